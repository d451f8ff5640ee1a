"""Compile the attention kernels for sm_90a here (no GPU needed): registers, stack, shared memory, and whether
the matmuls became wgmma (HGMMA in SASS). Run: ``PYTHONPATH=src python benchmarks/attention_ptxas.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from onlinesoftmax.attention.kernels import fwd

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SM90 = GPUTarget("cuda", 90, 32)


def report(compiled):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    return tuple(int(g) for g in m.groups()), sass.count("HGMMA"), sass.count("HMMA")


def sig(names, ptr_dtype, ints, floats):
    s = {}
    for n in names:
        s[n] = "*fp32" if n in ("LSE", "DELTA", "DLSE") else f"*{ptr_dtype}"
    for n in ints:
        s[n] = "i32"
    for n in floats:
        s[n] = "fp32"
    return s


def fwd_src(D, BM, BN, dt="bf16", left=False, right=False, softcap=False, ones=(), divisible=("Sq", "Sk")):
    strides = [f"s{t}{a}" for t in "qkvo" for a in "bhmd"]
    ints = strides + ["H", "GROUP", "Sq", "Sk", "LEFT", "RIGHT"]
    s = sig(["Q", "K", "V", "O", "LSE"], dt, ints, ["qk_scale", "cap_in", "cap_out"])
    params = list(fwd.attention_fwd_kernel.arg_names)
    sig_by_pos = dict(zip(params, list(s.values())))
    bd = max(16, 1 << (D - 1).bit_length())
    constexprs = dict(HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=bd, HAS_LEFT=left, HAS_RIGHT=right,
                      SOFTCAP=softcap, REVERSE=right, F32=False)
    for n in ("sqd", "skd", "svd", "sod") + tuple(ones):
        constexprs[n] = 1
    full = {n: ("constexpr" if n in constexprs else sig_by_pos[n]) for n in params}
    # what a launch specialises on: pointers 16-byte aligned, strides and sizes divisible by 16
    div16 = [n for n in params if n not in constexprs and (full[n].startswith("*") or n[0] == "s" or n in divisible)]
    attrs = {(params.index(n),): [["tt.divisibility", 16]] for n in div16}
    return ASTSource(fwd.attention_fwd_kernel, full, {(params.index(n),): v for n, v in constexprs.items()}, attrs)


def main():
    rows = []
    for D, BM, BN, w, st in [(64, 128, 128, 4, 3), (128, 128, 128, 8, 3), (128, 128, 64, 4, 3), (256, 128, 64, 8, 2),
                             (80, 128, 64, 8, 2)]:
        for right in (False, True):
            c = triton.compile(fwd_src(D, BM, BN, right=right), target=SM90,
                               options=dict(num_warps=w, num_stages=st))
            rows.append((f"fwd D{D} {BM}x{BN} w{w} s{st} causal={right}", *report(c)))
    c = triton.compile(fwd_src(64, 64, 64, left=True, right=True, softcap=True, ones=("Sk", "Sq", "GROUP", "H")),
                       target=SM90, options=dict(num_warps=4, num_stages=2))
    rows.append(("fwd D64 window+softcap, sizes 1", *report(c)))
    for r in rows:
        print(r)


if __name__ == "__main__":
    sys.exit(main())
