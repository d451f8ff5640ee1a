"""Unusual tensor layouts through every public op, on both backends, against the fp64 references.

Inputs and incoming gradients as views: stride-0 (expanded) dims, transposes and permutations (last stride != 1),
steps, storage offsets, overlapping rows (``unfold``, ``as_strided``), size-1 dims of odd strides; index tensors
(cu_seqlens, cache_seqlens, block_table, targets) as strided views. Each test also checks that its inputs are
unchanged. Gradients flow to a leaf *base* that the view is taken of, so autograd sums a stride-0 dim's
gradient as torch does; the reference takes the same view of the base in fp64.

fp32 on the CPU (the interpreter): the ops compute in fp32, so 1e-5 (a few hundred fp32 ulps of values of order
one) bounds their error; the attention kernels on CUDA multiply in TF32 (2^-11 relative per product): 5e-3 there.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import onlinesoftmax as oss
from onlinesoftmax.reference import losses as ref_losses
from onlinesoftmax.reference.attention import attention_scores
from onlinesoftmax.reference.attention import attention_varlen as varlen_ref
from onlinesoftmax.reference.decode import attention_with_kvcache as kvcache_ref
from onlinesoftmax.reference.decode import merge_attention_states as merge_ref

BACKENDS = ["torch", "triton"]
TOL = dict(rtol=1e-5, atol=1e-5)


def _tol(device: torch.device) -> dict:
    return TOL if device.type == "cpu" else dict(rtol=5e-3, atol=5e-3)


# ---- views of [M, N] (M = 5, N = 7): (base shape, view of the base) ---------------------------------------------
M, N = 5, 7
VIEWS_2D = {
    "contiguous": ((M, N), lambda b: b),
    "transposed": ((N, M), lambda b: b.t()),
    "step_cols": ((M, 2 * N), lambda b: b[:, ::2]),
    "step_rows": ((2 * M, N), lambda b: b[1::2]),
    "expand_cols": ((M, 1), lambda b: b.expand(M, N)),          # x[:, :1].expand(M, N): last stride 0
    "expand_rows": ((1, N), lambda b: b.expand(M, N)),
    "offset": ((M * N + 3,), lambda b: b[3:].view(M, N)),
    "unfold": ((M + N - 1,), lambda b: b.unfold(0, N, 1)),       # overlapping windows
    "overlap": ((2 * M + N,), lambda b: b.as_strided((M, N), (2, 1), 1)),
    "flip_t": ((N, M), lambda b: b.flip(0).t()),
}
VIEWS_3D = {
    "permuted": ((3, 4, 5), lambda b: b.permute(2, 0, 1)),
    "channels_last": ((2, 3, 4, 5), lambda b: b.permute(0, 2, 3, 1)[:, 1]),
    "size1_odd": ((90,), lambda b: b.as_strided((2, 1, 5), (45, 77, 2))),
    "expand_mid": ((2, 1, 5), lambda b: b.expand(2, 4, 5)),
}
VIEWS = {**VIEWS_2D, **VIEWS_3D}


def _leaves(shape) -> tuple:
    """An fp32 leaf of ``shape``, its fp64 twin for the reference and a copy to check it is left unchanged."""
    base = torch.randn(shape, requires_grad=True)
    return base, base.detach().double().requires_grad_(), base.detach().clone()


def _same_gradient(y, y64, g, base, base64, before) -> None:
    """The gradient of ``y`` (given ``g``) to ``base`` as the reference's to ``base64``; ``base`` unchanged."""
    (dx,) = torch.autograd.grad(y, base, g)
    (dx64,) = torch.autograd.grad(y64, base64, g.double())
    torch.testing.assert_close(dx.double(), dx64, **TOL)
    assert torch.equal(base.detach(), before)


