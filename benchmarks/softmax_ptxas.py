"""Compiler report for the softmax family: for each goal shape of issue 3 (1 GiB per tensor, as the bench suites),
and for the softmax decode shapes (M = 1 / 8 / 32 rows of 128256 / 151936 / 262144, with their grid and the
fraction of the GPU's program slots it fills), the kernels the plan launches on an H200, compiled here for sm_90a
(no GPU: Triton's ptxas and cuobjdump), with

- registers, stack frame (spills), shared memory (dynamic included), and the programs per SM they allow;
- the bytes a program holds (its tile or chunk: in registers, or in shared memory for the Gluon kernels of
  kernels/softmax_smem.py) and an SM at that occupancy;
- from the SASS: instructions per thread and MUFU (exp/log/rcp) per thread, per element, and the element rates
  they bound: issue 4 warp-instructions per clock per SM, MUFU 16 lanes per clock per SM, at CLOCK_GHZ, against
  the rate the copy ceiling asks for. Static counts over the elements one thread holds per tile: the main loop's
  body where the kernel loops over tiles (marked *), else the whole kernel (straight-line code runs once; the
  barrier's spin loop counts once).

    PYTHONPATH=src python benchmarks/softmax_ptxas.py > benchmarks/results/softmax/ptxas-<commit>.txt
"""

from __future__ import annotations

import collections
import os
import re

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from cubin_tools import compile_sm90, cubin_report  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from onlinesoftmax.kernels import softmax as K  # noqa: E402
from onlinesoftmax.ops.softmax import row_geometry  # noqa: E402

SMS = 132                 # H200
CLOCK_GHZ = 1.98          # H200 boost clock: the bounds below assume it
COPY_GBPS = 4281          # measured copy ceiling (ANCHORS.md)
REGS_PER_SM, MAX_WARPS_PER_SM, MAX_PROGRAMS_PER_SM = 65536, 64, 32
GIB = 1 << 30
PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
       torch.int32: "*i32"}


def compile_launch(fn, args: tuple, meta: dict):
    """``fn`` specialised as a launch with ``args`` gets it (ints equal to 1 as constants, pointers and ints
    divisible by 16 marked so), compiled for sm_90a: ((registers, stack bytes, shared bytes), SASS text)."""
    sig, const, attrs = {}, {}, {}
    runtime = [p for p in fn.params if not p.is_constexpr]
    for p, a in zip(runtime, args):
        if isinstance(a, torch.Tensor):
            sig[p.name] = PTR[a.dtype]
            attrs[(fn.arg_names.index(p.name),)] = [["tt.divisibility", 16]]
        elif a == 1:
            sig[p.name], const[p.name] = "constexpr", 1
        else:
            sig[p.name] = "i32" if abs(a) < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(fn.arg_names.index(p.name),)] = [["tt.divisibility", 16]]
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", meta[p.name]
    sig = {n: sig[n] for n in fn.arg_names}
    options = {k: v for k, v in meta.items() if k in ("num_warps", "maxnreg")}
    source = GluonASTSource if fn.is_gluon() else ASTSource
    compiled = compile_sm90(source(fn, sig, const, attrs), options)
    (regs, stack, shared), sass = cubin_report(compiled, sass=True)
    return (regs, stack, max(shared, compiled.metadata.shared)), sass   # dynamic shared memory included


def opcodes(sass: str) -> tuple[collections.Counter, bool]:
    """Opcode counts of the instructions that run once per tile: the body of the kernel's main loop (its
    longest backward branch, when that spans over a third of the code: the persistent `rows` loop), else the
    whole kernel (the barrier's spin loop is short and counts once). Returns (counts, looped)."""
    code = []                                     # (address, opcode, branch target or None)
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line)
        if m and m.group(2) != "NOP":
            t = re.search(r"0x([0-9a-f]+)", m.group(3)) if m.group(2).startswith("BRA") else None
            code.append((int(m.group(1), 16), m.group(2).split(".")[0], int(t.group(1), 16) if t else None))
    back = [(a - t, t, a) for a, _, t in code if t is not None and t < a]
    span, lo, hi = max(back, default=(0, 0, 0))
    looped = span * 3 > (code[-1][0] - code[0][0]) if code else False
    return collections.Counter(op for a, op, _ in code if not looped or lo <= a <= hi), looped


