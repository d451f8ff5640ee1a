"""cross_entropy: torch path against F.cross_entropy, Triton kernels (interpreter on CPU) against the fp64 reference,
plans, custom op under torch.compile, errors."""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

import onlinesoftmax as oss
from onlinesoftmax.losses import CEKnobs, explain
from onlinesoftmax.losses.plan import CEProblem, plan_cross_entropy, with_knobs
from onlinesoftmax.reference import losses as ref
from onlinesoftmax.target import A100, H200, INTERPRETER

CE = importlib.import_module("onlinesoftmax.losses.cross_entropy")     # the module (the package exports the op)

# The Triton paths, forced small so the interpreter walks every loop and mask: one block; two passes of 256-wide
# tiles; the row split over programs of 512 classes; the coop kernel (one chunk per row in the interpreter, where no
# program may wait for another: its C > 1 merge runs in the GPU tests).
PATHS = {"one": CEKnobs(path="row"), "two": CEKnobs(path="row", one_block=False, block=256),
         "split": CEKnobs(path="split", block=128, chunk=256), "coop": CEKnobs(path="coop")}


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _inputs(N, V, dtype=torch.float32, ignore_every=5):
    x = (torch.randn(N, V) * 3).to(dtype)
    t = torch.randint(0, V, (N,))
    if ignore_every:
        t[::ignore_every] = -100
    return x, t


def _run(x, t, **kw):
    xl = x.clone().requires_grad_()
    loss = oss.cross_entropy(xl, t, **kw)
    (loss.sum() * 1.5).backward()
    return loss.detach(), xl.grad


def _ref(x, t, **kw):
    kw.pop("backend", None), kw.pop("knobs", None)
    xd = x.detach().double().requires_grad_()
    loss = ref.cross_entropy(xd, t, **kw)
    (loss.sum() * 1.5).backward()
    return loss.detach(), xd.grad


OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1),
           dict(weight="rand"), dict(weight="rand", label_smoothing=0.2, reduction="sum"),
           dict(ignore_index=3), dict(z_loss=1e-2), dict(softcap=5.0), dict(z_loss=1e-3, softcap=3.0,
                                                                               reduction="none")]


def _opts(kw, V):
    kw = dict(kw)
    if kw.get("weight") == "rand":
        kw["weight"] = torch.rand(V) + 0.1
    return kw


@pytest.mark.parametrize("kw", OPTIONS, ids=lambda k: ",".join(k) or "default")
def test_torch_backend_equals_torch(kw):
    x, t = _inputs(13, 40)
    kw = _opts(kw, 40)
    if kw.get("ignore_index") == 3:
        t[t == -100] = 3
    loss, g = _run(x, t, backend="torch", **kw)
    lr, gr = _ref(x, t, **kw)
    if not kw.get("z_loss") and kw.get("softcap") is None:     # then it is F.cross_entropy itself
        xx = x.clone().requires_grad_()
        lt = F.cross_entropy(xx, t, **kw)
        (lt.sum() * 1.5).backward()
        torch.testing.assert_close(loss, lt, rtol=0, atol=0)
        torch.testing.assert_close(g, xx.grad, rtol=0, atol=0)
    assert loss.dtype == torch.float32
    assert _rel(loss, lr) < 1e-6 and _rel(g, gr) < 1e-5


@pytest.mark.interpreter
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda k: ",".join(k) or "default")
def test_triton_vs_fp64(path, kw):
    V = 1000 if path != "one" else 700
    x, t = _inputs(6, V)
    kw = _opts(kw, V)
    if kw.get("ignore_index") == 3:
        t[t == -100] = 3
    loss, g = _run(x, t, backend="triton", knobs=PATHS[path], **kw)
    lr, gr = _ref(x, t, **kw)
    assert loss.dtype == torch.float32 and g.dtype == x.dtype
    assert _rel(loss, lr) < 2e-6
    assert _rel(g, gr) < 2e-5


