"""``launch.DecodeCall``: decode's bound shape classes (hit along a growing cache, new for a new shape) and their
lanes of ints, checked on the CPU against the ``BoundKernel`` route's arguments with fake compiled kernels (the
H200's launches run in tests/decode/test_decode_gpu.py); results through the interpreter against the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from decode_inputs import assert_matches, make_cache

import onlinesoftmax as oss
from onlinesoftmax._triton import launch as shared
from onlinesoftmax.decode.plan import Knobs, Problem, decode_plan
from onlinesoftmax.reference import decode as ref
from onlinesoftmax.target import H200, INTERPRETER, target_of

launch = pytest.importorskip("onlinesoftmax.decode.launch")
HEAD = (1, 1, 1, 0, False, False, None, None, (4, 1, 0), None, None, None)     # a C launcher's head, stream aside


def _clear():
    for cache in (launch._bound_split, launch._bound_balanced):
        cache.cache_clear()


@pytest.fixture
def fake_gpu(monkeypatch):
    """BoundKernels whose every compile key has a fake compiled kernel that records its C launcher's arguments; the
    launch module sees a CUDA device (raw launches, current device 0)."""
    seen = []

    def record(*args):
        seen.append(args)

    class Fake(shared.BoundKernel):
        def __init__(self, fn, grid, meta):
            super().__init__(fn, grid, meta)
            self.interpret = False
            self.tail = tuple(meta[a] for a in fn.arg_names if a in meta)      # the constexprs, in order
            self._compiled = Always((record, HEAD, None))

        def __call__(self, args, check, device):
            return super().__call__(args, check, torch.device("cuda", 0))

    monkeypatch.setattr(launch, "BoundKernel", Fake)
    monkeypatch.setattr(shared, "current_device", lambda: 0)
    monkeypatch.setattr(shared, "current_stream", lambda index: None)      # a CPU call's stream
    monkeypatch.setattr(launch, "raw_launches", lambda device: True)
    monkeypatch.setattr(launch, "_calls", {})
    _clear()
    yield seen
    _clear()


class Always(dict):
    """Every key has the one entry (a fake compiled kernel for any alignment and dtypes)."""

    def __init__(self, entry):
        super().__init__()
        self.entry = entry

    def get(self, key, default=None):
        return self.entry


def _ptrs(args):
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


def _want(call, q, k, v, lens, bt, o, lse):
    """What the BoundKernel route passes for this call (tensors as their data_ptr())."""
    bound = call.last[1]
    s_max = bt.shape[1] * call.page if bt is not None else k.shape[2]
    if lens is None:
        tab, first = call.table[:2]
        lens = tab[s_max - first, :call.B]
    po, pl, pw = bound.ws
    out = []
    for kern, args, _ in bound.launches:
        a = args(q, k, v, lens, lens if bt is None else bt, o, pw if lse is None else lse, po, pl, s_max, k.stride(),
                 v.stride(), bt.stride(0) if bt is not None else 1)
        out.append(_ptrs((*HEAD[:3], None, *HEAD[3:], *a, *kern.tail)))
    return out


@pytest.mark.parametrize("balanced", [False, True], ids=["split", "balanced"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("Sq", [1, 4])
def test_lanes_pass_the_bound_routes_arguments(fake_gpu, monkeypatch, balanced, paged, Sq):
    """The first call of a class goes through ``BoundKernel`` and binds the lanes; later calls pass exactly what that
    route would (tensors as ``data_ptr()``) with this call's tensors, lengths and strides, across classes of 16
    lengths and S % 16 == 0; a misaligned q takes the bound route."""
    seen = fake_gpu
    knobs = Knobs.of(balanced=balanced, splits=3)
    monkeypatch.setattr(launch, "cached_plan", lambda p, device: decode_plan(p, INTERPRETER, knobs))
    B, H, Hkv, D, page = 3, 4, 2, 16, 8
    q = torch.randn(B, Sq, H, D).transpose(1, 2)
    kv_store = torch.randn(2, B * Hkv * 80 * D)
    bound_before = set()
    for need_lse in (True, False):
        for S in range(40, 66):
            if paged:
                k, v, lens, bt = make_cache(B, Hkv, D, [S] * B, S, torch.float32, q.device, page=page)
                full = False
            else:
                k, v = (kv_store[i, :B * Hkv * S * D].view(B, Hkv, S, D) for i in range(2))
                bt, full = None, S % 3 == 0        # the full-cache route (a lengths table) or given lengths
                lens = None if full else torch.full((B,), S, dtype=torch.int32)
            seen.clear()
            o, lse = launch.attention_decode(q, k, v, lens, bt, True, 0.25, -1, -1, 0.0, need_lse)
            assert (lse is not None) == need_lse and o.shape == (B, H, Sq, D)
            assert len(launch._calls) == 1 + (not need_lse)
            call = [c for c in launch._calls.values() if c.need_lse == need_lse][0]
            assert [_ptrs(a) for a in seen] == _want(call, q, k, v, lens, bt, o, lse)
            bound = call.last[1]
            assert bound.lanes is not None
            if id(bound) in bound_before:           # not the class's first call: the lanes, all ints
                assert not any(isinstance(a, torch.Tensor) for s in seen for a in s)
            bound_before.add(id(bound))
    seen.clear()
    qm = torch.randn(B * H * Sq * D + 1)[1:].view(B, Sq, H, D).transpose(1, 2)    # misaligned: tensors
    launch.attention_decode(qm, k, v, lens, bt, True, 0.25, -1, -1, 0.0, False)
    assert seen and all(any(isinstance(a, torch.Tensor) for a in s) for s in seen)


def test_calls_cached_per_shape_class(fake_gpu):
    """A growing cache hits one DecodeCall; q's shape or strides, the heads, masking, scale, lse make new ones."""
    B, H, Hkv, D = 2, 4, 2, 16
    q = torch.randn(B, H, 1, D)
    for S in (30, 31, 47, 48, 49):
        k = torch.randn(B, Hkv, S, D)
        launch.attention_decode(q, k, k, None, None, True, 0.25, -1, -1, 0.0, False)
    assert len(launch._calls) == 1
    call = next(iter(launch._calls.values()))
    assert len(call.bound) == 4          # classes 32, 48 (S % 16 == 0 and not), 64; 30 and 31 share one
    launch_kept = launch.BOUND_KEPT
    try:                                  # a long generation's classes are kept up to BOUND_KEPT, then dropped
        launch.BOUND_KEPT = 5
        for S in (65, 81, 97):
            launch.attention_decode(q, torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D), None, None, True, 0.25,
                                    -1, -1, 0.0, False)
        assert len(call.bound) == 2       # 4 + 65's class = 5 kept; 81's class found them full: 81, 97
    finally:
        launch.BOUND_KEPT = launch_kept
    k = torch.randn(B, Hkv, 50, D)
    for args in ((q, None, None, True, 0.5, -1, -1, 0.0, False), (q, None, None, False, 0.25, -1, -1, 0.0, False),
                 (q, None, None, True, 0.25, 7, -1, 0.0, False), (q, None, None, True, 0.25, -1, -1, 0.0, True),
                 (torch.randn(B, 1, H, D).transpose(1, 2), None, None, True, 0.25, -1, -1, 0.0, False)):
        n = len(launch._calls)
        launch.attention_decode(args[0], k, k, *args[1:])
        assert len(launch._calls) == n + 1


