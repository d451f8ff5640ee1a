"""oss.attention against the fp64 references: both backends, forward and backward, masks, GQA, edge cases.

Tolerance rule (attention-gym's ``assert_matches_low_precision_eager``): our worst error against fp64 may not
exceed twice that of the same math done eagerly by torch in the input dtype, plus 4 eps of the dtype (relative to
the largest reference value). Without CUDA the Triton kernels run in the interpreter at tiny sizes; the
``gpu``-marked tests repeat them at real sizes on the device.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax.attention import explain
from onlinesoftmax.attention.plan import Knobs
from onlinesoftmax.reference.attention import attention_mask, attention_scores, attention_tiled
from onlinesoftmax.reference.attention import attention_varlen as varlen_ref
from onlinesoftmax.target import A100, H200, INTERPRETER, L4

HAS_CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if HAS_CUDA else "cpu")
LOWP = [torch.float16, torch.bfloat16]


# ---- helpers ------------------------------------------------------------------------------------------------
def make(B, H, Hkv, Sq, Sk, D, dtype=torch.float32, device=DEV, grad=False, layout="bhsd"):
    """Random q, k, v in SDPA layout; ``layout="bshd"`` makes them [B, S, H, D] tensors seen transposed."""
    def one(h, s):
        if layout == "bshd":
            t = torch.randn(B, s, h, D, dtype=dtype, device=device).transpose(1, 2)
        else:
            t = torch.randn(B, h, s, D, dtype=dtype, device=device)
        return t.requires_grad_(grad)
    return one(H, Sq), one(Hkv, Sk), one(Hkv, Sk)


def eager(q, k, v, causal=False, scale=None, window=None, softcap=None):
    """The same math as the reference, done by torch in the inputs' own dtype (the low-precision yardstick)."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    keep = attention_mask(Sq, Sk, causal, window, device=q.device)
    s = s.masked_fill(~keep, -math.inf)
    m = s.amax(-1, keepdim=True) if Sk else s.new_zeros(s.shape[:-1] + (1,))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    p = torch.exp(s - m)
    d = p.sum(-1, keepdim=True)
    o = (p @ v) / torch.where(d > 0, d, torch.ones_like(d))
    lse = torch.where(d > 0, m + torch.log(torch.where(d > 0, d, torch.ones_like(d))), torch.full_like(d, -math.inf))
    return o, lse.squeeze(-1)


class tf32_yardstick:
    """fp32 on CUDA: the kernels' matmuls run on TF32 tensor cores (documented), so the yardstick does too, and
    the factor is 3 (P is rounded to TF32 before P·V as well, which eager's fp32 softmax is not)."""

    def __init__(self, t):
        self.on = t.is_cuda and t.dtype == torch.float32

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.prev or self.on
        return 3.0 if self.on else 2.0

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev


def bound(ref, eager_out, dtype, factor=2.0):
    scale = ref.abs().max().item() if ref.numel() else 1.0
    theirs = (eager_out.double() - ref).abs().max().item() if ref.numel() else 0.0
    return factor * theirs + 4 * torch.finfo(dtype).eps * max(scale, 1e-30)


def _tf32_truncated(x):
    """x (fp32) with the 13 low mantissa bits cleared: what a TF32 tensor core multiplies."""
    bits = x.detach().float().contiguous().view(torch.int32) & ~0x1FFF
    return bits.view(torch.float32).view(x.shape)


def err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def check_forward(q, k, v, backend, **kw):
    o, lse = oss.attention(q, k, v, return_lse=True, backend=backend, **kw)
    ro, rl = attention_scores(q, k, v, **kw)
    assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    empty = torch.isinf(rl)
    assert torch.equal(torch.isinf(lse), empty.to(lse.device)) and (lse[empty.to(lse.device)] < 0).all()
    assert (o[empty.to(o.device)] == 0).all()
    with torch.no_grad(), tf32_yardstick(q) as factor:
        eo, el = eager(q.detach(), k.detach(), v.detach(), **kw)
    b = bound(ro, eo, q.dtype, factor)
    if factor > 2:
        # TF32 (see below): cuBLAS keeps small products in full fp32, so eager is no yardstick there; the fp64 o of
        # q, k, v truncated to TF32, plus P's own truncation before P·V: |Δo| <= 2^-10 · max |v|
        to_, _ = attention_scores(_tf32_truncated(q), _tf32_truncated(k), _tf32_truncated(v), **kw)
        b = max(b, 2 * err(to_, ro) + 2.0 ** -10 * v.detach().abs().max().item() + 1e-6)
    assert err(o, ro) <= b, f"o: error {err(o, ro):.3e} > bound {b:.3e}"
    fin = (~empty).to(lse.device)
    # the scores are fp32 sums of exact products (fp16 / bf16, or fp32 off CUDA): lse to 1e-5; under TF32 the
    # products are rounded, and the yardstick is eager's TF32 lse
    lb = 1e-5 * max(1.0, rl[fin].abs().max().item() if fin.any() else 1)
    if factor > 2:
        lb = max(lb, bound(rl[fin], el[fin], torch.float32, factor))
        # the tensor cores read fp32 operands as TF32 by dropping 13 mantissa bits (truncation, not rounding: the
        # products' errors add up with one sign); the fp64 lse of q and k so truncated is the kernel's own error
        _, tl_ = attention_scores(_tf32_truncated(q), _tf32_truncated(k), v, **kw)
        lb = max(lb, 2 * err(tl_[fin.to(tl_.device)], rl[fin.to(rl.device)]) + 1e-5)
    assert err(lse[fin], rl[fin]) <= lb, f"lse: error {err(lse[fin], rl[fin]):.3e} > bound {lb:.3e}"
    return o, lse


def check_backward(q, k, v, backend, with_lse=False, **kw):
    o, lse = oss.attention(q, k, v, return_lse=True, backend=backend, **kw)
    do = torch.randn_like(o)
    dl = torch.randn_like(lse)
    ro, rl = attention_scores(q, k, v, **kw)
    fin = torch.isfinite(rl)
    loss = (o.double() * do.double()).sum()
    rloss = (ro * do.double()).sum()
    if with_lse:
        loss = loss + (lse.double().where(fin, 0) * dl.double()).sum()
        rloss = rloss + (rl.where(fin, 0) * dl.double()).sum()
    got = torch.autograd.grad(loss, (q, k, v))
    want = torch.autograd.grad(rloss, (q, k, v))
    qe, ke, ve = (t.detach().requires_grad_() for t in (q, k, v))
    with tf32_yardstick(q) as factor:
        eo, el = eager(qe, ke, ve, **kw)
        eloss = (eo * do).sum()
        if with_lse:
            eloss = eloss + (el.where(fin.to(el.device), 0) * dl).sum()
        elow = torch.autograd.grad(eloss, (qe, ke, ve))
    floor = {}
    if factor > 2:
        # TF32 and Δ: dS = P∘(dP − Δ) with dP = dO·Vᵀ on TF32 operands (error <= 2^-9 · Σ_d |dO||V| per entry)
        # and Δ in fp32: where the exact dS is ~0 (a single key: dQ = dK = 0) no relative test holds, so the
        # error may also reach that level carried through K (dQ, Σ_j P = 1) or Q (dK, Σ over the group's rows)
        scale = kw.get("scale") or q.shape[-1] ** -0.5
        g_ = q.shape[1] // k.shape[1]
        a = (do.detach().abs().double() @ v.detach().abs().double().repeat_interleave(g_, 1).transpose(-1, -2))
        a = a.max().item() if a.numel() else 0.0
        floor = {"q": 2.0 ** -8 * scale * a * k.detach().abs().max().item(),
                 "k": 2.0 ** -8 * scale * a * q.detach().abs().max().item() * q.shape[2] * g_}
    for name, g, w, e, t in zip("qkv", got, want, elow, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype
        assert not torch.isnan(g).any(), f"d{name} has NaN"
        b = bound(w, e, q.dtype, factor) + 1e-6 + floor.get(name, 0.0)
        if factor > 2 and err(g, w) > b:
            # TF32: Δ = rowsum(O·dO) does not cancel dP's rounding as eager's Σ P·dP does (FlashAttention's
            # backward); held to the TF32 level instead, ||g - ref|| / ||ref|| <= 3e-3
            rel = ((g.double() - w).norm() / w.norm().clamp_min(1e-30)).item()
            assert rel <= 3e-3, f"d{name}: relative error {rel:.3e} > 3e-3 (TF32)"
            continue
        assert err(g, w) <= b, f"d{name}: error {err(g, w):.3e} > bound {b:.3e}"


# ---- the references agree ------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal,window,softcap", [(False, None, None), (True, None, None), (False, (3, 2), None),
                                                   (True, (5, -1), 2.0), (False, (0, 0), None)])
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (7, 40), (40, 7), (33, 33), (5, 0)])
def test_reference_tiled_matches_scores(Sq, Sk, causal, window, softcap):
    q, k, v = make(2, 4, 2, Sq, Sk, 8, torch.float64, "cpu")
    o1, l1 = attention_scores(q, k, v, causal=causal, window=window, softcap=softcap)
    o2, l2 = attention_tiled(q, k, v, causal=causal, window=window, softcap=softcap, block=8)
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(l1, l2, rtol=1e-12, atol=1e-12)


def test_reference_mask_semantics():
    # bottom-right causal: with Sq = 2, Sk = 4 the last query sees every key, the first all but the last
    assert attention_mask(2, 4, causal=True).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert attention_mask(3, 5, window=(1, 0)).tolist() == [[False, True, True, False, False],
                                                          [False, False, True, True, False],
                                                          [False, False, False, True, True]]


# ---- the torch backend (CPU: full fp32) ------------------------------------------------------------------------
SHAPES = [  # (B, H, Hkv, Sq, Sk, D)
    (1, 2, 2, 7, 7, 16), (2, 4, 1, 63, 65, 32), (1, 8, 1, 65, 63, 64), (1, 4, 4, 1, 257, 80), (1, 8, 2, 257, 1, 128),
    (1, 2, 1, 17, 33, 256),
]


@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_torch_backend_forward(B, H, Hkv, Sq, Sk, D, causal):
    q, k, v = make(B, H, Hkv, Sq, Sk, D, device="cpu")
    check_forward(q, k, v, "torch", causal=causal)


@pytest.mark.parametrize("dtype", [torch.float32, *LOWP])
@pytest.mark.parametrize("kw", [dict(window=(4, 3)), dict(causal=True, window=(6, -1), softcap=3.0),
                                dict(scale=0.3, softcap=1.5), dict(causal=True, window=(-1, 5))])
def test_torch_backend_options(dtype, kw):
    q, k, v = make(2, 4, 2, 19, 30, 32, dtype, "cpu")
    check_forward(q, k, v, "torch", **kw)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window=(3, 1), softcap=2.0)])
def test_torch_backend_backward(kw):
    q, k, v = make(1, 4, 2, 21, 13, 16, device="cpu", grad=True)
    check_backward(q, k, v, "torch", with_lse=True, **kw)


# ---- the Triton kernels (interpreter on CPU, tiny) ---------------------------------------------------------------
TINY = [  # (B, H, Hkv, Sq, Sk, D, options)
    (1, 2, 1, 7, 9, 16, {}),
    (1, 4, 1, 20, 33, 32, dict(causal=True)),           # Sq < Sk, GQA 4
    (1, 8, 1, 33, 20, 16, dict(causal=True)),           # Sq > Sk: the first 13 rows attend nothing; GQA 8
    (2, 2, 2, 17, 40, 24, dict(window=(5, 3))),         # D not a power of two
    (1, 2, 1, 17, 40, 16, dict(causal=True, window=(3, -1), softcap=2.0)),
    (1, 1, 1, 1, 1, 16, {}),
    (1, 1, 1, 1, 65, 8, dict(causal=True)),
]


