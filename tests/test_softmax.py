"""softmax / log_softmax / logsumexp against the fp64 references, on every backend and path.

Tolerance rule: our worst relative error against fp64 may not exceed twice torch eager's in the same dtype,
plus 4 eps of the output dtype (``assert_matches_low_precision_eager``).
Without CUDA the Triton kernels run in the interpreter (small sizes); with CUDA the same tests run there.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax import reference as ref
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

HAS_CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if HAS_CUDA else "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BACKENDS = ["torch", "triton"]
FNS = {
    "softmax": (oss.softmax, torch.softmax, ref.softmax),
    "log_softmax": (oss.log_softmax, torch.log_softmax, ref.log_softmax),
    "logsumexp": (oss.logsumexp, torch.logsumexp, ref.logsumexp),
}


def fp64_ref(name, x, dim):
    return torch.from_numpy(np.asarray(FNS[name][2](x.double().cpu().numpy(), axis=dim)))


def assert_matches_low_precision_eager(name, out, x, dim, out_dtype=None):
    """max |ours - fp64| / |fp64| <= 2 x the same for torch eager + 4 eps; NaN and inf exactly as the reference."""
    expect = fp64_ref(name, x, dim)
    kw = {} if name == "logsumexp" or out_dtype is None else {"dtype": out_dtype}
    eager = FNS[name][1](x, dim, **kw).double().cpu()
    got = out.double().cpu()
    assert got.shape == expect.shape
    assert out.dtype == (out_dtype or x.dtype)
    nan = torch.isnan(expect)
    assert torch.equal(torch.isnan(got), nan), "NaN pattern differs from torch's"
    inf = torch.isinf(expect)
    assert torch.equal(got[inf], expect[inf]), "infinities differ"
    fin = ~(nan | inf)
    # relative error (absolute below 1 for log outputs), compared as the worst case over the tensor
    floor = torch.finfo(out.dtype).tiny if name == "softmax" else 1.0
    scale = expect[fin].abs().clamp_min(floor)
    ours = ((got[fin] - expect[fin]).abs() / scale).max() if fin.any() else 0.0
    theirs = ((eager[fin] - expect[fin]).abs() / scale).max() if fin.any() else 0.0
    bound = 2 * theirs + 4 * torch.finfo(out.dtype).eps
    assert ours <= bound, f"{name}: worst relative error {ours:.3e} > bound {bound:.3e} (torch eager {theirs:.3e})"


def small(shape):
    """Interpreter runs are slow: keep CPU sizes small."""
    return shape if HAS_CUDA else tuple(min(s, 64) if i < len(shape) - 1 else s for i, s in enumerate(shape))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1823, 12672, 50257])
def test_odd_rows(backend, name, dtype, n):
    m = 3 if n > 20000 and not HAS_CUDA else 33
    x = (torch.randn(m, n, device=DEV) * 3).to(dtype)
    assert_matches_low_precision_eager(name, FNS[name][0](x, -1, backend=backend), x, -1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("shape,dim", [((4, 9, 5), 1), ((4, 9, 5), 0), ((6, 5, 130), 2), ((7,), 0),
                                       ((3, 1, 200), -1), ((2, 3, 4, 5), 2)])
def test_dims(backend, name, shape, dim):
    x = torch.randn(shape, device=DEV)
    assert_matches_low_precision_eager(name, FNS[name][0](x, dim, backend=backend), x, dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FNS))
def test_strided_inputs(backend, name):
    base = torch.randn(40, 300, device=DEV)
    views = {
        "transposed": (base.t(), -1),          # rows 40 apart: the column layout
        "sliced_rows": (base[::3], -1),        # row stride 900
        "sliced_cols": (base[:, ::2], -1),     # element stride 2
        "narrowed": (base[:, 5:290], 0),
        "permuted3d": (torch.randn(5, 6, 70, device=DEV).permute(2, 0, 1), 0),
    }
    for label, (x, dim) in views.items():
        assert not x.is_contiguous(), label
        out = FNS[name][0](x, dim, backend=backend)
        assert_matches_low_precision_eager(name, out, x, dim)


def test_row_geometry_avoids_copies():
    x = torch.randn(4, 9, 5)
    assert row_geometry([x], 1) == (20, 9, 5, [(45, 1, 5)])
    assert row_geometry([x.transpose(0, 2)], 2) == (45, 4, 9, [(1, 5, 45)])
    assert row_geometry([x[:, :, ::2]], 2) == (36, 3, 1, [(5, 0, 2)])
    # three groups of dims that do not fold: no view, the op copies
    y = torch.randn(4, 6, 8, 10)[::2, :, :, ::2]
    assert row_geometry([y], 2) is None
    assert row_geometry([torch.randn(4, 6, 8, 10)[:, ::2, :, ::2]], 2) == (60, 8, 5, [(160, 2, 10)])


SPECIAL_ROWS = [
    [0.0, 1.0, 2.0, 3.0],
    [-math.inf, -math.inf, -math.inf, -math.inf],
    [math.inf, 1.0, 2.0, -math.inf],
    [math.nan, 1.0, 2.0, 3.0],
    [-math.inf, 5.0, -math.inf, 2.0],
    [1e4, -1e4, 0.0, 1e4],
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_match_torch(backend, name, dtype):
    x = torch.tensor(SPECIAL_ROWS, device=DEV).to(dtype)
    out = FNS[name][0](x, -1, backend=backend)
    expect = FNS[name][1](x.float(), -1).to(dtype) if name != "logsumexp" else torch.logsumexp(x.float(), -1)
    torch.testing.assert_close(out.float().cpu(), expect.float().cpu(), equal_nan=True, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_values_long_rows(backend):
    """The chunked paths merge partial states: an all -inf chunk, +inf and NaN in one chunk only."""
    n = 40000
    x = torch.randn(5, n, device=DEV)
    x[0] = -math.inf
    x[1, : n // 2] = -math.inf
    x[2, 123] = math.inf
    x[3, 39999] = math.nan
    for name in FNS:
        out = FNS[name][0](x, -1, backend=backend)
        expect = FNS[name][1](x, -1)
        torch.testing.assert_close(out, expect, equal_nan=True, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_scalar(backend):
    for shape, dim in [((0, 5), -1), ((5, 0), -1), ((0,), 0), ((3, 0, 2), 1)]:
        x = torch.randn(shape, device=DEV)
        assert oss.softmax(x, dim, backend=backend).shape == x.shape
        assert oss.log_softmax(x, dim, backend=backend).shape == x.shape
        lse = oss.logsumexp(x, dim, backend=backend)
        assert lse.shape == torch.logsumexp(x, dim).shape and (lse == -math.inf).all()
    s = torch.tensor(2.5, device=DEV)
    torch.testing.assert_close(oss.softmax(s, 0, backend=backend), torch.softmax(s, 0))
    torch.testing.assert_close(oss.logsumexp(s, 0, backend=backend), torch.logsumexp(s, 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_argument_and_keepdim(backend):
    x = torch.randn(8, 100, device=DEV).to(torch.bfloat16)
    for out_dtype in (torch.float32, torch.float16, torch.float64):
        y = oss.softmax(x, -1, dtype=out_dtype, backend=backend)
        assert_matches_low_precision_eager("softmax", y, x, -1, out_dtype=out_dtype)
        y = oss.log_softmax(x, -1, dtype=out_dtype, backend=backend)
        assert_matches_low_precision_eager("log_softmax", y, x, -1, out_dtype=out_dtype)
    xf = torch.randn(8, 100, device=DEV)
    y = oss.softmax(xf, 0, dtype=torch.bfloat16, backend=backend)   # torch casts x first
    torch.testing.assert_close(y, torch.softmax(xf, 0, dtype=torch.bfloat16))
    assert oss.logsumexp(xf, 1, keepdim=True, backend=backend).shape == (8, 1)
    xi = torch.arange(12, device=DEV).reshape(3, 4)
    torch.testing.assert_close(oss.softmax(xi, -1, dtype=torch.float32, backend=backend),
                               torch.softmax(xi, -1, dtype=torch.float32))


def test_properties():
    x = torch.randn(16, 777, device=DEV) * 20
    y = oss.softmax(x)
    assert (y >= 0).all() and (y <= 1).all()
    torch.testing.assert_close(y.sum(-1), torch.ones(16, device=DEV))
    torch.testing.assert_close(oss.softmax(x + 100), y)
    torch.testing.assert_close(oss.log_softmax(x).exp(), y, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(oss.logsumexp(x), oss.SoftmaxState.from_tensor(x).logsumexp())


def assert_grad_like_eager(fn, torch_fn, x, g, backend, **kw):
    """Gradient error vs fp64 autograd <= 2 x torch eager's in x's dtype + 2 eps x max|dx| (the Triton
    interpreter rounds to bf16/fp16 by truncation, up to one more unit than the GPU)."""
    a = x.clone().requires_grad_()
    fn(a, -1, backend=backend, **kw).backward(g)
    e = x.clone().requires_grad_()
    torch_fn(e, -1).backward(g)
    r = x.double().requires_grad_()
    torch_fn(r, -1).backward(g.double())
    ours = (a.grad.double() - r.grad).abs().max()
    theirs = (e.grad.double() - r.grad).abs().max()
    bound = 2 * theirs + 2 * torch.finfo(x.dtype).eps * r.grad.abs().max()
    assert ours <= bound, f"{fn.__name__}: grad error {ours:.3e} > {bound:.3e} (torch eager {theirs:.3e})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [37, 3000, 40000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_torch_autograd(backend, n, dtype):
    x = (torch.randn(4, n, device=DEV) * 2).to(dtype)
    g = torch.randn(4, n, device=DEV).to(dtype)
    assert_grad_like_eager(oss.softmax, torch.softmax, x, g, backend)
    assert_grad_like_eager(oss.log_softmax, torch.log_softmax, x, g, backend)
    assert_grad_like_eager(oss.logsumexp, torch.logsumexp, x, torch.randn(4, device=DEV).to(dtype), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [37, 3000, 40000])
def test_fp64_gradients_computed_in_fp64(backend, n):
    """fp64 in, fp64 arithmetic: the backward kernels must not round y or dy to fp32 (errors ~1e-7)."""
    x = torch.randn(4, n, dtype=torch.float64, device=DEV) * 2
    g = torch.randn(4, n, dtype=torch.float64, device=DEV)
    for fn, torch_fn in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
        a, r = x.clone().requires_grad_(), x.clone().requires_grad_()
        fn(a, -1, backend=backend).backward(g)
        torch_fn(r, -1).backward(g)
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-12, atol=1e-12 * r.grad.abs().max().item())


def test_gradcheck_fp64():
    x = torch.randn(3, 11, dtype=torch.float64, device=DEV, requires_grad=True)
    for fn in (oss.softmax, oss.log_softmax, oss.logsumexp):
        assert torch.autograd.gradcheck(lambda t, fn=fn: fn(t, 1, backend="torch"), (x,))


def test_gradient_strided_dim0():
    x = torch.randn(50, 6, device=DEV, requires_grad=True)
    g = torch.randn(50, 6, device=DEV)
    oss.softmax(x, 0).backward(g)
    x2 = x.detach().clone().requires_grad_()
    torch.softmax(x2, 0).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)


def test_torch_compile_fullgraph():
    def f(x):
        return oss.softmax(x, -1) * 2 + oss.log_softmax(x, 0) + oss.logsumexp(x, -1, keepdim=True)

    x = torch.randn(8, 33, device=DEV)
    compiled = torch.compile(f, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    torch.testing.assert_close(compiled(x), f(x))


def test_bad_arguments():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match="dim=2"):
        oss.softmax(x, 2)
    with pytest.raises(TypeError, match="x must have dtype"):
        oss.softmax(torch.arange(4))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        oss.log_softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="backend must be"):
        oss.logsumexp(x, backend="cuda")
    with pytest.raises(TypeError, match="dtype must be"):
        oss.softmax(x, dtype=torch.int32)


# ---- which path runs --------------------------------------------------------------------------------
H200_SMS = 132


@pytest.mark.parametrize("m,n,path", [
    (65536, 1024, "rows"), (16384, 4096, "rows"), (4096, 16384, "rows"), (2048, 32768, "rows"),
    (512, 131072, "coop"), (256, 262144, "coop"), (1, 262144, "coop"), (32, 151936, "coop"),
    (8, 128256, "coop"), (1, 4096, "rows"), (1, 16384, "rows"), (4, 3_000_000, "split"),
])
def test_path_choice_on_h200(m, n, path):
    assert K.choose_path(m, n, H200_SMS, interpret=False) == path


@pytest.mark.parametrize("m,n,path,chunk", [
    (4096, 32768, "coop", 4096), (2048, 65536, "coop", 4096), (1024, 131072, "coop", 16384),
    (8192, 16384, "rows", None), (32, 151936, "coop", K.COOP_CHUNK),
])
def test_bf16x2_path_and_chunk_on_h200(m, n, path, chunk):
    """bf16 rows the bf16x2 kernel can take: coop from N > BF16X2_ROW_MAX_N with their own chunk sizes;
    decode sizes keep the generic chunking."""
    words = m > K.DECODE_MAX_ROWS_PER_SM * H200_SMS
    assert K.choose_path(m, n, H200_SMS, interpret=False, words=words) == path
    if chunk:
        assert K._chunking(m, n, H200_SMS, backward=False, words=words)[0] == chunk


@pytest.mark.parametrize("m,n,size,mode,bf16x2,expect", [
    (2048, 131072, 4, K.SOFTMAX, False, K.SMEM_CONFIG[4]), (1024, 262144, 4, K.LOG_SOFTMAX, False, K.SMEM_CONFIG[4]),
    (4096, 131072, 2, K.SOFTMAX, True, K.SMEM_CONFIG[2]), (2048, 262144, 2, K.SOFTMAX, True, K.SMEM_CONFIG[2]),
    (4096, 131072, 2, K.LOG_SOFTMAX, True, K.SMEM_CONFIG[2]), (16384, 32768, 2, K.SOFTMAX, True, None),
    (8192, 65536, 2, K.SOFTMAX, True, K.SMEM_CONFIG[2]),
    (4096, 131072, 2, K.LOG_SOFTMAX, False, K.SMEM_CONFIG[2]), (32, 151936, 4, K.SOFTMAX, False, None),
    (2048, 128256, 4, K.SOFTMAX, False, K.SMEM_CONFIG[4]), (4096, 100000, 2, K.SOFTMAX, True,
                                                            K.SMEM_CONFIG_MASKED[2]),
    (2048, 3 * 16384 + 4095, 4, K.SOFTMAX, False, K.SMEM_CONFIG_MASKED[4]),
    (2048, 3 * 16384 + 4096, 4, K.SOFTMAX, False, K.SMEM_CONFIG[4]),
])
def test_smem_kernel_choice_on_h200(m, n, size, mode, bf16x2, expect):
    """Many long rows take the shared-memory coop kernel, except bf16 rows under SMEM_BF16_MIN_N (bf16x2) and
    decode sizes; registers hold part of each chunk (REG) only where every chunk of the row covers them."""
    assert K._smem_config(m, n, size, mode, H200_SMS, bf16x2) == expect


@pytest.mark.parametrize("m,n,size,log,expect", [
    (2048, 131072, 4, True, (16384, 8, 2, 4)), (4096, 131072, 2, False, (32768, 8, 2, 0)),
    (2048, 262144, 4, False, (10240, 4, 8, 0)), (4096, 131072, 2, True, (16384, 4, 2, 4)),
    (32, 131072, 2, False, None),                                          # decode sizes: the register kernels
    (2048, 32768, 4, False, (8192, 4, 4, 0)),       # 32768 = 3 x 10240 + 2048, under REG's 8 x 512: the next config
    (2048, 3 * 10240 + 4096, 4, False, (10240, 4, 8, 0)),
    (2048, 4 * 8192 + 2047, 4, False, (8192, 4, 0, 0)),     # under both: the last config, reg = 0
    (4096, 32768 + 4095, 2, False, (32768, 8, 0, 0)), (4096, 32768 + 4096, 2, True, (16384, 4, 2, 4)),
    (4096, 16384 + 2047, 2, True, (16384, 4, 0, 4)),          # last chunk under REG's 2 x 1024: reg 0, still RING
])
def test_smem_backward_choice_on_h200(m, n, size, log, expect):
    """Many long rows: the backward takes the shared-memory kernel with REG sub-tiles in registers, in the first
    SMEM_BWD_CONFIG entry whose REG the row's last chunk covers, else the last with reg = 0; decode sizes keep the
    register kernels."""
    assert K._smem_bwd_config(m, n, size, log, H200_SMS) == expect


@pytest.mark.parametrize("dtype,m,n,mode,expect", [
    (torch.bfloat16, 131072, 4096, K.SOFTMAX, ("rows", "smem", 4)),
    (torch.float16, 32768, 16384, K.LOG_SOFTMAX, ("rows", "smem", 4)),
    (torch.bfloat16, 16384, 32768, K.SOFTMAX, ("rows", "smem", 16)),
    (torch.bfloat16, 16384, 20000, K.SOFTMAX, ("rows", "smem", 16)),
    (torch.bfloat16, 32, 32768, K.SOFTMAX, ("coop", "chunks", 4)),            # decode sizes: the coop path
    (torch.bfloat16, 16384, 32776, K.SOFTMAX, ("coop", "bf16x2", 4)),         # longer than SMEM_ROWS
    (torch.bfloat16, 16384, 32752, K.SOFTMAX, ("rows", "smem", 16)),
    (torch.bfloat16, 16384, 32762, K.SOFTMAX, ("coop", "bf16x2", 4)),         # N not a multiple of 16
    (torch.float32, 16384, 16384, K.SOFTMAX, ("rows", None, 32)),             # fp32 keeps registers
    (torch.bfloat16, 524288, 1024, K.SOFTMAX, ("rows", None, 2)),
    (torch.bfloat16, 32768, 16384, K.LOGSUMEXP, ("rows", "pipe", 8)),       # logsumexp: LSE_PIPE
])
def test_smem_rows_choice_on_h200(monkeypatch, dtype, m, n, mode, expect):
    """16-bit rows of SMEM_ROWS lengths (unit stride, N a multiple of 16) run the shared-memory kernel with the
    whole row in one program (no barrier); others, logsumexp and decode sizes do not. Plans on meta tensors."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    x = torch.empty((m, n), dtype=dtype, device="meta")
    out = torch.empty((m,) if mode == K.LOGSUMEXP else (m, n), dtype=dtype, device="meta")
    M, N, inner, (gx, gy) = row_geometry([x, x if mode == K.LOGSUMEXP else out], 1)
    rec = K._forward_plan({}, x, out, gx, gy, M, N, inner, mode, dtype == torch.bfloat16).record
    assert (rec["path"], rec.get("kernel"), rec["num_warps"]) == expect, rec
    if rec.get("kernel") == "smem" and rec["path"] == "rows":
        assert rec["chunks"] == 1 and N <= rec["chunk"] < N + 8 * 32 * rec["num_warps"]