@pytest.mark.interpreter
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda k: ",".join(k) or "default")
def test_every_target_ignored(kw):
    """The coefficient kernel's 1 / 0 with every target ignored: NaN for "mean" (as torch), 0 otherwise, and zero
    gradients, with every option."""
    V = 300
    x, _ = _inputs(3, V)
    kw = _opts(kw, V)
    t = torch.full((3,), kw.get("ignore_index", -100))
    loss, g = _run(x, t, backend="triton", **kw)
    torch.testing.assert_close(loss, oss.cross_entropy(x, t, backend="torch", **kw), equal_nan=True)
    assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.interpreter
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_coef_and_loss_kernels_past_one_block(reduction, weighted):
    """The coefficient and loss kernels alone over more targets / rows / classes than one block of theirs."""
    from onlinesoftmax.losses import kernels as K
    from onlinesoftmax.losses.cross_entropy import _reduction_coefs

    N, V = 2 * K.COEF_BLOCK + 77, K.COEF_BLOCK + 5
    t = torch.randint(0, V, (N,))
    t[::4] = -100
    w = torch.rand(V) + 0.1 if weighted else None
    coef = torch.full((3,), float("nan"))
    K.ce_coefs(t, w, -100, reduction, V, coef)
    torch.testing.assert_close(coef, _reduction_coefs(t, w, -100, reduction, V).float(), rtol=1e-6, atol=0)
    rows, lse = torch.rand(N), torch.randn(N) * 4
    out = torch.full((), float("nan"))
    K.ce_total_loss(rows, lse, coef, 1e-2, reduction, out)
    s, s_z = (coef[0], coef[1]) if reduction == "mean" else (1.0, 1.0)
    want = rows.double().sum() * s + 1e-2 * (lse.double() ** 2).sum() * s_z
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=0)


@pytest.mark.interpreter
@pytest.mark.parametrize("V", [1, 3, 1000])
@pytest.mark.parametrize("path", list(PATHS))
def test_small_vocab_bf16(V, path):
    x, t = _inputs(5, V, torch.bfloat16, ignore_every=4)
    loss, g = _run(x, t, backend="triton", knobs=PATHS[path], label_smoothing=0.05)
    lr, gr = _ref(x, t, label_smoothing=0.05)
    assert g.dtype == torch.bfloat16
    assert _rel(loss, lr) < 1e-5
    assert _rel(g, gr) < 8e-3          # bf16 rounding of dlogits


@pytest.mark.interpreter
@pytest.mark.parametrize("V", [50257, 128256])
def test_llm_vocab(V):
    """Real vocabularies: the torch path and the Triton two-pass / split kernels at 2 rows (large tiles)."""
    x, t = _inputs(2, V, torch.bfloat16, ignore_every=0)
    lr, gr = _ref(x, t)
    for kw in (dict(backend="torch"), dict(backend="triton", knobs=CEKnobs(path="row", block=16384)),
               dict(backend="triton", knobs=CEKnobs(path="split", block=16384, chunk=32768)),
               dict(backend="triton", knobs=CEKnobs(path="coop"))):
        loss, g = _run(x, t, **kw)
        assert _rel(loss, lr) < 1e-5, kw
        assert _rel(g, gr) < 8e-3, kw


@pytest.mark.interpreter
@pytest.mark.parametrize("path", list(PATHS))
def test_extremes(path):
    """±1e4 logits and -inf entries off the target; loss and gradients finite and as the reference."""
    x, t = _inputs(6, 300, ignore_every=0)
    x[0, :3] = 1e4
    x[1, :3] = -1e4
    x[2] = 1e4
    x[3, ::2] = float("-inf")
    t[3] = 1
    loss, g = _run(x, t, backend="triton", knobs=PATHS[path], reduction="none")
    lr, gr = _ref(x, t, reduction="none")
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    torch.testing.assert_close(loss.double(), lr, rtol=1e-6, atol=1e-3)
    assert _rel(g, gr) < 1e-5
    torch.testing.assert_close(oss.cross_entropy(x, t, backend="torch", reduction="none"), lr.float())