@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,kw", TINY)
def test_triton_forward_backward(B, H, Hkv, Sq, Sk, D, kw, kernel_device):
    q, k, v = make(B, H, Hkv, Sq, Sk, D, device=kernel_device, grad=True)
    check_forward(q, k, v, "triton", **kw)
    check_backward(q, k, v, "triton", **kw)


def test_triton_lse_gradient(kernel_device):
    q, k, v = make(1, 2, 1, 12, 20, 16, device=kernel_device, grad=True)
    check_backward(q, k, v, "triton", with_lse=True, causal=True, window=(4, -1))


@pytest.mark.parametrize("dtype", LOWP)
def test_triton_low_precision(dtype, kernel_device):
    q, k, v = make(1, 2, 1, 24, 40, 32, dtype, kernel_device, grad=True)
    check_forward(q, k, v, "triton", causal=True)
    check_backward(q, k, v, "triton", causal=True)


def test_triton_strided_inputs(kernel_device):
    """[B, S, H, D] tensors transposed, and a head-dim stride of 2: read as they come."""
    q, k, v = make(2, 4, 2, 19, 23, 16, device=kernel_device, layout="bshd", grad=True)
    assert not q.is_contiguous()
    o = check_forward(q, k, v, "triton", causal=True)[0]
    assert o.stride() == torch.empty_like(q).stride()
    check_backward(q, k, v, "triton", causal=True)
    big = torch.randn(1, 2, 9, 32, device=kernel_device)
    qs, ks, vs = big[..., ::2], big[..., 1::2], big[..., ::2].flip(2)
    check_forward(qs, ks, vs, "triton")


ATOMIC_DQ = [dict(dq_atomic=True), dict(dq_atomic=True, block_n=32)]   # block_n 32: key blocks twice the query step


@pytest.fixture
def backward_knobs(monkeypatch):
    """Calls made after ``backward_knobs(dict)`` run the backward with those plan fields (the api's plan_attention
    wrapped): how the tests reach a variant no default plan picks."""
    from onlinesoftmax.attention import api

    plan = api.plan_attention

    def use(knobs):           # a later call replaces an earlier one's fields
        monkeypatch.setattr(api, "plan_attention", lambda p, t, b, kn=Knobs(): plan(p, t, b, Knobs(backward=knobs)))
    return use


@pytest.mark.parametrize("knobs", ATOMIC_DQ)
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,kw", TINY)
def test_triton_backward_atomic_dq(B, H, Hkv, Sq, Sk, D, kw, knobs, kernel_device, backward_knobs):
    """dQ added by the dK/dV kernel (fp32 atomics into zeroed rows, then a cast): GQA, causal, window, softcap."""
    backward_knobs(knobs)
    q, k, v = make(B, H, Hkv, Sq, Sk, D, device=kernel_device, grad=True)
    check_backward(q, k, v, "triton", with_lse=bool(kw), **kw)


@pytest.mark.parametrize("knobs", ATOMIC_DQ)
def test_triton_backward_atomic_dq_strided_lowp(knobs, kernel_device, backward_knobs):
    backward_knobs(knobs)
    q, k, v = make(2, 4, 2, 19, 23, 16, device=kernel_device, layout="bshd", grad=True)
    check_backward(q, k, v, "triton", causal=True)
    q, k, v = make(1, 2, 1, 24, 40, 32, torch.bfloat16, kernel_device, grad=True)
    check_backward(q, k, v, "triton", causal=True)


def test_fully_masked_rows_no_nan(kernel_device):
    # window (0, 0) with Sq > Sk: rows i < Sq - Sk have no key; left bound past every key for the rest
    for backend in ("torch", "triton"):
        q, k, v = make(1, 2, 1, 20, 6, 16, device=kernel_device, grad=True)
        o, lse = oss.attention(q, k, v, causal=True, return_lse=True, backend=backend)
        assert (o[:, :, :14] == 0).all() and torch.isinf(lse[:, :, :14]).all() and (lse[:, :, :14] < 0).all()
        assert torch.isfinite(lse[:, :, 14:]).all()
        dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))
        assert (dq[:, :, :14] == 0).all() and all(torch.isfinite(g).all() for g in (dq, dk, dv))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("B,Sq,Sk", [(2, 0, 5), (2, 5, 0), (0, 3, 3), (1, 0, 0)])
def test_empty(backend, B, Sq, Sk, kernel_device):
    q, k, v = make(B, 2, 1, Sq, Sk, 16, device=kernel_device, grad=True)
    o, lse = oss.attention(q, k, v, return_lse=True, backend=backend)
    assert o.shape == q.shape and lse.shape == (B, 2, Sq)
    assert (o == 0).all() and (lse == -math.inf).all()
    dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v), allow_unused=True)
    for g, t in zip((dq, dk, dv), (q, k, v)):
        assert g is None or (g.shape == t.shape and (g == 0).all())


# ---- plans ------------------------------------------------------------------------------------------------------
@pytest.mark.interpreter
def test_explain_paths():
    q, k, v = make(1, 4, 1, 8, 8, 64, device="cpu")
    assert explain(q, k, v, backend="torch").backend == "torch"
    p = explain(q, k, v, causal=True, window=(4, -1))
    assert p.problem.window == (4, 0) and p.problem.group == 4 and p.problem.causal
    from onlinesoftmax.attention.plan import Problem, plan_attention, plan_forward
    prob = Problem(4, 32, 32, 4096, 4096, 128, "bfloat16", True, (-1, 0))
    hopper, ampere = plan_attention(prob, H200, "triton"), plan_attention(prob, A100, "triton")
    assert (hopper.forward.block_m, hopper.forward.block_n, hopper.forward.num_warps) == (128, 128, 8)
    assert hopper.backward.dq_atomic and (hopper.backward.block_m, hopper.backward.block_n) == (64, 128)
    plain = plan_attention(dataclasses.replace(prob, causal=False, window=(-1, -1)), H200, "triton").backward
    assert not plain.dq_atomic and (plain.block_m, plain.block_n) == (64, 64)
    assert not plan_attention(dataclasses.replace(prob, Hkv=8), H200, "triton").backward.dq_atomic
    assert not plan_attention(dataclasses.replace(prob, deterministic=True), H200, "triton").backward.dq_atomic
    q, k, v = make(1, 2, 2, 8, 8, 128, torch.bfloat16, device="cpu")
    torch.use_deterministic_algorithms(True)
    try:
        assert explain(q, k, v, causal=True, backend="triton").problem.deterministic
    finally:
        torch.use_deterministic_algorithms(False)
    assert not explain(q, k, v, causal=True, backend="triton").problem.deterministic
    assert ampere.forward.kernel == "triton" and (ampere.forward.block_m, ampere.forward.block_n) == (64, 64)
    assert plan_forward(prob, L4) == ampere.forward
    assert plan_forward(prob, INTERPRETER).block_m == 16
    assert plan_forward(prob, H200, Knobs(forward={"block_n": 64})).block_n == 64
    with pytest.raises(TypeError, match="forward has no field blockn"):     # at construction: on any backend
        Knobs(forward={"blockn": 64})
    with pytest.raises(TypeError, match="backward has no field dq_slots"):
        Knobs(backward={"dq_slots": True})


# ---- errors -------------------------------------------------------------------------------------------------------
@pytest.mark.interpreter
def test_errors_name_function_and_argument():
    q, k, v = make(1, 4, 2, 8, 8, 16, device="cpu")
    cases = [
        (dict(q=q[0]), ValueError, "q must have 4 dimensions"),
        (dict(k=k.half()), TypeError, "share one dtype"),
        (dict(k=torch.randn(1, 3, 8, 16), v=torch.randn(1, 3, 8, 16)), ValueError, "multiple of the key/value heads"),
        (dict(v=torch.randn(1, 2, 9, 16)), ValueError, "k and v must have the same shape"),
        (dict(k=torch.randn(1, 2, 8, 8), v=torch.randn(1, 2, 8, 8)), ValueError, "same head dim"),
        (dict(q=q.long()), TypeError, "q must have dtype"),
        (dict(window=(3,)), TypeError, "window must be None or a pair"),
        (dict(window=(-2, 0)), ValueError, "window entries"),
        (dict(softcap=0.0), ValueError, "softcap must be a positive"),
        (dict(scale="1"), TypeError, "scale must be"),
        (dict(causal=1), TypeError, "causal must be a bool"),
        (dict(backend="cuda"), ValueError, "backend must be"),
    ]
    for over, exc, msg in cases:
        args = dict(q=q, k=k, v=v)
        kw = {n: over.pop(n) for n in list(over) if n not in args}
        args.update(over)
        with pytest.raises(exc, match=msg) as e:
            oss.attention(args["q"], args["k"], args["v"], **kw)
        assert "onlinesoftmax.attention" in str(e.value)
    with pytest.raises(TypeError, match="backend='triton' takes float16"):
        oss.attention(q.double(), k.double(), v.double(), backend="triton")
    big = torch.randn(1, 1, 2, 300)
    with pytest.raises(ValueError, match="head dims up to 256"):
        oss.attention(big, big, big, backend="triton")
    o64 = oss.attention(q.double(), k.double(), v.double(), backend="torch")
    assert o64.dtype == torch.float64


# ---- torch.compile ------------------------------------------------------------------------------------------------
def test_compile_fullgraph(kernel_device):
    """One custom op each way, faked for tracing: no graph break, same values and gradients."""
    q, k, v = make(1, 4, 2, 12, 20, 16, device=kernel_device, grad=True)

    def f(q, k, v):
        o, lse = oss.attention(q, k, v, causal=True, window=(6, -1), return_lse=True, backend="triton")
        return o.sum() + lse.sum()

    compiled = torch.compile(f, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    got = compiled(q, k, v)
    want = f(q, k, v)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v)), torch.autograd.grad(want, (q, k, v)))


def test_compile_torch_backend():
    q, k, v = make(1, 2, 1, 9, 9, 16, device="cpu")
    f = torch.compile(lambda q, k, v: oss.attention(q, k, v, causal=True, backend="torch"), fullgraph=True,
                      backend="eager")
    torch.testing.assert_close(f(q, k, v), oss.attention(q, k, v, causal=True, backend="torch"))