def test_smem_plans_keep_coop_max_chunks(monkeypatch):
    """A row needing more than COOP_MAX_CHUNKS shared-memory chunks (fp32 log-softmax backward at N = 2^20 with
    4096-element chunks: 256) takes the register kernel instead; its default 16384-element chunks (64) keep the
    smem kernel. Plans on meta tensors, as on an H200."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)        # plan as for the GPU (CI sets the interpreter)
    x = torch.empty(4096, 1 << 20, device="meta")
    m, nn, inner, (g1, g2, g3) = row_geometry([x, x, x], 1)
    for cfg, kernel in (({}, "smem"), ({"chunk": 4096}, "chunks")):
        plan = K._backward_plan(cfg, x.device, g1, g2, g3, m, nn, inner, True, (x.dtype,) * 3, aligned=True)
        assert plan.record["kernel"] == kernel and plan.record["chunks"] <= K.COOP_MAX_CHUNKS, plan.record


def test_smem_backward_fp16_register_bound(monkeypatch):
    """fp16 holds the backward's register sub-tiles as elements (WORDS is bf16's), where ptxas alone spills: its
    plan carries SMEM_BWD_F16_MAXNREG; bf16 and fp32, and fp16 without register sub-tiles, carry no bound (the
    sm_90a compile is checked in test_smem_backward_defaults_compile_for_sm90_without_spills)."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    for dtype, cfg, bound in ((torch.float16, {}, K.SMEM_BWD_F16_MAXNREG), (torch.bfloat16, {}, 0),
                              (torch.float32, {}, 0), (torch.float16, {"reg": 0}, 0)):
        x = torch.empty((1 << 30) // (131072 * dtype.itemsize), 131072, dtype=dtype, device="meta")
        m, nn, inner, (g1, g2, g3) = row_geometry([x, x, x], 1)
        plan = K._backward_plan(dict(cfg), x.device, g1, g2, g3, m, nn, inner, False, (dtype,) * 3, aligned=True)
        assert plan.record["kernel"] == "smem" and plan.record["maxnreg"] == bound, (dtype, plan.record)
        assert plan.launches[0].meta.get("maxnreg", 0) == bound


def test_smem_backward_eligibility():
    row = (131072, 0, 1)
    f32, bf = (torch.float32,) * 3, (torch.bfloat16,) * 3
    assert K._smem_bwd_ok((row, row, row), 131072, f32, True, False)
    assert K._smem_bwd_ok((row, row, row), 131072, bf, True, False)
    assert not K._smem_bwd_ok((row, row, row), 131072, f32, False, False)          # a pointer off 16 bytes
    assert not K._smem_bwd_ok((row, row, row), 131072, f32, True, True)            # interpreter
    assert not K._smem_bwd_ok((row, row, row), 131072, (torch.float32, torch.bfloat16, torch.float32), True, False)
    assert not K._smem_bwd_ok((row, row, row), 131064, f32, True, False)           # N not a multiple of 16
    assert not K._smem_bwd_ok((row, (131080, 0, 1), row), 131072, f32, True, False)
    assert not K._smem_bwd_ok((row, row, (131072, 0, 2)), 131072, f32, True, False)
    assert not K._smem_bwd_ok((row, row, row), 131072, (torch.float64,) * 3, True, False)


def test_bf16x2_backward_eligibility():
    row = (65536, 0, 1)                       # (stride_outer, stride_inner, stride_n) of contiguous rows
    assert K._bf16x2_bwd_ok((row, row, row), 65536, words=True)
    assert not K._bf16x2_bwd_ok((row, row, row), 65536, words=False)          # a pointer off a 4-byte boundary
    assert not K._bf16x2_bwd_ok((row, row, row), 65535, words=True)           # odd N
    assert not K._bf16x2_bwd_ok((row, (65537, 0, 1), row), 65536, words=True)   # an odd row stride
    assert not K._bf16x2_bwd_ok((row, row, (1, 0, 4096)), 65536, words=True)    # strided columns


@pytest.mark.parametrize("mode,dtype,n,fast", [
    (K.SOFTMAX, torch.bfloat16, 512, False), (K.SOFTMAX, torch.bfloat16, 1024, True),
    (K.LOG_SOFTMAX, torch.bfloat16, 1024, True), (K.SOFTMAX, torch.float32, 4096, True),
    (K.LOGSUMEXP, torch.float32, 1024, True), (K.LOGSUMEXP, torch.float32, 2048, True),   # not LSE_PIPE lengths
])
def test_fast_exp_choice_on_h200(monkeypatch, mode, dtype, n, fast):
    """The rows kernel takes ex2.approx.ftz except for softmax in the prefetching loop (measured slower there);
    the interpreter always takes tl.exp."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    m = (1 << 30) // (n * dtype.itemsize)
    x = torch.empty((m, n), dtype=dtype, device="meta")
    out = torch.empty((m,) if mode == K.LOGSUMEXP else (m, n), dtype=dtype, device="meta")
    M, N, inner, (gx, gy) = row_geometry([x, x if mode == K.LOGSUMEXP else out], 1)
    for interpret, expect in ((False, fast), (True, False)):
        monkeypatch.setattr(K, "interpret_mode", lambda: interpret)
        record = K._forward_plan({}, x, out, gx, gy, M, N, inner, mode, dtype == torch.bfloat16).record
        assert record["path"] == "rows" and record["fast_exp"] is expect


@pytest.mark.parametrize("fast,mode,out_dtype,level", [
    (True, K.SOFTMAX, torch.float32, 2), (True, K.SOFTMAX, torch.bfloat16, 1), (True, K.SOFTMAX, torch.float16, 1),
    (True, K.LOG_SOFTMAX, torch.float32, 1), (True, K.LOGSUMEXP, torch.float32, 1),
    (False, K.SOFTMAX, torch.float32, 0), (False, K.LOG_SOFTMAX, torch.bfloat16, 0),
])
def test_exp_level(fast, mode, out_dtype, level):
    """The compensated exponential (FAST == 2) only where softmax writes e^(x - m) to an fp32 output."""
    assert K._exp_level(fast, mode, out_dtype) == level


def test_compensated_exp_constants():
    """_exp's FAST == 2 in numpy with an exact 2^t (the hardware's ex2.approx adds its own ~2 ulp): LN2_HI + LN2_LO
    is ln 2 to fp32 twice, and the Cody-Waite e^z is within one fp32 eps of fp64 where the plain 2^(fp32 z·L) is
    off by more than 10 eps for large |z|."""
    L = np.float32(K.LOG2E.value)
    assert L == np.float32(1 / math.log(2))
    z = np.concatenate([np.linspace(-87, 0, 200_001), np.linspace(0, 88, 20_001)]).astype(np.float32)
    t = z * L                                                                   # fp32 product
    e = np.exp2(t.astype(np.float64)).astype(np.float32)
    hi, lo = (np.float64(np.float32(c.value)) for c in (K.LN2_HI, K.LN2_LO))
    assert hi + lo == np.float64(np.float32(math.log(2))) + np.float64(np.float32(math.log(2) - hi))
    u = (z.astype(np.float64) - t.astype(np.float64) * hi).astype(np.float32)  # fma(-t, LN2_HI, z)
    u = (u.astype(np.float64) - t.astype(np.float64) * lo).astype(np.float32)  # fma(-t, LN2_LO, u)
    y = (e.astype(np.float64) * u.astype(np.float64) + e).astype(np.float32)   # fma(e, u, e)
    exact = np.exp(z.astype(np.float64))
    eps = float(np.finfo(np.float32).eps)
    assert (np.abs(y - exact) / exact).max() <= 1.0 * eps
    assert (np.abs(e - exact) / exact).max() > 10 * eps


@pytest.mark.parametrize("n,chunk,reg_elems,fits", [
    (131072, 16384, 4096, True), (128256, 16384, 4096, True), (3 * 16384 + 4095, 16384, 4096, False),
    (3 * 16384 + 4096, 16384, 4096, True), (12672, 16384, 2048, True), (1000, 16384, 2048, False),
])
def test_register_sub_tiles_fit_every_chunk(n, chunk, reg_elems, fits):
    """REG keeps the first elements of every chunk in registers unmasked: the row's last chunk must cover them."""
    assert K._reg_fits(n, chunk, reg_elems) is fits


