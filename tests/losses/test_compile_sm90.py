"""The cross-entropy's shared-memory kernel (path "smem", Gluon: it runs on sm_90 only, never under the interpreter)
compiled for sm_90a as its launcher binds it, with no GPU: cp.async copies, the shared memory of its chunk less the
register sub-tiles, registers within the plan's bound and no spills (cuobjdump's stack frame).

Compiled in a child process: under TRITON_INTERPRET=1 (CI) Triton's own helpers are interpreter objects, which
Gluon cannot compile.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r"""
import json, os, re, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
from compiler_report import cubin_report          # pops TRITON_INTERPRET before triton loads
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.losses import kernels as K
from onlinesoftmax.losses.plan import CEKnobs, CEProblem, plan_cross_entropy
from onlinesoftmax.target import H200

out = []
for case in json.loads(sys.argv[2]):
    V, itemsize, flags = case["V"], case["itemsize"], case["flags"]
    plan = plan_cross_entropy(CEProblem(8192, V, itemsize, True, smem_rows=True), H200,
                              CEKnobs(path="smem", **case["knobs"]))
    f = dict(HAS_WEIGHT=False, HAS_SMOOTH=False, HAS_Z=False, HAS_SOFTCAP=False, NEED_GRAD=True, HAS_G=False,
             FAST=1)
    f.update(flags)
    bound = K._rows_launch(plan, 8192, V, tuple(f.items()), (16,) * 5, itemsize, itemsize == 2).launches[0]
    fn, meta = bound.fn, dict(bound.meta)
    opts = {k: meta.pop(k) for k in ("num_warps", "maxnreg") if k in meta}
    ptr = "*bf16" if itemsize == 2 else "*fp32"
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
    sig.update(X=ptr, DX=ptr, T="*i64", W="*fp32", COEF="*fp32", LOSS="*fp32", LSE="*fp32", G="*fp32",
               PART_M="*fp32", PART_D="*fp32", PART_S="*fp32", ARRIVE="*i32", GEN="*i32", eps="fp32",
               z_loss="fp32", softcap="fp32")
    # as a launch specialises it: pointers, V and the row strides divisible by 16
    aligned = ("X", "DX", "stride_x", "stride_dx", "V", "T", "W", "COEF", "LOSS", "LSE", "PART_M", "PART_D",
               "PART_S", "ARRIVE", "GEN")
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    k = triton.compile(GluonASTSource(fn, sig, meta, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    (regs, stack, _), _ = cubin_report(k)
    sub = 16 // itemsize * 32 * plan.num_warps
    out.append({"regs": regs, "stack": stack, "shared": k.metadata.shared, "maxnreg": opts.get("maxnreg", 0),
                "smem": (plan.chunk // sub - plan.reg) * sub * itemsize,
                "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", k.asm["ptx"]))})
print(json.dumps(out))
"""

CASES = [
    # the plan's bf16 chunking at V = 128256 (4 register sub-tiles as words, 64 registers), with KEEP_E, and with
    # every unweighted option; V = 32000's whole row in one program (8 warps, 4 register sub-tiles of 2048 under 64
    # registers), plain and with every unweighted option; fp32 at V = 262144 (chunks divide the row: EVEN); the
    # masked chunking (V = 50256); a weighted loss with smoothing and softcap (the compiler's register count)
    dict(V=128256, itemsize=2, knobs={}, flags={}),
    dict(V=32000, itemsize=2, knobs={}, flags={}),
    dict(V=128256, itemsize=2, knobs=dict(keep_e=True), flags={}),
    dict(V=32000, itemsize=2, knobs={}, flags=dict(HAS_SMOOTH=True, HAS_Z=True, HAS_SOFTCAP=True, HAS_G=True)),
    dict(V=262144, itemsize=4, knobs={}, flags={}),
    dict(V=50256, itemsize=2, knobs={}, flags={}),
    dict(V=151936, itemsize=2, knobs=dict(keep_e=True), flags=dict(HAS_WEIGHT=True, HAS_SMOOTH=True, HAS_Z=True,
                                                                  HAS_SOFTCAP=True)),
]


def test_smem_cross_entropy_compiles_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", PROBE, ROOT, json.dumps(CASES)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for case, got in zip(CASES, json.loads(res.stdout.strip().splitlines()[-1])):
        assert got["stack"] == 0 and got["shared"] >= got["smem"] > 0 and got["cp_async"] > 0, (case, got)
        assert got["regs"] <= (got["maxnreg"] or 255), (case, got)


LCE_PROBE = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
from compiler_report import compile_launch          # pops TRITON_INTERPRET before triton loads
import torch
from onlinesoftmax.losses import lce_kernels as K

out = []
for n, vc in ((8192, 3840), (16384, 1920)):
    S = torch.empty(n, vc, dtype=torch.bfloat16, device="meta")
    T = torch.empty(n, dtype=torch.int64, device="meta")
    f = torch.empty(n, dtype=torch.float32, device="meta")
    for smooth in (False, True):
        for cap in (False, True):
            meta = K._meta(vc, True, smooth, cap)
            for fn in (K.lce_fold_kernel, K.lce_grad_kernel):
                r = compile_launch(fn, (S, vc, T, f, f, f, f, vc, vc, -100, 1.0), meta, 90)
                out.append(dict(kernel=fn.__name__, vc=vc, smooth=smooth, cap=cap, regs=r["regs"], stack=r["stack"]))
print(json.dumps(out))
"""


def test_linear_cross_entropy_vocab_kernels_compile_for_sm90_without_spills():
    """Scheme "vocab"'s fold and gradient kernels at the goal shapes' chunks, every option: no stack frame."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", LCE_PROBE, ROOT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for got in json.loads(res.stdout.strip().splitlines()[-1]):
        assert got["stack"] == 0 and got["regs"] <= 128, got