def test_opcheck(kernel_device):
    q, k, v = make(1, 2, 1, 5, 7, 16, device=kernel_device, grad=True)
    torch.library.opcheck(torch.ops.onlinesoftmax.attention_fwd, (q, k, v, True, 0.25, -1, -1, 0.0),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


# ---- varlen -------------------------------------------------------------------------------------------------------
def packed(lens_q, lens_k, H, Hkv, D, dtype=torch.float32, device=DEV, grad=True):
    cu = [torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
          for lens in (lens_q, lens_k)]
    q = torch.randn(sum(lens_q), H, D, dtype=dtype, device=device, requires_grad=grad)
    k = torch.randn(sum(lens_k), Hkv, D, dtype=dtype, device=device, requires_grad=grad)
    v = torch.randn(sum(lens_k), Hkv, D, dtype=dtype, device=device, requires_grad=grad)
    return q, k, v, cu[0], cu[1]


def check_varlen(lens_q, lens_k, H, Hkv, D, backend, dtype=torch.float32, device=DEV, tol=None, **kw):
    q, k, v, cq, ck = packed(lens_q, lens_k, H, Hkv, D, dtype, device)
    o, lse = oss.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), return_lse=True, backend=backend, **kw)
    ro, rl = varlen_ref(q, k, v, cq, ck, **kw)
    assert o.shape == q.shape and lse.shape == (H, q.shape[0]) and o.dtype == q.dtype
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isinf(lse).cpu(), (~fin).cpu()) and (o[(~fin).T.to(o.device)] == 0).all()
    do = torch.randn_like(o)
    got = torch.autograd.grad((o * do).sum(), (q, k, v))
    want = torch.autograd.grad((ro * do.double()).sum(), (q, k, v))
    tol = tol or (5e-6 if dtype == torch.float32 and not q.is_cuda else 2e-2)
    for name, a, b in [("o", o, ro), ("lse", lse[fin], rl[fin])] + list(zip(("dq", "dk", "dv"), got, want)):
        scale = max(b.abs().max().item(), 1.0) if b.numel() else 1.0
        assert err(a, b) <= tol * scale, f"{name}: {err(a, b):.3e}"


VARLEN = [  # (lens_q, lens_k, options): empty sequences, Sq < Sk, Sq > Sk, one long
    ([5, 0, 17, 3, 9], [7, 4, 0, 3, 20], {}),
    ([5, 0, 17, 3, 9], [7, 4, 0, 3, 20], dict(causal=True)),
    ([1, 30, 2], [1, 30, 2], dict(causal=True, window=(3, -1), softcap=2.0)),
    ([0, 0], [0, 4], {}),
]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("lens_q,lens_k,kw", VARLEN)
def test_varlen(lens_q, lens_k, kw, backend, kernel_device):
    check_varlen(lens_q, lens_k, 4, 2, 16, backend, device=kernel_device, **kw)


@pytest.mark.parametrize("lens_q,lens_k,kw", VARLEN)
def test_varlen_atomic_dq(lens_q, lens_k, kw, kernel_device, backward_knobs):
    backward_knobs(ATOMIC_DQ[0])
    check_varlen(lens_q, lens_k, 4, 2, 16, "triton", device=kernel_device, **kw)


def test_varlen_matches_dense(kernel_device):
    """One sequence of a batch is the dense call on that sequence, strides as given (a [B, S, H, D] view)."""
    q, k, v = make(2, 4, 2, 9, 13, 16, device=kernel_device, layout="bshd")
    cq = torch.tensor([0, 9, 18], dtype=torch.int32, device=kernel_device)
    ck = torch.tensor([0, 13, 26], dtype=torch.int32, device=kernel_device)
    qp, kp, vp = (t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (q, k, v))
    o = oss.attention_varlen(qp, kp, vp, cq, ck, 9, 13, causal=True, backend="triton")
    dense = oss.attention(q, k, v, causal=True, backend="triton").transpose(1, 2).reshape(-1, 4, 16)
    torch.testing.assert_close(o, dense, rtol=1e-5, atol=1e-6)


def test_varlen_errors():
    q, k, v, cq, ck = packed([3, 4], [3, 4], 2, 1, 16, device="cpu", grad=False)
    with pytest.raises(TypeError, match="onlinesoftmax.attention_varlen: cu_seqlens_q must be an int32 "):
        oss.attention_varlen(q, k, v, cq.float(), ck, 4, 4)
    with pytest.raises(ValueError, match="onlinesoftmax.attention_varlen: cu_seqlens_q must be a 1-d int32"):
        oss.attention_varlen(q, k, v, cq[None], ck, 4, 4)
    with pytest.raises(ValueError, match="same length B"):
        oss.attention_varlen(q, k, v, cq, ck[:2], 4, 4)
    with pytest.raises(TypeError, match="max_seqlen_k must be an int"):
        oss.attention_varlen(q, k, v, cq, ck, 4, 4.0)
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        oss.attention_varlen(q[None], k, v, cq, ck, 4, 4)
    # CPU tensors' values (a GPU's are not read: no synchronisation), on both backends
    for backend in ("torch", "triton"):
        for bad in ([1, 3, 7], [0, 5, 3], [0, 3, 6]):
            with pytest.raises(ValueError, match=r"^onlinesoftmax.attention_varlen: cu_seqlens_q must start at 0"):
                oss.attention_varlen(q, k, v, torch.tensor(bad, dtype=torch.int32), ck, 5, 4, backend=backend)
        with pytest.raises(ValueError, match="cu_seqlens_k must start at 0"):
            oss.attention_varlen(q, k, v, cq, torch.tensor([0, 3, 8], dtype=torch.int32), 4, 5, backend=backend)
        with pytest.raises(ValueError, match="max_seqlen_k = 3 is less than sequence 1's length 4"):
            oss.attention_varlen(q, k, v, cq, ck, 4, 3, backend=backend)


def test_varlen_compile(kernel_device):
    q, k, v, cq, ck = packed([5, 0, 7], [6, 2, 7], 4, 2, 16, device=kernel_device)

    def f(q, k, v):
        return oss.attention_varlen(q, k, v, cq, ck, 7, 7, causal=True, backend="triton").sum()

    compiled = torch.compile(f, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    got = compiled(q, k, v)
    torch.testing.assert_close(got, f(q, k, v))
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v)), torch.autograd.grad(f(q, k, v), (q, k, v)))


