"""Where a decode-sized softmax spends its time: the coop kernel taken apart step by step, each step a CUDA graph
of one launch, timed beside a copy of x (torch's, and one with our grid), torch.softmax and our default call.

The probe kernel is the register coop kernel (`softmax_chunks_kernel`, PHASE 0) built from the same building
blocks, cut after each of its steps:

    STEPS 0  read x, write it back (a copy with the coop grid: chunk, warps, programs)
    STEPS 1  + (m_c, d_c) published, y from the chunk's own state (no barrier; y is not the softmax)
    STEPS 2  + the row barrier (y still from the chunk's own state)
    STEPS 3  + (m, d) = ⊕ of the row's states: the whole kernel (checked against torch)
    STEPS 4  the whole kernel with steps 2-3 as `_merge_by_last` (one round trip fewer for the waiting programs)

with the barrier's generation read at the barrier (HOIST 0) or right after the chunk's loads are issued (HOIST 1,
`_row_generation`, as the register kernels do since this probe's first run), and the last arrival resetting ARRIVE
before releasing GEN (ORDER 0, `_row_barrier`) or after (ORDER 1). "default" is our call as it ships,
"default, old" the module saved as `kernels/softmax_old.py` where there is one (see ab_kernels.py). Each graph is
timed with two L2 flushes before every replay (flush_probe.timed: CUDA events, median of 60): zeroing 256 MB
(do_bench's; it leaves L2 full of dirty lines) and reading 256 MB (L2 left clean).

    PYTHONPATH=$PWD/src:$PWD/benchmarks python benchmarks/decode_probe.py [OUT_DIR]
"""

from __future__ import annotations

import importlib
import json
import sys

import torch
import triton
import triton.language as tl
from flush_probe import timed

from onlinesoftmax.bench.harness import environment
from onlinesoftmax.kernels import _launch
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

SHAPES = ((1, 128256), (1, 262144), (8, 128256), (8, 151936), (32, 128256), (32, 262144))


@triton.jit
def _barrier_release_first(ARRIVE, GEN, row, C, gen):
    """_row_barrier with the last arrival's two steps swapped: GEN released first, ARRIVE reset after (ORDER 1)."""
    if tl.atomic_add(ARRIVE + row, 1, sem="acq_rel") == C - 1:
        tl.atomic_add(GEN + row, 1, sem="release")
        tl.atomic_xchg(ARRIVE + row, 0, sem="relaxed")
    else:
        while tl.atomic_add(GEN + row, 0, sem="acquire") == gen:
            pass