def test_interpreter_uses_split_for_long_rows():
    assert K.choose_path(512, 131072, H200_SMS, interpret=True) == "split"


@pytest.mark.parametrize("m,n,path", [(64, 1000, "rows"), (3, 50000, "split" if not HAS_CUDA else "coop")])
def test_op_runs_the_chosen_path(m, n, path):
    x = torch.randn(m, n, device=DEV)
    oss.softmax(x, backend="triton")
    assert K.last_launch()["path"] == path
    oss.logsumexp(x, backend="triton")
    assert K.last_launch()["path"] == ("rows" if path == "rows" else "chunks")


@pytest.mark.parametrize("dtype,n,block_m,warps", [
    (torch.float32, 4096, 1, 16), (torch.float32, 1024, 1, 4), (torch.bfloat16, 1024, 1, 2),
    (torch.bfloat16, 16384, 1, 16), (torch.float32, 16384, 1, 32), (torch.float32, 512, 16, 16),
])
def test_rows_warps(dtype, n, block_m, warps):
    """From ONE_ROW_MIN_N one row per program, ROW_BYTES_PER_WARP of it per warp (ROW_WARPS_MEASURED where
    measured otherwise); rows of at most 2 KB below it take the prefetching loop's tiles of PREFETCH_TILE_ELEMS.
    x starts one element off a 16-byte boundary: on the GPU, 16-bit rows of SMEM_ROWS lengths would otherwise take
    the shared-memory kernel."""
    x = torch.randn(64, n + 1, device=DEV).to(dtype)[:, 1:]
    oss.softmax(x, backend="triton")
    info = K.last_launch()
    assert (info["path"], info["block_m"], info["num_warps"]) == ("rows", block_m, warps), info


