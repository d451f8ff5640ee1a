"""(experiment) The long-row coop kernel with its chunk brought into shared memory by TMA instead of cp.async.

One thread issues P bulk tensor copies per chunk (x viewed as rows of 256 elements; box [RP, 256]), each
signalling its own mbarrier, so the SM issues no per-thread copy instructions (fp32 16384-element chunk: 4096
cp.async per program otherwise). Steps as softmax_coop_smem_kernel (kernels/softmax_smem.py): 1. m_c as each part
lands, then d_c; 2. publish, row barrier, ⊕; 3. y = e^(x - m)/d written from registers (st.global) or, with
TMA_STORE, back into shared memory and out by bulk tensor stores. Softmax only, x and y of one dtype, N a multiple
of the chunk (no masks). Timed against our default and the cp.async kernel at the same chunk, torch and the copy,
1 GiB per tensor, one process.

    PYTHONPATH=$PWD/src python benchmarks/tma_probe.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
from functools import partial

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.bench.harness import copy_ceiling_gbps, environment
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.kernels.softmax import _alpha, _exp, _row_barrier, _shift
from onlinesoftmax.ops.softmax import row_geometry

GIB = 1 << 30
W = gl.constexpr(256)         # x is viewed as rows of W elements; a TMA box is [RP, W]


@gluon.jit
def tma_coop_kernel(x_desc, y_desc, X, Y, PART_M, PART_D, ARRIVE, GEN, C,
                    CHUNK: gl.constexpr, P: gl.constexpr, SR: gl.constexpr, VEC: gl.constexpr,
                    WARPS: gl.constexpr, C_POW2: gl.constexpr, TMA_STORE: gl.constexpr, FAST: gl.constexpr,
                    RR: gl.constexpr):
    """RR: the chunk's first RR rows of W are loaded into registers (ld.global), the rest by TMA."""
    RP: gl.constexpr = (CHUNK // W - RR) // P                # rows of W per part (one TMA box, one mbarrier)
    NB: gl.constexpr = RP * W * x_desc.dtype.primitive_bitwidth // 8
    L: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS, 1], [1, 0])
    pid = gl.program_id(0)
    row = pid // C
    r0 = pid * (CHUNK // W)                                  # N = C·CHUNK: chunk pid starts at pid·CHUNK
    smem = gl.allocate_shared_memory(x_desc.dtype, [P, RP, W], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [P, 1], mbarrier.MBarrierLayout())
    # 0. the whole chunk in flight: P bulk copies
    for p in gl.static_range(P):
        mbarrier.init(bars.index(p), count=1)
    for p in gl.static_range(P):
        mbarrier.expect(bars.index(p), NB)
        tma.async_copy_global_to_shared(x_desc, [r0 + RR + p * RP, 0], bars.index(p), smem.index(p))
    i = gl.arange(0, SR, layout=gl.SliceLayout(1, L))
    j = gl.arange(0, W, layout=gl.SliceLayout(0, L))
    if RR > 0:
        ir = gl.arange(0, RR, layout=gl.SliceLayout(1, L))
        off_r = (r0 + ir).to(gl.int64)[:, None] * W + j[None, :]
        xr = gl.load(X + off_r).to(gl.float32)
    # 1. m_c as each part lands, then d_c
    mv = gl.full([SR, W], float("-inf"), gl.float32, L)
    for p in gl.static_range(P):
        mbarrier.wait(bars.index(p), 0)
        for k in gl.static_range(RP // SR):
            mv = gl.maximum(mv, smem.index(p).slice(k * SR, SR).load(L).to(gl.float32))
    m_c = gl.max(gl.max(mv, axis=1), axis=0)
    if RR > 0:
        m_c = gl.maximum(m_c, gl.max(gl.max(xr, axis=1), axis=0))
    sh_c = _shift(m_c)
    dv = gl.zeros([SR, W], gl.float32, L)
    for p in gl.static_range(P):
        for k in gl.static_range(RP // SR):
            dv += _exp(smem.index(p).slice(k * SR, SR).load(L).to(gl.float32) - sh_c, True)
    d_c = gl.sum(gl.sum(dv, axis=1), axis=0)
    if RR > 0:
        d_c += gl.sum(gl.sum(_exp(xr - sh_c, True), axis=1), axis=0)
    # 2. publish, wait for the row's C chunks, ⊕
    gl.store(PART_M + pid, m_c)
    gl.store(PART_D + pid, d_c)
    gl.thread_barrier()
    _row_barrier(ARRIVE, GEN, row, C)
    kk = gl.arange(0, C_POW2, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    pm = gl.load(PART_M + row * C + kk, mask=kk < C, other=float("-inf"), volatile=True)
    pd = gl.load(PART_D + row * C + kk, mask=kk < C, other=0.0, volatile=True)
    m = gl.max(pm, axis=0)
    d = gl.sum(pd * _alpha(pm, m), axis=0)
    sh = _shift(m)
    c = gl.where(m == float("inf"), float("nan"), 1.0 / d)
    # 3. y
    for p in gl.static_range(P):
        for k in gl.static_range(RP // SR):
            y = (_exp(smem.index(p).slice(k * SR, SR).load(L).to(gl.float32) - sh, FAST) * c).to(x_desc.dtype)
            if TMA_STORE:
                smem.index(p).slice(k * SR, SR).store(y)
            else:
                off = (r0 + RR + p * RP + k * SR + i).to(gl.int64)[:, None] * W + j[None, :]
                gl.store(Y + off, y)
        if TMA_STORE:
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(y_desc, [r0 + RR + p * RP, 0], smem.index(p))
    if RR > 0:
        gl.store(Y + off_r, (_exp(xr - sh, FAST) * c).to(x_desc.dtype))
    if TMA_STORE:
        tma.store_wait(0)
    for p in gl.static_range(P):
        mbarrier.invalidate(bars.index(p))


def tma_softmax(chunk, warps, parts, sr, tma_store, rr=0):
    state = {}

    def run(x):
        m, n = x.shape
        C = n // chunk
        y = torch.empty_like(x)
        rp = (chunk // 256 - rr) // parts
        bits = x.element_size() * 8
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)
        x2, y2 = x.view(-1, 256), y.view(-1, 256)
        xd = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [rp, 256], layout)
        yd = TensorDescriptor(y2, list(y2.shape), list(y2.stride()), [rp, 256], layout)
        if m not in state:
            state[m] = (torch.empty(m * C, device=x.device), torch.empty(m * C, device=x.device),
                        torch.zeros(m, dtype=torch.int32, device=x.device),
                        torch.zeros(m, dtype=torch.int32, device=x.device))
        pm, pd, arrive, gen = state[m]
        tma_coop_kernel[(m * C,)](xd, yd, x, y, pm, pd, arrive, gen, C, CHUNK=chunk, P=parts, SR=sr,
                                  VEC=16 // x.element_size(), WARPS=warps, C_POW2=1 << (C - 1).bit_length(),
                                  TMA_STORE=tma_store, FAST=2 if x.dtype == torch.float32 else 1,
                                  RR=rr, num_warps=warps)
        return y
    return run


def smem_variant(cfg):
    plans = {}

    def run(x):
        out = torch.empty_like(x)
        m, n, inner, (gx, gy) = row_geometry([x, out], 1)
        key = (x.shape, x.dtype)
        if key not in plans:
            plans[key] = K._forward_plan(dict(cfg), x, out, gx, gy, m, n, inner, K.SOFTMAX,
                                         x.dtype == torch.bfloat16)
        K._run(plans[key], (x, out), x.device)
        return out
    return run


CASES = {                    # (dtype, N) -> (name, (chunk, warps, parts, sub-tile rows, TMA store, register rows))
    (torch.float32, 131072): [("tma 16384 w8 P4", (16384, 8, 4, 8, False)),
                              ("tma 16384 w8 RR16 P3", (16384, 8, 3, 8, False, 16)),
                              ("tma 16384 w8 RR16 P6", (16384, 8, 6, 8, False, 16)),
                              ("tma 16384 w4 RR16 P3", (16384, 4, 3, 4, False, 16)),
                              ("tma 16384 w4 RR16 P12", (16384, 4, 12, 4, False, 16))],
    (torch.float32, 262144): [("tma 16384 w8 P4", (16384, 8, 4, 8, False)),
                              ("tma 16384 w8 RR16 P3", (16384, 8, 3, 8, False, 16)),
                              ("tma 16384 w8 RR16 P6", (16384, 8, 6, 8, False, 16)),
                              ("tma 16384 w4 RR16 P3", (16384, 4, 3, 4, False, 16)),
                              ("tma 16384 w4 RR16 P12", (16384, 4, 12, 4, False, 16))],
}
SMEM_BASELINES = {           # element bytes -> the cp.async kernel at the same chunks, shared memory only
    4: [("smem 16384 w8 reg0", {"reg": 0}), ("smem 8192 w4 reg0", {"chunk": 8192, "num_warps": 4, "reg": 0})],
    2: [("smem 16384 w4 reg0 keep0", {"reg": 0, "keep_e": False}),
        ("smem 8192 w4 reg0 keep0", {"chunk": 8192, "num_warps": 4, "reg": 0, "keep_e": False})],
}


def main(out_dir=None):
    ceiling = copy_ceiling_gbps(torch.device("cuda"))
    env = environment()
    print(f"{env.get('device')} copy ceiling {ceiling:.0f} GB/s", flush=True)
    rows = []
    for (dtype, n), variants in CASES.items():
        m = GIB // (n * dtype.itemsize)
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        ref = torch.softmax(x.float(), -1)
        impls = [("torch", lambda t: torch.softmax(t, -1)), ("default", lambda t: oss.softmax(t, -1))]
        impls += [(name, smem_variant(cfg)) for name, cfg in SMEM_BASELINES[dtype.itemsize]]
        impls += [(name, tma_softmax(*args)) for name, args in variants]
        for name, fn in impls:
            try:
                y = fn(x)
                err = (y.float() - ref).abs().max().item()
                ok = err < (1e-5 if dtype == torch.float32 else 4e-3)
                us = do_bench(partial(fn, x), warmup=25, rep=150, return_mode="median") * 1e3
            except Exception as e:          # a probe: report and go on
                print(f"{str(dtype)[6:]:9} N={n:<7} {name:26} FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
                continue
            gbps = 2 * m * n * dtype.itemsize / us / 1e3
            rows.append(dict(dtype=str(dtype)[6:], n=n, impl=name, us=us, gbps=gbps, pct=gbps / ceiling * 100,
                             err=err, ok=ok))
            print(f"{str(dtype)[6:]:9} N={n:<7} {name:26} {us:8.1f} us {gbps:6.0f} GB/s {gbps / ceiling * 100:5.1f} %"
                  f"  err {err:.1e}{'' if ok else '  WRONG'}", flush=True)
        x = ref = None
    if out_dir:
        with open(f"{out_dir}/tma-probe.json", "w") as f:
            json.dump(dict(environment=env, copy_ceiling_gbps=ceiling, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
