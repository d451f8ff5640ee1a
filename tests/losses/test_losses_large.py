"""The losses past 2^31 elements and on misaligned tensors (``pytest -m gpu tests/losses/test_losses_large.py``).

* Offsets: ``cross_entropy`` on bf16 logits ``[N, V]`` with ``N·V > 2^31`` (8.6 GB with the gradient), on every
  kernel path the plan can choose at such shapes (smem, coop, row in registers and in two passes, split), and
  ``linear_cross_entropy`` whose logical logits pass 2^31. A kernel that forms ``row · stride`` in 32 bits reads
  and writes another row there: only the rows ending past 2^31 are checked, against fp64 on those rows (cheap).
* Alignment: logits, targets, class weights, hidden states and weights starting off a 16-byte boundary (what
  ``buf[1:]`` gives). The smem path (cp.async) needs 16-byte aligned rows: such inputs take another path and
  must give the aligned input's loss and gradient, never a fault or a wrong answer; an aligned call after them
  must replay the aligned kernels bit for bit.

The private helpers take the sizes: one small call each runs on the CPU (the interpreter) to keep them honest.
"""

import pytest
import torch
from big_inputs import free, misaligned, past_2_31, rel

import onlinesoftmax as oss
from onlinesoftmax.losses import CEKnobs, LCEKnobs, explain
from onlinesoftmax.reference import losses as ref

HAS_CUDA = torch.cuda.is_available()


def _sm90() -> bool:
    return HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)


def _ce_tail(N, V, first, dev, knobs=None, need_grad=True, path=None, backend=None):
    """cross_entropy of bf16 ``[N, V]`` logits; rows ``first:`` (one of them ignored) against fp64 on those rows:
    the loss (reduction 'none'), the gradient under a non-unit upstream gradient, and 'mean' against the mean of
    the kept rows' losses."""
    x = torch.randn(N, V, device=dev, dtype=torch.bfloat16)
    t = torch.randint(0, V, (N,), device=dev)
    t[N - 2] = -100
    tail = slice(first, N)
    kw = dict(knobs=knobs, backend=backend)
    if path is not None:
        assert explain(oss.cross_entropy, x, t, need_grad=need_grad, **kw).path == path
    xs = x[tail].double().requires_grad_()
    lr = ref.cross_entropy(xs, t[tail], reduction="none")
    if need_grad:
        x.requires_grad_()
        loss = oss.cross_entropy(x, t, reduction="none", **kw)
        up = torch.rand(N, device=dev) + 0.5
        (loss * up).sum().backward()
        (lr * up[tail].double()).sum().backward()
        g = x.grad[tail]
        assert not torch.isnan(g).any()
        assert rel(g, xs.grad) < 8e-3, rel(g, xs.grad)
        assert (x.grad[N - 2] == 0).all()
        x.grad = None
        x = x.detach()
    else:
        loss = oss.cross_entropy(x, t, reduction="none", **kw)
    assert rel(loss[tail], lr.detach()) < 1e-5, rel(loss[tail], lr.detach())
    mean = oss.cross_entropy(x, t, **kw)
    kept = loss.detach()[t != -100].double()
    assert abs(mean.item() - kept.mean().item()) <= 1e-5 * kept.mean().item()


def test_ce_tail_helper_small(kernel_device):
    """The helper at 7 rows of 300 (the interpreter on the CPU), with and without a gradient."""
    _ce_tail(7, 300, 4, kernel_device, backend="triton")
    _ce_tail(7, 300, 4, kernel_device, need_grad=False, backend="triton")


# (V, need_grad, knobs, (path on sm_90, path elsewhere))
CE_CASES = [
    (128256, True, None, ("smem", "row")),
    (128256, False, None, ("row", "row")),
    (32000, True, None, ("smem", "coop")),
    (32000, False, None, ("coop", "coop")),
    (50257, True, None, ("row", "row")),            # odd rows: no cp.async, past the coop size: two passes
    (128256, True, CEKnobs(path="coop"), ("coop", "coop")),
    (128256, True, CEKnobs(path="split"), ("split", "split")),
    (1024, True, None, ("coop", "coop")),           # 2M short rows: one program each
]


