"""``report.md`` and PNG plots of ``shardload bench formats`` from its result rows.

Every sentence of "What this run teaches" is computed from the rows of the same run (ratios
between settings), so the report says what this machine measured, not what we expect.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

Row = dict[str, Any]


def case_label(row: Row) -> str:
    name = f"{row['format']}-{row['variant']}" if row["variant"] else row["format"]
    mmap = row["mmap"]
    return name if mmap == "n/a" else f"{name} mmap={'on' if mmap else 'off'}"


def _settings(rows: list[Row]) -> list[tuple[bool, int]]:
    return sorted({(r["shuffle"], r["workers"]) for r in rows})


def _setting_label(shuffle: bool, workers: int) -> str:
    return f"{'shuffled' if shuffle else 'sequential'}, {workers} workers"


def main_table(rows: list[Row]) -> list[str]:
    """Markdown table: one line per format/variant/mmap, one column per (shuffle, workers);
    cells ``ratio to the read limit (samples/s)``."""
    settings = _settings(rows)
    cells: dict[str, dict[tuple[bool, int], Row]] = defaultdict(dict)
    for r in rows:
        cells[case_label(r)][(r["shuffle"], r["workers"])] = r
    head = "| format | " + " | ".join(_setting_label(*s) for s in settings) + " |"
    lines = [head, "|---|" + "---|" * len(settings)]
    for label, by_setting in cells.items():
        out = []
        for s in settings:
            cell = by_setting.get(s)
            if cell is None:
                out.append("-")
                continue
            mark = "*" if cell["capped"] else ""
            out.append(
                f"{_ratio(cell['ratio_to_read_limit'])} ({cell['samples_per_s']:,.0f}/s){mark}"
            )
        lines.append(f"| {label} | " + " | ".join(out) + " |")
    return lines


def storage_table(rows: list[Row]) -> list[str]:
    seen: dict[tuple[str, bool], Row] = {}
    for r in rows:
        name = f"{r['format']}-{r['variant']}" if r["variant"] else r["format"]
        seen.setdefault((name, r["fixed_length"]), r)
    lines = [
        "| format | length | files | bytes on disk | on disk / data | write s | write MB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, fixed), r in seen.items():
        lines.append(
            f"| {name} | {'fixed' if fixed else 'variable'} | {r['files']:,} | "
            f"{r['bytes_on_disk'] / 1e6:,.1f} MB | {r['bytes_on_disk'] / r['data_bytes']:.2f} | "
            f"{r['write_s']:.2f} | {r['data_bytes'] / r['write_s'] / 1e6:,.0f} |"
        )
    return lines


def memory_table(rows: list[Row]) -> list[str]:
    """Per format/mmap and worker count: the largest RSS growth during an epoch (MB)."""
    workers = sorted({r["workers"] for r in rows})
    growth: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        g = r["peak_rss_MB"] - r.get("rss_before_MB", r["peak_rss_MB"])
        cell = growth[case_label(r)]
        cell[r["workers"]] = max(cell.get(r["workers"], 0.0), g)
    lines = [
        "| format | " + " | ".join(f"{w} workers" for w in workers) + " |",
        "|---|" + "---|" * len(workers),
    ]
    for label, by_w in growth.items():
        cells = [f"{by_w[w]:,.0f} MB" if w in by_w else "-" for w in workers]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _ratio_of(rows: list[Row], key: str, a: Any, b: Any) -> dict[str, float]:
    """Per format: median over matching settings of rate(key=b) / rate(key=a)."""
    pairs: dict[tuple, dict[Any, float]] = defaultdict(dict)
    for r in rows:
        ident = tuple(
            (k, r[k])
            for k in ("format", "variant", "mmap", "fixed_length", "shuffle", "workers")
            if k != key
        )
        pairs[ident][r[key]] = r["samples_per_s"]
    per_format: dict[str, list[float]] = defaultdict(list)
    for ident, rates in pairs.items():
        if a in rates and b in rates and rates[a] > 0:
            fmt = dict(ident)["format"]
            variant = dict(ident)["variant"]
            per_format[f"{fmt}-{variant}" if variant else fmt].append(rates[b] / rates[a])
    return {name: median(v) for name, v in per_format.items()}


def _fmt_ratios(ratios: dict[str, float]) -> str:
    items = sorted(ratios.items(), key=lambda kv: kv[1])
    return ", ".join(f"{name} {x:.2f}x" for name, x in items)


def findings(rows: list[Row]) -> list[str]:
    """Sentences computed from the rows (medians of within-run ratios)."""
    out: list[str] = []
    workers = sorted({r["workers"] for r in rows})
    # lead with the fewest workers (in-process when 0 is measured): worker start-up dominates
    # small epochs, so a worker figure alone understates every format; it is given beside
    lead, other = workers[0], workers[-1]
    for fixed in (True, False):
        for shuffle in (False, True):
            sel = [
                r
                for r in rows
                if r["fixed_length"] == fixed and r["shuffle"] == shuffle and r["workers"] == lead
            ]
            if not sel:
                continue
            best = max(sel, key=lambda r: r["samples_per_s"])
            worst = min(sel, key=lambda r: r["samples_per_s"])
            out.append(
                f"- {'Fixed' if fixed else 'Variable'} length, "
                f"{'shuffled' if shuffle else 'sequential'}, {_workers_label(lead)}: fastest "
                f"{case_label(best)} at {_ratio(best['ratio_to_read_limit'])} of the read limit "
                f"({best['samples_per_s']:,.0f} samples/s{_beside(rows, best, other)}), slowest "
                f"{case_label(worst)} at {_ratio(worst['ratio_to_read_limit'])} "
                f"({worst['samples_per_s']:,.0f} samples/s{_beside(rows, worst, other)})."
            )
    shuffled = _ratio_of(rows, "shuffle", False, True)
    if shuffled:
        out.append(
            "- Shuffled / sequential rate (median per format; below 1 = shuffling costs): "
            + _fmt_ratios(shuffled)
            + "."
        )
    mm = _ratio_of([r for r in rows if r["mmap"] != "n/a"], "mmap", False, True)
    if mm:
        out.append("- mmap on / off rate (median per format): " + _fmt_ratios(mm) + ".")
    if len(workers) > 1:
        wk = _ratio_of(rows, "workers", workers[0], workers[-1])
        out.append(
            f"- {workers[-1]} workers / {workers[0]} workers rate (median per format): "
            + _fmt_ratios(wk)
            + "."
        )
    var = _ratio_of(rows, "fixed_length", True, False)
    if var:
        out.append("- Variable / fixed length rate (median per format): " + _fmt_ratios(var) + ".")
    capped = sorted({case_label(r) for r in rows if r["capped"]})
    if capped:
        out.append(
            "- Epochs stopped at the time cap (rate over the part read, marked *): "
            + ", ".join(capped)
            + "."
        )
    return out


def plot(rows: list[Row], path: Path, *, fixed: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = [r for r in rows if r["fixed_length"] == fixed]
    labels = list(dict.fromkeys(case_label(r) for r in sel))
    settings = _settings(sel)
    value = {(case_label(r), r["shuffle"], r["workers"]): r["ratio_to_read_limit"] for r in sel}
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) * max(1, len(settings) / 2) + 1.5))
    height = 0.8 / max(1, len(settings))
    for k, (shuffle, workers) in enumerate(settings):
        ys = [i + k * height for i in range(len(labels))]
        xs = [value.get((label, shuffle, workers), 0.0) for label in labels]
        ax.barh(ys, xs, height=height, label=_setting_label(shuffle, workers))
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))], labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("rate / read limit (sequential page-cache read), log scale")
    ax.set_title(f"{'fixed' if fixed else 'variable'}-length samples: checked epoch rate")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_storage(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first: dict[tuple[str, bool], Row] = {}
    for r in rows:
        name = f"{r['format']}-{r['variant']}" if r["variant"] else r["format"]
        first.setdefault((name, r["fixed_length"]), r)
    names = list(dict.fromkeys(n for n, _ in first))
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.3 * len(names) + 1.5), sharey=True)
    for k, fixed in enumerate((True, False)):
        ys = [i + k * 0.4 for i in range(len(names))]
        size = [
            first[(n, fixed)]["bytes_on_disk"] / first[(n, fixed)]["data_bytes"]
            if (n, fixed) in first
            else 0.0
            for n in names
        ]
        speed = [
            first[(n, fixed)]["data_bytes"] / first[(n, fixed)]["write_s"] / 1e6
            if (n, fixed) in first
            else 0.0
            for n in names
        ]
        label = "fixed" if fixed else "variable"
        axes[0].barh(ys, size, height=0.4, label=label)
        axes[1].barh(ys, speed, height=0.4, label=label)
    axes[0].set_yticks([i + 0.2 for i in range(len(names))], names, fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("bytes on disk / data bytes")
    axes[1].set_xlabel("write MB/s (to the page cache)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(rows: list[Row], meta: dict[str, Any], out: Path) -> list[Path]:
    """Write ``report.md`` and the plots into ``out``; returns the PNG paths."""
    pngs = []
    for fixed in (True, False):
        if any(r["fixed_length"] == fixed for r in rows):
            png = out / f"formats_{'fixed' if fixed else 'variable'}.png"
            plot(rows, png, fixed=fixed)
            pngs.append(png)
    if rows:
        png = out / "formats_storage.png"
        plot_storage(rows, png)
        pngs.append(png)
    m = meta["machine"]
    lines = [
        "# shardload bench formats",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {m['cpus']} CPUs, {m['memory_GB']:.0f} GB RAM, {m['platform']}, Python "
        f"{m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        f"Load average (1, 5, 15 min) at the start {_load(meta['load_avg_start'])}, at the end "
        f"{_load(meta.get('load_avg_end', []))}.",
        "",
        f"Dataset: {meta['num_samples']:,} float32 samples of {meta['sample_bytes']:,} bytes "
        f"(the mean for variable length), batches of {meta['batch_size']}, "
        f"{meta['group_rows']} samples per Arrow batch / Parquet row group / Zarr shard / tar "
        f"shard, seed {meta['seed']}. Every epoch checks each sample's XXH3-64 against the "
        "sample written and that the epoch held every sample once. Files are in the page cache "
        "(just written): the figures measure the software path, not the disk.",
        "",
    ]
    for label, lim in meta["limits"].items():
        lines.append(
            f"Read limit ({label}): {lim['read_limit_MB_per_s']:,.0f} MB/s — {lim['read_limit']}. "
            f"The check alone runs at {lim['check_MB_per_s']:,.0f} MB/s (one thread)."
        )
    for name, why in meta.get("skipped", {}).items():
        lines.append(f"Skipped {name}: {why}")
    lines += ["", "## What this run teaches", "", *findings(rows), ""]
    for fixed in (True, False):
        sel = [r for r in rows if r["fixed_length"] == fixed]
        if not sel:
            continue
        lines += [
            f"## {'Fixed' if fixed else 'Variable'}-length samples",
            "",
            "Cells: rate as a fraction of the read limit (samples/s after the first batch); "
            "* = epoch stopped at the time cap.",
            "",
            *main_table(sel),
            "",
            f"![{'fixed' if fixed else 'variable'}](formats_{'fixed' if fixed else 'variable'}.png)",
            "",
        ]
    lines += ["## Storage and write time", "", *storage_table(rows), ""]
    if rows:
        lines += ["![storage](formats_storage.png)", ""]
    peak = max((r["peak_rss_MB"] for r in rows), default=0.0)
    low = min((r["peak_rss_MB"] for r in rows), default=0.0)
    lines += [
        "## Peak memory",
        "",
        f"Peak RSS of the process and its workers (summed; mmap'd pages count in each process "
        f"that touched them): {low:,.0f} to {peak:,.0f} MB over all epochs; per epoch in "
        "results.json (`peak_rss_MB`, and `rss_before_MB` when the epoch began). Growth during "
        "the epoch (peak - before), the largest over each format's settings:",
        "",
        *memory_table(rows),
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    return pngs


def _workers_label(workers: int) -> str:
    return "in-process (0 workers)" if workers == 0 else f"{workers} workers"


def _beside(rows: list[Row], row: Row, workers: int) -> str:
    """``; 2 workers: N samples/s (R of the limit)`` for the same case with ``workers``."""
    if workers == row["workers"]:
        return ""
    keys = ("format", "variant", "mmap", "fixed_length", "shuffle")
    for r in rows:
        if r["workers"] == workers and all(r[k] == row[k] for k in keys):
            return (
                f"; {workers} workers: {r['samples_per_s']:,.0f} samples/s, "
                f"{_ratio(r['ratio_to_read_limit'])} of the limit"
            )
    return ""


def _load(avg: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in avg) if avg else "?"


def _ratio(x: float) -> str:
    """Two significant digits at least (ratios span 0.0001 to 2)."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"
