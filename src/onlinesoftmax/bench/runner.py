"""Run registered suites: ceiling first, then every case with a progress bar, then the reports."""

from __future__ import annotations

import torch

from . import report, suites  # noqa: F401  (suites register themselves on import)
from .harness import SUITES, BenchContext, Skip, copy_ceiling_gbps, environment, run_case

CPU_THREADS = 1             # CPU runs time every op on this many threads (stable figures, ours and torch alike)
RESULTS = "benchmarks/results/ (H200: every suite's latest full run, JSON + markdown + PNG)"


def run(names: list[str] | None, *, device: torch.device, quick: bool, out_dir: str | None,
        dtypes=None, console=None) -> dict:
    try:
        from rich.console import Console
        from rich.progress import Progress
        from rich.table import Table
    except ImportError as e:
        raise ImportError("onlinesoftmax bench needs rich: pip install 'onlinesoftmax[bench]'") from e
    console = console or Console(width=None if Console().is_terminal else 150)
    names = names or sorted(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; available: {sorted(SUITES)}")
    ctx = BenchContext(device=device, quick=quick, dtypes=dtypes)
    if device.type == "cpu":
        torch.set_num_threads(CPU_THREADS)
    env = environment()
    ceiling = copy_ceiling_gbps(device, quick)
    env["copy_ceiling_gbps"] = ceiling
    console.print(f"[bold]{env['device']}[/] torch {env['torch']} triton {env['triton']} "
                  f"commit {env['commit']}")
    console.print(f"copy ceiling (device-to-device, read + write): [bold]{ceiling:.0f} GB/s[/]")
    if device.type == "cpu":
        console.print(f"CPU run on {CPU_THREADS} thread(s): onlinesoftmax runs its portable path here (torch's own "
                      "ops where the semantics match); the Triton kernels need a CUDA GPU")
    results = {}
    for name in names:
        try:
            cases = list(SUITES[name](ctx))
        except Skip as e:
            console.print(f"[bold]{name}[/]: skipped ({e})")
            continue
        if not cases:           # e.g. --dtype fp64: no table, and no empty report over an earlier run's
            why = ("no case for the dtype(s) asked: " + ", ".join(str(d).removeprefix("torch.") for d in dtypes)
                   if dtypes else "no case to run")
            console.print(f"[bold]{name}[/]: skipped ({why})")
            continue
        rows = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"bench {name}", total=len(cases))
            for case in cases:
                progress.update(task, description=f"{name} {case.label} {case.dtype}")
                rows.extend(run_case(name, case, ctx, ceiling, env))
                progress.advance(task)
        table = Table(title=f"{name} (copy ceiling {ceiling:.0f} GB/s)")
        for h in report.HEADERS:
            table.add_column(h)
        for r in report.table_rows(rows):
            table.add_row(*r)
        console.print(table)
        if out_dir:
            for p in report.write(name, rows, env, ceiling, out_dir):
                console.print(f"wrote {p}")
        results[name] = rows
    console.print(f"Committed GPU results: {RESULTS}")
    return {"env": env, "ceiling": ceiling, "results": results}
