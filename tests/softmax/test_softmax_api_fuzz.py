"""softmax / log_softmax / logsumexp against torch's functions as a demanding user calls them: dims given as torch
takes them, size-0 dims anywhere, keepdim, ``dtype=`` casts, special values, on both backends (``"triton"`` in the
interpreter at tiny sizes)."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import onlinesoftmax as oss
from onlinesoftmax.backend import interpret_mode

# the backends a CPU tensor runs on here: "triton" only under the interpreter (on a CUDA machine it is not set)
CPU_BACKENDS = ["torch", "triton"] if interpret_mode() else ["torch"]
BACKENDS = [pytest.param("torch"), pytest.param("triton", marks=pytest.mark.interpreter)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
inf, nan = float("inf"), float("nan")


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """a equals torch's b: shape, dtype, NaN where b is NaN, values to a few ulps of the output dtype (ours
    accumulates in fp32 as torch's CPU kernels do; the last rounding may differ)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    eps = torch.finfo(a.dtype).eps
    torch.testing.assert_close(a, b, rtol=4 * eps, atol=4 * eps, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dims_as_torch_takes_them(backend):
    """torch takes a NumPy integer or a 0-d integer tensor as a dim (``__index__``); so do these (they raised
    TypeError). bool, float and one-element 1-D tensors stay refused, as torch refuses them."""
    x = torch.randn(3, 4, 5)
    for d in (np.int64(1), np.int32(-1), torch.tensor(0), torch.tensor(-2, dtype=torch.int32)):
        for ours, theirs in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
            _same(ours(x, d, backend=backend), theirs(x, d))
        _same(oss.logsumexp(x, d, backend=backend), torch.logsumexp(x, int(d)))
        other = 1 if int(d) % 3 != 1 else 2
        _same(oss.logsumexp(x, (d, other), True, backend=backend), torch.logsumexp(x, (int(d), other), True))
        s = oss.SoftmaxState.from_tensor(x, d)
        torch.testing.assert_close(s.logsumexp(), torch.logsumexp(x, int(d)))
    for bad in (True, 1.0, torch.tensor([1]), torch.tensor(1.0), np.float64(1.0), "1", None):
        with pytest.raises(TypeError, match="softmax: dim must be an int"):
            oss.softmax(x, bad, backend=backend)
        with pytest.raises(TypeError, match="logsumexp: dim must be an int"):
            oss.logsumexp(x, (0, bad), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_keepdim_must_be_a_bool(backend):
    """torch refuses a keepdim that is not a bool; ours took any truthy value as True (``keepdim=None`` or
    ``"no"`` silently changed the result's shape)."""
    x = torch.randn(2, 3)
    for bad in (1, 0, None, "no", torch.tensor(True)):
        with pytest.raises(TypeError, match="logsumexp: keepdim must be a bool"):
            oss.logsumexp(x, -1, bad, backend=backend)
        with pytest.raises(TypeError, match="logsumexp: keepdim must be a bool"):
            oss.logsumexp(x, (0, 1), keepdim=bad, backend=backend)
    assert oss.logsumexp(x, -1, True, backend=backend).shape == (2, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_casts_an_input_the_kernels_do_not_read(backend):
    """``dtype=`` casts the input first, as torch: a float8 (or integer, bool) x with ``dtype=torch.float32``
    works (float8 raised: the cast was skipped for any floating x whose bits were fewer than dtype's)."""
    x = torch.randn(3, 7)
    for src in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int32, torch.bool):
        xs = x.to(src)
        for dtype in (torch.float32, torch.float16, torch.float64):
            for ours, theirs in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
                _same(ours(xs, -1, dtype=dtype, backend=backend), theirs(xs, -1, dtype=dtype))
        with pytest.raises(TypeError, match="softmax: x must have dtype"):
            oss.softmax(xs, -1, backend=backend)


@st.composite
def _problems(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 5]), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(DTYPES))
    dim = draw(st.integers(-ndim - 2, ndim + 1))
    seed = draw(st.integers(0, 2**16))
    special = draw(st.sampled_from([None, -inf, inf, nan]))
    return shape, dtype, dim, seed, special


def _input(shape, dtype, seed, special):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    if special is not None and x.numel():
        x.view(-1)[torch.randint(x.numel(), (max(1, x.numel() // 3),), generator=g)] = special
    return x.to(dtype)


@given(_problems(), st.sampled_from(CPU_BACKENDS), st.booleans())
def test_matches_torch_on_any_shape_dim_and_dtype(problem, backend, keepdim):
    """Shapes with size-0 dims in any position, 0-d tensors, dims in and out of range (IndexError, as torch),
    16-bit and fp64 inputs, rows holding -inf / +inf / NaN: each op returns torch's result (its shape, dtype and
    special values)."""
    shape, dtype, dim, seed, special = problem
    x = _input(shape, dtype, seed, special)
    rank = max(x.dim(), 1)
    for ours, theirs in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
        if not -rank <= dim < rank:
            with pytest.raises(IndexError, match=f"{ours.__name__}: dim={dim} is out of range"):
                ours(x, dim, backend=backend)
            continue
        _same(ours(x, dim, backend=backend), theirs(x, dim))
    if -rank <= dim < rank:
        _same(oss.logsumexp(x, dim, keepdim, backend=backend), torch.logsumexp(x.float(), dim, keepdim).to(dtype)
              if dtype != torch.float64 else torch.logsumexp(x, dim, keepdim))
    else:
        with pytest.raises(IndexError, match="logsumexp: dim"):
            oss.logsumexp(x, dim, keepdim, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_argument_on_special_rows(backend, dtype):
    """``dtype=`` every way between the four dtypes, along a strided dim, on rows of -inf, +inf, NaN, ±1e30 (inf in
    16 bits) and 65504: torch's result (a down-cast applied to the input first)."""
    x = torch.tensor([[1., 2., 3., 4.], [-inf] * 4, [nan, 1, 2, 3], [inf, 1, 2, 3], [inf, inf, -inf, 0],
                      [1e30, -1e30, 0, 0], [65504., 65504., 0, -65504.], [-inf, -inf, -inf, 7.]]).to(dtype)
    for xs, dim in ((x, -1), (x.t(), 0)):
        for out in DTYPES:
            for ours, theirs in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
                _same(ours(xs, dim, dtype=out, backend=backend), theirs(xs, dim, dtype=out))