def test_lengths_table_rows():
    """The full cache's lengths: row S - S0 of the table holds B copies of S; a length past it makes a new one."""
    _clear()
    q = torch.randn(3, 2, 1, 16)
    call = launch.DecodeCall(q, 1, 0, (False, True, False, False, False, True), (0.25, 0.0, -1, -1), False)
    tab, first, end, ptr, row = call._new_table(5000)
    assert first <= 5000 < end and row == 16 and tab.data_ptr() == ptr
    for S in (first, 5000, end - 1):
        assert tab[S - first, :3].tolist() == [S] * 3
    assert call._new_table(end)[1] <= end


@pytest.mark.parametrize("page", [0, 4])
def test_strided_lengths_and_table(page, kernel_device):
    """cache_seqlens and a block table with non-unit inner strides read as the values they hold."""
    dev, B, H, Hkv, D = kernel_device, 3, 4, 2, 16
    lens = [37, 5, 20]
    k, v, sl, bt = make_cache(B, Hkv, D, lens, 40, torch.float32, dev, page=page)
    q = torch.randn(B, H, 1, D, device=dev)
    sl2 = torch.stack([sl, torch.zeros_like(sl)], 1)[:, 0]
    bt2 = None if bt is None else bt.t().contiguous().t()
    o, lse = oss.attention_with_kvcache(q, k, v, sl2, block_table=bt2, return_lse=True, backend="triton")
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, block_table=bt)
    assert_matches(o, lse, ro, rl, torch.float32)


