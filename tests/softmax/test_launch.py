"""Launching: explain's plan is the plan a launch runs, plans and bound launches cached per problem, the per-stream
workspace and the graph reserve (``_triton/launch.py``), Triton's launch hooks; on the GPU repeated coop calls,
streams, CUDA graphs and pointer alignment."""

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax._triton import launch as TL
from onlinesoftmax.softmax import api as SL_API
from onlinesoftmax.softmax import explain
from onlinesoftmax.softmax import launch as SL
from onlinesoftmax.softmax.plan import LOG_SOFTMAX, LOGSUMEXP, SOFTMAX, Knobs

from ._helpers import DEV, run_backward, run_forward

OPS = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX, "logsumexp": LOGSUMEXP}
FN = {"softmax": oss.softmax, "log_softmax": oss.log_softmax}


def _layouts():
    """(label, x, dim, dtype=): contiguous, transposed, sliced, off a 16-byte boundary, an upcast output, dims
    that do not fold into a view (the op copies), long rows (coop on the GPU, split in the interpreter) and
    16-bit rows the H200 holds in shared memory."""
    base = torch.randn(40, 301, device=DEV)
    return [
        ("contiguous", base[:, :300].contiguous(), -1, None),
        ("transposed", base.t(), -1, None),
        ("dim 0", base, 0, None),
        ("sliced rows", base[::3], -1, None),
        ("one element in", base[:, 1:], -1, None),
        ("bf16 one element in", base.to(torch.bfloat16)[:, 1:257], -1, None),
        ("bf16 to fp32", base.to(torch.bfloat16)[:, :256], -1, torch.float32),
        ("no view", torch.randn(4, 6, 8, 10, device=DEV)[::2, :, :, ::2], 2, None),
        ("long rows", torch.randn(3, 40000, device=DEV), -1, None),
        ("bf16 rows of 4K", torch.randn(16, 4096, device=DEV).to(torch.bfloat16), -1, None),   # H200: smem rows
    ]


@pytest.mark.parametrize("op", list(OPS))
def test_explain_is_the_plan_that_runs(op):
    """explain(x, dim, op=, dtype=) is the plan launch.forward runs on the op's row view, for every layout; its
    grad=True plan is the one launch.backward runs on the forward's y and a fresh dy."""
    for label, x, dim, dtype in _layouts():
        if op == "logsumexp" and dtype is not None:
            continue
        out, plan = run_forward(x, dim, OPS[op], out_dtype=dtype)
        assert explain(x, dim, op=op, dtype=dtype, backend="triton") == plan, label
        if op != "logsumexp":
            y = FN[op](x, dim, dtype=dtype, backend="triton")
            torch.testing.assert_close(out, y)
            dx, bplan = run_backward(y, torch.randn_like(y), op == "log_softmax", dim=dim)
            assert explain(x, dim, op=op, dtype=dtype, grad=True, backend="triton") == bplan, label



def test_launch_plan_cached_per_problem():
    """The second call of a layout reuses its bound launch (plan, grid, bound kernels) by one lookup; a new layout
    of the same row problem reuses the problem's launch; a new problem makes a new one; knobs are not cached."""
    def stats(fn):
        info = fn.cache_info()
        return info.misses, info.hits

    x = torch.randn(6, 293, device=DEV)
    (m0, h0), (lm0, lh0) = stats(SL._forward_launch), stats(SL._forward_by_layout)
    for _ in range(3):
        torch.testing.assert_close(oss.softmax(x, backend="triton"), torch.softmax(x, -1))
    assert stats(SL._forward_launch) == (m0 + 1, h0) and stats(SL._forward_by_layout) == (lm0 + 1, lh0 + 2)
    torch.testing.assert_close(oss.softmax(x.t(), 0, backend="triton"), torch.softmax(x.t(), 0))
    assert stats(SL._forward_launch) == (m0 + 1, h0 + 1)     # x.t() along dim 0: x's row problem along dim 1
    oss.log_softmax(x, backend="triton")
    assert stats(SL._forward_launch) == (m0 + 2, h0 + 1)
    out, plan = run_forward(x, -1, SOFTMAX, Knobs.of(num_warps=2))
    assert plan.num_warps == 2 and stats(SL._forward_launch) == (m0 + 2, h0 + 1)
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_launch_hooks_take_tritons_path():
    from triton import knobs

    assert not TL.hooks_installed()

    def hook(*args):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert TL.hooks_installed()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


