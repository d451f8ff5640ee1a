"""attention and attention_varlen past 2^31 elements and on misaligned tensors (``pytest -m gpu
tests/attention/test_attention_large.py``).

* Offsets: q / k / v / o / dO / dQ / dK / dV with ``B·H·S·D > 2^31`` elements (4.3 GB each in bf16): a kernel that
  forms ``b·stride_b + h·stride_h`` (or a packed row times its stride) in 32 bits reads and writes another head
  there. Only the last batch entry (the last packed sequence) is checked, against fp64 on that slice (cheap). The
  backward's tensors do not all fit the 40 GB budget at once: one test has big queries (q, o, dO, dQ, the fp32 dQ
  accumulator) over few keys, one big keys (k, v, dK, dV) under few queries. Then q / k / v / dO as views of one
  4.3 GB buffer whose batch 1 starts past element 2^31 (a huge batch stride, little compute), with TMA-able strides
  and with an odd batch stride (the tl.dot kernels).
* Alignment: q, k, v, dO each starting 2 bytes past a 16-byte boundary (TMA descriptors need 16-byte aligned
  bases: such calls take the tl.dot kernels), packed varlen inputs too: the aligned call's result within rounding,
  both against fp64, the forward of an aligned call after them bit for bit as the first.

The private helpers take the sizes: small calls run them on the CPU (the interpreter) to keep them honest.
"""

import pytest
import torch
from big_inputs import INT32_LIMIT, free, misaligned, past_2_31

import onlinesoftmax as oss
from onlinesoftmax.attention import explain
from onlinesoftmax.reference.attention import attention_scores

BF16 = torch.bfloat16


def _err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def _close(name, a, b, tol=2e-2):
    """bf16 attention outputs and gradients: within tol of the largest reference value (check_varlen's rule)."""
    scale = max(b.abs().max().item(), 1.0) if b.numel() else 1.0
    assert _err(a, b) <= tol * scale, f"{name}: {_err(a, b):.3e} > {tol * scale:.3e}"


def _check_lse(lse, rl):
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isinf(lse), ~fin)
    if fin.any():
        assert _err(lse[fin], rl[fin]) <= 1e-5 * max(1.0, rl[fin].abs().max().item())


def _attn_last(q, k, v, causal, grad, backend=None):
    """oss.attention on q, k, v (leaves); the last batch entry's o, lse and (grad) dq, dk, dv against fp64 on that
    entry."""
    o, lse = oss.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    last = [t.detach()[-1:].double().requires_grad_() for t in (q, k, v)]
    ro, rl = attention_scores(*last, causal=causal)
    _close("o", o.detach()[-1:], ro.detach())
    _check_lse(lse.detach()[-1:], rl.detach())
    if grad:
        do = torch.randn_like(o)
        got = torch.autograd.grad(o, (q, k, v), do)
        want = torch.autograd.grad(ro, last, do[-1:].double())
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert not torch.isnan(g[-1:]).any()
            _close(name, g[-1:], w)
    return o.detach(), lse.detach()


def _qkv(B, H, Sq, Sk, D, dev, grad):
    return [torch.randn(B, H, s, D, device=dev, dtype=BF16).requires_grad_(grad) for s in (Sq, Sk, Sk)]