@pytest.mark.gpu
@pytest.mark.parametrize("V,need_grad,knobs,paths", CE_CASES)
def test_gpu_cross_entropy_more_than_2_31_elements(V, need_grad, knobs, paths):
    """bf16 logits of N·V > 2^31 elements (4.3 GB, 8.6 GB with dx): the rows past 2^31 as fp64's."""
    N, first = past_2_31(V)
    _ce_tail(N, V, first, torch.device("cuda"), knobs=knobs, need_grad=need_grad,
             path=paths[0] if _sm90() else paths[1])
    free()


def _lce_tail(N, V, Hd, first, dev, knobs=None, backend=None, block=2048):
    """linear_cross_entropy of bf16 hidden ``[N, Hd]`` and weight ``[V, Hd]`` (reduction 'none', a non-unit
    upstream gradient): the loss and grad_hidden of rows ``first:`` against fp64 on those rows, grad_weight (a sum
    over every row) against fp32 built ``block`` rows at a time."""
    h = (torch.randn(N, Hd, device=dev) / 4).bfloat16().requires_grad_()
    w = (torch.randn(V, Hd, device=dev) / 4).bfloat16().requires_grad_()
    t = torch.randint(0, V, (N,), device=dev)
    t[N - 2] = -100
    t[::97] = -100
    up = torch.rand(N, device=dev) + 0.5
    loss = oss.linear_cross_entropy(h, w, t, reduction="none", knobs=knobs, backend=backend)
    (loss * up).sum().backward()
    tail = slice(first, N)
    hs, ws = h.detach()[tail].double().requires_grad_(), w.detach().double().requires_grad_()
    lr = ref.linear_cross_entropy(hs, ws, t[tail], reduction="none")
    (lr * up[tail].double()).sum().backward()
    assert rel(loss[tail], lr.detach()) < 1e-3, rel(loss[tail], lr.detach())
    assert rel(h.grad[tail], hs.grad) < 2e-2, rel(h.grad[tail], hs.grad)
    dw = torch.zeros(V, Hd, device=dev)
    wf = w.detach().float()
    for r0 in range(0, N, block):
        hc, tc = h.detach()[r0:r0 + block].float(), t[r0:r0 + block]
        p = torch.softmax(hc @ wf.T, -1)
        keep = tc != -100
        p[keep, tc[keep]] -= 1.0
        p *= (up[r0:r0 + block] * keep)[:, None]
        dw += p.T @ hc
        del p
    assert rel(w.grad, dw) < 2e-2, rel(w.grad, dw)


def test_lce_tail_helper_small(kernel_device):
    """The helper at 40 tokens × 300 classes (the interpreter), both schemes tiled."""
    for knobs in (LCEKnobs(scheme="vocab", vocab_chunk=128, chunk_tokens=16), LCEKnobs(scheme="tokens",
                                                                                      chunk_tokens=16)):
        _lce_tail(40, 300, 16, 30, kernel_device, knobs=knobs, backend="triton", block=16)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["vocab", "tokens"])
def test_gpu_linear_cross_entropy_logits_past_2_31(scheme):
    """16448 tokens × 131072 classes (2.16e9 logical logits, hidden 256): the tail tokens' loss and grad_hidden
    against fp64, grad_weight against fp32 (the tiles are small: this guards the token and class offsets of each
    tile)."""
    N, first = past_2_31(131072, extra=64)
    _lce_tail(N, 131072, 256, first, torch.device("cuda"), knobs=LCEKnobs(scheme=scheme))
    free()


# ---- misaligned tensors --------------------------------------------------------------------------------------