@pytest.mark.parametrize("dtype,n,prefetch,kernel", [(torch.float32, 1024, False, None),
                                                     (torch.float32, 4096, True, "pipe"),
                                                     (torch.bfloat16, 16384, True, "pipe"),
                                                     (torch.float32, 32768, False, "pipe"),
                                                     (torch.bfloat16, 32768, True, "stream")])
def test_logsumexp_rows_kernels(dtype, n, prefetch, kernel):
    """logsumexp of many rows: LSE_PIPE lengths run the pipelined kernel on the GPU, 16-bit rows from
    LSE_STREAM lengths the streaming kernel; the others, and every length in the interpreter, the register kernel,
    which prefetches rows of 16-64 KB."""
    m = 2 * K.DECODE_MAX_ROWS_PER_SM * K.sm_count(torch.device(DEV)) + 1      # not "few rows"
    x = torch.randn(m, n, device=DEV).to(dtype)
    lse = oss.logsumexp(x, backend="triton")
    info = K.last_launch()
    if HAS_CUDA and kernel:
        assert (info["path"], info["kernel"]) == ("rows", kernel), info
    else:
        assert info["path"] == "rows" and info.get("kernel") is None and info["prefetch"] is prefetch, info
    # against fp64: torch.logsumexp on fp32 CPU tensors is off by up to 3.3e-5 here in about one process in ten
    # (the same x, 4.7e-7 in the others), which made this test flaky against an fp32 reference
    torch.testing.assert_close(lse, torch.logsumexp(x.double(), -1).to(dtype))


@pytest.mark.parametrize("grad", [False, True])
def test_logsumexp_kernel_writes_the_output_dtype(monkeypatch, grad):
    """Eager logsumexp without autograd has the kernel write x's dtype (one launch: the suite measured the extra
    cast as 2-3 % of a 1 GiB bf16 call); with autograd the op returns fp32 for the backward and casts after."""
    seen = []
    forward = K.forward
    monkeypatch.setattr(K, "forward", lambda x, out, *a, **k: (seen.append(out.dtype), forward(x, out, *a, **k)))
    x = torch.randn(6, 300, device=DEV).to(torch.bfloat16).requires_grad_(grad)
    lse = oss.logsumexp(x, backend="triton")
    assert seen == [torch.float32 if grad else torch.bfloat16] and lse.dtype == torch.bfloat16
    assert_matches_low_precision_eager("logsumexp", lse.detach(), x.detach(), -1)


@pytest.mark.parametrize("dtype,m,n,ptr,expect", [
    (torch.bfloat16, 524288, 1024, 0, ("pipe", 1, 132 * 32)),
    (torch.bfloat16, 65536, 8192, 0, ("pipe", 4, 132 * 4)),
    (torch.bfloat16, 32768, 16384, 0, ("pipe", 8, 132 * 3)),
    (torch.bfloat16, 16384, 32768, 0, ("stream", 4, 132 * 8)),     # LSE_STREAM: the streaming kernel
    (torch.bfloat16, 16384, 20000, 0, ("stream", 4, 132 * 8)),     # 20000 = 16 x 1250: a partial tile
    (torch.bfloat16, 16384, 65520, 0, ("stream", 4, 132 * 8)),
    (torch.float16, 4096, 131072, 0, ("stream", 8, 132 * 4)),      # from 64K: longer tiles
    (torch.bfloat16, 300, 262144, 0, ("stream", 8, 300)),           # fewer rows than programs
    (torch.float32, 1024, 262144, 0, ("chunks", 8, None)),         # fp32 long rows: chunks
    (torch.bfloat16, 4096, 131080, 0, ("chunks", 8, None)),        # N not a multiple of 16
    (torch.bfloat16, 4096, 131072, 8, ("chunks", 8, None)),        # x 8 bytes off a 16-byte boundary
    (torch.float32, 32768, 8192, 0, ("pipe", 8, 132 * 2)),
    (torch.float32, 100, 16384, 0, ("pipe", 8, 100)),              # fewer rows than programs
    (torch.float32, 262144, 1024, 0, (None, 4, None)),            # fp32 1K / 2K: the register kernel
    (torch.bfloat16, 65536, 8200, 0, (None, 16, None)),           # N past 8192 and not a multiple of 16
    (torch.bfloat16, 65536, 8192, 8, (None, 16, None)),           # x 8 bytes off a 16-byte boundary
    (torch.bfloat16, 32, 32768, 0, ("chunks", 4, None)),          # decode sizes: chunks
])
def test_logsumexp_pipe_choice_on_h200(monkeypatch, dtype, m, n, ptr, expect):
    """LSE_PIPE and LSE_STREAM: (kernel, warps, grid) of the logsumexp plan; plans on meta tensors (x at
    address ``ptr``)."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    x = torch.empty((m, n), dtype=dtype, device="meta")
    out = torch.empty((m,), dtype=dtype, device="meta")
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda t: ptr if t.shape == x.shape else 0)
    M, N, inner, (gx, _) = row_geometry([x, x], 1)
    rec = K._forward_plan({}, x, out, gx, gx, M, N, inner, K.LOGSUMEXP, False).record
    grid = rec["grid"] if rec.get("kernel") in ("pipe", "stream") else None
    assert (rec.get("kernel"), rec["num_warps"], grid) == expect, rec


@pytest.mark.parametrize("dtype,out_dtype,m,n,mode,keep,bound", [
    (torch.bfloat16, torch.bfloat16, 4096, 131072, K.SOFTMAX, True, K.SMEM_BF16_MAXNREG),
    (torch.float16, torch.float16, 4185, 128256, K.SOFTMAX, True, 0),           # fp16 spills under the bound
    (torch.bfloat16, torch.bfloat16, 4096, 131072, K.LOG_SOFTMAX, False, K.SMEM_BF16_MAXNREG),  # no second exp
    (torch.bfloat16, torch.float32, 4096, 131072, K.SOFTMAX, False, 0),        # fp32 y: e must not be rounded
    (torch.float32, torch.float32, 2048, 131072, K.SOFTMAX, False, 0),
    (torch.bfloat16, torch.bfloat16, 32768, 16384, K.SOFTMAX, False, 0),       # whole rows (SMEM_ROWS)
])
def test_smem_keep_e_and_register_bound_on_h200(monkeypatch, dtype, out_dtype, m, n, mode, keep, bound):
    """KEEP_E in the shared-memory kernel: 16-bit softmax with y of x's dtype, in coop chunks only; the register
    bound SMEM_BF16_MAXNREG where bf16 register sub-tiles are held as words (a 9th program per SM)."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    x = torch.empty((m, n), dtype=dtype, device="meta")
    out = torch.empty((m, n), dtype=out_dtype, device="meta")
    M, N, inner, (gx, gy) = row_geometry([x, out], 1)
    plan = K._forward_plan({}, x, out, gx, gy, M, N, inner, mode, dtype == out_dtype == torch.bfloat16)
    rec = plan.record
    assert rec["kernel"] == "smem" and rec["keep_e"] is keep and rec["maxnreg"] == bound, rec
    assert plan.launches[0].meta.get("maxnreg", 0) == bound