def test_full_cache_and_kvcache_routes_agree(kernel_device):
    """oss.attention's decode dispatch (lengths table) and attention_with_kvcache over the same full cache, with and
    without lse, along a few growing lengths, against the reference."""
    dev, B, H, Hkv, D = kernel_device, 2, 4, 2, 16
    q = torch.randn(B, 1, H, D, device=dev).transpose(1, 2)
    store = torch.randn(2, B * Hkv * 2052 * D, device=dev)
    for S in (2048, 2049, 2051):
        k, v = (store[i, :B * Hkv * S * D].view(B, Hkv, S, D) for i in range(2))
        sl = torch.full((B,), S, dtype=torch.int32, device=dev)
        o, lse = oss.attention(q, k, v, causal=True, return_lse=True, backend="triton")
        o2, lse2 = oss.attention_with_kvcache(q, k, v, sl, return_lse=True, backend="triton")
        plans = [launch.cached_plan(dataclasses.replace(_problem(q, k), full=f), q.device) for f in (True, False)]
        if plans[0] == plans[1]:        # the interpreter's tiles split per sequence either way
            assert torch.equal(o, o2) and torch.equal(lse, lse2)
        assert torch.equal(oss.attention(q, k, v, causal=True, backend="triton"), o)
        ro, rl = ref.attention_with_kvcache(q, k, v, sl)
        assert_matches(o, lse, ro, rl, torch.float32)
        assert_matches(o2, lse2, ro, rl, torch.float32)


def _problem(q, k):
    B, H, Sq, D = q.shape
    return Problem(B, H, k.shape[1], Sq, D, k.shape[2], 0, q.element_size())


def test_full_cache_splits_per_sequence(fake_gpu):
    """A full cache (``oss.attention``'s decode dispatch, no lengths) and the same cache with lengths bind apart in one
    DecodeCall: on the H200 the full one splits per sequence (nothing to balance, no segment merge), the other runs
    the balanced schedule (lengths unknown to the host)."""
    B, H, Hkv, S, D = 8, 32, 32, 32768, 128
    assert not decode_plan(Problem(B, H, Hkv, 1, D, S, full=True), H200).balanced
    assert decode_plan(Problem(B, H, Hkv, 1, D, S), H200).balanced
    assert decode_plan(Problem(B, H, Hkv, 1, D, S, full=True), H200, Knobs.of(balanced=True)).balanced
    q = torch.randn(2, 4, 1, 16)
    k = torch.randn(2, 2, 40, 16)
    lens = torch.full((2,), 40, dtype=torch.int32)
    launch.attention_decode(q, k, k, None, None, True, 0.25, -1, -1, 0.0, False)
    call = next(iter(launch._calls.values()))
    assert call.last[1].problem.full
    launch.attention_decode(q, k, k, lens, None, True, 0.25, -1, -1, 0.0, False)
    assert len(launch._calls) == 1 and len(call.bound) == 2 and not call.last[1].problem.full


# ---- on the GPU: the lanes against the BoundKernel route, bit for bit -------------------------------------------
def _gpu_plan(monkeypatch, balanced):
    """cached_plan with the balanced knob (None: the default plan); the DecodeCalls bound before are dropped."""
    if balanced is not None:
        target = target_of(torch.device("cuda"))
        monkeypatch.setattr(launch, "cached_plan",
                            lambda p, device: decode_plan(p, target, Knobs.of(balanced=balanced)))
    monkeypatch.setattr(launch, "_calls", {})