@pytest.mark.interpreter
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.1, z_loss=1e-3)])
def test_nonfinite_rows_as_torch(path, opts):
    """A +inf logit (on the target or off it) or a NaN in a row: loss NaN and the row's whole gradient NaN, as
    F.cross_entropy gives (its log_softmax is inf − inf there); the other rows untouched (a −inf logit: a finite
    loss, +inf with smoothing, whose term takes −z_j)."""
    x, t = _inputs(5, 300, ignore_every=0)
    x[0, 5], t[0] = float("inf"), 5
    x[1, 7], t[1] = float("inf"), 1
    x[2, 3] = float("nan")
    x[3, 9] = float("-inf")
    loss, g = _run(x, t, backend="triton", knobs=PATHS[path], reduction="none", **opts)
    lt, gt = _run(x, t, backend="torch", reduction="none", **opts)
    xl = x.clone().requires_grad_()
    torch_loss = F.cross_entropy(xl, t, reduction="none", label_smoothing=opts.get("label_smoothing", 0.0))
    (torch_loss.sum() * 1.5).backward()
    assert loss[:3].isnan().all() and g[:3].isnan().all() and lt[:3].isnan().all() and gt[:3].isnan().all()
    assert torch_loss[:3].isnan().all() and xl.grad[:3].isnan().all()
    assert torch.isfinite(g[3:]).all() and torch.isfinite(loss[4]) and loss[3].isinf() == bool(opts)  # ε·(−inf)
    torch.testing.assert_close(loss[3:], lt[3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g[3:], gt[3:], rtol=1e-5, atol=1e-6)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_all_ignored(backend):
    x, t = _inputs(4, 50)
    t[:] = -100
    for reduction in ("mean", "sum", "none"):
        loss, g = _run(x, t, backend=backend, reduction=reduction, z_loss=1e-2)
        torch_loss = F.cross_entropy(x, t, reduction=reduction)
        torch.testing.assert_close(loss, torch_loss, equal_nan=True)
        assert torch.equal(g, torch.zeros_like(g))
    assert math.isnan(oss.cross_entropy(x, t, backend=backend).item())


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_class_dim_last(backend):
    x = torch.randn(2, 3, 4, 17)
    t = torch.randint(0, 17, (2, 3, 4))
    t[0, 1] = -100
    for reduction in ("mean", "none"):
        out = oss.cross_entropy(x, t, reduction=reduction, backend=backend)
        expect = F.cross_entropy(x.movedim(-1, 1), t, reduction=reduction)     # torch: classes on dim 1
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
    xl = x.clone().requires_grad_()
    oss.cross_entropy(xl, t, backend=backend).backward()
    xr = x.clone().requires_grad_()
    F.cross_entropy(xr.movedim(-1, 1), t).backward()
    torch.testing.assert_close(xl.grad, xr.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.interpreter
@pytest.mark.parametrize("bad", [25, 20, -1, -101])
def test_out_of_range_target(bad, monkeypatch):
    """CPU tensors: an IndexError naming the function on both backends (torch's own message named neither, and the
    torch path of linear_cross_entropy returned NaN); the kernels, which a CUDA call reaches unchecked, give that
    row a NaN loss and the others theirs."""
    x, t = _inputs(3, 20, ignore_every=0)
    t[1] = bad
    for backend in ("torch", "triton"):
        with pytest.raises(IndexError, match=rf"^cross_entropy: target {bad} \(flat position 1\) is outside \[0, 20\)"):
            oss.cross_entropy(x, t, backend=backend)
        with pytest.raises(IndexError, match=rf"^linear_cross_entropy: target {bad} \(flat position 1\)"):
            oss.linear_cross_entropy(torch.randn(3, 8), torch.randn(20, 8), t, backend=backend)
    assert torch.isfinite(oss.cross_entropy(x, t, ignore_index=bad))        # ignore_index itself is fine
    monkeypatch.setattr(CE, "_check_target_values", lambda *a: None)
    loss = oss.cross_entropy(x, t, backend="triton", reduction="none")
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_weight_requiring_grad_is_an_error(backend):
    """No gradient flows to the class weights (F.cross_entropy refuses them with a RuntimeError naming nll_loss):
    a ValueError naming the function and the argument, where the kernel path dropped their gradient silently."""
    x, t = _inputs(4, 30)
    w = torch.rand(30, requires_grad=True)
    with pytest.raises(ValueError, match="^cross_entropy: weight .* must not require grad"):
        oss.cross_entropy(x.requires_grad_(), t, weight=w, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(oss.cross_entropy(x, t, weight=w, backend=backend),
                                   F.cross_entropy(x, t, weight=w))


@pytest.mark.interpreter
def test_no_grad_and_empty():
    x, t = _inputs(5, 30)
    with torch.no_grad():
        a = oss.cross_entropy(x.requires_grad_(), t, backend="triton")
    torch.testing.assert_close(a, F.cross_entropy(x, t))
    e = torch.zeros(0, 30)
    te = torch.zeros(0, dtype=torch.int64)
    assert math.isnan(oss.cross_entropy(e, te, backend="triton").item())
    assert oss.cross_entropy(e, te, backend="triton", reduction="sum").item() == 0.0


@pytest.mark.interpreter
def test_second_backward_is_an_error():
    x, t = _inputs(4, 30)
    x.requires_grad_()
    loss = oss.cross_entropy(x, t, backend="triton")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


@pytest.mark.interpreter
def test_torch_compile_fullgraph():
    x, t = _inputs(6, 100)
    f = torch.compile(lambda x, t: oss.cross_entropy(x, t, backend="triton", label_smoothing=0.1, z_loss=1e-3),
                      fullgraph=True)
    xl = x.clone().requires_grad_()
    loss = f(xl, t)
    (loss * 2).backward()
    lr, gr = _ref(x, t, label_smoothing=0.1, z_loss=1e-3)
    assert abs(loss.item() - lr.item()) < 1e-5
    assert _rel(xl.grad, gr * (2 / 1.5)) < 1e-5


@pytest.mark.parametrize("bad, match", [
    (dict(target=torch.zeros(4, dtype=torch.float32)), "target must be int64"),
    (dict(target=torch.zeros(5, dtype=torch.int64)), "target shape"),
    (dict(reduction="avg"), "reduction"),
    (dict(ignore_index=2**63), "ignore_index must fit int64"),     # an OverflowError deep inside, or torch's
    (dict(weight=torch.ones(7)), "weight must be 1-d"),
    (dict(label_smoothing=1.5), "label_smoothing"),
    (dict(softcap=0.0), "softcap"),
    (dict(softcap=math.inf), "softcap must be None or a positive finite"),     # c·tanh(x/c) would be NaN, silently
    (dict(z_loss=None), "z_loss must be a float"),
    (dict(z_loss=math.inf), "z_loss must be >= 0 and finite"),
    (dict(softcap="x"), "softcap must be a float"),
    (dict(label_smoothing="0.1"), "label_smoothing must be a float"),
    (dict(backend="cuda"), "backend"),
    (dict(logits=torch.zeros(4, 10, dtype=torch.int64)), "logits must have dtype"),
])
def test_errors(bad, match):
    args = dict(logits=torch.randn(4, 10), target=torch.zeros(4, dtype=torch.int64))
    args.update(bad)
    with pytest.raises((TypeError, ValueError), match=match) as e:
        oss.cross_entropy(args.pop("logits"), args.pop("target"), **args)
    assert "cross_entropy" in str(e.value)


def test_plans_by_target():
    big = CEProblem(8192, 128256, 2, True)
    assert plan_cross_entropy(big, H200).path == "row" and not plan_cross_entropy(big, H200).one_block
    assert plan_cross_entropy(CEProblem(64, 128256, 2, True), H200).path == "split"
    for tgt in (H200, A100):            # V <= 64K on a GPU: the row over C programs at a row barrier
        p = plan_cross_entropy(CEProblem(8192, 32000, 2, True), tgt)
        assert (p.path, p.chunk, p.chunks, p.num_warps) == ("coop", 8192, 4, 16)
    p = plan_cross_entropy(big, H200, CEKnobs(path="coop"))
    assert (p.chunk, p.chunks, p.num_warps) == (8192, 16, 16)
    assert plan_cross_entropy(CEProblem(64, 262144, 2, True), H200, CEKnobs(path="coop", chunk=4096)).chunks == 64
    # more chunks than may wait for each other (64; one per SM): one program per row, or the row split
    huge = CEProblem(8192, 1 << 20, 2, True)
    assert plan_cross_entropy(huge, H200).path == "row" and not plan_cross_entropy(huge, H200).one_block
    assert plan_cross_entropy(CEProblem(64, 1 << 20, 2, True), H200).path == "split"
    with pytest.raises(ValueError, match="coop"):
        plan_cross_entropy(huge, H200, CEKnobs(path="coop"))
    with pytest.raises(ValueError, match="registers"):
        plan_cross_entropy(big, H200, CEKnobs(path="coop", chunk=8192, block=4096))
    # the interpreter: no program may wait for another, so coop only as one chunk per row (knobs)
    assert plan_cross_entropy(CEProblem(8, 1000, 4, True), INTERPRETER).path == "row"
    assert plan_cross_entropy(CEProblem(8, 1000, 4, True), INTERPRETER, CEKnobs(path="coop")).chunks == 1
    with pytest.raises(ValueError, match="coop"):
        plan_cross_entropy(CEProblem(8, 1000, 4, True), INTERPRETER, CEKnobs(path="coop", chunk=256))
    assert plan_cross_entropy(CEProblem(8, 1000, 4, True), INTERPRETER).fast_exp is False
    assert plan_cross_entropy(big, H200, CEKnobs(path="split")).path == "split"
    with pytest.raises(TypeError):
        with_knobs(CEKnobs(), tiles=3)
    with pytest.raises(TypeError):
        CEKnobs(bogus=1)


@pytest.mark.parametrize("V, chunk, chunks, warps, even", [(32000, 32768, 1, 8, False), (128256, 16384, 8, 4, False),
                                                           (151936, 16384, 10, 4, False), (262144, 16384, 16, 4, True)])
def test_smem_plans_on_h200(V, chunk, chunks, warps, even):
    """Path "smem" (the default here): 16384-class chunks of 4 warps, 4 register sub-tiles of 1024 bf16 under a
    64-register bound; rows up to 32768 whole in one program of 8 warps (4 sub-tiles of 2048); every chunk covers
    its register sub-tiles."""
    prob = CEProblem(8192, V, 2, True, smem_rows=True)
    assert plan_cross_entropy(prob, H200).path == "smem"
    p = plan_cross_entropy(prob, H200, CEKnobs(path="smem"))
    assert (p.path, p.chunk, p.chunks, p.num_warps, p.reg, p.maxnreg, p.keep_e) == \
        ("smem", chunk, chunks, warps, 4, 64, False), p
    assert (V % p.chunk == 0) == even and (even or V % p.chunk >= p.reg * 256 * warps)
    p = plan_cross_entropy(prob, H200, CEKnobs(path="smem", chunk=32768, num_warps=8, reg=2, keep_e=True))
    assert (p.chunk, p.chunks, p.reg, p.keep_e) == (32768, -(-V // 32768), 2, True)
    # fp32 V = 48: 4 register sub-tiles of 1024 do not fit; the masked configuration's whole row, one sub-tile
    p = plan_cross_entropy(CEProblem(8192, 48, 4, True, smem_rows=True), H200, CEKnobs(path="smem"))
    assert (p.chunk, p.chunks, p.reg, p.maxnreg) == (512, 1, 0, 0), p


def test_smem_plan_limits():
    ok = CEProblem(8192, 50256, 2, True, smem_rows=True)
    # 50256 = 3 x 16384 + 1104: the last chunk cannot hold 4 register sub-tiles; the masked configuration
    p = plan_cross_entropy(ok, H200, CEKnobs(path="smem"))
    assert (p.chunk, p.chunks, p.num_warps, p.reg, p.maxnreg) == (8192, 7, 2, 0, 0), p
    with pytest.raises(ValueError, match="reg"):
        plan_cross_entropy(ok, H200, CEKnobs(path="smem", reg=4))
    with pytest.raises(ValueError, match="reg"):
        plan_cross_entropy(ok, H200, CEKnobs(path="smem", reg=3, chunk=8192))
    with pytest.raises(ValueError, match="chunks"):
        plan_cross_entropy(CEProblem(64, 1 << 21, 2, True, smem_rows=True), H200, CEKnobs(path="smem"))
    for tgt in (A100, INTERPRETER):
        with pytest.raises(ValueError, match="sm_90"):
            plan_cross_entropy(ok, tgt, CEKnobs(path="smem"))
    for bad in (CEProblem(8192, 50257, 2, True), CEProblem(8192, 32000, 8, True, smem_rows=True)):
        with pytest.raises(ValueError, match="smem"):
            plan_cross_entropy(bad, H200, CEKnobs(path="smem"))
    from onlinesoftmax.losses.cross_entropy import smem_rows

    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    assert smem_rows(x) and not smem_rows(x[:, :40]) and not smem_rows(x[:, 1:]) and not smem_rows(x.double())


@pytest.mark.interpreter
def test_explain():
    x, t = _inputs(20, 3000)
    x.requires_grad_()
    assert explain(oss.cross_entropy, x, t).path == "torch"
    p = explain(oss.cross_entropy, x, t, backend="triton")
    assert p.path == "row" and not p.one_block           # 3000 > the interpreter's one-block size; 20 rows
    assert explain(oss.cross_entropy, x[:4], t[:4], backend="triton").path == "split"   # 4 rows on 4 "SMs"
    pa = explain(oss.cross_entropy, x, t, target_gpu=A100)           # a GPU: one 8192-class chunk per row
    assert pa.path == "coop" and pa.chunks == 1 and pa.chunk == 8192 and pa.fast_exp
    assert explain(oss.cross_entropy, x, t, backend="triton", knobs=PATHS["split"]).chunks == 12


@pytest.mark.interpreter
def test_bound_kernels_keyed_by_integer_specialisation():
    """One plan serves rows of several strides (two passes of the same tiles): a bound kernel replays the variant
    Triton compiled at its first call, so each specialisation of the run-time integers (== 1, % 16) gets its own (on
    the H200 a kernel compiled for rows of 128256 replayed for rows of 50257 faulted)."""
    from onlinesoftmax._triton.host import int_spec
    from onlinesoftmax.losses import kernels as K

    knobs = CEKnobs(path="row", one_block=False, block=64)
    before = K._rows_launch.cache_info().misses
    for stride in (128, 130, 144):      # row strides 16-divisible, not, 16-divisible: two variants for V = 128
        x, t = _inputs(4, stride, ignore_every=0)
        xl = x.clone().requires_grad_()
        t %= 128
        loss = oss.cross_entropy(xl[:, :128], t, backend="triton", knobs=knobs)
        loss.backward()
        lr, gr = _ref(x[:, :128], t)
        assert _rel(loss, lr) < 2e-6 and _rel(xl.grad[:, :128], gr / 1.5) < 2e-5
        assert not xl.grad[:, 128:].any()
    assert K._rows_launch.cache_info().misses == before + 2
    assert int_spec(1, 16, 50257, -100, 0) == (1, 16, 0, 0, 16)


def test_smem_path_is_the_hopper_default_for_16_bit_rows_with_a_gradient():
    """sm_90, 16-bit rows cp.async can copy, a gradient to write, V >= SMEM_MIN_V: the shared-memory coop kernel;
    otherwise the paths before it (fp32, no gradient, small V, unaligned rows, another GPU, the interpreter)."""
    from onlinesoftmax.losses.plan import SMEM_MIN_V

    for V in (32000, 128256, 151936, 262144):
        assert plan_cross_entropy(CEProblem(8192, V, 2, True, smem_rows=True), H200).path == "smem", V
    assert plan_cross_entropy(CEProblem(8192, SMEM_MIN_V - 16, 2, True, smem_rows=True), H200).path != "smem"
    assert plan_cross_entropy(CEProblem(8192, 128256, 4, True, smem_rows=True), H200).path != "smem"
    assert plan_cross_entropy(CEProblem(8192, 128256, 2, False, smem_rows=True), H200).path != "smem"
    assert plan_cross_entropy(CEProblem(8192, 128256, 2, True, smem_rows=False), H200).path != "smem"
    assert plan_cross_entropy(CEProblem(8192, 128256, 2, True, smem_rows=True), A100).path != "smem"
    assert plan_cross_entropy(CEProblem(64, 128256, 2, True, smem_rows=True), INTERPRETER).path != "smem"


@pytest.mark.interpreter
def test_bound_call_cache_hits_misses_and_no_stale_state():
    """The eager call's plan and launches (``_bound_run``) are bound once per (rows, classes, dtype, row stride,
    alignment, device, options, knobs): a repeat hits and gives the same bits; every option change misses and is
    right; the workspace shared by the calls (coefficients, loss rows, lse) leaves nothing stale across shapes and
    options, and "none" returns a fresh tensor."""
    from onlinesoftmax.losses.cross_entropy import _bound_run

    knobs = CEKnobs(path="row")
    x, t = _inputs(9, 40)
    info = _bound_run.cache_info()
    a, ga = _run(x, t, backend="triton", knobs=knobs)
    b, gb = _run(x, t, backend="triton", knobs=knobs)
    assert torch.equal(a, b) and torch.equal(ga, gb)
    assert (_bound_run.cache_info().misses, _bound_run.cache_info().hits) == (info.misses + 1, info.hits + 1)
    cases = [dict(reduction="sum"), dict(reduction="none"), dict(ignore_index=3), dict(label_smoothing=0.1),
             dict(weight="rand"), dict(z_loss=1e-2, softcap=4.0)]
    for shape in ((9, 40), (3, 70), (12, 40)):          # scratch grown, reused by a smaller call, grown again
        x, t = _inputs(*shape)
        for kw in cases:
            kw = _opts(kw, shape[1])
            tk = torch.where(t == -100, kw.get("ignore_index", -100), t)
            before = _bound_run.cache_info().misses
            loss, g = _run(x, tk, backend="triton", knobs=knobs, **kw)
            assert _bound_run.cache_info().misses == before + 1
            lr, gr = _ref(x, tk, **kw)
            assert _rel(loss, lr) < 2e-6 and _rel(g, gr) < 2e-5, kw
    first = oss.cross_entropy(x, t, reduction="none", backend="triton", knobs=knobs)
    kept = first.clone()
    second = oss.cross_entropy(x * 2, t, reduction="none", backend="triton", knobs=knobs)
    assert torch.equal(first, kept) and not torch.equal(first, second)
    with torch.no_grad():                                # no gradient: its own entry (no dx written)
        before = _bound_run.cache_info().misses
        torch.testing.assert_close(oss.cross_entropy(x, t, backend="triton", knobs=knobs), a.new_tensor(
            ref.cross_entropy(x.double(), t).item()), rtol=2e-6, atol=0)
        assert _bound_run.cache_info().misses == before + 1


@pytest.mark.interpreter
def test_eager_call_matches_the_custom_op_bitwise():
    """The eager path (the bound call under an autograd.Function) and the custom op (torch.compile's) run the same
    kernels: the same loss and gradient bits."""
    x, t = _inputs(7, 300)
    for kw in (dict(), dict(reduction="sum", label_smoothing=0.1), dict(reduction="none", z_loss=1e-3)):
        loss, g = _run(x, t, backend="triton", **kw)
        xl = x.clone().requires_grad_()
        op = torch.ops.onlinesoftmax.cross_entropy(xl, t, None, kw.get("ignore_index", -100),
                                                   kw.get("reduction", "mean"), kw.get("label_smoothing", 0.0),
                                                   kw.get("z_loss", 0.0), None, True, "", 0, -1, 0, 0, -1, -1, -1)[0]
        (op.sum() * 1.5).backward()
        assert torch.equal(loss, op.detach()) and torch.equal(g, xl.grad), kw


@pytest.mark.parametrize("backend_device", [pytest.param("cpu", marks=pytest.mark.interpreter), "kernel"])
def test_opcheck(backend_device, kernel_device):
    """The forward op against its fake implementation (loss and the gradient it writes) for each reduction, with
    and without weight and a gradient; the in-place scale op too."""
    dev = kernel_device if backend_device == "kernel" else torch.device("cpu")
    x = torch.randn(6, 37, device=dev)
    t = torch.randint(0, 37, (6,), device=dev)
    t[2] = -100
    w = torch.rand(37, device=dev)
    for reduction, weight, need in (("mean", None, True), ("sum", w, True), ("none", None, False), ("mean", w, False)):
        torch.library.opcheck(torch.ops.onlinesoftmax.cross_entropy.default,
                              (x, t, weight, -100, reduction, 0.1, 1e-4, None, need, *CE._knob_args(CEKnobs())))
    torch.library.opcheck(torch.ops.onlinesoftmax.cross_entropy_scale_.default,
                          (x.clone(), torch.tensor(2.0, device=dev)))


@pytest.mark.interpreter
def test_double_backward_is_an_error_not_a_silent_zero():
    """create_graph=True through the Triton path (whose gradient the forward wrote: no graph to give) raises, naming
    the function; a gradient penalty lost its second-order term silently before. The torch path differentiates
    twice."""
    x, t = _inputs(4, 30, ignore_every=0)
    xl = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(oss.cross_entropy(xl, t, backend="torch"), xl, create_graph=True)
    (g * g).sum().backward()
    assert xl.grad.abs().sum() > 0
    xl = x.clone().requires_grad_()
    loss = oss.cross_entropy(xl, t, backend="triton")
    with pytest.raises(RuntimeError, match="cross_entropy: double backward"):
        torch.autograd.grad(loss, xl, create_graph=True)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_torch_func_grad_and_vmap(backend):
    """torch.func.grad / vmap take torch's ops (the custom op's autograd has no setup_context for functorch): the
    gradient as F.cross_entropy's."""
    x, t = _inputs(4, 6, ignore_every=0)
    want = torch.func.grad(lambda z: F.cross_entropy(z, t))(x)
    got = torch.func.grad(lambda z: oss.cross_entropy(z, t, backend=backend))(x)
    torch.testing.assert_close(got, want)
    per_row = torch.func.vmap(lambda z, y: oss.cross_entropy(z[None], y[None], backend=backend))(x, t)
    torch.testing.assert_close(per_row, F.cross_entropy(x, t, reduction="none"))