@pytest.mark.parametrize("dtype,n,log,aligned,expect", [
    (torch.float32, 1024, True, True, ("smem", 4, 0, 1)), (torch.bfloat16, 1024, True, True, ("smem", 1, 0, 2)),
    (torch.float32, 4096, True, True, ("smem", 4, 0, 2)), (torch.bfloat16, 4096, True, True, ("smem", 2, 0, 2)),
    (torch.float32, 16384, True, True, ("smem", 4, 2, 4)), (torch.bfloat16, 16384, True, True, ("smem", 2, 2, 4)),
    (torch.float16, 12672, True, True, ("smem", 2, 2, 4)),
    (torch.float32, 1000, True, True, None),          # N not a multiple of 16
    (torch.float32, 512, True, True, None),           # shorter than SMEM_BWD_ROWS
    (torch.bfloat16, 4096, True, False, None),        # a pointer off 16 bytes
    (torch.float32, 1024, False, True, ("smem", 4, 0, 0)), (torch.bfloat16, 4096, False, True, ("smem", 2, 0, 0)),
    (torch.float32, 16384, False, True, ("smem", 16, 0, 0)), (torch.bfloat16, 16384, False, True, ("smem", 4, 2, 0)),
    (torch.float32, 4095, False, True, None),
])
def test_smem_backward_rows_choice_on_h200(monkeypatch, dtype, n, log, aligned, expect):
    """The backward of rows of 1K-16K takes the smem kernel holding a whole row (C = 1, SMEM_BWD_ROWS: y and dy in
    shared memory; log-softmax: dy, y through its ring), with its warps, reg and ring; the others keep the
    register rows kernel. Plans on meta tensors, as on an H200."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    y = torch.empty(((1 << 30) // (n * dtype.itemsize), n), dtype=dtype, device="meta")
    M, N, inner, (g1, g2, g3) = row_geometry([y, y, y], 1)
    rec = K._backward_plan({}, y.device, g1, g2, g3, M, N, inner, log, (dtype,) * 3, aligned=aligned).record
    assert rec["path"] == "rows", rec
    if expect is None:
        assert rec.get("kernel") is None and "block_m" in rec, rec
    else:
        assert (rec["kernel"], rec["num_warps"], rec["reg"], rec["ring"]) == expect and rec["chunks"] == 1, rec
        assert N <= rec["chunk"] < N + 16 // dtype.itemsize * 32 * rec["num_warps"], rec


def _assert_dx_within_eager(dx, eager, y64, dy64, log):
    """dx against the fp64 backward of (y, dy), within twice the error of torch's eager dx (same inputs) plus 4 eps
    of max |dx|: softmax dx = y·(dy − Σ y·dy), log-softmax dx = dy − e^y·Σ dy."""
    ref = dy64 - y64.exp() * dy64.sum(-1, keepdim=True) if log else y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    ours, theirs = (dx.double() - ref).abs().max(), (eager.double() - ref).abs().max()
    assert ours <= 2 * theirs + 4 * torch.finfo(dx.dtype).eps * ref.abs().max(), (ours, theirs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("m,n", [(37, 1024), (37, 1040), (19, 4096), (9, 12672), (5, 16384)])
def test_gpu_smem_backward_rows(dtype, log, m, n):
    """The backward through the smem kernel holding whole rows (SMEM_BWD_ROWS; log-softmax with its ring of y)
    against fp64 dx (error within twice torch's + 4 eps of max |dx|): y from rows holding -inf, padded row strides,
    dy 16 bytes in, a partial last sub-tile (1040, 12672); dy one element in falls back to the register rows
    kernel; autograd through oss.softmax / oss.log_softmax takes the same kernel."""
    fwd, ours_fn = (torch.log_softmax, oss.log_softmax) if log else (torch.softmax, oss.softmax)
    torch_bwd = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    x = (torch.randn(m, n + 16, device="cuda") * 3)
    x[1, 5], x[m - 1, :3] = float("-inf"), float("-inf")
    y = fwd(x[:, :n], -1).to(dtype)
    gbase = torch.randn(m, n + 16, device="cuda").to(dtype)
    for dy, smem in ((gbase[:, :n], True), (gbase[:, 16 // dtype.itemsize:n + 16 // dtype.itemsize], True),
                     (gbase[:, 1:n + 1], False)):
        dx = torch.empty_like(y)
        mm, nn, inner, geos = row_geometry([y, dy, dx], 1)
        K.backward(y, dy, dx, *geos, mm, nn, inner, log)
        info = K.last_launch()
        assert info["path"] == "rows" and (info.get("kernel") == "smem") is smem, info
        _assert_dx_within_eager(dx, torch_bwd(dy, y, -1, dtype), y.double(), dy.double(), log)
    g = gbase[:, :n]
    xs, xt = (x[:, :n].to(dtype).detach().clone().requires_grad_() for _ in range(2))
    ours_fn(xs, -1).backward(g)
    assert K.last_launch().get("kernel") == "smem"
    fwd(xt, -1).backward(g)
    _assert_dx_within_eager(xs.grad, xt.grad, fwd(x[:, :n].to(dtype).double(), -1), g.double(), log)


@pytest.mark.parametrize("dtype,block_m,warps", [(torch.bfloat16, 8, 16), (torch.float32, 2, 8)])
def test_backward_rows_tile(dtype, block_m, warps):
    """The backward's register `rows` kernel at N = 1K (where the smem kernel of SMEM_BWD_ROWS does not run: the
    interpreter, or smem=False): 16-bit tiles of BWD_ROWS_MEASURED (8 rows, 16 warps), fp32 2 rows with 8 warps."""
    y = torch.softmax(torch.randn(64, 1024, device=DEV), -1).to(dtype)
    dy = torch.randn(64, 1024, device=DEV).to(dtype)
    dx = torch.empty_like(y)
    m, n, inner, geos = row_geometry([y, dy, dx], 1)
    K.backward(y, dy, dx, *geos, m, n, inner, False, config={"smem": False})
    rec = K.last_launch()
    assert (rec["path"], rec["block_m"], rec["num_warps"]) == ("rows", block_m, warps), rec
    ref = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    torch.testing.assert_close(dx.float(), ref, atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=1e-2)


@pytest.mark.parametrize("log", [False, True])
def test_backward_long_rows_chunk(log):
    """Many long rows: the backward's register kernels hold BWD_COOP_CHUNK elements of y and dy per program, 8
    warps (the interpreter); on the GPU the shared-memory kernel takes them, as SMEM_BWD_CONFIG says (log-softmax:
    with its ring of y)."""
    sms = K.sm_count(torch.device(DEV))
    m = K.DECODE_MAX_ROWS_PER_SM * sms + 1
    ours, theirs = (oss.log_softmax, torch.log_softmax) if log else (oss.softmax, torch.softmax)
    x = torch.randn(m, 40000, device=DEV, requires_grad=True)
    g = torch.randn(m, 40000, device=DEV)
    ours(x, backend="triton").backward(g)
    rec = K.last_launch()
    if DEV.type == "cuda":
        chunk, warps, reg, ring = K._smem_bwd_config(m, 40000, 4, log, sms)
        assert (rec["kernel"], rec["chunk"], rec["num_warps"], rec["reg"], rec["ring"]) == \
            ("smem", chunk, warps, reg, ring) and (ring > 0) == log, rec
    else:
        assert (rec["chunk"], rec["num_warps"]) == (K.BWD_COOP_CHUNK, 8) and rec["path"] in ("coop", "split")
    x2 = x.detach().clone().requires_grad_()
    theirs(x2, -1).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)


def test_logsumexp_long_rows_chunk():
    """Many long rows: LSE_CHUNK elements per program (few rows keep the decode chunking)."""
    many = K.DECODE_MAX_ROWS_PER_SM * K.sm_count(torch.device(DEV)) + 1
    for m, chunk in ((many, K.LSE_CHUNK), (2, None)):
        x = torch.randn(m, 40000, device=DEV)
        torch.testing.assert_close(oss.logsumexp(x, backend="triton"), torch.logsumexp(x, -1))
        rec = K.last_launch()
        assert rec["path"] == "chunks"
        if chunk:
            assert (rec["chunk"], rec["num_warps"]) == (chunk, K.LSE_CHUNK_WARPS)
        else:
            assert rec["chunk"] != K.LSE_CHUNK


@pytest.mark.parametrize("dtype,n,prefetch", [(torch.bfloat16, 512, True), (torch.bfloat16, 1024, False),
                                              (torch.float32, 1024, False)])
def test_prefetching_loop_only_for_short_rows(dtype, n, prefetch):
    x = torch.randn(64, n, device=DEV).to(dtype)
    oss.softmax(x, backend="triton")
    assert K.last_launch()["path"] == "rows" and K.last_launch()["prefetch"] is prefetch
    torch.testing.assert_close(oss.softmax(x, backend="triton").float(), torch.softmax(x.float(), -1),
                               atol=1e-2, rtol=1e-2)


# ---- GPU only: sizes the interpreter cannot afford ---------------------------------------------------
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
def test_gpu_coop_repeated_calls_and_streams():
    """The row barrier's words persist across launches: many calls, varying C, two streams, a CUDA graph."""
    xs = [torch.randn(m, n, device="cuda") for m, n in [(4, 70000), (2, 262144), (16, 40000), (4, 70000)]]
    for _ in range(20):
        for x in xs:
            torch.testing.assert_close(oss.softmax(x), torch.softmax(x, -1))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = oss.softmax(xs[1])
    s.synchronize()
    torch.testing.assert_close(y, torch.softmax(xs[1], -1))
    x = xs[0]
    oss.softmax(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = oss.softmax(x)
    for _ in range(5):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.testing.assert_close(y, torch.softmax(x, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("reserve", [True, False])
def test_gpu_graph_capture_workspace(reserve):
    """Coop launches captured into CUDA graphs take their barrier words from the pre-zeroed reserve (no zeroing
    inside the graph), or, with the reserve empty, zero them inside the graph; either way every replay, and
    replays of two graphs alternating, match torch (forward, log-softmax, backward at decode and long-row sizes)."""
    from onlinesoftmax.kernels import _launch

    xs = [torch.randn(m, n, device="cuda") * 3 for m, n in [(1, 262144), (8, 151936), (64, 131072)]]
    dy = [torch.randn_like(x) for x in xs]
    for x in xs:                                     # eager calls first, as a decoder warms up; tops the reserve up
        oss.softmax(x)
    if not reserve:
        _launch._reserve.clear()
    held = len(_launch._held_by_graphs)
    graphs, outs = [], []
    for x, g in zip(xs, dy):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = oss.softmax(x)
            lp = oss.log_softmax(x)
            dx = torch.ops.onlinesoftmax.softmax_backward(y, g, 1, False, y.dtype, "triton")
        graphs.append(graph)
        outs.append((y, lp, dx))
    assert len(_launch._held_by_graphs) - held == (min(3 * len(xs), _launch.GRAPH_RESERVE) if reserve else 0)
    for _ in range(3):
        for x, g, graph, (y, lp, dx) in zip(xs, dy, graphs, outs):
            x.copy_(torch.randn_like(x) * 3)
            graph.replay()
            ref = torch.softmax(x, -1)
            torch.testing.assert_close(y, ref)
            torch.testing.assert_close(lp, torch.log_softmax(x, -1))
            torch.testing.assert_close(dx, torch._softmax_backward_data(g, ref, -1, x.dtype), atol=1e-6, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("n,kernel", [(1024, None), (4096, "smem"), (131072, "smem")])
def test_gpu_more_than_2_31_elements(n, kernel):
    """Offsets past 2^31: 2^31 + 3 rows of bf16 elements; check the rows beyond the 32-bit boundary (N = 1024:
    rows path in registers; N = 4096: a whole row in shared memory; N = 131072: the shared-memory coop kernel;
    logsumexp: the pipelined kernel at N = 1024 and 4096, the streaming kernel at 131072)."""
    m = (1 << 31) // n + 3
    x = torch.empty(m, n, device="cuda", dtype=torch.bfloat16).normal_()
    y = oss.softmax(x)
    assert K.last_launch().get("kernel") == kernel
    tail = slice(m - 5, m)
    torch.testing.assert_close(y[tail].float(), torch.softmax(x[tail].float(), -1), atol=1e-2, rtol=1e-2)
    lse = oss.logsumexp(x)
    assert K.last_launch().get("kernel") == ("pipe" if n <= 4096 else "stream")
    torch.testing.assert_close(lse[tail].float(), torch.logsumexp(x[tail].float(), -1), atol=1e-2, rtol=1e-2)
    del y
    xt = x[:, :1].expand(m, 3)  # stride 0 columns, still 64-bit rows
    torch.testing.assert_close(oss.softmax(xt, -1)[tail].float(), torch.full((5, 3), 1 / 3, device="cuda"),
                               atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 151936])
def test_gpu_bound_launch_alignment_and_devices(n):
    """One plan (same shape and strides), data pointers of different 16-byte alignment: the pre-bound launch
    keeps a compiled kernel per alignment, and a call under another current device index still runs right."""
    base = torch.randn(3, n + 1, device="cuda")
    views = [base[:, :n], base[:, 1:], base[:, :n], base[:, 1:]]
    assert views[0].stride() == views[1].stride() and views[1].data_ptr() % 16 != 0
    for v in views:
        for fn, expect in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
            for _ in range(3):
                torch.testing.assert_close(fn(v), expect(v, -1))
        torch.testing.assert_close(oss.logsumexp(v), torch.logsumexp(v, -1))
    with torch.cuda.device(0):
        torch.testing.assert_close(oss.softmax(views[1]), torch.softmax(views[1], -1))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,kernel", [(300, 131072, "bf16x2"), (600, 32768, "bf16x2"), (3, 151936, "chunks")])
def test_gpu_bf16x2_coop_kernel_and_its_fallbacks(m, n, kernel):
    """Many bf16 coop rows of unit stride, even N and 4-byte aligned starts run the packed kernel; an odd start,
    an odd N, strided columns and decode sizes do not; rows holding ±inf / NaN / all -inf keep torch's
    semantics everywhere."""
    base = (torch.randn(m, n + 2, device="cuda") * 4).to(torch.bfloat16)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[m - 1, 3] = float("-inf")
    fallback = ("coop", "chunks") if n > K.ROW_MAX_N or m <= 264 else ("rows", None)
    cases = [(base[:, :n], ("coop", kernel)), (base[:, 1:n + 1], fallback), (base[:, :n - 1], fallback),
             (base.t().contiguous()[:n].t(), fallback)]
    for x, (path, kern) in cases:
        for name in ("softmax", "log_softmax"):
            out = FNS[name][0](x, -1)
            info = K.last_launch()
            assert (info["path"], info.get("kernel")) == (path, kern), (x.stride(), x.shape, info)
            assert_matches_low_precision_eager(name, out, x, -1)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(600, 32768), (300, 131072)])
def test_gpu_bf16x2_backward_and_its_fallbacks(m, n):
    """Many bf16 coop rows: the backward holds y and dy as words when y, dy, dx are unit-stride rows with even N
    and 4-byte aligned starts; dy starting on an odd element, or an odd N, takes the generic kernel."""
    x = (torch.randn(m, n, device="cuda") * 4).to(torch.bfloat16)
    gbase = torch.randn(m, n + 2, device="cuda").to(torch.bfloat16)
    cases = [(x, gbase[:, :n], "bf16x2"), (x, gbase[:, 1:n + 1], "chunks"), (x[:, :n - 1], gbase[:, :n - 1], "chunks")]
    for xx, g, kern in cases:
        for fn, torch_fn in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
            assert_grad_like_eager(fn, torch_fn, xx, g, "triton")
            info = K.last_launch()
            assert (info["path"], info["kernel"]) == ("coop", kern), (g.stride(), g.storage_offset(), info)


def _forward_with(x, dim, mode, config, out_dtype=None):
    """K.forward with an explicit plan config (not cached): (output, last_launch())."""
    out = torch.empty_like(x, dtype=out_dtype or x.dtype)
    m, n, inner, (gx, gy) = row_geometry([x, out], dim % x.dim())
    K.forward(x, out, gx, gy, m, n, inner, mode, config=dict(config))
    return out, K.last_launch()


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
    cfg = {"path": "coop", "smem": True, "chunk": chunk, "num_warps": warps, "reg": reg}
    cases = [(base[:, :n], -1, "smem", None), (base[:, 16:n + 16], -1, "smem", None),
             (base[:, :n].t(), 0, "smem", None), (base[:, 1:n + 1], -1, None, None)]
    if reg and dtype == torch.bfloat16:
        cases.append((base[:, :n], -1, "smem", torch.float32))
    for x, dim, kern, out_dtype in cases:
        for name, mode in (("softmax", K.SOFTMAX), ("log_softmax", K.LOG_SOFTMAX)):
            out, info = _forward_with(x, dim, mode, cfg if kern else {"path": "coop", "smem": True}, out_dtype)
            keep_e = mode == K.SOFTMAX and dtype != torch.float32 and out_dtype is None     # e_j kept (KEEP_E)
            assert info["path"] == "coop" and info.get("kernel") != "smem" if kern is None else \
                (info["kernel"], info["chunk"], info["reg"], info["keep_e"]) == ("smem", chunk, reg, keep_e), info
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
    cfg = {"path": "rows", "stream": False, "pipe": True, "num_warps": warps, "ctas": ctas}
    cases = [(base[:, :n], -1, True), (base[:, 16:n + 16], -1, True), (base[:, :n].t(), 0, True),
             (base[:, 1:n + 1], -1, False)]
    for x, dim, pipe in cases:
        out = torch.empty(m, dtype=dtype, device="cuda")
        M, N, inner, (gx, _) = row_geometry([x, x], dim % 2)
        K.forward(x, out, gx, (0, 0, 0), M, N, inner, K.LOGSUMEXP, config=dict(cfg))
        info = K.last_launch()
        assert (info["path"] == "rows" and info.get("kernel") == "pipe") is pipe, info
        if pipe:
            assert info["grid"] == min(m, ctas * K.sm_count(x.device)), info
        assert_matches_low_precision_eager("logsumexp", out, x, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,cfg", [(300, 131072, None), (600, 20000, None), (40, 50256, (4, 4, 2)),
                                     (600, 1024, (8, 2, 4)), (5, 20000, (2, 4, 8)), (2000, 4096, (4, 1, 16))])
