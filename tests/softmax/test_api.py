"""softmax / log_softmax / logsumexp, the public functions, against the fp64 references on every backend: shapes,
dims, strides, special values, dtype=, autograd, torch.compile, torch.vmap and torch.func; ``explain``.

Tolerance rule: see ``_helpers.assert_matches_low_precision_eager``.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import onlinesoftmax as oss
from onlinesoftmax.softmax import explain
from onlinesoftmax.softmax.plan import TORCH_PLAN, Knobs
from onlinesoftmax.target import H200

from ._helpers import BACKENDS, DEV, DTYPES, FNS, HAS_CUDA, assert_grad_like_eager, assert_matches_low_precision_eager


class OpLog(TorchDispatchMode):
    """The ops that reach the dispatcher's Python key, in order: (name, input shapes, output shape, output dtype).
    Our custom ops appear as ``onlinesoftmax.<op>.default`` (what runs inside them does not); eager calls without
    autograd call no custom op."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        tensor = isinstance(out, torch.Tensor)
        self.calls.append((str(func), shapes, tuple(out.shape) if tensor else None, out.dtype if tensor else None))
        return out

    def of(self, prefix):
        return [c for c in self.calls if c[0].startswith(prefix)]


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_layouts_without_a_row_view(backend):
    """Dims that fold into no (outer, inner) pair of strides: x and y are copied to rows and the result copied
    back into y, which keeps x's strides (the fake implementation's). A [B, S, H, D] tensor seen as [B, H, S, D]
    returned an unwritten y on the Triton path (softmax along D or B), as did channels_last along W or H."""
    from onlinesoftmax.softmax.geometry import row_geometry_of

    views = [(torch.randn(2, 5, 3, 7, device=DEV).transpose(1, 2), (3, 0)),
             (torch.randn(2, 3, 4, 5, device=DEV).to(memory_format=torch.channels_last), (3, 2)),
             (torch.randn(3, 4, 5, 6, device=DEV).permute(2, 0, 3, 1), (0, 1, 2, 3))]
    for x, dims in views:
        for dim in dims:
            if dim in (0, 3) and x.dim() == 4 and x.shape[1] == 3 and x.shape[2] == 5:
                assert row_geometry_of(x.shape, (x.stride(),), dim) is None      # the copy path runs
            for name, (fn, torch_fn, _) in FNS.items():
                out = fn(x, dim, backend=backend)
                assert_matches_low_precision_eager(name, out, x, dim)
                if name == "logsumexp":
                    continue
                assert out.stride() == x.stride(), (name, dim)
                g = torch.randn_like(x).transpose(0, 1).contiguous().transpose(0, 1)     # dy of other strides
                a = x.clone().requires_grad_()
                fn(a, dim, backend=backend).backward(g)
                e = x.double().requires_grad_()
                torch_fn(e, dim).backward(g.double())
                torch.testing.assert_close(a.grad.double(), e.grad, rtol=1e-5, atol=1e-6)
                assert a.grad.stride() == x.stride()


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    """The custom ops against their fake implementations and registered autograd (strides included), on a
    contiguous tensor and on layouts with and without a row view."""
    ops = torch.ops.onlinesoftmax
    for x in (torch.randn(3, 40, device=DEV), torch.randn(2, 5, 3, 7, device=DEV).transpose(1, 2),
              torch.randn(2, 3, 4, 5, device=DEV).to(memory_format=torch.channels_last)):
        for dim in (0, x.dim() - 1):
            for mode in (0, 1):
                torch.library.opcheck(ops.softmax.default, (x.clone().requires_grad_(), dim, mode, x.dtype, backend))
                y = ops.softmax(x, dim, mode, x.dtype, backend)
                torch.library.opcheck(ops.softmax_backward.default, (y, torch.randn_like(y), dim, mode == 1, x.dtype,
                                                                     backend))
            torch.library.opcheck(ops.logsumexp.default, (x.clone().requires_grad_(), dim, backend))


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