# ---- the device, real sizes ---------------------------------------------------------------------------------------
GPU_CASES = [  # (B, H, Hkv, Sq, Sk, D, dtype, options)
    (2, 8, 8, 1024, 1024, 128, torch.bfloat16, {}),
    (2, 8, 8, 1024, 1024, 128, torch.bfloat16, dict(causal=True)),
    (1, 16, 4, 777, 1500, 64, torch.bfloat16, dict(causal=True)),
    (1, 16, 2, 1500, 777, 64, torch.bfloat16, dict(causal=True)),
    (1, 8, 8, 257, 1023, 256, torch.bfloat16, {}),
    (2, 4, 1, 513, 513, 80, torch.bfloat16, dict(causal=True, window=(255, -1), softcap=30.0)),
    (1, 4, 4, 63, 65, 16, torch.bfloat16, dict(causal=True)),
    (1, 4, 4, 1, 2049, 32, torch.bfloat16, dict(causal=True)),
    (1, 16, 4, 777, 1500, 64, torch.float16, {}),
    (1, 8, 8, 257, 1023, 256, torch.float16, dict(causal=True)),
    (2, 4, 1, 513, 513, 80, torch.float32, dict(causal=True)),
    (1, 16, 2, 1500, 777, 64, torch.float32, dict(window=(100, 50), softcap=20.0)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,dtype,kw", GPU_CASES)
def test_gpu_real_sizes(B, H, Hkv, Sq, Sk, D, dtype, kw):
    q, k, v = make(B, H, Hkv, Sq, Sk, D, dtype, grad=True, layout="bshd" if D == 64 else "bhsd")
    check_forward(q, k, v, "triton", **kw)
    check_backward(q, k, v, "triton", **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,dtype,kw,knobs", [
    GPU_CASES[i] + (kn,) for i in (1, 2, 3, 5) for kn in (
        dict(kernel="triton", dq_atomic=True), dict(kernel="triton", dq_atomic=True, block_m=32, block_n=128,
                                                    num_warps=8))
] + [GPU_CASES[10] + (dict(kernel="triton", dq_atomic=True),)])
def test_gpu_atomic_dq(B, H, Hkv, Sq, Sk, D, dtype, kw, knobs, backward_knobs):
    backward_knobs(knobs)
    q, k, v = make(B, H, Hkv, Sq, Sk, D, dtype, grad=True)
    check_backward(q, k, v, "triton", **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_varlen(dtype):
    lens = [1000, 0, 3000, 17, 4000, 1, 2500, 1575]
    check_varlen(lens, lens, 8, 2, 128, "triton", dtype, causal=True)
    check_varlen(lens, lens[::-1], 8, 8, 64, "triton", dtype, window=(200, 10))


@pytest.mark.parametrize("Sq,causal,window", [(1, True, None), (3, True, None), (4, False, None), (16, True, (300, 0))])
def test_few_queries_over_many_keys_run_the_decode_kernels(kernel_device, Sq, causal, window):
    """Sq <= 16 over Sk >= 2048 keys without a gradient: the decode family's split-KV kernels (explain says so),
    the same result as the torch path; with a gradient the attention kernels."""
    g = torch.Generator().manual_seed(Sq)
    q = torch.randn(1, 4, Sq, 16, generator=g).to(kernel_device)
    k = torch.randn(1, 2, 2048, 16, generator=g).to(kernel_device)
    v = torch.randn(1, 2, 2048, 16, generator=g).to(kernel_device)
    assert explain(q, k, v, causal=causal, window=window, backend="triton").decode
    assert not explain(q, k[:, :, :1000], v[:, :, :1000], causal=causal, backend="triton").decode
    o, lse = oss.attention(q, k, v, causal=causal, window=window, return_lse=True, backend="triton")
    ro, rl = oss.attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), causal=causal, window=window,
                           return_lse=True, backend="torch")
    torch.testing.assert_close(o.double().cpu(), ro, rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(lse.double().cpu(), rl.double(), rtol=2e-5, atol=2e-5)


# ---- the sm90 forward (Gluon: TMA ring, producer warp, wgmma consumers) ------------------------------------------
def test_sm90_forward_plan():
    """Hopper runs the sm90 kernel for 16-bit D = 64 / 128 / 256 inputs TMA can copy: D = 64 / 128 folded, on a
    persistent grid of one program per SM for dense inputs (its ring slots; causal or windowed problems in pairs of
    query blocks; at D = 128 not banded past SM90_WS_PERSISTENT_BANDED_SK keys), per tile for packed sequences (a
    third slot when banded at D = 128); D = 256 per tile, unfolded; packed D = 64, fp32, unaligned strides and
    every other GPU keep the tl.dot kernel."""
    from onlinesoftmax.attention.plan import SM90_WS_PERSISTENT_BANDED_SK, Problem, plan_forward

    base = Problem(4, 32, 8, 4096, 4096, 128, "bfloat16", False, (-1, -1), tma=True)
    plan = plan_forward(base, H200)
    assert (plan.kernel, plan.block_m, plan.block_n, plan.num_warps, plan.num_stages) == ("sm90", 128, 128, 4, 2)
    assert (plan.fold, plan.programs, plan.pairs) == (True, H200.sm_count, False)
    causal = dataclasses.replace(base, causal=True, window=(-1, 0))
    c = plan_forward(causal, H200)
    assert (c.num_stages, c.programs, c.pairs) == (2, H200.sm_count, True)
    assert plan_forward(dataclasses.replace(base, window=(100, 20)), H200).pairs
    packed = plan_forward(dataclasses.replace(causal, varlen=True), H200)
    assert (packed.kernel, packed.num_stages, packed.fold, packed.programs) == ("sm90", 3, True, 0)
    wide = plan_forward(dataclasses.replace(base, D=256), H200)
    assert (wide.kernel, wide.block_n, wide.fold, wide.programs) == ("sm90", 64, False, 0)
    d64 = plan_forward(dataclasses.replace(base, D=64), H200)
    assert (d64.kernel, d64.num_stages, d64.fold, d64.programs) == ("sm90", 4, True, H200.sm_count)
    c64 = plan_forward(dataclasses.replace(causal, D=64, Sq=20000, Sk=20000), H200)
    assert (c64.kernel, c64.num_stages, c64.programs, c64.pairs) == ("sm90", 4, H200.sm_count, True)
    long = plan_forward(dataclasses.replace(causal, Sq=SM90_WS_PERSISTENT_BANDED_SK + 1,
                                            Sk=SM90_WS_PERSISTENT_BANDED_SK + 1), H200)
    assert (long.kernel, long.num_stages, long.fold, long.programs, long.pairs) == ("sm90", 3, True, 0, False)
    for other in (dataclasses.replace(base, D=64, varlen=True), dataclasses.replace(base, D=80),
                  dataclasses.replace(base, dtype="float32"), dataclasses.replace(base, tma=False)):
        assert plan_forward(other, H200).kernel == "triton", other
    for target in (A100, L4, INTERPRETER):
        assert plan_forward(base, target).kernel == "triton"


def test_sm90_forward_knobs():
    """The knob asks for the Gluon kernel at D = 64 (its table row); programs = -1 is the target's SM count (a
    persistent grid, dense inputs only); a problem or GPU the kernel cannot run raises."""
    from onlinesoftmax.attention.plan import SM90_WS_FORWARD, Problem, plan_forward

    base = Problem(16, 32, 32, 1024, 1024, 64, "bfloat16", True, (-1, 0), tma=True)
    sm90 = {"kernel": "sm90"}
    plan = plan_forward(base, H200, Knobs(forward=sm90))
    assert (plan.kernel, plan.block_n, plan.num_stages, plan.fold, plan.programs) == ("sm90", 128, 4, False, 0)
    assert (plan.block_m, plan.block_n, plan.num_warps, plan.num_stages) == SM90_WS_FORWARD[64]
    pers = plan_forward(base, H200, Knobs(forward=dict(sm90, programs=-1, fold=True, num_stages=4)))
    assert (pers.programs, pers.fold, pers.num_stages) == (H200.sm_count, True, 4)
    with pytest.raises(ValueError, match="persistent"):
        plan_forward(dataclasses.replace(base, varlen=True), H200, Knobs(forward=dict(sm90, programs=-1)))
    with pytest.raises(ValueError, match="persistent"):
        plan_forward(dataclasses.replace(base, D=80), H200, Knobs(forward={"programs": -1}))   # tl.dot: no such grid
    for other, target in ((dataclasses.replace(base, D=80), H200), (dataclasses.replace(base, tma=False), H200),
                          (base, A100), (base, INTERPRETER)):
        with pytest.raises(ValueError, match="sm90 forward"):
            plan_forward(other, target, Knobs(forward=sm90))


def test_sm90_persistent_launch_follows_the_problem():
    """The persistent forward's bound launch (what a default call and a knob call with the same plan replay) carries
    the band of its problem: causal and not get launches of their own (HAS_RIGHT, REVERSE; causal in pairs of query
    blocks), a knob plan equal to the default shares the default's launch, and the grid is at most one program per
    work unit (pairs: half as many)."""
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import SM90_WS_FORWARD, Problem, plan_forward

    strides = (1,) * 18
    for D in (64, 128):
        dense = Problem(8, 16, 16, 2048, 2048, D, "bfloat16", False, (-1, -1), tma=True)
        causal = dataclasses.replace(dense, causal=True, window=(-1, 0))
        knobs = Knobs(forward=dict(kernel="sm90", programs=-1, fold=True, num_stages=SM90_WS_FORWARD[D][3]))
        launches = {}
        for p in (dense, causal):
            plan = plan_forward(p, H200, Knobs(forward=dict(dict(knobs.forward), pairs=p.causal)))
            bk = api._caches()[0](p, plan, strides)
            assert bk.fn.__name__ == "attention_fwd_sm90_persistent_kernel"
            assert (bk.meta["HAS_RIGHT"], bk.meta["REVERSE"]) == (p.causal, p.causal), bk.meta
            assert (bk.meta["PAIRS"], bk.meta["O_DIRECT"], bk.grid) == (p.causal, False, (H200.sm_count,))
            # the default plan of these problems is this plan: one launch serves both calls
            assert plan_forward(p, H200) == plan
            assert api._caches()[0](p, plan_forward(p, H200), strides) is bk
            launches[p.causal] = bk
        assert launches[False] is not launches[True]
        small = dataclasses.replace(causal, B=1, H=2, Hkv=2, Sq=640, Sk=640)      # 5 query blocks per head
        for pairs, units in ((False, 10), (True, 6)):
            plan = plan_forward(small, H200, Knobs(forward=dict(dict(knobs.forward), pairs=pairs)))
            assert api._caches()[0](small, plan, strides).grid == (units,)
            assert api.persistent_units(5, 2, pairs) == units


def test_sm90_persistent_options_need_the_persistent_grid():
    from onlinesoftmax.attention.plan import Problem, plan_forward

    p = Problem(4, 32, 32, 4096, 4096, 128, "bfloat16", True, (-1, 0), tma=True)
    for opt in ("pairs", "o_direct"):
        plan = plan_forward(p, H200, Knobs(forward={"kernel": "sm90", "programs": -1, "num_stages": 2, opt: True}))
        assert getattr(plan, opt) and plan.programs == H200.sm_count
        with pytest.raises(ValueError, match="persistent"):
            plan_forward(p, H200, Knobs(forward={"kernel": "sm90", opt: True}))


def test_sm90_persistent_grid_fits_its_shared_memory():
    """The persistent forward's tiles (q, O's staging buffer unless o_direct, the ring) fit in 227 KB or the plan
    raises: D = 256 runs there only with o_direct (q 64 KB + two slots of k, v 128 KB; O's 64 KB more would not
    fit), D = 128 banded takes its per-tile third slot only with o_direct; the defaults fit."""
    from onlinesoftmax.attention.plan import SM90_SHARED, SM90_WS_FORWARD, Problem, plan_forward, sm90_persistent_shared

    wide = Problem(2, 16, 16, 4096, 4096, 256, "bfloat16", True, (-1, 0), tma=True)
    pers = {"kernel": "sm90", "programs": -1}
    with pytest.raises(ValueError, match="shared memory"):
        plan_forward(wide, H200, Knobs(forward=pers))
    for extra in ({}, {"fold": True}, {"pairs": True}, {"fold": True, "pairs": True}):
        plan = plan_forward(wide, H200, Knobs(forward=dict(pers, o_direct=True, **extra)))
        assert (plan.block_n, plan.num_stages, plan.programs, plan.o_direct) == (64, 2, H200.sm_count, True)
        assert sm90_persistent_shared(256, plan) == 196608          # the kernel compiles to 196984 with its barriers
    with pytest.raises(ValueError, match="shared memory"):
        plan_forward(wide, H200, Knobs(forward=dict(pers, o_direct=True, num_stages=3)))
    d128 = dataclasses.replace(wide, D=128)
    with pytest.raises(ValueError, match="shared memory"):                      # three slots beside O's buffer
        plan_forward(d128, H200, Knobs(forward=pers))
    assert plan_forward(d128, H200, Knobs(forward=dict(pers, o_direct=True))).num_stages == 3
    for D in SM90_WS_FORWARD:
        for causal in (False, True):
            p = dataclasses.replace(wide, D=D, causal=causal, window=(-1, 0) if causal else (-1, -1))
            plan = plan_forward(p, H200)
            assert not plan.programs or sm90_persistent_shared(D, plan) < SM90_SHARED, (D, causal, plan)
    # D = 256's default: causal / windowed on the persistent grid (o_direct, fold, pairs), non-causal per tile
    assert plan_forward(wide, H200) == plan_forward(wide, H200, Knobs(forward=dict(pers, o_direct=True, fold=True,
                                                                                    pairs=True)))
    nc = dataclasses.replace(wide, causal=False, window=(-1, -1))
    assert (plan_forward(nc, H200).programs, plan_forward(nc, H200).fold) == (0, False)
    assert plan_forward(dataclasses.replace(wide, varlen=True), H200).programs == 0


def test_sm90_persistent_launch_at_d256():
    """D = 256 on the persistent grid (o_direct; fold, pairs by knob): 64-key boxes of k and v, O from registers,
    causal in pairs of query blocks; one program per SM, at most one per work unit."""
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Problem, plan_forward

    strides = (1,) * 18
    for causal, B, S in ((False, 2, 4096), (True, 2, 4096), (True, 4, 2048)):
        p = Problem(B, 16, 16, S, S, 256, "bfloat16", causal, (-1, 0) if causal else (-1, -1), tma=True)
        plan = plan_forward(p, H200, Knobs(forward=dict(kernel="sm90", programs=-1, o_direct=True, fold=True,
                                                        pairs=causal)))
        bk = api._caches()[0](p, plan, strides)
        assert bk.fn.__name__ == "attention_fwd_sm90_persistent_kernel"
        assert (bk.meta["HEAD_DIM"], bk.meta["BLOCK_N"], bk.meta["STAGES"]) == (256, 64, 2), bk.meta
        assert (bk.meta["O_DIRECT"], bk.meta["FOLD"], bk.meta["PAIRS"], bk.meta["REVERSE"]) == (
            True, True, causal, causal), bk.meta
        assert bk.grid == (H200.sm_count,)
        n_m = S // 128
        assert api.persistent_units(n_m, B * 16, causal) == (n_m // 2 if causal else n_m) * B * 16
    small = Problem(1, 1, 1, 300, 300, 256, "bfloat16", True, (-1, 0), tma=True)      # 3 query blocks
    plan = plan_forward(small, H200, Knobs(forward=dict(kernel="sm90", programs=-1, o_direct=True, pairs=True)))
    assert api._caches()[0](small, plan, strides).grid == (2,)


def test_tma_eligibility_of_tensors():
    """Problem.tma: unit head-dim stride, 16-byte aligned data and strides (CPU tensors never: no TMA there)."""
    from onlinesoftmax.attention import api

    q = torch.randn(2, 4, 8, 64)
    assert not api._problem(q, q, False, (-1, -1), q).tma           # a CPU tensor
    assert api._tma_ok(q, q, q)
    assert not api._tma_ok(q[..., 1:])                              # misaligned data
    assert not api._tma_ok(torch.randn(2, 4, 8, 65)[..., :64])      # a 65-element row stride
    assert not api._tma_ok(q.transpose(-1, -2))                     # head dim not contiguous
    assert api._tma_ok(torch.randn(2, 8, 4, 64).transpose(1, 2))    # [B, S, H, D] viewed as [B, H, S, D]


_SM90_PROBE = r"""
import json, os, re, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
from compiler_report import cubin_report          # pops TRITON_INTERPRET before triton loads
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.attention.kernels.fwd_sm90 import attention_fwd_sm90_kernel as fn
out = []
for D, BN, ST, flags in ((128, 128, 2, {}), (128, 128, 3, dict(HAS_RIGHT=True, REVERSE=True, SOFTCAP=True)),
                         (256, 64, 2, dict(VARLEN=True, HAS_LEFT=True)), (256, 64, 2, dict(FOLD=True)),
                         (256, 64, 2, dict(FOLD=True, HAS_RIGHT=True, REVERSE=True)), (64, 128, 4, dict(FOLD=True)),
                         (64, 256, 2, dict(FOLD=True, OVERLAP=False, HAS_RIGHT=True))):
    const = dict(HEAD_DIM=D, BLOCK_M=64, BLOCK_N=BN, STAGES=ST, HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False,
                 REVERSE=False, VARLEN=False, OVERLAP=True, FOLD=False)
    const.update(flags)
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
    sig.update(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", CU_Q="*i32", CU_K="*i32",
               qk_scale="fp32", cap_in="fp32", cap_out="fp32")
    k = compile(GluonASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    (_, stack, _), sass = cubin_report(k)
    out.append({"D": D, "stack": stack, "shared": k.metadata.shared, "hgmma": len(re.findall("HGMMA", sass)),
                "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"])))})
# the persistent grid (host descriptors over [B, H, S, D]: 4-D boxes) at D = 64 / 128, the scale folded
from triton.experimental.gluon import language as gl
from onlinesoftmax.attention.kernels.fwd_sm90 import attention_fwd_sm90_persistent_kernel as pfn
for D, ST, flags in ((64, 4, dict(HAS_RIGHT=True, REVERSE=True)), (128, 2, dict(HAS_LEFT=True, SOFTCAP=True)),
                     (64, 5, dict(HAS_RIGHT=True, REVERSE=True, PAIRS=True, O_DIRECT=True)),
                     (64, 4, dict(HAS_RIGHT=True, REVERSE=True, PAIRS=True)),        # the causal defaults
                     (128, 2, dict(HAS_RIGHT=True, REVERSE=True, PAIRS=True)),
                     (256, 2, dict(O_DIRECT=True)),                        # D = 256 by knob: O from registers
                     (256, 2, dict(O_DIRECT=True, HAS_RIGHT=True, REVERSE=True, PAIRS=True))):
    BN = 64 if D == 256 else 128
    const = dict(HEAD_DIM=D, BLOCK_M=64, BLOCK_N=BN, STAGES=ST, HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False,
                 REVERSE=False, OVERLAP=True, FOLD=True, PAIRS=False, O_DIRECT=False)
    const.update(flags)
    def desc(rows):
        lay = gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)
        return f"tensordesc<bf16[1, 1, {rows}, {D}],{lay!r}>"
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in pfn.params}
    sig.update(q_desc=desc(64), o_desc=desc(64), k_desc=desc(BN), v_desc=desc(BN), O="*bf16", LSE="*fp32",
               qk_scale="fp32", cap_in="fp32", cap_out="fp32")
    k = compile(GluonASTSource(pfn, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    (_, stack, _), sass = cubin_report(k)
    out.append({"D": D, "persistent": True, "banded": flags.get("HAS_RIGHT", False), "stack": stack,
                "shared": k.metadata.shared,
                "hgmma": len(re.findall("HGMMA", sass)),
                "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"])))})
print(json.dumps(out))
"""


def test_sm90_forward_compiles_without_spills():
    """The sm90 kernel compiles for sm_90a (Triton's ptxas, no GPU): wgmma (HGMMA) in the SASS, no stack frame (but
    at causal D = 128 on the persistent grid), the ring within 227 KB of shared memory, consumers raised to their
    register budget by setmaxnreg."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", _SM90_PROBE, root], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    for r in json.loads(res.stdout.strip().splitlines()[-1]):
        print(r)
        # causal D = 128 / 256 on the persistent grid keeps a few scalars on the stack (D = 128: 8 bytes, 32 with
        # pairs; D = 256 with pairs: 16): the accumulators stay in registers; at D = 128 it measured faster than
        # without pairs, tools/probe_fwd2.py
        banded = r["D"] in (128, 256) and r.get("persistent") and r.get("banded")
        assert r["stack"] <= (32 if banded else 0) and r["hgmma"] > 0 and r["shared"] <= 232448, r
        assert "240" in r["setmaxnreg"], r


@pytest.mark.gpu
def test_gpu_sm90_forward_is_what_runs():
    """On an H100 / H200 a bf16 D = 128 call plans the sm90 forward (persistent, folded) and backward; elsewhere the
    tl.dot kernels (what a non-Hopper GPU gets)."""
    from onlinesoftmax.target import target_of

    q, k, v = make(2, 8, 8, 1024, 1024, 128, torch.bfloat16)
    expected = "sm90" if target_of(q.device).sm90 else "triton"
    plan = explain(q, k, v, causal=True)
    assert plan.forward.kernel == expected and plan.backward.kernel == expected
    if expected == "sm90":
        assert plan.forward.programs == target_of(q.device).sm_count and plan.backward.dq_tma
    assert explain(q.float(), k.float(), v.float()).forward.kernel == "triton"


# ---- the sm90 backward (Gluon: Q / dO ring filled by a producer warp, dK / dV in wgmma consumers, dQ atomics) ----
def test_sm90_backward_plan():
    """On Hopper the sm90 backward (lse / Δ staged, dQ by TMA reduce) is the default for eligible problems (16-bit,
    TMA-able, D = 64 / 128 / 256, no softcap, not deterministic); the tl.dot kernels elsewhere and on request; the
    sm90 knob raises where the kernel cannot run."""
    from onlinesoftmax.attention.plan import Problem, plan_backward, sm90_bwd_eligible

    base = Problem(4, 32, 8, 4096, 4096, 128, "bfloat16", True, (-1, 0), tma=True)
    plan = plan_backward(base, H200)
    assert (plan.kernel, plan.block_m, plan.block_n, plan.num_warps, plan.num_stages, plan.dq_atomic) == \
        ("sm90", 64, 128, 4, 2, True)
    assert plan.stage_rows and plan.dq_tma
    sm90 = Knobs(backward={"kernel": "sm90"})
    assert plan_backward(base, H200, sm90) == plan
    assert plan_backward(base, H200, Knobs(backward={"kernel": "sm90", "num_stages": 3})).num_stages == 3
    plain = plan_backward(base, H200, Knobs(backward={"kernel": "sm90", "stage_rows": False, "dq_tma": False}))
    assert not (plain.stage_rows or plain.dq_tma)
    assert plan_backward(base, H200, Knobs(backward={"kernel": "triton"})).kernel == "triton"
    assert plan_backward(dataclasses.replace(base, deterministic=True), H200).kernel == "triton"
    for ok in (dataclasses.replace(base, D=64), dataclasses.replace(base, dtype="float16", varlen=True),
               dataclasses.replace(base, causal=False, window=(100, 20), Hkv=32)):
        assert sm90_bwd_eligible(ok) and plan_backward(ok, H200, sm90).kernel == "sm90", ok
    # D = 256: 64 keys per program, dQ by TMA reduce through the Q / dO slot; D = 64: 128 query rows per step (64
    # by knob)
    wide = dataclasses.replace(base, D=256)
    plan = plan_backward(wide, H200)
    assert (plan.kernel, plan.block_m, plan.block_n, plan.stage_rows, plan.dq_tma, plan.dq_slot) == \
        ("sm90", 64, 64, True, True, True)
    assert plan_backward(wide, H200, Knobs(backward={"kernel": "triton"})).kernel == "triton"
    d64 = plan_backward(dataclasses.replace(base, D=64), H200)
    assert (d64.kernel, d64.block_m, d64.block_n, d64.dq_tma) == ("sm90", 128, 128, True)
    assert plan_backward(dataclasses.replace(base, D=64), H200, Knobs(backward={"block_m": 64})).block_m == 64
    for other in (dataclasses.replace(base, D=80),
                  dataclasses.replace(base, dtype="float32"), dataclasses.replace(base, tma=False),
                  dataclasses.replace(base, softcap=True), dataclasses.replace(base, deterministic=True)):
        assert not sm90_bwd_eligible(other)
        with pytest.raises(ValueError, match="sm90 backward"):
            plan_backward(other, H200, sm90)
    for target in (A100, L4, INTERPRETER):
        assert plan_backward(base, target).kernel == "triton"
        with pytest.raises(ValueError, match="sm90 backward"):
            plan_backward(base, target, sm90)


def test_sm90_backward_persistent_default():
    """Dense D = 64 / 128 problems of at most 2048 query rows and keys run the sm90 backward on the persistent grid
    (the SM count), causal ones with pairs (in place of lpt_heads); longer, varlen and D = 256 stay one program per
    key block; a knob naming the tiles (block_m, num_stages, dq_tma) or programs = 0 leaves no grid and no pairs."""
    from onlinesoftmax.attention.plan import Problem, plan_backward

    short = Problem(16, 32, 32, 1024, 1024, 128, "bfloat16", True, (-1, 0), tma=True)
    nc = dataclasses.replace(short, causal=False, window=(-1, -1))
    for p, want in ((short, (132, True, 0)), (nc, (132, False, 0)), (dataclasses.replace(short, Hkv=8), (132, True, 0)),
                    (dataclasses.replace(short, D=64, Sq=2048, Sk=2048), (132, True, 0)),
                    (dataclasses.replace(short, window=(100, 0)), (132, True, 0)),
                    (dataclasses.replace(nc, window=(100, 100)), (132, False, 0)),
                    (dataclasses.replace(short, Sq=16, Sk=4096), (0, False, 0)),
                    (dataclasses.replace(short, Sq=4096, Sk=4096), (0, False, 0)),
                    (dataclasses.replace(short, Hkv=8, Sq=4096, Sk=4096), (0, False, 132)),
                    (dataclasses.replace(short, varlen=True), (0, False, 0)),
                    (dataclasses.replace(short, D=256), (0, False, 16))):
        plan = plan_backward(p, H200)
        assert (plan.kernel, plan.programs, plan.pairs, plan.lpt_heads) == ("sm90", *want), p
    for knobs in ({"programs": 0}, {"block_m": 64}, {"num_stages": 3}, {"dq_tma": False}):
        plan = plan_backward(short, H200, Knobs(backward=knobs))
        assert (plan.programs, plan.pairs) == (0, False), knobs
    assert plan_backward(short, H200, Knobs(backward={"num_stages": 2, "programs": -1})).programs == 132
    assert plan_backward(short, A100).programs == 0


def test_sm90_backward_knobs_dq_slot_lpt_rows():
    """dq_slot (dQ's TMA reduce through the drained Q / dO slot), lpt_heads and dq_rows are sm90 knobs, on by
    default where they measured faster (D = 256: dq_slot, causal lpt_heads 16; causal D = 64: dq_rows; causal GQA
    at D = 128: lpt_heads 132); dq_slot needs dq_tma and dQ split in two (D = 128 / 256, dq_rows at D = 64),
    D = 256's dq_tma needs dq_slot, dq_rows is D = 64's; the bound launch carries them."""
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Problem, plan_backward

    base = Problem(4, 32, 32, 4096, 4096, 128, "bfloat16", True, (-1, 0), tma=True)
    nc = dataclasses.replace(base, causal=False, window=(-1, -1))
    for p, want in (((base, (False, 0, False))), (dataclasses.replace(base, Hkv=8), (False, 132, False)),
                    (dataclasses.replace(nc, Hkv=8), (False, 0, False)),
                    (dataclasses.replace(base, D=256), (True, 16, False)),
                    (dataclasses.replace(nc, D=256), (True, 0, False)),
                    (dataclasses.replace(base, D=64), (False, 0, True)),
                    (dataclasses.replace(nc, D=64), (False, 0, False))):
        plan = plan_backward(p, H200)
        assert (plan.dq_slot, plan.lpt_heads, plan.dq_rows) == want, p
    slot = plan_backward(base, H200, Knobs(backward={"dq_slot": True, "num_stages": 3, "lpt_heads": 16}))
    assert (slot.kernel, slot.dq_tma, slot.dq_slot, slot.num_stages, slot.lpt_heads) == ("sm90", True, True, 3, 16)
    wide = dataclasses.replace(base, D=256)
    assert plan_backward(wide, H200, Knobs(backward={"dq_tma": True, "dq_slot": True})).dq_slot
    assert plan_backward(wide, H200, Knobs(backward={"dq_tma": True, "num_stages": 1})).dq_tma
    d64 = dataclasses.replace(base, D=64)
    rows = plan_backward(d64, H200, Knobs(backward={"dq_rows": True, "dq_slot": True}))
    assert (rows.block_m, rows.dq_tma, rows.dq_rows, rows.dq_slot) == (128, True, True, True)
    with pytest.raises(ValueError, match="num_stages = 1"):
        plan_backward(wide, H200, Knobs(backward={"dq_slot": False}))
    d64_nc = dataclasses.replace(d64, causal=False, window=(-1, -1))
    for p, knobs in ((wide, {"dq_slot": True, "dq_tma": False}), (d64_nc, {"dq_slot": True}),
                     (base, {"dq_slot": True, "dq_tma": False})):
        with pytest.raises(ValueError, match="dq_slot"):
            plan_backward(p, H200, Knobs(backward=knobs))
    for p, knobs in ((base, {}), (wide, {}), (d64, {"block_m": 64})):
        with pytest.raises(ValueError, match="dq_rows"):
            plan_backward(p, H200, Knobs(backward={"dq_rows": True, **knobs}))
    for knobs in ({"dq_slot": True}, {"lpt_heads": 16}, {"dq_rows": True}):
        with pytest.raises(ValueError, match="lpt_heads"):
            plan_backward(base, H200, Knobs(backward={"kernel": "triton", **knobs}))
    # a default resting on a field a knob changed falls away; named, it raises
    assert not plan_backward(d64, H200, Knobs(backward={"block_m": 64})).dq_rows
    assert not plan_backward(wide, H200, Knobs(backward={"dq_tma": False})).dq_slot
    strides = (1,) * 27
    bk = api._caches()[1](base, slot, strides, False)[1]
    assert bk.fn.__name__ == "attention_bwd_sm90_kernel" and bk.grid == (32, 4 * 32)
    assert (bk.meta["DQ_SLOT"], bk.meta["LPT_HEADS"], bk.meta["STAGES"]) == (True, 16, 3), bk.meta
    assert api._caches()[1](base, plan_backward(base, H200), strides, False)[1].meta["LPT_HEADS"] == 0
    assert api._caches()[1](d64, rows, strides, False)[1].meta["DQ_ROWS"]


def test_sm90_backward_producer_regs_knob():
    """producer_regs (the producer warpgroup's setmaxnreg; the default-partition consumer gets 504 − 240 − it): 32
    by default, a knob of the sm90 backward only, carried by the bound launch."""
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Problem, plan_backward

    base = Problem(4, 32, 32, 4096, 4096, 128, "bfloat16", True, (-1, 0), tma=True)
    assert plan_backward(base, H200).producer_regs == 32
    plan = plan_backward(base, H200, Knobs(backward={"producer_regs": 24}))
    assert plan.producer_regs == 24
    assert api._caches()[1](base, plan, (1,) * 27, False)[1].meta["PRODUCER_REGS"] == 24
    for knobs in ({"producer_regs": 20}, {"producer_regs": 24, "kernel": "triton"}):
        with pytest.raises(ValueError, match="producer_regs"):
            plan_backward(base, H200, Knobs(backward=knobs))


def _lpt_order_host(n_kb, bh, heads, longest_last):
    """bwd_sm90._lpt_order on the host: (key block, head) of each program in launch order."""
    out = []
    for flat in range(n_kb * bh):
        group = flat // (n_kb * heads)
        g_heads = min(bh - group * heads, heads)
        r = flat - group * n_kb * heads
        j = r // g_heads
        out.append((n_kb - 1 - j if longest_last else j, group * heads + r % g_heads))
    return out


@pytest.mark.parametrize("n_kb,bh,heads", [(8, 512, 16), (5, 7, 3), (1, 1, 16), (3, 20, 132)])
def test_sm90_backward_lpt_order_covers_the_grid(n_kb, bh, heads):
    """lpt_heads' program order (kernels/bwd_sm90._lpt_order, mirrored here) visits every (key block, head) once,
    the key blocks of a head group in order of their work (block 0 first under a causal band)."""
    for last in (False, True):
        order = _lpt_order_host(n_kb, bh, heads, last)
        assert sorted(order) == [(j, h) for j in range(n_kb) for h in range(bh)]
        first = order[: min(heads, bh)]
        assert {j for j, _ in first} == {n_kb - 1 if last else 0}


_SM90_BWD_PROBE = r"""
import json, os, re, subprocess, tempfile
import triton
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.attention.kernels.bwd_sm90 import attention_bwd_sm90_kernel as fn
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = []
fast = dict(STAGE_ROWS=True, DQ_TMA=True)
for D, flags in ((128, {}), (128, dict(HAS_RIGHT=True)), (128, dict(VARLEN=True, HAS_LEFT=True, HAS_RIGHT=True)),
                 (64, {}), (64, dict(HAS_RIGHT=True)), (128, fast), (128, dict(fast, HAS_RIGHT=True)),
                 (128, dict(fast, VARLEN=True, HAS_LEFT=True, HAS_RIGHT=True)), (64, dict(fast, HAS_RIGHT=True)),
                 (64, dict(fast, BLOCK_M=128, HAS_RIGHT=True)), (64, dict(fast, STAGES=4)),
                 (256, dict(STAGE_ROWS=True, BLOCK_N=32)),
                 (256, dict(STAGE_ROWS=True, BLOCK_N=32, VARLEN=True, HAS_LEFT=True, HAS_RIGHT=True)),
                 (128, dict(fast, DQ_SLOT=True, STAGES=3, LPT_HEADS=16, HAS_RIGHT=True)),
                 (128, dict(fast, DQ_SLOT=True, STAGES=3, VARLEN=True, HAS_LEFT=True, HAS_RIGHT=True)),
                 (256, dict(fast, DQ_SLOT=True, BLOCK_N=32, LPT_HEADS=16, HAS_RIGHT=True)),
                 (256, dict(fast, DQ_SLOT=True, BLOCK_N=32, VARLEN=True, HAS_LEFT=True, HAS_RIGHT=True)),
                 (64, dict(fast, BLOCK_M=128, DQ_ROWS=True, HAS_RIGHT=True)),
                 (64, dict(fast, BLOCK_M=128, DQ_ROWS=True, DQ_SLOT=True, VARLEN=True, HAS_LEFT=True,
                           HAS_RIGHT=True)),
                 (128, dict(fast, HAS_RIGHT=True, PRODUCER_REGS=24))):
    const = dict(HEAD_DIM=D, BLOCK_M=64, BLOCK_N=64, STAGES=2, HAS_LEFT=False, HAS_RIGHT=False, VARLEN=False,
                 DQ_SLOT=False, LPT_HEADS=0, DQ_ROWS=False, PRODUCER_REGS=32)
    const.update(flags)
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
    sig.update(Q="*bf16", K="*bf16", V="*bf16", DO="*bf16", DK="*bf16", DV="*bf16", LSE="*fp32", DELTA="*fp32",
               DQACC="*fp32", CU_Q="*i32", CU_K="*i32", scale="fp32", qk_scale="fp32")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in sig
             if sig[n].startswith("*") or (n.startswith("s") and n != "scale")}
    k = compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    out.append({"D": D, "flags": flags, "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
                "shared": k.metadata.shared, "hgmma": len(re.findall("HGMMA", sass)),
                "tnspA": len(re.findall(r"HGMMA\S*\s.*tnspA", sass)),
                "atom": sorted(set(re.findall(r"\b(?:red|atom)\.global[\w.]+", k.asm["ptx"]))),
                "reduce": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor[\w.:]+add", k.asm["ptx"])),
                "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"])))})
