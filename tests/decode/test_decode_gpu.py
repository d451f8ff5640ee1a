"""The decode kernels on the GPU at real sizes against the fp64 reference: B up to 64, caches 4K-128K, page sizes
1 / 16 / 256 (pages shuffled, NaN in every unused slot and page), GQA 32/8 and 32/32, Sq 1 and 4, bf16 / fp16 /
fp32, strided caches, window, softcap, forced split counts, CUDA-graph capture replayed after cache_seqlens and
block_table change, the merge at 1 GiB-class sizes. ``pytest -m gpu tests/decode``."""

import pytest
import torch
from decode_inputs import assert_matches, make_cache, plant_nan

import onlinesoftmax as oss
from onlinesoftmax.decode import explain
from onlinesoftmax.decode.launch import attention_split_kv
from onlinesoftmax.decode.plan import Knobs
from onlinesoftmax.reference import decode as ref

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _case(B, H, Hkv, Sq, D, lens, s_max, dtype, page=0, strided=False, splits=None, knobs=None, **kw):
    k, v, sl, table = make_cache(B, Hkv, D, lens, s_max, dtype, DEV, page=page, strided=strided)
    q = torch.randn(B, H, Sq, D, device=DEV).to(dtype)
    if splits or knobs:
        plan = explain(q, k, v, sl, block_table=table, knobs=Knobs.of(**(knobs or dict(splits=splits))))
        left, right = kw.get("window") or (-1, -1)
        o, lse = attention_split_kv(q, k, v, sl, table, kw.get("causal", True), D ** -0.5, left, right,
                                    kw.get("softcap") or 0.0, plan)
    else:
        o, lse = oss.attention_with_kvcache(q, k, v, sl, block_table=table, return_lse=True, **kw)
    torch.cuda.synchronize()
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, table, **kw)
    lowp = (ro.to(dtype).double() - ro).abs().max().item() if dtype != torch.float32 else 0.0
    assert_matches(o, lse, ro, rl, dtype, lowp)


@pytest.mark.parametrize("page", [0, 1, 16, 256])
@pytest.mark.parametrize("B,H,Hkv,S", [(8, 32, 32, 32768), (1, 32, 32, 131072), (8, 32, 8, 32768),
                                       (64, 32, 8, 4096)])
