"""Where the host time of one eager ``oss.attention`` call goes, measured on a machine without a GPU.

The public call runs on small CPU tensors as it would on an H200: the target is ``H200``, the problem TMA-able
(``_problem`` sees CPU tensors as TMA-able: a ``dataclasses.replace``, ~1-3 µs, that the GPU path does not pay), and
the bound launch replays a fake compiled kernel whose launcher is Triton 3.6's real ``wrap_handle_tensordesc``
wrapper around a no-op C launcher, ``fill_tma_descriptor`` (cuTensorMapEncodeTiled) a stub: everything Python does
per call is here, the C launcher's and the driver's own work is not (tools/probe_hostdesc.py measures those on the
GPU). Works on the tree on PYTHONPATH, this branch or main (``PYTHONPATH=/work/main/src``), for before / after.

    PYTHONPATH=src python tools/hostcost_cpu.py [--n 3000]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")      # resolve_backend's backend="triton" on CPU tensors

import torch  # noqa: E402
import triton.runtime  # noqa: E402
from hostcost_util import timed  # noqa: E402
from triton.backends.nvidia import driver  # noqa: E402

import onlinesoftmax as oss  # noqa: E402
from onlinesoftmax._triton import launch  # noqa: E402
from onlinesoftmax.attention import api  # noqa: E402
from onlinesoftmax.attention.plan import plan_attention  # noqa: E402
from onlinesoftmax.target import H200  # noqa: E402

CUDA0 = torch.device("cuda", 0)


def fake_gpu():
    """Patch the api as described above; returns the stub fill's call counter."""
    calls = [0]

    def fill(*a):
        calls[0] += 1
        return ("map",) + a[:1]

    triton.runtime.driver._active = types.SimpleNamespace(utils=types.SimpleNamespace(fill_tma_descriptor=fill))
    api.target_of = lambda device: H200
    real_problem = api._problem

    def problem(q, k, causal, window, v=None, *rest):
        p = real_problem(q, k, causal, window, v, *rest)
        return dataclasses.replace(p, tma=v is not None and api._tma_ok(q, k, v))

    api._problem = problem
    launch.current_device = lambda: 0
    launch.current_stream = lambda index: 0

    def noop(*args):
        return None

    real_caches, proxies = api._caches, {}

    def bound(p, plan, strides):
        bk = real_caches()[0](p, plan, strides)
        proxy = proxies.get(id(bk))
        if proxy is None:
            n = len(getattr(bk, "boxes", ())) or (4 if plan.programs else 0)
            sig = {prm.name: ("constexpr" if prm.is_constexpr else
                              "tensordesc<bf16[1, 1, 64, 64]>" if i < n else "i32")
                   for i, prm in enumerate(bk.fn.params)}
            metas = [dict(swizzle=3, elem_size=2, elem_type=10, block_size=[1, 1, 64, 64], fp4_padded=False)] * n
            run = types.SimpleNamespace(launch=driver.wrap_handle_tensordesc(noop, sig, metas), global_scratch_size=0,
                                        profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
            compiled = types.SimpleNamespace(run=run, function=0, packed_metadata=(4, 1, 0))
            key = (0, True, *([torch.bfloat16] * 4))
            bk._compiled[key] = bk._bind(compiled)
            bk.interpret = False

            def proxy(args, check, device, bk=bk):
                return bk(args, check, CUDA0)

            proxies[id(bk)] = (proxy, bk)
        return proxies[id(bk)][0]

    api._caches = lambda: (bound, real_caches()[1])
    return calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    calls = fake_gpu()
    rows = []
    for shape, causal in (((1, 2, 256, 64), False), ((1, 2, 256, 128), True)):
        q = torch.randn(*shape, dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        scale = shape[-1] ** -0.5
        left, right = -1, (0 if causal else -1)
        p = api._op_problem(q, k, v, causal, -1, -1, 0.0)
        plan = plan_attention(p, H200, "triton").forward
        assert plan.programs, plan            # the persistent forward
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32)
        impl = getattr(api, "_attention_fwd_impl", None) or api._attention_fwd_op._init_fn
        plan_fn = (lambda: api._triton_plan(p, q.device)) if hasattr(api, "_triton_plan") else \
            (lambda: plan_attention(p, api.target_of(q.device), "triton"))
        oss.attention(q, k, v, causal=causal, backend="triton")
        before = calls[0]
        oss.attention(q, k, v, causal=causal, backend="triton")
        fills = calls[0] - before
        n = args.n
        t = {
            "public call": timed(lambda: oss.attention(q, k, v, causal=causal, backend="triton"), n),
            "custom op call": timed(lambda: torch.ops.onlinesoftmax.attention_fwd(q, k, v, causal, scale, left, right,
                                                                                  0.0), n),
            "op body": timed(lambda: impl(q, k, v, causal, scale, left, right, 0.0), n),
            "_prepare (checks)": timed(lambda: api._prepare(q, k, v, causal, None, None, None, "triton"), n),
            "_decode_call": timed(lambda: api._decode_call(q, k, v), n),
            "_op_problem (+ fake tma)": timed(lambda: api._op_problem(q, k, v, causal, left, right, 0.0), n),
            "plan": timed(plan_fn, n),
            "o, lse = torch.empty": timed(lambda: (torch.empty_like(q),
                                                   torch.empty(q.shape[:3], dtype=torch.float32)), n),
            "_forward_persistent": timed(lambda: api._forward_persistent(q, k, v, o, lse, p, plan, scale, 0.0), n),
        }
        t["custom op dispatch"] = t["custom op call"] - t["op body"]
        rows.append((f"{shape} causal={causal} fills/call={fills}", t))
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = [1, 1, 64, 64]
    lay = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    desc = TensorDescriptor(q, list(q.shape), list(q.stride()), block, lay)
    meta = dict(swizzle=3, elem_size=2, elem_type=10, block_size=block, fp4_padded=False)
    rows.append(("pieces (each per descriptor; a call of the old path made four)", {
        "get_default_for": timed(lambda: gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16), args.n),
        "TensorDescriptor(...)": timed(lambda: TensorDescriptor(q, list(q.shape), list(q.stride()), block, lay),
                                       args.n),
        "make_tensordesc_arg (stub)": timed(lambda: driver.make_tensordesc_arg(desc, meta), args.n),
        "_tma_ok(q, k, v)": timed(lambda: api._tma_ok(q, k, v), args.n),
        "fake tma's replace (harness)": timed(lambda: dataclasses.replace(p, tma=True), args.n),
    }))
    for name, t in rows:
        print(name)
        for k_, val in t.items():
            print(f"  {k_:28s} {val:8.1f} µs")


if __name__ == "__main__":
    main()
