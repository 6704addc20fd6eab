"""Shuffles by name: how an epoch orders its rows (pure numpy, seeded, no I/O).

A shuffle is two steps of the epoch plan (:mod:`.epoch`): the *sequence* of the epoch's
segments, and the *order of a shuffle group's rows* (:mod:`.groups`). ``SHUFFLES`` names each
one; ``shuffle=True`` / ``False`` of ``plan_epoch`` and the loaders are the names
``"pieces"`` / ``"none"``. A new shuffle is one :class:`Shuffle` entry and its test.

Each entry carries the ``key`` its plans are fingerprinted with (``True``, ``False`` or
``"uniform"``, what ``shuffle`` was before shuffles had names), so resume states saved before
the registry resume as they did, and two names of one plan share their states.

>>> sorted(SHUFFLES)
['chunks', 'none', 'pieces', 'uniform']
>>> get_shuffle(True).name, get_shuffle("chunks").key, get_shuffle("chunks").group
('pieces', True, 4)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardload.errors import PlanError
from shardload.plan.spans import Spans

#: ``sequence(sizes, ids, starts, rng)``: the epoch's segments, in order.
Sequence = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], Spans]
#: ``group_order(lengths, at, n, batch_size, rng)``: the order of a group's ``n`` rows.
GroupOrder = Callable[[np.ndarray, int, int, int, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class Shuffle:
    """One named shuffle.

    ``sequence`` orders the epoch's chunk-table entries; ``group_order`` (None: the rows as
    they come) orders each shuffle group's rows. ``key`` is what plans and their fingerprints
    carry. ``group``: the shuffle groups' size (in pieces) the loaders default to with this
    shuffle (None: the loader's own default, ``shardload.load.options``).
    """

    name: str
    key: bool | str
    sequence: Sequence
    group_order: GroupOrder | None = None
    group: int | None = None


def const(value: int, n: int) -> np.ndarray:
    """``n`` int64 copies of ``value`` in no memory (a read-only broadcast view: a plan of
    10**5 pieces or 10**9 one-row segments holds one such column per sequence)."""
    return np.broadcast_to(np.int64(value), (n,))


def natural_sequence(
    sizes: np.ndarray, ids: np.ndarray, starts: np.ndarray, rng: np.random.Generator
) -> Spans:
    """The entries as given, whole (``shuffle=False``)."""
    n = len(sizes)
    return Spans(ids, starts, const(0, n), sizes, const(-1, n))


def chunk_sequence(
    sizes: np.ndarray, ids: np.ndarray, starts: np.ndarray, rng: np.random.Generator
) -> Spans:
    """The entries whole, in :func:`shuffle_order` (rounds of one piece per chunk)."""
    order = shuffle_order(ids, rng)
    n = len(sizes)
    return Spans(ids[order], starts[order], const(0, n), sizes[order], const(-1, n))


def uniform_sequence(
    sizes: np.ndarray, ids: np.ndarray, starts: np.ndarray, rng: np.random.Generator
) -> Spans:
    """Every row as a one-row segment, in a uniform random order (16 bytes x 5 per row)."""
    n = int(sizes.sum())
    perm = rng.permutation(n)
    cum = np.concatenate(([0], np.cumsum(sizes)))
    entry = np.searchsorted(cum, perm, "right") - 1
    off = perm - cum[entry]
    return Spans(ids[entry], starts[entry], off, off + 1, const(-1, n))


def shuffle_order(ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A seeded permutation of chunk-table entries that spreads the pieces of each chunk: the
    entries come in rounds, round ``k`` holding one piece of every chunk that has more than
    ``k`` (which piece, and the order of chunks in a round, are random). With one entry per
    chunk it is a plain random permutation (pure).

    >>> ids = np.array([0, 0, 1, 1, 2, 2])
    >>> ids[shuffle_order(ids, np.random.default_rng(0))].reshape(2, 3).tolist()
    [[0, 2, 1], [2, 1, 0]]
    """
    n = len(ids)
    pick, place = rng.random(n), rng.random(n)
    if n < 2 or bool((ids[1:] > ids[:-1]).all()):
        # one entry per chunk, in chunk order (a store of small chunks, read whole): one round,
        # ordered by ``place`` alone, as below, without sorting the entries by chunk first
        # (two of the three sorts: 1.6 of 3.1 ms for the default store's 8,192 chunks)
        return np.argsort(place, kind="stable")
    by_chunk = np.lexsort((pick, ids))  # each chunk's entries together, in a random order
    sorted_ids = ids[by_chunk]
    first = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    round_ = np.empty(n, np.int64)
    round_[by_chunk] = np.arange(n) - np.repeat(first, np.diff(np.append(first, n)))
    return np.lexsort((place, round_))


def _small_int(n: int) -> type:
    """The smallest unsigned type for values below ``n`` (numpy radix-sorts 8/16-bit keys)."""
    return np.uint8 if n <= 1 << 8 else np.uint16 if n <= 1 << 16 else np.int64


def deal_order(
    lengths: np.ndarray, at: int, n: int, batch_size: int, rng: np.random.Generator
) -> np.ndarray:
    """A random order of a group's ``n`` rows (segments of ``lengths`` rows, concatenated)
    that *deals* each segment's rows to different batches (pure).

    The rows are listed segment by segment, segments in a random order and rows in a random
    order within each; this list is then dealt like cards to the batches the group's stream
    positions ``at .. at + n`` fall in: the first row to the first batch, the next to the
    second, ... one row per batch per round (a batch with no place left is skipped). So the
    rows of a segment of ``k`` rows land in ``k`` different batches when the group spans at
    least ``k`` batches, where a uniform permutation puts two rows of a 16-row piece in one
    batch of 16 with probability 1 - 16!/16**16 ~ 1. A batch's rows come in the random order
    of their segments. With pieces of a storage-order feature (neighbouring rows correlated),
    this is what keeps a batch as varied as a uniform shuffle's (docs/loading.md, "Shuffle
    quality").

    >>> order = deal_order(np.array([2, 2, 2, 2]), 0, 8, 4, np.random.default_rng(0))
    >>> order.reshape(2, 4).tolist(), (order // 2).reshape(2, 4).tolist()  # rows, their segments
    ([[4, 0, 2, 6], [5, 1, 3, 7]], [[2, 0, 1, 3], [2, 0, 1, 3]])
    """
    lengths = np.asarray(lengths, np.int64)
    # rows in a random order, then (stable) by their segment's random rank: segment by segment
    perm = rng.permutation(n)
    rank: np.ndarray = rng.permutation(len(lengths)).astype(_small_int(len(lengths)))
    seg_rank = np.repeat(rank, lengths)[perm]
    listed = perm[np.argsort(seg_rank, kind="stable")]
    # the stream positions by (place in their batch, batch) take the list
    order = np.empty(n, np.int64)
    order[deal_positions(at, n, batch_size)] = listed
    return order


def deal_positions(at: int, n: int, batch_size: int) -> np.ndarray:
    """Stream positions ``at .. at + n`` (as ``0 .. n - 1``) sorted by their rank in their
    batch's share of them, then by batch: the order in which :func:`deal_order` deals (pure). Computed as a
    (place, batch) grid instead of a stable sort of each position's place (a third of
    ``deal_order``'s time for a group of 3,500 rows).

    >>> deal_positions(6, 7, 4).tolist()  # batches: positions 0-1, 2-5, 6
    [0, 2, 6, 1, 3, 4, 5]
    """
    b = int(batch_size)
    first = min(n, b - at % b)  # positions in the first batch (from place ``at % b`` on)
    places = np.arange(min(b, n), dtype=np.int64)
    later = -(-(n - first) // b)  # batches after the first
    grid = np.empty((len(places), later + 1), np.int64)
    grid[:, 0] = places  # the first batch's positions (ranked by position, as the later ones)
    grid[:, 1:] = first + places[:, None] + b * np.arange(later, dtype=np.int64)
    valid = grid < n
    valid[:, 0] = places < first
    return grid[valid]


#: The shuffles by name. Today's default (``True``) is ``"pieces"``: small pieces of every chunk
#: in rounds (:func:`shuffle_order`), each group's rows dealt to its batches (:func:`deal_order`).
#: ``"chunks"`` is the earlier default: the same plan over groups of 4 chunk-sized pieces (the
#: loaders' ``shuffle_chunks=4``). ``"uniform"``: every row its own segment, in a uniform
#: permutation (for readers that read rows where they lie). ``"none"`` (``False``): storage order.
SHUFFLES: dict[str, Shuffle] = {
    "pieces": Shuffle("pieces", True, chunk_sequence, deal_order),
    "chunks": Shuffle("chunks", True, chunk_sequence, deal_order, group=4),
    "uniform": Shuffle("uniform", "uniform", uniform_sequence),
    "none": Shuffle("none", False, natural_sequence),
}
#: ``shuffle=True`` / ``False``: the names they stand for.
ALIASES: dict[bool, str] = {True: "pieces", False: "none"}


def get_shuffle(shuffle: bool | str) -> Shuffle:
    """The :class:`Shuffle` that ``shuffle`` (a name, or ``True`` / ``False``) names.

    >>> get_shuffle("random")
    Traceback (most recent call last):
    shardload.errors.PlanError: shuffle must be True, False or one of 'chunks', 'none', 'pieces', 'uniform'; got 'random'
    """
    if isinstance(shuffle, str):
        found = SHUFFLES.get(shuffle)
    else:
        found = SHUFFLES[ALIASES[bool(shuffle)]]
    if found is None:
        names = ", ".join(repr(n) for n in sorted(SHUFFLES))
        raise PlanError(f"shuffle must be True, False or one of {names}; got {shuffle!r}")
    return found


def shuffle_key(shuffle: bool | str) -> bool | str:
    """What a plan carries for ``shuffle``: ``True``, ``False`` or ``"uniform"``."""
    return get_shuffle(shuffle).key