def test_fast_path_keeps_the_checks():
    """Calls the no-autograd fast path could take but must not (on the CPU it holds nothing): a bool or float dim,
    a dtype, a tensor subclass, requires_grad. Each gets what the full path gives."""
    x = torch.randn(3, 5, device=DEV)
    for _ in range(2):
        torch.testing.assert_close(oss.softmax(x, -1), torch.softmax(x, -1))
    with pytest.raises(TypeError, match="softmax: dim must be an int"):
        oss.softmax(x, True)
    with pytest.raises(TypeError, match="softmax: dim must be an int"):
        oss.softmax(x, 1.0)
    torch.testing.assert_close(oss.softmax(x, -1, dtype=torch.float64), torch.softmax(x, -1, dtype=torch.float64))
    p = torch.nn.Parameter(x.clone())
    y = oss.log_softmax(p, -1)
    y.sum().backward()
    torch.testing.assert_close(p.grad, torch.func.grad(lambda t: torch.log_softmax(t, -1).sum())(x))
    if DEV.type != "cuda":
        assert not SL_API._fast


def test_captured_scratch_takes_zeroed_words_from_the_reserve():
    """What a launch being captured into a CUDA graph gets (_captured_scratch, run here on the CPU): the zeroed
    views from a pre-zeroed reserve buffer, which is then held for good; the others uninitialised; with the
    reserve empty or too small, freshly zeroed views. Eager calls top the reserve up. (The CPU's reserve is this
    test's own: CPU launches never take from it; it is emptied before and after.)"""
    dev = torch.device("cpu")
    TL._reserve.pop(dev, None)
    held = len(TL._held_by_graphs)
    try:
        layout = ((1024, torch.int32), (1024, torch.int32), (70000, torch.float32))
        a = TL._captured_scratch(dev, layout, 2)                        # empty reserve: zeroed here
        assert len(TL._held_by_graphs) == held and [v.numel() for v in a] == [1024, 1024, 70000]
        assert all(bool((v == 0).all()) for v in a[:2]) and all(v.data_ptr() % 16 == 0 for v in a)
        TL._top_up_reserve(dev)
        assert len(TL._reserve[dev]) == TL.GRAPH_RESERVE
        b = TL._captured_scratch(dev, layout, 2)
        assert len(TL._reserve[dev]) == TL.GRAPH_RESERVE - 1 and len(TL._held_by_graphs) == held + 1
        assert b[0].data_ptr() == TL._held_by_graphs[-1].data_ptr() and all(bool((v == 0).all()) for v in b[:2])
        assert b[2].data_ptr() % 16 == 0 and b[2].numel() == 70000
        big = ((2048, torch.int32), (2048, torch.int32), (8, torch.float32))   # 16 KB of words: past a buffer
        c = TL._captured_scratch(dev, big, 2)
        assert len(TL._held_by_graphs) == held + 1 and all(bool((v == 0).all()) for v in c[:2])
        d = TL._captured_scratch(dev, layout[2:], 0)                    # nothing zeroed (top-k's workspace)
        assert len(TL._held_by_graphs) == held + 1 and d[0].numel() == 70000
    finally:
        TL._reserve.pop(dev, None)
        del TL._held_by_graphs[held:]


