"""attention_with_kvcache and merge_attention_states past 2^31 elements and on misaligned tensors (``pytest -m gpu
tests/decode/test_decode_large.py``).

* Offsets: a dense cache ``[64, 8, 33000, 128]`` (2.16e9 elements, 4.3 GB each for k and v) checked on its last
  sequence (and ``oss.attention``'s decode dispatch over it: a full cache); a paged pool whose last pages start
  past element 2^31, the checked sequence's block table pointing at them; Sq = 1 and 4; the merge of ``[N, 128]``
  states with ``N·128 > 2^31`` on its tail rows. A kernel that forms ``b·stride_b`` or ``page·stride_page`` in 32
  bits reads another sequence's keys there. Each against fp64 on the checked slice only.
* Alignment: q, k_cache, v_cache (dense and paged), o and lse of the merge starting off a 16-byte boundary: as
  fp64's and the aligned call's; an aligned call after them bit for bit as before (the bound C launchers of
  aligned calls are not replayed on a misaligned pointer).

The private helpers take the sizes: small calls run them on the CPU (the interpreter) to keep them honest.
"""

import pytest
import torch
from big_inputs import free, misaligned, past_2_31
from decode_inputs import assert_matches

import onlinesoftmax as oss
from onlinesoftmax.attention import explain as explain_attention
from onlinesoftmax.reference import decode as ref
from onlinesoftmax.reference.attention import attention_scores

BF16 = torch.bfloat16


def _lowp(ro, dtype):
    return (ro.to(dtype).double() - ro).abs().max().item() if dtype != torch.float32 else 0.0


def _check_last(q, k, v, lens, table, o, lse, last=1):
    """The last ``last`` sequences' o and lse against the fp64 reference on them."""
    sl = slice(q.shape[0] - last, None)
    ro, rl = ref.attention_with_kvcache(q[sl], k if table is not None else k[sl], v if table is not None else v[sl],
                                        lens[sl], None if table is None else table[sl])
    assert_matches(o[sl], lse[sl], ro, rl, q.dtype, _lowp(ro, q.dtype))


def _dense_last(B, Hkv, S, D, H, dev, backend=None):
    """A dense cache: the last sequence (full) for Sq = 1 and 4, and oss.attention's decode dispatch over the
    whole cache (Sq = 1, no mask)."""
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=BF16)
    v = torch.randn(B, Hkv, S, D, device=dev, dtype=BF16)
    lens = torch.randint(1, S + 1, (B,), device=dev, dtype=torch.int32)
    lens[-1] = S
    for Sq in (1, 4):
        q = torch.randn(B, H, Sq, D, device=dev, dtype=BF16)
        o, lse = oss.attention_with_kvcache(q, k, v, lens, return_lse=True, backend=backend)
        _check_last(q, k, v, lens, None, o, lse)
    q = torch.randn(B, H, 1, D, device=dev, dtype=BF16)
    if backend is None:
        assert explain_attention(q, k, v).decode
    o, lse = oss.attention(q, k, v, return_lse=True, backend=backend)
    ro, rl = attention_scores(q[-1:], k[-1:], v[-1:])
    assert_matches(o[-1:], lse[-1:], ro, rl, BF16, _lowp(ro, BF16))


def test_dense_helper_small(kernel_device):
    _dense_last(3, 2, 40, 16, 4, kernel_device, backend="triton")


@pytest.mark.gpu
def test_gpu_dense_cache_more_than_2_31_elements():
    """k, v [64, 8, 33000, 128] bf16 (8.7 GB): the last sequence, Sq = 1 and 4, and oss.attention over it."""
    B, _ = past_2_31(8 * 33000 * 128, extra=1)
    assert B == 64
    _dense_last(B, 8, 33000, 128, 32, torch.device("cuda"))
    free()


def _paged_last(B, Hkv, page, D, H, seq, extra_pages, dev, backend=None):
    """A pool of ``num_pages`` pages where the last ``seq // page`` lie past ``extra_pages`` others: the last
    sequence's table points at them (reversed), the other sequences at random pages below; Sq = 1 and 4."""
    per_seq = seq // page
    num_pages = extra_pages + per_seq
    k = torch.randn(num_pages, Hkv, page, D, device=dev, dtype=BF16)
    v = torch.randn(num_pages, Hkv, page, D, device=dev, dtype=BF16)
    table = torch.randint(0, extra_pages, (B, per_seq), device=dev, dtype=torch.int32)
    table[-1] = torch.arange(num_pages - 1, extra_pages - 1, -1, device=dev, dtype=torch.int32)
    lens = torch.full((B,), seq, device=dev, dtype=torch.int32)
    lens[0] = seq - 7
    for Sq in (1, 4):
        q = torch.randn(B, H, Sq, D, device=dev, dtype=BF16)
        o, lse = oss.attention_with_kvcache(q, k, v, lens, block_table=table, return_lse=True, backend=backend)
        _check_last(q, k, v, lens, table, o, lse)


def test_paged_helper_small(kernel_device):
    _paged_last(3, 2, 4, 16, 4, 32, 10, kernel_device, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 256])
def test_gpu_paged_cache_pages_past_2_31(page):
    """A [num_pages, 8, page, 128] bf16 pool (4.3 GB each for k and v) whose last 4096 / page pages start past
    element 2^31: the sequence reading them (4096 keys) against fp64, Sq = 1 and 4."""
    first = past_2_31(8 * page * 128, extra=0)[1]
    _paged_last(4, 8, page, 128, 32, 4096, first, torch.device("cuda"))
    free()


