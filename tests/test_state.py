"""The (m, d) state: ⊕ is associative, commutative, has identity (-inf, 0), and agrees with fp64 logsumexp."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from onlinesoftmax import SoftmaxState
from onlinesoftmax.state import _rescale

finite = st.floats(min_value=-80.0, max_value=80.0, allow_nan=False, allow_infinity=False, width=64)
value = st.one_of(finite, st.just(-math.inf))
rows = st.lists(value, min_size=0, max_size=40)


def state_of(values) -> SoftmaxState:
    return SoftmaxState.from_tensor(torch.tensor(values, dtype=torch.float64), dim=-1)


def broken_combine(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """The seed's Q2 mistake: m updated, d not rescaled."""
    return SoftmaxState(torch.maximum(a.m, b.m), a.d + b.d)


def assert_same_state(a: SoftmaxState, b: SoftmaxState):
    # Compare through logsumexp, and m exactly: equal states may differ in d only by rounding.
    assert torch.equal(a.m, b.m), (a, b)
    torch.testing.assert_close(a.logsumexp(), b.logsumexp(), rtol=1e-12, atol=1e-12)


def check_associative(combine, a, b, c):
    assert_same_state(combine(combine(a, b), c), combine(a, combine(b, c)))


def check_commutative(combine, a, b):
    assert_same_state(combine(a, b), combine(b, a))


def check_split(combine, values, cut):
    """Splitting a row anywhere and merging the halves gives the row's fp64 logsumexp."""
    merged = combine(state_of(values[:cut]), state_of(values[cut:]))
    ref = np.logaddexp.reduce(np.asarray(values, dtype=np.float64)) if values else -np.inf
    lse = merged.logsumexp().item()
    assert not math.isnan(lse)
    if math.isinf(ref):
        assert lse == ref
    else:
        assert lse == pytest.approx(ref, rel=1e-12, abs=1e-12)


@given(rows, rows, rows)
def test_associative(x, y, z):
    check_associative(SoftmaxState.combine, state_of(x), state_of(y), state_of(z))


@given(rows, rows)
def test_commutative(x, y):
    check_commutative(SoftmaxState.combine, state_of(x), state_of(y))


@given(rows)
def test_identity(x):
    s = state_of(x)
    e = SoftmaxState.identity((), dtype=torch.float64)
    for r in (s.combine(e), e.combine(s)):
        assert_same_state(r, s)
        assert not torch.isnan(r.d).any()


@given(rows, st.data())
def test_split_agrees_with_fp64_logsumexp(x, data):
    cut = data.draw(st.integers(min_value=0, max_value=len(x)))
    check_split(SoftmaxState.combine, x, cut)


@given(st.lists(finite, min_size=1, max_size=64), st.data())
def test_many_chunks_agree_with_torch(x, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(x)), max_size=6)))
    bounds = [0, *cuts, len(x)]
    s = SoftmaxState.identity((), dtype=torch.float64)
    for lo, hi in zip(bounds, bounds[1:]):
        s = s | state_of(x[lo:hi])
    expect = torch.logsumexp(torch.tensor(x, dtype=torch.float64), dim=0)
    torch.testing.assert_close(s.logsumexp(), expect, rtol=1e-12, atol=1e-12)


def test_broken_combine_is_caught():
    """The property checks above fail for the classic mistake of not rescaling d."""
    with pytest.raises(AssertionError):
        check_split(broken_combine, [1.0, 2.0, 3.0], 2)
    with pytest.raises(AssertionError):
        check_split(broken_combine, [7.0, 0.5], 1)


def test_seed_worked_example():
    """Seed 003: (2, 1.367879) ⊕ (3, 1) = (3, 1.503214)."""
    s = state_of([1.0, 2.0]) | state_of([3.0])
    assert s.m.item() == 3.0
    assert s.d.item() == pytest.approx(math.exp(-2) + math.exp(-1) + 1, rel=1e-12)


def test_identity_combinations_never_nan():
    e = SoftmaxState.identity((3,), dtype=torch.float32)
    r = e | e
    assert torch.equal(r.m, e.m) and torch.equal(r.d, e.d)
    assert r.logsumexp().eq(-math.inf).all()
    neg = state_of([-math.inf, -math.inf])
    assert (neg | e).logsumexp().eq(-math.inf).all()
    assert not torch.isnan((neg | e).d).any()


