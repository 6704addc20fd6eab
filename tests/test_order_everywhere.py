"""Order is a function of the store's content, seed, epoch and world, never of where it lives.

The same store read from its folder, by URL (``shardload serve`` on loopback), staged to
``/dev/shm`` and from its SquashFS image yields the same batches (index and values), with the
default options, on 1 and 2 ranks of 2 workers each; a resume state taken mid-epoch on one
resumes on another to the same remaining batches (issue 25). Raw rows (uncompressed Zarr, npy)
and a compressed store: before, an uncompressed store read by URL was planned in whole chunks
and came in another order than the same store read locally.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from _resume import assert_same_batches, rank_batches
from _stores import make_store
from shardload.load.spec import LoadSpec
from shardload.move import mount as squashfs
from shardload.move.pack import pack
from shardload.move.serve import serving
from shardload.move.staging import staged
from shardload.plan.resume import plan_state

pytestmark = pytest.mark.timeout(180)

LAYOUTS = {
    "zarr-none": {"fmt": "zarr", "compression": "none"},
    "npy": {"fmt": "npy", "compression": "none"},
    "zarr-zstd": {"fmt": "zarr", "compression": "zstd"},
}
#: The defaults but for the batch size; seed 3, epoch 1 (the issue's).
KW = dict(batch_size=8, split="train", seed=3, epoch=1)
WORLDS = ((1, 2), (2, 2))  # (ranks, workers per rank)


def _squashfs_problem() -> str | None:
    for tool in ("mksquashfs", "squashfuse"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install squashfs-tools squashfuse fuse3)"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "fusermount is not installed (apt-get install fuse3)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is missing or not usable: FUSE mounts are impossible here"
    return None


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """One folder of small stores: 300 rows of 24 bytes, in chunks of 15 rows."""
    base = tmp_path_factory.mktemp("order")
    for name, kw in LAYOUTS.items():
        make_store(base, n=300, chunk_rows=15, name=name, **kw)
    return base


@pytest.fixture(scope="module")
def url(root) -> Iterator[str]:
    with serving(root) as base:
        yield base


@pytest.fixture(scope="module")
def shm(root) -> Iterator[Path]:
    """The stores staged to /dev/shm (a folder of the test's where /dev/shm is not writable)."""
    to = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else root / "shm"
    folder = Path(tempfile.mkdtemp(prefix="shardload-order-", dir=to))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def world_batches(store: object) -> list[list[dict[str, np.ndarray]]]:
    """Every rank's batches of every world in ``WORLDS``."""
    return [
        rank_batches(store, rank=r, world=world, workers=workers, **KW)
        for world, workers in WORLDS
        for r in range(world)
    ]


def assert_same_worlds(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(w) > 3
        assert_same_batches(g, w)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_batches_locally_and_by_url(root, url, layout):
    local = world_batches(str(root / layout))
    assert_same_worlds(world_batches(url + layout), local)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_batches_staged_to_shm(root, url, shm, layout):
    local = world_batches(str(root / layout))
    with staged(root / layout, shm / "from-folder") as path:
        assert_same_worlds(world_batches(str(path)), local)
    with staged(url + layout, shm / "from-url") as path:  # staging by URL, then local reads
        assert_same_worlds(world_batches(str(path)), local)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_batches_from_its_squashfs_image(root, tmp_path, monkeypatch, layout):
    problem = _squashfs_problem()
    if problem:
        pytest.skip(f"SquashFS images need the real tools: {problem}")
    monkeypatch.setenv(squashfs.MOUNT_DIR_ENV, str(tmp_path / "mounts"))
    image = pack(str(root / layout), tmp_path / f"{layout}.sqfs")
    local = world_batches(str(root / layout))
    try:
        assert_same_worlds(world_batches(str(image)), local)
    finally:  # end this process's use now: the mount must not outlive the test's folder
        squashfs.unmount(image)
        deadline = time.monotonic() + 30
        while _mounted_under(tmp_path / "mounts") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _mounted_under(tmp_path / "mounts")


def _mounted_under(folder: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split(" ")[1].startswith(f"{folder}/") for line in f)


def _state(store: str, k: int, *, world: int, workers: int) -> dict:
    """The resume state a rank saves after ``k`` batches of the epoch (``shardload.torch``
    saves this: the plan position and the data's fingerprint)."""
    spec = LoadSpec.build(store, **{k_: v for k_, v in KW.items() if k_ != "epoch"})
    with spec.store:  # by URL: its connections end here, not at a garbage collection
        plan = spec.plan(world_size=world, num_workers=workers, epoch=KW["epoch"])
        state = plan_state(plan, k).to_dict()
        state["dataset"] = spec.fingerprint
    return state


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resume_state_taken_locally_resumes_by_url(root, url, layout):
    for world, workers in WORLDS:
        for rank in range(world):
            local = rank_batches(str(root / layout), rank=rank, world=world, workers=workers, **KW)
            for k in (1, len(local) // 2):
                state = _state(str(root / layout), k, world=world, workers=workers)
                rest = rank_batches(
                    url + layout, rank=rank, world=world, workers=workers, state=state, **KW
                )
                assert_same_batches(rest, local[k:])
                # and the other way: a state taken by URL resumes locally
                state = _state(url + layout, k, world=world, workers=workers)
                rest = rank_batches(
                    str(root / layout), rank=rank, world=world, workers=workers, state=state, **KW
                )
                assert_same_batches(rest, local[k:])


def test_torch_state_taken_locally_resumes_by_url(root, url):
    """The state ``StreamingDataLoader`` saves mid-epoch from a local store, loaded into one
    reading the same store by URL: the remaining batches, bit for bit."""
    torch = pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    def loader(store: str) -> StreamingDataLoader:
        ds = StreamingDataset(store, batch_size=8, split="train", seed=3)
        return StreamingDataLoader(ds, num_workers=0)

    first = loader(str(root / "zarr-none"))
    first.dataset.set_epoch(1)
    full = [{k: np.asarray(v) for k, v in b.items()} for b in first]
    first.dataset.set_epoch(1)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    del it
    second = loader(url + "zarr-none")
    second.load_state_dict(state)
    rest = [{k: np.asarray(v) for k, v in b.items()} for b in second]
    assert_same_batches(rest, full[3:])
    assert torch is not None


@pytest.fixture
def requests_made(monkeypatch) -> list[tuple[str, int | None, int | None]]:
    """Every read of a file by URL: (path in the store, start, end); None, None: whole."""
    from shardload.move.remote import RemoteFileSystem

    calls: list[tuple[str, int | None, int | None]] = []
    cat_file = RemoteFileSystem.cat_file

    def spy(self, path, start=None, end=None, what="", **kw):
        calls.append((path.split("/zarr-none/", 1)[-1], start, end))
        return cat_file(self, path, start, end, what=what, **kw)

    monkeypatch.setattr(RemoteFileSystem, "cat_file", spy)
    return calls


def test_a_piece_of_a_raw_zarr_chunk_by_url_is_a_range_of_its_rows(
    root, url, requests_made, monkeypatch
):
    """By URL, rows of an uncompressed Zarr chunk are one HTTP range request of just those
    rows; the process's first read of a chunk fetches the whole file once to check its
    checksum (and serves the rows from those bytes; kept for later reads unless
    ``SHARDLOAD_URL_KEEP_BYTES`` is 0)."""
    import shardload

    monkeypatch.setenv("SHARDLOAD_URL_KEEP_BYTES", "0")  # no checked file kept for later reads
    want = shardload.open_store(root / "zarr-none", verify="never").read("x")
    s = shardload.open_store(url + "zarr-none")  # verify="auto": by URL, once per process
    np.testing.assert_array_equal(s.read("x", 17, 19), want[17:19])  # chunk 1, rows 2:4
    np.testing.assert_array_equal(s.read("x", 20, 22), want[20:22])  # chunk 1, rows 5:7
    row = want[0].nbytes  # 16 bytes
    assert [c for c in requests_made if c[0] == "x/c/1/0"] == [
        ("x/c/1/0", None, None),
        ("x/c/1/0", 5 * row, 7 * row),
    ]
    requests_made.clear()
    s = shardload.open_store(url + "zarr-none", verify="never")
    batches = list(shardload.iter_batches(s, batch_size=8, split="train", seed=3, arrays=["x"]))
    assert sum(len(b["index"]) for b in batches) == 240
    chunks = [c for c in requests_made if c[0].startswith("x/c/")]
    # range requests only (a group's pieces of one file share one: tests/test_url_raw_zarr.py)
    assert chunks and all(c[1] is not None for c in chunks), chunks


def test_uniform_shuffle_by_url_is_the_local_one(root, url):
    """``shuffle="uniform"`` needs raw rows, wherever they are: by URL each row is a range."""
    kw = dict(KW, shuffle="uniform")
    local = rank_batches(str(root / "zarr-none"), rank=1, world=2, workers=2, **kw)
    assert len(local) > 3
    assert_same_batches(rank_batches(url + "zarr-none", rank=1, world=2, workers=2, **kw), local)


def test_raw_rows_are_read_from_the_manifest_alone(root):
    """The planning fact depends on the recorded format and codecs, nothing else."""
    from dataclasses import replace

    import shardload
    from shardload.load.kinds import stores_raw_rows

    m = shardload.open_store(root / "zarr-none").manifest
    assert stores_raw_rows(m, ["x", "y"])
    assert stores_raw_rows(shardload.open_store(root / "npy").manifest, ["x"])
    assert not stores_raw_rows(shardload.open_store(root / "zarr-zstd").manifest, ["x"])
    assert not stores_raw_rows(replace(m, options={**m.options, "shard_chunks": 4}), ["x"])
    assert not stores_raw_rows(replace(m, format="hdf5"), ["x"])
    assert not stores_raw_rows(replace(m, provenance={"source": "plain zarr"}), ["x"])
    cf = replace(m.arrays["x"], attrs={"cf": {}})
    assert not stores_raw_rows(replace(m, arrays={**m.arrays, "x": cf}), ["x", "y"])
    assert stores_raw_rows(replace(m, arrays={**m.arrays, "x": cf}), ["y"])


def test_dataloader_workers_by_url_yield_the_local_batches(root, url):
    """``StreamingDataLoader`` with 2 worker processes, rank 1 of 2: the same batches from the
    folder and by URL."""
    pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    def batches(store: str) -> list[dict[str, np.ndarray]]:
        ds = StreamingDataset(store, batch_size=8, split="train", seed=3, rank=1, world_size=2)
        ds.set_epoch(1)
        loader = StreamingDataLoader(ds, num_workers=2)
        return [{k: np.array(v) for k, v in b.items()} for b in loader]

    local = batches(str(root / "zarr-none"))
    assert len(local) > 3
    assert_same_batches(batches(url + "zarr-none"), local)