@triton.jit
def _merge_by_last(ARRIVE, GEN, RES, PART_M, PART_D, row, C, gen, k):
    """Steps 2-3 with one L2 round trip fewer for the waiting programs (STEPS 4): the row's last arrival merges
    the C published states and stores (m, d), packed in one 64-bit word, in the row's slot for this generation
    (gen & 1); the others poll that slot until it is no longer 0 (a valid state never packs to 0: m = +0 means
    d >= 1). The last arrival also empties the slot the next launch will use, resets ARRIVE and bumps GEN."""
    slot = RES + row * 2 + (gen & 1)
    if tl.atomic_add(ARRIVE + row, 1, sem="acq_rel") == C - 1:
        m, d = K._merge_row(PART_M, PART_D, row, C, k)
        tl.atomic_xchg(RES + row * 2 + ((gen + 1) & 1), 0, sem="relaxed")
        w = (m.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (d.to(tl.int32, bitcast=True).to(tl.int64)
                                                                   & 0xFFFFFFFF)
        tl.atomic_xchg(slot, w, sem="release")
        tl.atomic_xchg(ARRIVE + row, 0, sem="relaxed")
        tl.atomic_add(GEN + row, 1, sem="relaxed")
    else:
        w = tl.atomic_add(slot, 0, sem="acquire")
        while w == 0:
            w = tl.atomic_add(slot, 0, sem="acquire")
        m = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        d = w.to(tl.int32).to(tl.float32, bitcast=True)
    return m, d


@triton.jit
def probe_kernel(X, Y, PART_M, PART_D, ARRIVE, GEN, RES, N, C, CHUNK: tl.constexpr, C_POW2: tl.constexpr,
                 STEPS: tl.constexpr, HOIST: tl.constexpr, ORDER: tl.constexpr, FAST: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // C
    c = pid % C
    cols = c * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    off = row.to(tl.int64) * N + cols
    x = tl.load(X + off, mask=mask, other=float("-inf")).to(tl.float32)          # read x
    if STEPS == 0:
        tl.store(Y + off, x.to(Y.dtype.element_ty), mask=mask)
    else:
        if HOIST:
            gen = K._row_generation(GEN, row)
        m_c, d_c, e = K._state(x, 0, FAST)                                      # 1. (m_c, d_c), published
        tl.store(PART_M + pid, m_c)
        tl.store(PART_D + pid, d_c)
        tl.debug_barrier()
        m = m_c
        d = d_c
        if STEPS == 4:                                                          # 2-3. merged by the last
            m, d = _merge_by_last(ARRIVE, GEN, RES, PART_M, PART_D, row, C, gen, tl.arange(0, C_POW2))
        elif STEPS >= 2:                                                        # 2. the row barrier
            if not HOIST:
                gen = K._row_generation(GEN, row)
            if ORDER:
                _barrier_release_first(ARRIVE, GEN, row, C, gen)
            else:
                K._row_barrier(ARRIVE, GEN, row, C, gen)
        if STEPS == 3:
            m, d = K._merge_row(PART_M, PART_D, row, C, tl.arange(0, C_POW2))    # 3. (m, d) = ⊕_c (m_c, d_c)
        tl.store(Y + off, K._normalise(x, e, m_c, m, d, 0).to(Y.dtype.element_ty), mask=mask)   # write y


def graphed(fn):
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def probe_launch(x, y, chunk, steps, hoist=0, order=0, warps=None):
    m, n = x.shape
    C = triton.cdiv(n, chunk)
    part = torch.empty(2, m * C, device="cuda")
    bar = torch.zeros(2, m, dtype=torch.int32, device="cuda")
    res = torch.zeros(m, 2, dtype=torch.int64, device="cuda")
    fast = K._exp_level(True, K.SOFTMAX, y.dtype)
    warps = warps or K._warps(chunk, 32)

    def run():
        probe_kernel[(m * C,)](x, y, part[0], part[1], bar[0], bar[1], res, n, C, CHUNK=chunk,
                               C_POW2=triton.next_power_of_2(C), STEPS=steps, HOIST=hoist, ORDER=order, FAST=fast,
                               num_warps=warps)
    return run


def old_module():
    try:
        K_old = importlib.import_module("onlinesoftmax.kernels.softmax_old")
    except ImportError:
        return None
    # its own workspace, every view zeroed as that version's stream_scratch did
    K_old.stream_scratch = lambda tag, device, layout, **_: _launch.stream_scratch(("old", tag), device, layout)
    return K_old


def main(out_dir):
    env = environment()
    sms = K.sm_count(torch.device("cuda"))
    K_old = old_module()
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}  (graph replay, µs: flush by zeroing "
          f"/ by reading 256 MB)")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
            ref = torch.softmax(x.float(), -1)
            y = torch.empty_like(x)
            chunk, C = K._chunking(m, n, sms, backward=False)
            geo = row_geometry([x, y], 1)[3]
            variants = {"torch.softmax": lambda: torch.softmax(x, -1), "copy of x (torch)": lambda: y.copy_(x),
                        "default": lambda: K.forward(x, y, *geo, m, n, 1, K.SOFTMAX)}
            if K_old is not None:
                variants["default, old"] = lambda: K_old.forward(x, y, *geo, m, n, 1, K.SOFTMAX)
            variants["copy, coop grid"] = probe_launch(x, y, chunk, 0)
            variants["+ state, no barrier"] = probe_launch(x, y, chunk, 1)
            for steps, name in ((2, "+ barrier"), (3, "+ merge (whole kernel)")):
                variants[name] = probe_launch(x, y, chunk, steps)
                variants[f"{name}, gen hoisted"] = probe_launch(x, y, chunk, steps, 1)
                variants[f"{name}, gen hoisted, release first"] = probe_launch(x, y, chunk, steps, 1, 1)
            variants["whole kernel, merged by the last arrival"] = probe_launch(x, y, chunk, 4, 1)
            for c, w in ((chunk, 1), (chunk, 2), (chunk // 2, 1), (chunk // 2, 2)):
                if triton.cdiv(n, c) <= K.COOP_MAX_CHUNKS:
                    variants[f"whole kernel, gen hoisted, chunk {c}, {w} warps"] = probe_launch(x, y, c, 3, 1, 0, w)
                    variants[f"merged by the last arrival, chunk {c}, {w} warps"] = probe_launch(x, y, c, 4, 1, 0, w)
            for c in (chunk // 2, chunk * 2):
                if triton.cdiv(n, c) <= K.COOP_MAX_CHUNKS:
                    variants[f"whole kernel, gen hoisted, chunk {c}"] = probe_launch(x, y, c, 3, 1)
            for name, fn in variants.items():
                y.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                checked = name.startswith(("whole", "+ merge", "default", "merged"))
                err = (y.float() - ref).abs().max().item() if checked else float("nan")
                if checked and not err < 1e-2:
                    print(f"  {name}: WRONG, max error {err}")
                g = graphed(fn)
                zero, read = timed(g, "zero"), timed(g, "read")
                if checked:                     # again after some 250 replays (the barrier's state cycles)
                    y.fill_(float("nan"))
                    g()
                    torch.cuda.synchronize()
                    err = max(err, (y.float() - ref).abs().max().item())
                    if not err < 1e-2:
                        print(f"  {name}: WRONG after the timed replays, max error {err}")
                rows.append(dict(dtype=str(dtype), m=m, n=n, default_chunk=chunk, variant=name, zero_us=zero,
                                 read_us=read, max_err=err))
                print(f"{str(dtype)[6:]:9} {m:>3}x{n:<7} chunk {chunk:>5} {name:52} {zero:7.2f} / {read:6.2f} µs")
    with open(f"{out_dir}/decode_probe.json", "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
