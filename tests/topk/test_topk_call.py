"""``launch.TopKCall``: softmax_topk's bound problems (cache hits and misses) and their lanes of ints, checked on
the CPU against the ``BoundKernel`` route's arguments with fake compiled kernels (the H200's launches are not run
here)."""

from __future__ import annotations

import torch

import onlinesoftmax as oss
from onlinesoftmax._triton import launch as tl
from onlinesoftmax.reference import softmax_topk as ref_topk
from onlinesoftmax.topk import launch


def test_calls_cached_per_problem():
    x = torch.randn(3, 300)
    a = launch.topk_call(x, 5, None)
    assert launch.topk_call(x, 5, None) is a                          # hit
    assert launch.topk_call(x.clone(), 5, None) is a                  # the pointer is not part of the problem
    assert launch.topk_call(x, 6, None) is not a                      # k
    assert launch.topk_call(x[:2], 5, None) is not a                  # B
    assert launch.topk_call(x.t().contiguous().t(), 5, None) is not a     # strides
    assert launch.topk_call(x.half(), 5, None) is not a               # dtype
    assert launch.topk_call(x, 5, 7) is not a                         # stream


def test_results_through_bound_calls():
    """Two shapes on one stream share the workspace; repeated calls (bound) give the reference every time."""
    for B, V, k in ((2, 700, 7), (5, 300, 3), (2, 700, 7)):
        x = torch.randn(B, V)
        got = oss.softmax_topk(x, k, backend="triton")
        r = ref_topk(x.double().numpy(), k)
        torch.testing.assert_close(got.indices, torch.as_tensor(r[1]))
        torch.testing.assert_close(got.values, torch.as_tensor(r[0]).float(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got.lse, torch.as_tensor(r[2]).float(), atol=1e-5, rtol=1e-5)


def test_lanes_pass_the_bound_routes_arguments(monkeypatch):
    """With fake compiled kernels: the first call goes through ``BoundKernel`` and binds the lanes; later calls pass
    exactly the arguments that route would (tensors as their ``data_ptr()``), with this call's x and outputs."""
    seen = []

    def record(*args):
        seen.append(args)

    cuda0 = torch.device("cuda", 0)
    real_call = tl.BoundKernel.__call__
    monkeypatch.setattr(tl.BoundKernel, "__call__", lambda self, a, check, device: real_call(self, a, check, cuda0))
    monkeypatch.setattr(tl, "current_device", lambda: 0)
    monkeypatch.setattr(tl, "current_stream", lambda index: 5)
    monkeypatch.setattr(launch, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "raw_launches", lambda device: True)
    monkeypatch.setattr(launch, "_calls", {})
    B, V, k = 3, 1000, 4
    x0 = torch.randn(B, V)
    call = launch.topk_call(x0, k, 5)
    cfg, launches = call.launches
    head = (1, 1, 1, 0, False, False, None, None, (4, 1, 0), None, None, None)
    for bk, _ in launches:
        monkeypatch.setattr(bk, "interpret", False)
        monkeypatch.setattr(bk, "_compiled", {(0, al, torch.float32): (record, head, None) for al in (True, False)})
        monkeypatch.setattr(bk, "tail", tuple(bk.meta[a] for a in bk.fn.arg_names if a in bk.meta))

    def ptrs(args):
        return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)

    call(x0, 5, False)
    assert call.lanes is not None and len(seen) == len(launches)
    ws, ws2 = launch.workspaces(B, cfg, x0.device)
    for _ in range(2):
        seen.clear()
        x = torch.randn(B, V)
        out = call(x, 5, False)
        want = [ptrs((*head[:3], 5, *head[3:], *args(x, ws, ws2, out), *bk.tail)) for bk, args in launches]
        assert seen == want
    seen.clear()
    call(x0, 5, True)                   # a capture: the bound route (tensors), not the lanes
    assert all(any(isinstance(a, torch.Tensor) for a in s) for s in seen)
    seen.clear()
    xm = torch.randn(B * V + 1)[1:].view(B, V)      # misaligned x: the bound route
    call(xm, 5, False)
    assert all(any(isinstance(a, torch.Tensor) for a in s) for s in seen)