def _ce_misaligned(N, V, dtype, dev, backend=None, weight=False):
    """Aligned, then each input misaligned (logits; targets and class weights), then aligned again: every
    result against fp64, the misaligned ones against the aligned one, the second aligned call bit for bit."""
    x = (torch.randn(N, V, device=dev) * 2).to(dtype)
    x[0, :3] = 1e4
    t = torch.randint(0, V, (N,), device=dev)
    t[::7] = -100
    wt = torch.rand(V, device=dev) + 0.5 if weight else None
    xs = x.double().requires_grad_()
    lr = ref.cross_entropy(xs, t, weight=wt, reduction="none")
    up = torch.rand(N, device=dev) + 0.5
    (lr * up.double()).sum().backward()

    def run(x_, t_, w_):
        xl = x_.detach().requires_grad_()
        loss = oss.cross_entropy(xl, t_, weight=w_, reduction="none", backend=backend)
        (loss * up).sum().backward()
        return loss.detach(), xl.grad, explain(oss.cross_entropy, x_, t_, weight=w_, need_grad=True,
                                               backend=backend).path

    first = run(x, t, wt)
    cases = [(misaligned(x), t, wt), (x, misaligned(t), None if wt is None else misaligned(wt))]
    results = [run(*c) for c in cases] + [run(x, t, wt)]
    gtol = 8e-3 if dtype != torch.float32 else 1e-4
    for loss, g, path in [first] + results:
        assert rel(loss, lr.detach()) < 1e-5, (path, rel(loss, lr.detach()))
        assert rel(g, xs.grad) < gtol, (path, rel(g, xs.grad))
    for loss, g, path in results[:-1]:
        assert rel(loss, first[0]) < 1e-6 and rel(g, first[1]) < gtol, path
    assert torch.equal(results[-1][0], first[0]) and torch.equal(results[-1][1], first[1])
    if _sm90() and V % 16 == 0 and dtype == torch.bfloat16 and V >= 32000:
        assert first[2] == "smem" and results[0][2] != "smem", (first[2], results[0][2])
    return first[2], results[0][2]


def test_ce_misaligned_helper_small(kernel_device):
    _ce_misaligned(9, 320, torch.float32, kernel_device, backend="triton", weight=True)


@pytest.mark.gpu
@pytest.mark.parametrize("V,dtype,weight", [(32000, torch.bfloat16, False), (128256, torch.bfloat16, True),
                                            (50257, torch.bfloat16, False), (32000, torch.float32, True),
                                            (4096, torch.float16, False)])
def test_gpu_cross_entropy_misaligned(V, dtype, weight):
    _ce_misaligned(256, V, dtype, torch.device("cuda"), weight=weight)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["vocab", "tokens"])
def test_gpu_linear_cross_entropy_misaligned(scheme):
    """hidden, then weight, starting 2 bytes past a 16-byte boundary: loss and all three gradients as fp64's
    (the aligned call's tolerance), bias too."""
    dev = torch.device("cuda")
    N, Hd, V = 1000, 512, 50304
    h = (torch.randn(N, Hd, device=dev) / 4).bfloat16()
    w = (torch.randn(V, Hd, device=dev) / 4).bfloat16()
    b = torch.randn(V, device=dev).bfloat16()
    t = torch.randint(0, V, (N,), device=dev)
    t[::7] = -100
    hs, ws, bs = (a.double().requires_grad_() for a in (h, w, b))
    lr = ref.linear_cross_entropy(hs, ws, t, bias=bs, reduction="none")
    lr.sum().backward()
    for hh, ww, bb in [(h, w, b), (misaligned(h), w, b), (h, misaligned(w), b), (h, w, misaligned(b))]:
        leaves = [a.detach().requires_grad_() for a in (hh, ww, bb)]
        loss = oss.linear_cross_entropy(leaves[0], leaves[1], t, bias=leaves[2], reduction="none",
                                        knobs=LCEKnobs(scheme=scheme))
        loss.sum().backward()
        assert rel(loss, lr.detach()) < 1e-3
        for leaf, want in zip(leaves, (hs.grad, ws.grad, bs.grad)):
            assert rel(leaf.grad, want) < 2e-2