def _merge_tail(N, D, first, dev, dtype=BF16, backend=None):
    """merge_attention_states of [N, D] states: rows ``first:`` (one side empty on one of them) against fp64."""
    oa, ob = torch.randn(N, D, device=dev, dtype=dtype), torch.randn(N, D, device=dev, dtype=dtype)
    la, lb = torch.randn(N, device=dev) * 4, torch.randn(N, device=dev) * 4
    lb[N - 1] = float("-inf")
    o, lse = oss.merge_attention_states(oa, la, ob, lb, backend=backend)
    ro, rl = ref.merge_attention_states(oa[first:], la[first:], ob[first:], lb[first:])
    assert torch.equal(o[N - 1], oa[N - 1])
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(o[first:].double(), ro, rtol=tol, atol=tol)
    torch.testing.assert_close(lse[first:].double(), rl, rtol=1e-6, atol=1e-5)
    return o, lse


def test_merge_helper_small(kernel_device):
    _merge_tail(40, 16, 30, kernel_device, backend="triton")


@pytest.mark.gpu
def test_gpu_merge_more_than_2_31_elements():
    """o_a, o_b, o [N, 128] bf16 with N·128 > 2^31 (12.9 GB): the rows past 2^31."""
    N, first = past_2_31(128)
    _merge_tail(N, 128, first, torch.device("cuda"))
    free()


# ---- misaligned tensors --------------------------------------------------------------------------------------


def _misaligned_kvcache(B, H, Hkv, S, D, page, Sq, dev, dtype=BF16, backend=None):
    """Aligned twice (the second call takes the bound launchers), then q, k_cache, v_cache misaligned one at a
    time, then aligned again: every call against fp64, the misaligned ones within rounding of the aligned one,
    the last bit for bit."""
    if page:
        per = S // page
        k = torch.randn(B * per + 2, Hkv, page, D, device=dev).to(dtype)
        table = torch.randperm(B * per, device=dev).int().reshape(B, per)
    else:
        k = torch.randn(B, Hkv, S, D, device=dev).to(dtype)
        table = None
    v = torch.randn_like(k)
    q = torch.randn(B, H, Sq, D, device=dev).to(dtype)
    lens = torch.randint(Sq, S + 1, (B,), device=dev, dtype=torch.int32)
    ro, rl = ref.attention_with_kvcache(q, k, v, lens, table)

    def run(q_, k_, v_):
        o, lse = oss.attention_with_kvcache(q_, k_, v_, lens, block_table=table, return_lse=True, backend=backend)
        assert_matches(o, lse, ro, rl, dtype, _lowp(ro, dtype))
        return o, lse

    first = run(q, k, v)
    run(q, k, v)
    for i in range(3):
        args = [q, k, v]
        args[i] = misaligned(args[i])
        o, lse = run(*args)
        torch.testing.assert_close(o.double(), first[0].double(), rtol=0, atol=2 * _lowp(ro, dtype) + 1e-5)
        torch.testing.assert_close(lse, first[1], rtol=1e-5, atol=1e-5)
    again = run(q, k, v)
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


def test_misaligned_kvcache_helper_small(kernel_device):
    _misaligned_kvcache(2, 4, 2, 32, 16, 0, 1, kernel_device, backend="triton")
    _misaligned_kvcache(2, 4, 2, 32, 16, 8, 4, kernel_device, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16, 256])
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_kvcache_misaligned(page, Sq, dtype):
    """B = 8, 32 / 8 heads, 4096 keys, D = 128: q, k_cache, v_cache misaligned one at a time."""
    _misaligned_kvcache(8, 32, 8, 4096, 128, page, Sq, torch.device("cuda"), dtype)


def _misaligned_merge(shape, dev, dtype=BF16, backend=None):
    """o_a, lse_a, o_b, lse_b misaligned one at a time between aligned calls: as fp64's and the aligned call's,
    the second aligned call bit for bit as the first."""
    oa, ob = torch.randn(shape, device=dev).to(dtype), torch.randn(shape, device=dev).to(dtype)
    la, lb = torch.randn(shape[:-1], device=dev) * 4, torch.randn(shape[:-1], device=dev) * 4
    ro, rl = ref.merge_attention_states(oa, la, ob, lb)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    outs = []
    for i in range(6):
        args = [oa, la, ob, lb]
        if 0 < i < 5:
            args[i - 1] = misaligned(args[i - 1])
        o, lse = oss.merge_attention_states(*args, backend=backend)
        torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol)
        torch.testing.assert_close(lse.double(), rl, rtol=1e-6, atol=1e-5)
        outs.append((o, lse))
    for o, lse in outs[1:5]:
        torch.testing.assert_close(o, outs[0][0], rtol=0, atol=tol)
        torch.testing.assert_close(lse, outs[0][1], rtol=1e-6, atol=1e-6)
    assert torch.equal(outs[5][0], outs[0][0]) and torch.equal(outs[5][1], outs[0][1])


def test_misaligned_merge_helper_small(kernel_device):
    _misaligned_merge((2, 3, 5, 40), kernel_device, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_merge_misaligned(dtype):
    _misaligned_merge((16, 32, 4, 128), torch.device("cuda"), dtype)