def programs_per_sm(regs: int, warps: int, shared: int) -> int:
    per_warp = -(-regs * 32 // 256) * 256          # registers are allocated per warp in units of 256
    by_regs = REGS_PER_SM // (per_warp * warps)
    by_shared = (228 * 1024) // max(shared + 1024, 1)
    return min(by_regs, MAX_WARPS_PER_SM // warps, MAX_PROGRAMS_PER_SM, by_shared)


def fake(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def plan_for(op: str, dtype, n: int, m: int | None = None):
    """The plan of a goal shape: 1 GiB per tensor, or ``m`` rows (decode)."""
    size = torch.finfo(dtype).bits // 8
    m = m or GIB // (n * size)
    x = fake((m, n), dtype)
    if op == "bwd":
        y, dy, dx = x, fake((m, n), dtype), fake((m, n), dtype)
        M, N, inner, (g1, g2, g3) = row_geometry([y, dy, dx], 1)
        plan = K._backward_plan({}, x.device, g1, g2, g3, M, N, inner, False, (dtype,) * 3, dtype == torch.bfloat16,
                                aligned=True)
        return plan, (y, dy, dx), 3 * size
    mode = {"fwd": K.SOFTMAX, "log": K.LOG_SOFTMAX, "lse": K.LOGSUMEXP}[op]
    out = fake((m,), dtype) if mode == K.LOGSUMEXP else fake((m, n), dtype)
    M, N, inner, (gx, gy) = row_geometry([x, out if mode != K.LOGSUMEXP else x], 1)
    plan = K._forward_plan({}, x, out, gx, gy, M, N, inner, mode, dtype == torch.bfloat16)
    return plan, (x, out), (1 if mode == K.LOGSUMEXP else 2) * size


def main():
    K.sm_count = lambda device: SMS                   # plan as on the H200
    K.stream_scratch = lambda tag, device, layout, zeroed=None: tuple(fake((n,), dt) for n, dt in layout)
    print(f"sm_90a, {SMS} SMs at {CLOCK_GHZ} GHz (assumed), copy ceiling {COPY_GBPS} GB/s; 1 GiB per tensor.\n"
          "bound GB/s = bytes per element x element rate bounded by instruction issue (4 warp-instr/clk/SM) or MUFU "
          "(16 lanes/clk/SM)")
    seen = {}
    goal = [(op, dtype, None, n) for op in ("fwd", "log", "lse", "bwd") for dtype in (torch.float32, torch.bfloat16)
            for n in (1024, 4096, 16384, 32768, 131072, 262144)]
    decode = [("fwd", dtype, m, n) for dtype in (torch.float32, torch.bfloat16) for m in (1, 8, 32)
              for n in (128256, 151936, 262144)]
    for op, dtype, m, n in goal + decode:
        plan, tensors, bpe = plan_for(op, dtype, n, m)
        rec = plan.record
        ws = None
        if plan.workspace is not None:            # the views _workspace carves, as meta tensors
            rows, parts, wdt, pick = plan.workspace
            layout = K._workspace(torch.device("meta"), rows, parts, wdt)
            ws = tuple(layout[i] for i in pick)
        for bound in plan.launches:
            args = tensors + (ws or ()) + plan.scalars
            key = (bound.fn.__name__, tuple(sorted(bound.meta.items(), key=str)),
                   tuple(a.dtype if isinstance(a, torch.Tensor) else (a == 1, a % 16 == 0) for a in args))
            if key not in seen:
                seen[key] = compile_launch(bound.fn, args, bound.meta)
            (regs, stack, shared), sass = seen[key]
            warps = bound.meta["num_warps"]
            # elements per program at a time: a chunk, a tile of rows (pipe: one row), or the stream
            # kernel's tile (it holds that and the next one in flight)
            elems = rec.get("chunk") or rec.get("tile") or rec.get("block_m", 1) * rec["block_n"]
            e_thread = elems / (32 * warps)
            occ = programs_per_sm(regs, warps, shared)
            esz = torch.finfo(dtype).bits // 8
            stream = rec.get("kernel") == "stream"
            held = elems * esz * (2 if op == "bwd" or stream else 1)
            phase = f"PHASE={bound.meta['PHASE']} " if "PHASE" in bound.meta else ""
            where = "shared" if bound.fn.is_gluon() and not stream else "regs"
            # decode sizes: M rows, the grid and how many times it fills the GPU at this occupancy
            shape = f"N={n:<6}" if m is None else f"{m}x{n}"
            waves = "" if m is None else f"grid {rec['grid']:4} ({rec['grid'] / (occ * SMS):.2f} of the GPU) "
            head = (f"{op:3} {str(dtype)[6:]:8} {shape:8} {rec['path']:5} {bound.fn.__name__:32} {phase}{waves}"
                    f"elems/program {elems:6} warps {warps:2} | regs {regs:3} stack {stack:3} shared "
                    f"{shared // 1024:3} KB | {occ:2} programs/SM, holds ({where}) {held // 1024:4} KB/program "
                    f"{occ * held // 1024:4} KB/SM | ")
            if bound.fn.is_gluon() and not stream:   # run-time loops over sub-tiles: no per-tile counts
                print(head + "instructions: n/a (run-time loops over sub-tiles)", flush=True)
                continue
            ops, looped = opcodes(sass)
            total, mufu = sum(ops.values()), ops["MUFU"]
            issue_gbps = 128 * e_thread / total * SMS * CLOCK_GHZ * bpe
            mufu_gbps = 16 * e_thread / mufu * SMS * CLOCK_GHZ * bpe if mufu else float("inf")
            star = "*" if looped else " "
            print(head + f"instr/thread{star}{total:5} ({total / e_thread:5.1f}/elem) "
                  f"MUFU {mufu / e_thread:4.2f}/elem | "
                  f"issue bound {issue_gbps:6.0f} GB/s ({100 * issue_gbps / COPY_GBPS:4.0f} %), "
                  f"MUFU bound {mufu_gbps:6.0f} GB/s ({100 * mufu_gbps / COPY_GBPS:4.0f} %)", flush=True)


if __name__ == "__main__":
    main()