def test_stream_scratch_views_aligned_reused_and_grown():
    """Workspace views start 16-byte aligned (bound kernels take them as aligned), are reused while they fit and,
    once a request outgrows one, are carved again no smaller from a zeroed buffer (barrier words start at 0)."""
    tag = ("test", DEV)
    a = TL.stream_scratch(tag, DEV, ((5, torch.int32), (3, torch.float64), (7, torch.float32)))
    assert [v.numel() for v in a] == [5, 3, 7] and all(v.data_ptr() % 16 == 0 for v in a)
    assert all(bool((v == 0).all()) for v in a)
    a[0].fill_(1)
    b = TL.stream_scratch(tag, DEV, ((4, torch.int32), (3, torch.float64), (1, torch.float32)))
    assert all(x is y for x, y in zip(a, b))
    c = TL.stream_scratch(tag, DEV, ((9, torch.int32), (2, torch.float64), (7, torch.float32)))
    assert [v.numel() for v in c] == [9, 3, 7] and all(v.data_ptr() % 16 == 0 for v in c)
    assert bool((c[0] == 0).all()) and c[1].dtype == torch.float64
    # another layout under the same tag (more views, other dtypes) gets views of its own layout, never fewer
    d = TL.stream_scratch(tag, DEV, ((9, torch.int32), (2, torch.float64), (7, torch.float32), (5, torch.int64)))
    assert [(v.numel(), v.dtype) for v in d] == [(9, torch.int32), (2, torch.float64), (7, torch.float32),
                                                 (5, torch.int64)]
    e = TL.stream_scratch(tag, DEV, ((3, torch.float32),))
    assert [(v.numel(), v.dtype) for v in e] == [(3, torch.float32)]


# ---- GPU only -----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_coop_repeated_calls_and_streams():
    """The row barrier's words persist across launches: many calls, varying C, two streams, a CUDA graph."""
    xs = [torch.randn(m, n, device="cuda") for m, n in [(4, 70000), (2, 262144), (16, 40000), (4, 70000)]]
    for _ in range(20):
        for x in xs:
            torch.testing.assert_close(oss.softmax(x), torch.softmax(x, -1))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = oss.softmax(xs[1])
    s.synchronize()
    torch.testing.assert_close(y, torch.softmax(xs[1], -1))
    x = xs[0]
    oss.softmax(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = oss.softmax(x)
    for _ in range(5):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.testing.assert_close(y, torch.softmax(x, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("reserve", [True, False])
def test_gpu_graph_capture_workspace(reserve):
    """Coop launches captured into CUDA graphs take their barrier words from the pre-zeroed reserve (no zeroing
    inside the graph), or, with the reserve empty, zero them inside the graph; either way every replay, and
    replays of two graphs alternating, match torch (forward, log-softmax, backward at decode and long-row sizes)."""
    xs = [torch.randn(m, n, device="cuda") * 3 for m, n in [(1, 262144), (8, 151936), (64, 131072)]]
    dy = [torch.randn_like(x) for x in xs]
    for x in xs:                                     # eager calls first, as a decoder warms up; tops the reserve up
        oss.softmax(x)
    if not reserve:
        TL._reserve.clear()
    held = len(TL._held_by_graphs)
    graphs, outs = [], []
    for x, g in zip(xs, dy):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = oss.softmax(x)
            lp = oss.log_softmax(x)
            dx = torch.ops.onlinesoftmax.softmax_backward(y, g, 1, False, y.dtype, "triton")
        graphs.append(graph)
        outs.append((y, lp, dx))
    assert len(TL._held_by_graphs) - held == (min(3 * len(xs), TL.GRAPH_RESERVE) if reserve else 0)
    for _ in range(3):
        for x, g, graph, (y, lp, dx) in zip(xs, dy, graphs, outs):
            x.copy_(torch.randn_like(x) * 3)
            graph.replay()
            ref = torch.softmax(x, -1)
            torch.testing.assert_close(y, ref)
            torch.testing.assert_close(lp, torch.log_softmax(x, -1))
            torch.testing.assert_close(dx, torch._softmax_backward_data(g, ref, -1, x.dtype), atol=1e-6, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 151936])
def test_gpu_bound_launch_alignment_and_devices(n):
    """One plan (same shape and strides), data pointers of different 16-byte alignment: the pre-bound launch
    keeps a compiled kernel per alignment, and a call under another current device index still runs right."""
    base = torch.randn(3, n + 1, device="cuda")
    views = [base[:, :n], base[:, 1:], base[:, :n], base[:, 1:]]
    assert views[0].stride() == views[1].stride() and views[1].data_ptr() % 16 != 0
    for v in views:
        for fn, expect in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax)):
            for _ in range(3):
                torch.testing.assert_close(fn(v), expect(v, -1))
        torch.testing.assert_close(oss.logsumexp(v), torch.logsumexp(v, -1))
    with torch.cuda.device(0):
        torch.testing.assert_close(oss.softmax(views[1]), torch.softmax(views[1], -1))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 1024), (2, 262144)])       # rows; coop with a workspace
