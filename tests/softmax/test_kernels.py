"""The kernel paths, run: under the interpreter at small sizes (CPU), and on the GPU (``@pytest.mark.gpu``) at
sizes the interpreter cannot afford and with kernels only the GPU runs (shared memory, Gluon, bf16 words).

Which kernel ran is read from ``explain`` (the plan a call runs) or from the Plan that ``launch.forward`` /
``launch.backward`` return; plans the H200 would make for the same problems are checked here on the CPU too.
"""

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax.softmax import explain
from onlinesoftmax.softmax import tuned as T
from onlinesoftmax.softmax.plan import LOG_SOFTMAX, LOGSUMEXP, SOFTMAX, Knobs, backward_plan, smem_bwd_config
from onlinesoftmax.target import H200, target_of

from ._helpers import (
    DEV,
    DTYPES,
    FNS,
    HAS_CUDA,
    assert_dx_within_eager,
    assert_grad_like_eager,
    assert_matches_low_precision_eager,
    backward_problem,
    run_backward,
    run_forward,
)

SMS = target_of(DEV).sm_count            # the device's: 4 in the interpreter


def _many_rows(target=None) -> int:
    """The fewest rows that are not "few rows" (decode sizes) on ``target`` (the device's)."""
    return T.DECODE_MAX_ROWS_PER_SM * (target.sm_count if target else SMS) + 1


# ---- interpreter (CPU) and GPU ----------------------------------------------------------------------------------
@pytest.mark.parametrize("m,n,path", [(64, 1000, "rows"), (3, 50000, "split" if not HAS_CUDA else "coop")])
def test_op_runs_the_chosen_path(m, n, path):
    x = torch.randn(m, n, device=DEV)
    assert explain(x, backend="triton").path == path
    torch.testing.assert_close(oss.softmax(x, backend="triton"), torch.softmax(x, -1))
    assert explain(x, op="logsumexp", backend="triton").path == ("rows" if path == "rows" else "chunks")
    torch.testing.assert_close(oss.logsumexp(x, backend="triton"), torch.logsumexp(x, -1))


@pytest.mark.parametrize("dtype,n,block_m,warps", [
    (torch.float32, 4096, 1, 16), (torch.float32, 1024, 1, 4), (torch.bfloat16, 1024, 1, 2),
    (torch.bfloat16, 16384, 1, 16), (torch.float32, 16384, 1, 32), (torch.float32, 512, 16, 16),
])
def test_rows_warps(dtype, n, block_m, warps):
    """From ONE_ROW_MIN_N one row per program, ROW_BYTES_PER_WARP of it per warp (ROW_WARPS_MEASURED where
    measured otherwise); rows of at most 2 KB below it take the prefetching loop's tiles of PREFETCH_TILE_ELEMS.
    x starts one element off a 16-byte boundary: on the H200, 16-bit rows of SMEM_ROWS lengths would otherwise take
    the shared-memory kernel. The device's plan and the H200's."""
    x = torch.randn(64, n + 1, device=DEV).to(dtype)[:, 1:]
    out = oss.softmax(x, backend="triton")
    for plan in (explain(x, backend="triton"), explain(x, target=H200)):
        assert (plan.path, plan.kernel, plan.block_m, plan.num_warps) == ("rows", "rows", block_m, warps), plan
    assert_matches_low_precision_eager("softmax", out, x, -1)


@pytest.mark.parametrize("dtype,n,prefetch,kernel", [(torch.float32, 1024, False, None),
                                                     (torch.float32, 4096, True, "pipe"),
                                                     (torch.bfloat16, 16384, True, "pipe"),
                                                     (torch.float32, 32768, False, "pipe"),
                                                     (torch.bfloat16, 32768, True, "stream")])
