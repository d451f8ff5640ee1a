"""Probe of the attention backward's knob-only tiles on the H200: the sm90 (Gluon) kernel at D = 256 (SPLIT_D),
retuned tl.dot tiles at D = 256, more ring slots and 128 query rows per step at D = 64; beside the current default
and SDPA's cuDNN and flash backwards.

    PYTHONPATH=src python tools/probe_attnbwd3.py --out DIR          # on the GPU machine, < 150 s
    PYTHONPATH=src python tools/probe_attnbwd3.py --compile-only     # here, no GPU: every launch's sm_90a
                                                                     # registers / stack / shared memory

Steps:
1. compile and run every variant once in its own worker process (all at once; a variant whose worker fails or
   does not report within the deadline, a hang, is dropped), at the check shapes below, so that the main process
   finds every kernel in Triton's disk cache;
2. check each variant against an fp32 torch backward on fresh random inputs, outputs poisoned with NaN first:
   causal and not, GQA 16 / 4, a window, Sq != Sk and ragged lengths, packed sequences with empty ones (causal;
   a window) at each head dim the variant runs; a variant that fails is not timed;
3. at the goal shapes: the variant must agree with the default (rel. err < 1e-2), then ``do_bench`` medians (the
   L2 cleared before every repetition; each call reads > 60 MB).
TFLOP/s = 2.5 · 4·B·H·S²·D / t, halved when causal. Writes DIR/probe_attnbwd3.json, prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from probe_util import err_line, forward, inputs, poisoned, ref_backward, rel_norm

T0 = time.time()
BUDGET_S = 135          # stop timing past this (the whole run must end within 150 s)

# name -> (BackwardPlan knobs, the head dims it runs at); "default" is whatever the plan picks today
VARIANTS = {
    "default": ({}, (64, 256)),
    # D = 256, Gluon: 64 keys per program, S / dP split by keys and dK / dV / dQ by columns between the warpgroups
    "sm90": ({"kernel": "sm90"}, (256,)),
    # D = 256, tl.dot retunes without spills at sm_90a (today: dK/dV 32 x 64, 4 warps, 1 stage: a 1368-byte stack
    # frame; dQ 64 x 32, 4 warps, 1 stage: 360 bytes)
    "tl 32x64w8": ({"kernel": "triton", "block_m": 32, "block_n": 64, "num_warps": 8, "num_stages": 2,
                    "block_m_dq": 64, "block_n_dq": 64, "num_warps_dq": 8, "num_stages_dq": 2}, (256,)),
    "tl 16x64w8": ({"kernel": "triton", "block_m": 16, "block_n": 64, "num_warps": 8, "num_stages": 2,
                    "block_m_dq": 128, "block_n_dq": 32, "num_warps_dq": 8, "num_stages_dq": 2}, (256,)),
    # D = 64, Gluon: ring slots (default 2), 128 query rows per step (default 64)
    "sm90 s3": ({"num_stages": 3}, (64,)),
    "sm90 s4": ({"num_stages": 4}, (64,)),
    "sm90 m128": ({"block_m": 128}, (64,)),
    "sm90 m128 s3 atom": ({"block_m": 128, "num_stages": 3, "dq_tma": False}, (64,)),
}

# (B, H, Hkv, S, D, causal)
SHAPES = [(2, 16, 16, 4096, 256, False), (2, 16, 16, 4096, 256, True),
          (8, 16, 16, 2048, 64, False), (8, 16, 16, 2048, 64, True),
          (4, 32, 32, 4096, 64, False)]
# (B, H, Hkv, Sq, Sk, causal, window) at each D: square, GQA 4 with Sq < Sk / Sq > Sk (odd sizes), a window
CHECKS = [(1, 16, 16, 1024, 1024, False, None), (1, 16, 16, 1024, 1024, True, None),
          (1, 16, 4, 777, 1500, True, None), (1, 16, 4, 1500, 777, False, None),
          (1, 8, 2, 1000, 1000, False, (200, 30))]
VARLEN_LENS = [300, 0, 1000, 17, 1, 1500, 64]      # packed sequences: empty, tiny, ragged
VARLEN_CASES = [(8, 2, dict(causal=True)), (8, 8, dict(window=(200, 10)))]    # (H, Hkv, options)


def runs(name, D):
    return D in VARIANTS[name][1]


def problem(B, H, Hkv, Sq, Sk, D, causal, window=None, varlen=False):
    from onlinesoftmax.attention.plan import Problem
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return Problem(B, H, Hkv, Sq, Sk, D, "bfloat16", causal, (left, right), varlen=varlen, tma=True)


def bwd_plan(p, name):
    from onlinesoftmax.attention.plan import Knobs, plan_backward
    from onlinesoftmax.target import H200
    knobs = dict(VARIANTS[name][0])
    if name.startswith("sm90"):
        knobs.setdefault("kernel", "sm90")
    return plan_backward(p, H200, Knobs(backward=knobs))


def backward(name, q, k, v, do, o, lse, causal, window=None):
    from onlinesoftmax.attention import api
    B, H, Sq, D = q.shape
    p = problem(B, H, k.shape[1], Sq, k.shape[2], D, causal, window)
    return api._backward_triton(do, None, q, k, v, o, lse, p, bwd_plan(p, name), D ** -0.5, 0.0)


def varlen_case(name, H, Hkv, D, kw, seed):
    """(got, want) gradients on packed sequences: the variant's backward vs fp32 torch per sequence."""
    import torch

    import onlinesoftmax as oss
    from onlinesoftmax.attention import api
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(VARLEN_LENS)
    cu = torch.tensor([0] + torch.tensor(VARLEN_LENS).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    S = max(VARLEN_LENS)
    o, lse = oss.attention_varlen(q, k, v, cu, cu, S, S, return_lse=True, backend="triton", **kw)
    causal = kw.get("causal", False)
    p = problem(len(VARLEN_LENS), H, Hkv, S, S, D, causal, kw.get("window"), varlen=True)
    shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
    got = poisoned(lambda: api._backward_triton(do, None, q, k, v, o, lse, p, bwd_plan(p, name), D ** -0.5, 0.0,
                                                (cu, cu)), shapes)
    want = [torch.zeros(t.shape, dtype=torch.float32, device="cuda") for t in (q, k, v)]
    for b, n in enumerate(VARLEN_LENS):
        if n == 0:
            continue
        s0 = int(cu[b])
        sl = slice(s0, s0 + n)
        qs, ks, vs, ds = (t[sl].transpose(0, 1).unsqueeze(0) for t in (q, k, v, do))
        for w, gi in zip(want, ref_backward(qs, ks, vs, ds, causal, kw.get("window"))):
            w[sl] = gi[0].transpose(0, 1)
    return got, want


# ---- compile-only (no GPU): sm_90a resources of every variant's launches, from the api's own arguments ------------
def compile_only():
    os.environ.pop("TRITON_INTERPRET", None)
    import re
    import subprocess
    import tempfile

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api

    ptr = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32"}
    nvbin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    recorded = []
    launch.BoundKernel.__call__ = lambda self, args, check, device: recorded.append((self.fn, args, self.meta))
    api._tma_ok = lambda *ts: True                       # meta tensors have no data pointer
    api._ensure_allocator = lambda: None
    seen = set()
    for name in VARIANTS:
        for B, H, Hkv, S, D, causal in sorted({(1, H, Hkv, 1024, D, c) for _, H, Hkv, _, D, c in SHAPES}):
            if not runs(name, D):
                continue
            q, do = (torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
            k, v = (torch.empty(B, Hkv, S, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
            o, lse = torch.empty_like(q), q.new_empty((B, H, S), dtype=torch.float32)
            recorded.clear()
            try:
                backward(name, q, k, v, do, o, lse, causal)
            except Exception as e:
                print(f"{name:18} D={D} causal={causal!s:5}: {err_line(e)}", flush=True)
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
                if key in seen or "delta" in fn.__name__ or "cast" in fn.__name__:
                    continue
                seen.add(key)
                src = (GluonASTSource if "sm90" in fn.__name__ else ASTSource)(fn, sig, const, attrs)
                try:
                    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                        f.write(c.asm["cubin"])
                        f.flush()
                        res = subprocess.run([os.path.join(nvbin, "cuobjdump"), "-res-usage", f.name],
                                             capture_output=True, text=True, check=True).stdout
                    regs, stack = (int(g) for g in re.search(r"REG:(\d+).*?STACK:(\d+)", res).groups())
                    out = f"regs {regs:3} stack {stack:4} smem {c.metadata.shared // 1024:3} KB"
                except Exception as e:
                    out = f"FAILED {err_line(e)}"
                print(f"{name:18} D={D:3} causal={causal!s:5} {fn.__name__:28} {out}", flush=True)


# ---- the device -----------------------------------------------------------------------------------------------
def _warm(name):
    """Worker: one variant's backward (or the default forward) at the check shapes and on packed sequences:
    compiles, and finds a kernel that fails or hangs before the main process runs it."""
    import torch
    t0 = time.time()
    errors = []
    dims = (64, 256) if name == "forward" else VARIANTS[name][1]
    for D in dims:
        for B, H, Hkv, Sq, Sk, causal, window in CHECKS:
            try:
                q, k, v, do = inputs(B, H, Hkv, Sq, Sk, D, "cuda")
                if name == "forward":
                    forward(q, k, v, causal, window)
                else:
                    o = torch.randn_like(q)
                    lse = torch.randn(B, H, Sq, device="cuda", dtype=torch.float32)
                    backward(name, q, k, v, do, o, lse, causal, window)
                torch.cuda.synchronize()
            except Exception as e:
                errors.append(f"D={D} {(Sq, Sk, causal, window)}: {err_line(e)}")
        if name != "forward":
            for ci, (H, Hkv, kw) in enumerate(VARLEN_CASES):
                try:
                    varlen_case(name, H, Hkv, D, kw, ci)
                    torch.cuda.synchronize()
                except Exception as e:
                    errors.append(f"varlen D={D} {kw}: {err_line(e)}")
    return name, time.time() - t0, errors


def device_run(out_dir):
    import multiprocessing as mp

    import torch
    import triton
    from triton.testing import do_bench

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  variants={n: dict(knobs=k, dims=d) for n, (k, d) in VARIANTS.items()}, warm={}, check={},
                  rows=[], plans={})

    # 1. compile (and run once, small) in parallel worker processes
    jobs = ["forward"] + list(VARIANTS)
    bad = set()
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(jobs)) as pool:
        it = pool.imap_unordered(_warm, jobs)
        deadline = time.time() + 75
        for _ in jobs:
            try:
                name, secs, errors = it.next(timeout=max(1.0, deadline - time.time()))
            except Exception as e:
                print(f"warm-up incomplete: {err_line(e)}", flush=True)
                break
            report["warm"][name] = dict(s=round(secs, 1), errors=errors)
            if errors and name != "forward":
                bad.add(name)
            print(f"warm {name:18} {secs:5.1f} s {'; '.join(errors)[:300]}", flush=True)
        pool.terminate()
    for name in VARIANTS:
        if name not in report["warm"]:
            bad.add(name)
            report["warm"][name] = "no report within the deadline (hung?)"
            print(f"warm {name:18} did not report: not run here", flush=True)
    print(f"[{time.time() - T0:5.1f} s] compiled; skipped: {sorted(bad)}", flush=True)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    report["matmul_tflops"] = mm = 2 * 8192 ** 3 / (do_bench(lambda: a @ a, rep=100, return_mode="median")
                                                    * 1e-3) / 1e12
    a = None

    # 2. correctness against fp32 torch, fresh inputs, poisoned outputs
    def record(key, name, fn):
        try:
            got, want = fn()
            errs = [rel_norm(x, y) for x, y in zip(got, want)]
            report["check"][key] = errs
            if max(errs) > 2e-2:
                bad.add(name)
                print(f"WRONG {key}: rel err dq/dk/dv {errs}", flush=True)
        except Exception as e:
            bad.add(name)
            report["check"][key] = err_line(e)
            print(f"FAILED {key}: {err_line(e)}", flush=True)

    for D in (64, 256):
        for ci, (B, H, Hkv, Sq, Sk, causal, window) in enumerate(CHECKS):
            q, k, v, do = inputs(B, H, Hkv, Sq, Sk, D, "cuda", seed=100 + ci + D)
            g_ref = ref_backward(q, k, v, do, causal, window)
            o, lse = forward(q, k, v, causal, window)
            shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype), ((B, H, Sq, D), torch.float32)]
            for name in VARIANTS:
                if name in bad or not runs(name, D):
                    continue
                record(f"{name} | D{D} H{H}/{Hkv} {Sq}x{Sk} causal={causal} window={window}", name,
                       lambda: (poisoned(lambda: backward(name, q, k, v, do, o, lse, causal, window), shapes), g_ref))
        for ci, (H, Hkv, kw) in enumerate(VARLEN_CASES):
            for name in VARIANTS:
                if name in bad or not runs(name, D):
                    continue
                record(f"{name} | D{D} varlen H{H}/{Hkv} {kw}", name, lambda: varlen_case(name, H, Hkv, D, kw, 7 + ci))
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
        q, k, v, do = inputs(B, H, Hkv, S, S, D, "cuda", seed=si)
        o, lse = forward(q, k, v, causal)
        base = None
        row = dict(shape=(B, H, Hkv, S, D), causal=causal, ms={}, tflops={}, err={})
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
                row["err"][pname] = err_line(e)
            og = qg = kg = vg = f = None
        for name in VARIANTS:
            if name in bad or not runs(name, D) or time.time() - T0 > BUDGET_S:
                continue
            try:
                report["plans"][f"{name} D{D} causal={causal}"] = str(bwd_plan(problem(B, H, Hkv, S, S, D, causal),
                                                                              name))
                shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
                g = poisoned(lambda: backward(name, q, k, v, do, o, lse, causal), shapes)
                if base is None:
                    base = g
                else:
                    e = max(rel_norm(x, y) for x, y in zip(g, base))
                    row["err"][name] = e
                    if e > 1e-2:
                        raise RuntimeError(f"differs from the default by {e:.2e}")
                g = None
                row["ms"][name] = do_bench(lambda: backward(name, q, k, v, do, o, lse, causal), rep=100,
                                           return_mode="median")
            except Exception as e:
                row["err"][name] = err_line(e)
                print(f"FAILED {name} at {row['shape']} causal={causal}: {err_line(e)}", flush=True)
        row["tflops"] = {n: fl / ms / 1e9 for n, ms in row["ms"].items()}
        report["rows"].append(row)
        print(f"[{time.time() - T0:5.1f} s] {row['shape']} causal={causal}: "
              + " ".join(f"{n.replace(' ', '_')}={t:.0f}" for n, t in row["tflops"].items()), flush=True)
        q = k = v = do = o = lse = base = None
        torch.cuda.empty_cache()

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe_attnbwd3.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    table(report, mm)


