"""warmup: which calls it makes, and (on the GPU) that after it a first call with a new row count, k or batch size
compiles nothing (<= 50 ms)."""

import dataclasses
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
