"""``shardload demo``: the main job on the embedded default, end to end.

sample radiation data -> prepare (Zarr, threads) -> inspect -> stream into a small MLP.
Everything lives under ``$SHARDLOAD_HOME`` (default ``~/.shardload``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from shardload.util.home import ensure_home

log = logging.getLogger("shardload.demo")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on generated MAELSTROM-style radiation data",
        description="Generate sample radiation files, prepare a Zarr store, inspect it and stream it "
        "into a small MLP, all under $SHARDLOAD_HOME (default ~/.shardload).",
    )
    p.add_argument("--columns", type=int, default=4096, help="columns per raw file (default 4096)")
    p.add_argument("--patches", type=int, default=4, help="number of patch files (default 4)")
    p.add_argument(
        "--steps", type=int, default=300, help="training steps (default 300; 0 skips training)"
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from shardload.cli.prepare import summary
    from shardload.prep.driver import prepare
    from shardload.samples.radiation import write_radiation_sample

    home = ensure_home()
    raw = home / "data" / "raw" / "radiation"
    config = home / "config.yaml"
    print(default_config(config))
    t0 = time.perf_counter()
    params = {"columns": args.columns, "patches": args.patches, "seed": 0}
    files, what = sample_files(raw, params, write_radiation_sample)
    print(
        f"[1/4] sample: {len(files)} raw files in {raw}, {what} ({time.perf_counter() - t0:.1f} s)"
    )
    t1 = time.perf_counter()
    store = prepare(config, overrides=["overwrite=true"])
    print(f"[2/4] prepare: {store.url} ({time.perf_counter() - t1:.1f} s)")
    s = summary(store)
    shapes = ", ".join(f"{k}{tuple(a['shape'])}" for k, a in s["arrays"].items())
    splits = ", ".join(f"{k}={v['rows']}" for k, v in s["splits"].items())
    print(
        f"[3/4] inspect: {s['length']} samples, {s['num_chunks']} chunks of {s['chunk_rows']} rows, "
        f"arrays {shapes}, splits {splits}"
    )
    if args.steps > 0:
        from shardload.train.demo import train_mlp

        res = train_mlp(
            store, steps=args.steps, batch_size=args.batch_size, num_workers=args.workers
        )
        out = home / "artifacts" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        saved = save_model(res, out)
        print(
            f"[4/4] train: {res['steps']} steps of a {res['params']:,}-parameter MLP, loss {res['first_loss']:.4f} -> "
            f"{res['last_loss']:.4f}, validation loss {res['val_loss']:.4f} (the mean predictor's "
            f"{res['val_loss_mean_predictor']:.4f}; {res['val_rows']} rows), "
            f"{res['samples_per_s']:,.0f} samples/s ({res['mb_per_s']:.1f} MB/s) "
            f"with {args.workers} DataLoader worker(s); model saved to {saved}"
        )
    print(f"done in {time.perf_counter() - t0:.1f} s; workspace {home}")
    return 0


#: sha256 of every earlier shipped ``configs/radiation-flat.yaml``: a workspace's config.yaml
#: equal to one is an earlier demo's, unedited, and is replaced by today's default. RULE: add
#: the old file's hash here whenever radiation-flat.yaml changes.
EARLIER_DEFAULT_CONFIGS: frozenset[str] = frozenset(
    {"507cefa58b01965b1368cfd3ce024416320f59703e7a45d20874aad68825e4d0"}  # before d082ddd
)


def default_config(config: Path) -> str:
    """Put the shipped default config at ``config`` unless the user's own is there: written
    when missing, replaced when it is an earlier default left unedited; returns what was done."""
    shipped = resources.files("shardload.configs").joinpath("radiation-flat.yaml").read_text()
    if not config.exists():
        config.write_text(shipped)
        return f"wrote the default config {config}"
    text = config.read_text()
    if text == shipped:
        return f"config {config} (the default)"
    if hashlib.sha256(text.encode()).hexdigest() in EARLIER_DEFAULT_CONFIGS:
        config.write_text(shipped)
        return f"replaced {config}, an earlier shardload's default left unedited, by today's"
    return (
        f"using {config}: it differs from the shipped default (yours: kept; delete it to get that)"
    )


#: Written beside the demo's sample files: what the demo wrote (and may replace), with what.
SAMPLE_MARKER = ".shardload-demo-sample.json"


def sample_files(
    raw: Path, params: dict[str, int], write: Callable[..., list[Path]]
) -> tuple[list[Path], str]:
    """The demo's raw files in ``raw``: written there when it holds no file; the demo's own
    files of the same parameters reused when the generator would write them the same (their
    stamp: ``write(..., reuse=True)`` regenerates the others, from an older generator, and
    logs why); the demo's own files (listed in its marker) replaced when the parameters
    changed. Files the demo did not write are never deleted: a folder holding them is used as
    it is (with a warning where they come from an older generator)."""
    marker = raw / SAMPLE_MARKER
    present = sorted(p for p in raw.glob("*") if p.is_file() and p.name != SAMPLE_MARKER)
    if marker.exists():
        mine = json.loads(marker.read_text())
        if mine.get("params") == params:
            return _write_or_reuse(raw, params, write)
        for f in mine["files"]:  # only the demo's own files
            (raw / f).unlink(missing_ok=True)
        marker.unlink()
        present = sorted(p for p in raw.glob("*") if p.is_file())
    if present:
        log.warning("%s holds files the demo did not write: using them, deleting nothing", raw)
        _warn_outdated(present)
        return present, "the files already there (not written by the demo: kept as they are)"
    return _write_or_reuse(raw, params, write)


def _write_or_reuse(
    raw: Path, params: dict[str, int], write: Callable[..., list[Path]]
) -> tuple[list[Path], str]:
    """The demo's files written, or reused where up to date (``reuse=True``), and its marker."""
    marker = raw / SAMPLE_MARKER
    before = {p.name: p.stat().st_mtime_ns for p in raw.glob("*") if p.is_file()}
    files = write(
        raw,
        columns=params["columns"],
        timesteps=(0,),
        patches=tuple(range(params["patches"])),
        seed=params["seed"],
        reuse=True,
    )
    marker.write_text(json.dumps({"params": params, "files": [Path(f).name for f in files]}))
    rewritten = [f for f in files if before.get(Path(f).name) != Path(f).stat().st_mtime_ns]
    if not rewritten:
        return list(files), "reused (written by an earlier demo, up to date)"
    if not any(Path(f).name in before for f in rewritten):
        return list(files), "written"
    # the store is prepared again below, as on every run: never kept from the old files
    return list(files), (
        f"{len(rewritten)} of them written again (missing, or from an older sample generator: "
        "the log says which and why)"
    )


def _warn_outdated(files: list[Path]) -> None:
    """A warning for each file written by an older ``shardload sample radiation``: the demo
    would not learn from it (its targets were not a function of its inputs)."""
    import netCDF4

    from shardload.samples.stamp import why_outdated

    for f in files:
        if f.suffix != ".nc" or not f.name.startswith(("rad4NN_inputs_", "3dcorrection_")):
            continue
        try:
            with netCDF4.Dataset(f) as ds:  # real MAELSTROM files are not shardload's samples
                ours = "shardload sample radiation" in str(getattr(ds, "history", ""))
        except OSError:
            continue
        why = why_outdated(f, "radiation") if ours else None
        if why is not None:
            log.warning(
                "%s: %s; move it away (the demo then writes current files) or regenerate it "
                "with 'shardload sample radiation'",
                f,
                why,
            )


def save_model(res: dict[str, Any], out: Path) -> Path:
    """The demo's trained model (``model.pt``, a state dict) and its metrics (``metrics.json``)
    in ``out``; returns the model's path."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.pt"
    torch.save(res["model"].state_dict(), path)
    keep = {k: v for k, v in res.items() if isinstance(v, (int, float, str))}
    (out / "metrics.json").write_text(json.dumps(keep, indent=1))
    return path
