"""``launch.TopKCall`` and ``sampling_launch.SampleCall``: softmax_topk's and sample's bound problems (cache hits
and misses) and their lanes of ints, checked on the CPU against the ``BoundKernel`` route's arguments with fake
compiled kernels (the H200's launches are not run here; ``test_gpu_fast_call_skips_only_the_checks`` and
``test_gpu_fast_path_matches_the_checked_path`` run them)."""

from __future__ import annotations

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax._triton import launch as tl
from onlinesoftmax.reference import softmax_topk as ref_topk
from onlinesoftmax.topk import launch
from onlinesoftmax.topk import sampling_launch as SL
from onlinesoftmax.topk.plan import NO_SAMPLE_KNOBS

HEAD = (1, 1, 1, 0, False, False, None, None, (4, 1, 0), None, None, None)    # a fake C launcher's head


def _fake_cuda(monkeypatch, module) -> list:
    """CPU tensors launched as on ``cuda:0`` (stream 5) by ``module``'s bound calls (``launch`` or
    ``SL``), whose cache starts empty; returns the list the fake C launchers record their arguments in."""
    seen = []
    cuda0 = torch.device("cuda", 0)
    real_call = tl.BoundKernel.__call__
    monkeypatch.setattr(tl.BoundKernel, "__call__", lambda self, a, check, device: real_call(self, a, check, cuda0))
    monkeypatch.setattr(tl, "current_device", lambda: 0)
    monkeypatch.setattr(tl, "current_stream", lambda index: 5)
    monkeypatch.setattr(module, "current_device", lambda: 0)
    monkeypatch.setattr(module, "raw_launches", lambda device: True)
    monkeypatch.setattr(module, "_calls", {})
    return seen


def _fake_compiled(monkeypatch, kernels, dtypes: tuple, seen: list) -> None:
    """Each ``BoundKernel`` of ``kernels`` compiled (for ``check`` tensors of ``dtypes``, aligned or not) into a
    C launcher that appends its arguments to ``seen``."""
    def record(*args):
        seen.append(args)

    for bk in kernels:
        monkeypatch.setattr(bk, "interpret", False)
        monkeypatch.setattr(bk, "_compiled", _AnyAlignment(dtypes, (record, HEAD, None)))
        monkeypatch.setattr(bk, "tail", tuple(bk.meta[a] for a in bk.fn.arg_names if a in bk.meta))


class _AnyAlignment(dict):
    """The one fake compiled kernel for the ``check`` tensors' ``dtypes`` on device 0, whatever their alignments
    (``launch.compile_key``: True where all are aligned, else each one's)."""

    def __init__(self, dtypes: tuple, entry: tuple):
        super().__init__()
        self.dtypes, self.entry = dtypes, entry

    def get(self, key, default=None):
        return self.entry if key[0] == 0 and key[2:] == self.dtypes else default


def _ptrs(args) -> tuple:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


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


@pytest.mark.interpreter
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
    seen = _fake_cuda(monkeypatch, launch)
    B, V, k = 3, 1000, 4
    x0 = torch.randn(B, V)
    call = launch.topk_call(x0, k, 5)
    cfg, launches = call.launches
    _fake_compiled(monkeypatch, [bk for bk, _ in launches], (torch.float32,), seen)
    call(x0, 5, False)
    assert call.lanes is not None and len(seen) == len(launches)
    ws, ws2 = launch.workspaces(B, cfg, x0.device)
    kept = []
    for _ in range(2):
        seen.clear()
        x = torch.randn(B, V)
        out = call(x, 5, False)
        want = [_ptrs((*HEAD[:3], 5, *HEAD[3:], *args(x, ws, ws2, out), *bk.tail)) for bk, args in launches]
        assert seen == want
        # the outputs: fresh tensors of softmax_topk's shapes and dtypes (empty_like of the call's templates)
        assert [(t.shape, t.dtype, t.is_contiguous()) for t in out] == [
            ((B, k), torch.float32, True), ((B, k), torch.int64, True), ((B,), torch.float32, True)]
        kept.append(out)
    ptrs_seen = {t.data_ptr() for out in kept for t in out} | {t.data_ptr() for t in call.like}
    assert len(ptrs_seen) == 9
    seen.clear()
    call(x0, 5, True)                   # a capture: the bound route (tensors), not the lanes
    assert all(any(isinstance(a, torch.Tensor) for a in s) for s in seen)
    seen.clear()
    xm = torch.randn(B * V + 1)[1:].view(B, V)      # misaligned x: the bound route
    call(xm, 5, False)
    assert all(any(isinstance(a, torch.Tensor) for a in s) for s in seen)


def test_sample_lanes_pass_the_bound_routes_arguments(monkeypatch):
    """The first call goes through ``BoundKernel`` and binds the lanes; later calls pass exactly the arguments that
    route would (tensors as their ``data_ptr()``) with this call's x, outputs and Philox words, into fresh outputs."""
    seen = _fake_cuda(monkeypatch, SL)
    B, V, K = 3, 1000, 50
    x0 = torch.randn(B, V)
    call = SL.sample_call(x0, False, K, 1, NO_SAMPLE_KNOBS, 5, 1)
    _fake_compiled(monkeypatch, call.kernels, call.dtypes, seen)
    tt, kt, pt, qt = (None, 0.8, -1), (None, K, -1), (None, 0.9, -1), (None, 0.0, -1)

    call(x0, tt, kt, pt, qt, (1, 2, 3, 4), 5, False)
    assert call.lanes is not None and len(seen) == len(call.kernels)
    kept = []
    for words in ((11, -12, 13, 14), (21, 22, -23, 24)):
        seen.clear()
        x = torch.randn(B, V)
        ids, logp = call(x, tt, kt, pt, qt, words, 5, False)
        prm = [logp, 0.8, -1, ids, K, -1, logp, 0.9, -1, logp, 0.0, -1]
        want = [_ptrs((*HEAD[:3], 5, *HEAD[3:], *a, *bk.tail))
                for bk, a in zip(call.kernels, call._arglists(x, call.ws, ids, logp, logp, prm, words + (0, 0)))]
        assert seen == want
        assert [(t.shape, t.dtype, t.is_contiguous()) for t in (ids, logp)] == [
            ((B,), torch.int64, True), ((B,), torch.float32, True)]
        kept.append((ids, logp))
    # fresh outputs every call (empty_like of the call's templates, never the templates themselves)
    assert len({t.data_ptr() for out in kept for t in out} | {t.data_ptr() for t in call.like}) == 6
    seen.clear()
    call(x0, tt, kt, pt, qt, (1, 2, 3, 4), 5, True)     # a capture: the bound route (tensors), not the lanes
    assert seen and all(any(isinstance(a, torch.Tensor) for a in s) for s in seen)
