"""``SampleKnobs(grid=True)``: top-p without top-k or min-p on a grid of launches (``topk/sampling_grid.py``)
against the fp64 reference draw, which rows it takes and which it leaves to the row kernel, its plan. On CPU the
kernels run in the interpreter with several chunks per row (the row kernel has one there)."""

import pytest
import torch
from test_sample_kernels import BINS_CASES, _logits, _mid_uniforms, check_draws, topp_call, workspace_views

from onlinesoftmax.reference import philox_uniform
from onlinesoftmax.topk import sample as sample_

GRID = dict(grid=True, grid_chunk=512, draw="torch")


def _grid_views(x, knobs):
    """(records ``[B, 3, 4]`` int32, lists ``[B, ROW_BINS_CAP]``) of the grid workspace a call on ``x`` uses."""
    from onlinesoftmax.topk import sampling_launch as SL

    B, cap = x.shape[0], SL.ROW_BINS_CAP
    views = workspace_views(x, knobs)
    return views[-3][:12 * B].view(B, 3, 4), views[-1][:B * cap].view(B, cap)


def _knobs(**kw):
    from onlinesoftmax.topk.plan import SampleKnobs

    return SampleKnobs(**dict(GRID, **kw))


@pytest.mark.parametrize("V, kw", BINS_CASES, ids=[f"{V}-{kw}" for V, kw in BINS_CASES])
def test_grid_draw_matches_reference(kernel_device, kw, V):
    """The reference's ids on every row; the rows whose nucleus runs past the 64 candidates took the grid (its last
    record on, the list of the boundary's bin written) unless min-p is on (left to the row kernel: no record)."""
    from onlinesoftmax.reference import sample_distribution
    from onlinesoftmax.topk.plan import FREE_K

    B = 5
    x = _logits(B, V, scale=1.0, device=kernel_device)
    x[1] = torch.linspace(-3, 3, V)
    knobs = _knobs()
    rec, lst = _grid_views(x, knobs)
    rec.fill_(-5)
    lst.fill_(-7)
    check_draws(x, torch.rand(B, device=kernel_device), backend="triton", knobs=knobs, **kw)
    xs = x.double().cpu().numpy()
    long = torch.tensor([int((sample_distribution(xs[r], kw.get("temperature", 1.0), None, kw.get("top_p"),
                                                  kw.get("min_p")) > 0).sum()) > FREE_K for r in range(B)])
    took = (rec[:, 2, 0] == 0).cpu()
    assert took.tolist() == (long & ("min_p" not in kw)).tolist(), (took, long)
    n = rec[:, 2, 3].cpu()
    assert ((lst != -7).sum(1).cpu()[took] == n[took]).all()
    assert V < 3000 or bool(long.any())


@pytest.mark.parametrize("chunk", [256, 768, 4096])
def test_grid_chunks_of_any_size(kernel_device, chunk):
    """Chunks of one block, of three, past the row (C = 1): the same draws."""
    x = _logits(3, 2500, scale=1.0, device=kernel_device)
    check_draws(x, torch.rand(3, device=kernel_device), top_p=0.8, backend="triton", knobs=_knobs(grid_chunk=chunk))


def test_grid_ties_per_row_top_k_and_overflow(kernel_device, monkeypatch):
    """bf16 logits (runs of ties at the boundary), a row of equal logits (one fine bin of V elements: the third
    level, then the cut by index), per-row top-k (those rows left to the row kernel); a list capacity of 16: the
    rows whose boundary bin overflows it go to the row kernel (last record off) and draw the same ids."""
    from onlinesoftmax.topk import sampling_launch as SL

    B, V = 4, 2001
    x = _logits(B, V, dtype=torch.bfloat16, scale=1.0, device=kernel_device)
    x[2] = 0.5
    u = torch.rand(B, device=kernel_device)
    k = torch.tensor([0, 700, 0, 0], device=kernel_device)
    knobs = _knobs()
    rec, _ = _grid_views(x, knobs)
    rec.fill_(-5)
    check_draws(x, u, top_k=k, top_p=0.8, backend="triton", knobs=knobs, max_near=0.5)
    assert rec[:, 2, 0].tolist() == [0, -5, 0, 0]
    assert int(rec[2, 2, 1]) == 3 and int(rec[2, 2, 3]) == V       # equal logits: three levels, all V listed
    monkeypatch.setattr(SL, "ROW_BINS_CAP", 16)
    SL._calls.clear()
    try:
        rec, _ = _grid_views(x, knobs)
        rec.fill_(-5)
        check_draws(x, u, top_p=0.6, backend="triton", knobs=knobs, max_near=0.5)
        assert int(rec[2, 2, 0]) == 1
    finally:
        SL._calls.clear()


