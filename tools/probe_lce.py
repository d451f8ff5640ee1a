"""Probe: linear cross-entropy forward + backward (issue 27) at (N, Hd, V) = (8192, 4096, 128256) and
(16384, 2048, 151936), bf16, 10 % of targets ignored, mean reduction.

    PYTHONPATH=src python tools/probe_lce.py --out DIR [--shapes 0,1] [--budget 140]

Rows: the current default (scheme "tokens": 224-token chunks, 3 GEMMs, grad_weight accumulated in bf16 per chunk),
scheme "vocab" variants (two sweeps over vocab chunks, 4 cuBLAS GEMMs, grad_weight written once per chunk), the
torch.compile of F.cross_entropy((h @ w.T).float(), t) (compiled once per shape before any timing), Cut
Cross-Entropy and Liger where importable. Per shape: (1) each row checked against an fp32 torch reference on the
same inputs (loss, grad_hidden, grad_weight relative norm errors; outputs poisoned with NaN through the caching
allocator first; a wrong row is marked FAIL and still timed); (2) do_bench medians of forward + backward (each call
moves GBs, far past the 60 MB L2, so one input set); (3) peak memory above the call's start minus the gradients
(the goal's "extra"); (4) a breakdown: each GEMM / kernel of both schemes timed alone at its chunk shape, times
its count. Writes DIR/probe_lce.json; the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback

import torch
import torch.nn.functional as F
import triton

import onlinesoftmax as oss
from onlinesoftmax.losses import LCEKnobs

SHAPES = [(8192, 4096, 128256), (16384, 2048, 151936)]
IGNORE = -100
T0 = time.time()


def _err(e):
    return " | ".join(traceback.format_exception_only(type(e), e))[:300].strip()


def _rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _poison(gib=3.0):
    """NaN into blocks the caching allocator hands out next."""
    x = torch.full((int(gib * 2**30) // 4,), float("nan"), device="cuda")
    del x


def _variants(N, Hd, V, peers, compiled):
    """name -> fn(h, w, t) returning the loss (backward is called by the harness)."""
    out = {"oss default": lambda h, w, t: oss.linear_cross_entropy(h, w, t, ignore_index=IGNORE)}
    vocab = {"vocab": LCEKnobs(scheme="vocab")}
    if N == 8192:
        vocab["vocab Vc=2048"] = LCEKnobs(scheme="vocab", vocab_chunk=2048)
        vocab["vocab Vc=4096 (64.1 MiB)"] = LCEKnobs(scheme="vocab", vocab_chunk=4096)
    else:
        vocab["vocab Nb=8192 Vc=3840"] = LCEKnobs(scheme="vocab", chunk_tokens=8192, vocab_chunk=3840)
    vocab["vocab dh_fp32"] = LCEKnobs(scheme="vocab", dh_fp32=True)
    for name, k in vocab.items():
        out[name] = (lambda k: lambda h, w, t: oss.linear_cross_entropy(h, w, t, ignore_index=IGNORE, knobs=k))(k)
    if compiled is not None:
        out["torch.compile"] = compiled
    if "cce" in peers:
        out["cce"] = lambda h, w, t: peers["cce"](h, w, t, ignore_index=IGNORE)
    if "liger" in peers:
        out["liger"] = lambda h, w, t: peers["liger"](h, w, t, ignore_index=IGNORE)
    return out


def _peers():
    out = {}
    try:
        from cut_cross_entropy import linear_cross_entropy as cce
        out["cce"] = cce
    except Exception as e:
        print("cce not importable:", _err(e))
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
        out["liger"] = liger_fused_linear_cross_entropy
    except Exception as e:
        print("liger not importable:", _err(e))
    return out


def _fwd_bwd(fn, h, w, t):
    h.grad = w.grad = None
    loss = fn(h, w, t)
    loss.backward()
    return loss.detach().float()


def _reference(h, w, t):
    """fp32 loss, grad_hidden, grad_weight (TF32 off)."""
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    loss = F.cross_entropy(hf @ wf.T, t, ignore_index=IGNORE)
    loss.backward()
    torch.backends.cuda.matmul.allow_tf32 = prev
    out = (loss.detach(), hf.grad, wf.grad)
    del hf, wf
    return out


def _plan_note(N, Hd, V, name):
    from onlinesoftmax.losses.plan import LCEProblem, plan_linear_cross_entropy
    from onlinesoftmax.target import target_of
    k = {"vocab": LCEKnobs(scheme="vocab"), "vocab dh_fp32": LCEKnobs(scheme="vocab", dh_fp32=True)}.get(name)
    if k is None and name != "oss default":
        return ""
    try:
        p = plan_linear_cross_entropy(LCEProblem(N, Hd, V, 2, True), target_of(torch.device("cuda")), k)
        return f"{p.scheme}: {p.chunk_tokens} tok x {p.vocab_chunk or V} cls, tile {p.tile_bytes / 2**20:.1f} MiB"
    except Exception as e:
        return _err(e)


def _breakdown(N, Hd, V, h, w, t):
    """Each piece of both schemes alone at its chunk shape (ms per call, count per fwd+bwd)."""
    from onlinesoftmax.losses import lce_kernels as K
    from onlinesoftmax.losses.plan import LCEProblem, plan_linear_cross_entropy
    from onlinesoftmax.target import target_of
    tgt = target_of(h.device)
    res = {}
    hd, wd = h.detach(), w.detach()

    def bench(f):
        return triton.testing.do_bench(f, warmup=10, rep=40)

    # scheme tokens
    pt = plan_linear_cross_entropy(LCEProblem(N, Hd, V, 2, True), tgt)
    T, nt = pt.chunk_tokens, math.ceil(N / pt.chunk_tokens)
    tile = (torch.randn(T, V, device="cuda") * 0.01).bfloat16()
    dW = torch.zeros_like(wd)
    dh = torch.empty(T, Hd, device="cuda", dtype=torch.bfloat16)
    res["tokens S=h[T]@W^T"] = (bench(lambda: torch.mm(hd[:T], wd.t(), out=tile)), nt)
    res["tokens dh=dS@W"] = (bench(lambda: torch.mm(tile, wd, out=dh)), nt)
    res["tokens dW+=dS^T@h (bf16, K=T)"] = (bench(lambda: dW.addmm_(tile.t(), hd[:T])), nt)
    # scheme vocab
    pv = plan_linear_cross_entropy(LCEProblem(N, Hd, V, 2, True), tgt, LCEKnobs(scheme="vocab"))
    B, Vc = pv.chunk_tokens, pv.vocab_chunk
    nv = math.ceil(V / Vc)
    sc = torch.randn(B, Vc, device="cuda").bfloat16()
    dW = torch.empty(Vc, Hd, device="cuda", dtype=torch.bfloat16)
    dh = torch.zeros(B, Hd, device="cuda", dtype=torch.bfloat16)
    dhf = torch.zeros(B, Hd, device="cuda", dtype=torch.float32)
    st = torch.zeros(4, B, device="cuda")
    st[0] = float("-inf")
    rows = torch.full((3, B), 1e-4, device="cuda")
    lse = torch.full((B,), 12.0, device="cuda")
    ts = t[:B].contiguous()
    res[f"vocab S_c=h@W_c^T (Vc={Vc})"] = (bench(lambda: torch.mm(hd[:B], wd[:Vc].t(), out=sc)), 2 * nv - 1)
    res["vocab fold kernel"] = (bench(lambda: K.fold(sc, ts, st, 0, IGNORE, False, None, True)), nv)
    res["vocab grad kernel (in place)"] = (bench(lambda: K.grad_(sc, ts, lse, rows, 0, IGNORE, False, None, True)),
                                           nv)
    res["vocab dW_c=dS^T@h"] = (bench(lambda: torch.mm(sc.t(), hd[:B], out=dW)), nv)
    res["vocab dh+=dS@W_c (bf16)"] = (bench(lambda: dh.addmm_(sc, wd[:Vc])), nv)
    try:
        res["vocab dh+=dS@W_c (fp32 out)"] = (bench(lambda: torch.addmm(dhf, sc, wd[:Vc], out_dtype=torch.float32,
                                                                        out=dhf)), nv)
    except Exception as e:
        print("fp32-out addmm:", _err(e))
    return {k: {"ms": round(v[0], 4), "count": v[1], "total_ms": round(v[0] * v[1], 2)} for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default="0,1")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds: rows past it are skipped")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    peers = _peers()
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm_ms = triton.testing.do_bench(lambda: a @ a, warmup=20, rep=100)
    rate = 2 * 8192 ** 3 / mm_ms / 1e9                     # TFLOP/s
    report = {"matmul_tflops": round(rate, 1), "shapes": {}}
    print(f"bf16 matmul 8192^3: {mm_ms:.3f} ms = {rate:.0f} TFLOP/s")
    for si in [int(s) for s in args.shapes.split(",")]:
        N, Hd, V = SHAPES[si]
        key = f"{N}x{Hd}x{V}"
        rec = {"floor_3mm_ms": round(6 * N * Hd * V / rate / 1e9, 2),
               "floor_4mm_ms": round(8 * N * Hd * V / rate / 1e9, 2), "rows": {}}
        report["shapes"][key] = rec
        h = (torch.randn(N, Hd, device=dev) / Hd ** 0.25).bfloat16().requires_grad_()
        w = (torch.randn(V, Hd, device=dev) / Hd ** 0.25).bfloat16().requires_grad_()
        t = torch.randint(0, V, (N,), device=dev)
        t[torch.rand(N, device=dev) < 0.1] = IGNORE
        grad_bytes = (N * Hd + V * Hd) * 2
        ref = _reference(h, w, t)
        torch.cuda.empty_cache()
        compiled = None
        if time.time() - T0 < args.budget - 40:
            try:
                c0 = time.time()
                f = torch.compile(lambda h, w, t: F.cross_entropy((h @ w.T).float(), t, ignore_index=IGNORE),
                                  dynamic=False)
                _fwd_bwd(f, h, w, t)
                torch.cuda.synchronize()
                compiled = f
                rec["compile_s"] = round(time.time() - c0, 1)
            except Exception as e:
                print(key, "torch.compile failed:", _err(e))
        for name, fn in _variants(N, Hd, V, peers, compiled).items():
            row = rec["rows"].setdefault(name, {})
            if name.startswith("vocab") or name == "oss default":
                row["plan"] = _plan_note(N, Hd, V, name)
            if time.time() - T0 > args.budget:
                row["skipped"] = "time budget"
                continue
            try:
                # (1) check against the fp32 reference, outputs poisoned first
                h.grad = w.grad = None
                torch.cuda.empty_cache()
                _poison()
                loss = _fwd_bwd(fn, h, w, t)
                torch.cuda.synchronize()
                errs = (_rel(loss, ref[0]), _rel(h.grad, ref[1]), _rel(w.grad, ref[2]))
                row.update(err_loss=float(f"{errs[0]:.2e}"), err_dh=float(f"{errs[1]:.2e}"),
                           err_dw=float(f"{errs[2]:.2e}"))
                ok = errs[0] < 1e-3 and errs[1] < 2e-2 and errs[2] < 2e-2 and all(map(math.isfinite, errs))
                row["check"] = "ok" if ok else "FAIL"
                if not ok:
                    print(f"FAIL {key} {name}: errors {errs}")
                # (3) peak memory above the call's start, less the gradients
                h.grad = w.grad = None
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                _fwd_bwd(fn, h, w, t)
                torch.cuda.synchronize()
                row["extra_MiB"] = round((torch.cuda.max_memory_allocated() - base - grad_bytes) / 2**20, 1)
                # (2) time
                ms = triton.testing.do_bench(lambda: _fwd_bwd(fn, h, w, t), warmup=100, rep=500)
                row["ms"] = round(ms, 2)
                row["tflops_6"] = round(6 * N * Hd * V / ms / 1e9, 1)
            except Exception as e:
                row["error"] = _err(e)
                print(f"ERROR {key} {name}: {row['error']}")
            h.grad = w.grad = None
        del ref
        torch.cuda.empty_cache()
        if time.time() - T0 < args.budget:
            try:
                rec["breakdown"] = _breakdown(N, Hd, V, h, w, t)
            except Exception as e:
                rec["breakdown_error"] = _err(e)
                print(f"breakdown {key}: {rec['breakdown_error']}")
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "probe_lce.json"), "w") as fh:
            json.dump(report, fh, indent=1)
    # the table, last
    print(f"\n=== probe_lce ({time.time() - T0:.0f} s), bf16 matmul {rate:.0f} TFLOP/s ===")
    for key, rec in report["shapes"].items():
        print(f"\n{key}: floor 3 GEMMs {rec['floor_3mm_ms']} ms, 4 GEMMs {rec['floor_4mm_ms']} ms; "
              f"compile {rec.get('compile_s', '-')} s")
        print(f"{'row':28s} {'ms':>7s} {'TF(6NHV)':>8s} {'extraMiB':>9s} {'check':>5s} {'e_loss':>8s} {'e_dh':>8s} "
              f"{'e_dw':>8s}  plan")
        for name, r in rec["rows"].items():
            if "error" in r or "skipped" in r:
                print(f"{name:28s} {r.get('error', r.get('skipped'))[:150]}")
                continue
            print(f"{name:28s} {r['ms']:7.2f} {r['tflops_6']:8.1f} {r['extra_MiB']:9.1f} {r['check']:>5s} "
                  f"{r['err_loss']:8.1e} {r['err_dh']:8.1e} {r['err_dw']:8.1e}  {r.get('plan', '')}")
        for k, v in rec.get("breakdown", {}).items():
            print(f"  {k:36s} {v['ms']:7.3f} ms x {v['count']:3d} = {v['total_ms']:7.2f} ms")
    with open(os.path.join(args.out, "probe_lce.json"), "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
