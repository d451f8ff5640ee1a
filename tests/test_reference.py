"""The seeds' algorithms (reference/) agree with each other and with torch in fp64."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from onlinesoftmax import reference as ref

ALGOS = {
    "naive": ref.naive_softmax,
    "safe": ref.safe_softmax,
    "online": ref.online_softmax,
    "chunked": lambda x, axis=-1: ref.chunked_online_softmax(x, chunk_size=3, axis=axis),
}


def torch_softmax(x, axis=-1):
    return torch.softmax(torch.as_tensor(x, dtype=torch.float64), dim=axis).numpy()


@pytest.mark.parametrize("name", sorted(ALGOS))
@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((3, 5, 6), 1), ((9,), 0), ((2, 1823), -1)])
def test_matches_torch_fp64(name, shape, axis):
    x = np.random.default_rng(0).standard_normal(shape) * 4
    np.testing.assert_allclose(ALGOS[name](x, axis=axis), torch_softmax(x, axis), rtol=1e-13, atol=1e-15)


@given(arrays(np.float64, st.integers(1, 50), elements=st.floats(-700, 700)), st.integers(1, 8))
def test_online_forms_agree_with_safe(x, chunk):
    expect = ref.safe_softmax(x)
    np.testing.assert_allclose(ref.online_softmax(x), expect, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(ref.chunked_online_softmax(x, chunk), expect, rtol=1e-12, atol=1e-300)
    m, d = ref.tree_reduce_states(x, leaf_size=chunk)
    np.testing.assert_allclose(m + np.log(d), np.logaddexp.reduce(x), rtol=1e-12, atol=1e-12)


def test_naive_overflows_where_safe_does_not():
    x = np.array([1000.0, 999.0])
    assert np.isnan(ref.naive_softmax(x)).all()
    np.testing.assert_allclose(ref.online_softmax(x), [1 / (1 + math.e**-1), 1 / (1 + math.e)], rtol=1e-14)


def test_course_example():
    """Seed 003's own check: chunk_size=2 on a row with large and very negative values."""
    x = np.array([1.0, 2.0, 10.0, 85.0, 87.0, -50.0], dtype=np.float32)
    y = ref.chunked_online_softmax(x, chunk_size=2)
    np.testing.assert_allclose(y, ref.safe_softmax(x), rtol=1e-14)
    assert y.sum() == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("row", [[-math.inf] * 3, [math.inf, 1.0], [math.nan, 2.0], [0.0, -math.inf]])
def test_special_values_match_torch(row):
    x = np.array([row, [1.0, 2.0, 3.0][: len(row)] or [0.0]], dtype=object)[0]
    x = np.asarray(x, dtype=np.float64)
    t = torch.tensor(x)
    for name, fn in ALGOS.items():
        if name == "naive" and np.isinf(x).any():
            continue  # naive softmax is undefined on infinities: that is the point of the safe form
        np.testing.assert_allclose(fn(x), torch.softmax(t, 0).numpy(), equal_nan=True, err_msg=name)
    np.testing.assert_allclose(ref.log_softmax(x), torch.log_softmax(t, 0).numpy(), equal_nan=True)
    np.testing.assert_allclose(ref.logsumexp(x), torch.logsumexp(t, 0).numpy(), equal_nan=True)


def test_empty_rows():
    x = np.zeros((3, 0))
    assert ref.softmax(x).shape == (3, 0)
    assert ref.online_softmax(x).shape == (3, 0)
    np.testing.assert_array_equal(ref.logsumexp(x), [-np.inf] * 3)
    m, d = ref.tree_reduce_states(x)
    np.testing.assert_array_equal(m, [-np.inf] * 3)
    np.testing.assert_array_equal(d, [0.0] * 3)


def test_log_softmax_and_logsumexp():
    x = np.random.default_rng(1).standard_normal((5, 33)) * 10
    t = torch.tensor(x)
    np.testing.assert_allclose(ref.log_softmax(x), torch.log_softmax(t, -1).numpy(), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(ref.logsumexp(x), torch.logsumexp(t, -1).numpy(), rtol=1e-13)