def test_logsumexp_rows_kernels(dtype, n, prefetch, kernel):
    """logsumexp of many rows: LSE_PIPE lengths run the pipelined kernel on the H200, 16-bit rows from
    LSE_STREAM lengths the streaming kernel; the others, and every length in the interpreter, the register kernel,
    which prefetches rows of 16-64 KB."""
    x = torch.randn(2 * _many_rows() - 1, n, device=DEV).to(dtype)      # not "few rows"
    lse = oss.logsumexp(x, backend="triton")
    plan = explain(x, op="logsumexp", backend="triton")
    if target_of(DEV).sm90 and kernel:
        assert (plan.path, plan.kernel) == ("rows", kernel), plan
    else:
        assert (plan.path, plan.kernel, plan.prefetch) == ("rows", "rows", prefetch), plan
    h200 = explain(torch.empty(2 * _many_rows(H200) - 1, n, dtype=dtype, device="meta"), op="logsumexp", target=H200)
    assert (h200.path, h200.kernel) == ("rows", kernel or "rows") and (kernel or h200.prefetch is prefetch), h200
    # against fp64: torch.logsumexp on fp32 CPU tensors is off by up to 3.3e-5 here in about one process in ten
    # (the same x, 4.7e-7 in the others), which made this test flaky against an fp32 reference
    torch.testing.assert_close(lse, torch.logsumexp(x.double(), -1).to(dtype))


@pytest.mark.parametrize("dtype,block_m,warps", [(torch.bfloat16, 8, 16), (torch.float32, 2, 8)])
def test_backward_rows_tile(dtype, block_m, warps):
    """The backward's register `rows` kernel at N = 1K (where the smem kernel of SMEM_BWD_ROWS does not run: the
    interpreter, or smem=False): 16-bit tiles of BWD_ROWS_MEASURED (8 rows, 16 warps), fp32 2 rows with 8 warps."""
    y = torch.softmax(torch.randn(64, 1024, device=DEV), -1).to(dtype)
    dy = torch.randn(64, 1024, device=DEV).to(dtype)
    dx, plan = run_backward(y, dy, False, Knobs.of(smem=False))
    h200 = backward_plan(backward_problem(64, 1024, dtype, False), H200, Knobs.of(smem=False))
    for p in (plan, h200):
        assert (p.path, p.kernel, p.block_m, p.num_warps) == ("rows", "rows", block_m, warps), p
    ref = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    torch.testing.assert_close(dx.float(), ref, atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=1e-2)


@pytest.mark.parametrize("log", [False, True])
def test_backward_long_rows_chunk(log):
    """Many long rows: the backward's register kernels hold BWD_COOP_CHUNK elements of y and dy per program, 8
    warps (the interpreter); on the H200 the shared-memory kernel takes them, as SMEM_BWD_CONFIG says (log-softmax:
    with its ring of y)."""
    m = _many_rows()
    name = "log_softmax" if log else "softmax"
    ours, theirs = FNS[name][:2]
    x = torch.randn(m, 40000, device=DEV, requires_grad=True)
    g = torch.randn(m, 40000, device=DEV)
    ours(x, backend="triton").backward(g)
    plan = explain(x, op=name, grad=True, backend="triton")
    target = target_of(DEV)
    if target.sm90:
        chunk, warps, reg, ring = smem_bwd_config(backward_problem(m, 40000, torch.float32, log), target)
        assert (plan.kernel, plan.chunk, plan.num_warps, plan.reg, plan.ring) == \
            ("smem", chunk, warps, reg, ring) and (ring > 0) == log, plan
    else:
        assert (plan.chunk, plan.num_warps) == (T.BWD_COOP_CHUNK, 8) and plan.path in ("coop", "split"), plan
    x2 = x.detach().clone().requires_grad_()
    theirs(x2, -1).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)


