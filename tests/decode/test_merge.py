"""merge_attention_states: the ⊕ laws (identity, both empty, commutativity, split of the keys), dtypes, leading
shapes, autograd; the torch path and the Triton kernel (interpreter on CPU)."""

import pytest
import torch
from decode_inputs import make_cache

import onlinesoftmax as oss
from onlinesoftmax.reference import decode as ref

BACKENDS = ["torch", "triton"]
INF = float("inf")


def _states(shape, dtype, device):
    o = torch.randn(shape, device=device).to(dtype)
    lse = torch.randn(shape[:-1], device=device) * 3
    return o, lse


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(backend, dtype, kernel_device):
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    oa, la = _states((2, 3, 5, 40), dtype, dev)
    ob, lb = _states((2, 3, 5, 40), dtype, dev)
    o, lse = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
    ro, rl = ref.merge_attention_states(oa, la, ob, lb)
    assert o.dtype == dtype and lse.dtype == torch.float32 and o.shape == oa.shape and lse.shape == la.shape
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_and_empty(backend, kernel_device):
    """An empty side (lse -inf, o NaN or anything) gives the other side back bit for bit; both empty: 0, -inf."""
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    oa, la = _states((4, 3, 24), torch.bfloat16, dev)
    ob, lb = _states((4, 3, 24), torch.bfloat16, dev)
    lb[0] = -INF
    ob[0] = float("nan")
    la[1] = -INF
    oa[1] = float("nan")
    la[2, 1] = lb[2, 1] = -INF
    oa[2, 1] = ob[2, 1] = float("nan")
    o, lse = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert torch.equal(o[0], oa[0]) and torch.equal(lse[0], la[0])
    assert torch.equal(o[1], ob[1]) and torch.equal(lse[1], lb[1])
    assert (o[2, 1] == 0).all() and lse[2, 1] == -INF


