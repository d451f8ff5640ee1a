"""linear_cross_entropy: against the fp64 reference of cross_entropy(hidden @ weightᵀ + bias), both backends,
chunking, gradients to all three, plans, errors."""

import dataclasses
import importlib

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax.losses import LCEKnobs, explain
from onlinesoftmax.losses.plan import LCEProblem, plan_linear_cross_entropy
from onlinesoftmax.reference import losses as ref
from onlinesoftmax.target import A100, H200


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _case(N=37, H=16, V=300, bias=True, dtype=torch.float32):
    h = torch.randn(N, H).to(dtype)
    w = (torch.randn(V, H) / 2).to(dtype)
    b = torch.randn(V).to(dtype) if bias else None
    t = torch.randint(0, V, (N,))
    t[::6] = -100
    return h, w, b, t


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kw", [dict(), dict(reduction="sum", label_smoothing=0.1),
                                dict(reduction="none", z_loss=1e-3), dict(softcap=4.0)],
                         ids=["mean", "sum-ls", "none-z", "softcap"])
def test_vs_fp64(backend, bias, kw):
    h, w, b, t = _case(bias=bias)
    leaves = [x.clone().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    # scheme "tokens" in 16-token chunks: three chunks and a ragged last one
    loss = oss.linear_cross_entropy(leaves[0], leaves[1], t, bias=leaves[2] if bias else None, backend=backend,
                                    knobs=LCEKnobs(scheme="tokens", chunk_tokens=16), **kw)
    (loss.sum() * 0.7).backward()
    d = [x.double().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    lr = ref.linear_cross_entropy(d[0], d[1], t, bias=d[2] if bias else None, **kw)
    (lr.sum() * 0.7).backward()
    assert loss.dtype == torch.float32
    assert _rel(loss, lr) < 1e-5
    for leaf, x in zip(leaves, d):
        assert leaf.grad.dtype == leaf.dtype
        assert _rel(leaf.grad, x.grad) < 1e-4


@pytest.mark.interpreter
def test_bf16_and_batch_dims():
    h, w, b, t = _case(N=24, V=500, dtype=torch.bfloat16)
    h3, t3 = h.reshape(2, 12, -1), t.reshape(2, 12)
    hl, wl = h3.clone().requires_grad_(), w.clone().requires_grad_()
    loss = oss.linear_cross_entropy(hl, wl, t3, bias=b, backend="triton",
                                    knobs=LCEKnobs(scheme="tokens", chunk_tokens=16))
    loss.backward()
    hd, wd = h3.double().requires_grad_(), w.double().requires_grad_()
    lr = ref.linear_cross_entropy(hd, wd, t3, bias=b.double())
    lr.backward()
    assert _rel(loss, lr) < 1e-2
    assert hl.grad.shape == h3.shape and _rel(hl.grad, hd.grad) < 2e-2 and _rel(wl.grad, wd.grad) < 2e-2


@pytest.mark.interpreter
def test_only_weight_requires_grad_and_no_grad():
    h, w, _, t = _case(bias=False)
    wl = w.clone().requires_grad_()
    oss.linear_cross_entropy(h, wl, t, backend="triton").backward()
    wd = w.double().requires_grad_()
    ref.linear_cross_entropy(h.double(), wd, t).backward()
    assert _rel(wl.grad, wd.grad) < 1e-4
    with torch.no_grad():
        a = oss.linear_cross_entropy(h, w, t, backend="triton")
    assert abs(a.item() - ref.linear_cross_entropy(h, w, t).item()) < 1e-5


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("scheme", ["vocab", "tokens"])
def test_inf_logit_rows_nan_as_torch(backend, scheme):
    """A weight row of +inf gives a +inf logit in rows whose hidden state is positive there: NaN loss and NaN
    gradients in those rows, as F.cross_entropy(h @ wᵀ) (the kernels' lse was +inf, the loss inf; the torch path
    of scheme "tokens" too)."""
    h, w, _, t = _case(N=6, bias=False)
    t[:] = 3
    h[:3, 0], h[3:, 0] = 1.0, -1.0
    w[5, 0] = float("inf")
    hl = h.clone().requires_grad_()
    loss = oss.linear_cross_entropy(hl, w, t, reduction="none", backend=backend, knobs=LCEKnobs(scheme=scheme))
    loss.sum().backward()
    assert loss[:3].isnan().all() and hl.grad[:3].isnan().all()
    hr = h.clone().requires_grad_()
    lr = torch.nn.functional.cross_entropy(hr @ w.T, t, reduction="none")
    lr.sum().backward()
    assert lr[:3].isnan().all() and torch.isfinite(lr[3:]).all()
    torch.testing.assert_close(loss[3:], lr[3:].detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter
def test_all_ignored():
    h, w, b, t = _case()
    t[:] = -100
    hl = h.clone().requires_grad_()
    loss = oss.linear_cross_entropy(hl, w, t, backend="triton")
    assert torch.isnan(loss)
    s = oss.linear_cross_entropy(hl, w, t, backend="triton", reduction="sum")
    s.backward()
    assert s.item() == 0.0 and torch.equal(hl.grad, torch.zeros_like(h))


@pytest.mark.interpreter
def test_compile_fullgraph():
    h, w, b, t = _case()
    hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
    f = torch.compile(lambda h, w, t: oss.linear_cross_entropy(h, w, t, bias=b, backend="triton"), fullgraph=True)
    f(hl, wl, t).backward()
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    ref.linear_cross_entropy(hd, wd, t, bias=b.double()).backward()
    assert _rel(hl.grad, hd.grad) < 1e-4 and _rel(wl.grad, wd.grad) < 1e-4


@pytest.mark.interpreter
def test_plan_fits_budget():
    """The default is scheme "vocab" (16-bit: an fp32 grad-hidden accumulator; fp32: none); scheme "tokens" on
    request; both within their budgets."""
    p = LCEProblem(8192, 4096, 128256, 2, True)
    plan = plan_linear_cross_entropy(p, H200)
    assert (plan.scheme, plan.dh_fp32) == ("vocab", True) and plan.tile_bytes <= 60 << 20
    assert plan.chunk_tokens % 16 == 0 and plan.vocab_chunk % 128 == 0
    assert plan_linear_cross_entropy(dataclasses.replace(p, itemsize=4), H200).dh_fp32 is False
    assert plan_linear_cross_entropy(p, A100) == plan
    tokens = plan_linear_cross_entropy(p, H200, LCEKnobs(scheme="tokens"))
    assert tokens.scheme == "tokens" and tokens.tile_bytes <= 56 << 20 and tokens.chunk_tokens % 16 == 0
    assert tokens.ce.path == "split"               # a tile of ~224 rows is too few rows for one program each
    assert plan_linear_cross_entropy(p, H200, LCEKnobs(scheme="tokens", chunk_tokens=64)).chunk_tokens == 64
    h, w, _, t = _case()
    assert explain(oss.linear_cross_entropy, h, w, t, backend="triton").scheme == "vocab"


@pytest.mark.parametrize("bad, match", [
    (dict(target=torch.zeros(37)), "int64"),
    (dict(weight=torch.randn(300, 15)), "weight's dim 1"),
    (dict(target=torch.zeros(36, dtype=torch.int64)), "target shape"),
    (dict(bias=torch.randn(299)), "bias must be"),
    (dict(softcap=float("inf")), "softcap must be None or a positive finite"),
])
def test_errors(bad, match):
    h, w, b, t = _case()
    args = dict(hidden=h, weight=w, target=t)
    args.update(bad)
    with pytest.raises((TypeError, ValueError), match=match) as e:
        oss.linear_cross_entropy(args.pop("hidden"), args.pop("weight"), args.pop("target"), **args)
    assert "linear_cross_entropy" in str(e.value)


# ---- scheme "vocab": token blocks × vocab chunks, two sweeps ------------------------------------------------

VOCAB = LCEKnobs(scheme="vocab", chunk_tokens=16, vocab_chunk=64)   # 3 token blocks, 5 vocab chunks, both ragged


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kw", [dict(), dict(reduction="sum", label_smoothing=0.1),
                                dict(reduction="none", z_loss=1e-3), dict(softcap=4.0)],
                         ids=["mean", "sum-ls", "none-z", "softcap"])
def test_vocab_scheme_vs_fp64(backend, kw):
    h, w, b, t = _case()
    t[1] = 299                                    # the last class, in the ragged last chunk
    leaves = [x.clone().requires_grad_() for x in (h, w, b)]
    loss = oss.linear_cross_entropy(leaves[0], leaves[1], t, bias=leaves[2], backend=backend, knobs=VOCAB, **kw)
    (loss.sum() * 0.7).backward()
    d = [x.double().requires_grad_() for x in (h, w, b)]
    lr = ref.linear_cross_entropy(d[0], d[1], t, bias=d[2], **kw)
    (lr.sum() * 0.7).backward()
    assert _rel(loss, lr) < 1e-5
    for leaf, x in zip(leaves, d):
        assert leaf.grad.dtype == leaf.dtype and _rel(leaf.grad, x.grad) < 1e-4


@pytest.mark.interpreter
def test_vocab_scheme_bf16_fp32_accumulator_and_no_grad():
    h, w, b, t = _case(N=24, V=500, dtype=torch.bfloat16)
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    ref.linear_cross_entropy(hd, wd, t, bias=b.double()).backward()
    for backend, k in (("triton", LCEKnobs(scheme="vocab", vocab_chunk=256)),
                       ("torch", LCEKnobs(scheme="vocab", vocab_chunk=128, dh_fp32=True, chunk_tokens=16))):
        hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
        oss.linear_cross_entropy(hl, wl, t, bias=b, backend=backend, knobs=k).backward()
        assert _rel(hl.grad, hd.grad) < 2e-2 and _rel(wl.grad, wd.grad) < 2e-2
    with torch.no_grad():
        a = oss.linear_cross_entropy(h.double(), w.double(), t, backend="torch", knobs=VOCAB)
    assert abs(a.item() - ref.linear_cross_entropy(h.double(), w.double(), t).item()) < 1e-5
    t[:] = -100
    hl = h.clone().requires_grad_()
    s = oss.linear_cross_entropy(hl, w, t, backend="torch", reduction="sum", knobs=VOCAB)
    s.backward()
    assert s.item() == 0.0 and torch.equal(hl.grad, torch.zeros_like(h))


def test_vocab_plan_fits_budget():
    for N, Hd, V in ((8192, 4096, 128256), (16384, 2048, 151936), (65536, 4096, 262144), (100, 64, 1000)):
        for fp32 in (False, True):
            p = plan_linear_cross_entropy(LCEProblem(N, Hd, V, 2, True), H200,
                                          LCEKnobs(scheme="vocab", dh_fp32=fp32))
            assert p.scheme == "vocab" and p.tile_bytes <= 60 << 20 and p.dh_fp32 == fp32
            assert p.chunk_tokens <= max(N, 16) and (p.vocab_chunk % 128 == 0 or p.vocab_chunk == V)
    p = plan_linear_cross_entropy(LCEProblem(8192, 4096, 128256, 2, True), H200,
                                  LCEKnobs(scheme="vocab", dh_fp32=False))
    assert (p.chunk_tokens, p.vocab_chunk) == (8192, 3840)      # all tokens in one block: grad_W written once
    with pytest.raises(ValueError, match="scheme"):
        plan_linear_cross_entropy(LCEProblem(8, 4, 10, 2, True), H200, LCEKnobs(scheme="rows"))
    with pytest.raises(ValueError, match="vocab"):
        plan_linear_cross_entropy(LCEProblem(8, 4, 10, 2, True), H200, LCEKnobs(scheme="tokens", vocab_chunk=64))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_opcheck(backend, kernel_device):
    """The forward and backward ops against their fake implementations (every gradient on or off, a bias)."""
    LCE = importlib.import_module("onlinesoftmax.losses.linear_cross_entropy")     # the module

    dev = kernel_device if backend == "triton" else torch.device("cpu")
    h, W, b = torch.randn(6, 16, device=dev), torch.randn(37, 16, device=dev), torch.randn(37, device=dev)
    t = torch.randint(0, 37, (6,), device=dev)
    for bias, need in ((None, (True, True, False)), (b, (True, False, True)), (b, (False, False, False))):
        h2, t2, which, kargs = LCE._prepare("linear_cross_entropy", h, W, t, bias, -100, "mean", 0.0, 0.0, None,
                                            backend, None)
        torch.library.opcheck(torch.ops.onlinesoftmax.linear_cross_entropy.default,
                              (h2, W, bias, t2, -100, "mean", 0.0, 0.0, None, *need, which, *kargs))


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_double_backward_is_an_error_and_torch_func_grad(backend):
    """create_graph=True raises naming the function (the gradients are written by the forward: a silent first-order
    answer before); torch.func.grad takes the logits and torch's cross-entropy."""
    h, w, _, t = _case(N=6, V=40, bias=False)
    hl = h.clone().requires_grad_()
    for reduction in ("mean", "none"):           # "none" (gradients in the backward) raised torch's error, later
        loss = oss.linear_cross_entropy(hl, w, t, backend=backend, reduction=reduction)
        with pytest.raises(RuntimeError, match="linear_cross_entropy: double backward"):
            torch.autograd.grad(loss.sum(), hl, create_graph=True)
    want = torch.func.grad(lambda a: torch.nn.functional.cross_entropy(a @ w.T, t))(h)
    got = torch.func.grad(lambda a: oss.linear_cross_entropy(a, w, t, backend=backend))(h)
    torch.testing.assert_close(got, want)