def test_grid_rows_whose_bins_fail_go_to_the_row_kernel(kernel_device):
    """At a tiny temperature the fine bins' range is lost to fp32 (x_lo rounds to x_max: s = inf): every step's
    record says so, even over records a former call left "on" (zeros), and the row kernel draws the nucleus of the
    first ceil(top_p · n) ties (270 of 300 flat entries at 0.9), as without the grid."""
    import math

    x = torch.ones(3, 300, device=kernel_device)
    u = torch.tensor([0.0, 0.5, 0.999], device=kernel_device)
    knobs = _knobs()
    rec, _ = _grid_views(x, knobs)
    rec.zero_()
    ids, logp = sample_(x, temperature=1e-10, top_p=0.9, uniform=u, backend="triton", knobs=knobs)
    assert rec[:, :, 0].tolist() == [[1, 1, 1]] * 3
    assert (ids >= 0).all() and (ids < 271).all() and ids[0] == 0
    assert (logp.cpu() >= -math.log(271)).all() and (logp.cpu() <= -math.log(270) + 1e-6).all()


def test_grid_lane_counts_match_the_histogram(kernel_device):
    """Levels 2 and 3 counting per lane (``grid_lane_counts``) record the same levels, groups and counts as
    ``tl.histogram``, and draw the reference's ids (several chunks a row; a third level forced with grid_list 16)."""
    x = _logits(3, 3000, scale=1.0, device=kernel_device)
    u = torch.rand(3, device=kernel_device)
    for lst in (4096, 16):
        recs = []
        for lanes in (False, True):
            knobs = _knobs(grid_list=lst, grid_lane_counts=lanes)
            passes = [k for k in topp_call(x, knobs).kernels if k.fn.__name__ == "_grid_pass_kernel"]
            assert len(passes) == 4 and all(k.meta["LANE_COUNTS"] == lanes for k in passes)     # the knob arrives
            rec, _ = _grid_views(x, knobs)
            rec.fill_(-7)
            check_draws(x, u, top_p=0.9, backend="triton", knobs=knobs, max_near=0.5)
            recs.append(rec.cpu().clone())
        assert torch.equal(recs[0], recs[1]) and (recs[0][:, 2, 0] == 0).all(), recs


def test_grid_third_level(kernel_device):
    """A boundary group of more than ``grid_list`` elements takes the third level (step 4): with grid_list 16
    every row's last record has three levels and a shorter list, and the draws are the reference's."""
    x = _logits(3, 3000, scale=1.0, device=kernel_device)
    u = torch.rand(3, device=kernel_device)
    levels, n = [], []
    for lst in (4096, 16):
        knobs = _knobs(grid_list=lst)
        rec, _ = _grid_views(x, knobs)
        check_draws(x, u, top_p=0.9, backend="triton", knobs=knobs, max_near=0.5)
        levels.append(rec[:, 2, 1].tolist())
        n.append(rec[:, 2, 3].cpu().clone())
    assert levels == [[2] * 3, [3] * 3] and bool((n[1] < n[0]).all()), (levels, n)