def test_logsumexp_long_rows_chunk():
    """Many long rows: LSE_CHUNK elements per program (few rows keep the decode chunking)."""
    for m, chunk in ((_many_rows(), T.LSE_CHUNK), (2, None)):
        x = torch.randn(m, 40000, device=DEV)
        torch.testing.assert_close(oss.logsumexp(x, backend="triton"), torch.logsumexp(x, -1))
        plan = explain(x, op="logsumexp", backend="triton")
        assert plan.path == "chunks", plan
        if chunk:
            assert (plan.chunk, plan.num_warps) == (chunk, T.LSE_CHUNK_WARPS), plan
        else:
            assert plan.chunk != T.LSE_CHUNK, plan


@pytest.mark.parametrize("dtype,n,prefetch", [(torch.bfloat16, 512, True), (torch.bfloat16, 1024, False),
                                              (torch.float32, 1024, False)])
def test_prefetching_loop_only_for_short_rows(dtype, n, prefetch):
    x = torch.randn(64, n, device=DEV).to(dtype)
    plan = explain(x, backend="triton")
    assert plan.path == "rows" and plan.prefetch is prefetch, plan
    torch.testing.assert_close(oss.softmax(x, backend="triton").float(), torch.softmax(x.float(), -1),
                               atol=1e-2, rtol=1e-2)


