"""Torch-free streaming of a store: selection, background reads, shuffle groups, batches.

``iter_batches`` (numpy batches for any framework) is the entry point; ``shardload.torch`` wraps
it for PyTorch. Data flows one way: :mod:`.select` (which rows) -> ``plan.epoch`` (who reads
what, in which order) -> :mod:`.reader` (background reads of shuffle groups) -> :mod:`.batches`.
"""
