"""The shared-memory kernels compiled for sm_90a (no GPU needed: Triton's ptxas and cuobjdump): the chunk held in
shared memory by cp.async, its register sub-tiles, and no spills at the backward's SMEM_BWD_CONFIG defaults.

Compiled in a child process: under TRITON_INTERPRET=1 (CI) Triton's own helpers are interpreter objects, which
Gluon cannot compile.
"""

import json
import os
import subprocess
import sys

import torch

from onlinesoftmax.softmax import tuned as T

# cuobjdump's resource usage, as tools/compiler_report.py's cubin_report reads it (tools/ is not a package)
CUBIN_REPORT = r'''
import os, re, subprocess, tempfile
import triton

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def cubin_report(compiled):
    """(registers, stack frame bytes, shared bytes) of a compiled kernel, read with cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    return tuple(int(g) for g in m.groups())
'''


def _run_probe(probe: str, *args: str, timeout: int) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_smem_kernel_compiles_for_sm90():
    """The forward's shared-memory coop kernel compiles for sm_90a holding its chunk in shared memory (cp.async)
    with no spills, and with its first REG sub-tiles in registers (where it is eligible: test_plan.py)."""
    probe = r"""
import json
import re
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.softmax.kernels.smem import softmax_coop_smem_kernel as fn
sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
sig.update(X="*fp32", Y="*fp32", PART_M="*fp32", PART_D="*fp32", ARRIVE="*i32", GEN="*i32")
out = []
for reg in (0, 4):      # the chunk's first `reg` sub-tiles in registers (REG)
    const = dict(CHUNK=8192, VEC=4, WARPS=8, C_POW2=16, MODE=0, EVEN=False, REG=reg, WORDS=False, FAST=2,
                 KEEP_E=False)
    k = compile(GluonASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = k.asm["ptx"]
    out.append({"shared": k.metadata.shared, "local": "ld.local" in ptx,
                "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx))})
print(json.dumps(out))
"""
    full, hybrid = _run_probe(probe, timeout=300)
    assert full["shared"] >= 8192 * 4 and full["cp_async"] >= 8 and not full["local"], full
    # 8 sub-tiles of 1024 elements: 4 in shared memory, 4 in registers, no spills
    assert 4096 * 4 <= hybrid["shared"] < 8192 * 4 and hybrid["cp_async"] >= 4 and not hybrid["local"], hybrid


def test_smem_backward_defaults_compile_for_sm90_without_spills():
    """The backward smem kernel at its SMEM_BWD_CONFIG defaults (fp32 softmax 10240 / 4 warps / 8 register
    sub-tiles of y and dy: 124 registers; 16-bit 32768 / 8 / 2, bf16 as words, fp16 as elements under
    SMEM_BWD_F16_MAXNREG: without it ptxas spills; log-softmax with its ring of y, RING) compiles for sm_90a with no
    stack frame (no spills; cuobjdump's resource usage) and the shared memory of its (chunk - reg sub-tiles) of y
    and dy (with RING: of dy, and `ring` sub-tiles of y)."""
    cases = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False), (torch.float16, False),
             (torch.bfloat16, True), (torch.float16, True)]
    specs = []
    for dtype, log in cases:
        chunk, warps, reg, ring = T.SMEM_BWD_CONFIG[dtype.itemsize, log][0]
        vec = 16 // dtype.itemsize
        specs.append(dict(ptr={torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype],
                          maxnreg=T.SMEM_BWD_F16_MAXNREG if dtype == torch.float16 else 0, CHUNK=chunk, VEC=vec,
                          WARPS=warps, REG=reg, WORDS=dtype == torch.bfloat16, LOG=log, RING=ring,
                          LIBDEVICE=dtype == torch.float32, SUM="fp64" if dtype == torch.float32 else "fp32",
                          smem=((2 - bool(ring)) * (chunk - reg * vec * 32 * warps) + ring * vec * 32 * warps)
                          * dtype.itemsize))
    probe = CUBIN_REPORT + r"""
import json, sys
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from onlinesoftmax.softmax.kernels.smem import softmax_bwd_coop_smem_kernel as fn
out = []
for spec in json.loads(sys.argv[1]):
    sig = {p.name: "constexpr" if p.is_constexpr else "i32" for p in fn.params}
    sig.update(Yp=spec["ptr"], DY=spec["ptr"], DX=spec["ptr"], PART="*" + spec["SUM"], ARRIVE="*i32", GEN="*i32")
    const = {k: spec[k] for k in ("CHUNK", "VEC", "WARPS", "REG", "WORDS", "LOG", "LIBDEVICE", "RING")}
    const.update(C_POW2=16, EVEN=True, SUM=getattr(tl, {"fp64": "float64", "fp32": "float32"}[spec["SUM"]]))
    # as the plan launches unit-stride rows of 16-byte aligned tensors (tools/compiler_report.py compiles them so):
    # INNER = 1 a constant, pointers, N and the strides divisible by 16
    sig["INNER"], const["INNER"] = "constexpr", 1
    aligned = ("Yp", "DY", "DX", "PART", "N", "syo", "syi", "sdo", "sdi", "sxo", "sxi")
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    opts = {"num_warps": spec["WARPS"], **({"maxnreg": spec["maxnreg"]} if spec["maxnreg"] else {})}
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    regs, stack, _ = cubin_report(k)
    out.append({"regs": regs, "stack": stack, "shared": k.metadata.shared})
print(json.dumps(out))
"""
    for spec, got in zip(specs, _run_probe(probe, json.dumps(specs), timeout=600)):
        assert got["stack"] == 0 and got["regs"] <= 255 and got["shared"] >= spec["smem"], (spec, got)