def test_grid_kernel_draw_and_replay_counts(kernel_device):
    """The grid's draw takes u as step 1 does: Philox of the generator's words (``philox`` 1) and, for a captured
    call (``philox`` 2), at the row's replay count, which it advances once per call: the ids and logprobs of
    ``uniform=`` those u."""
    from onlinesoftmax.topk.sampling import _int32, philox_words
    from onlinesoftmax.topk.sampling_launch import sample_2d

    B, V, seed, offset, tag = 4, 3000, 0xF234567890ABCDEF, 4 * (2**32 - 2), (0x2345 << 40) | 0x9ABCDEF1
    x = _logits(B, V, scale=1.0, device=kernel_device)
    knobs = _knobs(draw="kernel", mass="fixed")
    rec, _ = _grid_views(x, knobs)
    rec.fill_(-5)
    ids, logp = sample_2d(x, 1.0, None, 0.9, None, philox_words(seed, offset), knobs)
    assert rec[:, 2, 0].tolist() == [0] * B
    u = torch.tensor([philox_uniform(seed, offset, r) for r in range(B)], device=kernel_device)
    ref = sample_2d(x, 1.0, None, 0.9, None, u, knobs)
    assert torch.equal(ids, ref[0]) and torch.equal(logp, ref[1])
    slots = torch.tensor([0, -1, tag - 1, 12345], dtype=torch.int64, device=kernel_device)
    words = (slots, *philox_words(seed, offset), _int32(tag & 0xFFFFFFFF), _int32(tag >> 32))
    for n in range(2):
        ids, logp = sample_2d(x, 1.0, None, 0.9, None, words, knobs)
        assert slots.tolist() == [tag + n + 1] * B, n
        u = torch.tensor([philox_uniform(seed, offset + 4 * n, r) for r in range(B)], device=kernel_device)
        ref = sample_2d(x, 1.0, None, 0.9, None, u, knobs)
        assert torch.equal(ids, ref[0]) and torch.equal(logp, ref[1]), n


def test_grid_plan():
    """Chunks per row from the batch (GRID_WAVES programs per SM, chunks within [GRID_MIN_CHUNK,
    GRID_MAX_CHUNK], at most GRID_TABLE per row); only where the row kernel runs its bins, by default from
    GRID_MIN_ROWS rows; knobs checked; ``pdl`` only on sm_90+ outside the interpreter."""
    import dataclasses

    from onlinesoftmax.target import H200
    from onlinesoftmax.topk import explain_sample
    from onlinesoftmax.topk.plan import GRID_LIST, GRID_TABLE, PDL, SampleKnobs, grid_chunks, sample_plan

    assert grid_chunks(1, 128256, H200) == (126, 1024)
    assert grid_chunks(8, 128256, H200) == (63, 2048)
    assert grid_chunks(64, 128256, H200) == grid_chunks(256, 128256, H200) == (16, 8192)
    assert grid_chunks(1, 262144, H200) == (128, 2048)
    assert grid_chunks(1, 10**6, H200)[0] <= GRID_TABLE
    assert grid_chunks(2, 3000, H200, 512, 256) == (6, 512)
    assert grid_chunks(2, 3000, H200, 700, 256) == (4, 768)
    x = torch.empty(8, 128256, device="meta")
    on = SampleKnobs(grid=True)
    p = explain_sample(x, target=H200, knobs=on)
    assert (p.grid_chunks, p.grid_chunk, p.grid_block, p.grid_warps) == (63, 2048, 256, 4) and p.row_chunks
    assert explain_sample(x, target=H200).grid_chunks == 63                         # on by default from 8 rows
    assert explain_sample(x[:7], target=H200).grid_chunks == 0                      # the row kernel below
    assert explain_sample(x, target=H200, knobs=SampleKnobs(grid=False)).grid_chunks == 0
    assert explain_sample(x, target=H200).grid_list == p.grid_list == GRID_LIST
    assert explain_sample(x, top_k=50, target=H200, knobs=on).grid_chunks == 0      # step 1 decides every row
    assert sample_plan(8, 128256, 4, H200, knobs=SampleKnobs(grid=True, row="radix")).grid_chunks == 0
    assert explain_sample(x, target=H200).pdl == PDL
    interp, a100 = dataclasses.replace(H200, interpret=True), dataclasses.replace(H200, arch=80)
    for kw in (dict(grid=True), dict(grid=False)):             # programmatic dependent launches: sm_90+ only
        assert sample_plan(8, 128256, 4, H200, knobs=SampleKnobs(pdl=True, **kw)).pdl
        assert not sample_plan(8, 128256, 4, interp, knobs=SampleKnobs(pdl=True, **kw)).pdl
        assert not sample_plan(8, 128256, 4, a100, knobs=SampleKnobs(pdl=True, **kw)).pdl
    for bad in (dict(grid_block=100), dict(grid_warps=3), dict(grid_chunk=0), dict(grid_list=0),
                dict(grid_list=4097)):
        with pytest.raises(ValueError, match="grid_"):
            sample_plan(8, 1000, 4, H200, knobs=SampleKnobs(grid=True, **bad))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 16, 64])
