"""``attention_with_kvcache``, ``merge_attention_states`` and their ``explain`` functions as a demanding user calls
them: index tensors of any integer dtype, an int ``cache_seqlens`` (as FlashAttention's), scalars as torch takes them,
bool flags, windows wider than the cache, meta tensors; results against the fp64 references."""

import numpy as np
import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax.decode import explain, explain_merge
from onlinesoftmax.reference import decode as ref
from onlinesoftmax.target import H200

BACKENDS = [pytest.param("torch"), pytest.param("triton", marks=pytest.mark.interpreter)]
TOL = dict(rtol=1e-4, atol=1e-5)


def _dense():
    return (torch.randn(2, 2, 1, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8),
            torch.tensor([3, 6], dtype=torch.int32))


def _check(out, want):
    torch.testing.assert_close(out[0].double(), want[0], **TOL)
    torch.testing.assert_close(out[1].double(), want[1], **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_tensors_of_any_integer_dtype(backend):
    """int64 cache_seqlens / block_table raised TypeError: converted to the int32 the kernels read (values checked
    first on the CPU); an int cache_seqlens is every sequence's length. Float ones stay a TypeError."""
    q, k, v, sl = _dense()
    want = ref.attention_with_kvcache(q, k, v, sl)
    _check(oss.attention_with_kvcache(q, k, v, sl.long(), return_lse=True, backend=backend), want)
    full = torch.tensor([6, 6], dtype=torch.int32)
    for n in (6, np.int64(6), torch.tensor(6)):
        _check(oss.attention_with_kvcache(q, k, v, n, return_lse=True, backend=backend),
               ref.attention_with_kvcache(q, k, v, full))
    pages, table = torch.randn(5, 1, 2, 8), torch.tensor([[0, 1, 2], [3, 4, 0]])
    paged_want = ref.attention_with_kvcache(q, pages, pages, sl, table.int())
    _check(oss.attention_with_kvcache(q, pages, pages, sl.long(), block_table=table, return_lse=True,
                                      backend=backend), paged_want)
    with pytest.raises(IndexError, match=r"attention_with_kvcache: block_table\[0, 1\] = -1"):
        oss.attention_with_kvcache(q, pages, pages, sl, block_table=torch.tensor([[0, -1, 2], [3, 4, 0]]),
                                   backend=backend)
    with pytest.raises(ValueError, match="attention_with_kvcache: cache_seqlens holds 4294967296"):
        oss.attention_with_kvcache(q, k, v, torch.tensor([2**32, 3]), backend=backend)
    with pytest.raises(TypeError, match="attention_with_kvcache: cache_seqlens must be an int32 tensor"):
        oss.attention_with_kvcache(q, k, v, 6.0, backend=backend)
    with pytest.raises(TypeError, match="attention_with_kvcache: block_table must be an int32 tensor"):
        oss.attention_with_kvcache(q, pages, pages, sl, block_table=table.bool(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalars_flags_and_windows(backend):
    """scale / softcap as NumPy numbers or 0-d tensors and window entries as NumPy ints raised TypeError;
    ``return_lse=None`` gave o alone; a window side of 2^31 - 1 overflowed the kernels' int32 positions (a wrong
    answer), 2^64 raised an OverflowError."""
    q, k, v, sl = _dense()
    want = ref.attention_with_kvcache(q, k, v, sl, scale=0.5, softcap=2.0, window=(2, 0))
    for s, c, w in ((np.float32(0.5), np.float64(2.0), (np.int64(2), 0)), (torch.tensor(0.5), torch.tensor(2.0),
                                                                            (torch.tensor(2), np.int32(0)))):
        _check(oss.attention_with_kvcache(q, k, v, sl, scale=s, softcap=c, window=w, return_lse=True,
                                          backend=backend), want)
    unbounded = ref.attention_with_kvcache(q, k, v, sl, causal=False)
    for w in ((2**31 - 1, 2**31 - 1), (2**64, 2**64)):
        _check(oss.attention_with_kvcache(q, k, v, sl, causal=False, window=w, return_lse=True, backend=backend),
               unbounded)
    for bad in (None, 1, "yes", np.True_):
        with pytest.raises(TypeError, match="attention_with_kvcache: return_lse must be a bool"):
            oss.attention_with_kvcache(q, k, v, sl, return_lse=bad, backend=backend)


def test_explain_checks_the_call_arguments():
    """explain(attention_with_kvcache) took any scale, window, causal or return_lse and planned a call that raises;
    it raises the call's errors, and takes what the call takes (an int64 cache_seqlens)."""
    q, k, v, sl = _dense()
    assert explain(q, k, v, sl.long(), scale=np.float32(0.1)).path == "torch"
    for kw, exc, msg in ((dict(scale="x"), TypeError, "scale must be None or a float"),
                         (dict(window=(-5, 0)), ValueError, "window entries must be >= -1"),
                         (dict(causal="x"), TypeError, "causal must be a bool"),
                         (dict(return_lse=None), TypeError, "return_lse must be a bool"),
                         (dict(softcap=0.0), ValueError, "softcap must be a positive finite float")):
        with pytest.raises(exc, match=f"attention_with_kvcache: {msg}"):
            explain(q, k, v, sl, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_meta_gives_the_fakes_shapes(backend):
    """backend="triton" on meta states (the interpreter) tried to copy their data out: now the op's fake."""
    o, lse = torch.empty(2, 3, 8, device="meta"), torch.empty(2, 3, device="meta")
    mo, ml = oss.merge_attention_states(o, lse, o, lse, backend=backend)
    assert mo.shape == o.shape and ml.shape == lse.shape and mo.device.type == "meta"


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype, D", [(torch.float64, 16), (torch.float32, 320)], ids=["float64", "D320"])
def test_what_the_kernels_do_not_take(dtype, D):
    """float64 or a head dim past 256 with backend="triton": an error naming the function, as oss.attention's (both
    ran on the torch path silently, and a D > 256 cache on a GPU reached the kernels by default); by default the
    torch path (``_kernel_backend``: what a GPU does with backend=None), right against the fp64 reference."""
    from onlinesoftmax.decode.api import _kernel_backend

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 1, D, generator=gen, dtype=dtype)
    k, v = (torch.randn(2, 2, 9, D, generator=gen, dtype=dtype) for _ in range(2))
    lens = torch.tensor([9, 4], dtype=torch.int32)
    err = (TypeError, "takes float16, bfloat16 or float32") if dtype == torch.float64 else \
        (ValueError, "takes head dims up to 256")
    with pytest.raises(err[0], match="^attention_with_kvcache: backend='triton' " + err[1]):
        oss.attention_with_kvcache(q, k, v, lens, backend="triton")
    with pytest.raises(err[0], match=r"^explain\(attention_with_kvcache\): backend='triton' " + err[1]):
        explain(q, k, v, lens, backend="triton")
    assert _kernel_backend("triton", None, q, "op") == "torch"
    assert _kernel_backend("triton", None, q[..., :16].float(), "op") == "triton"
    o = oss.attention_with_kvcache(q, k, v, lens)
    torch.testing.assert_close(o.double(), ref.attention_with_kvcache(q, k, v, lens)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.interpreter
def test_merge_float64_with_backend_triton_is_an_error():
    """A float64 state with backend="triton" ran the torch path silently (the kernel merges in fp32); by default it
    still merges in float64."""
    gen = torch.Generator().manual_seed(5)
    o_a, o_b = (torch.randn(2, 3, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    lse_a, lse_b = (torch.randn(2, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    with pytest.raises(TypeError, match="^merge_attention_states: backend='triton' takes float16, bfloat16 or float32"):
        oss.merge_attention_states(o_a, lse_a, o_b, lse_b, backend="triton")
    with pytest.raises(TypeError, match="^merge_attention_states: backend='triton'"):
        oss.merge_attention_states(o_a.float(), lse_a, o_b.float(), lse_b.float(), backend="triton")
    o, lse = oss.merge_attention_states(o_a, lse_a, o_b, lse_b)
    ro, rl = ref.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert o.dtype == lse.dtype == torch.float64
    torch.testing.assert_close(o, ro.to(o.dtype), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, rl.to(lse.dtype), rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match=r"^explain\(merge_attention_states\): backend='triton' takes"):
        explain_merge(o_a, backend="triton")
    assert explain_merge(o_a, target=H200).path != "torch"          # another GPU's plan: the kernel's
