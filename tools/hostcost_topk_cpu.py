"""Where the host time of one eager ``oss.softmax_topk(x, k=50)`` and one ``oss.sample(x, temperature=0.8,
top_k=50, top_p=0.9)`` goes, measured on a machine without a GPU.

The public calls run on CPU tensors ``[B, 128256]`` fp32 as they would on an H200: the plans are the H200's
(``target_of`` patched), every bound launch (``BoundKernel``) replays a fake compiled kernel whose C launcher is a
no-op that counts its calls, ``BoundKernel.__call__`` sees the device as ``cuda:0`` (one wrapper frame more per
launch than on the GPU, ~0.1 µs), and ``raw_launches`` is true (the sampler's, and top-k's where this tree has
them, lanes of ints bind as on CUDA). Not here: the C launchers' own work and the driver's (a tensor argument
costs the real launcher a ``data_ptr`` call and a ``cuPointerGetAttribute`` query, an int nothing), the CUDA
caching allocator's (``torch.empty`` on the CPU instead), ``torch.rand``'s Philox launch (counted as an op, not a
launch), and on the GPU ``stream_scratch``'s stream look-up and graph reserve check (a CPU device skips them).
``backend="triton"`` stands in for the default (the interpreter makes CPU tensors Triton's).

ATen ops: every op the dispatcher sees (``TorchDispatchMode``, one call). Launches: the fake C launchers' calls.
Works on the tree on PYTHONPATH, this branch or main (``PYTHONPATH=/work/main/src``), for before / after.

    PYTHONPATH=src python tools/hostcost_topk_cpu.py [--n 3000]
"""

from __future__ import annotations

import argparse
import collections
import os

os.environ.setdefault("TRITON_INTERPRET", "1")      # resolve_backend's backend="triton" on CPU tensors

import torch  # noqa: E402
from hostcost_util import AtenOps, timed  # noqa: E402

import onlinesoftmax as oss  # noqa: E402
from onlinesoftmax._triton import launch as tl  # noqa: E402
from onlinesoftmax.target import H200  # noqa: E402
from onlinesoftmax.topk import launch as topk_launch  # noqa: E402
from onlinesoftmax.topk import sampling_launch  # noqa: E402

CUDA0 = torch.device("cuda", 0)
V, K = 128256, 50
LAUNCHES = [0]


def counts(fn) -> tuple[int, dict]:
    """(launches, ATen ops by name) of one call of ``fn``."""
    before = LAUNCHES[0]
    with AtenOps() as mode:
        fn()
    return LAUNCHES[0] - before, dict(collections.Counter(mode.ops))


def noop(*args):
    LAUNCHES[0] += 1


def fake_entry(bk, dtype) -> None:
    """Give ``bk`` a fake compiled kernel for aligned pointers of ``dtype`` (and the sampler's parameter dtypes)."""
    if bk.interpret is False and bk._compiled:
        return
    bk.interpret = False
    bk.tail = tuple(bk.meta[a] for a in bk.fn.arg_names if a in bk.meta)     # the constexprs, in order
    head = (1, 1, 1, 0, False, False, None, None, (4, 1, 0), None, None, None)
    for key in ((0, True, dtype), (0, True, dtype, torch.float32, torch.int64, torch.float32, torch.float32,
                                   torch.float32)):
        bk._compiled[key] = (noop, head, None)


def fake_gpu() -> None:
    """Patch the modules as described above."""
    topk_launch.target_of = lambda device: H200
    sampling_launch.target_of = lambda device: H200
    for mod in (tl, topk_launch, sampling_launch):
        if hasattr(mod, "current_device"):
            mod.current_device = lambda: 0
        if hasattr(mod, "current_stream"):
            mod.current_stream = lambda index: 0
    for mod in (topk_launch, sampling_launch):
        if hasattr(mod, "raw_launches"):
            mod.raw_launches = lambda device: True
    real_call = tl.BoundKernel.__call__

    def call(self, args, check, device):
        return real_call(self, args, check, CUDA0)

    tl.BoundKernel.__call__ = call


def bind_fakes(x: torch.Tensor) -> None:
    """Fake compiled kernels for every launch the two calls make on ``x``."""
    B = x.shape[0]
    cfg = topk_launch.cached_plan(B, V, K, x.dtype, x.device)
    for t_mode in (0, 1):
        for bk, _ in topk_launch._launches(cfg, B, V, K, x.stride(0), x.stride(1), t_mode):
            fake_entry(bk, x.dtype)
    call = sampling_launch.sample_call(x, False, K, 1, sampling_launch.NO_SAMPLE_KNOBS, None)
    for bk in call.kernels:
        fake_entry(bk, x.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    fake_gpu()
    n = args.n
    for B in (1, 8):
        x = torch.randn(B, V)
        bind_fakes(x)

        def topk():
            return oss.softmax_topk(x, k=K, backend="triton")

        def sample():
            return oss.sample(x, temperature=0.8, top_k=K, top_p=0.9, backend="triton")

        for fn in (topk, sample):
            fn()
            fn()
        cfg = topk_launch.cached_plan(B, V, K, x.dtype, x.device)
        rows = {
            "softmax_topk (public)": timed(topk, n),
            "sample (public)": timed(sample, n),
            "  check_float_tensor": timed(lambda: oss._checks.check_float_tensor(x, "x"), n),
            "  resolve_backend": timed(lambda: oss.backend.resolve_backend("triton", x, "op"), n),
            "  cached_plan": timed(lambda: topk_launch.cached_plan(B, V, K, x.dtype, x.device), n),
            "  _launches look-up": timed(lambda: topk_launch._launches(cfg, B, V, K, x.stride(0), x.stride(1)), n),
            "  workspaces": timed(lambda: topk_launch.workspaces(B, cfg, x.device), n),
            "  3 x torch.empty (outputs)": timed(lambda: (torch.empty((B, K), dtype=torch.float32),
                                                          torch.empty((B, K), dtype=torch.int64),
                                                          torch.empty((B,), dtype=torch.float32)), n),
            "  softmax_topk_2d": timed(lambda: topk_launch.softmax_topk_2d(x, K, cfg), n),
            "  torch.rand(B) (sample)": timed(lambda: torch.rand(B), n),
            "  sample_2d (sample)": timed(lambda: sampling_launch.sample_2d(x, 0.8, K, 0.9, None, torch.rand(B)), n),
        }
        if hasattr(topk_launch, "topk_call"):
            rows["  topk_call look-up"] = timed(lambda: topk_launch.topk_call(x, K, None), n)
            rows["  topk_2d"] = timed(lambda: topk_launch.topk_2d(x, K), n)
        print(f"B={B} V={V} k={K} fp32 (H200 plan {cfg.splits} splits, tree {cfg.tree})")
        for name, val in rows.items():
            print(f"  {name:32s} {val:8.2f} µs")
        for name, fn in (("softmax_topk", topk), ("sample", sample)):
            nl, ops = counts(fn)
            print(f"  {name}: {nl} launches, {sum(ops.values())} ATen ops {ops}")


if __name__ == "__main__":
    main()