@pytest.mark.gpu
@pytest.mark.parametrize("balanced", [False, True], ids=["split", "balanced"])
@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("Sq", [1, 4])
def test_gpu_lanes_match_bound_route(monkeypatch, balanced, page, Sq):
    dev, B, H, Hkv, D, S = torch.device("cuda"), 8, 32, 8, 128, 5000
    _gpu_plan(monkeypatch, balanced)
    k, v, sl, bt = make_cache(B, Hkv, D, [S, 1, 77, 4999, 2048, 3000, 17, 5000], S, torch.bfloat16, dev, page=page)
    for need_lse in (True, False):
        for _ in range(3):                  # the first binds the lanes
            q = torch.randn(B, H, Sq, D, device=dev).bfloat16()
            o, lse = launch.attention_decode(q, k, v, sl, bt, True, D ** -0.5, -1, -1, 0.0, need_lse)
            call = [c for c in launch._calls.values() if c.need_lse == need_lse][0]
            bound = call.last[1]
            assert bound.lanes is not None and bound.plan.balanced == balanced
            o2, lse2 = launch.attention_split_kv(q, k, v, sl, bt, True, D ** -0.5, -1, -1, 0.0, bound.plan)
            assert torch.equal(o, o2) and (lse is None or torch.equal(lse, lse2))
        ro, rl = ref.attention_with_kvcache(q, k, v, sl, bt)
        assert_matches(o2, lse2, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("balanced", [None, False], ids=["default", "split"])
def test_gpu_growing_cache_loop(monkeypatch, balanced):
    """oss.attention along 40 steps of a cache grown by torch.cat (transformers' DynamicCache): the lanes and the
    lengths table give what the BoundKernel route with uniform_lengths gives, every step."""
    dev, B, H, Hkv, D = torch.device("cuda"), 8, 32, 8, 128
    _gpu_plan(monkeypatch, balanced)
    q = torch.randn(B, 1, H, D, device=dev).bfloat16().transpose(1, 2)
    k = torch.randn(B, Hkv, 2047, D, device=dev).bfloat16()
    v = torch.randn_like(k)
    for _ in range(40):
        k = torch.cat([k, torch.randn(B, Hkv, 1, D, device=dev).bfloat16()], 2)
        v = torch.cat([v, torch.randn(B, Hkv, 1, D, device=dev).bfloat16()], 2)
        S = k.shape[2]
        o = oss.attention(q, k, v, causal=True)
        lens = launch.uniform_lengths(B, S, dev)
        plan = next(iter(launch._calls.values())).last[1].plan
        o2, _ = launch.attention_split_kv(q, k, v, lens, None, True, D ** -0.5, -1, -1, 0.0, plan)
        assert torch.equal(o, o2), S
    ro, rl = ref.attention_with_kvcache(q, k, v, lens)
    assert_matches(o2, _, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16])
def test_gpu_capture_after_lanes(monkeypatch, page):
    """A call captured into a CUDA graph after its lanes are bound (the capture takes the BoundKernel route, its own
    workspace) replays right after cache_seqlens change, and the eager lanes still agree afterwards."""
    dev, B, H, Hkv, D, S = torch.device("cuda"), 8, 32, 8, 128, 4096
    _gpu_plan(monkeypatch, None)
    k, v, sl, bt = make_cache(B, Hkv, D, [S] * B, S, torch.bfloat16, dev, page=page)
    q = torch.randn(B, H, 1, D, device=dev).bfloat16()
    for _ in range(2):
        oss.attention_with_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        og, lg = oss.attention_with_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
    for lens in ([S] * B, [1, 17, 4000, 2, 9, 4095, 3000, 5]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        o, lse = oss.attention_with_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(og, o) and torch.equal(lg, lse)
        ro, rl = ref.attention_with_kvcache(q, k, v, sl, bt)
        assert_matches(o, lse, ro, rl, torch.bfloat16, (ro.bfloat16().double() - ro).abs().max().item())
