"""Inputs for the decode tests: dense and paged caches with NaN planted in every slot and page no sequence uses."""

from __future__ import annotations

import torch

NAN = float("nan")


def make_cache(B, Hkv, D, lens, s_max, dtype, device, page=0, strided=False):
    """(k, v, cache_seqlens, block_table): dense ``[B, Hkv, s_max, D]`` (from a ``[B, s_max, Hkv, D]`` buffer when
    ``strided``) or paged ``[num_pages, Hkv, page, D]`` with shuffled pages and spare ones; NaN wherever j >= len."""
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    if not page:
        shape = (B, s_max, Hkv, D) if strided else (B, Hkv, s_max, D)
        k = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
        v = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
        if strided:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        for b, n in enumerate(lens):
            k[b, :, n:] = NAN
            v[b, :, n:] = NAN
        return k, v, seqlens, None
    max_pages = -(-s_max // page)
    num_pages = B * max_pages + 3           # the last 3 pages: never in use, all NaN
    shape = (num_pages, page, Hkv, D) if strided else (num_pages, Hkv, page, D)
    k = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    v = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    if strided:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    perm = torch.randperm(B * max_pages, device=device).int()
    table = perm.reshape(B, max_pages).contiguous()
    plant_nan(k, v, seqlens, table)
    return k, v, seqlens, table


def plant_nan(k, v, seqlens, table):
    """NaN in every paged slot no sequence uses: past cache_seqlens[b] in b's pages, all of the pages no table
    entry below its length names (the tail of the pool)."""
    page = k.shape[2]
    used = torch.zeros(k.shape[0], page, dtype=torch.bool, device=k.device)
    for b, n in enumerate(seqlens.tolist()):
        j = torch.arange(n, device=k.device)
        used[table[b].long()[j // page], j % page] = True
    free = ~used
    k.masked_fill_(free[:, None, :, None], NAN)
    v.masked_fill_(free[:, None, :, None], NAN)


def tolerance(dtype):
    return {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]


def assert_matches(o, lse, ref_o, ref_lse, dtype, lowp_err=0.0):
    """o within 2x the low-precision eager result's error against fp64 plus the dtype's rounding; lse finite where
    the reference's is, -inf where it is; no NaN anywhere."""
    assert not torch.isnan(o).any(), "NaN in o"
    assert not torch.isnan(lse).any(), "NaN in lse"
    err = (o.double() - ref_o).abs().max().item() if o.numel() else 0.0
    tol = 2 * lowp_err + tolerance(dtype)
    assert err <= tol, f"o: max error {err:.3g} > {tol:.3g}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "lse -inf where the reference has no key (only there)"
    if (~empty).any():
        lerr = (lse.double() - ref_lse)[~empty].abs().max().item()
        assert lerr <= 1e-4 * max(1.0, ref_lse[~empty].abs().max().item()), f"lse: max error {lerr:.3g}"
    assert (o[empty.unsqueeze(-1).expand_as(o)] == 0).all(), "rows without a key must be 0"