def _incoming(shape, kind: str, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """An incoming gradient of ``shape`` laid out as ``kind``."""
    shape = tuple(shape)
    if kind == "sum":                                   # y.sum().backward(): every stride 0
        return torch.ones((), dtype=dtype, device=device).expand(shape)
    if kind == "bcast_last":                            # (y * w[..., :1]).sum()
        return torch.randn(shape[:-1] + (1,), dtype=dtype, device=device).expand(shape)
    if kind == "bcast_first":                           # (y * w).sum() with w broadcast over the rows
        return torch.randn((1,) + shape[1:], dtype=dtype, device=device).expand(shape)
    if kind == "step":
        return torch.randn(shape[:-1] + (2 * shape[-1],), dtype=dtype, device=device)[..., ::2]
    if kind == "reversed":
        p = list(range(len(shape)))[::-1]
        return torch.randn([shape[i] for i in p], dtype=dtype, device=device).permute(*p)
    return torch.randn(shape, dtype=dtype, device=device)


GRADS = ["sum", "bcast_last", "bcast_first", "step", "reversed", "dense"]


# ---- softmax, log_softmax, logsumexp ----------------------------------------------------------------------------
SOFTMAX_OPS = {
    "softmax": (oss.softmax, torch.softmax),
    "log_softmax": (oss.log_softmax, torch.log_softmax),
    "logsumexp": (oss.logsumexp, torch.logsumexp),
}


@pytest.mark.interpreter
@given(op=st.sampled_from(sorted(SOFTMAX_OPS)), view=st.sampled_from(sorted(VIEWS)), dim=st.integers(-3, 2),
       grad=st.sampled_from(GRADS), backend=st.sampled_from(BACKENDS))
def test_softmax_family_views(op, view, dim, grad, backend):
    fn, ref = SOFTMAX_OPS[op]
    shape, make = VIEWS[view]
    base, base64, before = _leaves(shape)
    x = make(base)
    dim = dim % x.dim()
    y = fn(x, dim, backend=backend)
    y64 = ref(make(base64), dim)
    torch.testing.assert_close(y.double(), y64.detach(), **TOL)
    g = _incoming(y.shape, grad)
    _same_gradient(y, y64, g, base, base64, before)


# ---- softmax_topk and sample ---------------------------------------------------------------------------------------
@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", ["transposed", "step_cols", "expand_rows", "unfold", "overlap", "channels_last"])
def test_softmax_topk_views(view, backend):
    shape, make = VIEWS[view]
    base, base64, before = _leaves(shape)
    x = make(base)
    k = 3
    out = oss.softmax_topk(x, k, backend=backend)
    p64 = torch.softmax(make(base64), -1)
    v64 = p64.gather(-1, out.indices)       # the op's indices (ties: expanded rows repeat values)
    torch.testing.assert_close(out.values.double(), p64.detach().topk(k, -1).values, **TOL)
    torch.testing.assert_close(out.lse.double(), torch.logsumexp(make(base64), -1).detach(), **TOL)
    for outs, outs64 in (((out.values,), (v64,)), ((out.lse,), (torch.logsumexp(make(base64), -1),)),
                         ((out.values, out.lse), (v64, torch.logsumexp(make(base64), -1)))):
        gs = [_incoming(o.shape, "sum") for o in outs]       # (values.sum() and lse.sum(): all strides 0)
        (dx,) = torch.autograd.grad(outs, base, gs, retain_graph=True)
        (dx64,) = torch.autograd.grad(outs64, base64, [g.double() for g in gs], retain_graph=True)
        torch.testing.assert_close(dx.double(), dx64, **TOL)
    assert torch.equal(base.detach(), before)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", ["transposed", "expand_rows", "unfold", "channels_last"])
def test_sample_views(view, backend):
    """Logits and per-row parameters as views (a column of a 2-d tensor, an expanded scalar)."""
    from onlinesoftmax.reference import sample_distribution, sample_draw

    shape, make = VIEWS[view]
    base = torch.randn(shape) * 3
    x = make(base)
    B, V = x.numel() // x.shape[-1], x.shape[-1]

    def col(vals):
        return torch.stack([vals, torch.zeros_like(vals)], 1)[:, 0]

    t = col(torch.rand(B) + 0.5)
    k = torch.tensor([V]).expand(B)
    p = col(torch.rand(B) * 0.5 + 0.5)
    u = col(torch.rand(B) * 0.99)
    ids, logp = oss.sample(x, temperature=t, top_k=k, top_p=p, uniform=u, backend=backend)
    rows = x.reshape(B, V).double().numpy()
    for r in range(B):
        probs = sample_distribution(rows[r], float(t[r]), int(k[r]), float(p[r]))
        want, margin = sample_draw(probs, float(u[r]))
        got = int(ids.reshape(-1)[r])
        assert got == want or margin < 1e-5
        assert abs(float(logp.reshape(-1)[r]) - float(torch.tensor(probs[got]).log())) < 1e-4


# ---- attention ------------------------------------------------------------------------------------------------
def _attn_view(kind: str, shape: tuple, device):
    """(leaf base, view fn) of a [B, h, S, D] tensor laid out as ``kind``."""
    B, h, S, D = shape
    bases = {
        "contiguous": ((B, h, S, D), lambda t: t),
        "bshd": ((B, S, h, D), lambda t: t.transpose(1, 2)),
        "expand_heads": ((B, 1, S, D), lambda t: t.expand(B, h, S, D)),     # MQA emulated: head stride 0
        "expand_batch": ((1, h, S, D), lambda t: t.expand(B, h, S, D)),
        "step_d": ((B, h, S, 2 * D), lambda t: t[..., ::2]),
        "d_major": ((B, h, D, S), lambda t: t.transpose(2, 3)),
        "overlap_rows": ((B * h * S * D,), lambda t: t.as_strided(shape, (h * S * D, S * D, D // 2, 1))),
        "offset": ((B * h * S * D + 8,), lambda t: t[8:].view(shape)),
    }
    bshape, fn = bases[kind]
    return torch.randn(bshape, device=device, requires_grad=True), fn


ATTN_VIEWS = ["bshd", "expand_heads", "expand_batch", "step_d", "d_major", "overlap_rows", "offset"]


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", ATTN_VIEWS)
def test_attention_views(view, backend):
    """q, k, v all laid out as ``view`` (k, v of Hkv = 2 heads for H = 4), gradients of o.sum() and a strided
    dlse. (On CUDA: tests/attention/test_attention.py::test_triton_unusual_layouts, 16-bit, the TMA kernels.)"""
    kernel_device = torch.device("cpu")
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 5, 7, 16
    made = [_attn_view(view, s, kernel_device) for s in ((B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))]
    bases = [b for b, _ in made]
    bases64 = [b.detach().double().requires_grad_() for b in bases]
    before = [b.detach().clone() for b in bases]
    q, k, v = (fn(b) for b, fn in made)
    o, lse = oss.attention(q, k, v, causal=True, return_lse=True, backend=backend)
    o64, lse64 = attention_scores(*(fn(b) for (_, fn), b in zip(made, bases64)), causal=True)
    tol = _tol(kernel_device) if backend == "triton" else TOL
    torch.testing.assert_close(o.double(), o64.detach(), **tol)
    torch.testing.assert_close(lse.double(), lse64.detach(), **tol)
    do = _incoming(o.shape, "sum", device=kernel_device)
    dlse = _incoming(lse.shape, "reversed", device=kernel_device)
    grads = torch.autograd.grad((o, lse), bases, (do, dlse))
    grads64 = torch.autograd.grad((o64, lse64), bases64, (do.double(), dlse.double()))
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, **tol)
    for b, b0 in zip(bases, before):
        assert torch.equal(b.detach(), b0)


def _column(values: list, device, junk: int = -9) -> torch.Tensor:
    """An int32 [n] tensor as column 0 of an [n, 2] tensor (stride 2), the other column ``junk``."""
    c = torch.tensor(values, dtype=torch.int32, device=device)
    return torch.stack([c, torch.full_like(c, junk)], 1)[:, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_varlen_strided_cu_seqlens(backend, kernel_device):
    """cu_seqlens as a column of a 2-d tensor (stride 2): the kernels read cu_seqlens[b] at b, so a strided view
    read the other column's values (NaN outputs, or a crash in the interpreter) before it was made dense."""
    H, Hkv, D = 4, 2, 16
    cq, ck = [0, 3, 3, 7], [0, 5, 7, 11]
    q = torch.randn(7, H, D, device=kernel_device, requires_grad=True)
    kv = [torch.randn(11, Hkv, D, device=kernel_device, requires_grad=True) for _ in range(2)]
    cu_q, cu_k = _column(cq, kernel_device), _column(ck, kernel_device)
    assert cu_q.stride() == (2,)
    o, lse = oss.attention_varlen(q, *kv, cu_q, cu_k, 4, 5, causal=True, return_lse=True, backend=backend)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, *kv))
    dense = [torch.tensor(c, dtype=torch.int32) for c in (cq, ck)]
    o64, lse64 = varlen_ref(q64, k64, v64, *dense, causal=True)
    tol = _tol(kernel_device) if backend == "triton" else TOL
    torch.testing.assert_close(o.double(), o64.detach(), **tol)
    torch.testing.assert_close(lse.double(), lse64.detach(), **tol)
    grads = torch.autograd.grad(o.sum(), (q, *kv))
    grads64 = torch.autograd.grad(o64.sum(), (q64, k64, v64))
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, **tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", ["bshd", "expand_heads", "step_d", "d_major"])
def test_attention_with_kvcache_views(view, backend, kernel_device):
    """Dense and paged caches as views; cache_seqlens a column of a 2-d tensor, block_table a transposed view."""
    B, H, Hkv, Sq, D, page = 3, 4, 2, 2, 16, 4
    q = _attn_view("bshd", (B, H, Sq, D), kernel_device)[1](torch.randn(B, Sq, H, D, device=kernel_device))
    lens = _column([12, 5, 9], kernel_device, junk=1000)
    table = torch.randperm(10)[:9].reshape(3, 3).to(torch.int32).to(kernel_device).t().contiguous().t()
    for paged in (False, True):
        n, s = (10, page) if paged else (B, 12)
        (kb, kf), (vb, vf) = (_attn_view(view, (n, Hkv, s, D), kernel_device) for _ in range(2))
        k, v = kf(kb.detach()), vf(vb.detach())
        bt = table if paged else None
        o, lse = oss.attention_with_kvcache(q, k, v, lens, block_table=bt, return_lse=True, backend=backend)
        o64, lse64 = kvcache_ref(*(t.double().cpu() for t in (q, k, v)), lens.cpu(), None if bt is None else bt.cpu())
        tol = _tol(kernel_device) if backend == "triton" else TOL
        torch.testing.assert_close(o.double().cpu(), o64, **tol)
        torch.testing.assert_close(lse.double().cpu(), lse64.double(), **tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", ["bshd", "expand_batch", "step_d", "d_major"])
def test_merge_attention_states_views(view, backend, kernel_device):
    made_o = [_attn_view(view, (2, 4, 3, 16), kernel_device) for _ in range(2)]
    lse_bases = [torch.randn(2, 3, 4, device=kernel_device, requires_grad=True) for _ in range(2)]
    bases = [made_o[0][0], lse_bases[0], made_o[1][0], lse_bases[1]]
    fns = [made_o[0][1], lambda t: t.transpose(1, 2), made_o[1][1], lambda t: t.transpose(1, 2)]
    bases64 = [b.detach().double().requires_grad_() for b in bases]
    o, lse = oss.merge_attention_states(*(f(b) for f, b in zip(fns, bases)), backend=backend)
    o64, lse64 = merge_ref(*(f(b) for f, b in zip(fns, bases64)))
    torch.testing.assert_close(o.double(), o64.detach(), **TOL)
    torch.testing.assert_close(lse.double(), lse64.detach(), **TOL)
    dlse = _incoming(lse.shape, "bcast_first", device=kernel_device)
    grads = torch.autograd.grad((o, lse), bases, (_incoming(o.shape, "sum", device=kernel_device), dlse))
    grads64 = torch.autograd.grad((o64, lse64), bases64, (torch.ones_like(o64), dlse.double()))
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, **TOL)


# ---- losses -----------------------------------------------------------------------------------------------------
@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("view", ["transposed", "step_cols", "expand_rows", "expand_cols", "unfold", "channels_last"])
def test_cross_entropy_views(view, reduction, backend):
    """Logits as views, targets a column of a 2-d int64 tensor, "none"'s loss given a strided gradient."""
    shape, make = VIEWS[view]
    base, base64, before = _leaves(shape)
    x = make(base)
    V = x.shape[-1]
    t = torch.stack([torch.randint(0, V, x.shape[:-1]), torch.full(x.shape[:-1], -5)], -1)[..., 0]
    t.reshape(-1)[0] = -100
    loss = oss.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1, backend=backend)
    loss64 = ref_losses.cross_entropy(make(base64), t, reduction=reduction, label_smoothing=0.1)
    torch.testing.assert_close(loss.double(), loss64.detach(), **TOL)
    g = _incoming(loss.shape, "reversed") if reduction == "none" else torch.tensor(3.0)
    _same_gradient(loss, loss64, g, base, base64, before)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_linear_cross_entropy_views(reduction, backend):
    """hidden a permuted 3-d view, weight the transpose of a [Hd, V] tensor (tied embeddings), bias stride 2."""
    Hd, V = 8, 11
    bases = [torch.randn(2, 3, Hd, requires_grad=True), torch.randn(Hd, V, requires_grad=True),
             torch.randn(2 * V, requires_grad=True)]
    fns = [lambda b: b.transpose(0, 1), lambda b: b.t(), lambda b: b[::2]]
    bases64 = [b.detach().double().requires_grad_() for b in bases]
    h, w, bias = (f(b) for f, b in zip(fns, bases))
    t = torch.stack([torch.randint(0, V, (3, 2)), torch.full((3, 2), -7)], -1)[..., 0]
    loss = oss.linear_cross_entropy(h, w, t, bias=bias, reduction=reduction, backend=backend)
    h64, w64, b64 = (f(b) for f, b in zip(fns, bases64))
    loss64 = ref_losses.linear_cross_entropy(h64, w64, t, bias=b64, reduction=reduction)
    torch.testing.assert_close(loss.double(), loss64.detach(), **TOL)
    g = _incoming(loss.shape, "sum") if reduction == "none" else torch.tensor(0.5)
    grads = torch.autograd.grad(loss, bases, g)
    grads64 = torch.autograd.grad(loss64, bases64, g.double())
    for a, b in zip(grads, grads64):
        torch.testing.assert_close(a.double(), b, **TOL)


# ---- index tensors of the wrong dtype or device: the function, the argument and what was given ------------------
def test_index_argument_errors():
    q, k = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 6, 8)
    lens = torch.tensor([6, 3], dtype=torch.int32)
    pages, table = torch.randn(4, 2, 4, 8), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    kv = "attention_with_kvcache"
    cases = [
        (lambda: oss.attention_with_kvcache(q, k, k, lens.float()), TypeError,
         rf"^{kv}: cache_seqlens must be an int32 tensor of shape \[B\] \(or another integer dtype\), got float32 of "
         r"shape \(2,\)"),
        (lambda: oss.attention_with_kvcache(q, k, k, lens[:, None]), TypeError,
         rf"^{kv}: cache_seqlens .*, got int32 of shape \(2, 1\)"),
        (lambda: oss.attention_with_kvcache(q, k, k, [6, 3]), TypeError, rf"^{kv}: cache_seqlens .*, got list"),
        (lambda: oss.attention_with_kvcache(q, k, k, lens.to("meta")), ValueError,
         rf"^{kv}: cache_seqlens is on meta, q on cpu"),
        (lambda: oss.attention_with_kvcache(q, pages, pages, lens, block_table=table.float()), TypeError,
         rf"^{kv}: block_table must be an int32 tensor \[B, max_pages\] \(or another integer dtype\), got float32 "
         r"of shape \(2, 2\)"),
        (lambda: oss.attention_with_kvcache(q, pages, pages, lens, block_table=table.to("meta")), ValueError,
         rf"^{kv}: block_table is on meta, q on cpu"),
        (lambda: oss.cross_entropy(torch.randn(4, 9), torch.zeros(4, dtype=torch.int32)), TypeError,
         "^cross_entropy: target must be int64 class indices, got int32"),
        (lambda: oss.cross_entropy(torch.randn(4, 9), torch.zeros(4, dtype=torch.int64, device="meta")), ValueError,
         "^cross_entropy: target is on meta, logits on cpu"),
        (lambda: oss.linear_cross_entropy(torch.randn(4, 8), torch.randn(9, 8), torch.zeros(4, dtype=torch.int32)),
         TypeError, "^linear_cross_entropy: target must be int64 class indices, got int32"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()
