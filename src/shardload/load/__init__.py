"""Torch-free streaming of a store: options resolved once, one reading loop, group readers.

``iter_batches`` (numpy batches for any framework) is the entry point; ``shardload.torch`` wraps
it for PyTorch. Data flows one way: :mod:`.spec` (``LoadSpec``: the selection cut into pieces by
:mod:`.select`, the defaults of :mod:`.options`, the read kind of :mod:`.kinds`) ->
``plan.epoch`` (who reads what, in which order) -> :mod:`.loop` (one loop, one thread pool,
:mod:`.pool`) driving the group reader of the kind (:mod:`.gather`, :mod:`.scatter`,
:mod:`.ragged`, :mod:`.windows`) -> batches (:mod:`.batches`, memory from :mod:`.recycle` or
the shared-memory ring of :mod:`.ring`).
"""