def test_special_values_match_torch():
    cases = [[math.inf, 1.0], [math.inf, math.inf], [math.nan, 1.0], [-math.inf], [], [5.0, -math.inf]]
    for v in cases:
        t = torch.tensor(v, dtype=torch.float64)
        got = SoftmaxState.from_tensor(t).logsumexp()
        torch.testing.assert_close(got, torch.logsumexp(t, dim=0), equal_nan=True)


def test_rescale_rule():
    m = torch.tensor([-math.inf, math.inf, 1.0])
    assert torch.equal(_rescale(m, m), torch.ones(3))


def test_batched_dims_and_dtypes():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    for dim in (0, 1, 2, -1):
        s = SoftmaxState.from_tensor(x, dim=dim)
        assert s.m.dtype == torch.float32
        torch.testing.assert_close(s.logsumexp(), torch.logsumexp(x.float(), dim=dim), rtol=1e-6, atol=1e-6)
    # reduce over a stack of states = sequential ⊕
    parts = [SoftmaxState.from_tensor(c, -1) for c in x.float().split(2, dim=-1)]
    stacked = SoftmaxState.reduce(
        SoftmaxState(torch.stack([p.m for p in parts]), torch.stack([p.d for p in parts])))
    torch.testing.assert_close(stacked.logsumexp(), torch.logsumexp(x.float(), -1), rtol=1e-6, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(IndexError, match="dim=3"):
        SoftmaxState.from_tensor(torch.zeros(2, 2), dim=3)
    with pytest.raises(TypeError, match="floating"):
        SoftmaxState.from_tensor(torch.zeros(2, dtype=torch.int64))


def test_combine_shapes_broadcast_or_raise():
    a = SoftmaxState.from_tensor(torch.randn(3, 10))
    b = SoftmaxState.from_tensor(torch.randn(1, 10))                # shape (1,): broadcasts
    torch.testing.assert_close((a | b).logsumexp(), torch.logaddexp(a.logsumexp(), b.logsumexp()))
    torch.testing.assert_close((a | SoftmaxState.identity(())).logsumexp(), a.logsumexp())
    with pytest.raises(ValueError, match=r"SoftmaxState.combine: the states' shapes \(3,\) and \(2,\)"):
        a | SoftmaxState.from_tensor(torch.randn(2, 10))
    with pytest.raises(TypeError, match="SoftmaxState.combine: other"):
        a.combine(torch.randn(3))


def test_reduce_takes_a_sequence_and_plus_is_refused():
    """``reduce([s1, s2])`` merges a list of states (it used to fail unpacking it); ``s + s`` used to return a
    4-tuple (NamedTuple concatenation) and now says what to use instead."""
    gen = torch.Generator().manual_seed(3)
    a, b, c = (SoftmaxState.from_tensor(torch.randn(4, 9, generator=gen)) for _ in range(3))
    r = SoftmaxState.reduce([a, b, c])
    want = a | b | c
    torch.testing.assert_close(r.m, want.m)
    torch.testing.assert_close(r.d, want.d)
    with pytest.raises(TypeError, match=r"a \| b"):
        a + b
    with pytest.raises(TypeError):
        a * 2
    with pytest.raises(ValueError, match="no states"):
        SoftmaxState.reduce([])
    with pytest.raises(TypeError, match="sequence of SoftmaxState"):
        SoftmaxState.reduce([a.m, a.d, b.m])


def test_reduce_of_an_empty_stack_and_named_dim_errors():
    """A stack of no states reduces to the identity (as ``from_tensor`` of an empty dim); a scalar state to
    itself; a bad dim names the method."""
    empty = SoftmaxState(torch.empty(0, 3), torch.empty(0, 3))
    r = SoftmaxState.reduce(empty, 0)
    assert torch.equal(r.m, torch.full((3,), float("-inf"))) and torch.equal(r.d, torch.zeros(3))
    one = SoftmaxState(torch.tensor(1.0), torch.tensor(2.0))
    r = SoftmaxState.reduce(one, 0)
    assert r.m.item() == 1.0 and r.d.item() == 2.0
    with pytest.raises((IndexError, ValueError), match="SoftmaxState.reduce: dim"):
        SoftmaxState.reduce(SoftmaxState.from_tensor(torch.randn(4, 5)), 3)
    with pytest.raises((IndexError, ValueError), match="SoftmaxState.from_tensor: dim"):
        SoftmaxState.from_tensor(torch.randn(3), 5)
