"""Losses on the GPU at real sizes against the fp64 reference (``pytest -m gpu tests/losses``)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import onlinesoftmax as oss
from onlinesoftmax.losses import CEKnobs, LCEKnobs, explain
from onlinesoftmax.reference import losses as ref

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def _grads_ref(fn, *leaves):
    xs = [x.detach().double().requires_grad_() for x in leaves]
    loss = fn(*xs)
    loss.sum().backward()
    return loss.detach(), [x.grad for x in xs]


def _hard_rows(V, opts, neg_inf=True, N=384):
    """bf16 logits with 1e4 entries and (neg_inf) a row of -inf, targets with ~10 % ignored, the options with a
    class weight drawn where opts asks for one."""
    dev = torch.device("cuda")
    x = (torch.randn(N, V, device=dev) * 3).bfloat16()
    x[0, :5] = 1e4
    if neg_inf:
        x[1, 7::3] = float("-inf")
    t = torch.randint(0, V, (N,), device=dev)
    t[t % 10 == 3] = -100
    t[1] = 8
    opts = dict(opts)
    if opts.pop("weight", False):
        opts["weight"] = torch.rand(V, device=dev) + 0.5
    return x, t, opts


KNOBS = {"plan": None, "coop": CEKnobs(path="coop"), "row": CEKnobs(path="row"), "split": CEKnobs(path="split")}


@pytest.mark.parametrize("V", [32000, 50257, 128256])
@pytest.mark.parametrize("path", list(KNOBS))
@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.1, z_loss=1e-4, softcap=30.0, reduction="sum"),
                                  dict(weight=True, reduction="none")])
def test_cross_entropy_gpu_vs_fp64(V, path, opts):
    x, t, opts = _hard_rows(V, opts)
    xl = x.clone().requires_grad_()
    loss = oss.cross_entropy(xl, t, knobs=KNOBS[path], **opts)
    loss.sum().backward()
    lr, (gr,) = _grads_ref(lambda a: ref.cross_entropy(a, t, **opts), x)
    assert loss.dtype == torch.float32 and xl.grad.dtype == torch.bfloat16
    assert _rel(loss, lr) < 1e-5
    assert _rel(xl.grad, gr) < 8e-3


def test_cross_entropy_gpu_matches_torch_and_plans():
    dev = torch.device("cuda")
    x = torch.randn(4096, 128256, device=dev, dtype=torch.bfloat16)
    t = torch.randint(0, 128256, (4096,), device=dev)
    torch.testing.assert_close(oss.cross_entropy(x, t), F.cross_entropy(x.float(), t), rtol=1e-5, atol=1e-5)
    plan = explain(oss.cross_entropy, x, t, need_grad=False)
    assert plan.path == "row" and plan.block == 32768 and plan.num_warps == 32, plan
    on_hopper = torch.cuda.get_device_capability() == (9, 0)
    plan = explain(oss.cross_entropy, x, t, need_grad=True)
    assert (plan.path, plan.chunks) == (("smem", 8) if on_hopper else ("row", 1)), plan
    plan = explain(oss.cross_entropy, x[:, :32000], t.clamp(max=31999), need_grad=True)
    assert (plan.path, plan.chunks) == (("smem", 1) if on_hopper else ("coop", 4)), plan
    plan = explain(oss.cross_entropy, x[:, :32001], t.clamp(max=31999), need_grad=True)   # odd rows: no cp.async
    assert plan.path == "coop" and plan.chunks == 4 and plan.chunk == 8192, plan
    t[:] = -100
    assert torch.isnan(oss.cross_entropy(x, t))


def test_cross_entropy_gpu_coop_in_place_and_many_rows():
    """The coop kernel over 8192 rows (more programs than fit at once: rows wait in dispatch order), and in place
    (dx over x, as the linear cross-entropy's tiles): the target logit is read before any program of its row
    writes dx."""
    dev = torch.device("cuda")
    N, V = 8192, 32000
    x = (torch.randn(N, V, device=dev) * 2).bfloat16()
    t = torch.randint(0, V, (N,), device=dev)
    t[::10] = -100
    from onlinesoftmax.losses import kernels as K
    from onlinesoftmax.losses.cross_entropy import _plan_for, _reduction_coefs

    lr, (gr,) = _grads_ref(lambda a: ref.cross_entropy(a, t, reduction="sum"), x)
    plans = [_plan_for(x, True, CEKnobs(path="coop")), _plan_for(x, True, CEKnobs(path="coop", chunk=4096))]
    assert [(p.path, p.chunks) for p in plans] == [("coop", 4), ("coop", 8)]
    for plan, inplace in itertools.product(plans, (False, True)):
        xi = x.clone()
        dx = xi if inplace else torch.empty_like(xi)
        loss, lse = torch.empty(N, device=dev), torch.empty(N, device=dev)
        K.ce_rows(plan, xi, t, None, _reduction_coefs(t, None, -100, "sum", V), loss, lse, dx, None, -100, 0.0,
                  0.0, None)
        assert _rel(loss.sum(), lr) < 1e-5, (plan, inplace)
        assert _rel(dx, gr) < 8e-3, (plan, inplace)


SMEM = {"smem": CEKnobs(path="smem"), "smem keep_e": CEKnobs(path="smem", keep_e=True),
        "smem whole rows": CEKnobs(path="smem", chunk=32768, num_warps=8, reg=2, keep_e=True),
        "smem no registers": CEKnobs(path="smem", chunk=8192, num_warps=2, reg=0)}


@pytest.mark.parametrize("V", [32000, 128256, 262144])
@pytest.mark.parametrize("name", list(SMEM))
@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.1, z_loss=1e-4, softcap=30.0, reduction="sum"),
                                  dict(weight=True, label_smoothing=0.05, reduction="none")])
def test_cross_entropy_gpu_smem_vs_fp64(V, name, opts):
    """Path "smem" (the chunk in shared memory, C programs per row at the row barrier; C = 1 for whole rows of
    32000): loss and gradient against fp64, -inf and 1e4 logits, ignored rows, every option."""
    x, t, opts = _hard_rows(V, opts, neg_inf=not opts.get("label_smoothing"))
    assert explain(oss.cross_entropy, x, t, knobs=SMEM[name], need_grad=True, **opts).path == "smem"
    xl = x.clone().requires_grad_()
    loss = oss.cross_entropy(xl, t, knobs=SMEM[name], **opts)
    up = torch.rand(loss.shape, device=x.device) + 0.5       # a non-unit upstream gradient: the backward's scale
    (loss * up).sum().backward()
    xs = x.double().requires_grad_()
    lr = ref.cross_entropy(xs, t, **opts)
    (lr * up.double()).sum().backward()
    assert loss.dtype == torch.float32 and xl.grad.dtype == torch.bfloat16
    assert _rel(loss, lr.detach()) < 1e-5
    assert _rel(xl.grad, xs.grad) < 8e-3


def test_cross_entropy_gpu_smem_many_rows_poisoned():
    """8192 rows (more programs than fit at once: rows wait in dispatch order), 10 % ignored, dx poisoned with NaN
    before the kernel: every element written, loss and dx as fp64's."""
    dev = torch.device("cuda")
    from onlinesoftmax.losses import kernels as K
    from onlinesoftmax.losses.cross_entropy import _plan_for, _reduction_coefs

    for V in (32000, 128256):
        N = 8192
        x = (torch.randn(N, V, device=dev) * 2).bfloat16()
        t = torch.randint(0, V, (N,), device=dev)
        t[::10] = -100
        lr, (gr,) = _grads_ref(lambda a: ref.cross_entropy(a, t, reduction="sum"), x)
        for knobs in SMEM.values():
            plan = _plan_for(x, True, knobs)
            dx = torch.full_like(x, float("nan"))
            loss, lse = torch.empty(N, device=dev), torch.empty(N, device=dev)
            K.ce_rows(plan, x, t, None, _reduction_coefs(t, None, -100, "sum", V), loss, lse, dx, None, -100, 0.0,
                      0.0, None)
            assert not torch.isnan(dx).any(), plan
            assert _rel(loss.sum(), lr) < 1e-5, plan
            assert _rel(dx, gr) < 8e-3, plan


def test_cross_entropy_gpu_one_plan_many_row_lengths():
    """8192 rows of 128256 then of 50257 and 151936: one plan (two passes of 32K tiles), each row length and stride
    its own compiled variant (a kernel compiled for 16-divisible strides, replayed for 50257, faulted)."""
    dev = torch.device("cuda")
    for V in (128256, 50257, 151936):
        x = torch.randn(8192, V, device=dev).bfloat16()
        t = torch.randint(0, V, (8192,), device=dev)
        assert explain(oss.cross_entropy, x, t, need_grad=False).block == 32768
        torch.testing.assert_close(oss.cross_entropy(x, t), F.cross_entropy(x.float(), t), rtol=1e-5, atol=1e-5)
        torch.cuda.synchronize()


@pytest.mark.parametrize("scheme", ["tokens", "vocab"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_gpu_vs_fp64(bias, reduction, scheme):
    dev = torch.device("cuda")
    N, Hd, V = 1500, 512, 50257
    h = (torch.randn(N, Hd, device=dev) / 4).bfloat16()
    w = (torch.randn(V, Hd, device=dev) / 4).bfloat16()
    b = torch.randn(V, device=dev).bfloat16() if bias else None
    t = torch.randint(0, V, (N,), device=dev)
    t[::7] = -100
    leaves = [x.clone().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    loss = oss.linear_cross_entropy(leaves[0], leaves[1], t, bias=leaves[2] if bias else None, reduction=reduction,
                                    knobs=LCEKnobs(scheme=scheme))
    loss.sum().backward()
    lr, grs = _grads_ref(lambda hh, ww, *bb: ref.linear_cross_entropy(hh, ww, t, bias=bb[0] if bb else None,
                                                                     reduction=reduction),
                         *(h, w) + ((b,) if bias else ()))
    assert _rel(loss, lr) < 1e-3
    for leaf, g in zip(leaves, grs):
        assert _rel(leaf.grad, g) < 2e-2


@pytest.mark.parametrize("name", ["coop", "row", "split", "smem"])
def test_cross_entropy_gpu_inf_logit_rows_nan(name):
    """A +inf logit (on or off the target) or a NaN in a row: the row's loss and whole gradient NaN, as
    F.cross_entropy; the other rows as fp64 (every path, the Gluon one included)."""
    knobs = SMEM[name] if name in SMEM else KNOBS[name]
    x, t, _ = _hard_rows(128256, {}, N=64)
    x[2, 5], t[2] = float("inf"), 5
    x[3, 7], t[3] = float("inf"), 11
    x[4, 9], t[4] = float("nan"), 1                     # (a target of ~10 % of rows is ignore_index)
    xl = x.clone().requires_grad_()
    loss = oss.cross_entropy(xl, t, knobs=knobs, reduction="none")
    loss.sum().backward()
    assert loss[2:5].isnan().all() and xl.grad[2:5].isnan().all()
    keep = torch.ones(64, dtype=torch.bool, device=x.device)
    keep[2:5] = False
    lr, (gr,) = _grads_ref(lambda a: ref.cross_entropy(a, t[keep], reduction="none"), x[keep])
    assert _rel(loss[keep], lr) < 1e-5
    assert _rel(xl.grad[keep], gr) < 8e-3