@pytest.mark.parametrize("Sq", [1, 4])
def test_goal_shapes(page, B, H, Hkv, S, Sq):
    if page == 1 and S > 32768:
        pytest.skip("page size 1 at 128K: covered at 32K")
    lens = [S] * B
    lens[0] = S - 1                      # odd and full lengths side by side
    if B > 1:
        lens[1] = max(Sq, 1 + S // 3)
    _case(B, H, Hkv, Sq, 128, lens, S, torch.bfloat16, page=page)


@pytest.mark.parametrize("knobs", [dict(dense_tiles=True), dict(ahead=3)], ids=["dense_tiles", "ahead3"])
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("B,H,Hkv,S", [(8, 32, 8, 16384), (8, 32, 32, 32768), (64, 32, 8, 4096)])
@pytest.mark.parametrize("Sq", [1, 4])
def test_page_numbers_per_page(knobs, page, B, H, Hkv, S, Sq):
    """One page number per page (ahead 3), with the paged tiles or the dense cache's (dense_tiles), at the goal
    shapes: shuffled pages, odd, short and full lengths side by side, a windowed case."""
    lens = [S] * B
    lens[0], lens[1], lens[2] = S - 1, 1 + S // 3, Sq
    _case(B, H, Hkv, Sq, 128, lens, S, torch.bfloat16, page=page, knobs=knobs)
    if Sq == 4 and B == 8:
        _case(B, H, Hkv, Sq, 128, lens, S, torch.bfloat16, page=page, knobs=knobs, window=(1000, -1), softcap=30.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("page", [0, 16])
def test_variable_lengths_strided(dtype, page):
    """Lengths 0 / 1 / odd / full in one batch, caches from [B, S, Hkv, D] buffers (and [pages, page, Hkv, D])."""
    g = torch.Generator().manual_seed(1)
    lens = [0, 1, 4095, 4096, 7, 1000] + torch.randint(1, 4097, (10,), generator=g).tolist()
    _case(16, 32, 8, 1, 128, lens, 4096, dtype, page=page, strided=True)


@pytest.mark.parametrize("Sq", [1, 2, 5, 16])
@pytest.mark.parametrize("H,Hkv", [(8, 8), (32, 8), (16, 2)])
def test_speculative_rows_and_gqa(Sq, H, Hkv):
    _case(4, H, Hkv, Sq, 128, [Sq, 300, 2049, 8192], 8192, torch.bfloat16, page=16)


@pytest.mark.parametrize("kw", [dict(window=(1024, -1)), dict(softcap=30.0), dict(window=(255, 3), causal=False),
                                dict(causal=False), dict(window=(4096, -1), softcap=50.0)])
def test_window_softcap(kw):
    _case(4, 32, 8, 4, 128, [4, 5000, 16384, 777], 16384, torch.bfloat16, page=256, **kw)


@pytest.mark.parametrize("D", [64, 80, 256])
def test_head_dims(D):
    _case(2, 16, 4, 2, D, [3000, 65], 4096, torch.bfloat16, page=16)


@pytest.mark.parametrize("splits", [1, 2, 7, 64, 128])
def test_forced_splits(splits):
    _case(2, 32, 8, 1, 128, [32768, 1234], 32768, torch.bfloat16, splits=splits)
    _case(2, 32, 8, 4, 128, [32768, 5], 32768, torch.bfloat16, page=16, splits=splits)


def test_cuda_graph_replay_after_lengths_and_table_change():
    """Captured once, replayed after cache_seqlens and block_table are rewritten in place: the new answer."""
    B, H, Hkv, D, S, page = 4, 32, 8, 128, 16384, 16
    k, v, sl, table = make_cache(B, Hkv, D, [S] * B, S, torch.bfloat16, DEV, page=page)
    q = torch.randn(B, H, 1, D, device=DEV).bfloat16()
    oss.attention_with_kvcache(q, k, v, sl, block_table=table, return_lse=True)     # compile, warm the caches
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = oss.attention_with_kvcache(q, k, v, sl, block_table=table, return_lse=True)
    for lens in ([S] * B, [1, 17, 5000, 16383], [0, S, 2, 9999]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        table.copy_(torch.randperm(table.numel(), device=DEV).int().reshape(table.shape))   # pages moved
        for c in (k, v):
            c[:-3].normal_()            # finite in every page a table may name, then NaN where no one reads
        plant_nan(k, v, sl, table)
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = ref.attention_with_kvcache(q, k, v, sl, table)
        assert_matches(o, lse, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())


def test_no_host_sync():
    """The Triton path issues no device-to-host synchronisation (it may run inside a graph capture)."""
    k, v, sl, table = make_cache(2, 8, 128, [100, 4000], 4096, torch.bfloat16, DEV, page=16)
    q = torch.randn(2, 32, 1, 128, device=DEV).bfloat16()
    oss.attention_with_kvcache(q, k, v, sl, block_table=table)
    lz = torch.zeros(q.shape[:-1], device=DEV)
    oss.merge_attention_states(q, lz, q, lz)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        oss.attention_with_kvcache(q, k, v, sl, block_table=table)
        oss.merge_attention_states(q, lz, q, lz)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_second_stream():
    k, v, sl, _ = make_cache(1, 8, 128, [65536], 65536, torch.bfloat16, DEV)
    q = torch.randn(1, 32, 1, 128, device=DEV).bfloat16()
    ro, rl = ref.attention_with_kvcache(q, k, v, sl)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o, lse = oss.attention_with_kvcache(q, k, v, sl, return_lse=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert_matches(o, lse, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_large(dtype):
    shape = (64, 32, 4, 128) if dtype == torch.float32 else (256, 32, 16, 128)
    oa, ob = torch.randn(shape, device=DEV).to(dtype), torch.randn(shape, device=DEV).to(dtype)
    la, lb = torch.randn(shape[:-1], device=DEV) * 4, torch.randn(shape[:-1], device=DEV) * 4
    lb[0] = float("-inf")
    ob[0] = float("nan")
    la[1, 0] = lb[1, 0] = float("-inf")
    o, lse = oss.merge_attention_states(oa, la, ob, lb)
    ro, rl = ref.merge_attention_states(oa, la, ob, lb)
    assert not torch.isnan(o).any()
    assert torch.equal(o[0], oa[0]) and torch.equal(lse[0], la[0])
    assert (o[1, 0] == 0).all() and (lse[1, 0] == float("-inf")).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-6, atol=1e-5)


def test_merge_agrees_with_split_attention():
    B, H, Hkv, D, L, a = 2, 32, 8, 128, 20000, 8191
    k, v, sl, _ = make_cache(B, Hkv, D, [L, L], L, torch.bfloat16, DEV)
    q = torch.randn(B, H, 1, D, device=DEV).bfloat16()
    full = oss.attention_with_kvcache(q, k, v, sl, causal=False, return_lse=True)
    pre = oss.attention_with_kvcache(q, k[:, :, :a], v[:, :, :a], torch.full_like(sl, a), causal=False,
                                     return_lse=True)
    suf = oss.attention_with_kvcache(q, k[:, :, a:], v[:, :, a:], torch.full_like(sl, L - a), causal=False,
                                     return_lse=True)
    o, lse = oss.merge_attention_states(*pre, *suf)
    torch.testing.assert_close(o.float(), full[0].float(), rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(lse, full[1], rtol=1e-5, atol=1e-5)


def test_plan_on_this_gpu():
    k, v, sl, _ = make_cache(1, 8, 128, [8], 131072, torch.bfloat16, DEV)
    q = torch.randn(1, 32, 1, 128, device=DEV).bfloat16()
    p = explain(q, k, v, sl)
    major, minor = torch.cuda.get_device_capability()
    assert p.path == "split_kv" and p.kernel == ("sm90" if (major, minor) == (9, 0) else "portable")
    assert p.splits > 1


def test_many_units_split_per_sequence():
    """512 (b, kv head) units, lengths 0 / 1 / odd / full among drawn ones: the default dense plan on the H200 splits
    per sequence (no split, no merge), right at every length."""
    B, H, Hkv, S = 64, 32, 8, 4096
    lens = [S, 1, 0, 7, S - 1] + torch.randint(1, S + 1, (B - 5,)).tolist()
    k, v, sl, _ = make_cache(B, Hkv, 128, lens, S, torch.bfloat16, DEV)
    q = torch.randn(B, H, 1, 128, device=DEV).bfloat16()
    plan = explain(q, k, v, sl)
    if torch.cuda.get_device_capability() == (9, 0):
        assert not plan.balanced and plan.splits == 1
    o, lse = oss.attention_with_kvcache(q, k, v, sl, return_lse=True)
    ro, rl = ref.attention_with_kvcache(q, k, v, sl)
    assert_matches(o, lse, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())


@pytest.mark.parametrize("dtype, D", [(torch.float64, 64), (torch.bfloat16, 320)], ids=["float64", "D320"])
def test_kernel_limits_take_the_torch_path(dtype, D):
    """float64 or a head dim past 256 on CUDA: the torch path by default (the plan says so), an error naming the
    function with backend="triton". (D = 320 and 512 at 64 query rows per kv head (G·Sq) took the kernels by
    default: OutOfResources, 262-332 KB of shared memory; D <= 256 fits at every row count.)"""
    k, v, sl, _ = make_cache(2, 1, D, [300, 5], 512, dtype, DEV)
    q = torch.randn(2, 16, 4, D, device=DEV, dtype=dtype)
    assert explain(q, k, v, sl).path == "torch"
    o = oss.attention_with_kvcache(q, k, v, sl)
    ro, _ = ref.attention_with_kvcache(q, k, v, sl)
    tol = 1e-9 if dtype == torch.float64 else 2e-2
    torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol)
    with pytest.raises((TypeError, ValueError), match="^attention_with_kvcache: backend='triton' takes"):
        oss.attention_with_kvcache(q, k, v, sl, backend="triton")


@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("B,H,Hkv", [(8, 32, 32), (64, 32, 8)])
def test_balanced_varied_lengths(page, B, H, Hkv):
    """The balanced schedule at varied lengths: a few long, many short, empty and one-key sequences."""
    S = 32768 if B == 8 else 4096
    lens = [S, 1, 0, 7, S // 3 + 1, 129, S - 1, 2][:B] + [(37 * b) % S for b in range(B - 8)]
    k, v, sl, table = make_cache(B, Hkv, 128, lens, S, torch.bfloat16, DEV, page=page)
    q = torch.randn(B, H, 1, 128, device=DEV).bfloat16()
    plan = explain(q, k, v, sl, block_table=table, knobs=Knobs.of(balanced=True))
    o, lse = attention_split_kv(q, k, v, sl, table, True, 128 ** -0.5, -1, -1, 0.0, plan)
    torch.cuda.synchronize()
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, table)
    assert_matches(o, lse, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())


@pytest.mark.parametrize("page", [0, 16])
def test_balanced_cuda_graph_replay_after_lengths_change(page):
    """The balanced schedule captured once, replayed after cache_seqlens (and block_table) change in place: the
    chunks are re-cut on the device from the new lengths."""
    B, H, Hkv, D, S = 4, 32, 8, 128, 16384
    k, v, sl, table = make_cache(B, Hkv, D, [S] * B, S, torch.bfloat16, DEV, page=page)
    q = torch.randn(B, H, 1, D, device=DEV).bfloat16()
    plan = explain(q, k, v, sl, block_table=table, knobs=Knobs.of(balanced=True))

    def step():
        return attention_split_kv(q, k, v, sl, table, True, D ** -0.5, -1, -1, 0.0, plan)
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = step()
    for lens in ([S] * B, [1, 17, 5000, 16383], [0, S, 2, 9999], [0, 0, 0, 1]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        if page:
            table.copy_(torch.randperm(table.numel(), device=DEV).int().reshape(table.shape))
            for c in (k, v):
                c[:-3].normal_()
            plant_nan(k, v, sl, table)
        else:
            for c in (k, v):
                c.normal_()
                for b, n in enumerate(lens):
                    c[b, :, n:] = float("nan")
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = ref.attention_with_kvcache(q, k, v, sl, table)
        assert_matches(o, lse, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())
