"""attention_with_kvcache against the fp64 reference: the torch path at many shapes, the split-KV kernels under the
interpreter at tiny ones (dense / paged, NaN in unused slots and pages, lengths 0 / 1 / odd / full, Sq 1-16,
GQA 1 / 4 / 8, window, softcap, strided caches, forced split counts); plans through ``explain``."""

import dataclasses

import pytest
import torch
from decode_inputs import assert_matches, make_cache

import onlinesoftmax as oss
from onlinesoftmax.decode import explain
from onlinesoftmax.decode.plan import (
    BALANCED_MAX_B,
    MAX_SPLITS,
    PAGED_BALANCED_MIN_B,
    Knobs,
    Problem,
    decode_plan,
    dense_tiles_fit,
    num_splits_heuristic,
    tiles_for,
)
from onlinesoftmax.reference import decode as ref
from onlinesoftmax.target import A100, H200, INTERPRETER, L4

CPU = torch.device("cpu")


def _run(q, k, v, lens, table, backend, plan=None, **kw):
    if plan is not None:        # the kernels with a forced plan (split counts, tiles)
        from onlinesoftmax.decode.launch import attention_split_kv

        left, right = kw.get("window") or (-1, -1)
        return attention_split_kv(q, k, v, lens, table, kw.get("causal", True), kw.get("scale") or q.shape[-1] ** -0.5,
                                  left, right, kw.get("softcap") or 0.0, plan)
    return oss.attention_with_kvcache(q, k, v, lens, block_table=table, return_lse=True, backend=backend, **kw)


def _check(B, H, Hkv, Sq, D, lens, s_max, dtype, device, backend, page=0, strided=False, knobs=None, **kw):
    k, v, sl, table = make_cache(B, Hkv, D, lens, s_max, dtype, device, page=page, strided=strided)
    q = torch.randn(B, H, Sq, D, device=device).to(dtype)
    plan = explain(q, k, v, sl, block_table=table, backend="triton", knobs=knobs) if knobs else None
    o, lse = _run(q, k, v, sl, table, backend, plan, **kw)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, H, Sq) and lse.dtype == torch.float32
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, table, **kw)
    lowp = 0.0
    if dtype != torch.float32:      # the eager result in q's dtype errs this much against fp64
        lowp = (ro.to(dtype).double() - ro).abs().max().item()
    assert_matches(o, lse, ro, rl, dtype, lowp)


# ---- the torch path -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [0, 1, 16, 256])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("Sq", [1, 3, 16])
def test_torch_path(page, H, Hkv, Sq):
    lens = [0, 1, 37, 300] if Sq == 1 else [Sq, Sq + 5, 300, 41]
    _check(4, H, Hkv, Sq, 32, lens, 300, torch.float32, CPU, "torch", page=page)


@pytest.mark.parametrize("kw", [dict(window=(7, -1)), dict(window=(3, 2), causal=False), dict(window=(0, 0)),
                                dict(softcap=1.5), dict(causal=False), dict(scale=0.3),
                                dict(window=(5, -1), softcap=2.0)])