def table(report, mm):
    print(f"\n== attention backward, bf16, TFLOP/s (2.5x fwd flops, causal halved); bf16 matmul {mm:.0f}; "
          f"{report['device']}, torch {report['torch']}, triton {report['triton']}")
    for r in report["rows"]:
        B, H, Hkv, S, D = r["shape"]
        t = r["tflops"]
        lab = f"{B},{H}/{Hkv},{S},{D}{' c' if r['causal'] else ''}"
        cud = t.get("cudnn")
        cells = " ".join(f"{n.replace(' ', '_')}={v:.0f}" + (f"({v / cud:.2f})" if cud else "")
                         for n, v in t.items())
        print(f"{lab:20} {cells}")
    errs = {f"{k} @ {r['shape']} c={r['causal']}": v for r in report["rows"] for k, v in r["err"].items()
            if isinstance(v, str)}
    for k, v in list(errs.items())[:8]:
        print(f"error {k}: {v}")
    for k, v in report["check"].items():
        if isinstance(v, str) or max(v) > 2e-2:
            print(f"check {k}: {v}")
    for name in VARIANTS:
        vals = [max(v) for k, v in report["check"].items() if k.startswith(name + " |") and not isinstance(v, str)]
        print(f"check {name:18}: {len(vals)} cases passed, worst rel err vs fp32 torch "
              f"{max(vals) if vals else float('nan'):.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--compile-only", action="store_true", help="sm_90a compile of every variant's launches, no GPU")
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
    else:
        device_run(a.out)


if __name__ == "__main__":
    sys.exit(main())