def test_gpu_logsumexp_stream_kernel(dtype, m, n, cfg):
    """logsumexp_stream_kernel (its default, and forced with other warps / loads / programs per SM) against fp64:
    rows longer and shorter than a tile, partial tiles, fewer rows than programs, rows holding ±inf / NaN / all
    -inf, a row far below 0 (its first state (-inf, 0) rescaled by e^(-inf - m') = 0, not 0·inf), strided rows and
    dim 0."""
    base = (torch.randn(m, n + 32, device="cuda") * 4).to(dtype)
    base[1, 5], base[2, 7], base[0, :] = float("inf"), float("nan"), float("-inf")
    base[4] -= 200
    base[m - 1, 3], base[3, n - 1] = float("-inf"), float("inf")
    config = {"stream": True} | (dict(zip(("num_warps", "loads", "ctas"), cfg)) if cfg else {})
    for x, dim in ((base[:, :n], -1), (base[:, 16:n + 16], -1), (base[:, :n].t(), 0)):
        out = torch.empty(m, dtype=dtype, device="cuda")
        M, N, inner, (gx, _) = row_geometry([x, x], dim % 2)
        K.forward(x, out, gx, (0, 0, 0), M, N, inner, K.LOGSUMEXP, config=dict(config))
        assert K.last_launch()["kernel"] == "stream", K.last_launch()
        assert_matches_low_precision_eager("logsumexp", out, x, dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_smem_register_tiles_past_the_row_fall_back(dtype):
    """A forced REG config whose register sub-tiles the row's last chunk does not cover (50256 = 8 x 6144 + 1104)
    is refused: the register kernels run, and the result is right."""
    x = (torch.randn(6, 50256, device="cuda") * 3).to(dtype)
    out, info = _forward_with(x, -1, K.SOFTMAX, {"path": "coop", "smem": True, "chunk": 6144, "num_warps": 8,
                                                  "reg": 2})
    assert info["path"] == "coop" and info.get("kernel") != "smem", info
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
            info = K.last_launch()
            assert (info["path"] == "rows" and info.get("kernel") == "smem" and info["chunks"] == 1) is smem, info
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
    if isinstance(chunk, tuple):
        chunk = chunk[dtype.itemsize == 2]
    x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
    y = (torch.log_softmax if log else torch.softmax)(x.float(), -1).to(dtype)
    gbase = torch.randn(m, n + 16, device="cuda").to(dtype)
    for dy, kern in ((gbase[:, :n], "smem"), (gbase[:, 8:n + 8], "smem"), (gbase[:, 1:n + 1], None)):
        dx = torch.empty_like(y)
        mm, nn, inner, geos = row_geometry([y, dy, dx], 1)
        cfg = {"path": "coop", "smem": True}
        if kern:
            cfg.update(chunk=chunk, num_warps=warps, reg=reg, ring=ring)
        K.backward(y, dy, dx, *geos, mm, nn, inner, log, config=cfg)
        info = K.last_launch()
        assert info.get("kernel") != "smem" if kern is None else \
            (info["kernel"], info["chunk"], info["reg"], info["ring"]) == ("smem", chunk, reg, ring)
        eager = (torch._log_softmax_backward_data if log else torch._softmax_backward_data)(dy, y, -1, dtype)
        _assert_dx_within_eager(dx, eager, y.double(), dy.double(), log)


@pytest.mark.parametrize("dtype,n,cfg,reg", [
    (torch.bfloat16, 131072, dict(chunk=12288, num_warps=4, reg=4), 4),
    (torch.float32, 131072, dict(chunk=8192, num_warps=4, reg=4), 4),
    (torch.bfloat16, 131072, dict(chunk=4096, num_warps=4, reg=4), None),    # no sub-tile left in shared memory
    (torch.bfloat16, 131072, dict(chunk=8192, num_warps=4, reg=3), None),    # not a power of two
    (torch.float32, 3 * 8192 + 1008, dict(chunk=8192, num_warps=4, reg=2), None),   # last chunk below 2 x 512
])
def test_smem_backward_register_tiles_plan(monkeypatch, dtype, n, cfg, reg):
    """Forced `reg` sub-tiles of y and dy in registers in the backward smem kernel: plans on meta tensors;
    where they cannot be held the plan falls back to a register kernel."""
    monkeypatch.setattr(K, "sm_count", lambda device: H200_SMS)
    monkeypatch.setattr(K, "interpret_mode", lambda: False)
    y, dy, dx = (torch.empty((4096, n), dtype=dtype, device="meta") for _ in range(3))
    M, N, inner, (g1, g2, g3) = row_geometry([y, dy, dx], 1)
    rec = K._backward_plan(dict(path="coop", smem=True, **cfg), y.device, g1, g2, g3, M, N, inner, False,
                           (dtype,) * 3, dtype == torch.bfloat16, aligned=True).record
    assert (rec.get("kernel") == "smem" and rec["reg"]) == (reg or False), rec


def test_smem_kernel_eligibility_and_compile_for_sm90():
    """Where the shared-memory kernel may run (no GPU needed), and that it compiles for sm_90a holding its
    chunk in shared memory with no spills."""
    class T:            # the attributes _smem_ok reads
        def __init__(self, size=4, ptr=0):
            self._size, self._ptr = size, ptr

        def element_size(self):
            return self._size

        def data_ptr(self):
            return self._ptr

    ok = (T(), T(), (131072, 0, 1), (131072, 0, 1), 131072, K.SOFTMAX, False)
    assert K._smem_ok(*ok)
    assert K._smem_ok(T(2), T(2), *ok[2:])
    assert not K._smem_ok(*ok[:-1], True)                                   # interpreter
    assert not K._smem_ok(T(8), T(8), *ok[2:])                              # fp64
    assert not K._smem_ok(T(ptr=4), T(), *ok[2:])                           # x off 16 bytes
    assert not K._smem_ok(*ok[:2], (131080, 0, 1), (131072, 0, 1), *ok[4:])  # row stride not a multiple of 16
    assert not K._smem_ok(*ok[:2], (131072, 0, 2), (131072, 0, 1), *ok[4:])  # strided columns
    assert not K._smem_ok(*ok[:4], 131064, *ok[5:])                           # N not a multiple of 16
    assert not K._smem_ok(*ok[:5], K.LOGSUMEXP, False)
    # compiled in a child process: under TRITON_INTERPRET=1 (CI) Triton's own helpers are interpreter objects,
    # which Gluon cannot compile
    probe = r"""
import json
import re
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.kernels.softmax_smem import softmax_coop_smem_kernel as fn
sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
sig.update(X="*fp32", Y="*fp32", PART_M="*fp32", PART_D="*fp32", ARRIVE="*i32", GEN="*i32")
out = []
for reg in (0, 4):      # the chunk's last `reg` sub-tiles in registers (REG)
    const = dict(CHUNK=8192, VEC=4, WARPS=8, C_POW2=16, MODE=0, EVEN=False, REG=reg, WORDS=False, FAST=2)
    k = compile(GluonASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = k.asm["ptx"]
    out.append({"shared": k.metadata.shared, "local": "ld.local" in ptx,
                "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx))})
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    full, hybrid = json.loads(res.stdout.strip().splitlines()[-1])
    assert full["shared"] >= 8192 * 4 and full["cp_async"] >= 8 and not full["local"], full
    # 8 sub-tiles of 1024 elements: 4 in shared memory, 4 in registers, no spills
    assert 4096 * 4 <= hybrid["shared"] < 8192 * 4 and hybrid["cp_async"] >= 4 and not hybrid["local"], hybrid


def test_smem_backward_defaults_compile_for_sm90_without_spills():
    """The backward smem kernel at its SMEM_BWD_CONFIG defaults (fp32 softmax 10240 / 4 warps / 8 register
    sub-tiles of y and dy: 124 registers; 16-bit 32768 / 8 / 2, bf16 as words, fp16 as elements under
    SMEM_BWD_F16_MAXNREG: without it ptxas spills; log-softmax with its ring of y, RING) compiles for sm_90a with no
    stack frame (no spills; cuobjdump's resource usage, read by benchmarks/cubin_tools.py as for the compiler
    report) and the shared memory of its (chunk - reg sub-tiles) of y and dy (with RING: of dy, and `ring` sub-tiles
    of y). Compiled in a child process, as the forward's compile test."""
    cases = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False), (torch.float16, False),
             (torch.bfloat16, True), (torch.float16, True)]
    specs = []
    for dtype, log in cases:
        chunk, warps, reg, ring = K.SMEM_BWD_CONFIG[dtype.itemsize, log][0]
        vec = 16 // dtype.itemsize
        specs.append(dict(ptr={torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype],
                          maxnreg=K.SMEM_BWD_F16_MAXNREG if dtype == torch.float16 else 0, CHUNK=chunk, VEC=vec,
                          WARPS=warps, REG=reg, WORDS=dtype == torch.bfloat16, LOG=log, RING=ring,
                          LIBDEVICE=dtype == torch.float32, SUM="fp64" if dtype == torch.float32 else "fp32",
                          smem=((2 - bool(ring)) * (chunk - reg * vec * 32 * warps) + ring * vec * 32 * warps)
                          * dtype.itemsize))
    probe = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import triton.language as tl
