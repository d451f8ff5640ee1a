"""``attention`` / ``attention_varlen`` / ``explain`` as a demanding user calls them: scalars as torch takes them
(NumPy numbers, 0-d tensors), bool flags that must be bools, integer index tensors of any integer dtype, windows
wider than the problem, meta tensors on either backend; results against the fp64 references."""

import numpy as np
import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax.attention import explain
from onlinesoftmax.reference import attention as ref

BACKENDS = [pytest.param("torch"), pytest.param("triton", marks=pytest.mark.interpreter)]
TOL = dict(rtol=1e-4, atol=1e-5)


def _qkv(B=1, H=2, Hkv=1, Sq=5, Sk=7, D=8):
    return torch.randn(B, H, Sq, D), torch.randn(B, Hkv, Sk, D), torch.randn(B, Hkv, Sk, D)


def _packed():
    cq, ck = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 4, 7], dtype=torch.int32)
    return torch.randn(5, 2, 8), torch.randn(7, 1, 8), torch.randn(7, 1, 8), cq, ck


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalars_as_torch_takes_them(backend):
    """SDPA takes a NumPy float or int, or a 0-d tensor, as ``scale``; so do these (and for ``softcap`` and the
    window's entries, ints as torch takes them). They raised TypeError."""
    q, k, v = _qkv()
    want = ref.attention_scores(q, k, v, scale=0.5, softcap=3.0, window=(2, 1))[0]
    for s, c, w in ((np.float32(0.5), np.float64(3.0), (np.int64(2), np.int32(1))),
                    (torch.tensor(0.5), torch.tensor(3), (torch.tensor(2), 1))):
        o = oss.attention(q, k, v, scale=s, softcap=c, window=w, backend=backend)
        torch.testing.assert_close(o.double(), want, **TOL)
    q, k, v, cq, ck = _packed()
    o = oss.attention_varlen(q, k, v, cq, ck, 3, 4, scale=np.float32(0.5), window=(np.int64(1), 0), backend=backend)
    torch.testing.assert_close(o.double(), ref.attention_varlen(q, k, v, cq, ck, scale=0.5, window=(1, 0))[0], **TOL)
    for bad in (torch.tensor([0.5]), True, "0.5", torch.tensor(0.5, dtype=torch.complex64)):
        with pytest.raises(TypeError, match="onlinesoftmax.attention: scale must be None or a float"):
            oss.attention(*_qkv(), scale=bad, backend=backend)
    with pytest.raises(TypeError, match=r"onlinesoftmax.attention: window\[0\] must be an int, got float"):
        oss.attention(*_qkv(), window=(2.0, 0), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flags_must_be_bools(backend):
    """``return_lse`` took any truthy value (None gave o alone, "no" a tuple); it is a bool now, as ``causal`` (whose
    error named a NumPy bool plain "bool")."""
    q, k, v = _qkv()
    qp, kp, vp, cq, ck = _packed()
    for bad in (1, None, "no", np.True_, torch.tensor(True)):
        with pytest.raises(TypeError, match="onlinesoftmax.attention: return_lse must be a bool"):
            oss.attention(q, k, v, return_lse=bad, backend=backend)
        with pytest.raises(TypeError, match="onlinesoftmax.attention_varlen: return_lse must be a bool"):
            oss.attention_varlen(qp, kp, vp, cq, ck, 3, 4, return_lse=bad, backend=backend)
    with pytest.raises(TypeError, match="causal must be a bool, got numpy.bool"):
        oss.attention(q, k, v, causal=np.True_, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_wider_than_the_problem(backend):
    """A window side of 2^31 - 1 overflowed the kernels' int32 positions (a silent wrong answer), 2^64 raised an
    OverflowError: a side wider than the problem restricts nothing, and now gives the unbounded result."""
    q, k, v = _qkv()
    want = ref.attention_scores(q, k, v)[0]
    for w in ((2**31 - 1, 2**31 - 1), (2**64, 2**40), (2**62, -1)):
        torch.testing.assert_close(oss.attention(q, k, v, window=w, backend=backend).double(), want, **TOL)
    causal = ref.attention_scores(q, k, v, causal=True)[0]
    torch.testing.assert_close(oss.attention(q, k, v, causal=True, window=(2**31 - 1, 0), backend=backend).double(),
                               causal, **TOL)
    qp, kp, vp, cq, ck = _packed()
    o = oss.attention_varlen(qp, kp, vp, cq, ck, 3, 4, window=(2**31 - 1, 2**31 - 1), backend=backend)
    torch.testing.assert_close(o.double(), ref.attention_varlen(qp, kp, vp, cq, ck)[0], **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_index_arguments(backend):
    """int64 cu_seqlens (``torch.cumsum``'s dtype) raised ValueError; they are converted to the int32 the kernels read
    (values checked first on the CPU). ``max_seqlen`` as ``lengths.max()`` (a 0-d tensor) or a NumPy integer raised
    TypeError. A float cu_seqlens is a TypeError, a negative max_seqlen a ValueError."""
    q, k, v, cq, ck = _packed()
    want = ref.attention_varlen(q, k, v, cq, ck, causal=True)[0]
    lens = torch.tensor([3, 2])
    for a, b, mq, mk in ((cq.long(), ck.long(), lens.max(), np.int64(4)), (cq.short(), ck.to(torch.uint8), 3, 4)):
        o = oss.attention_varlen(q, k, v, a, b, mq, mk, causal=True, backend=backend)
        torch.testing.assert_close(o.double(), want, **TOL)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        oss.attention_varlen(q, k, v, torch.tensor([0, 2**32 + 3, 5]), ck, 3, 4, backend=backend)
    with pytest.raises(TypeError, match="onlinesoftmax.attention_varlen: cu_seqlens_k must be an int32"):
        oss.attention_varlen(q, k, v, cq, ck.float(), 3, 4, backend=backend)
    with pytest.raises(ValueError, match="onlinesoftmax.attention_varlen: max_seqlen_q must be an int >= 0, got -1"):
        oss.attention_varlen(q, k, v, cq, ck, -1, 4, backend=backend)
    for bad in (3.0, True, torch.tensor([3]), None):
        with pytest.raises(TypeError, match="onlinesoftmax.attention_varlen: max_seqlen_k must be an int"):
            oss.attention_varlen(q, k, v, cq, ck, 3, bad, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_meta_tensors_give_the_fakes_shapes(backend):
    """backend="triton" on meta tensors (the interpreter) tried to copy their data out: now the op's fake."""
    q, k, v = (t.to("meta") for t in _qkv(Sk=4096 if backend == "triton" else 7))
    for o, lse in (oss.attention(q, k, v, return_lse=True, backend=backend),
                   oss.attention(q[:, :, :1], k, v, return_lse=True, backend=backend)):
        assert o.device.type == "meta" and lse.dtype == torch.float32 and lse.shape == o.shape[:3]
    assert explain(q, k, v, scale=np.float32(0.1), backend=backend).problem.Sk == k.shape[2]