@pytest.mark.parametrize("backend", BACKENDS)
def test_commutative(backend, kernel_device):
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    oa, la = _states((7, 64), torch.float32, dev)
    ob, lb = _states((7, 64), torch.float32, dev)
    o1, l1 = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
    o2, l2 = oss.merge_attention_states(ob, lb, oa, la, backend=backend)
    torch.testing.assert_close(o1, o2, rtol=1e-6, atol=1e-7)
    assert torch.equal(l1, l2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_shapes_and_strides(backend, kernel_device):
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    for shape in [(16,), (1, 16), (2, 1, 3, 4, 300)]:
        oa, la = _states(shape, torch.float32, dev)
        ob, lb = _states(shape, torch.float32, dev)
        o, lse = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
        ro, rl = ref.merge_attention_states(oa, la, ob, lb)
        torch.testing.assert_close(o.double(), ro, rtol=1e-6, atol=1e-6)
    big = torch.randn(3, 8, 2, 32, device=dev)          # o of a [B, S, H, D] buffer viewed as [B, H, S, D]
    oa = big.transpose(1, 2)
    ob = torch.randn(3, 2, 8, 32, device=dev)
    la, lb = torch.randn(3, 8, 2, device=dev).transpose(1, 2), torch.randn(3, 2, 8, device=dev)
    o, lse = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
    ro, rl = ref.merge_attention_states(oa, la, ob, lb)
    torch.testing.assert_close(o.double(), ro, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_agrees_with_attention_over_a_split_of_the_keys(backend, kernel_device):
    """Attention over keys [0, a) ⊕ attention over [a, L) = attention over [0, L) (non-causal: cascade)."""
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    B, H, Hkv, D, L, a = 2, 4, 2, 32, 45, 19
    k, v, lens, _ = make_cache(B, Hkv, D, [L, L], L, torch.float32, dev)
    q = torch.randn(B, H, 1, D, device=dev)
    full = oss.attention_with_kvcache(q, k, v, lens, causal=False, return_lse=True, backend=backend)
    pre = oss.attention_with_kvcache(q, k[:, :, :a], v[:, :, :a], torch.full_like(lens, a), causal=False,
                                     return_lse=True, backend=backend)
    suf = oss.attention_with_kvcache(q, k[:, :, a:], v[:, :, a:], torch.full_like(lens, L - a), causal=False,
                                     return_lse=True, backend=backend)
    o, lse = oss.merge_attention_states(*pre, *suf, backend=backend)
    torch.testing.assert_close(o, full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, full[1], rtol=1e-6, atol=1e-6)


def test_autograd_against_reference():
    """Gradients to o_a, lse_a, o_b, lse_b against autograd through the fp64 reference (one side partly empty)."""
    oa, la = _states((3, 5, 8), torch.float64, "cpu")
    ob, lb = _states((3, 5, 8), torch.float64, "cpu")
    lb[0, :2] = -INF
    ins = [t.clone().requires_grad_() for t in (oa, la, ob, lb)]
    o, lse = oss.merge_attention_states(*ins)
    go, gl = torch.randn_like(o), torch.randn_like(lse)
    grads = torch.autograd.grad((o * go).sum() + (lse * gl).sum(), ins)
    rins = [t.clone().requires_grad_() for t in (oa, la, ob, lb)]
    ro, rl = ref.merge_attention_states(*rins)
    rgrads = torch.autograd.grad((ro * go).sum() + (rl * gl).sum(), rins)
    for g, r in zip(grads, rgrads):
        r = torch.nan_to_num(r, nan=0.0)
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_autograd_through_kernel_fp32(kernel_device):
    oa, la = _states((4, 16), torch.float32, kernel_device)
    ob, lb = _states((4, 16), torch.float32, kernel_device)
    ins = [t.clone().requires_grad_() for t in (oa, la, ob, lb)]
    o, lse = oss.merge_attention_states(*ins, backend="triton")
    (o.sum() + lse.sum()).backward()
    rins = [t.double().requires_grad_() for t in (oa, la, ob, lb)]
    ro, rl = ref.merge_attention_states(*rins)
    (ro.sum() + rl.sum()).backward()
    for t, r in zip(ins, rins):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_func_transforms(backend, kernel_device):
    """torch.func.grad / jacrev raised torch's "an autograd.Function with functorch transforms ... must override the
    setup_context staticmethod" (the op's registered autograd); vmap and jvp on the Triton path "Cannot access
    storage of BatchedTensorImpl / TensorWrapper". Under torch.func the ⊕ runs in torch ops, as the reference."""
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    oa, la = _states((3, 5, 8), torch.float32, dev)
    ob, lb = _states((3, 5, 8), torch.float32, dev)
    f = lambda *s: oss.merge_attention_states(*s, backend=backend)        # noqa: E731
    r = ref.merge_attention_states
    for got, want in zip(torch.func.vmap(f)(oa, la, ob, lb), f(oa, la, ob, lb)):
        torch.testing.assert_close(got, want)
    grad = lambda m: torch.func.grad(lambda a, l: (m(a, l, ob, lb)[0] ** 2).sum(), argnums=(0, 1))(oa, la)  # noqa
    for got, want in zip(grad(f), grad(r)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    jac = lambda m: torch.func.jacrev(lambda lse: m(oa, lse, ob, lb)[1])(la)       # noqa: E731
    torch.testing.assert_close(jac(f), jac(r), rtol=1e-5, atol=1e-6)
    jvp = lambda m: torch.func.jvp(lambda o: m(o, la, ob, lb)[0], (oa,), (torch.ones_like(oa),))[1]  # noqa: E731
    torch.testing.assert_close(jvp(f), jvp(r), rtol=1e-5, atol=1e-6, check_dtype=False)    # the reference: fp64


def test_errors():
    o, lse = _states((2, 3, 8), torch.float32, "cpu")
    with pytest.raises(ValueError, match="shape"):
        oss.merge_attention_states(o, lse, o[:1], lse[:1])
    with pytest.raises(ValueError, match="lse_b"):
        oss.merge_attention_states(o, lse, o, lse[:, :1])
    with pytest.raises(TypeError, match="o_a"):
        oss.merge_attention_states(o.int(), lse, o, lse)


def test_compile_fullgraph():
    oa, la = _states((2, 3, 8), torch.float32, "cpu")
    ob, lb = _states((2, 3, 8), torch.float32, "cpu")
    f = torch.compile(lambda *a: oss.merge_attention_states(*a), fullgraph=True, backend="aot_eager")
    o, lse = f(oa, la, ob, lb)
    ro, rl = oss.merge_attention_states(oa, la, ob, lb)
    torch.testing.assert_close(o, ro)
    torch.testing.assert_close(lse, rl)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend, kernel_device):
    """The op against its fake implementation (contiguous o and lse, whatever the inputs' strides: the torch path
    returned o_a's transposed strides where the fake promised them and the kernel wrote contiguous ones) and its
    registered autograd."""
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    oa = torch.randn(2, 3, 5, 8, device=dev).transpose(1, 2)
    la = torch.randn(2, 3, 5, device=dev).transpose(1, 2)
    ob, lb = _states((2, 5, 3, 8), torch.float32, dev)
    for args in ((oa, la, ob, lb), (ob, lb, oa, la), (oa.contiguous(), la.contiguous(), ob, lb)):
        torch.library.opcheck(torch.ops.onlinesoftmax.merge_attention_states.default,
                              (*(t.clone().requires_grad_() for t in args), backend))
        o, lse = oss.merge_attention_states(*args, backend=backend)
        assert o.is_contiguous() and lse.is_contiguous()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_large_lse_weights_from_the_difference(backend, kernel_device):
    """|lse| ~ 1e7: the merged lse rounded to fp32 is off by up to half an ulp (0.5), so weights e^(lse_x − lse)
    were off by e^(±0.5) (o of two equal sides 0.74 or 2.0 instead of 1; d o / d o_a 0.37 instead of 0.5); the
    weights now come from lse_a − lse_b, as the kernel forms them."""
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    for L in (1e4, 1e7, 3e7, -3e7):
        oa = torch.randn(3, 8, device=dev).requires_grad_()
        ob = torch.randn(3, 8, device=dev).requires_grad_()
        la = torch.full((3,), L, device=dev)
        lb = la + torch.tensor([0.0, 4.0, -4.0], device=dev)      # exact in fp32 at these magnitudes
        o, lse = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
        w = torch.sigmoid(torch.tensor([0.0, -4.0, 4.0], dtype=torch.float64)).to(dev)   # weight of side a
        want = w[:, None] * oa.double() + (1 - w[:, None]) * ob.double()
        torch.testing.assert_close(o.double(), want, rtol=1e-6, atol=1e-6)
        o.sum().backward()
        torch.testing.assert_close(oa.grad.double(), w[:, None].expand(3, 8), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_lse_give_nan(backend, kernel_device):
    """A NaN or +inf lse on either side: o NaN on both backends (the torch path's where() turned the NaN weights into
    o = 0, a corrupted state merged away silently); −inf stays the empty side."""
    o = torch.randn(4, 2, device=kernel_device)
    la = torch.tensor([float("nan"), float("inf"), float("inf"), float("-inf")], device=kernel_device)
    lb = torch.tensor([0.0, 0.0, float("inf"), 0.5], device=kernel_device)
    mo, ml = oss.merge_attention_states(o, la, o * 2, lb, backend=backend)
    assert mo[:3].isnan().all() and ml[0].isnan() and (ml[1:3] == float("inf")).all()
    torch.testing.assert_close(mo[3], o[3] * 2)
