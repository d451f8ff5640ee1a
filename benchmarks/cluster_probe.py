"""Probe: long rows on thread-block clusters (kernels/softmax_cluster.py) against the library's default path,
torch.softmax and the copy ceiling, one run, 1 GiB per tensor. Each variant is checked against torch first.

    PYTHONPATH=src python benchmarks/cluster_probe.py $OUT
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.bench.harness import copy_ceiling_gbps, environment
from onlinesoftmax.kernels.softmax_cluster import cluster_regs_layouts, softmax_cluster_regs_kernel

GIB = 1 << 30
SHAPES = {   # (dtype, N) -> [(C, CHUNK, warps)]
    (torch.float32, 131072): [(16, 8192, 4), (16, 8192, 8), (16, 8192, 16), (8, 16384, 8), (8, 16384, 16)],
    (torch.float32, 262144): [(16, 16384, 8), (16, 16384, 16), (16, 16384, 32)],
    (torch.bfloat16, 131072): [(8, 16384, 4), (8, 16384, 8), (8, 16384, 16), (16, 8192, 4), (16, 8192, 8)],
    (torch.bfloat16, 262144): [(16, 16384, 8), (16, 16384, 16), (16, 16384, 4)],
    (torch.bfloat16, 32768): [(2, 16384, 8), (4, 8192, 4), (4, 8192, 8)],
}


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


def main(out):
    env = environment()
    ceiling = copy_ceiling_gbps(torch.device("cuda"))
    print(f"{env['device']}  copy ceiling {ceiling:.0f} GB/s", flush=True)
    rows = []
    for (dtype, n), variants in SHAPES.items():
        m = GIB // (n * torch.finfo(dtype).bits // 8)
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        y = torch.full_like(x, float("nan"))
        ref = torch.softmax(x.float(), -1)
        gb = 2 * x.numel() * x.element_size() / 1e9
        cands = [("torch.softmax", lambda x, y: torch.softmax(x, -1)),
                 ("onlinesoftmax", lambda x, y: oss.softmax(x, -1))]
        for C, chunk, w in variants:
            fn, info = cluster_fn(C, chunk, w, x)
            cands.append((f"cluster C={C} chunk={chunk} w={w}", fn, info))
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
    json.dump(dict(env=env, ceiling=ceiling, rows=rows), open(f"{out}/cluster_probe.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
