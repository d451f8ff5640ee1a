"""Where the host time of one eager ``oss.cross_entropy`` forward + backward goes, measured on a machine without a
GPU (the linear cross-entropy's too).

The public calls run on small CPU tensors as they would on an H200: the plan is made for ``H200`` and every Triton
launch goes through :class:`~onlinesoftmax._triton.launch.BoundKernel`'s bound path into a fake compiled kernel
whose C launcher is a no-op (``BoundKernel.__call__`` is wrapped to pass ``cuda:0`` as the device: the wrapper's
own cost is measured and printed, not subtracted). Everything Python does per call is here; what is not: the C
launcher and the driver (about 5 µs a launch on the H200's host), CUDA's caching allocator (the torch ops here
allocate and run on the CPU), the autograd engine's hand-over to its CUDA device thread, and the speed of the
H200's host (tools/probe_ce32k.py on ce32k measured 464-600 µs there where this measured ~1/3 of it).
Besides µs, each row counts the ATen ops and Triton launches of one call: on the GPU each costs roughly
5-15 µs of host time.

Works on the tree on PYTHONPATH, this branch or main (``PYTHONPATH=/work/main/src``), for before / after.

    PYTHONPATH=src python tools/hostcost_ce_cpu.py [--n 2000]
"""

from __future__ import annotations

import argparse
import importlib
import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")      # resolve_backend's backend="triton" on CPU tensors

import torch  # noqa: E402
from hostcost_util import AtenOps, timed  # noqa: E402

import onlinesoftmax as oss  # noqa: E402
from onlinesoftmax._triton import launch  # noqa: E402
from onlinesoftmax.target import H200  # noqa: E402

ce = importlib.import_module("onlinesoftmax.losses.cross_entropy")
lce = importlib.import_module("onlinesoftmax.losses.linear_cross_entropy")
K = importlib.import_module("onlinesoftmax.losses.kernels")

CUDA0 = torch.device("cuda", 0)
LAUNCHES = [0]


def counts(fn) -> tuple[int, int, list]:
    """(ATen ops, Triton launches, op names) of one call of ``fn``."""
    fn()
    before = LAUNCHES[0]
    with AtenOps() as c:
        fn()
    return len(c.ops), LAUNCHES[0] - before, c.ops


def fake_gpu():
    """Plans for the H200; every BoundKernel launch replays a no-op compiled kernel as on a GPU."""
    ce.target_of = lambda device: H200
    lce.target_of = lambda device: H200
    launch.current_device = lambda: 0
    launch.current_stream = lambda index: 0

    def noop(*args):
        LAUNCHES[0] += 1

    run = types.SimpleNamespace(launch=noop, global_scratch_size=0, profile_scratch_size=0,
                                launch_cooperative_grid=False, launch_pdl=False)
    compiled = types.SimpleNamespace(run=run, function=0, packed_metadata=(4, 1, 0))
    call = launch.BoundKernel.__call__

    def fake_call(self, args, check, device):
        if self.interpret:
            self.interpret = False
        key = (0, not any(t.data_ptr() & 15 for t in check), *(t.dtype for t in check))
        if key not in self._compiled:
            if not hasattr(self.fn, "params"):      # the interpreter's function: its constexprs are meta's names
                self.fn.params = [types.SimpleNamespace(name=a, is_constexpr=a in self.meta)
                                  for a in self.fn.arg_names]
            self._compiled[key] = self._bind(compiled)
        return call(self, args, check, CUDA0)

    launch.BoundKernel.__call__ = fake_call
    return fake_call


def wrapper_cost(n):
    """The harness's wrapper around one launch (not subtracted from the rows)."""
    bk = launch.BoundKernel.__new__(launch.BoundKernel)
    x = torch.empty(4)

    def f():
        if bk.interpret:
            pass
        key = (0, not any(t.data_ptr() & 15 for t in (x,)), *(t.dtype for t in (x,)))
        if key not in bk._compiled:
            pass
    bk.interpret, bk._compiled = False, {}
    return timed(f, n)


