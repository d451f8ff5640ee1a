"""Probe: two designs for many long rows against the library's default path, torch.softmax and the copy
ceiling, one run, 1 GiB per tensor. Each variant is checked against torch first.

- ``cluster``: one thread-block cluster per row, chunks in registers, hardware cluster barrier
  (kernels/softmax_cluster.py; run b753976: 55-85 % of copy, below the smem coop kernel: SHAPES_CLUSTER).
- ``lag``: no waiting on the SM; program q reads chunk q (pass 1) and finishes chunk q - LAG from L2
  (kernels/softmax_lag.py).

    PYTHONPATH=src python benchmarks/long_rows_probe.py $OUT [cluster]
    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,\
        gpu__time_duration.sum python benchmarks/long_rows_probe.py $OUT ncu     # one launch of each, fp32 128K
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.bench.harness import copy_ceiling_gbps, environment
from onlinesoftmax.kernels.softmax_cluster import cluster_regs_layouts, softmax_cluster_regs_kernel
from onlinesoftmax.kernels.softmax_lag import softmax_lag_kernel

GIB = 1 << 30
SHAPES_CLUSTER = {   # (dtype, N) -> [(C, CHUNK, warps)]
    (torch.float32, 131072): [(16, 8192, 4), (16, 8192, 8), (16, 8192, 16), (8, 16384, 8), (8, 16384, 16)],
    (torch.float32, 262144): [(16, 16384, 8), (16, 16384, 16), (16, 16384, 32)],
    (torch.bfloat16, 131072): [(8, 16384, 4), (8, 16384, 8), (8, 16384, 16), (16, 8192, 4), (16, 8192, 8)],
    (torch.bfloat16, 262144): [(16, 16384, 8), (16, 16384, 16), (16, 16384, 4)],
    (torch.bfloat16, 32768): [(2, 16384, 8), (4, 8192, 4), (4, 8192, 8)],
}

# run d4b55d8 (probe-lag-d4b55d8.log): the first lag kernel, best fp32 76 %, bf16 67 %; ncu (ncu-lag-0d4e9b5.log):
# DRAM reads 1.16 GB of 1.07 with eviction hints (2.08 without), so pass 2 hits L2; 78 registers, 34 % warps active
W8 = [(4096, 4096, 8, 8, True), (4096, 4096, 8, 12, True), (4096, 4096, 4, 8, True), (4096, 4096, 4, 12, True),
      (8192, 4096, 8, 6, True), (8192, 4096, 8, 8, True), (8192, 2048, 4, 8, True), (16384, 4096, 8, 4, True)]
W16 = [(8192, 8192, 8, 8, True), (8192, 8192, 8, 12, True), (8192, 4096, 4, 8, True), (8192, 4096, 4, 12, True),
       (16384, 8192, 8, 6, True), (16384, 4096, 4, 8, True), (16384, 8192, 8, 4, True), (8192, 8192, 16, 8, True)]
SHAPES_LAG = {   # (dtype, N) -> [(CHUNK, SUB, warps, LAG in SMs, eviction hints)]
    (torch.float32, 131072): W8, (torch.float32, 262144): W8,
    (torch.bfloat16, 131072): W16, (torch.bfloat16, 262144): W16,
}


def lag_fn(chunk, sub, warps, lag_sms, hints, x):
    M, N = x.shape
    C = -(-N // chunk)
    Q = M * C
    lag = max(C, lag_sms * torch.cuda.get_device_properties(0).multi_processor_count)
    part = torch.empty(2, Q, device=x.device)
    arrive = torch.zeros(M, dtype=torch.int32, device=x.device)
    info = {}

    def run(x, y):
        info["k"] = softmax_lag_kernel[(Q + lag,)](
            x, y, part[0], part[1], arrive, N, 1, x.stride(0), 0, y.stride(0), 0, C, Q, lag, CHUNK=chunk, SUB=sub,
            C_POW2=1 << (C - 1).bit_length(), MODE=0, EVEN=N % chunk == 0, HINTS=hints, FAST=True, num_warps=warps)
        return y
    return run, info


def cluster_fn(C, chunk, warps, x):
    vec = 16 // x.element_size()
    L, R = cluster_regs_layouts(C, vec, warps)
    M, N = x.shape
    part = torch.empty(2, M * C, device=x.device)
    info = {}

    def run(x, y):
        k = softmax_cluster_regs_kernel[(M,)](x, y, part[0], part[1], N, x.stride(0), y.stride(0), CHUNK=chunk, C=C,
                                              MODE=0, EVEN=N == C * chunk, L=L, R=R, num_warps=warps, num_ctas=C)
        info["k"] = k
        return y
    return run, info


def profile_once():
    """One launch each (after a warm-up) of the default plan and three lag variants, for Nsight Compute."""
    x = (torch.randn(2048, 131072, device="cuda") * 3)
    y = torch.empty_like(x)
    fns = {"default": lambda x, y: oss.softmax(x, -1)}
    for v in [(8192, 4096, 8, 4, True), (8192, 4096, 8, 4, False), (4096, 4096, 8, 4, True)]:
        fns[f"lag {v}"] = lag_fn(*v, x)[0]
    for fn in fns.values():
        fn(x, y)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in fns.items():
        fn(x, y)
        torch.cuda.synchronize()
        print("profiled:", name, flush=True)
    torch.cuda.cudart().cudaProfilerStop()


def main(out, which="lag"):
    if which == "ncu":
        return profile_once()
    env = environment()
    ceiling = copy_ceiling_gbps(torch.device("cuda"))
    print(f"{env['device']}  copy ceiling {ceiling:.0f} GB/s", flush=True)
    rows = []
    shapes = SHAPES_CLUSTER if which == "cluster" else SHAPES_LAG
    for (dtype, n), variants in shapes.items():
        m = GIB // (n * torch.finfo(dtype).bits // 8)
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        y = torch.full_like(x, float("nan"))
        ref = torch.softmax(x.float(), -1)
        gb = 2 * x.numel() * x.element_size() / 1e9
        cands = [("torch.softmax", lambda x, y: torch.softmax(x, -1)),
                 ("onlinesoftmax", lambda x, y: oss.softmax(x, -1))]
        for v in variants:
            if which == "cluster":
                fn, info = cluster_fn(*v, x)
                cands.append((f"cluster C={v[0]} chunk={v[1]} w={v[2]}", fn, info))
            else:
                fn, info = lag_fn(*v, x)
                cands.append((f"lag chunk={v[0]} sub={v[1]} w={v[2]} lag={v[3]}xSM{'' if v[4] else ' nohint'}",
                              fn, info))
        for cand in cands:
            name, fn = cand[0], cand[1]
            try:
                y.fill_(float("nan"))
                out_ = fn(x, y)
                torch.cuda.synchronize()
                err = (out_.float() - ref).abs().max().item()
                tol = 1e-5 if dtype == torch.float32 else 8e-3
                ok = err <= tol
                ms = do_bench(lambda fn=fn, x=x, y=y: fn(x, y), warmup=25, rep=100, return_mode="median")
                extra = ""
                if len(cand) > 2:
                    k = cand[2]["k"]
                    ptx = k.asm["ptx"]
                    extra = f" regs {k.n_regs} v4 stores {ptx.count('st.global.v4')} all st {ptx.count('st.global')}"
                gbs = gb / (ms * 1e-3)
                print(f"{str(dtype)[6:]:9} {m:>5}x{n:<7} {name:34} {ms*1e3:8.1f} us {gbs:7.0f} GB/s "
                      f"{100*gbs/ceiling:6.1f} %"
                      f"  err {err:.1e} {'ok' if ok else 'WRONG'}{extra}", flush=True)
                rows.append(dict(dtype=str(dtype), m=m, n=n, impl=name, us=ms * 1e3, gbps=gbs,
                                 pct=100 * gbs / ceiling, err=err, ok=ok, extra=extra))
            except Exception as e:  # a variant that fails to compile or launch is reported, not fatal
                print(f"{str(dtype)[6:]:9} {m:>5}x{n:<7} {name:34} FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
                rows.append(dict(dtype=str(dtype), m=m, n=n, impl=name, failed=str(e)[:300]))
        del x, y, ref
        torch.cuda.empty_cache()
    json.dump(dict(env=env, ceiling=ceiling, rows=rows), open(f"{out}/probe-{which}.json", "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