print(json.dumps(out))
"""


def test_sm90_backward_compiles():
    """The sm90 backward compiles for sm_90a (Triton's ptxas, no GPU): wgmma (HGMMA, dQ's with A read transposed
    from shared memory) in the SASS, dQ by fp32 atomics two-wide or (DQ_TMA) by TMA reduce-add and no atomics,
    shared memory within 227 KB, consumers at 240 registers. D = 64 has no stack frame; D = 128 (dK, dV, Sᵀ, dPᵀ
    and dQ: 224 fp32 accumulator registers of the 240), D = 64 with 128 query rows and D = 256 spill a few scalars,
    at most 160 bytes (the accumulators stay in registers). DQ_SLOT (D = 128 with three slots, D = 256),
    LPT_HEADS, DQ_ROWS (D = 64; up to 256 bytes packed) and PRODUCER_REGS 24 compile the same way (DQ_SLOT: TMA
    reduce, no atomics)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SM90_BWD_PROBE], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    for r in json.loads(res.stdout.strip().splitlines()[-1]):
        assert r["hgmma"] > 0 and r["tnspA"] > 0 and r["shared"] <= 232448, r
        tma_dq = r["flags"].get("DQ_TMA", False)
        assert r["atom"] == ([] if tma_dq else ["atom.global.gpu.relaxed.add.v2.f32"]), r
        assert (r["reduce"] > 0) == tma_dq and "240" in r["setmaxnreg"], r
        assert r["stack"] <= (0 if r["D"] == 64 and r["flags"].get("BLOCK_M", 64) == 64 else
                              256 if r["flags"].get("DQ_ROWS") else 160), r


