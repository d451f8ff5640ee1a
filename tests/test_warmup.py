"""warmup: which calls it makes, and (on the GPU) that after it a first call with a new row count, k or batch size
compiles nothing (<= 50 ms)."""

import dataclasses
import sys
import time

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax.softmax import explain
from onlinesoftmax.softmax.launch import warmup_rows
from onlinesoftmax.target import H200


@pytest.mark.parametrize("N", [32000, 128256, 262144])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_warmup_rows_are_few_and_cover_every_variant(N, dtype):
    """A handful of row counts cover every compiled forward variant of M <= 1024 on the H200 (the plan's
    constexprs change with M in a few classes; Triton specialises the run-time integers on == 1 and % 16)."""
    for mode in (0, 1, 2):
        rows = warmup_rows(N, dtype, mode, 1024, H200)
        assert rows[0] == 1 and len(rows) <= 8, rows
        assert rows == sorted(set(rows)) and rows[-1] <= 1024


@pytest.mark.parametrize("N", [32000, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_warmup_rows_cover_the_plans_calls_make(N, dtype):
    """Every plan a call on contiguous [M, N] rows makes (``explain`` on the meta device, M <= 1024) is among the
    warmed rows' plans: the listed rows take the calls' own row view (another view misses the shared-memory kernel
    of M > 264 on the H200)."""
    for op, mode in (("softmax", 0), ("logsumexp", 2)):
        warmed = {_shape_free(explain(torch.empty(M, N, dtype=dtype, device="meta"), op=op, target=H200))
                  for M in warmup_rows(N, dtype, mode, 1024, H200)}
        for M in range(1, 1025, 7):
            plan = explain(torch.empty(M, N, dtype=dtype, device="meta"), op=op, target=H200)
            assert _shape_free(plan) in warmed, (op, M, plan)


def _shape_free(plan):
    return dataclasses.replace(plan, grid=0)


def test_warmup_argument_checks():
    with pytest.raises(ValueError, match="softmax_ops"):
        oss.warmup(softmax_ops=("softmaxx",), device="cpu")
    for bad in (0, -5, 2.5, True):          # (0 raised under softmax_topk's name)
        with pytest.raises(ValueError, match="^warmup: vocab_size must be an int >= 1"):
            oss.warmup(bad, device="cpu")


def test_warmup_checks_every_argument_before_running(monkeypatch):
    """Each sequence argument holds ints >= 1 (or float dtypes the kernels take), checked before any call runs:
    top_k = 0 or -5 was warmed as k = 16, 2.5 as 2, softmax_sizes = 0 ran empty tensors, a negative size or batch
    failed inside torch, and a bad softmax_ops entry was found only after the top-k warm-up had run."""
    ran = []
    monkeypatch.setattr(sys.modules["onlinesoftmax.warmup"], "topk_warmup", lambda *a, **kw: ran.append(kw) or 0)
    for kw, err, what in (({"top_k": (0,)}, ValueError, "top_k"), ({"top_k": (-5,)}, ValueError, "top_k"),
                          ({"top_k": (2.5,)}, TypeError, "top_k"), ({"top_k": None}, TypeError, "top_k"),
                          ({"batch_sizes": (0,)}, ValueError, "batch_sizes"),
                          ({"batch_sizes": (-1,)}, ValueError, "batch_sizes"),
                          ({"dtypes": (torch.int32,)}, TypeError, "dtypes"),
                          ({"softmax_sizes": (0,)}, ValueError, "softmax_sizes"),
                          ({"softmax_sizes": (2.7,)}, TypeError, "softmax_sizes"),
                          ({"max_rows": 0}, ValueError, "max_rows"), ({"max_rows": 2.5}, ValueError, "max_rows"),
                          ({"softmax_ops": ("softmax", "softmaxx")}, ValueError, "softmax_ops")):
        with pytest.raises(err, match=f"^warmup: {what}"):
            oss.warmup(64, device="cpu", **kw)
    assert not ran
    with pytest.raises(ValueError, match="^warmup: top_k"):
        sys.modules["onlinesoftmax.topk.warmup"].warmup(64, top_k=(0,), device="cpu")


def test_warmup_takes_single_values(monkeypatch):
    """A single value where a sequence is expected: ``softmax_ops="log_softmax"`` was iterated by character (a
    ValueError naming 'l'), ``top_k=50`` and ``softmax_sizes=16`` raised 'int' object is not iterable."""
    seen = []
    monkeypatch.setattr(sys.modules["onlinesoftmax.warmup"], "topk_warmup", lambda v, **kw: seen.append(kw) or 0)
    assert oss.warmup(64, top_k=50, batch_sizes=1, dtypes=torch.bfloat16, device="cpu") == 0
    assert seen == [dict(top_k=(50,), batch_sizes=(1,), dtypes=(torch.bfloat16,), sampling=True,
                         device=torch.device("cpu"))]
    calls = []
    monkeypatch.setattr(sys.modules["onlinesoftmax.softmax.api"], "log_softmax",
                        lambda x, dim: calls.append(tuple(x.shape)))
    n = oss.warmup(device="cpu", softmax_sizes=16, softmax_ops="log_softmax", max_rows=2)
    assert n == len(calls) >= 1 and all(shape[1] == 16 for shape in calls)


def test_warmup_warms_each_drawing_sample_call_in_its_captured_form(monkeypatch):
    """Beside each ``sample`` call that draws, ``warmup`` launches the kernels of that call captured into a CUDA
    graph under the default ``graph_draw`` ("kernel"): the same parameters, u in the capture's form (zeroed int64
    slots per row and six words: ``philox`` 2). Recorded at ``sample_2d`` on CPU tensors that take the kernels'
    path (``resolve_backend`` patched; the recorder returns None: the torch path finishes each call)."""
    from onlinesoftmax.topk import sampling

    seen = []

    def record(x, t, kk, pp, qq, u, knobs, capturing=None):
        seen.append((x.shape[0], t, kk, pp, qq, u))

    monkeypatch.setattr(sampling, "resolve_backend", lambda backend, x, op: "triton")
    monkeypatch.setattr(sampling, "_sample_2d", record)
    oss.warmup(300, top_k=(5, 50), batch_sizes=(1, 3), device="cpu")

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.stride() == b.stride() and torch.equal(a, b)
        return type(a) is type(b) and a == b

    pairs, greedy, i = [], 0, 0
    while i < len(seen):
        B, t, kk, pp, qq, u = seen[i]
        if u is None:                               # all greedy: a capture launches the eager call's kernels
            assert t == 0.0
            greedy += 1
            i += 1
            continue
        assert isinstance(u, torch.Tensor) and u.dtype == torch.float32 and u.shape == (B,), i
        w = seen[i + 1]
        assert all(same(a, b) for a, b in zip(seen[i][:5], w[:5])), (seen[i], w)
        assert type(w[5]) is tuple and len(w[5]) == 7, w
        slots = w[5][0]
        assert slots.dtype == torch.int64 and slots.shape == (B,) and not slots.any()
        pairs.append((B, type(t).__name__, type(kk).__name__, pp is not None, qq is not None))
        i += 2
    # per batch size: int top_k 16 and 64 with and without a temperature, top-p + min-p, per-row tensors; greedy
    assert greedy == 2 and sorted(pairs) == sorted(
        [(B, *m) for B in (1, 3) for m in [("float", "int", True, False), ("float", "int", False, False)] * 2
         + [("float", "NoneType", True, True), ("Tensor", "Tensor", False, False)]])


@pytest.mark.gpu
def test_gpu_softmax_no_compile_stall_after_warmup():
    N = 128256
    oss.warmup(softmax_sizes=[N], softmax_ops=("softmax", "logsumexp"), max_rows=512)
    for M in (2, 37, 129, 301, 512):
        x = torch.randn(M, N, device="cuda")
        for fn in (oss.softmax, oss.logsumexp):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(x, -1)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            assert ms <= 50, (M, fn.__name__, ms)