def test_torch_path_options(kw):
    _check(3, 8, 2, 4, 16, [4, 50, 130], 130, torch.float32, CPU, "torch", page=16, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_path_half(dtype):
    _check(2, 8, 2, 2, 64, [9, 200], 256, dtype, CPU, "torch", page=16, strided=True)


def test_sq_above_length_rows_empty():
    """Sq > cache_seqlens[b] (an invalid call) leaves the rows with no key at 0 / -inf, not NaN."""
    _check(2, 4, 2, 5, 16, [3, 0], 8, torch.float32, CPU, "torch")


# ---- the split-KV kernels (interpreter on CPU) ---------------------------------------------------------------
KERNEL_CASES = [
    # B, H, Hkv, Sq, D, lens, s_max, page, splits, kw
    (3, 4, 4, 1, 32, [0, 1, 45], 45, 0, None, {}),
    (2, 8, 2, 1, 32, [70, 33], 70, 0, 3, {}),
    (2, 8, 1, 4, 16, [70, 9], 72, 16, 2, {}),
    (2, 4, 1, 16, 16, [16, 40], 40, 1, None, {}),
    (1, 8, 2, 3, 24, [77], 96, 32, 4, dict(window=(10, -1))),
    (2, 4, 2, 2, 16, [60, 31], 64, 0, 2, dict(softcap=3.0, window=(8, 1), causal=False)),
    (2, 4, 4, 1, 64, [100, 5], 256, 256, 2, {}),
    (1, 2, 1, 1, 16, [0], 16, 0, 2, {}),
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: f"B{c[0]}H{c[1]}kv{c[2]}Sq{c[3]}p{c[7]}s{c[8]}")
def test_kernel(case, kernel_device):
    B, H, Hkv, Sq, D, lens, s_max, page, splits, kw = case
    _check(B, H, Hkv, Sq, D, lens, s_max, torch.float32, kernel_device, "triton", page=page,
           knobs=Knobs.of(splits=splits) if splits else None, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_half_strided(dtype, kernel_device):
    _check(2, 8, 2, 2, 32, [50, 17], 64, dtype, kernel_device, "triton", strided=True, knobs=Knobs.of(splits=2))
    _check(2, 8, 2, 1, 32, [50, 17], 64, dtype, kernel_device, "triton", page=16, strided=True,
           knobs=Knobs.of(splits=3))


VARIANT_CASES = [
    # B, H, Hkv, Sq, D, lens, s_max, page, knobs, kw: the paged page-number read-ahead (ahead 1 / 2) and the
    # splits cut from the bound (programs past a sequence's end exit), at tile / page edges
    (3, 4, 2, 1, 32, [0, 1, 45], 48, 16, dict(ahead=1, splits=3), {}),
    (2, 8, 2, 2, 16, [70, 33], 80, 16, dict(ahead=2, splits=2), {}),
    (2, 4, 4, 1, 16, [37, 64], 64, 1, dict(ahead=2, splits=3), {}),
    (2, 4, 1, 3, 16, [100, 5], 256, 256, dict(ahead=2), dict(window=(20, -1))),
    (4, 4, 2, 1, 16, [0, 1, 17, 96], 96, 0, dict(bound=True, splits=6), {}),
    (3, 8, 2, 2, 16, [90, 16, 2], 96, 16, dict(bound=True, ahead=2, splits=4), dict(window=(30, -1))),
    (2, 4, 2, 1, 16, [40, 7], 48, 0, dict(bound=True), dict(softcap=2.0)),
    # more splits than the merge loads per step (MERGE_STEP = 16): three steps, empty splits among them
    (2, 4, 2, 1, 16, [700, 33], 704, 0, dict(splits=40), {}),
    # one page number per page (ahead 3): pages of 4 / 16 / 32 / 256 keys against the interpreter's 16-key tiles
    # (several pages per tile, one page per tile, several tiles per page), odd lengths, Sq 1 and 4, GQA, window,
    # softcap, bound splits
    (3, 8, 2, 1, 16, [0, 1, 45], 52, 4, dict(ahead=3, splits=3), dict(softcap=2.0)),
    (2, 8, 2, 4, 16, [70, 33], 80, 16, dict(ahead=3, splits=2), dict(window=(30, -1))),
    (3, 4, 1, 4, 16, [100, 5, 64], 128, 32, dict(ahead=3, bound=True, splits=4), {}),
    (2, 4, 4, 1, 32, [37, 256], 256, 256, dict(ahead=3, splits=3), dict(window=(20, -1), softcap=3.0)),
]


@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: f"B{c[0]}p{c[7]}-" + "-".join(f"{k}{v}" for k, v in
                                                                                             c[8].items()))
def test_kernel_variants(case, kernel_device):
    B, H, Hkv, Sq, D, lens, s_max, page, knobs, kw = case
    _check(B, H, Hkv, Sq, D, lens, s_max, torch.float32, kernel_device, "triton", page=page, knobs=Knobs.of(**knobs),
           **kw)


BALANCED_CASES = [
    # B, H, Hkv, Sq, D, lens, s_max, page, knobs, kw: the balanced schedule (chunks of the line of all sequences'
    # tiles) at chunk counts below, at and above the tile count T, empty sequences between others, windows whose
    # first tile starts mid-sequence, pages of 1 / 16 / 256 keys
    (4, 4, 4, 1, 32, [0, 1, 45, 17], 48, 0, dict(balanced=True), {}),
    (5, 4, 2, 1, 16, [0, 0, 33, 0, 1], 48, 0, dict(balanced=True, splits=13), {}),
    (4, 8, 2, 1, 16, [96, 3, 50, 16], 96, 0, dict(balanced=True, splits=5), {}),
    (3, 8, 2, 2, 16, [90, 16, 2], 96, 16, dict(balanced=True, ahead=2, splits=7), dict(window=(30, -1))),
    (3, 8, 2, 2, 16, [90, 16, 2], 96, 0, dict(balanced=True, splits=4), dict(window=(30, -1))),
    (2, 4, 1, 16, 16, [16, 40], 40, 1, dict(balanced=True, ahead=1, splits=3), {}),
    (2, 4, 2, 3, 16, [60, 31], 64, 0, dict(balanced=True, splits=11), dict(softcap=3.0, window=(8, 1), causal=False)),
    (3, 4, 4, 1, 64, [300, 5, 257], 512, 256, dict(balanced=True, splits=6), {}),
    (2, 8, 1, 4, 16, [70, 9], 72, 16, dict(balanced=True, splits=1), {}),
    # a sequence over more chunks than the merge loads per step (MERGE_SEGMENTS = 2): 13 of them
    (2, 4, 2, 1, 16, [200, 3], 208, 0, dict(balanced=True, splits=16), {}),
    # cross: one line over all kv heads (chunks spanning heads; counts not divisible by Hkv, above Hkv·T)
    (4, 8, 4, 1, 16, [0, 1, 45, 17], 48, 0, dict(balanced=True, cross=True, splits=7), {}),
    (5, 4, 2, 1, 16, [0, 0, 33, 0, 1], 48, 0, dict(balanced=True, cross=True, splits=13), {}),
    (3, 8, 2, 2, 16, [90, 16, 2], 96, 16, dict(balanced=True, cross=True, ahead=2, splits=5), dict(window=(30, -1))),
    (2, 4, 2, 16, 16, [16, 40], 40, 1, dict(balanced=True, cross=True, ahead=1, splits=3), {}),
    (3, 4, 4, 1, 64, [300, 5, 257], 512, 256, dict(balanced=True, cross=True, splits=9), {}),
    (2, 8, 1, 4, 16, [70, 9], 72, 0, dict(balanced=True, cross=True), {}),
    # the dense cache's tiles over pages (dense_tiles: one page number per page, read a tile ahead): pages of
    # 4 / 8 / 16 / 64 / 256 keys, odd lengths, an empty sequence, Sq 1 and 4, GQA 4, window, softcap, cross
    (4, 8, 2, 1, 16, [0, 45, 3, 50], 52, 4, dict(dense_tiles=True, splits=7), dict(softcap=2.0)),
    (3, 8, 2, 4, 16, [90, 16, 5], 96, 8, dict(dense_tiles=True, splits=5), dict(window=(30, -1))),
    (3, 8, 2, 4, 16, [90, 16, 5], 96, 16, dict(dense_tiles=True), {}),
    (3, 4, 4, 1, 32, [300, 5, 257], 512, 256, dict(dense_tiles=True, splits=6), dict(window=(100, -1))),
    (4, 8, 2, 1, 16, [0, 1, 129, 77], 192, 64, dict(dense_tiles=True, cross=True, splits=9), dict(softcap=3.0)),
]


@pytest.mark.parametrize("case", BALANCED_CASES, ids=lambda c: f"B{c[0]}Sq{c[3]}p{c[7]}-" + "-".join(
    f"{k}{v}" for k, v in c[8].items()))
def test_kernel_balanced(case, kernel_device):
    """The balanced schedule, its partial-state workspace planted with NaN first (a slot the merge reads but no
    program wrote would show)."""
    from onlinesoftmax._triton.launch import stream_scratch

    B, H, Hkv, Sq, D, lens, s_max, page, knobs, kw = case
    rows = H * Sq * (4096 + B)
    layout = ((rows * D, torch.float32), (rows, torch.float32), (B * H * Sq, torch.float32))    # o, lse, lse sink
    for t in stream_scratch("decode", kernel_device, layout, zeroed=0):
        t.fill_(float("nan"))
    _check(B, H, Hkv, Sq, D, lens, s_max, torch.float32, kernel_device, "triton", page=page, knobs=Knobs.of(**knobs),
           **kw)


def test_kernel_rows_over_blocks(kernel_device):
    """G·Sq = 32 rows > the interpreter's 16-row blocks: two row blocks per kv head."""
    _check(1, 8, 1, 4, 16, [40], 40, torch.float32, kernel_device, "triton", knobs=Knobs.of(splits=2))


def test_kernel_strided_q_and_sq_one_size_one(kernel_device):
    """q from a [B, Sq, H, D] buffer; every size 1 where it can be (Triton specialises 1)."""
    dev = kernel_device
    k, v, sl, _ = make_cache(1, 1, 16, [1], 1, torch.float32, dev)
    q = torch.randn(1, 1, 1, 16, device=dev)
    o, lse = oss.attention_with_kvcache(q, k, v, sl, return_lse=True, backend="triton")
    ro, rl = ref.attention_with_kvcache(q, k, v, sl)
    assert_matches(o, lse, ro, rl, torch.float32)
    k, v, sl, _ = make_cache(2, 2, 32, [20, 9], 24, torch.float32, dev)
    q = torch.randn(2, 3, 8, 32, device=dev).transpose(1, 2)
    o, lse = oss.attention_with_kvcache(q, k, v, sl, return_lse=True, backend="triton")
    ro, rl = ref.attention_with_kvcache(q, k, v, sl)
    assert_matches(o, lse, ro, rl, torch.float32)


def test_return_and_defaults():
    k, v, sl, _ = make_cache(1, 2, 16, [5], 8, torch.float32, CPU)
    q = torch.randn(1, 2, 1, 16)
    o = oss.attention_with_kvcache(q, k, v, sl)
    assert isinstance(o, torch.Tensor) and o.shape == q.shape


@pytest.mark.interpreter
def test_errors():
    k, v, sl, table = make_cache(2, 2, 16, [5, 6], 16, torch.float32, CPU, page=4)
    q = torch.randn(2, 4, 1, 16)
    with pytest.raises(TypeError, match="cache_seqlens"):
        oss.attention_with_kvcache(q, k, v, sl.float(), block_table=table)
    with pytest.raises(TypeError, match="block_table"):
        oss.attention_with_kvcache(q, k, v, sl, block_table=table.float())
    with pytest.raises(ValueError, match="multiple"):
        oss.attention_with_kvcache(torch.randn(2, 3, 1, 16), k, v, sl, block_table=table)
    with pytest.raises(TypeError, match="window"):
        oss.attention_with_kvcache(q, k, v, sl, block_table=table, window=5)
    with pytest.raises(TypeError, match="dtype"):
        oss.attention_with_kvcache(q.half(), k, v, sl, block_table=table)
    with pytest.raises(ValueError, match="backend"):
        oss.attention_with_kvcache(q, k, v, sl, block_table=table, backend="cuda")
    # CPU tensors: a page a sequence reads must be one of the cache's (a negative one indexed from the end); entries
    # past a sequence's last page are never read, whatever they hold
    n = k.shape[0]
    for backend in ("torch", "triton"):
        for page in (n, -1):
            bad = table.clone()
            bad[1, 1] = page                    # sequence 1 (6 keys, pages of 4) reads entries 0 and 1
            with pytest.raises(IndexError, match=rf"^attention_with_kvcache: block_table\[1, 1\] = {page} "):
                oss.attention_with_kvcache(q, k, v, sl, block_table=bad, backend=backend)
        unused = table.clone()
        unused[:, 2:] = -7
        torch.testing.assert_close(oss.attention_with_kvcache(q, k, v, sl, block_table=unused, backend=backend),
                                   oss.attention_with_kvcache(q, k, v, sl, block_table=table, backend=backend))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_opcheck(backend, kernel_device):
    dev = kernel_device if backend == "triton" else CPU
    for page in (0, 4):
        k, v, sl, table = make_cache(2, 2, 16, [5, 9], 16, torch.float32, dev, page=page, strided=True)
        q = torch.randn(2, 1, 4, 16, device=dev).transpose(1, 2)     # [B, Sq, H, D] seen as [B, H, Sq, D]
        torch.library.opcheck(torch.ops.onlinesoftmax.attention_with_kvcache.default,
                              (q, k, v, sl, table, True, 0.25, -1, -1, 0.0, backend))


@pytest.mark.parametrize("page", [4, 0], ids=["paged", "dense"])
def test_compile_fullgraph(page):
    """Paged and dense caches (the dense CPU lengths' range check is eager-only: under torch.compile it read a
    data-dependent value and failed to trace)."""
    k, v, sl, table = make_cache(2, 2, 16, [5, 9], 16, torch.float32, CPU, page=page)
    q = torch.randn(2, 4, 2, 16)
    f = torch.compile(lambda *a: oss.attention_with_kvcache(*a[:4], block_table=a[4], return_lse=True),
                      fullgraph=True, backend="aot_eager")
    o, lse = f(q, k, v, sl, table)
    ro, rl = oss.attention_with_kvcache(q, k, v, sl, block_table=table, return_lse=True)
    torch.testing.assert_close(o, ro)
    torch.testing.assert_close(lse, rl)


def test_head_dim_zero_is_an_error():
    q = torch.randn(1, 2, 1, 0)
    k = torch.randn(1, 2, 8, 0)
    with pytest.raises(ValueError, match="attention_with_kvcache: the head dim"):
        oss.attention_with_kvcache(q, k, k, torch.tensor([3], dtype=torch.int32))


# ---- plans ----------------------------------------------------------------------------------------------------
def _meta(B, H, Hkv, Sq, D, S, page=0, dtype=torch.bfloat16):
    q = torch.empty(B, H, Sq, D, dtype=dtype, device="meta")
    if page:
        k = torch.empty(B * -(-S // page), Hkv, page, D, dtype=dtype, device="meta")
        table = torch.empty(B, -(-S // page), dtype=torch.int32, device="meta")
    else:
        k, table = torch.empty(B, Hkv, S, D, dtype=dtype, device="meta"), None
    return q, k, k, torch.empty(B, dtype=torch.int32, device="meta"), table


def test_plans_per_target():
    q, k, v, sl, _ = _meta(1, 32, 8, 1, 128, 131072)
    p = explain(q, k, v, sl, target=H200)
    assert (p.path, p.kernel) == ("split_kv", "sm90") and p.splits > 1 and p.block_m == 16
    for t in (A100, L4):
        assert explain(q, k, v, sl, target=t).kernel == "portable"
    assert explain(q, k, v, sl, target=INTERPRETER).fast is False
    cpu = [torch.zeros(t.shape, dtype=t.dtype) for t in (q, k, v, sl)]     # (lengths are checked on the CPU)
    assert explain(*cpu).path == "torch"


def test_explain_takes_the_calls_keywords():
    """explain accepts attention_with_kvcache's keywords (they do not change the plan); a misspelled one is a
    TypeError, not a dense plan for a paged cache."""
    q, k, v, sl, _ = _meta(2, 8, 2, 1, 64, 4096)
    base = explain(q, k, v, sl, target=H200)
    assert explain(q, k, v, sl, target=H200, causal=False, scale=0.1, window=(128, -1), softcap=30.0,
                   return_lse=True) == base
    with pytest.raises(TypeError):
        explain(q, k, v, sl, target=H200, blocktable=None)


def test_split_count_from_shapes_only():
    """Per-sequence splits (paged caches; dense ones on request): many (b, kv head) programs: no split; one long
    sequence: many; bounded. Dense caches on the H200 run the balanced schedule: one program per SM over all
    sequences' tiles (up to BALANCED_MAX_B sequences and below 3 (b, kv head) units per SM: more fill the SMs
    without a split), paged ones from PAGED_BALANCED_MIN_B sequences. Only shapes enter the plan."""
    per_seq = Knobs.of(balanced=False)
    big = explain(*_meta(64, 32, 8, 1, 128, 4096)[:4], target=H200, knobs=per_seq)
    assert big.splits == 1
    long = explain(*_meta(1, 32, 8, 1, 128, 131072)[:4], target=H200, knobs=per_seq)
    assert 1 < long.splits <= MAX_SPLITS
    short = explain(*_meta(1, 32, 8, 1, 128, 64)[:4], target=H200, knobs=per_seq)
    assert short.splits == 1                  # one tile: nothing to split
    paged = explain(*_meta(1, 32, 8, 1, 128, 131072, page=16)[:4], block_table=_meta(1, 32, 8, 1, 128, 131072,
                                                                                       page=16)[4], target=H200)
    assert paged.splits == long.splits and not paged.balanced
    dense = explain(*_meta(32, 32, 8, 1, 128, 4096)[:4], target=H200)
    assert dense.balanced and dense.splits * 8 == H200.sm_count // 8 * 8       # one program per SM: 16 per kv head
    many = explain(*_meta(64, 32, 8, 1, 128, 4096)[:4], target=H200)         # 512 units on 132 SMs
    assert not many.balanced and many.splits == 1
    assert explain(*_meta(64, 32, 8, 1, 128, 4096)[:4], target=H200, knobs=Knobs.of(balanced=True)).balanced
    assert explain(*_meta(49, 32, 8, 1, 128, 4096)[:4], target=H200).balanced  # 392 units: < 3 per SM
    assert not explain(*_meta(50, 32, 8, 1, 128, 4096)[:4], target=H200).balanced
    assert explain(*_meta(64, 32, 8, 1, 128, 4096)[:4], target=A100).splits == 1
    assert not explain(*_meta(BALANCED_MAX_B + 1, 8, 8, 1, 128, 64)[:4], target=H200).balanced
    tiles = tiles_for(H200)
    for B in (1, 2, 4, 8, 16, 64):
        for S in (1024, 32768, 131072):
            s = num_splits_heuristic(B, 8, 1, S, H200.sm_count, tiles)
            assert 1 <= s <= MAX_SPLITS
            assert s <= max(1, -(-S // (tiles.block_n * 4)))


def test_balanced_occupancy_register_cap():
    """The paged balanced schedule fills 3 programs of 4 warps per SM: the plan caps their registers at 168 (the
    causal mask of Sq > 1 rows took 200: 2 programs per SM, the grid in 1.5 waves); row blocks past 16 rows take
    more shared memory and aim for 2 per SM, uncapped; dense balanced plans (one program per SM) and other targets
    are not capped."""
    paged = {Sq: decode_plan(Problem(8, 32, 8, Sq, 128, 32768, 16), H200) for Sq in (1, 4, 8, 16)}
    assert all(pl.balanced and pl.num_warps == 4 for pl in paged.values())
    assert paged[1].maxnreg == paged[4].maxnreg == 168 and paged[1].block_m == paged[4].block_m == 16
    assert [paged[Sq].per_sm for Sq in (1, 4, 8, 16)] == [3, 3, 2, 2]
    assert paged[1].splits == paged[4].splits == H200.sm_count * 3 // 8
    for Sq in (8, 16):                  # 32 and 64 rows per program (G = 4)
        assert paged[Sq].block_m == 4 * Sq and paged[Sq].maxnreg == 0
        assert paged[Sq].splits == H200.sm_count * 2 // 8
    assert decode_plan(Problem(8, 32, 8, 4, 128, 32768), H200).maxnreg == 0            # dense: 1 per SM
    assert decode_plan(Problem(8, 32, 8, 4, 128, 32768, 16), A100).maxnreg == 0
    assert decode_plan(Problem(8, 32, 8, 4, 128, 32768, 16), H200, Knobs.of(maxnreg=0)).maxnreg == 0


def test_knobs():
    p = Problem(1, 8, 2, 1, 64, 1000)
    assert decode_plan(p, H200, Knobs.of(splits=7)).splits == 7
    with pytest.raises(TypeError):
        Knobs.of(split=7)
    with pytest.raises(ValueError):
        decode_plan(p, H200, Knobs.of(block_m=24))
    assert decode_plan(p, H200, Knobs.of(ahead=2)).ahead == 0          # dense: no page numbers to read ahead
    assert decode_plan(Problem(1, 8, 2, 1, 64, 1024, 16), H200, Knobs.of(ahead=2, bound=True)).ahead == 2
    assert decode_plan(p, H200, Knobs.of(bound=True)).bound and not decode_plan(p, H200).bound
    # the occupancy-based split count: 512 (b, kv head) programs on 3 x 132 slots split 3 ways (3.9 full waves)
    assert decode_plan(Problem(64, 32, 8, 1, 128, 4096), H200,
                       Knobs.of(programs_per_sm=3, balanced=False)).splits == 3
    assert decode_plan(Problem(64, 32, 8, 1, 128, 4096), H200, Knobs.of(balanced=False)).splits == 1
    for B, S in ((1, 131072), (8, 32768), (2, 64)):
        s = decode_plan(Problem(B, 32, 8, 1, 128, S), H200, Knobs.of(programs_per_sm=3, balanced=False)).splits
        assert 1 <= s <= max(1, S // 256)
    # the balanced schedule (dense caches' default, one program per SM): programs per (kv head, row block) from the
    # slots alone, whatever the lengths; paged caches split per sequence unless asked
    bal = decode_plan(Problem(8, 32, 8, 1, 128, 32768), H200)
    assert bal.balanced and bal.splits == 132 // 8 and decode_plan(p, H200).balanced
    assert decode_plan(Problem(8, 32, 8, 1, 128, 32768), H200, Knobs.of(programs_per_sm=2)).splits == 2 * 132 // 8
    assert not decode_plan(dataclasses.replace(p, page=16), H200).balanced
    assert decode_plan(dataclasses.replace(p, page=16), H200, Knobs.of(balanced=True)).balanced
    # paged caches of PAGED_BALANCED_MIN_B to BALANCED_MAX_B sequences: balanced, 3 programs of 4 warps per SM
    for B in (PAGED_BALANCED_MIN_B, BALANCED_MAX_B):
        pb = decode_plan(Problem(B, 32, 8, 1, 128, 32768, 16), H200)
        assert (pb.balanced, pb.splits, pb.num_warps, pb.num_stages, pb.ahead) == (True, 3 * 132 // 8, 4, 3, 2)
        own = decode_plan(Problem(B, 32, 8, 1, 128, 32768, 16), H200, Knobs.of(balanced=False))
        assert (own.balanced, own.num_warps, own.num_stages) == (False, 8, 4)      # the per-sequence tiles
    for B in (PAGED_BALANCED_MIN_B - 1, BALANCED_MAX_B + 1):
        assert not decode_plan(Problem(B, 32, 8, 1, 128, 32768, 16), H200).balanced
    assert not decode_plan(Problem(64, 32, 8, 1, 128, 4096, 16), A100).balanced
    assert decode_plan(Problem(8, 32, 32, 1, 128, 32768), H200, Knobs.of(balanced=True, programs_per_sm=1)).splits == 4
    assert decode_plan(Problem(1, 8, 8, 1, 128, 256), H200, Knobs.of(balanced=True)).splits == 2   # one per tile
    # across kv heads: the chunks of one line fill every SM (132, not 16 · 8 = 128); cross needs balanced
    wide = Problem(32, 32, 8, 1, 128, 4096)
    xh = decode_plan(wide, H200, Knobs.of(cross=True))
    assert xh.balanced and xh.cross and xh.splits == 132 and decode_plan(wide, H200).splits == 16
    assert not decode_plan(wide, H200).cross and not decode_plan(wide, H200, Knobs.of(cross=True, balanced=False)).cross
    assert decode_plan(Problem(2, 300, 300, 1, 128, 4096), H200, Knobs.of(balanced=True)).splits == 1
    # dense_tiles: a paged cache takes the dense cache's tiles and schedule, page numbers one per page (ahead 3);
    # the default on sm_90 where a page holds whole dense tiles (page 256); dense_tiles=False keeps the paged tiles
    for page in (16, 256):
        pp = Problem(8, 32, 8, 1, 128, 16384, page)
        dt = decode_plan(pp, H200, Knobs.of(dense_tiles=True))
        dense = decode_plan(dataclasses.replace(pp, page=0), H200)
        assert dataclasses.replace(dt, ahead=0) == dense and dt.ahead == 3
        assert dense_tiles_fit(pp, H200) == (page == 256)
        assert (decode_plan(pp, H200) == dt) == (page == 256)
        assert decode_plan(pp, H200, Knobs.of(dense_tiles=False)).ahead == 2
    assert not dense_tiles_fit(Problem(8, 32, 8, 1, 128, 16384, 256), INTERPRETER)
    assert decode_plan(Problem(8, 32, 8, 1, 128, 16384, 16), INTERPRETER, Knobs.of(dense_tiles=True)).ahead == 3
    with pytest.raises(ValueError):         # one page number per page: 48-key pages against 64-key tiles
        decode_plan(Problem(8, 32, 8, 1, 128, 16368, 48), H200, Knobs.of(ahead=3))
    assert dataclasses.is_dataclass(decode_plan(p, H200))
    with pytest.raises(dataclasses.FrozenInstanceError):
        decode_plan(p, H200).splits = 3


@pytest.mark.parametrize("page", [0, 4])
def test_strided_lengths_and_table(page, kernel_device):
    """cache_seqlens and a block table with non-unit inner strides are read as the values they hold (the kernels
    index them at unit stride: such views are made contiguous first)."""
    dev, B, H, Hkv, D = kernel_device, 3, 4, 2, 16
    k, v, sl, bt = make_cache(B, Hkv, D, [37, 5, 20], 40, torch.float32, dev, page=page)
    q = torch.randn(B, H, 1, D, device=dev)
    sl2 = torch.stack([sl, torch.zeros_like(sl)], 1)[:, 0]            # stride 2
    bt2 = None if bt is None else bt.t().contiguous().t()             # inner stride B
    o, lse = oss.attention_with_kvcache(q, k, v, sl2, block_table=bt2, return_lse=True, backend="triton")
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, block_table=bt)
    assert_matches(o, lse, ro, rl, torch.float32)


def test_gradients_take_the_torch_path(kernel_device):
    """q / k_cache / v_cache requiring grad: the eager call is differentiable on either backend (the kernels have
    no backward: the triton backend takes torch ops there), gradients as the torch backend's."""
    q = torch.randn(2, 4, 1, 16, device=kernel_device, requires_grad=True)
    k, v = (torch.randn(2, 2, 8, 16, device=kernel_device, requires_grad=True) for _ in range(2))
    lens = torch.tensor([8, 5], dtype=torch.int32, device=kernel_device)
    grads = []
    for backend in ("torch", "triton"):
        o = oss.attention_with_kvcache(q, k, v, lens, backend=backend)
        assert o.grad_fn is not None
        grads.append(torch.autograd.grad(o.square().sum(), (q, k, v)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        assert oss.attention_with_kvcache(q, k, v, lens, backend="triton").grad_fn is None


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("page", [0, 4])
def test_torch_func_transforms(backend, page, kernel_device):
    """vmap raised on both paths (the torch path wrote each sequence's rows into an unbatched [B, ...] buffer: "vmap:
    inplace arithmetic ... is not possible"; the kernels "Cannot access storage of BatchedTensorImpl"), jvp on the
    Triton path "... of TensorWrapper". Under torch.func the torch path runs, its rows stacked: as a loop over the
    vmapped dim, and jvp as the torch backend's."""
    B, H, Hkv, D, s_max = 3, 4, 2, 16, 12
    k, v, lens, table = make_cache(B, Hkv, D, [12, 0, 5], s_max, torch.float32, kernel_device, page=page)
    qs = torch.randn(2, B, H, 2, D, device=kernel_device)
    f = lambda q, k, v, backend=backend: oss.attention_with_kvcache(        # noqa: E731
        q, k, v, lens, block_table=table, return_lse=True, backend=backend)
    for in_dims in [(0, None, None), (0, 0, 0)]:
        kv = [t if d is None else torch.stack([t, t.flip(-1)]) for t, d in zip((k, v), in_dims[1:])]
        o, lse = torch.func.vmap(f, in_dims=in_dims)(qs, *kv)
        for i in range(2):
            ro, rl = f(qs[i], *(t if d is None else t[i] for t, d in zip(kv, in_dims[1:])))
            torch.testing.assert_close(o[i], ro)
            torch.testing.assert_close(lse[i], rl)
    tq = torch.randn_like(qs[0])
    got = torch.func.jvp(lambda q: f(q, k, v)[0], (qs[0],), (tq,))
    want = torch.func.jvp(lambda q: f(q, k, v, "torch")[0], (qs[0],), (tq,))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kw, err, msg", [
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(scale=True), TypeError, "scale must be None or a float"),
    (dict(softcap=float("inf")), ValueError, "softcap must be a positive finite"),
    (dict(softcap=0.0), ValueError, "softcap must be a positive finite"),
    (dict(causal=1), TypeError, "causal must be a bool"),
])
def test_scalar_arguments_checked_as_attention(kw, err, msg):
    q = torch.randn(1, 2, 1, 16)
    k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(err, match=f"attention_with_kvcache: {msg}"):
        oss.attention_with_kvcache(q, k, v, torch.tensor([8], dtype=torch.int32), **kw)


def test_dense_lengths_past_the_cache():
    q = torch.randn(1, 2, 1, 16)
    k = v = torch.randn(1, 2, 8, 16)
    msg = "attention_with_kvcache: cache_seqlens holds 12, past the dense cache.s S_max = 8"
    with pytest.raises(ValueError, match=msg):
        oss.attention_with_kvcache(q, k, v, torch.tensor([12], dtype=torch.int32))


def test_paged_lengths_past_the_cache():
    """A paged cache holds max_pages · page_size keys per sequence: a longer length is an error for CPU lengths, as
    for a dense cache (the torch path clamped it and the kernels did not: 40 keys over 2 pages of 16 gave other rows
    on each backend)."""
    q = torch.randn(2, 2, 2, 16)
    k = v = torch.randn(4, 2, 16, 16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    msg = r"attention_with_kvcache: cache_seqlens holds 40, past the paged cache.s max_pages · page_size = 32"
    with pytest.raises(ValueError, match=msg):
        oss.attention_with_kvcache(q, k, v, torch.tensor([20, 40], dtype=torch.int32), block_table=table)


@pytest.mark.parametrize("page", [0, 4])
def test_negative_lengths(page):
    """A negative length is an error for CPU lengths (it was taken as an empty sequence, silently)."""
    k, v, _, table = make_cache(2, 2, 16, [5, 6], 8, torch.float32, CPU, page=page)
    q = torch.randn(2, 2, 1, 16)
    with pytest.raises(ValueError, match="attention_with_kvcache: cache_seqlens holds -1, a negative length"):
        oss.attention_with_kvcache(q, k, v, torch.tensor([5, -1], dtype=torch.int32), block_table=table)


@pytest.mark.parametrize("page", [0, 4], ids=["dense", "paged"])
def test_shapes_of_meta_and_fake_tensors(page):
    """Meta tensors and FakeTensorMode propagate o's and lse's shapes, as the other public ops do (the torch path read
    cache_seqlens: "Cannot copy out of meta tensor", and the CPU range checks a DataDependentOutputException)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def call(device):
        q = torch.empty(2, 4, 3, 16, device=device)
        k = torch.empty(4 if page else 2, 2, page or 8, 16, device=device)
        table = torch.zeros(2, 2, dtype=torch.int32, device=device) if page else None
        lens = torch.full((2,), 5, dtype=torch.int32, device=device)
        return oss.attention_with_kvcache(q, k, k, lens, block_table=table, return_lse=True)

    o, lse = call("meta")
    assert o.shape == (2, 4, 3, 16) and lse.shape == (2, 4, 3) and o.device.type == "meta"
    with FakeTensorMode():
        o, lse = call("cpu")
    assert o.shape == (2, 4, 3, 16) and lse.shape == (2, 4, 3) and lse.dtype == torch.float32