SM90_BWD_CASES = [  # (B, H, Hkv, Sq, Sk, D, dtype, options): causal, GQA 4, window, D 64 / 128, ragged sizes
    (2, 8, 8, 1024, 1024, 128, torch.bfloat16, {}),
    (2, 8, 8, 1024, 1024, 128, torch.bfloat16, dict(causal=True)),
    (1, 16, 4, 777, 1500, 128, torch.bfloat16, dict(causal=True)),
    (1, 16, 4, 1500, 777, 64, torch.bfloat16, dict(causal=True)),
    (2, 8, 2, 1000, 1000, 128, torch.float16, dict(window=(200, 30))),
    (1, 8, 8, 2048, 2048, 64, torch.bfloat16, dict(causal=True, window=(511, -1))),
    (1, 4, 4, 63, 65, 64, torch.bfloat16, {}),
]


# the first form (lse / Δ loaded, dQ atomics); the default (lse / Δ staged, dQ by TMA reduce)
SM90_BWD_KNOBS = [{"stage_rows": False, "dq_tma": False, "dq_slot": False, "dq_rows": False, "lpt_heads": 0}, {}]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", SM90_BWD_KNOBS)
@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,D,dtype,kw", SM90_BWD_CASES)
def test_gpu_sm90_backward(B, H, Hkv, Sq, Sk, D, dtype, kw, knobs, backward_knobs):
    """Against the fp64 reference (check_backward), and close to the tl.dot backward on the same inputs."""
    from onlinesoftmax.target import target_of

    if not target_of(DEV).sm90:
        pytest.skip("the sm90 backward runs on Hopper only")
    q, k, v = make(B, H, Hkv, Sq, Sk, D, dtype, grad=True, layout="bshd" if D == 64 else "bhsd")
    backward_knobs({"kernel": "triton"})
    o, lse = oss.attention(q, k, v, return_lse=True, **kw)
    do, dl = torch.randn_like(o), torch.randn_like(lse).where(torch.isfinite(lse), 0)
    ref = torch.autograd.grad((o, lse), (q, k, v), (do, dl))
    backward_knobs({"kernel": "sm90", **knobs})
    check_backward(q, k, v, "triton", with_lse=True, **kw)
    o, lse = oss.attention(q, k, v, return_lse=True, **kw)
    got = torch.autograd.grad((o, lse), (q, k, v), (do, dl))
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        rel = ((g.float() - r.float()).norm() / r.float().norm()).item()
        assert rel < 1e-2, f"{name}: sm90 vs tl.dot backward, relative difference {rel:.2e}"


