"""The results of ``shardload bench loaders``: the largest number of accelerators kept busy
(:func:`summarize`, pure), the machine measured on, and ``results.json``, ``report.md`` and
``au.png``."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: an accelerator is kept busy when its utilisation (AU) is at least this
THRESHOLD = 0.9


def summarize(rows: Sequence[dict[str, Any]], threshold: float = THRESHOLD) -> list[dict[str, Any]]:
    """Per (loader, workers): the largest accelerator count whose every accelerator reached
    ``threshold`` AU, counting up from the smallest tried (0 if even the smallest failed).

    >>> rows = [dict(loader="a", workers=0, accelerators=n, au_min=au)
    ...         for n, au in ((1, .99), (2, .95), (4, .7))]
    >>> summarize(rows)[0]["max_accelerators"]
    2
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["loader"], r["workers"], r["accelerators"])):
        key = (r["loader"], r["workers"])
        s = out.setdefault(
            key,
            {
                "loader": key[0],
                "workers": key[1],
                "max_accelerators": 0,
                "tried": [],
                "failed": False,
            },
        )
        s["tried"].append(r["accelerators"])
        ok = r.get("error") is None and r["au_min"] >= threshold
        if ok and not s["failed"]:
            s["max_accelerators"] = r["accelerators"]
        elif not ok:
            s["failed"] = True
    for s in out.values():
        s["bound"] = "" if s["failed"] else f"(all tried passed: >= {s['max_accelerators']})"
    return list(out.values())


def command_line(args: argparse.Namespace) -> str:
    """The ``shardload bench loaders`` command line that ``args`` came from."""
    words = [
        "shardload bench loaders",
        str(args.store),
        "--emulate-compute",
        f"{args.emulate_compute:g}",
        "--batch-size",
        str(args.batch_size),
        "--workers",
        ",".join(map(str, args.workers)),
        "--accelerators",
        ",".join(map(str, args.accelerators)),
        "--loaders",
        args.loaders,
    ]
    if args.goal != THRESHOLD:
        words += ["--goal", f"{args.goal:g}"]
    if args.window is not None:
        words += ["--window", str(args.window)]
    if getattr(args, "epochs", 1) != 1:
        words += ["--epochs", str(args.epochs)]
    if args.split:
        words += ["--split", args.split]
    if args.max_batches:
        words += ["--max-batches", str(args.max_batches)]
    return " ".join(words)


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and how busy the machine was."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        model = [
            ln
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ]
        info["cpu"] = model[0].split(":", 1)[1].strip() if model else ""
        mem = Path("/proc/meminfo").read_text().split()
        info["memory_gib"] = round(int(mem[mem.index("MemTotal:") + 1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def write_report(out: Path, doc: dict[str, Any]) -> None:
    """``results.json``, ``report.md`` and ``au.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    m = doc["machine"]
    goal = doc.get("goal", THRESHOLD)
    window = doc.get("window")
    sample = f"a window of {window} states" if window else "one row"
    lines = [
        "# shardload bench loaders",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Store: {doc['store']} ({doc['store_format']}, {doc['store_rows']:,} rows, "
        f"{doc['row_bytes']:,} bytes per row); a sample is {sample}; batch {doc['batch_size']}, "
        f"emulated compute {doc['compute_s'] * 1e3:g} ms per batch, goal: every accelerator "
        f">= {goal:.0%} busy.",
        "",
        f"Machine: {m.get('cpus')} CPUs ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB, "
        f"{m.get('platform')}; load average {m.get('load_average')} before, "
        f"{doc['load_after']} after (other jobs share the machine when it is not 0).",
        "",
        "## Largest number of accelerators kept busy",
        "",
        f"| loader | workers per accelerator | accelerators >= {goal:.0%} busy | tried |",
        "|---|---|---|---|",
    ]
    for s in doc["summary"]:
        lines.append(
            f"| {s['loader']} | {s['workers']} | **{s['max_accelerators']}** {s['bound']} | "
            f"{', '.join(map(str, s['tried']))} |"
        )
    lines += [
        "",
        "## Every run",
        "",
        "| loader | workers | accelerators | AU min | AU mean | samples/s (all) | MB/s of states "
        "(all) | batches each | start-up (max) | waited (max) | loader CPU s a batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        if r["error"]:
            lines.append(
                f"| {r['loader']} | {r['workers']} | {r['accelerators']} | error: {r['error'][:200]} ||||||||"
            )
            continue
        lines.append(
            f"| {r['loader']} | {r['workers']} | {r['accelerators']} | {r['au_min']:.1%} | "
            f"{r['au_mean']:.1%} | {r['samples_per_s']:,.1f} | {r.get('bytes_per_s', 0) / 1e6:,.0f} | "
            f"{r['batches_per_accelerator']} | "
            f"{r['first_batch_s_max']:.2f} s | {r['wait_s_max']:.2f} s | "
            f"{r.get('cpu_s_per_batch', float('nan')):.3f} |"
        )
    lines += ["", "## Peers", ""]
    lines += [f"- {name}: {why}" for name, why in doc["peers"].items()]
    lines += [
        "",
        "AU = time in the emulated compute (measured) / wall time from the accelerator's "
        "first batch to its end; MB/s of states: the bytes of the states delivered to all "
        "accelerators together (K rows a window of K) over the wall time; loader CPU s a batch: "
        "the CPU seconds of the accelerators' loaders (DataLoader workers and start-up "
        "included) over their batches; start-up (worker launch, first batch) is the column apart; "
        "'waited' is the accelerator's time waiting for its next batch.",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    _plot(out / "au.png", doc)


def _plot(path: Path, doc: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for r in doc["rows"]:
        if r["error"] is None:
            series.setdefault((r["loader"], r["workers"]), []).append(
                (r["accelerators"], r["au_min"])
            )
    for (loader, w), pts in sorted(series.items()):
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, [100 * y for y in ys], marker="o", label=f"{loader}, {w} workers")
    goal = doc.get("goal", THRESHOLD)
    ax.axhline(100 * goal, color="grey", ls="--", lw=1, label=f"{goal:.0%} goal")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("emulated accelerators (consumer processes)")
    ax.set_ylabel("least busy accelerator's AU (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"compute {doc['compute_s'] * 1e3:g} ms/batch, batch {doc['batch_size']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
