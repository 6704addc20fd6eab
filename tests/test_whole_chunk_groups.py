"""Stores read by whole chunks (compressed Zarr, HDF5): default shuffle groups sized by decoded
bytes, the default read-ahead, and resume states of the earlier default (4 chunks a group)."""

from __future__ import annotations

import pytest

import shardload
from _stores import check_values, make_store, split_rows
from shardload.errors import StateError
from shardload.load import options as options_mod
from shardload.load.select import select_rows
from shardload.plan.epoch import plan_fingerprint
from shardload.plan.resume import EpochState

# these tests shrink the group budget to a few chunks on purpose: the warning that such a
# group cannot mix well (tests/test_default_layout.py) is expected here, not checked
pytestmark = pytest.mark.filterwarnings("ignore::shardload.errors.ShuffleQualityWarning")

ROWS, CHUNK = 160, 4  # 40 chunks


@pytest.fixture(scope="module")
def zstd(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("zstd"),
        fmt="zarr",
        compression="zstd",
        n=ROWS,
        chunk_rows=CHUNK,
        splits={"train": 1.0},
    )


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("raw"),
        fmt="zarr",
        compression="none",
        n=ROWS,
        chunk_rows=CHUNK,
        splits={"train": 1.0},
    )


def chunk_bytes(store, arrays=None) -> int:
    infos = store.manifest.arrays
    return CHUNK * sum(infos[a].row_bytes for a in (arrays or store.arrays))