SM90_BWD_VARIANTS = [  # (D, knobs, options): 64 query rows at D = 64 and 3 slots at 128 rows (dQ by atomics: the
    # TMA-reduce tiles leave no room), by knob; the D = 256 kernel (a default)
    (64, {"block_m": 64}, dict(causal=True)),
    (64, {"block_m": 128, "num_stages": 3, "dq_tma": False}, dict(window=(300, 20))),
    (256, {}, {}), (256, {}, dict(causal=True)), (256, {}, dict(window=(200, 30))),
    # dQ's TMA reduce through the drained Q / dO slot (a third slot at D = 128), programs longest first
    (128, {"dq_slot": True, "num_stages": 3, "lpt_heads": 3}, dict(causal=True)),
    (128, {"dq_slot": True, "num_stages": 3}, dict(window=(300, 20))),
    (256, {"dq_tma": True, "dq_slot": True}, dict(causal=True)),
    (256, {"dq_tma": True, "dq_slot": True, "lpt_heads": 3}, dict(window=(200, 30))),
    (256, {"dq_slot": False, "num_stages": 1}, dict(causal=True)),
    (256, {"dq_tma": False, "dq_slot": False, "lpt_heads": 0}, dict(causal=True)),   # dQ by atomics
    (64, {"lpt_heads": 3}, dict(window=(300, -1))),
    (64, {"dq_rows": True}, dict(causal=True)),
    (64, {"dq_rows": True, "dq_slot": True}, dict(window=(300, 20))),
]


