"""Every top-k kernel compiles for sm_90a when any size or stride is 1 (no GPU needed: Triton's ptxas).

Triton specialises an integer argument equal to 1 into a constant (a Python int in the kernel's body, with no
``.to``): ``buf = slots + BS.to(tl.int64) * ...`` failed to compile for one row (BS = B·S = 1), so
``softmax_topk`` of a 1 x 3 row with k = 2 crashed on the GPU. The launches of ``topk/launch.py:_launches`` are
compiled as a real launch specialises them (``tools/compiler_report.py:compile_launch``), for B, V, k in {1, 2, 3}
with contiguous, transposed and unit strides, in one launch (a row in one chunk) and in two, and for plans with
the two-level merge, the exact path apart, the narrow merge and 3-bit bisection at B = 1 (k = 1 or 3); the
backward's row kernel at unit sizes and strides. The goal shapes at B = 1 are in the compiler report.

In a child process: under TRITON_INTERPRET=1 (CI) the kernels are interpreter objects, which do not compile.
"""

import json
import os
import subprocess
import sys

import pytest

import onlinesoftmax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r"""
import itertools, json, sys
import torch
import compiler_report as CR
from onlinesoftmax._triton.host import int_spec
from onlinesoftmax.target import H200
from onlinesoftmax.topk import launch as TL
from onlinesoftmax.topk import plan as tp

seen, failed = {}, []


def compile_plan(plan, B, V, k, stride_b, stride_v):
    x = CR._meta((B, V), torch.float32)
    ws, ws2 = CR._meta((1 << 22,), torch.int32), CR._meta((1 << 20,), torch.int32)
    out = (CR._meta((B, k), torch.float32), CR._meta((B, k), torch.int64), CR._meta((B,), torch.float32))
    for kernel, args in TL._launches(plan, B, V, k, stride_b, stride_v):
        a = args(x, ws, ws2, out)
        key = CR._key(kernel.fn, kernel.meta, a)    # the same specialisation compiles once
        if key in seen:
            continue
        try:
            seen[key] = CR.compile_launch(kernel.fn, a, kernel.meta, 90)
        except Exception as e:
            seen[key] = None
            failed.append(f"{kernel.fn.__name__} B={B} V={V} k={k} strides=({stride_b}, {stride_v}) {plan}: "
                          f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")


for B, V, k in itertools.product((1, 2, 3), repeat=3):
    if k <= V:
        for strides, one in itertools.product(((V, 1), (1, B), (1, 1)), (None, False)):
            compile_plan(tp.topk_plan(B, V, k, 4, H200, tp.Knobs.of(one=one)), B, V, k, *strides)
for k, knobs in ((1, dict(tree=2, exact_apart=True)), (1, dict(tree=2)), (3, dict(kb=2, width=8, peel=0)),
                 (3, dict(kb=2, width=8, peel=2)), (1, dict(radix=3))):
    plan = tp.topk_plan(1, 300, k, 4, H200, tp.Knobs.of(block=128, **knobs))
    compile_plan(plan, 1, 300, k, 300, 1)
for B, V, k in ((1, 1, 1), (1, 3, 2), (3, 1, 1), (2, 300, 13), (70, 64, 8), (1, 5000, 3000)):   # the backward's
    for (sb, sv), dt, has in itertools.product(((V, 1), (1, B), (1, 1)), (torch.float32, torch.bfloat16),
                                               ((True, True), (True, False), (False, True))):
        bk = TL._grad_launch(B, V, k, *has, int_spec(sb, sv, k, 1, 1))
        f32 = torch.float32
        a = (CR._meta((B, V), dt), CR._meta((B,), f32), CR._meta((B, k), f32), CR._meta((B, k), torch.int64),
             CR._meta((B, k), f32), CR._meta((B,), f32), CR._meta((B, V), dt), sb, sv, k, 1, 1, B, V, k,
             -(-V // bk.meta["BLOCK"]))
        key = CR._key(bk.fn, bk.meta, a)
        if key not in seen:
            try:
                seen[key] = CR.compile_launch(bk.fn, a, bk.meta, 90)
            except Exception as e:
                seen[key] = None
                failed.append(f"_topk_grad_kernel B={B} V={V} k={k} strides=({sb}, {sv}) {dt} {has}: "
                              f"{type(e).__name__}: {e}")
names = sorted({json.loads(key)[0] for key in seen})
print(json.dumps(dict(compiled=len(seen), failed=failed, names=names)))
"""


