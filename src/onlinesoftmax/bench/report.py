"""Printed table, JSON, markdown and a PNG per suite."""

from __future__ import annotations

import json
import os
from collections import defaultdict

from .harness import X_LABELS, Row


def _need(module: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"the benchmark report needs {module}: pip install 'onlinesoftmax[bench]'") from e


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


HEADERS = ["case", "dtype", "impl", "ms", "GB/s", "TFLOP/s", "% copy", "× peer", "peer", "ok"]


def table_rows(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        out.append([r.case, r.dtype, r.impl, _fmt(r.ms, ".4g"), _fmt(r.gbps, ".4g"), _fmt(r.tflops, ".4g"),
                    _fmt(r.pct_ceiling, ".1f"), _fmt(r.speedup_vs_peer, ".2f"), r.peer,
                    "yes" if r.ok else f"NO {r.note}"])
    return out


def markdown(suite: str, rows: list[Row], env: dict, ceiling: float) -> str:
    tabulate = _need("tabulate").tabulate
    lines = [f"# Benchmark `{suite}`", "",
             f"- device: {env['device']}",
             f"- torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, Python {env['python']}",
             f"- commit {env['commit']}, {env['timestamp']}",
             f"- command: `{env['command']}`",
             f"- copy ceiling measured in this run: **{ceiling:.0f} GB/s** (read + write)"
             + ("" if "CPU" not in env["device"] else f"; CPU, {env.get('cpu_threads')} thread(s): no % of it (a "
                "CPU op's inputs sit in cache), and `onlinesoftmax` there is its portable path (torch's ops)"),
             "- ms: median; GB/s counts the fewest bytes the op must move; × peer = peer time / this time"
             + ("; host-timed rows: host time per eager call" if any(r.info.get("timing") == "host"
                                                                    for r in rows) else ""),
             ""]
    lines.append(tabulate(table_rows(rows), headers=HEADERS, tablefmt="github"))
    info_keys = list(dict.fromkeys(k for r in rows for k in r.info))
    if info_keys:   # suites that attach per-implementation columns (Case.impl_info) get a second table
        detail = [[r.case, r.impl, *(r.info.get(k, "-") for k in info_keys), _fmt(r.gbps, ".0f"),
                   _fmt(r.pct_ceiling, ".1f"), _fmt(r.speedup_vs_peer, ".2f")] for r in rows if r.info]
        lines += ["", tabulate(detail, headers=["case", "impl", *info_keys, "GB/s", "% copy", "× peer"],
                               tablefmt="github")]
    return "\n".join(lines) + "\n"


PLOT_COLUMNS = 3                 # panels per row of the figure
CEILING_SHOWN_ABOVE = 0.25       # draw the copy ceiling in a panel whose best GB/s reaches this share of it;
                                 # below, latency-bound panels keep their own scale and say the ceiling is off it


def plot(suite: str, rows: list[Row], ceiling: float, path: str) -> bool:
    """GB/s (or TFLOP/s) against the case's x for every implementation; one panel per group."""
    rows = [r for r in rows if r.x is not None and (r.gbps or r.tflops)]
    if not rows:
        return False
    _need("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)
    for r in rows:
        groups[r.group or r.dtype].append(r)
    cols = min(PLOT_COLUMNS, len(groups))
    nrows = -(-len(groups) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    for ax, (group, grows) in zip(axes.flat, sorted(groups.items(), key=lambda g: _group_key(g[0]))):
        by_impl = defaultdict(list)
        for r in grows:
            by_impl[r.impl].append((r.x, r.gbps if r.gbps else r.tflops))
        for impl, pts in by_impl.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        title = f"{suite}: {group}"
        if any(r.gbps for r in grows):
            if max(r.gbps or 0 for r in grows) >= CEILING_SHOWN_ABOVE * ceiling:
                ax.axhline(ceiling, color="k", linestyle="--", label=f"copy ceiling {ceiling:.0f} GB/s")
            else:
                title += f"\n(copy ceiling {ceiling:.0f} GB/s, off this scale)"
            ax.set_ylabel("GB/s")
        else:
            ax.set_ylabel("TFLOP/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(X_LABELS.get(suite, "N"))
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _group_key(group: str):
    """Panels in numeric order of the numbers in their names ("B=32" before "B=256")."""
    import re
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", group)]


def replot(json_path: str) -> str | None:
    """Draw the PNG of a results JSON again (beside it), from its rows as measured; None where no row has a rate
    to draw. A file that is not a suite's results JSON (not JSON, or without its suite, ceiling and rows) is a
    ValueError saying so."""
    with open(json_path) as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise ValueError(f"{json_path} is not JSON ({e})") from None
    try:
        suite, ceiling = data["suite"], data["copy_ceiling_gbps"]
        rows = [Row(**r) for r in data["rows"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{json_path} is not a results JSON written by `onlinesoftmax bench --out` "
                         f"({type(e).__name__}: {e})") from None
    path = os.path.splitext(json_path)[0] + ".png"
    return path if plot(suite, rows, ceiling, path) else None


def write(suite: str, rows: list[Row], env: dict, ceiling: float, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, suite)
    with open(base + ".json", "w") as f:
        json.dump({"suite": suite, "env": env, "copy_ceiling_gbps": ceiling,
                   "rows": [r.as_dict() for r in rows]}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(suite, rows, env, ceiling))
    paths = [base + ".json", base + ".md"]
    if plot(suite, rows, ceiling, base + ".png"):
        paths.append(base + ".png")
    return paths