@pytest.mark.parametrize("grad", [False, True])
def test_logsumexp_kernel_writes_the_output_dtype(grad):
    """Eager logsumexp without autograd has the kernel write x's dtype (one launch, no cast: the suite measured
    the extra cast as 2-3 % of a 1 GiB bf16 call); with autograd the kernel writes fp32 for the backward (an lse
    rounded to bf16 would cost e^0.03 in every gradient) and the result is cast after."""
    x = torch.randn(6, 300, device=DEV).to(torch.bfloat16).requires_grad_(grad)
    with OpLog() as log:
        lse = oss.logsumexp(x, backend="triton")
    # what the kernel wrote: the [M] buffer the launch allocates (or, through the custom op, the op's output)
    written = [c[3] for c in log.calls if (c[0] == "aten.empty.memory_format" and c[2] == (6,))
               or c[0].startswith("onlinesoftmax.")]
    assert written == [torch.float32 if grad else torch.bfloat16], log.calls
    assert [c[3] for c in log.of("aten._to_copy")] == ([torch.bfloat16] if grad else [])
    assert lse.dtype == torch.bfloat16
    assert_matches_low_precision_eager("logsumexp", lse.detach(), x.detach(), -1)


# ---- autograd ---------------------------------------------------------------------------------------------
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


# ---- torch.vmap and torch.func --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bdim,dim", [(0, -1), (1, 0), (2, 1)])
def test_vmap_matches_a_loop(backend, bdim, dim):
    """torch.vmap runs the custom ops on the batched tensor (batch first, dim + 1), not through a per-sample loop,
    and not through the eager shortcut (which cannot read a BatchedTensor)."""
    x = torch.randn(3, 5, 33, device=DEV)
    x[1, 2] = -math.inf
    for name in FNS:
        got = torch.func.vmap(lambda r: FNS[name][0](r, dim, backend=backend), in_dims=bdim)(x)
        expect = torch.stack([FNS[name][1](x.select(bdim, i), dim) for i in range(x.shape[bdim])])
        torch.testing.assert_close(got, expect, equal_nan=True)
    with OpLog() as log:                    # the op, whichever backend: x's shape per call
        torch.func.vmap(lambda r: oss.softmax(r, dim, backend=backend), in_dims=bdim)(x)
    batched = (x.shape[bdim],) + tuple(n for i, n in enumerate(x.shape) if i != bdim)
    assert [c[1][0] for c in log.of("onlinesoftmax.")] == [batched]      # one batched call
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
    with OpLog() as log:                # and the forward is our op (once), not a fallback
        torch.func.grad(loss(lambda x: ours(x, 1, backend=backend)))(x)
    op = "onlinesoftmax.logsumexp" if name == "logsumexp" else "onlinesoftmax.softmax"
    assert [c[0] for c in log.of("onlinesoftmax.")] == [op + ".default"]


# ---- explain: the plan a call runs --------------------------------------------------------------------------
def test_explain_portable_path_and_arguments():
    """The portable path, empty and 0-d tensors and logsumexp's backward (torch ops) give TORCH_PLAN; an unknown
    op is an error, and explain checks its arguments as the public functions do."""
    x = torch.randn(8, 100, device=DEV)
    assert explain(x, backend="torch") == TORCH_PLAN
    if not HAS_CUDA:
        assert explain(x) == TORCH_PLAN                         # backend=None on the CPU: the torch path
    for t in (torch.empty(0, 5, device=DEV), torch.tensor(1.0, device=DEV)):
        assert explain(t, backend="triton") == TORCH_PLAN
        assert explain(t, target=H200) == TORCH_PLAN
    assert explain(x, op="logsumexp", grad=True, backend="triton") == TORCH_PLAN
    assert explain(x, backend="triton").path == "rows"
    assert explain(x, op="log_softmax", grad=True, backend="triton").path == "rows"
    with pytest.raises(ValueError, match="op must be one of"):
        explain(x, op="softmax_backward")
    with pytest.raises(IndexError, match="dim=2"):
        explain(x, 2, backend="triton")
    with pytest.raises(TypeError, match="dtype must be"):
        explain(x, dtype=torch.int32, backend="triton")