def test_gpu_fast_path_and_lanes(shape):
    """A second eager call without autograd goes from one dict look-up to the bound launch's C launchers (no
    BoundKernel, no Triton launch path), with int pointers, on the current stream; Triton's launch hooks, a
    misaligned x, requires_grad and another stream still get the right answer."""
    from triton import knobs

    x = torch.randn(*shape, device="cuda") * 3
    torch.testing.assert_close(oss.softmax(x), torch.softmax(x, -1))
    launch = SL_API._fast[(SOFTMAX, -1, x.shape, x.stride(), x.dtype, 0)]
    assert set(launch.lanes) == {0} and len(launch.lanes[0]) == len(launch.kernels)
    # one kernel without workspace: the fast path calls its C launcher inline (the coop plan keeps Launch.__call__)
    direct = len(launch.kernels) == 1 and launch.workspace is None
    assert direct == (shape == (4, 1024)) and (launch.pair.__name__ == "pair") == direct

    def refuse(*args):
        raise AssertionError("a fast call went through BoundKernel")

    real = TL.BoundKernel.__call__
    TL.BoundKernel.__call__ = refuse
    try:
        for _ in range(3):
            x.copy_(torch.randn_like(x) * 3)
            torch.testing.assert_close(oss.softmax(x), torch.softmax(x, -1))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = oss.softmax(x)
        s.synchronize()
        torch.testing.assert_close(y, torch.softmax(x, -1))
    finally:
        TL.BoundKernel.__call__ = real
    calls = []

    def hook(*args):
        calls.append(1)

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        torch.testing.assert_close(oss.softmax(x), torch.softmax(x, -1))
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(calls) == len(launch.kernels)
    base = torch.empty(x.numel() + 1, device="cuda")
    v = base[1:].view(shape)
    v.copy_(x)
    assert v.stride() == x.stride() and v.data_ptr() % 16
    torch.testing.assert_close(oss.softmax(v), torch.softmax(x, -1))
    xg = x.clone().requires_grad_()
    oss.softmax(xg).pow(2).sum().backward()
    xr = x.clone().requires_grad_()
    torch.softmax(xr, -1).pow(2).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad)


def test_direct_pair_calls_the_launcher_inline_or_falls_back(monkeypatch):
    """``_direct``'s pair(x, y): the C launcher with (head3, the current stream, head9, x's and y's pointers, the
    scalars, the constexpr tail); the fallback under a launch hook or on another current device."""
    from onlinesoftmax.softmax import launch as SL

    calls, fell = [], []
    x, y = torch.empty(4), torch.empty(4)
    pair = SL._direct(1, lambda *a: calls.append(a), (1, 2, 3), ("h",) * 9, ("T",), (5, 6.0),
                      lambda a, b: fell.append((a, b)))
    monkeypatch.setattr(SL, "current_device", lambda: 1)
    monkeypatch.setattr(SL, "current_stream", lambda i: 77 + i)
    monkeypatch.setattr(SL, "hooks_installed", lambda: False)
    pair(x, y)
    assert calls == [(1, 2, 3, 78, *("h",) * 9, x.data_ptr(), y.data_ptr(), 5, 6.0, "T")] and not fell
    monkeypatch.setattr(SL, "current_device", lambda: 0)
    pair(x, y)
    monkeypatch.setattr(SL, "current_device", lambda: 1)
    monkeypatch.setattr(SL, "hooks_installed", lambda: True)
    pair(x, y)
    assert len(calls) == 1 and len(fell) == 2 and fell[0][0] is x and fell[1][1] is y