def test_gpu_grid_matches_reference(dtype, B):
    """Flat rows of a real vocabulary on the grid (its default chunks): the reference's ids on every row (u in the
    middle of a kept token's interval); per-row top-k and min-p rows left to the row kernel beside them."""
    from onlinesoftmax.topk.plan import SampleKnobs

    V = 128256
    x = torch.randn(B, V, device="cuda").to(dtype)
    knobs = SampleKnobs(grid=True)
    rec, _ = _grid_views(x, knobs)
    k = torch.tensor([0, 5000, 100, 0] * (B // 4 + 1), device="cuda")[:B]
    mixes = [dict(top_p=0.9), dict(temperature=0.7, top_p=0.5), dict(top_k=k, top_p=0.95),
             dict(temperature=1.3, top_p=0.99, min_p=0.001), dict(temperature=0.8, top_p=0.999)]
    for i, kw in enumerate(mixes):
        rec.fill_(-5)
        xi = x.t().contiguous().t() if i == 4 else x
        check_draws(xi, _mid_uniforms(x, **kw), backend="triton", gap=2e-6, max_near=0, knobs=knobs, **kw)
        took = rec[:, 2, 0] == 0
        if i in (0, 1, 4):
            assert bool(took.all()), (i, rec[:, 2])
        elif i == 2:
            assert took.tolist() == (k == 0).tolist()
        else:
            assert not bool(took.any())


@pytest.mark.gpu
@pytest.mark.parametrize("grid", [False, True], ids=["row", "grid"])
def test_gpu_pdl_chain_matches_reference(grid):
    """The launches after softmax_topk's as programmatic dependent launches (``pdl``), on the grid or the row
    kernel: the reference's ids on flat rows and per-row mixes, and bit for bit what the same plan gives without."""
    from onlinesoftmax.topk import explain_sample, sample
    from onlinesoftmax.topk.plan import SampleKnobs

    B, V = (16 if grid else 3), 128256
    x = torch.randn(B, V, device="cuda")
    knobs = SampleKnobs(grid=grid, pdl=True)
    plan = explain_sample(x, knobs=knobs)
    assert plan.pdl and bool(plan.grid_chunks) == grid
    k = torch.tensor([0, 5000, 100, 0] * (B // 4 + 1), device="cuda")[:B]
    for kw in (dict(top_p=0.9), dict(temperature=0.7, top_p=0.5), dict(top_k=k, top_p=0.95),
               dict(temperature=1.3, top_p=0.99, min_p=0.001)):
        check_draws(x, _mid_uniforms(x, **kw), backend="triton", gap=2e-6, max_near=0, knobs=knobs, **kw)
        u = torch.rand(B, device="cuda")
        got = sample(x, uniform=u, knobs=knobs, **kw)
        want = sample(x, uniform=u, knobs=SampleKnobs(grid=grid, pdl=False), **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), kw


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_gpu_grid_under_graph_capture(pdl):
    """A captured grid call replays with new logits and new per-row top_p: the reference's distribution's ids
    (u in the middle of a kept token's interval, passed as a tensor); the same with programmatic dependent launches
    captured (``pdl``)."""
    from onlinesoftmax.topk import sample
    from onlinesoftmax.topk.plan import SampleKnobs

    B, V = 8, 128256
    knobs = SampleKnobs(grid=True, pdl=pdl)
    x = torch.randn(B, V, device="cuda")
    p = torch.full((B,), 0.9, device="cuda")
    u = torch.rand(B, device="cuda")
    sample(x, top_p=p, uniform=u, knobs=knobs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ids, logp = sample(x, top_p=p, uniform=u, knobs=knobs)
    for top_p in (0.9, 0.6):
        x.copy_(torch.randn(B, V, device="cuda"))
        p.fill_(top_p)
        u.copy_(_mid_uniforms(x, top_p=top_p))
        g.replay()
        want = sample(x, top_p=p, uniform=u, knobs=SampleKnobs(grid=False))
        assert torch.equal(ids, want[0]), top_p
        torch.testing.assert_close(logp, want[1], rtol=2e-5, atol=2e-5)


GRID_PROBE = r"""
import json
import torch
import compiler_report as CR
from onlinesoftmax.target import H200
from onlinesoftmax.topk.plan import SampleKnobs, sample_plan
from onlinesoftmax.topk.sampling_launch import SampleCall

M = CR._meta
failed, regs, seen, gdc = [], {}, set(), {}
for (B, V), philox, knobs in (((1, 128256), 1, SampleKnobs(grid=True)), ((256, 128256), 2, SampleKnobs(grid=True)),
                              ((64, 128256), 2, SampleKnobs(grid=True, pdl=True)),
                              ((8, 262144), 0, SampleKnobs(grid=True, grid_block=1024, grid_warps=8)),
                              ((3, 300), 1, SampleKnobs(grid=True, grid_block=128, grid_warps=2))):
    plan = sample_plan(B, V, 4, H200, knobs=knobs)
    call = SampleCall(plan, B, V, V, 1, 1, torch.device("meta"), torch.float32, philox)
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    K, G = plan.k, 16 * B * plan.grid_chunks
    views = (M((1 << 24,), i32), M((1 << 20,), i32), M((B * K,), f32), M((B * K,), i64), M((B,), f32), M((B,), i32),
             M((B,), i32), M((B,), i32), M((1 << 20,), i32), M((1 << 20,), f32), M((1 << 16,), i32),
             M((1 << 16,), f32), M((B * 4096,), i32),
             M((G,), f32), M((G // 16,), f32), M((G,), f32), M((G,), i32), M((G,), f32), M((G,), i32),
             M((12 * B,), i32), M((12 * B,), f32), M((B * 4096,), i32))
    ids, logp = M((B,), i64), M((B,), f32)
    u = M((B,), i64 if philox == 2 else f32)
    prm = [logp, 0.8, -1, ids, 0, -1, logp, 0.9, -1, logp, 0.0, -1]
    rng = (-5, 7, -2**31, 1, 3, -9) if philox else (0,) * 6
    for kern, a in zip(call.kernels, call._arglists(M((B, V), f32), views, ids, logp, u, prm, rng)):
        key = CR._key(kern.fn, kern.meta, a)
        if key in seen or "grid" not in kern.fn.__name__ and "row" not in kern.fn.__name__:
            continue
        seen.add(key)
        try:
            r = CR.compile_launch(kern.fn, a, kern.meta, 90, keep_sass=True)
            regs.setdefault(kern.fn.__name__, []).append(r["regs"])
            # griddepcontrol.wait / launch_dependents lower to ACQBULK / PREEXIT
            gdc.setdefault(str(kern.meta.get("PDL", False)), []).append(
                [kern.fn.__name__, "ACQBULK" in r["sass_text"], "PREEXIT" in r["sass_text"]])
            if r["stack"]:
                failed.append(f"{kern.fn.__name__} B={B} V={V} {kern.meta}: {r['stack']} bytes of stack")
        except Exception as e:
            failed.append(f"{kern.fn.__name__} B={B} V={V} {kern.meta}: {type(e).__name__}: {str(e)[-300:]}")
print(json.dumps(dict(failed=failed, regs=regs, gdc=gdc)))
"""


@pytest.mark.slow
def test_grid_launches_compile():
    """Every launch of a grid plan (the four passes, the per-row finish, the row kernel after them), with the real
    argument layout, compiles for sm_90a without spilling: Philox 0 / 1 / 2, 128- to 1024-element steps, programmatic
    dependent launches (``pdl``: griddepcontrol in every kernel after softmax_topk's); the
    passes at 256-element steps and 4 warps stay under 128 registers (several programs per SM)."""
    from test_topk_compile import _compile_probe

    out = _compile_probe(GRID_PROBE)
    assert not out["failed"], "\n".join(out["failed"])
    assert sorted(out["regs"]) == ["_grid_finish_kernel", "_grid_pass_kernel", "_sample_row_kernel"]
    assert len(out["regs"]["_grid_pass_kernel"]) >= 12
    assert max(out["regs"]["_grid_pass_kernel"][:4]) <= 128, out["regs"]
    # with pdl every launch waits (the row kernel, last, triggers nothing); without, none has either instruction
    assert out["gdc"]["True"] == [["_grid_pass_kernel", True, True]] * 4 + [["_grid_finish_kernel", True, True],
                                                                          ["_sample_row_kernel", True, False]]
    assert all(not w and not t for _n, w, t in out["gdc"]["False"])