@pytest.mark.gpu
@pytest.mark.parametrize("D,knobs,kw", SM90_BWD_VARIANTS)
def test_gpu_sm90_backward_tiles(D, knobs, kw, backward_knobs):
    """The tiles above against the fp64 reference: GQA 4, ragged Sq > Sk and Sq < Sk, packed sequences."""
    from onlinesoftmax.target import target_of

    if not target_of(DEV).sm90:
        pytest.skip("the sm90 backward runs on Hopper only")
    backward_knobs({"kernel": "sm90", **knobs})
    for Sq, Sk in ((777, 1500), (1500, 777)):
        q, k, v = make(1, 16, 4, Sq, Sk, D, torch.bfloat16, grad=True)
        check_backward(q, k, v, "triton", with_lse=True, **kw)
    lens = [1000, 0, 3000, 17, 1, 1575]
    check_varlen(lens, lens, 8, 2, D, "triton", torch.bfloat16, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", SM90_BWD_KNOBS)
@pytest.mark.parametrize("D,Hkv", [(128, 2), (64, 8)])
def test_gpu_sm90_backward_varlen(D, Hkv, knobs, backward_knobs):
    """Packed sequences with empty ones (no queries, no keys), causal and windowed."""
    from onlinesoftmax.target import target_of

    if not target_of(DEV).sm90:
        pytest.skip("the sm90 backward runs on Hopper only")
    backward_knobs({"kernel": "sm90", **knobs})
    lens = [1000, 0, 3000, 17, 4000, 1, 2500, 1575]
    check_varlen(lens, lens, 8, Hkv, D, "triton", torch.bfloat16, causal=True)
    check_varlen(lens, lens[::-1], 8, Hkv, D, "triton", torch.bfloat16, window=(200, 10))


# ---- the sm90 backward on a persistent grid (programs: one program per SM walking the (key block, head) units) ----
def test_sm90_backward_persistent_plan():
    """``programs = -1`` asks for one program per SM; the sm90 kernel on dense inputs only; pairs needs the
    persistent grid and replaces a default lpt_heads (both named raise); tiles past 227 KB raise naming the knob;
    every default fits; at 4096 keys the defaults stay per program."""
    from onlinesoftmax.attention.plan import SM90_SHARED, Problem, plan_backward, sm90_bwd_shared

    base = Problem(4, 32, 32, 4096, 4096, 128, "bfloat16", True, (-1, 0), tma=True)
    pers = Knobs(backward={"programs": -1})
    plan = plan_backward(base, H200, pers)
    assert (plan.kernel, plan.programs, plan.pairs) == ("sm90", H200.sm_count, False)
    assert dataclasses.replace(plan, programs=0) == plan_backward(base, H200)
    for D in (64, 128, 256):
        for causal in (False, True):
            p = dataclasses.replace(base, D=D, causal=causal, window=(-1, 0) if causal else (-1, -1))
            assert plan_backward(p, H200).programs == 0
            plan = plan_backward(p, H200, pers)
            assert sm90_bwd_shared(D, plan) <= SM90_SHARED - 1024, (D, causal)
    gqa = dataclasses.replace(base, Hkv=8)
    assert plan_backward(gqa, H200, pers).lpt_heads == 132
    assert plan_backward(gqa, H200, Knobs(backward={"programs": -1, "pairs": True})).lpt_heads == 0
    with pytest.raises(ValueError, match="pairs"):
        plan_backward(gqa, H200, Knobs(backward={"programs": -1, "pairs": True, "lpt_heads": 16}))
    with pytest.raises(ValueError, match="persistent"):
        plan_backward(base, H200, Knobs(backward={"pairs": True}))
    with pytest.raises(ValueError, match="persistent"):
        plan_backward(dataclasses.replace(base, varlen=True), H200, pers)
    with pytest.raises(ValueError, match="persistent"):
        plan_backward(base, H200, Knobs(backward={"kernel": "triton", "programs": -1}))
    # D = 128: three slots beside dq_tma's tiles (246 KB) do not fit; with dq_slot they do
    with pytest.raises(ValueError, match="shared memory.*num_stages"):
        plan_backward(base, H200, Knobs(backward={"programs": -1, "num_stages": 3, "dq_tma": True}))
    assert plan_backward(base, H200, Knobs(backward={"programs": -1, "num_stages": 3, "dq_slot": True,
                                                     "dq_tma": True})).programs == H200.sm_count
    # the tile bytes as the kernels compile them (barriers aside): D = 64 226 KB, 128 209 KB, 256 225 KB
    for D, want in ((64, 231424), (128, 214016), (256, 230400)):
        assert sm90_bwd_shared(D, plan_backward(dataclasses.replace(base, D=D, causal=False, window=(-1, -1)),
                                                H200)) == want


def test_sm90_backward_persistent_launch():
    """The persistent backward's bound launch: host descriptors (q, k, v, dO, dQ's rows), grid min(programs, units)
    (pairs: half as many units, the middle block of an odd count alone), the plan's knobs as constexprs."""
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Problem, plan_backward

    strides = (1,) * 27
    p = Problem(16, 32, 32, 1024, 1024, 128, "bfloat16", True, (-1, 0), tma=True)
    bk = api._caches()[1](p, plan_backward(p, H200, Knobs(backward={"programs": -1, "pairs": False})), strides,
                          False)[1]
    assert bk.fn.__name__ == "attention_bwd_sm90_persistent_kernel" and bk.grid == (H200.sm_count,)
    assert (bk.meta["PAIRS"], bk.meta["STAGE_ROWS"], bk.meta["DQ_TMA"], "VARLEN" in bk.meta) == (
        False, True, True, False), bk.meta
    assert [b[0] for b in bk.boxes] == [[1, 1, 64, 128], [1, 1, 128, 128], [1, 1, 128, 128], [1, 1, 64, 128],
                                        [1, 1, 64, 64]]
    d64 = dataclasses.replace(p, D=64)                 # dq_rows: a warpgroup's dQ is 64 of the 128 rows
    bk = api._caches()[1](d64, plan_backward(d64, H200, Knobs(backward={"programs": -1})), strides, False)[1]
    assert bk.meta["DQ_ROWS"] and bk.boxes[4][0] == [1, 1, 64, 64] and bk.boxes[0][0] == [1, 1, 128, 64]
    small = dataclasses.replace(p, B=1, H=2, Hkv=2, Sq=600, Sk=600)      # 5 key blocks of 128 per head
    for pairs, units in ((False, 10), (True, 6)):
        plan = plan_backward(small, H200, Knobs(backward={"programs": -1, "pairs": pairs}))
        assert api._caches()[1](small, plan, strides, False)[1].grid == (units,)
        assert api.persistent_units(5, 2, pairs) == units


def _persistent_walk(programs, n_kb, bh, lpt_heads, pairs, longest_last=False):
    """bwd_sm90's persistent unit walk on the host (``_unit`` with fwd_sm90's ``_units`` / ``_halves`` /
    ``_pair_block``): the (key block, head) list of each program, in its order."""
    units = (-(-n_kb // 2) if pairs else n_kb) * bh
    lpt = dict(((j, b), (jj, hh)) for (j, b), (jj, hh) in zip(
        [(f % n_kb, f // n_kb) for f in range(n_kb * bh)], _lpt_order_host(n_kb, bh, max(lpt_heads, 1),
                                                                           longest_last)))
    walks = []
    for pid in range(programs):
        walk = []
        for u in range(pid, units, programs):
            if pairs:
                n_pairs = -(-n_kb // 2)
                i = u % n_pairs
                halves = 1 if n_kb % 2 and i == n_pairs - 1 else 2
                walk += [(n_kb - 1 - i if half == 0 else i, u // n_pairs) for half in range(halves)]
            elif lpt_heads:
                walk.append(lpt[(u % n_kb, u // n_kb)])        # _lpt_unit(u): launch index u of the grid
            else:
                walk.append((u % n_kb, u // n_kb))
        walks.append(walk)
    return walks


@pytest.mark.parametrize("n_kb,bh,programs", [(8, 512, 132), (5, 7, 3), (1, 1, 132), (9, 20, 132), (32, 32, 132)])
def test_sm90_backward_persistent_walk_covers_the_units(n_kb, bh, programs):
    """The persistent walk visits every (key block, head) once (plain, lpt_heads' order, pairs); with pairs of an even
    block count under a causal band (key block j has n_kb − j query tiles) the programs' work differs by at most
    one unit's."""
    want = sorted((j, h) for j in range(n_kb) for h in range(bh))
    for lpt, pairs in ((0, False), (16, False), (132, False), (0, True)):
        walks = _persistent_walk(min(programs, (-(-n_kb // 2) if pairs else n_kb) * bh), n_kb, bh, lpt, pairs)
        assert sorted(x for w in walks for x in w) == want, (lpt, pairs)
        if pairs and n_kb % 2 == 0:         # (an odd count's middle blocks, half a unit each, may alias)
            work = [sum(n_kb - j for j, _ in w) for w in walks]
            assert max(work) - min(work) <= n_kb + 1, work


_SM90_BWD_PERSISTENT_PROBE = r"""
import json, os, re, subprocess, tempfile
import triton
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.attention.kernels.bwd_sm90 import attention_bwd_sm90_persistent_kernel as fn
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
fast = dict(STAGE_ROWS=True, DQ_TMA=True)
out = []
for D, flags in ((128, fast), (128, dict(fast, HAS_RIGHT=True, LPT_HEADS=132)), (128, dict(fast, HAS_RIGHT=True,
                 PAIRS=True)), (128, dict(fast, HAS_LEFT=True, HAS_RIGHT=True)), (128, dict(HAS_RIGHT=True)),
                 (64, dict(fast, BLOCK_M=128)), (64, dict(fast, BLOCK_M=128, DQ_ROWS=True, HAS_RIGHT=True)),
                 (256, dict(fast, BLOCK_N=32, DQ_SLOT=True, HAS_RIGHT=True, LPT_HEADS=16)),
                 (256, dict(fast, BLOCK_N=32, DQ_SLOT=True)), (128, dict(fast, HAS_RIGHT=True, PAIRS=True,
                                                                            PRODUCER_REGS=24))):
    const = dict(HEAD_DIM=D, BLOCK_M=64, BLOCK_N=64, STAGES=2, HAS_LEFT=False, HAS_RIGHT=False, STAGE_ROWS=False,
                 DQ_TMA=False, DQ_SLOT=False, LPT_HEADS=0, DQ_ROWS=False, PAIRS=False, PRODUCER_REGS=32)
    const.update(flags)
    bm, keys = const["BLOCK_M"], 2 * const["BLOCK_N"]
    def desc(dt, name, block):
        return f"tensordesc<{name}{block},{gl.NVMMASharedLayout.get_default_for(block, dt)!r}>"
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
    sig.update(q_desc=desc(gl.bfloat16, "bf16", [1, 1, bm, D]), do_desc=desc(gl.bfloat16, "bf16", [1, 1, bm, D]),
               k_desc=desc(gl.bfloat16, "bf16", [1, 1, keys, D]), v_desc=desc(gl.bfloat16, "bf16", [1, 1, keys, D]),
               dq_desc=desc(gl.float32, "fp32", [1, 1, bm // 2 if const["DQ_ROWS"] else bm, D // 2 if D >= 128 else D]),
               DK="*bf16", DV="*bf16", LSE="*fp32", DELTA="*fp32", DQACC="*fp32", scale="fp32", qk_scale="fp32")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in sig
             if sig[n].startswith("*") or (n.startswith("s") and n != "scale")}
    k = compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    out.append({"D": D, "flags": flags, "stack": int(re.search(r"STACK:(\d+)", res).group(1)),
                "shared": k.metadata.shared, "hgmma": k.asm["ptx"].count("wgmma.mma_async"),
                "reduce": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor[\w.:]+add", k.asm["ptx"])),
                "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"])))})
print(json.dumps(out))
"""


def test_sm90_backward_persistent_compiles():
    """The persistent backward compiles for sm_90a at D = 64 / 128 / 256 with the defaults' knobs (dq_rows,
    lpt_heads, dq_slot), pairs, windows and dQ by atomics: wgmma, dQ's TMA reduce where DQ_TMA, consumers at 240
    registers, shared memory within 227 KB, at most 192 bytes of spilled scalars (the accumulators stay in
    registers)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SM90_BWD_PERSISTENT_PROBE], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    for r in json.loads(res.stdout.strip().splitlines()[-1]):
        assert r["hgmma"] > 0 and r["shared"] <= 232448 and "240" in r["setmaxnreg"], r
        assert (r["reduce"] > 0) == r["flags"].get("DQ_TMA", False) and r["stack"] <= 192, r


SM90_BWD_PERSISTENT = [  # (D, knobs, options) on the persistent grid: defaults' knobs, pairs, a few programs
    (128, {"programs": -1}, dict(causal=True)), (128, {"programs": -1}, dict(window=(200, 30))),
    (128, {"programs": 5, "pairs": True}, dict(causal=True)), (128, {"programs": 7, "lpt_heads": 3}, {}),
    (128, {"programs": 7, "dq_tma": False}, dict(causal=True)),
    (64, {"programs": -1}, dict(causal=True)), (64, {"programs": 7, "pairs": True}, dict(window=(300, -1))),
    (256, {"programs": -1}, dict(causal=True)), (256, {"programs": 7, "lpt_heads": 0}, dict(window=(200, 30))),
]


@pytest.mark.gpu
@pytest.mark.parametrize("D,knobs,kw", SM90_BWD_PERSISTENT)
def test_gpu_sm90_backward_persistent(D, knobs, kw, backward_knobs):
    """The persistent grid against the fp64 reference: GQA 4, odd lengths, Sq > Sk and Sq < Sk, MHA."""
    from onlinesoftmax.target import target_of

    if not target_of(DEV).sm90:
        pytest.skip("the sm90 backward runs on Hopper only")
    backward_knobs({"kernel": "sm90", **knobs})
    for Hkv, Sq, Sk in ((4, 777, 1500), (4, 1500, 777), (16, 1000, 1000)):
        q, k, v = make(1, 16, Hkv, Sq, Sk, D, torch.bfloat16, grad=True)
        check_backward(q, k, v, "triton", with_lse=True, **kw)


def test_backward_op_takes_a_strided_lse(kernel_device):
    """``attention_bwd`` given lse as a strided view (a zigzag ring passes each half's rows as a slice): the same
    gradients as with a dense lse (Δ and dQ's rows are laid out as lse: they were dense buffers indexed by the
    view's strides, out of bounds)."""
    B, H, Sq, Sk, D = 1, 2, 12, 24, 16
    q, k, v = make(B, H, H, Sq, Sk, D, device=kernel_device)
    o, lse = oss.attention(q, k, v, causal=True, return_lse=True, backend="torch")
    wide = torch.full((B, H, Sq, 3), float("nan"), device=kernel_device)
    wide[..., 1] = lse
    strided = wide[..., 1]                                  # strides (H·Sq·3, Sq·3, 3)
    assert not strided.is_contiguous() and torch.equal(strided, lse)
    do = torch.randn_like(o)
    tail = (True, D ** -0.5, -1, 0, 0.0)
    want = torch.ops.onlinesoftmax.attention_bwd(do, None, q, k, v, o, lse.contiguous(), *tail)
    got = torch.ops.onlinesoftmax.attention_bwd(do, None, q, k, v, o, strided, *tail)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_nan_scores_give_nan_lse(backend, kernel_device):
    """A row whose scores are NaN: lse NaN on both backends (the torch path wrote −inf, "attends no key", which a
    merge then drops)."""
    q, k, v = make(1, 2, 2, 3, 5, 16, device=kernel_device)
    q[0, 0, 1, 0] = float("nan")
    o, lse = oss.attention(q, k, v, return_lse=True, backend=backend)
    assert lse[0, 0, 1].isnan() and o[0, 0, 1].isnan().all()
    assert torch.isfinite(lse[0, 0, [0, 2]]).all() and torch.isfinite(lse[0, 1]).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("Sk", [7, 2048])                  # 2048 keys, 3 queries: the decode kernels' dispatch
def test_o_keeps_q_strides(backend, Sk, kernel_device):
    """o has q's strides (a [B, S, H, D] tensor seen transposed stays viewable back) on every path."""
    if backend == "triton" and Sk == 2048 and kernel_device.type == "cpu":
        pytest.skip("the interpreter at 2048 keys: covered on the GPU")
    q = torch.randn(1, 3, 2, 16, device=kernel_device).transpose(1, 2)
    k = torch.randn(1, 2, Sk, 16, device=kernel_device)
    o = oss.attention(q, k, k, backend=backend)
    assert o.stride() == q.stride()
    o.transpose(1, 2).view(1, 3, 32)
    torch.testing.assert_close(o, oss.attention(q.contiguous(), k, k, backend="torch"), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_torch_func_grad(backend, kernel_device):
    """torch.func.grad takes the torch path (the custom op's autograd has no setup_context for functorch)."""
    q, k, v = make(1, 2, 1, 5, 7, 16, device=kernel_device)
    want = torch.func.grad(lambda a: oss.attention(a, k, v, causal=True, backend="torch").sum())(q)
    got = torch.func.grad(lambda a: oss.attention(a, k, v, causal=True, backend=backend).sum())(q)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_varlen_torch_func_grad(backend, kernel_device):
    """attention_varlen under torch.func.grad raised torch's "an autograd.Function with functorch transforms ... must
    override the setup_context staticmethod" on the Triton path; it takes the torch path there, as attention."""
    q, k, v, cq, ck = packed([3, 0, 5], [4, 2, 5], 2, 1, 16, device=kernel_device, grad=False)
    f = lambda a, backend: oss.attention_varlen(a, k, v, cq, ck, 5, 5, causal=True, backend=backend)  # noqa: E731
    want = torch.func.grad(lambda a: (f(a, "torch") ** 2).sum())(q)
    got = torch.func.grad(lambda a: (f(a, backend) ** 2).sum())(q)
    torch.testing.assert_close(got, want)


def test_triton_double_backward_raises_at_the_backward(kernel_device):
    """A backward with create_graph=True (a gradient penalty) went through the Triton backward and handed back
    gradients without a graph: torch's "no autograd formula was registered for onlinesoftmax.attention_bwd" came
    only at the second backward. It raises at the first, naming the function; the torch path differentiates twice."""
    q, k, v = make(1, 2, 1, 5, 7, 16, device=kernel_device, grad=True)
    qp, kp, vp, cq, ck = packed([2, 3], [4, 3], 2, 1, 16, device=kernel_device)
    for fn, args, name in [(oss.attention, (q, k, v), "attention"),
                           (oss.attention_varlen, (qp, kp, vp, cq, ck, 3, 4), "attention_varlen")]:
        o = fn(*args, causal=True, backend="triton")
        with pytest.raises(RuntimeError, match=rf"onlinesoftmax\.{name}: double backward"):
            torch.autograd.grad(o.square().sum(), args[0], create_graph=True)
        o = fn(*args, causal=True, backend="triton")
        torch.autograd.grad(o.square().sum(), args[0])          # a plain backward runs
        o = fn(*args, causal=True, backend="torch")
        assert torch.autograd.grad(o.square().sum(), args[0], create_graph=True)[0].requires_grad


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("view", ["expand_heads", "expand_batch", "overlap_rows", "step_d", "d_major", "offset"])
def test_triton_unusual_layouts(view, dtype):
    """The GPU kernels (TMA where the strides allow it) on views: an MQA emulated by k.expand over the heads (stride
    0), a batch broadcast, rows that overlap (as_strided), a head-dim stride of 2, D-major rows, an offset of one
    element (unaligned); backward included. (CPU: tests/test_layouts_fuzz.py::test_attention_views.)"""
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 40, 72, 64

    def view_of(h, s):
        shape = (B, h, s, D)
        if view == "expand_heads":
            return torch.randn(B, 1, s, D, device=DEV, dtype=dtype).expand(shape)
        if view == "expand_batch":
            return torch.randn(1, h, s, D, device=DEV, dtype=dtype).expand(shape)
        if view == "overlap_rows":
            return torch.randn(B * h * s * D, device=DEV, dtype=dtype).as_strided(shape, (h * s * D, s * D, D // 2, 1))
        if view == "step_d":
            return torch.randn(B, h, s, 2 * D, device=DEV, dtype=dtype)[..., ::2]
        if view == "d_major":
            return torch.randn(B, h, D, s, device=DEV, dtype=dtype).transpose(2, 3)
        return torch.randn(B * h * s * D + 1, device=DEV, dtype=dtype)[1:].view(shape)

    q, k, v = (view_of(h, s).requires_grad_() for h, s in ((H, Sq), (Hkv, Sk), (Hkv, Sk)))
    check_forward(q, k, v, "triton", causal=True)
    check_backward(q, k, v, "triton", causal=True)
