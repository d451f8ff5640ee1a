"""Registers, stack frame (spills) and shared memory of the top-k kernels for the 45 goal shapes, compiled for
sm_90a here: no GPU needed (Triton's own ptxas and cuobjdump).

``PYTHONPATH=src python benchmarks/topk_ptxas.py [> ptxas.txt]``. Compiles each distinct configuration once, with
the specialisations a real launch gets (stride 1 as a constant, pointers and sizes divisible by 16).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from onlinesoftmax.kernels import topk as kt  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
STAGE1_SIG = {"x_ptr": "*fp32", "ws_ptr": "*i32", "stride_b": "i32", "stride_v": "constexpr", "V": "i32",
              "k": "i32", "S": "i32", "BS": "i32"}
MERGE_SIG = {"x_ptr": "*fp32", "stride_b": "i32", "stride_v": "constexpr", "V": "i32", "ws_ptr": "*i32",
             "out_ptr": "*i32", "val_ptr": "*fp32", "ind_ptr": "*i64", "lse_ptr": "*fp32", "k": "i32", "S": "i32",
             "BS": "i32", "GS": "i32", "NG": "i32"}


def resources(fn, sig: dict, constexprs: dict, num_warps: int) -> tuple[int, int, int]:
    """(registers, stack frame bytes, shared bytes) of ``fn`` compiled for sm_90a."""
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or n in ("stride_b", "V")}
    src = ASTSource(fn, sig, dict(constexprs, stride_v=1), attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", out)
    return tuple(int(g) for g in m.groups())


def main():
    seen: dict = {}
    print("(B, V, k): configuration | stage 1 (registers, stack bytes, shared bytes) | merge (same)")
    for B in (1, 32, 256):
        for V in (128256, 151936, 262144):
            for k in (1, 8, 50, 256, 1024):
                cfg = kt.select_path(B, V, k)
                sp = kt._pow2(cfg.splits)
                ct = max(1, min(sp, kt.MERGE_TILE // cfg.cap))
                meta = dict(BLOCK=cfg.block, R=cfg.cols, CAP=cfg.cap, FAST=True)
                k1 = ("stage1", cfg.block, cfg.cols, cfg.cap, cfg.num_warps)
                if k1 not in seen:
                    seen[k1] = resources(kt._topk_chunk_kernel, STAGE1_SIG, meta, cfg.num_warps)
                k2 = ("merge", cfg.block, cfg.cols, cfg.cap, sp, ct, cfg.merge_warps)
                if k2 not in seen:
                    seen[k2] = resources(kt._topk_merge_kernel, MERGE_SIG, dict(meta, SP=sp, CT=ct), cfg.merge_warps)
                print(f"({B}, {V}, {k}): block {cfg.block} R {cfg.cols} CAP {cfg.cap} warps {cfg.num_warps} "
                      f"S {cfg.splits} merge tiles {sp // ct} of {ct}x{cfg.cap}, merge warps {cfg.merge_warps} | "
                      f"stage 1 {seen[k1]} | merge {seen[k2]}", flush=True)


if __name__ == "__main__":
    main()