from cubin_tools import compile_sm90, cubin_report
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.kernels.softmax_smem import softmax_bwd_coop_smem_kernel as fn
out = []
for spec in json.loads(sys.argv[1]):
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
    sig.update(Yp=spec["ptr"], DY=spec["ptr"], DX=spec["ptr"], PART="*" + spec["SUM"], ARRIVE="*i32", GEN="*i32")
    const = {k: spec[k] for k in ("CHUNK", "VEC", "WARPS", "REG", "WORDS", "LOG", "LIBDEVICE", "RING")}
    const.update(C_POW2=16, EVEN=True, SUM=getattr(tl, {"fp64": "float64", "fp32": "float32"}[spec["SUM"]]))
    # as the plan launches unit-stride rows of 16-byte aligned tensors (benchmarks/softmax_ptxas.py compiles them
    # so): INNER = 1 a constant, pointers, N and the strides divisible by 16
    sig["INNER"], const["INNER"] = "constexpr", 1
    aligned = ("Yp", "DY", "DX", "PART", "N", "syo", "syi", "sdo", "sdi", "sxo", "sxi")
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    opts = {"num_warps": spec["WARPS"], **({"maxnreg": spec["maxnreg"]} if spec["maxnreg"] else {})}
    k = compile_sm90(GluonASTSource(fn, sig, const, attrs), opts)
    (regs, stack, _), _ = cubin_report(k)
    out.append({"regs": regs, "stack": stack, "shared": k.metadata.shared})
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    res = subprocess.run([sys.executable, "-c", probe, json.dumps(specs), bench], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    for spec, got in zip(specs, json.loads(res.stdout.strip().splitlines()[-1])):
        assert got["stack"] == 0 and got["regs"] <= 255 and got["shared"] >= spec["smem"], (spec, got)


def test_launch_plan_cached_per_problem():
    """The second call of a problem reuses its plan (path, grid, bound kernels); a new layout makes a new one."""
    K._plans.clear()
    x = torch.randn(6, 300, device=DEV)
    for _ in range(3):
        torch.testing.assert_close(oss.softmax(x, backend="triton"), torch.softmax(x, -1))
    assert len(K._plans) == 1
    torch.testing.assert_close(oss.softmax(x.t(), 0, backend="triton"), torch.softmax(x.t(), 0))
    oss.log_softmax(x, backend="triton")
    assert len(K._plans) == 2          # x.t() along dim 0 is the same row problem as x along dim 1


def test_launch_hooks_take_tritons_path():
    from triton import knobs

    from onlinesoftmax.kernels import _launch

    assert not _launch._hooks_installed()

    def hook(*args):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert _launch._hooks_installed()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


# ---- torch.vmap ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bdim,dim", [(0, -1), (1, 0), (2, 1)])
def test_vmap_matches_a_loop(backend, bdim, dim, monkeypatch):
    """torch.vmap runs the custom ops on the batched tensor (batch first, dim + 1), not through a per-sample loop,
    and not through the eager shortcut (which cannot read a BatchedTensor)."""
    import onlinesoftmax.ops.softmax as S

    x = torch.randn(3, 5, 33, device=DEV)
    x[1, 2] = -math.inf
    for name in FNS:
        got = torch.func.vmap(lambda r: FNS[name][0](r, dim, backend=backend), in_dims=bdim)(x)
        expect = torch.stack([FNS[name][1](x.select(bdim, i), dim) for i in range(x.shape[bdim])])
        torch.testing.assert_close(got, expect, equal_nan=True)
    calls = []                              # the op's implementation, whichever backend: x's shape per call
    inner = "_torch_forward" if backend == "torch" else "_rows_or_copy"
    real = getattr(S, inner)
    monkeypatch.setattr(S, inner, lambda t, *a: calls.append((t[0] if isinstance(t, list) else t).shape)
                        or real(t, *a))
    torch.func.vmap(lambda r: oss.softmax(r, dim, backend=backend), in_dims=bdim)(x)
    assert calls == [(x.shape[bdim],) + tuple(n for i, n in enumerate(x.shape) if i != bdim)]   # one batched call
    s = torch.randn(6, device=DEV)                          # 0-d samples
    torch.testing.assert_close(torch.func.vmap(lambda r: oss.softmax(r, backend=backend))(s), torch.ones_like(s))
    torch.testing.assert_close(torch.func.vmap(lambda r: oss.logsumexp(r, backend=backend))(s), s)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_backward_and_autograd_through_vmap(backend):
    x = torch.randn(4, 40, device=DEV, requires_grad=True)
    g = torch.randn(4, 40, device=DEV)
    y = torch.func.vmap(lambda r: oss.softmax(r, backend=backend))(x)
    (got,) = torch.autograd.grad(y, x, g)
    xr = x.detach().requires_grad_()
    (expect,) = torch.autograd.grad(torch.softmax(xr, -1), xr, g)
    torch.testing.assert_close(got, expect)
    yy = torch.softmax(x.detach(), -1)

    def op(y, dy):
        return torch.ops.onlinesoftmax.softmax_backward(y, dy, 0, False, torch.float32, backend)

    torch.testing.assert_close(torch.func.vmap(op, in_dims=(0, None))(yy, g[0]),
                               torch.stack([op(yy[i], g[0]) for i in range(4)]))
    # the op called directly with a negative dim: the rule counts it from the end of a sample
    x3 = torch.randn(3, 4, 5, device=DEV)
    got = torch.func.vmap(lambda r: torch.ops.onlinesoftmax.softmax(r, -2, 0, torch.float32, backend))(x3)
    torch.testing.assert_close(got, torch.softmax(x3, 1))
    torch.testing.assert_close(torch.ops.onlinesoftmax.softmax(x3, -2, 0, torch.float32, backend), torch.softmax(x3, 1))
    torch.testing.assert_close(torch.ops.onlinesoftmax.logsumexp(x3, -2, backend), torch.logsumexp(x3, 1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(FNS))
def test_torch_func_transforms_match_torch(backend, name):
    """torch.func.grad / jacrev / jacfwd / hessian and vmap(grad) through our functions equal torch's (fp64):
    under torch.func the ops run inside an autograd.Function whose derivatives are torch ops."""
    import onlinesoftmax.ops.softmax as S

    ours, theirs = FNS[name][0], FNS[name][1]
    x = torch.randn(3, 7, device=DEV, dtype=torch.float64)
    w = torch.randn(3, 7 if name != "logsumexp" else 1, device=DEV, dtype=torch.float64).squeeze(-1)

    def loss(f):
        return lambda x: (f(x) * w).sum()

    transforms = {
        "grad": lambda f: torch.func.grad(loss(f)),
        "jacrev": torch.func.jacrev,
        "jacfwd": torch.func.jacfwd,
        "hessian": lambda f: torch.func.hessian(loss(f)),
        "vmap(grad)": lambda f: torch.func.vmap(torch.func.grad(lambda r: (f(r.unsqueeze(0)) * w[0]).sum())),
    }
    for tname, transform in transforms.items():
        got = transform(lambda x: ours(x, 1, backend=backend))(x)
        want = transform(lambda x: theirs(x, 1))(x)
        torch.testing.assert_close(got, want, msg=lambda m: f"{name} {tname}: {m}")
    calls = []                          # and the forward is our op, not a fallback
    real = S._SoftmaxFunction.forward if name != "logsumexp" else S._LogsumexpFunction.forward
    cls = S._SoftmaxFunction if name != "logsumexp" else S._LogsumexpFunction
    try:
        cls.forward = staticmethod(lambda *a: calls.append(1) or real(*a))
        torch.func.grad(loss(lambda x: ours(x, 1, backend=backend)))(x)
    finally:
        cls.forward = staticmethod(real)
    assert calls == [1]


def test_captured_scratch_takes_zeroed_words_from_the_reserve(monkeypatch):
    """What a launch being captured into a CUDA graph gets (_captured_scratch, run here on the CPU): the zeroed
    views from a pre-zeroed reserve buffer, which is then held for good; the others uninitialised; with the
    reserve empty or too small, freshly zeroed views. Eager calls top the reserve up."""
    from onlinesoftmax.kernels import _launch

    dev = torch.device("cpu")
    monkeypatch.setattr(_launch, "_reserve", {})
    monkeypatch.setattr(_launch, "_held_by_graphs", [])
    layout = ((1024, torch.int32), (1024, torch.int32), (70000, torch.float32))
    a = _launch._captured_scratch(dev, layout, 2)                        # empty reserve: zeroed here
    assert not _launch._held_by_graphs and [v.numel() for v in a] == [1024, 1024, 70000]
    assert all(bool((v == 0).all()) for v in a[:2]) and all(v.data_ptr() % 16 == 0 for v in a)
    _launch._top_up_reserve(dev)
    assert len(_launch._reserve[dev]) == _launch.GRAPH_RESERVE
    b = _launch._captured_scratch(dev, layout, 2)
    assert len(_launch._reserve[dev]) == _launch.GRAPH_RESERVE - 1 and len(_launch._held_by_graphs) == 1
    assert b[0].data_ptr() == _launch._held_by_graphs[0].data_ptr() and all(bool((v == 0).all()) for v in b[:2])
    assert b[2].data_ptr() % 16 == 0 and b[2].numel() == 70000
    big = ((2048, torch.int32), (2048, torch.int32), (8, torch.float32))   # 16 KB of words: past a reserve buffer
    c = _launch._captured_scratch(dev, big, 2)
    assert len(_launch._held_by_graphs) == 1 and all(bool((v == 0).all()) for v in c[:2])
    d = _launch._captured_scratch(dev, layout[2:], 0)                    # nothing zeroed (top-k's workspace)
    assert len(_launch._held_by_graphs) == 1 and d[0].numel() == 70000


def test_stream_scratch_views_aligned_reused_and_grown():
    """Workspace views start 16-byte aligned (bound kernels take them as aligned), are reused while they fit and,
    once a request outgrows one, are carved again no smaller from a zeroed buffer (barrier words start at 0)."""
    from onlinesoftmax.kernels._launch import stream_scratch

    tag = ("test", DEV)
    a = stream_scratch(tag, DEV, ((5, torch.int32), (3, torch.float64), (7, torch.float32)))
    assert [v.numel() for v in a] == [5, 3, 7] and all(v.data_ptr() % 16 == 0 for v in a)
    assert all(bool((v == 0).all()) for v in a)
    a[0].fill_(1)
    b = stream_scratch(tag, DEV, ((4, torch.int32), (3, torch.float64), (1, torch.float32)))
    assert all(x is y for x, y in zip(a, b))
    c = stream_scratch(tag, DEV, ((9, torch.int32), (2, torch.float64), (7, torch.float32)))
    assert [v.numel() for v in c] == [9, 3, 7] and all(v.data_ptr() % 16 == 0 for v in c)
    assert bool((c[0] == 0).all()) and c[1].dtype == torch.float64
