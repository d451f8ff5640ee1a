"""SoftmaxState and its ⊕ fuzzed: from_tensor on any dim (special values, empty dims) against torch.logsumexp, the
documented laws on special states, and merges of states of different shapes, dtypes and devices."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from onlinesoftmax import SoftmaxState

inf, nan = float("inf"), float("nan")
VALUES = st.sampled_from([-inf, inf, nan, 0.0, -0.0, 1.0, -3.5, 80.0, -80.0, 1e30, -1e30])


def _states_equal(a: SoftmaxState, b: SoftmaxState) -> None:
    torch.testing.assert_close(a.m, b.m, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(a.d, b.d, equal_nan=True, rtol=1e-6, atol=0)


@given(st.lists(st.lists(VALUES, min_size=1, max_size=5), min_size=3, max_size=3))
def test_laws_on_special_states(rows):
    """⊕ is commutative and associative and (-inf, 0) is its identity on states holding -inf, +inf and NaN, and
    from_tensor is a homomorphism: the state of a concatenation is the ⊕ of the parts' states."""
    a, b, c = (SoftmaxState.from_tensor(torch.tensor(r, dtype=torch.float64)) for r in rows)
    e = SoftmaxState.identity(())
    _states_equal(a | b, b | a)
    _states_equal((a | b) | c, a | (b | c))
    _states_equal(a | e, a)
    _states_equal(e | a, a)
    whole = SoftmaxState.from_tensor(torch.tensor(rows[0] + rows[1] + rows[2], dtype=torch.float64))
    _states_equal(whole, a | b | c)
    _states_equal(whole, SoftmaxState.reduce([a, b, c]))
    ref = torch.logsumexp(torch.tensor(rows[0] + rows[1] + rows[2], dtype=torch.float64), 0)
    torch.testing.assert_close(whole.logsumexp(), ref, equal_nan=True)


@given(st.lists(st.sampled_from([0, 1, 3]), min_size=0, max_size=3), st.integers(-4, 3),
       st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]), st.integers(0, 999))
def test_from_tensor_on_any_dim(shape, dim, dtype, seed):
    """from_tensor along any dim (size-0 dims anywhere, 0-d tensors) gives torch.logsumexp's value and shape, in
    fp32 (fp64 for fp64); a dim out of range is an IndexError naming the method."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        with pytest.raises(IndexError, match="SoftmaxState.from_tensor: dim"):
            SoftmaxState.from_tensor(x, dim)
        return
    s = SoftmaxState.from_tensor(x, dim)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    want = torch.logsumexp(x.to(acc), dim)
    assert s.m.dtype == s.d.dtype == acc and s.m.shape == want.shape
    torch.testing.assert_close(s.logsumexp(), want)


def test_reduce_broadcasts_as_combine():
    """reduce([a, b]) is a | b for states whose shapes broadcast (identity(()) with a batch of states: torch.stack
    refused it), and names itself where they do not broadcast or its dim is out of range."""
    gen = torch.Generator().manual_seed(0)
    a = SoftmaxState.from_tensor(torch.randn(4, 6, generator=gen))
    b = SoftmaxState.from_tensor(torch.randn(1, 6, generator=gen))
    for parts in ([a, SoftmaxState.identity(())], [SoftmaxState.identity(()), a, b], [b, a]):
        want = parts[0]
        for p in parts[1:]:
            want = want | p
        _states_equal(SoftmaxState.reduce(parts), want)
    with pytest.raises(ValueError, match=r"SoftmaxState.reduce: the states' shapes \(4,\) and \(3,\)"):
        SoftmaxState.reduce([a, SoftmaxState.from_tensor(torch.randn(3, 6))])
    with pytest.raises(IndexError, match="SoftmaxState.reduce: dim=2"):
        SoftmaxState.reduce([a, a], 2)


def test_states_on_two_devices():
    """States on two devices are a ValueError naming the method and the devices (torch's own error named
    neither); a 0-d CPU state (the identity of shape ()) merges with states on any device, as torch's CPU
    scalars do."""
    cpu = SoftmaxState.from_tensor(torch.randn(3, 4))
    meta = SoftmaxState(torch.empty(3, device="meta"), torch.empty(3, device="meta"))
    with pytest.raises(ValueError, match=r"SoftmaxState.combine: the states are on different devices \(cpu, meta\)"):
        cpu | meta
    with pytest.raises(ValueError, match="SoftmaxState.reduce: the states are on different devices"):
        SoftmaxState.reduce([meta, cpu])
    for r in (meta | SoftmaxState.identity(()), SoftmaxState.identity(()) | meta,
              SoftmaxState.reduce([SoftmaxState.identity(()), meta])):
        assert r.m.device.type == "meta" and r.m.shape == (3,)


def test_mixed_dtypes_promote():
    """fp32 ⊕ fp64 promotes to fp64 as torch's elementwise ops, in combine and reduce alike."""
    a = SoftmaxState.from_tensor(torch.randn(2, 5))
    b = SoftmaxState.from_tensor(torch.randn(2, 5, dtype=torch.float64))
    assert (a | b).m.dtype == (b | a).d.dtype == SoftmaxState.reduce([a, b]).m.dtype == torch.float64
    _states_equal(SoftmaxState.reduce([a, b]), a | b)


def test_argument_errors_name_the_method():
    with pytest.raises(TypeError, match="SoftmaxState.from_tensor: x must be a torch.Tensor, got list"):
        SoftmaxState.from_tensor([1.0, 2.0])
    for bad in (torch.int32, torch.bool, "float32"):
        with pytest.raises(TypeError, match="SoftmaxState.identity: dtype must be a floating dtype"):
            SoftmaxState.identity(3, dtype=bad)
    e = SoftmaxState.identity((2, 3), dtype=torch.bfloat16)
    assert e.m.dtype == torch.bfloat16 and bool((e.m == -inf).all()) and bool((e.d == 0).all())
