"""Head-dim-outermost layouts whose offsets within a tile pass 2^31 elements, through the attention, decode and
merge kernels (``onlinesoftmax._triton.host.wide_tiles``).

The kernels add 64-bit (batch, head, row) bases to 32-bit offsets within a tile; a [..., S, D] view of a buffer laid
out head dim first, with (D − 1)·stride_d >= 2^31, wrapped those (a segmentation fault under the interpreter, reads
of other memory on a GPU). Such tensors are now copied to contiguous ones first. Here every tensor is a view of one
buffer of 2^31 / (D − 1) elements per head-dim step, most of it never touched: on the CPU the untouched pages are
never backed by memory (the process grows by a few MB); on the GPU the buffer is a real 8.6 GB allocation.

fp32 throughout: 1e-5 on the CPU (the interpreter); the attention kernels on CUDA multiply in TF32: 5e-3 there.
"""

from __future__ import annotations

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax._triton.host import wide_tiles
from onlinesoftmax.reference.attention import attention_scores
from onlinesoftmax.reference.attention import attention_varlen as varlen_ref
from onlinesoftmax.reference.decode import attention_with_kvcache as kvcache_ref
from onlinesoftmax.reference.decode import merge_attention_states as merge_ref

D = 16
STEP = 2**31 // (D - 1) + 64          # the head-dim stride: (D − 1)·STEP just past 2^31


def _tol(device: torch.device) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if device.type == "cpu" else dict(rtol=5e-3, atol=5e-3)


class _Buffer:
    """Views with head-dim stride STEP of one buffer, each at its own storage offset (the views' other elements lie
    in [offset, offset + their count) of each head-dim step, disjoint between views)."""

    def __init__(self, device: torch.device):
        self.base = torch.empty(STEP * (D - 1) + 2**16, device=device)
        self.used = 0

    def view(self, shape: tuple) -> torch.Tensor:
        """A tensor of ``shape`` (last dim D) whose other dims are packed row-major, the head dim outermost."""
        inner = [1]
        for n in reversed(shape[:-1]):
            inner.insert(0, inner[0] * n)
        t = self.base.as_strided(shape, (*inner[1:], STEP), self.used)
        self.used += inner[0]
        assert self.used < 2**16
        with torch.no_grad():
            t.copy_(torch.randn(shape))
        assert wide_tiles(t, len(shape) - 2, rows=1)
        return t


def test_wide_tiles_rule():
    """Dense layouts are never wide; the head dim outermost is, from (D − 1)·stride_d >= 2^31; rows count up to
    ``rows`` of the sequence dim (none for a size-1 one)."""
    meta = torch.empty(0, device="meta")
    dense = meta.new_empty((64, 32, 32768, 128))
    assert not wide_tiles(dense, 2) and not wide_tiles(dense.transpose(1, 2), 1)
    n = 2**31 // 127
    assert not wide_tiles(meta.as_strided((1, 1, 4, 128), (4, 4, 1, n)), 2, rows=1)
    assert wide_tiles(meta.as_strided((1, 1, 4, 128), (4, 4, 1, n + 1)), 2, rows=1)
    rows = meta.as_strided((1, 1, 300, 8), (0, 0, 2**31 // 255 + 1, 1))
    assert wide_tiles(rows, 2) and not wide_tiles(rows, 2, rows=1) and not wide_tiles(rows[:, :, :1], 2)
    assert not wide_tiles(meta.new_empty((0, 4, 8)), 0)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_wide_head_stride(kernel_device, causal):
    """attention forward and backward (the tl.dot kernels: stride_d != 1): q, k, v and the incoming gradient head-
    dim outermost, GQA 4 / 2; o and the gradients in the inputs' layouts (empty_like's), as fp64's."""
    buf = _Buffer(kernel_device)
    q, k, v, do = (buf.view(s) for s in ((2, 4, 9, D), (2, 2, 11, D), (2, 2, 11, D), (2, 4, 9, D)))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    o, lse = oss.attention(*leaves, causal=causal, return_lse=True, backend="triton")
    assert o.stride() == torch.empty_like(q).stride()
    grads = torch.autograd.grad(o, leaves, do)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o64, lse64 = attention_scores(*ref, causal=causal)
    want = torch.autograd.grad(o64, ref, do.double())
    tol = _tol(kernel_device)
    torch.testing.assert_close(o.double(), o64.detach(), **tol)
    torch.testing.assert_close(lse.double(), lse64.detach(), **tol)
    for t, g, w in zip((q, k, v), grads, want):
        assert g.stride() == torch.empty_like(t).stride()
        torch.testing.assert_close(g.double(), w, **tol)


def test_attention_varlen_wide_head_stride(kernel_device):
    """attention_varlen: packed q, k, v [T, H, D] head-dim outermost, sequences 5 / 0 / 7."""
    buf = _Buffer(kernel_device)
    q, k, v = (buf.view((12, h, D)) for h in (4, 2, 2))
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=kernel_device)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    o = oss.attention_varlen(*leaves, cu, cu, 7, 7, causal=True, backend="triton")
    grads = torch.autograd.grad(o.sum(), leaves)
    ref = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    o64, _ = varlen_ref(*ref, cu.cpu(), cu.cpu(), causal=True)
    want = torch.autograd.grad(o64.sum(), ref)
    tol = _tol(kernel_device)
    torch.testing.assert_close(o.double().cpu(), o64.detach(), **tol)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.double().cpu(), w, **tol)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_wide_head_stride(kernel_device, paged):
    """attention_with_kvcache: q and the caches (dense [B, Hkv, S, D]; paged [pages, Hkv, 4, D]) head-dim
    outermost, Sq = 2, GQA 4 / 2, lengths 12 / 5 / 9."""
    buf = _Buffer(kernel_device)
    q = buf.view((3, 4, 2, D))
    shape = (10, 2, 4, D) if paged else (3, 2, 12, D)
    k, v = buf.view(shape), buf.view(shape)
    lens = torch.tensor([12, 5, 9], dtype=torch.int32, device=kernel_device)
    table = torch.randperm(10)[:9].reshape(3, 3).to(torch.int32).to(kernel_device) if paged else None
    o, lse = oss.attention_with_kvcache(q, k, v, lens, block_table=table, return_lse=True, backend="triton")
    o64, lse64 = kvcache_ref(*(t.double().cpu() for t in (q, k, v)), lens.cpu(),
                             None if table is None else table.cpu())
    torch.testing.assert_close(o.double().cpu(), o64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double().cpu(), lse64.double(), rtol=1e-5, atol=1e-5)


def test_merge_wide_head_stride(kernel_device):
    """merge_attention_states: o_a and o_b [2, 4, 3, D] head-dim outermost."""
    buf = _Buffer(kernel_device)
    o_a, o_b = buf.view((2, 4, 3, D)), buf.view((2, 4, 3, D))
    lse_a, lse_b = (torch.randn(2, 4, 3, device=kernel_device) for _ in range(2))
    o, lse = oss.merge_attention_states(o_a, lse_a, o_b, lse_b, backend="triton")
    o64, lse64 = merge_ref(*(t.double() for t in (o_a, lse_a, o_b, lse_b)))
    torch.testing.assert_close(o.double(), o64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), lse64, rtol=1e-5, atol=1e-5)
