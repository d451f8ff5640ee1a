"""softmax_topk and sample fuzzed as a demanding PyTorch user calls them: k and dim as torch takes them, special
rows against torch.topk / torch.softmax / torch.logsumexp, and the Python parameters' edges (``uniform`` near 1)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import onlinesoftmax as oss
from onlinesoftmax.backend import interpret_mode

BACKENDS = [pytest.param("torch"), pytest.param("triton", marks=pytest.mark.interpreter)]
CPU_BACKENDS = ["torch", "triton"] if interpret_mode() else ["torch"]
inf, nan = float("inf"), float("nan")


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_and_dim_as_torch_takes_them(backend):
    """A NumPy integer or a 0-d integer tensor for k and dim, as torch.topk takes them (they raised TypeError:
    sample already took a NumPy top_k); bool and float refused on every path (the Triton 2-D path took
    ``dim=1.0`` and ``dim=True`` as 1)."""
    x = torch.randn(3, 9)
    for bad in (1.0, True, torch.tensor(1.0), None):
        with pytest.raises(TypeError, match="softmax_topk: dim must be an int"):
            oss.softmax_topk(x, 2, bad, backend=backend)
    for bad in (2.0, True, torch.tensor(2.0), torch.tensor(True), "2"):
        with pytest.raises(TypeError, match="softmax_topk: k must be an int"):
            oss.softmax_topk(x, bad, backend=backend)
    want = oss.softmax_topk(x, 4, 1, backend=backend)
    for k in (np.int64(4), torch.tensor(4), torch.tensor(4, dtype=torch.int32)):
        for dim in (np.int64(1), np.int32(-1), torch.tensor(-1)):
            got = oss.softmax_topk(x, k, dim, backend=backend)
            assert torch.equal(got.indices, want.indices) and torch.equal(got.values, want.values)


def _rows(seed, special, dtype, shape):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).float()        # small ints: many ties
    if special:
        flat = x.view(-1)
        flat[torch.randint(flat.numel(), (max(1, flat.numel() // 4),), generator=g)] = special
    return x.to(dtype)


@settings(max_examples=20)     # the interpreter's top-k takes ~0.3 s a call
@given(st.integers(0, 999), st.sampled_from([None, -inf, inf, nan]),
       st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
       st.sampled_from([(4, 7), (2, 3, 5), (6,), (1, 1)]), st.data())
def test_matches_torch_on_special_rows(seed, special, dtype, shape, data):
    """Against torch on rows with ties, -inf, +inf and NaN, any dim: the values at the indices are torch.topk's
    values (NaN first), ties to the lower index, indices int64, values torch.softmax's there and lse
    torch.logsumexp's (fp32, computed from the fp32 logits)."""
    backend = data.draw(st.sampled_from(CPU_BACKENDS))
    x = _rows(seed, special, dtype, shape)
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1))
    k = data.draw(st.integers(1, x.shape[dim]))
    r = oss.softmax_topk(x, k, dim, backend=backend)
    assert r.values.dtype == r.lse.dtype == torch.float32 and r.indices.dtype == torch.int64
    xf = x.float()
    tv = torch.topk(xf, k, dim).values
    at = xf.gather(dim, r.indices)
    assert torch.equal(torch.isnan(at), torch.isnan(tv))
    assert torch.equal(at.nan_to_num(0.0), tv.nan_to_num(0.0))
    # ties: among equal values, the indices ascend
    tied = (at.narrow(dim, 1, k - 1) == at.narrow(dim, 0, k - 1)) | (at.narrow(dim, 1, k - 1).isnan()
                                                                     & at.narrow(dim, 0, k - 1).isnan())
    assert bool((r.indices.narrow(dim, 1, k - 1) > r.indices.narrow(dim, 0, k - 1))[tied].all())
    torch.testing.assert_close(r.values, torch.softmax(xf, dim).gather(dim, r.indices), equal_nan=True)
    torch.testing.assert_close(r.lse, torch.logsumexp(xf, dim), equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_uniform_is_checked_as_given(backend):
    """A Python ``uniform`` is checked in [0, 1) as given: 1 − 1e-12 was rounded to fp32's 1.0 first and refused,
    and a bad value was quoted rounded (-0.10000000149...). Near 1 it draws the last kept token in index order."""
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    for kw in ({}, {"top_k": 2}, {"top_p": 0.8}):
        ids, logp = oss.sample(x, uniform=1 - 1e-12, backend=backend, **kw)
        near = oss.sample(x, uniform=torch.tensor([1 - 2**-24] * 2), backend=backend, **kw)
        assert torch.equal(ids, near[0]) and torch.isfinite(logp).all()
    for bad in (1.0, -0.1, 1 + 1e-12, nan):
        with pytest.raises(ValueError, match=rf"sample: uniform must be in \[0, 1\) on every row, got \[{bad}\]"):
            oss.sample(x, uniform=bad, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_on_special_rows_and_parameters(backend):
    """Rows with no distribution (all -inf, a NaN, a +inf) give -1 / NaN whatever the filters, greedy or not; a row
    with one finite entry gives it with log-probability 0; 16-bit and fp64 logits agree with fp32's."""
    X = torch.tensor([[-inf] * 5, [-inf, -inf, 3.0, -inf, -inf], [inf, 0, 0, 0, 0], [nan, 0, 0, 0, 0],
                      [1.0, 1.0, 1.0, 1.0, 1.0], [inf, inf, 0, 0, 0]])
    every = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    for i, kw in enumerate(({}, {"temperature": 0.0}, {"temperature": 1e-30}, {"temperature": 1e30}, {"top_k": 2},
               {"top_k": 10**9}, {"top_p": 1e-9}, {"top_p": 1.0}, {"min_p": 1.0}, {"min_p": 0.0},
               {"top_k": torch.tensor([0, 1, 2, 5, 6, -1])}, {"temperature": torch.tensor([0.0, 1, 0, 1, 0, 1])})):
        # under the interpreter (seconds a call) every dtype on one parameter set, fp32 on five more
        if backend != "torch" and i not in (0, 1, 4, 6, 10, 11):
            continue
        for dtype in every if backend == "torch" or i == 0 else every[:1]:
            ids, logp = oss.sample(X.to(dtype), uniform=0.3, backend=backend, **kw)
            assert ids.dtype == torch.int64 and logp.dtype == torch.float32
            assert ids[[0, 2, 3, 5]].eq(-1).all() and logp[[0, 2, 3, 5]].isnan().all(), (kw, dtype)
            assert ids[1] == 2 and logp[1] == 0, (kw, dtype)
            assert 0 <= ids[4] < 5 and torch.isfinite(logp[4]), (kw, dtype)
