"""PyTorch integration (the only package that imports torch).

- :class:`StreamingDataset` (:mod:`.dataset`): an ``IterableDataset`` of whole batches for
  ``DataLoader(ds, batch_size=None, num_workers=W)``; rank and world from ``torch.distributed``
  (or torchrun's environment), the worker from ``get_worker_info``; each pass is the next epoch
  unless ``set_epoch`` says otherwise; resumable mid-epoch.
- :class:`StreamingDataLoader` (:mod:`.dataloader`): a ``DataLoader`` that counts the batches it
  yields (in the main process) so that ``state_dict()`` / ``load_state_dict()`` resume
  mid-epoch with workers, and moves batches from workers in bundles.
- :class:`MapDataset` (:mod:`.mapdataset`): random access by row, for samplers such as
  ``DistributedSampler``.
- :class:`DevicePrefetcher` (:mod:`.device`): batches to a GPU through reused pinned buffers
  and non-blocking copies on a side stream, a few batches ahead (a plain ``.to`` elsewhere).
- :mod:`.transport`: the shared-memory ring hand-off and bundles; :mod:`.state`: rank/world,
  epochs and the one resume-state shape, shared with workers whatever their start method.

``StreamingDataset`` also works with torchdata's ``StatefulDataLoader``: inside a worker,
``state_dict()`` is that worker's position (``load_state_dict`` of it skips what the worker
already yielded, without reading it); in the main process it is the rank's position.
"""

from shardload.torch.dataloader import StreamingDataLoader
from shardload.torch.dataset import StreamingDataset
from shardload.torch.device import DevicePrefetcher
from shardload.torch.mapdataset import MapDataset
from shardload.torch.state import STATE_VERSION
from shardload.torch.transport import BUNDLE_BYTES, MAX_BUNDLE, plan_bundle, plan_rounds

__all__ = [
    "BUNDLE_BYTES",
    "MAX_BUNDLE",
    "STATE_VERSION",
    "DevicePrefetcher",
    "MapDataset",
    "StreamingDataLoader",
    "StreamingDataset",
    "plan_bundle",
    "plan_rounds",
]