def test_attention_helper_small(kernel_device):
    """The helper on 3 × 2 heads × 20 × 16 (the interpreter on the CPU), causal, with the backward."""
    _attn_last(*_qkv(3, 2, 20, 24, 16, kernel_device, True), causal=True, grad=True, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_forward_more_than_2_31_elements(D, causal):
    """q, k, v, o [B, 32, 1024, D] bf16 with B·32·1024·D > 2^31 (17.4 GB in all): the last batch entry."""
    B, _ = past_2_31(32 * 1024 * D, extra=1)
    _attn_last(*_qkv(B, 32, 1024, 1024, D, "cuda", False), causal=causal, grad=False)
    free()


@pytest.mark.gpu
@pytest.mark.parametrize("big", ["queries", "keys"])
def test_gpu_attention_backward_more_than_2_31_elements(big):
    """Forward and backward with q, o, dO, dQ past 2^31 over 64 keys per head (26 GB with the fp32 dQ
    accumulator), or k, v, dK, dV past 2^31 under 64 queries (causal, bottom-right): the last batch entry."""
    B, _ = past_2_31(32 * 1024 * 128, extra=1)
    Sq, Sk = (1024, 64) if big == "queries" else (64, 1024)
    _attn_last(*_qkv(B, 32, Sq, Sk, 128, "cuda", True), causal=big == "keys", grad=True)
    free()


def _strided_views(H, S, D, batch_stride, dev, base_elems=None):
    """q, k, v, dO [2, H, S, D] as views of one buffer with batch stride ``batch_stride`` elements (batch 1 at
    element >= batch_stride), each at its own offset: big offsets, a small problem."""
    per = H * S * D
    n = batch_stride + 4 * (per + 64) + 64
    buf = torch.randn(n if base_elems is None else base_elems, device=dev, dtype=BF16)
    views = [buf.as_strided((2, H, S, D), (batch_stride, S * D, D, 1), i * (per + 64)) for i in range(4)]
    return buf, [t.detach().requires_grad_() for t in views[:3]], views[3]


def _strided_check(H, S, D, batch_stride, dev, causal, backend=None):
    buf, (q, k, v), do = _strided_views(H, S, D, batch_stride, dev)
    o, lse = oss.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    got = torch.autograd.grad(o, (q, k, v), do)
    ref = [t.detach()[1:].double().requires_grad_() for t in (q, k, v)]
    ro, rl = attention_scores(*ref, causal=causal)
    want = torch.autograd.grad(ro, ref, do[1:].double())
    _close("o", o[1:], ro.detach())
    _check_lse(lse[1:], rl.detach())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        _close(name, g[1:], w)
    return explain(q, k, v, causal=causal, backend=backend)


def test_attention_strided_views_helper_small(kernel_device):
    _strided_check(2, 20, 16, 5000, kernel_device, True, backend="triton")
    _strided_check(2, 20, 16, 5001, kernel_device, False, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("odd", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_batch_past_2_31_by_its_stride(odd, causal):
    """q, k, v, dO [2, 8, 300, 128] views of one 4.3 GB buffer, batch stride 2^31 (TMA-able: 16-byte multiples) or
    2^31 + 1 (batch 1 misaligned: the tl.dot kernels): batch 1 against fp64, forward and backward."""
    plan = _strided_check(8, 300, 128, INT32_LIMIT + int(odd), torch.device("cuda"), causal)
    assert plan.problem.tma != odd, plan.problem
    free()


# ---- attention_varlen ----------------------------------------------------------------------------------------


def _packed(lens, H, D, dev, grad):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return torch.randn(int(cu[-1]), H, D, device=dev, dtype=BF16).requires_grad_(grad), cu.to(dev)


def _varlen_last(lens_q, lens_k, H, D, dev, causal, grad, backend=None):
    """attention_varlen over packed sequences; the last one's o, lse and (grad) its rows of dq, dk, dv against
    fp64 on that sequence."""
    q, cq = _packed(lens_q, H, D, dev, grad)
    k, ck = _packed(lens_k, H, D, dev, grad)
    v = torch.randn_like(k).requires_grad_(grad)
    o, lse = oss.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal, return_lse=True,
                                  backend=backend)
    rq, rk = slice(int(cq[-2]), None), slice(int(ck[-2]), None)
    last = [t.detach()[r].transpose(0, 1)[None].double().requires_grad_() for t, r in ((q, rq), (k, rk), (v, rk))]
    ro, rl = attention_scores(*last, causal=causal)
    _close("o", o.detach()[rq], ro.detach()[0].transpose(0, 1))
    _check_lse(lse.detach()[:, rq], rl.detach()[0])
    if grad:
        do = torch.randn_like(o)
        got = torch.autograd.grad(o, (q, k, v), do)
        want = torch.autograd.grad(ro, last, do[rq].transpose(0, 1)[None].double())
        for name, g, w, r in zip(("dq", "dk", "dv"), got, want, (rq, rk, rk)):
            _close(name, g[r], w[0].transpose(0, 1))


def test_varlen_helper_small(kernel_device):
    _varlen_last([5, 0, 17, 9], [7, 4, 3, 20], 2, 16, kernel_device, True, True, backend="triton")


def _big_lens(H, D):
    """Sequence lengths of 1024 (and a last one of 1000) whose packed rows pass 2^31 / (H·D): the last sequence
    starts past element 2^31."""
    n = past_2_31(1024 * H * D, extra=1)[0]
    return [1024] * n + [1000]


@pytest.mark.gpu
@pytest.mark.parametrize("big", ["both", "queries", "keys"])
def test_gpu_attention_varlen_more_than_2_31_elements(big):
    """Packed [total, 32, 128] bf16 with total·32·128 > 2^31: forward with q, k, v, o all past (causal, 17.4 GB);
    forward + backward with the queries' tensors past over 64 keys per sequence, or the keys' under 64 queries."""
    lens = _big_lens(32, 128)
    few = [64] * len(lens)
    lens_q, lens_k = {"both": (lens, lens), "queries": (lens, few), "keys": (few, lens)}[big]
    _varlen_last(lens_q, lens_k, 32, 128, torch.device("cuda"), big != "queries", big != "both")
    free()


# ---- misaligned tensors --------------------------------------------------------------------------------------


def _misaligned_attention(B, H, Hkv, S, D, dev, causal, backend=None):
    """q, k, v, dO aligned, then each misaligned alone, then aligned again: o, lse, dq, dk, dv against fp64 (each
    run), the misaligned runs' o within one bf16 rounding of the aligned run's, the last forward bit for bit."""
    q, k, v = (torch.randn(B, h, S, D, device=dev, dtype=BF16) for h in (H, Hkv, Hkv))
    do = torch.randn(B, H, S, D, device=dev, dtype=BF16)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    ro, rl = attention_scores(*ref, causal=causal)
    want = torch.autograd.grad(ro, ref, do.double())

    def run(q_, k_, v_, do_):
        leaves = [t.detach().requires_grad_() for t in (q_, k_, v_)]
        o, lse = oss.attention(*leaves, causal=causal, return_lse=True, backend=backend)
        got = torch.autograd.grad(o, leaves, do_)
        _close("o", o.detach(), ro.detach())
        _check_lse(lse.detach(), rl.detach())
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            _close(name, g, w)
        return o.detach(), lse.detach(), explain(q_, k_, v_, causal=causal, backend=backend)

    first = run(q, k, v, do)
    for i in range(4):
        args = [q, k, v, do]
        args[i] = misaligned(args[i])
        o, lse, plan = run(*args)
        assert _err(o, first[0]) <= 2.0 ** -7 * first[0].abs().max().item(), ("qkv dO"[i], plan.forward)
        assert _err(lse, first[1]) <= 1e-5 * max(1.0, first[1].abs().max().item())
        if i < 3:
            assert not plan.problem.tma
    again = run(q, k, v, do)
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    return first[2]


def test_misaligned_attention_helper_small(kernel_device):
    _misaligned_attention(1, 2, 1, 20, 16, kernel_device, True, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_misaligned(D, causal):
    """[2, 8, 300, D] bf16 (GQA 4 kv heads 2): q, k, v, dO 2 bytes past a 16-byte boundary, one at a time."""
    plan = _misaligned_attention(2, 8, 2, 300, D, torch.device("cuda"), causal)
    assert plan.problem.tma


def _misaligned_varlen(lens, H, D, dev, backend=None):
    """Packed q, k, v each misaligned in turn: o and the gradients of every sequence as the aligned call's."""
    q, cq = _packed(lens, H, D, dev, False)
    k, v = torch.randn_like(q), torch.randn_like(q)
    do = torch.randn_like(q)
    outs = []
    for i in range(4):
        args = [q, k, v]
        if i < 3:
            args[i] = misaligned(args[i])
        leaves = [t.detach().requires_grad_() for t in args]
        o = oss.attention_varlen(*leaves, cq, cq, max(lens), max(lens), causal=True, backend=backend)
        outs.append((o.detach(),) + torch.autograd.grad(o, leaves, do))
    for out in outs[:3]:
        for name, a, b in zip(("o", "dq", "dk", "dv"), out, outs[3]):
            _close(name, a, b, tol=1e-2)


def test_misaligned_varlen_helper_small(kernel_device):
    _misaligned_varlen([5, 0, 17, 9], 2, 16, kernel_device, backend="triton")


@pytest.mark.gpu
def test_gpu_attention_varlen_misaligned():
    _misaligned_varlen([1000, 0, 3000, 17, 300, 1], 8, 128, torch.device("cuda"))