def test_group_holds_the_decoded_bytes_of_four_default_chunks(zstd, hdf5_store, monkeypatch):
    """Chunks per group = max(4, WHOLE_CHUNK_GROUP_BYTES // decoded chunk bytes of the selected
    arrays), at most MAX_GROUP_CHUNKS; the default is 4 chunks of 16 MiB, so chunks of the
    default size keep 4 a group, as before."""
    assert options_mod.WHOLE_CHUNK_GROUP_BYTES == 4 * 16 * 2**20
    for store in (zstd, hdf5_store):
        monkeypatch.setattr(options_mod, "MAX_GROUP_CHUNKS", 4096)
        sel = select_rows(store)
        cb = chunk_bytes(store)
        for budget, want in ((cb * 4, 4), (cb, 4), (cb * 9 + cb // 2, 9), (cb * 30, 30)):
            monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", budget)
            assert options_mod.whole_chunk_group(store, sel) == want
            assert options_mod.resolve_shuffle(store, sel, None, None) == (0, want)
            # given options win: shuffle_chunks as given, piece_rows alone keeps 4 a group
            assert options_mod.resolve_shuffle(store, sel, None, 6) == (0, 6)
            assert options_mod.resolve_shuffle(store, sel, 0, None) == (0, 4)
        # the selected arrays' bytes only: fewer arrays, more chunks in the same bytes
        monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", cb * 9)
        one = select_rows(store, arrays=["y"])
        assert options_mod.whole_chunk_group(store, one) == cb * 9 // chunk_bytes(store, ["y"])
        monkeypatch.setattr(options_mod, "MAX_GROUP_CHUNKS", 7)
        assert options_mod.whole_chunk_group(store, sel) == 7


def test_raw_stores_keep_their_small_pieces(raw):
    sel = select_rows(raw)
    piece, group = options_mod.resolve_shuffle(raw, sel, None, None, batch_size=8)
    assert 0 < piece < CHUNK or group > 4  # the raw default (pieces), not whole-chunk groups
    assert options_mod.resolve_prefetch(raw, sel, None, shuffle_chunks=group, piece_rows=piece) == 4


def test_default_prefetch_is_a_group_of_small_chunks(zstd, monkeypatch):
    """Read ahead by default: a group's chunks on whole-chunk stores of small chunks (at most
    64 MiB decoded, as 4 chunks of 16 MiB), never fewer than 4; as given when given."""
    sel = select_rows(zstd)
    cb = chunk_bytes(zstd)
    monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", cb * 10)
    prefetch = options_mod.resolve_prefetch
    assert prefetch(zstd, sel, None, shuffle_chunks=10, piece_rows=0) == 10
    assert prefetch(zstd, sel, None, shuffle_chunks=30, piece_rows=0) == 10  # 64 MiB at most
    assert prefetch(zstd, sel, None, shuffle_chunks=2, piece_rows=0) == 4
    assert prefetch(zstd, sel, 3, shuffle_chunks=10, piece_rows=0) == 3
    monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", cb)
    assert prefetch(zstd, sel, None, shuffle_chunks=4, piece_rows=0) == 4


def test_default_groups_cover_the_epoch_whatever_the_threads(zstd, monkeypatch):
    """Several groups of whole chunks a worker: every row once per rank's share, the same
    batches for 1, 2 or 4 reader threads and any read-ahead, and two workers share the rows
    exactly."""
    monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", chunk_bytes(zstd) * 6)
    assert options_mod.whole_chunk_group(zstd, select_rows(zstd)) == 6

    def run(**kw):
        return [
            b["index"].tolist() for b in shardload.iter_batches(zstd, batch_size=5, seed=7, **kw)
        ]

    ref = run(threads=1)
    assert sorted(i for b in ref for i in b) == split_rows(zstd, None).tolist()
    for kw in ({"threads": 2}, {"threads": 4}, {"threads": 4, "prefetch": 1}, {"prefetch": 0}):
        assert run(**kw) == ref, kw
    per_worker = [run(worker=w, num_workers=2) for w in range(2)]
    for w in range(2):
        assert run(worker=w, num_workers=2, threads=4, prefetch=2) == per_worker[w]
    both = sorted(i for p in per_worker for b in p for i in b)
    assert both == split_rows(zstd, None).tolist()
    # a group mixes the rows of 6 chunks: a batch holds rows of more than one chunk
    assert max(len({i // CHUNK for i in b}) for b in ref) > 1
    for b in shardload.iter_batches(zstd, batch_size=5, seed=7):
        check_values(zstd, b)


def _state(store, consumed: int, shuffle_chunks: int, seed: int = 3) -> dict:
    sel = select_rows(store)
    fp = plan_fingerprint(
        sel.sizes,
        chunk_ids=sel.ids,
        chunk_starts=sel.starts,
        batch_size=8,
        seed=seed,
        shuffle_chunks=shuffle_chunks,
    )
    return EpochState(0, consumed, 1, 1, fp, ()).to_dict()


def test_a_state_of_the_earlier_default_is_refused_saying_how_to_resume(zstd, monkeypatch):
    """A resume state saved when whole-chunk stores had 4 chunks a group, whatever their size
    (as ``shuffle_chunks=4`` plans today), is refused by the new default with an error that
    names the old setting; passing it resumes the rest of that epoch exactly."""
    monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", chunk_bytes(zstd) * 6)
    old = [
        b["index"].tolist()
        for b in shardload.iter_batches(zstd, batch_size=8, seed=3, shuffle_chunks=4)
    ]
    state = _state(zstd, 3, 4)
    with pytest.raises(StateError, match=r"saved with shuffle_chunks=4.*pass shuffle_chunks=4"):
        shardload.iter_batches(zstd, batch_size=8, seed=3, state=state)
    rest = shardload.iter_batches(zstd, batch_size=8, seed=3, state=state, shuffle_chunks=4)
    assert [b["index"].tolist() for b in rest] == old[3:]
    # a state of the new default resumes with the defaults; other mismatches get no such hint
    new = _state(zstd, 2, 6)
    full = [b["index"].tolist() for b in shardload.iter_batches(zstd, batch_size=8, seed=3)]
    got = shardload.iter_batches(zstd, batch_size=8, seed=3, state=new)
    assert [b["index"].tolist() for b in got] == full[2:]
    with pytest.raises(StateError) as err:
        shardload.iter_batches(zstd, batch_size=8, seed=4, state=state)
    assert "pass shuffle_chunks" not in str(err.value)


def test_torch_state_of_the_earlier_default_is_refused_saying_how_to_resume(zstd, monkeypatch):
    from shardload.torch import StreamingDataset

    monkeypatch.setattr(options_mod, "WHOLE_CHUNK_GROUP_BYTES", chunk_bytes(zstd) * 6)
    old = StreamingDataset(zstd, batch_size=8, seed=3, shuffle_chunks=4, ring_slots=0)
    state = old.state_dict()
    new = StreamingDataset(zstd, batch_size=8, seed=3, ring_slots=0)
    assert new.options["shuffle_chunks"] == 6 and new.read_options["prefetch"] == 6
    with pytest.raises(StateError, match=r"saved with shuffle_chunks=4.*pass shuffle_chunks=4"):
        new.load_state_dict(state)
    StreamingDataset(zstd, batch_size=8, seed=3, shuffle_chunks=4).load_state_dict(state)


@pytest.fixture(scope="module")
def hdf5_store(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("h5"), fmt="hdf5", n=ROWS, chunk_rows=CHUNK, splits={"train": 1.0}
    )
