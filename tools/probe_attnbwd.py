"""Probe of the attention backward's variants (BackwardPlan knobs) on the H200, beside SDPA's cuDNN and flash.

    PYTHONPATH=src python tools/probe_attnbwd.py --out DIR          # on the GPU machine, < 150 s
    PYTHONPATH=src python tools/probe_attnbwd.py --compile-only     # here, no GPU: sm_90a registers / spills

Variants: the split (Δ, dK/dV per key block, dQ per query block: 7 matmuls) at several tile shapes, and
``dq_atomic`` (dQ added by the dK/dV kernel with fp32 atomics, then cast: 5 matmuls). Steps on the device:
1. compile every variant in worker processes (one per variant, at B = 1, S = 1024: the same Triton
   specialisation as the timed shapes, so the timed calls find every kernel in Triton's disk cache);
2. check each variant at (1, H, Hkv, 1024, D) against an fp32 torch backward, outputs poisoned with NaN first;
3. at the issue's shapes: check against the default kernel, time with ``do_bench`` medians (it clears the L2
   before every repetition; every call also reads > 120 MB), beside cuDNN / flash backwards
   (``autograd.grad`` of SDPA); per-kernel times (Δ, dK/dV, dQ or cast) at the first two shapes.
TFLOP/s = 2.5 · 4·B·H·S²·D / t, halved when causal. Writes DIR/probe_attnbwd.json, prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

T0 = time.time()
BUDGET_S = 138          # stop timing past this (the whole run must end within 150 s)

# name -> backward knobs; the split's fields: dK/dV (block_m queries per step, block_n keys, warps, stages),
# dQ (block_m_dq queries, block_n_dq keys per step, warps, stages)
def split(bm, bn, w, s, bmq, bnq, wq, sq):
    return dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s, block_m_dq=bmq, block_n_dq=bnq,
                num_warps_dq=wq, num_stages_dq=sq)


def atomic(bm, bn, w, s):
    return dict(dq_atomic=True, block_m=bm, block_n=bn, num_warps=w, num_stages=s)


VARIANTS = {
    "default": {},
    "split 64x64w4s2 | 128x64w8s2": split(64, 64, 4, 2, 128, 64, 8, 2),
    "split 64x128w8s2 | 128x64w8s2": split(64, 128, 8, 2, 128, 64, 8, 2),
    "split 32x128w8s2 | 128x64w8s2": split(32, 128, 8, 2, 128, 64, 8, 2),
    "split 64x128w8s3 | 128x64w8s3": split(64, 128, 8, 3, 128, 64, 8, 3),
    "split 64x128w8s2 | 128x128w8s2": split(64, 128, 8, 2, 128, 128, 8, 2),
    "atomic 64x128w8s2": atomic(64, 128, 8, 2),
    "atomic 32x128w8s2": atomic(32, 128, 8, 2),
    "atomic 64x128w8s3": atomic(64, 128, 8, 3),
    "atomic 32x128w8s3": atomic(32, 128, 8, 3),
}

# (B, H, Hkv, S, D, causal): the shapes; the first two also get per-kernel times
SHAPES = [(4, 32, 32, 4096, 128, False), (4, 32, 32, 4096, 128, True),
          (1, 32, 32, 16384, 128, False), (1, 32, 32, 16384, 128, True),
          (2, 32, 32, 8192, 128, False), (2, 32, 32, 8192, 128, True),
          (16, 32, 32, 1024, 128, False), (16, 32, 32, 1024, 128, True),
          (8, 16, 16, 2048, 64, False), (8, 16, 16, 2048, 64, True),
          (4, 32, 8, 4096, 128, True)]
CHECK_S = 1024


def groups():
    """One small shape per Triton specialisation of SHAPES: (1, H, Hkv, CHECK_S, D, causal)."""
    return sorted({(1, H, Hkv, CHECK_S, D, c) for _, H, Hkv, _, D, c in SHAPES})


def problem(B, H, Hkv, S, D, causal, dtype="bfloat16"):
    from onlinesoftmax.attention.plan import Problem
    return Problem(B, H, Hkv, S, S, D, dtype, causal, (-1, 0) if causal else (-1, -1))


def bwd_plan(p, knobs):
    from onlinesoftmax.attention.plan import Knobs, plan_backward
    from onlinesoftmax.target import H200
    return plan_backward(p, H200, Knobs(backward=knobs))


def inputs(B, H, Hkv, S, D, device, seed=0):
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, S, D, device=device, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, S, D, device=device, dtype=torch.bfloat16, generator=g)
    do = torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16, generator=g)
    return q, k, v, do


def backward(knobs, q, k, v, do, o, lse, causal):
    from onlinesoftmax.attention import api
    B, H, S, D = q.shape
    p = problem(B, H, k.shape[1], S, D, causal)
    return api._backward_triton(do, None, q, k, v, o, lse, p, bwd_plan(p, knobs), D ** -0.5, 0.0)


def forward(q, k, v, causal):
    """(o, lse) by the public call (whatever forward the plan picks: only the backward is probed)."""
    import onlinesoftmax as oss
    return oss.attention(q, k, v, causal=causal, return_lse=True, backend="triton")


def err_head(e: BaseException) -> str:
    lines = [ln for ln in traceback.format_exception_only(type(e), e)[-1].splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:300]


# ---- compile-only (no GPU): sm_90a resources of every variant's kernels ----------------------------------------
def compile_only(only: str | None):
    os.environ.pop("TRITON_INTERPRET", None)
    import re
    import subprocess
    import tempfile

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api

    ptr = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32"}
    nvbin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    recorded = []
    launch.BoundKernel.__call__ = lambda self, args, check, device: recorded.append((self.fn, args, self.meta))
    seen = {}
    for name, knobs in VARIANTS.items():
        if only and only not in name:
            continue
        for B, H, Hkv, S, D, causal in groups():
            q, do = (torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
            k, v = (torch.empty(B, Hkv, S, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
            o, lse = torch.empty_like(q), q.new_empty((B, H, S), dtype=torch.float32)
            recorded.clear()
            api._caches()
            try:
                backward(knobs, q, k, v, do, o, lse, causal)
            except Exception as e:
                print(f"{name:34} D={D} causal={causal!s:5}: {err_head(e)}", flush=True)
                continue
            for fn, args, meta in recorded:
                sig, const, attrs = {}, {}, {}
                runtime = [p for p in fn.params if not p.is_constexpr]
                for p, a in zip(runtime, args):
                    i = fn.arg_names.index(p.name)
                    if isinstance(a, torch.Tensor):
                        sig[p.name] = ptr[a.dtype]
                        attrs[(i,)] = [["tt.divisibility", 16]]
                    elif isinstance(a, float):
                        sig[p.name] = "fp32"
                    elif a == 1:
                        sig[p.name], const[p.name] = "constexpr", 1
                    else:
                        sig[p.name] = "i32" if abs(a) < 2**31 else "i64"
                        if a % 16 == 0:
                            attrs[(i,)] = [["tt.divisibility", 16]]
                for p in fn.params:
                    if p.is_constexpr:
                        sig[p.name], const[p.name] = "constexpr", meta[p.name]
                sig = {n: sig[n] for n in fn.arg_names}
                opts = {k_: meta[k_] for k_ in ("num_warps", "num_stages") if k_ in meta}
                key = (fn.__name__, json.dumps(sorted((k_, str(v_)) for k_, v_ in const.items())), str(attrs),
                       str(opts))
                if key in seen:
                    continue
                t = time.time()
                try:
                    c = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                                       options=opts)
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                        f.write(c.asm["cubin"])
                        f.flush()
                        res = subprocess.run([os.path.join(nvbin, "cuobjdump"), "-res-usage", f.name],
                                             capture_output=True, text=True, check=True).stdout
                    regs, stack = (int(g) for g in re.search(r"REG:(\d+).*?STACK:(\d+)", res).groups())
                    ptx = c.asm["ptx"]
                    red = sorted(set(re.findall(r"\b(?:red|atom)\.[\w.]+", ptx)))
                    wg = len(re.findall(r"wgmma\.mma_async", ptx))
                    seen[key] = (f"regs {regs:3} stack {stack:4} smem {c.metadata.shared // 1024:3} KB wgmma {wg:3}"
                                 f" {time.time() - t:4.1f}s {' '.join(red)}")
                except Exception as e:
                    seen[key] = f"FAILED {err_head(e)}"
                print(f"{name:34} D={D:3} causal={causal!s:5} {fn.__name__:30} {seen[key]}", flush=True)


# ---- the device -----------------------------------------------------------------------------------------------
def _warm(job):
    """Worker: run one variant's backward (or the default forward) at every group's small shape: compiles only."""
    import torch
    name, knobs = job
    t0 = time.time()
    errors = []
    for B, H, Hkv, S, D, causal in groups():
        try:
            q, k, v, do = inputs(B, H, Hkv, S, D, "cuda")
            if name == "forward":
                forward(q, k, v, causal)
            else:
                o = torch.randn_like(q)
                lse = torch.randn(B, H, S, device="cuda", dtype=torch.float32)
                backward(knobs, q, k, v, do, o, lse, causal)
            torch.cuda.synchronize()
        except Exception as e:
            errors.append(f"D={D} causal={causal}: {err_head(e)}")
    return name, time.time() - t0, errors


def ref_backward(q, k, v, do, causal):
    """fp32 torch backward from the bf16 inputs (GQA by repeating k / v; causal top-left = bottom-right, Sq = Sk)."""
    import torch
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = (qf @ kf.repeat_interleave(g, 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    o = torch.softmax(s, -1) @ vf.repeat_interleave(g, 1)
    return o.to(q.dtype), torch.autograd.grad(o, (qf, kf, vf), do.float())


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def poisoned(fn, shapes):
    """fn() after NaN-filled blocks of the outputs' sizes went back to the caching allocator (its torch.empty
    outputs reuse them); raises if any output has a NaN / inf."""
    import torch
    junk = [torch.full(s, float("nan"), device="cuda", dtype=dt) for s, dt in shapes]
    del junk
    out = fn()
    for name, t in zip(("dq", "dk", "dv"), out):
        if not torch.isfinite(t).all():
            raise RuntimeError(f"{name} has NaN / inf (unwritten or wrong)")
    return out


def device_run(out_dir):
    import multiprocessing as mp

    import torch
    from triton.testing import do_bench

    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api

    dev = torch.device("cuda")
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, variants=VARIANTS, warm={},
                  check={}, rows=[])
    import triton
    report["triton"] = triton.__version__

    # 1. compile in parallel
    jobs = [("forward", None)] + list(VARIANTS.items())
    ctx = mp.get_context("spawn")
    with ctx.Pool(min(len(jobs), max(1, (os.cpu_count() or 2) - 1))) as pool:
        res = pool.map_async(_warm, jobs)
        try:
            for name, secs, errors in res.get(timeout=95):
                report["warm"][name] = dict(s=round(secs, 1), errors=errors)
                print(f"warm {name:34} {secs:5.1f} s {'; '.join(errors)[:200]}", flush=True)
        except Exception as e:
            print(f"warm-up incomplete: {err_head(e)}", flush=True)
    print(f"[{time.time() - T0:5.1f} s] compiled", flush=True)

    # ceiling: the bf16 matmul rate
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    report["matmul_tflops"] = mm = 2 * 8192 ** 3 / (do_bench(lambda: a @ b, rep=100, return_mode="median")
                                                    * 1e-3) / 1e12
    a = b = None

    # 2. correctness at the small shapes against fp32 torch
    bad = set()
    for B, H, Hkv, S, D, causal in groups():
        q, k, v, do = inputs(B, H, Hkv, S, D, "cuda", seed=1 + D + causal)
        o_ref, g_ref = ref_backward(q, k, v, do, causal)
        o, lse = forward(q, k, v, causal)
        shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype), ((B, H, S, D), torch.float32)]
        for name, knobs in VARIANTS.items():
            key = f"{name} | H{H}/{Hkv} D{D} causal={causal}"
            try:
                g = poisoned(lambda: backward(knobs, q, k, v, do, o, lse, causal), shapes)
                errs = [rel(x, y) for x, y in zip(g, g_ref)]
                report["check"][key] = errs
                if max(errs) > 2e-2:
                    bad.add(name)
                    print(f"WRONG {key}: rel err dq/dk/dv {errs}", flush=True)
            except Exception as e:
                bad.add(name)
                report["check"][key] = err_head(e)
                print(f"FAILED {key}: {err_head(e)}", flush=True)
        q = k = v = do = o = lse = g_ref = None
    print(f"[{time.time() - T0:5.1f} s] checked; bad: {sorted(bad)}", flush=True)

    # 3. timings
    from torch.nn.attention import SDPBackend, sdpa_kernel
    peers = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for si, (B, H, Hkv, S, D, causal) in enumerate(SHAPES):
        if time.time() - T0 > BUDGET_S:
            print(f"out of time: shapes from {SHAPES[si]} not timed", flush=True)
            break
        fl = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
        q, k, v, do = inputs(B, H, Hkv, S, D, "cuda", seed=si)
        o, lse = forward(q, k, v, causal)
        base = None
        row = dict(shape=(B, H, Hkv, S, D), causal=causal, ms={}, tflops={}, err={}, kernels_ms={})
        for pname, be in peers.items():
            try:
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(be):
                    og = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                                                          enable_gqa=H != Hkv)
                f = lambda og=og, ins=(qg, kg, vg): torch.autograd.grad(og, ins, do, retain_graph=True)  # noqa: E731
                f()
                row["ms"][pname] = do_bench(f, rep=100, return_mode="median")
            except Exception as e:
                row["err"][pname] = err_head(e)
            og = qg = kg = vg = f = None
        for name, knobs in VARIANTS.items():
            if name in bad or time.time() - T0 > BUDGET_S:
                continue
            try:
                shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
                g = poisoned(lambda: backward(knobs, q, k, v, do, o, lse, causal), shapes)
                if base is None:
                    base = g
                else:
                    e = max(rel(x, y) for x, y in zip(g, base))
                    row["err"][name] = e
                    if e > 1e-2:
                        raise RuntimeError(f"differs from the default by {e:.2e}")
                g = None
                f = lambda knobs=knobs: backward(knobs, q, k, v, do, o, lse, causal)  # noqa: E731
                row["ms"][name] = do_bench(f, rep=100, return_mode="median")
                if si < 2:      # per kernel: record the launches of one call, then time each alone
                    calls = []
                    real = launch.BoundKernel.__call__

                    def rec(self, args, check, device, real=real):
                        calls.append((self, args, check, device))
                        return real(self, args, check, device)
                    launch.BoundKernel.__call__ = rec
                    try:
                        f()
                    finally:
                        launch.BoundKernel.__call__ = real
                    row["kernels_ms"][name] = [
                        (c[0].fn.__name__.replace("attention_bwd_", ""),
                         do_bench(lambda c=c: c[0](c[1], c[2], c[3]), rep=40, return_mode="median"))
                        for c in calls]
            except Exception as e:
                row["err"][name] = err_head(e)
                print(f"FAILED {name} at {row['shape']} causal={causal}: {err_head(e)}", flush=True)
        row["tflops"] = {n: fl / ms / 1e9 for n, ms in row["ms"].items()}
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row['shape']} causal={causal}: "
              + " ".join(f"{n.split(' ')[0]}={t:.0f}" for n, t in row["tflops"].items()), flush=True)
        q = k = v = do = o = lse = base = None
        torch.cuda.empty_cache()
    api._caches()

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe_attnbwd.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    table(report, mm)


def table(report, mm):
    names = list(VARIANTS)
    print(f"\n== attention backward, bf16, TFLOP/s (2.5x fwd flops, causal halved); bf16 matmul {mm:.0f}; "
          f"{report['device']}, torch {report['torch']}, triton {report['triton']}")
    print("variants: " + "; ".join(f"v{i}={n}" for i, n in enumerate(names)))
    head = f"{'shape':22} {'cudnn':>6} {'flash':>6} " + " ".join(f"{'v' + str(i):>6}" for i in range(len(names)))
    print(head + "  best/cudnn")
    for r in report["rows"]:
        B, H, Hkv, S, D = r["shape"]
        t = r["tflops"]
        lab = f"{B},{H}/{Hkv},{S},{D}{' c' if r['causal'] else ''}"
        cells = [f"{t[n]:6.0f}" if n in t else f"{'x':>6}" for n in ["cudnn", "flash"] + names]
        ours = [n for n in names if n in t]
        best = max(ours, key=t.get) if ours else None
        ratio = f"{t[best] / t['cudnn']:.2f} (v{names.index(best)})" if best and "cudnn" in t else "-"
        print(f"{lab:22} " + " ".join(cells) + f"  {ratio}")
    for r in report["rows"]:
        if r["kernels_ms"]:
            print(f"per kernel ms at {r['shape']} causal={r['causal']}:")
            for n, ks in r["kernels_ms"].items():
                print(f"  v{names.index(n)} " + " + ".join(f"{k} {ms:.3f}" for k, ms in ks)
                      + f" = {sum(ms for _, ms in ks):.3f} (whole {r['ms'][n]:.3f})")
    errs = {k: v for r in report["rows"] for k, v in r["err"].items() if isinstance(v, str)}
    for k, v in list(errs.items())[:8]:
        print(f"error {k}: {v}")
    for k, v in report["check"].items():
        if isinstance(v, str) or max(v) > 2e-2:
            print(f"check {k}: {v}")
    worst = max((max(v) for v in report["check"].values() if not isinstance(v, str)), default=float("nan"))
    print(f"worst rel err vs fp32 torch at S={CHECK_S} over passing variants: {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--compile-only", action="store_true", help="sm_90a compile of every variant, no GPU")
    ap.add_argument("--only", help="with --compile-only: the variants whose name contains this")
    ap.add_argument("--extra", help="with --compile-only: another variant, a JSON dict of backward knobs")
    a = ap.parse_args()
    if a.extra:
        VARIANTS["extra"] = json.loads(a.extra)
    if a.compile_only:
        compile_only(a.only)
    else:
        device_run(a.out)


if __name__ == "__main__":
    sys.exit(main())
