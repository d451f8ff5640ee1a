"""Packaging promises: import without GPU or Triton, one backend rule, the CLI and the bench harness."""

import json
import os
import subprocess
import sys

import pytest
import torch

from onlinesoftmax.backend import resolve_backend


def run_py(code: str, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


def test_import_does_not_load_triton_or_cuda():
    r = run_py("import sys, onlinesoftmax, torch\n"
               "assert 'triton' not in sys.modules, 'triton imported eagerly'\n"
               "assert 'transformers' not in sys.modules, 'transformers imported eagerly'\n"
               "assert not torch.cuda.is_initialized()\n"
               "print('ok')")
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_import_and_cpu_path_without_triton():
    # sys.modules['triton'] = None makes every `import triton` fail, as on a machine without it.
    r = run_py("import sys; sys.modules['triton'] = None\n"
               "import torch, onlinesoftmax\n"
               "from onlinesoftmax.backend import resolve_backend, triton_available\n"
               "assert not triton_available()\n"
               "s = onlinesoftmax.SoftmaxState.from_tensor(torch.randn(4, 9))\n"
               "assert resolve_backend(None, torch.zeros(1), 'op') == 'torch'\n"
               "try:\n    resolve_backend('triton', torch.zeros(1), 'op')\n"
               "except RuntimeError as e:\n    assert 'triton' in str(e); print('ok')\n")
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_backend_rule(monkeypatch):
    x = torch.zeros(2)
    assert resolve_backend(None, x, "op") == "torch"
    assert resolve_backend("torch", x, "op") == "torch"
    with pytest.raises(ValueError, match="backend must be"):
        resolve_backend("cuda", x, "op")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", x, "softmax")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("triton", x, "softmax") == "triton"


def test_cli_info():
    r = subprocess.run([sys.executable, "-m", "onlinesoftmax", "info"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "torch" in r.stdout and "backends:" in r.stdout


def test_bench_quick_writes_reports(tmp_path):
    r = subprocess.run([sys.executable, "-m", "onlinesoftmax", "bench", "--quick", "logsumexp", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "copy ceiling" in r.stdout
    data = json.loads((tmp_path / "logsumexp.json").read_text())
    assert data["copy_ceiling_gbps"] > 0
    rows = data["rows"]
    assert {r["impl"] for r in rows} == {"onlinesoftmax", "torch"}
    for row in rows:
        assert row["ok"] and row["ms"] > 0 and row["gbps"] > 0
        # a % of the copy ceiling on the GPU only (a CPU op's inputs sit in cache: it would pass 100 %)
        assert (row["pct_ceiling"] > 0) if torch.cuda.is_available() else row["pct_ceiling"] is None
        for key in ("device", "torch", "commit", "timestamp", "command"):
            assert row["meta"][key]
    assert (tmp_path / "logsumexp.md").read_text().startswith("# Benchmark `logsumexp`")
    assert (tmp_path / "logsumexp.png").stat().st_size > 1000
    (tmp_path / "logsumexp.png").unlink()            # `onlinesoftmax replot` draws it again from the JSON
    r = subprocess.run([sys.executable, "-m", "onlinesoftmax", "replot", str(tmp_path / "logsumexp.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "logsumexp.png").stat().st_size > 1000


def test_suites_name_their_plot_axis():
    from onlinesoftmax.bench import suites  # noqa: F401
    from onlinesoftmax.bench.harness import X_LABELS
    assert X_LABELS["topk"] == "k" and X_LABELS["topk-paper"] == "V" and X_LABELS["softmax"] == "N"


def test_bench_unknown_suite():
    r = subprocess.run([sys.executable, "-m", "onlinesoftmax", "bench", "nope"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "unknown suite" in (r.stderr + r.stdout)


def test_bench_out_naming_a_file_is_an_error_before_the_run(tmp_path):
    """`bench --out` naming an existing file (not a folder) is one error line and exit status 2 before any suite
    runs, not a FileExistsError traceback after the whole run."""
    path = tmp_path / "results"
    path.write_text("")
    r = subprocess.run([sys.executable, "-m", "onlinesoftmax", "bench", "--quick", "logsumexp", "--out", str(path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--out" in r.stderr and str(path) in r.stderr and "copy ceiling" not in r.stdout


def test_bench_suite_without_a_case_for_the_dtype_is_skipped(tmp_path):
    """A suite with no case for the dtypes asked (`bench softmax --dtype fp64`) says so and writes no report: an
    empty JSON / markdown in --out would replace an earlier run's results."""
    import io

    from rich.console import Console

    from onlinesoftmax.bench import runner

    out = io.StringIO()
    res = runner.run(["softmax"], device=torch.device("cpu"), quick=True, out_dir=str(tmp_path / "out"),
                     dtypes=(torch.float64,), console=Console(file=out, width=200))
    assert res["results"] == {} and not (tmp_path / "out").exists()
    assert "softmax: skipped (no case for the dtype(s) asked: float64)" in out.getvalue()


@pytest.mark.parametrize("text", ["not json", "{}", '{"V": 128256, "rows": [{"V": 1}]}', "[1]"])
def test_replot_rejects_a_file_that_is_not_results(tmp_path, text):
    """`onlinesoftmax replot` on a file that is not a suite's results JSON (a probe's JSON, any other file) is one
    line on stderr and exit status 2, not a traceback."""
    path = tmp_path / "x.json"
    path.write_text(text)
    r = subprocess.run([sys.executable, "-m", "onlinesoftmax", "replot", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "onlinesoftmax: error: replot:" in r.stderr and str(path) in r.stderr


def test_run_case_checks_all_but_the_yardsticks():
    """run_case compares every implementation with the peer except those named ``unchecked`` (a copy of x timed
    beside the op): a wrong op is reported as a mismatch, a yardstick is timed and labelled."""
    from onlinesoftmax.bench.harness import BenchContext, Case, copy_ceiling_gbps, environment, run_case

    ctx = BenchContext(device=torch.device("cpu"), quick=True)
    case = Case(label="4x8", shape=(4, 8), dtype=torch.float32, make_inputs=lambda: (torch.randn(4, 8),),
                impls={"torch": lambda x: torch.softmax(x, -1), "wrong": lambda x: x * 2,
                       "copy of x": lambda x: x.clone()}, peer="torch", bytes=256, unchecked=("copy of x",))
    rows = {r.impl: r for r in run_case("t", case, ctx, copy_ceiling_gbps(ctx.device, quick=True), environment())}
    assert rows["torch"].ok and not rows["wrong"].ok and "mismatch" in rows["wrong"].note
    assert rows["copy of x"].ok and "not checked" in rows["copy of x"].note and rows["copy of x"].ms > 0


def test_host_suite_runs_on_cpu():
    """The host suite's cases (softmax family with and without a gradient, softmax_topk against torch.topk) run and
    report a host time per call for both implementations, whose outputs agree (CPU, quick)."""
    from onlinesoftmax.bench import suites  # noqa: F401
    from onlinesoftmax.bench.harness import SUITES, BenchContext, copy_ceiling_gbps, environment, run_case

    ctx = BenchContext(device=torch.device("cpu"), quick=True)
    ceiling, env = copy_ceiling_gbps(ctx.device, quick=True), environment()
    cases = list(SUITES["host"](ctx))
    assert "softmax_topk k=50 no grad" in [case.label for case in cases]
    for case in cases:
        rows = run_case("host", case, ctx, ceiling, env)
        assert {r.impl for r in rows} == {"onlinesoftmax", "torch"} and all(r.ms > 0 for r in rows), rows
        assert all(r.ok for r in rows), [(r.case, r.impl, r.note) for r in rows if not r.ok]


def test_backward_suites_match_torch_on_cpu():
    """The two backward suites build their inputs (y of their op: probabilities, log-probabilities) and our op
    matches torch's own backward on them (quick sizes, CPU)."""
    from onlinesoftmax.bench import suites  # noqa: F401
    from onlinesoftmax.bench.harness import SUITES, BenchContext, copy_ceiling_gbps, environment, run_case

    ctx = BenchContext(device=torch.device("cpu"), quick=True)
    ceiling, env = copy_ceiling_gbps(ctx.device, quick=True), environment()
    for suite, top in (("softmax_backward", 1.0), ("log_softmax_backward", 0.0)):
        cases = list(SUITES[suite](ctx))
        assert cases and all(case.bytes == 3 * case.shape[0] * case.shape[1] * 4 for case in cases)
        y, _ = cases[0].make_inputs()
        assert y.max() <= top + 1e-6 and (y.max() > 0) == (top > 0)     # probabilities / log-probabilities
        for case in cases:
            rows = run_case(suite, case, ctx, ceiling, env)
            assert {r.impl for r in rows} == {"onlinesoftmax", "torch"} and all(r.ok for r in rows), rows