def ce_rows_of(V, N, dtype, n, **kw):
    x = (torch.randn(N, V) * 3).to(dtype).requires_grad_()
    t = torch.randint(0, V, (N,))
    t[::10] = -100
    xd = x.detach()

    def fwd_bwd():
        x.grad = None
        loss = oss.cross_entropy(x, t, backend="triton", **kw)
        loss.backward()

    def fwd():
        return oss.cross_entropy(x, t, backend="triton", **kw)

    def fwd_nograd():
        return oss.cross_entropy(xd, t, backend="triton", **kw)

    rows = {}
    for name, fn in (("eager fwd + bwd", fwd_bwd), ("eager fwd (grad)", fwd), ("fwd, no grad", fwd_nograd)):
        ops, launches, names = counts(fn)
        rows[name] = (timed(fn, n), ops, launches)
        if name == "eager fwd + bwd":
            opnames = names
    rows["bwd (engine + scale) = row 1 - row 2"] = (rows["eager fwd + bwd"][0] - rows["eager fwd (grad)"][0], None,
                                                     None)
    red = kw.get("reduction", "mean")
    pieces = {}
    if hasattr(ce, "_prepare"):
        pieces["_prepare (checks, backend, views)"] = lambda: ce._prepare(
            "cross_entropy", x, t, None, -100, red, 0.0, 0.0, None, "triton", None)
    if hasattr(ce, "_run_for"):           # the bound call (this branch)
        pieces["_run_for (cached plan + launches)"] = lambda: ce._run_for(xd, False, -100, red, 0.0, 0.0, None, True,
                                                                          None)
        run = ce._run_for(xd, False, -100, red, 0.0, 0.0, None, True, None)
        pieces["CERun body (3 launches, 2 allocs)"] = lambda: run(xd, t, None)
        pieces["  stream_scratch"] = lambda: launch.stream_scratch("ce-call", xd.device, run.layout, run.zeroed)
        coef = torch.empty(4)
        pieces["  one bound launch (coef)"] = lambda: run.coef((t, coef, coef, N, V, -100), (t, coef, coef),
                                                               xd.device)
        dx, g = torch.empty(N, V, dtype=dtype), torch.ones(())
        pieces["CERun.scale_(dx, dloss) (1 launch)"] = lambda: run.scale_(dx, g)
    else:                                 # main: plan, torch ops, one launch
        pieces["plan (_plan_for, uncached)"] = lambda: ce._plan_for(xd, True, None)
        pieces["_reduction_coefs (torch ops)"] = lambda: ce._reduction_coefs(t, None, -100, red, V)
        pieces["allocs: dx, loss rows, lse"] = lambda: (torch.empty_like(xd), torch.empty(N), torch.empty(N))
        plan = ce._plan_for(xd, True, None)
        coef = ce._reduction_coefs(t, None, -100, red, V)
        lr, lse, dx = torch.empty(N), torch.empty(N), torch.empty_like(xd)
        pieces["ce_rows (1 launch)"] = lambda: K.ce_rows(plan, xd, t, None, coef, lr, lse, dx, None, -100, 0.0, 0.0,
                                                         None)
        if red == "mean":
            pieces["loss: rows.sum() * coef[0]"] = lambda: lr.sum() * coef[0]
        g = torch.ones(())
        pieces["scale_rows_(dx, dloss) (1 launch)"] = lambda: K.scale_rows_(dx, g)
    for name, fn in pieces.items():
        rows[name] = (timed(fn, n), *counts(fn)[:2])
    return rows, opnames


def lce_rows_of(N, Hd, V, n):
    h = torch.randn(N, Hd, dtype=torch.bfloat16).requires_grad_()
    W = (torch.randn(V, Hd, dtype=torch.bfloat16) * 0.05).requires_grad_()
    t = torch.randint(0, V, (N,))
    t[::10] = -100

    def fwd_bwd():
        h.grad = W.grad = None
        oss.linear_cross_entropy(h, W, t, backend="triton").backward()

    ops, launches, _ = counts(fwd_bwd)
    return {"eager fwd + bwd": (timed(fwd_bwd, n), ops, launches)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    fake_gpu()
    print(f"harness wrapper per launch: {wrapper_cost(args.n):.2f} µs (in the rows below)")
    cases = [("cross_entropy N=64 V=32000 bf16 mean", dict(V=32000, N=64, dtype=torch.bfloat16), {}),
             ("cross_entropy N=64 V=128256 bf16 mean", dict(V=128256, N=64, dtype=torch.bfloat16), {}),
             ("cross_entropy N=64 V=32000 bf16 sum", dict(V=32000, N=64, dtype=torch.bfloat16),
              dict(reduction="sum")),
             ("cross_entropy N=64 V=32000 bf16 mean, smoothing 0.1 z 1e-4", dict(V=32000, N=64, dtype=torch.bfloat16),
              dict(label_smoothing=0.1, z_loss=1e-4))]
    ops_shown = False
    for title, shape, kw in cases:
        x2 = torch.empty(shape["N"], shape["V"], dtype=shape["dtype"])
        plan = ce.explain_cross_entropy(x2.requires_grad_(), torch.zeros(shape["N"], dtype=torch.long),
                                        backend="triton", target_gpu=H200, **kw)
        rows, opnames = ce_rows_of(n=args.n, **shape, **kw)
        print(f"{title}  (plan: {plan.path}, {plan.chunks} chunk(s))")
        for k_, (us, ops, launches) in rows.items():
            extra = "" if ops is None else f"  {ops:3d} ATen ops  {launches} launches"
            print(f"  {k_:40s} {us:8.1f} µs{extra}")
        if not ops_shown:
            print("  ATen ops of one fwd + bwd:", " ".join(opnames))
            ops_shown = True
    print("linear_cross_entropy N=16 Hd=16 V=4096 bf16 mean (scheme 'vocab'; its CPU GEMMs included; the custom op "
          "counts as one ATen op)")
    for k_, (us, ops, launches) in lce_rows_of(16, 16, 4096, max(args.n // 5, 20)).items():
        print(f"  {k_:40s} {us:8.1f} µs  {ops:3d} ATen ops  {launches} launches")


if __name__ == "__main__":
    main()