def test_explain_knobs():
    """explain passes knobs to the plan as the tools do; Knobs.of refuses a misspelled knob."""
    x = torch.empty(2048, 131072, device="meta")
    assert (explain(x, target=H200).path, explain(x, target=H200).kernel) == ("coop", "smem")
    assert explain(x, target=H200, knobs=Knobs.of(path="split")).path == "split"
    assert explain(x, target=H200, knobs=Knobs.of(path="coop", smem=False)).kernel == "chunks"
    assert explain(x, target=H200, knobs=Knobs.of(num_warps=2)).num_warps == 2
    with pytest.raises(TypeError):
        Knobs.of(chunks=3)                  # the knob is `chunk`
    assert Knobs.of(chunk=3) == Knobs(chunk=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_over_several_dims(backend):
    """A tuple or list of dims as torch.logsumexp takes them: values, keepdim, gradients, empty dims; errors."""
    x = torch.randn(3, 4, 5, 6, device=DEV)
    for dims in ((0, 2), [3, 1], (-1, 0, 1), (2,), (0, 1, 2, 3)):
        for keepdim in (False, True):
            xr = x.clone().requires_grad_()
            out = oss.logsumexp(xr, dims, keepdim, backend=backend)
            want = torch.logsumexp(x.double(), dims, keepdim)
            assert out.shape == want.shape
            torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)
            g = torch.randn_like(out)
            out.backward(g)
            xd = x.double().requires_grad_()
            torch.logsumexp(xd, dims, keepdim).backward(g.double())
            torch.testing.assert_close(xr.grad.double(), xd.grad, rtol=1e-5, atol=1e-7)
    assert oss.logsumexp(torch.randn(0, 3, device=DEV), (0,), backend=backend).tolist() == [-math.inf] * 3
    assert oss.logsumexp(torch.tensor(2.0, device=DEV), (0,), backend=backend).item() == 2.0
    with pytest.raises(ValueError, match="logsumexp: dim .* more than once"):
        oss.logsumexp(x, (0, -4), backend=backend)
    with pytest.raises(ValueError, match="at least one"):
        oss.logsumexp(x, (), backend=backend)
    with pytest.raises(IndexError, match="logsumexp: dim"):
        oss.logsumexp(x, (0, 4), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_dims_with_an_empty_kept_dim(backend):
    """A tuple of dims where a dim not reduced has size 0: an empty result, as torch (the rows' reshape took -1,
    ambiguous over no elements)."""
    for shape, dims in (((0, 3, 4), (1, 2)), ((3, 0, 4), (0, 2)), ((2, 0, 4, 5), (0, 3))):
        x = torch.randn(shape, device=DEV)
        for keepdim in (False, True):
            got = oss.logsumexp(x, dims, keepdim, backend=backend)
            assert got.shape == torch.logsumexp(x, dims, keepdim).shape


def test_logsumexp_over_several_dims_compiles():
    """A tuple of dims under torch.compile(fullgraph=True) (the dims' product was a generator dynamo refused)."""
    x = torch.randn(3, 4, 5, device=DEV)
    f = torch.compile(lambda t: oss.logsumexp(t, (0, 2)), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(x), torch.logsumexp(x, (0, 2)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_upcast_to_fp64_gradient(fn, backend):
    """``dtype=torch.float64`` of a bf16 / fp16 x: the gradient in x's dtype, as torch's (the kernels' dx is fp64,
    rounded once after; the interpreter's fp64 -> bf16 store gave zeros)."""
    for dt in (torch.bfloat16, torch.float16):
        x = torch.randn(3, 40, device=DEV).to(dt).requires_grad_()
        g = torch.randn(3, 40, device=DEV, dtype=torch.float64)
        got = torch.autograd.grad(getattr(oss, fn)(x, -1, torch.float64, backend=backend), x, g)[0]
        want = torch.autograd.grad(getattr(torch, fn)(x, -1, dtype=torch.float64), x, g)[0]
        assert got.dtype == dt
        torch.testing.assert_close(got, want)