def _compile_probe(probe: str) -> dict:
    """Run ``probe`` in a child process without the interpreter (kernels compile there for sm_90a with Triton's
    ptxas; skip where it is not installed) and return the JSON it prints last."""
    pytest.importorskip("triton")
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's NVIDIA backend (ptxas) is not installed")
    src = os.path.dirname(os.path.dirname(onlinesoftmax.__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([src, os.path.join(ROOT, "tools"), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_topk_kernels_compile_with_unit_sizes_and_strides():
    out = _compile_probe(PROBE)
    assert not out["failed"], "\n".join(out["failed"])
    # both launch shapes of a one-chunk row (one launch, and stage 1 + merge) and the exact path apart compiled
    assert out["names"] == ["_topk_chunk_kernel", "_topk_exact_kernel", "_topk_grad_kernel", "_topk_merge_kernel",
                            "_topk_row_kernel"]
    assert out["compiled"] >= 30


SAMPLE_PROBE = r"""
import itertools, json
import torch
import compiler_report as CR
from onlinesoftmax.topk.sampling_kernels import _sample_kernel, _sample_row_kernel

M = CR._meta
f32, i64, i32 = torch.float32, torch.int64, torch.int32
failed, n = [], 0
for B, V, K in itertools.product((1, 3), (1, 3, 300), (1, 3, 64)):
    if K > V:
        continue
    vals, inds, lse = M((B * K,), f32), M((B * K,), i64), M((B,), f32)
    ids, logp, flag = M((B,), i64), M((B,), f32), M((B,), i32)
    for per_row, fixed, philox in ((False, False, 0), (True, False, 0), (True, True, 1), (True, True, 2)):
        s = 1 if per_row else -1            # scalars (stride -1) and per-row tensors (stride 1)
        params = (vals, 0.8, s, inds, 5, s, vals, 0.9, s, vals, 0.1, s)
        rng = (-5, 7, -2**31, 1, 3, -9)
        u = M((B,), i64 if philox == 2 else f32)        # philox 2: the capture's slots
        launches = [(_sample_kernel, (vals, inds, lse, u, ids, logp, flag, *params, *rng, K, V),
                     dict(KP=max(16, 1 << (K - 1).bit_length()), num_warps=1, FIXED=fixed, PHILOX=philox,
                          PDL=philox > 0)),
                    *((_sample_row_kernel, (M((B, V), f32), V, 1, V, inds, lse, u, ids, logp, flag, *params, *rng,
                                            K, M((B,), i32), M((B,), i32), M((64 * B,), i32), M((64 * B,), f32),
                                            M((3 * B,), i32), M((6 * B,), f32), M((64 * B,), i32), 2, 1024),
                       dict(BLOCK=1024, CP=2, num_warps=4, PHILOX=philox, BINS=bins, CAP=64, PDL=philox > 0))
                      for bins in (0, 1))]
        for fn, args, meta in launches:
            try:
                CR.compile_launch(fn, args, meta, 90)
                n += 1
            except Exception as e:
                failed.append(f"{fn.__name__} B={B} V={V} K={K}: {type(e).__name__}: {str(e)[-300:]}")
print(json.dumps(dict(compiled=n, failed=failed)))
"""


@pytest.mark.slow
def test_sampling_kernels_compile():
    """The sampling kernels compile for sm_90a at unit and odd sizes, with scalar and per-row parameters (the row
    kernel once failed to compile on the GPU only: a name rebound with another type in a branch)."""
    out = _compile_probe(SAMPLE_PROBE)
    assert out["compiled"] >= 140 and not out["failed"], "\n".join(out["failed"])


CALL_PROBE = r"""
import itertools, json
import torch
import compiler_report as CR
from onlinesoftmax._triton.host import int_spec
from onlinesoftmax.target import H200
from onlinesoftmax.topk.plan import SampleKnobs, sample_plan
from onlinesoftmax.topk.sampling_launch import SampleCall

M = CR._meta
failed, n, seen, worst = [], 0, set(), {}
for (B, V, K), (fuse, mass, philox), t_mode, per_row in itertools.product(
        ((1, 3, 1), (3, 300, 3), (1, 128256, 50), (8, 128256, 50), (256, 128256, 50), (64, 262144, 50),
         (2, 151936, 256), (1, 128256, 1)),
        ((False, "fp32", 0), (True, "fp32", 0), (True, "fixed", 1), (False, "fixed", 1), (True, "fixed", 2)),
        (0, 1), (False, True)):
    if philox and (t_mode, per_row) != (1, False):
        continue
    plan = sample_plan(B, V, 4, H200, top_k=K, knobs=SampleKnobs(fuse=fuse, mass=mass))
    call = SampleCall(plan, B, V, V, 1, t_mode, torch.device("meta"), torch.bfloat16 if per_row else torch.float32,
                      philox)
    x = M((B, V), call.dtypes[0])
    ws, ws2 = M((1 << 24,), torch.int32), M((1 << 20,), torch.int32)
    views = (ws, ws2) + ((None,) * 4 if fuse else (M((B * K,), torch.float32), M((B * K,), torch.int64),
                                                     M((B,), torch.float32), M((B,), torch.int32)))
    ids, logp = M((B,), torch.int64), M((B,), torch.float32)
    u = M((B,), torch.int64 if philox == 2 else torch.float32)     # philox 2: the capture's slots
    s = 1 if per_row else -1
    f, i = (M((B,), torch.float32), M((B,), torch.int64)) if per_row else (logp, ids)
    prm = [f, 0.8, s, i, K, s, f, 0.9, s, f, 0.1, s]
    rng = (-5, 7, -2**31, 1, 3, -9) if philox else (0,) * 6
    for kern, a in zip(call.kernels, call._arglists(x, views, ids, logp, u, prm, rng)):
        key = CR._key(kern.fn, kern.meta, a)
        if key in seen:
            continue
        seen.add(key)
        try:
            r = CR.compile_launch(kern.fn, a, kern.meta, 90)
            n += 1
            if kern.fn.__name__ == "_sample_merge_kernel":
                worst[f"B={B} V={V} K={K} philox={philox}"] = (r["regs"], r["stack"])
            if r["stack"] and B <= 8 and K <= 50:     # (the merges spill a little at B >= 64 or K = 256 already)
                failed.append(f"{kern.fn.__name__} B={B} V={V} K={K}: spills ({r['stack']} bytes of stack)")
        except Exception as e:
            failed.append(f"{kern.fn.__name__} B={B} V={V} K={K} fuse={fuse} {mass} philox={philox}: "
                          f"{type(e).__name__}: {str(e)[-300:]}")
print(json.dumps(dict(compiled=n, failed=failed, fused=worst)))
"""


@pytest.mark.slow
def test_sample_call_launches_compile():
    """Every launch a bound ``sample`` problem makes (``SampleCall``: the top-k stages, then the fused sampling merge
    or step 1), with its real argument layout, compiles for sm_90a (without spilling up to B = 8, k = 50): unit
    sizes, the goal shapes, scalar and per-row parameters, T folded in or not."""
    out = _compile_probe(CALL_PROBE)
    assert out["compiled"] >= 20 and not out["failed"], "\n".join(out["failed"])