# ---- GPU only: sizes the interpreter cannot afford, kernels only the GPU runs ------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("m,n", [(37, 1024), (37, 1040), (19, 4096), (9, 12672), (5, 16384)])
def test_gpu_smem_backward_rows(dtype, log, m, n):
    """The backward through the smem kernel holding whole rows (SMEM_BWD_ROWS; log-softmax with its ring of y)
    against fp64 dx (error within twice torch's + 4 eps of max |dx|): y from rows holding -inf, padded row strides,
    dy 16 bytes in, a partial last sub-tile (1040, 12672); dy one element in falls back to the register rows
    kernel; autograd through oss.softmax / oss.log_softmax takes the same kernel."""
    name = "log_softmax" if log else "softmax"
    ours_fn, fwd = FNS[name][:2]
    torch_bwd = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    x = (torch.randn(m, n + 16, device="cuda") * 3)
    x[1, 5], x[m - 1, :3] = float("-inf"), float("-inf")
    y = fwd(x[:, :n], -1).to(dtype)
    gbase = torch.randn(m, n + 16, device="cuda").to(dtype)
    for dy, smem in ((gbase[:, :n], True), (gbase[:, 16 // dtype.itemsize:n + 16 // dtype.itemsize], True),
                     (gbase[:, 1:n + 1], False)):
        dx, plan = run_backward(y, dy, log)
        assert plan.path == "rows" and (plan.kernel == "smem") is smem, plan
        assert_dx_within_eager(dx, torch_bwd(dy, y, -1, dtype), y.double(), dy.double(), log)
    g = gbase[:, :n]
    xs, xt = (x[:, :n].to(dtype).detach().clone().requires_grad_() for _ in range(2))
    ours_fn(xs, -1).backward(g)
    assert explain(xs, op=name, grad=True).kernel == "smem"
    fwd(xt, -1).backward(g)
    assert_dx_within_eager(xs.grad, xt.grad, fwd(x[:, :n].to(dtype).double(), -1), g.double(), log)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(1, 262144), (8, 151936), (32, 128256), (300, 131072), (64, 262144),
                                 (3, 3_000_000), (4096, 4096), (1024, 32768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_large_shapes(m, n, dtype):
    x = (torch.randn(m, n, device="cuda") * 4).to(dtype)
    for name in FNS:
        assert_matches_low_precision_eager(name, FNS[name][0](x, -1), x, -1)
    g = torch.randn_like(x)
    a = x.clone().requires_grad_()
    b = x.clone().float().requires_grad_()
    oss.softmax(a).backward(g)
    torch.softmax(b, -1).backward(g.float())
    torch.testing.assert_close(a.grad.float(), b.grad, atol=1e-5 if dtype == torch.float32 else 1e-2,
                               rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,kernel", [(1024, "rows"), (4096, "smem"), (131072, "smem")])
def test_gpu_more_than_2_31_elements(n, kernel):
    """Offsets past 2^31: 2^31 + 3 rows of bf16 elements; check the rows beyond the 32-bit boundary (N = 1024:
    rows path in registers; N = 4096: a whole row in shared memory; N = 131072: the shared-memory coop kernel;
    logsumexp: the pipelined kernel at N = 1024 and 4096, the streaming kernel at 131072)."""
    m = (1 << 31) // n + 3
    x = torch.empty(m, n, device="cuda", dtype=torch.bfloat16).normal_()
    y = oss.softmax(x)
    assert explain(x).kernel == kernel
    tail = slice(m - 5, m)
    torch.testing.assert_close(y[tail].float(), torch.softmax(x[tail].float(), -1), atol=1e-2, rtol=1e-2)
    lse = oss.logsumexp(x)
    assert explain(x, op="logsumexp").kernel == ("pipe" if n <= 4096 else "stream")
    torch.testing.assert_close(lse[tail].float(), torch.logsumexp(x[tail].float(), -1), atol=1e-2, rtol=1e-2)
    del y
    xt = x[:, :1].expand(m, 3)  # stride 0 columns, still 64-bit rows
    torch.testing.assert_close(oss.softmax(xt, -1)[tail].float(), torch.full((5, 3), 1 / 3, device="cuda"),
                               atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,kernel", [(300, 131072, "bf16x2"), (600, 32768, "bf16x2"), (3, 151936, "chunks")])
def test_gpu_bf16x2_coop_kernel_and_its_fallbacks(m, n, kernel):
    """Many bf16 coop rows of unit stride, even N and 4-byte aligned starts run the packed kernel; an odd start,
    an odd N, strided columns and decode sizes do not; rows holding ±inf / NaN / all -inf keep torch's
    semantics everywhere. (Row strides of N + 2: not the shared-memory kernel's multiples of 16.)"""
    base = (torch.randn(m, n + 2, device="cuda") * 4).to(torch.bfloat16)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[m - 1, 3] = float("-inf")
    few = m < _many_rows()
    fallback = ("coop", "chunks") if n > T.ROW_MAX_N or few else ("rows", "rows")
    cases = [(base[:, :n], ("coop", kernel)), (base[:, 1:n + 1], fallback), (base[:, :n - 1], fallback),
             (base.t().contiguous()[:n].t(), fallback)]
    for x, (path, kern) in cases:
        for name in ("softmax", "log_softmax"):
            out = FNS[name][0](x, -1)
            plan = explain(x, op=name)
            assert (plan.path, plan.kernel) == (path, kern), (x.stride(), x.shape, plan)
            assert_matches_low_precision_eager(name, out, x, -1)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(600, 32768), (300, 131072)])
def test_gpu_bf16x2_backward_and_its_fallbacks(m, n):
    """Many bf16 coop rows: the backward holds y and dy as words when y, dy, dx are unit-stride rows with even N
    and 4-byte aligned starts; dy starting on an odd element, or an odd N, takes the generic kernel. (The plan of
    the launch autograd makes: launch.backward on the same y and dy, which gives autograd's dx bit for bit. y of
    x.clone(), as autograd's: a clone of the odd-N view is contiguous, and a forward on other strides may round
    differently.)"""
    x = (torch.randn(m, n, device="cuda") * 4).to(torch.bfloat16)
    gbase = torch.randn(m, n + 2, device="cuda").to(torch.bfloat16)
    cases = [(x, gbase[:, :n], "bf16x2"), (x, gbase[:, 1:n + 1], "chunks"), (x[:, :n - 1], gbase[:, :n - 1], "chunks")]
    for xx, g, kern in cases:
        for fn, torch_fn, log in ((oss.softmax, torch.softmax, False), (oss.log_softmax, torch.log_softmax, True)):
            grad = assert_grad_like_eager(fn, torch_fn, xx, g, "triton")
            dx, plan = run_backward(fn(xx.clone(), -1), g, log)     # y as autograd saved it (of x.clone())
            assert (plan.path, plan.kernel) == ("coop", kern), (g.stride(), g.storage_offset(), plan)
            assert torch.equal(dx, grad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,chunk,warps,reg", [
    (40, 131072, 8192, 8, 0), (9, 50256, 6144, 8, 0), (5, 12672, 16384, 4, 0), (70, 262144, 11264, 4, 0),
    (40, 131072, 16384, 8, 4), (9, 50256, 6144, 4, 1), (5, 12672, 16384, 4, 4), (70, 262144, 16384, 4, 4),
    (33, 128256, 16384, 8, 4),
])
def test_gpu_smem_coop_kernel(dtype, m, n, chunk, warps, reg):
    """The shared-memory coop kernel against fp64: partial last chunks, one chunk per row, rows holding
    ±inf / NaN / all -inf, strided rows and dim 0 (rows interleaved in memory), `reg` sub-tiles in registers (bf16:
    as int32 words; and with an fp32 output, unpacked); x starting off a 16-byte boundary takes the register kernels
    instead."""
    base = (torch.randn(m, n + 32, device="cuda") * 4).to(dtype)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[m - 1, 3], base[3, n - 2] = float("-inf"), float("inf")       # also a +inf in the register sub-tiles
    base[4] -= 200                                                      # far below 0
    base[m - 2, :n // 2] = float("-inf")                                # -inf up to mid-row
    forced = Knobs.of(path="coop", smem=True, chunk=chunk, num_warps=warps, reg=reg)
    cases = [(base[:, :n], -1, "smem", None), (base[:, 16:n + 16], -1, "smem", None),
             (base[:, :n].t(), 0, "smem", None), (base[:, 1:n + 1], -1, None, None)]
    if reg and dtype == torch.bfloat16:
        cases.append((base[:, :n], -1, "smem", torch.float32))
    for x, dim, kern, out_dtype in cases:
        for name, mode in (("softmax", SOFTMAX), ("log_softmax", LOG_SOFTMAX)):
            knobs = forced if kern else Knobs.of(path="coop", smem=True)
            out, plan = run_forward(x, dim, mode, knobs, out_dtype)
            keep_e = mode == SOFTMAX and dtype != torch.float32 and out_dtype is None     # e_j kept (KEEP_E)
            if kern is None:
                assert plan.path == "coop" and plan.kernel != "smem", plan
            else:
                assert (plan.kernel, plan.chunk, plan.reg, plan.keep_e) == ("smem", chunk, reg, keep_e), plan
            assert_matches_low_precision_eager(name, out, x, dim, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,warps,ctas", [(300, 32768, 16, 1), (600, 16384, 8, 2), (600, 12672, 8, 2),
                                            (3000, 4096, 4, 8), (9000, 1024, 1, 32), (7, 2048, 2, 16)])
def test_gpu_logsumexp_pipe_kernel(dtype, m, n, warps, ctas):
    """logsumexp_rows_pipe_kernel against fp64: several rows per program (the next row in flight while this one is
    reduced), fewer rows than programs, a partial block (12672 below 16384), rows holding ±inf / NaN / all -inf,
    strided rows and dim 0; x off a 16-byte boundary takes the register kernel."""
    base = (torch.randn(m, n + 32, device="cuda") * 4).to(dtype)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[m - 1, 3], base[3, n - 1] = float("-inf"), float("inf")
    knobs = Knobs.of(path="rows", stream=False, pipe=True, num_warps=warps, ctas=ctas)
    cases = [(base[:, :n], -1, True), (base[:, 16:n + 16], -1, True), (base[:, :n].t(), 0, True),
             (base[:, 1:n + 1], -1, False)]
    for x, dim, pipe in cases:
        out, plan = run_forward(x, dim, LOGSUMEXP, knobs)
        assert (plan.path == "rows" and plan.kernel == "pipe") is pipe, plan
        if pipe:
            assert plan.grid == min(m, ctas * target_of(x.device).sm_count), plan
        assert_matches_low_precision_eager("logsumexp", out, x, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,cfg", [(300, 131072, None), (600, 20000, None), (40, 50256, (4, 4, 2)),
                                     (600, 1024, (8, 2, 4)), (5, 20000, (2, 4, 8)), (2000, 4096, (4, 1, 16))])
def test_gpu_logsumexp_stream_kernel(dtype, m, n, cfg):
    """logsumexp_stream_kernel (its default, and forced with other warps / loads / programs per SM) against fp64:
    rows longer and shorter than a tile, partial tiles, fewer rows than programs, rows holding ±inf / NaN / all
    -inf, a row far below 0 (its first state (-inf, 0) rescaled by e^(-inf - m') = 0, not 0·inf), strided rows and
    dim 0. LSE_STREAM has no fp32 entry: a forced stream=True takes the whole configuration from the knobs (the old
    LSE_STREAM_FALLBACK, (4, 4, 8), there)."""
    if cfg is None and dtype == torch.float32:
        cfg = (4, 4, 8)
    base = (torch.randn(m, n + 32, device="cuda") * 4).to(dtype)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[4] -= 200
    base[m - 1, 3], base[3, n - 1] = float("-inf"), float("inf")
    knobs = Knobs.of(stream=True, **dict(zip(("num_warps", "loads", "ctas"), cfg or ())))
    for x, dim in ((base[:, :n], -1), (base[:, 16:n + 16], -1), (base[:, :n].t(), 0)):
        out, plan = run_forward(x, dim, LOGSUMEXP, knobs)
        assert plan.kernel == "stream", plan
        if cfg:
            assert (plan.num_warps, plan.grid) == (cfg[0], min(m, cfg[2] * target_of(x.device).sm_count)), plan
        assert_matches_low_precision_eager("logsumexp", out, x, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_smem_register_tiles_past_the_row_fall_back(dtype):
    """A forced REG config whose register sub-tiles the row's last chunk does not cover (50256 = 8 x 6144 + 1104)
    is refused: the register kernels run, and the result is right."""
    x = (torch.randn(6, 50256, device="cuda") * 3).to(dtype)
    out, plan = run_forward(x, -1, SOFTMAX, Knobs.of(path="coop", smem=True, chunk=6144, num_warps=8, reg=2))
    assert plan.path == "coop" and plan.kernel != "smem", plan
    assert_matches_low_precision_eager("softmax", out, x, -1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n", [(300, 4096), (300, 12672), (300, 32768), (300, 20000)])
def test_gpu_smem_rows(dtype, m, n):
    """16-bit rows of SMEM_ROWS lengths: one program holds the whole row in shared memory (no barrier). Against
    fp64: rows holding ±inf / NaN / all -inf, strided rows, dim 0, fp32 output (dtype=); x off a 16-byte
    boundary falls back."""
    base = (torch.randn(m, n + 32, device="cuda") * 4).to(dtype)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[m - 1, 3] = float("-inf")
    cases = [(base[:, :n], -1, True, None), (base[:, 16:n + 16], -1, True, None), (base[:, :n].t(), 0, True, None),
             (base[:, :n], -1, True, torch.float32), (base[:, 1:n + 1], -1, False, None)]
    for x, dim, smem, out_dtype in cases:
        for name in ("softmax", "log_softmax"):
            out = FNS[name][0](x, dim, **({"dtype": out_dtype} if out_dtype else {}))
            plan = explain(x, dim, op=name, dtype=out_dtype)
            assert (plan.path == "rows" and plan.kernel == "smem" and plan.chunks == 1) is smem, plan
            assert_matches_low_precision_eager(name, out, x, dim, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("m,n,chunk,warps,reg", [(40, 131072, 4096, 4, 0), (9, 50256, 2048, 2, 0),
                                                  (20, 262144, 8192, 4, 0), (40, 131072, 12288, 4, 4),
                                                  (9, 50256, 4096, 2, 2), (20, 262144, 16384, 8, 4),
                                                  (40, 131072, 8192, 4, 4), (9, 40000, 16384, 8, 2),
                                                  (7, 20000, (16384, 32768), 8, 2),
                                                  (20, 262144, (16384, 32768), 8, 2), (20, 131072, 10240, 4, 8)])
def test_gpu_smem_backward_kernel(dtype, log, m, n, chunk, warps, reg):
    """The shared-memory backward coop kernel against fp64 dx (error within twice torch's + 4 eps of max |dx|),
    with its first ``reg`` sub-tiles of y and dy in registers (bf16: as words) where ``reg`` > 0 (12288, 50256 /
    4096, 40000 / 16384: a shorter last chunk; 20000 / 32768: one chunk, masked); dy off a 16-byte boundary takes
    the register kernels. A (fp32, 16-bit) pair of chunks: 32768 16-bit elements (the default's) are 64 KB of
    shared memory per tensor, too many as fp32."""
    _check_smem_backward(dtype, log, m, n, chunk, warps, reg, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,chunk,warps,reg,ring", [(40, 131072, (16384, 32768), 8, 2, 4),
                                                       (20, 262144, 8192, 4, 4, 2), (9, 50256, 4096, 2, 2, 2),
                                                       (9, 40000, 16384, 8, 2, 4), (7, 20000, (16384, 32768), 8, 2, 4),
                                                       (9, 40000, 2048, 4, 0, 16), (40, 131072, 12288, 4, 4, 1),
                                                       (24, 131072, 16384, 4, 2, 4)])
def test_gpu_smem_backward_ring(dtype, m, n, chunk, warps, reg, ring):
    """Log-softmax's backward with y streamed through a ring of ``ring`` sub-tiles (RING) after step 1, as
    test_gpu_smem_backward_kernel: a shorter last chunk (50256 / 4096, 40000 / 16384), one masked chunk (20000),
    a ring longer than the chunk's shared-memory sub-tiles (40000 / 2048 / 16), a ring of one (12288); the defaults
    (fp32 16384 / 8 / 2 / 4, bf16 16384 / 4 / 2 / 4) among them."""
    _check_smem_backward(dtype, True, m, n, chunk, warps, reg, ring)


def _check_smem_backward(dtype, log, m, n, chunk, warps, reg, ring):
    """launch.backward with the smem kernel forced (every value from the knobs: these decode-sized problems have no
    SMEM_BWD_CONFIG entry), and with dy off a 16-byte boundary (the register kernels)."""
    if isinstance(chunk, tuple):
        chunk = chunk[dtype.itemsize == 2]
    x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
    y = (torch.log_softmax if log else torch.softmax)(x.float(), -1).to(dtype)
    gbase = torch.randn(m, n + 16, device="cuda").to(dtype)
    for dy, kern in ((gbase[:, :n], "smem"), (gbase[:, 8:n + 8], "smem"), (gbase[:, 1:n + 1], None)):
        knobs = dict(path="coop", smem=True)
        if kern:
            knobs.update(chunk=chunk, num_warps=warps, reg=reg, ring=ring)
        dx, plan = run_backward(y, dy, log, Knobs.of(**knobs))
        if kern is None:
            assert plan.kernel != "smem", plan
        else:
            assert (plan.kernel, plan.chunk, plan.reg, plan.ring) == ("smem", chunk, reg, ring), plan
        eager = (torch._log_softmax_backward_data if log else torch._softmax_backward_data)(dy, y, -1, dtype)
        assert_dx_within_eager(dx, eager, y.double(), dy.double(), log)
