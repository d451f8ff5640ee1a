"""Host cost of ``oss.attention`` on the H200 (<= 150 s): the persistent sm90 forward's cached TMA descriptor
encodings (``launch.DescriptorKernel``; ``launch.TMA_ARG_CACHE = 0`` switches the cache off: Triton's launcher
then encodes the four descriptors on every launch), the cached plans and the eager paths (no custom op).

1. checks: (o, lse) of the public call against fp32 torch, with the cache on and off (the two bitwise equal: the
   forward is deterministic), on fresh inputs with the output's future memory poisoned (NaN), where the cache misses
   and hits: fresh tensors, the same tensors with new contents, new tensors at freed addresses (same pointer,
   shape and strides: hits), the same pointer with other strides ([B, S, H, D] over a [B, H, S, D] buffer) and
   another shape, views at a head / row offset, GQA, odd Sq, Sq != Sk, fp16; the encodings made per call; the
   gradients of the eager autograd path against fp32 torch;
2. host µs per eager call (perf_counter over N calls, synchronised at the ends only; short problems, so the GPU
   idles): the public call with the cache on / off, the custom op called directly (the path before the eager
   bypass), with requires_grad (eager autograd.Function vs the op's registered autograd), SDPA cuDNN / default;
   the pieces: fill_tma_descriptor, make_tensordesc_arg, TensorDescriptor + get_default_for, the plan (cached vs
   plan_attention), the two allocations, the bound launch with its cached encodings;
3. do_bench ms (median, two input sets rotated past L2) of the public call (cache on / off) vs SDPA cuDNN at
   16 × 32 × 1024 × 128 causal, 8 × 16 × 2048 × 64 causal and not.
Table last; JSON to ``--out``.     ``PYTHONPATH=src python tools/probe_hostdesc.py --out DIR``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback

from probe_util import err_head, rel

T0 = time.time()
BF16 = "bfloat16"
CHECK_TOL = (2e-2, 5e-3)     # ‖o − ref‖∞ / ‖ref‖∞ (bf16 / fp16 inputs), max |lse − ref|
BENCH = [(16, 32, 1024, 128, True), (8, 16, 2048, 64, True), (8, 16, 2048, 64, False)]
HOST = [((1, 2, 256, 64), False), ((1, 2, 256, 128), True)]
BUDGET_S = 125               # no bench row starts past this (the whole probe: <= 150 s)


def poison(q):
    """NaN in the freed blocks the caching allocator hands out next for the call's o and lse."""
    import torch
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    del o, lse


class Encodes:
    """Counts the descriptor encodings (cache misses) of DescriptorKernel launches."""

    def __init__(self, launch):
        self.n = 0
        real = launch.DescriptorKernel.encode

        def encode(bk, i, t, meta):
            self.n += 1
            return real(bk, i, t, meta)
        launch.DescriptorKernel.encode = encode


def checks(report):
    import torch

    import onlinesoftmax as oss
    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api
    from onlinesoftmax.target import target_of

    enc = Encodes(launch)
    out = report["checks"] = {}
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)

    def run(name, q, k, v, causal):
        try:
            p = api._op_problem(q, k, v, causal, -1, -1, 0.0)
            plan = api._triton_plan(p, q.device).forward
            ro, rl = api._torch_attention(q.float(), k.float(), v.float(), q.shape[-1] ** -0.5, -1,
                                          0 if causal else -1, None)
            res = {"plan": f"{plan.kernel} programs={plan.programs}"}
            got = []
            for cache in (launch.TMA_ARG_CACHE, 0):
                saved, launch.TMA_ARG_CACHE = launch.TMA_ARG_CACHE, cache
                try:
                    poison(q)
                    n0 = enc.n
                    o, lse = oss.attention(q, k, v, causal=causal, return_lse=True)
                    torch.cuda.synchronize()
                    if cache:
                        res["encodes"] = enc.n - n0
                    got.append((o, lse))
                finally:
                    launch.TMA_ARG_CACHE = saved
            (o, lse), (o0, lse0) = got
            res["o err"], res["lse err"] = rel(o, ro), (lse - rl).abs().max().item()
            res["on == off"] = bool(torch.equal(o, o0) and torch.equal(lse, lse0))
            res["ok"] = (res["o err"] <= CHECK_TOL[0] and res["lse err"] <= CHECK_TOL[1] and res["on == off"])
        except Exception as e:  # noqa: BLE001
            res = {"ok": False, "error": err_head(e)}
            traceback.print_exc()
        out[name] = res
        print(f"[{time.time() - T0:5.1f} s] check {name}: {res}", flush=True)

    B, H, S, D = 2, 4, 512, 64
    q, k, v = rnd(B, H, S, D), rnd(B, H, S, D), rnd(B, H, S, D)
    run("fresh D64 nc (miss)", q, k, v, False)
    run("same tensors (hit)", q, k, v, False)
    q.normal_(generator=g)
    v.normal_(generator=g)
    run("same tensors, new data (hit)", q, k, v, False)
    del q, k, v
    q, k, v = rnd(B, H, S, D), rnd(B, H, S, D), rnd(B, H, S, D)     # likely the freed blocks: same pointers
    run("new tensors, freed addresses", q, k, v, False)
    buf = rnd(B * H * S * D)
    run("buffer as [B,H,S,D] q", buf.view(B, H, S, D), k, v, False)
    buf.normal_(generator=g)
    run("same ptr, [B,S,H,D] strides", buf.view(B, S, H, D).transpose(1, 2), k, v, False)
    run("same ptr, Sq = S/2", buf.view(B, H, S, D)[:, :, : S // 2], k, v, False)
    big = rnd(B, H + 2, S + 64, D)
    run("views: head / row offsets", big[:, 1:H + 1, 64:], big[:, 2:, :S], big[:, :H, 32:S + 32], False)
    run("views again (hit)", big[:, 1:H + 1, 64:], big[:, 2:, :S], big[:, :H, 32:S + 32], False)
    for name, (b, h, hk, sq, sk, d, causal, dt) in {
        "D128 causal": (2, 4, 4, 512, 512, 128, True, torch.bfloat16),
        "D128 causal GQA 8/2": (1, 8, 2, 384, 384, 128, True, torch.bfloat16),
        "D128 nc odd Sq 1000": (1, 4, 4, 1000, 1000, 128, False, torch.bfloat16),
        "D128 causal Sq<Sk": (1, 4, 4, 200, 777, 128, True, torch.bfloat16),
        "D64 nc fp16 GQA": (2, 4, 1, 129, 257, 64, False, torch.float16),
    }.items():
        run(name, rnd(b, h, sq, d, dtype=dt), rnd(b, hk, sk, d, dtype=dt), rnd(b, hk, sk, d, dtype=dt), causal)
    x = rnd(2, 384, 8, 128)                                       # [B, S, H, D]
    run("bshd D128 causal", x.transpose(1, 2), rnd(2, 384, 8, 128).transpose(1, 2),
        rnd(2, 384, 8, 128).transpose(1, 2), True)
    try:        # gradients through the eager autograd.Function
        q, k, v = (rnd(1, 4, 384, 128).requires_grad_() for _ in range(3))
        o, lse = oss.attention(q, k, v, causal=True, return_lse=True)
        w = torch.randn_like(o)
        ((o.float() * w).sum() + lse.sum()).backward()
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        ro, rl = api._torch_attention(qf, kf, vf, 128 ** -0.5, -1, 0, None)
        ((ro * w.float()).sum() + rl.sum()).backward()
        errs = {n: rel(a.grad, b.grad) for n, a, b in (("dq", q, qf), ("dk", k, kf), ("dv", v, vf))}
        out["eager grads D128 causal"] = {"ok": max(errs.values()) <= 3e-2, **errs,
                                          "grad_fn": type(o.grad_fn).__name__}
    except Exception as e:  # noqa: BLE001
        out["eager grads D128 causal"] = {"ok": False, "error": err_head(e)}
    print(f"[{time.time() - T0:5.1f} s] check grads: {out['eager grads D128 causal']}", flush=True)
    report["target"] = str(target_of(torch.device("cuda")))


def host_us(fn, n=300, reps=5) -> float:
    """Median over reps of the host µs per call of n eager calls (synchronised before and after only)."""
    import torch
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(ts), 1)


def host(report):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import onlinesoftmax as oss
    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api

    rows = report["host"] = []
    for shape, causal in HOST:
        r = {"shape": "x".join(map(str, shape)), "causal": causal}
        q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        qg = q.clone().requires_grad_()
        scale = shape[-1] ** -0.5
        cases = {
            "oss": lambda: oss.attention(q, k, v, causal=causal),
            "oss cache off": "off",
            "custom op": lambda: torch.ops.onlinesoftmax.attention_fwd(q, k, v, causal, scale, -1, -1, 0.0),
            "oss grad (eager Function)": lambda: oss.attention(qg, k, v, causal=causal),
            "custom op grad": lambda: torch.ops.onlinesoftmax.attention_fwd(qg, k, v, causal, scale, -1, -1, 0.0),
            "sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        }
        for name, fn in cases.items():
            try:
                if fn == "off":
                    saved, launch.TMA_ARG_CACHE = launch.TMA_ARG_CACHE, 0
                    try:
                        r[name] = host_us(cases["oss"])
                    finally:
                        launch.TMA_ARG_CACHE = saved
                else:
                    r[name] = host_us(fn)
            except Exception as e:  # noqa: BLE001
                r[name] = err_head(e)
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                r["sdpa cudnn"] = host_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        except Exception as e:  # noqa: BLE001
            r["sdpa cudnn"] = err_head(e)
        try:
            p = api._op_problem(q, k, v, causal, -1, -1, 0.0)
            r["plan"] = str(api._triton_plan(p, q.device).forward)
        except Exception as e:  # noqa: BLE001
            r["plan"] = err_head(e)
        rows.append(r)
        print(f"[{time.time() - T0:5.1f} s] host {r}", flush=True)
    try:
        report["pieces"] = pieces()
    except Exception as e:  # noqa: BLE001
        report["pieces"] = {"error": err_head(e)}
        traceback.print_exc()
    print(f"[{time.time() - T0:5.1f} s] pieces {report['pieces']}", flush=True)


def pieces() -> dict:
    """Host µs of the pieces of one persistent-forward call, on the GPU machine's CPU."""
    import torch
    import triton
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST, make_tensordesc_arg
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import plan_attention
    from onlinesoftmax.target import target_of

    q = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    p = api._op_problem(q, k, v, True, -1, -1, 0.0)
    plan = api._triton_plan(p, q.device).forward
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    so, sl = api._strides(o), api._lse_strides(p, lse)
    bk = api._caches()[0](p, plan, (*api._strides(q), *api._strides(k), *api._strides(v), *so, *sl))
    n_m = -(-p.Sq // plan.block_m)
    args = (q, k, v, o, o, *so[:3], lse, *sl, p.H, p.group, p.Sq, p.Sk, 0, 0, *api._scalars(q.shape[-1] ** -0.5, 0.0),
            n_m, api.persistent_units(n_m, p.B * p.H, plan.pairs))
    bk(args, (q, k, v, o), q.device)
    bk(args, (q, k, v, o), q.device)
    dev = q.device
    block, lay = bk.boxes[0]
    desc = TensorDescriptor(q, list(q.shape), list(q.stride()), block, lay)
    unwrapped = next(iter(bk._compiled.values()))[3]
    meta = unwrapped[1][0] if unwrapped else dict(swizzle=3, elem_size=2, elem_type=10, block_size=[1, 1, 64, 64],
                                                  fp4_padded=False)
    fill = triton.runtime.driver.active.utils.fill_tma_descriptor
    host_type = TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]]
    res = {
        "fill_tma_descriptor": lambda: fill(q.data_ptr(), meta["swizzle"], meta["elem_size"], host_type,
                                            meta["block_size"], list(q.shape), list(q.stride()), 0),
        "make_tensordesc_arg": lambda: make_tensordesc_arg(desc, meta),
        "get_default_for": lambda: gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16),
        "TensorDescriptor": lambda: TensorDescriptor(q, list(q.shape), list(q.stride()), block, lay),
        "plan_attention": lambda: plan_attention(p, target_of(dev), "triton"),
        "_triton_plan (cached)": lambda: api._triton_plan(p, dev),
        "_op_problem": lambda: api._op_problem(q, k, v, True, -1, -1, 0.0),
        "empty_like + empty lse": lambda: (torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32,
                                                                              device=dev)),
        "bound launch, encodings cached": lambda: bk(args, (q, k, v, o), dev),
        "_forward_persistent": lambda: api._forward_persistent(q, k, v, o, lse, p, plan, q.shape[-1] ** -0.5, 0.0),
    }

    def off():
        saved, launch.TMA_ARG_CACHE = launch.TMA_ARG_CACHE, 0
        try:
            bk(args, (q, k, v, o), dev)
        finally:
            launch.TMA_ARG_CACHE = saved
    res["bound launch, cache off"] = off
    out = {"unwrapped": unwrapped is not None, "meta": str(meta)}
    for name, fn in res.items():
        try:
            out[name] = host_us(fn, n=500)
        except Exception as e:  # noqa: BLE001
            out[name] = err_head(e)
    return out


def bench(report):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import onlinesoftmax as oss
    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api

    def ms(fn, sets):
        state = [0]

        def call():
            state[0] += 1
            return fn(*sets[state[0] % len(sets)])
        return round(do_bench(call, warmup=25, rep=100, return_mode="median"), 4)

    rows = report["bench"] = []
    for B, H, S, D, causal in BENCH:
        r = {"shape": f"{B}x{H}x{S}x{D}", "causal": causal}
        if time.time() - T0 > BUDGET_S:
            r["error"] = f"skipped: past {BUDGET_S} s"
            rows.append(r)
            continue
        try:
            sets = [tuple(torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    for _ in range(2)]
            p = api._op_problem(*sets[0], causal, -1, -1, 0.0)
            plan = api._triton_plan(p, sets[0][0].device).forward
            r["plan"] = f"{plan.kernel} programs={plan.programs}"
            r["oss"] = ms(lambda q, k, v: oss.attention(q, k, v, causal=causal), sets)
            saved, launch.TMA_ARG_CACHE = launch.TMA_ARG_CACHE, 0
            try:
                r["oss cache off"] = ms(lambda q, k, v: oss.attention(q, k, v, causal=causal), sets)
            finally:
                launch.TMA_ARG_CACHE = saved
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                r["sdpa cudnn"] = ms(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), sets)
            del sets
        except Exception as e:  # noqa: BLE001
            r["error"] = err_head(e)
            traceback.print_exc()
        torch.cuda.empty_cache()
        rows.append(r)
        print(f"[{time.time() - T0:5.1f} s] bench {r}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe-out")
    args = ap.parse_args()
    import torch
    import triton
    report = {"torch": torch.__version__, "triton": triton.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    os.makedirs(args.out, exist_ok=True)
    for step in (checks, host, bench):
        try:
            step(report)
        except Exception as e:  # noqa: BLE001
            report[step.__name__ + " error"] = err_head(e)
            traceback.print_exc()
        with open(os.path.join(args.out, "probe_hostdesc.json"), "w") as f:     # after each step: a kill keeps it
            json.dump(report, f, indent=1, default=str)

    print(f"\n== {report['device']} torch {report['torch']} triton {report['triton']}")
    print(f"== checks vs fp32 torch (o rel ≤ {CHECK_TOL[0]}, lse abs ≤ {CHECK_TOL[1]}, cache on == off bitwise)")
    for name, r in report.get("checks", {}).items():
        flag = "ok  " if r.get("ok") else "FAIL"
        rest = {k: (f"{v:.1e}" if isinstance(v, float) else v) for k, v in r.items() if k != "ok"}
        print(f"  {flag} {name:30} {rest}")
    print("\n== host µs per eager call (GPU idle: short problems)")
    for r in report.get("host", []):
        cells = " | ".join(f"{k} {v}" for k, v in r.items() if k not in ("shape", "causal", "plan"))
        print(f"  {r['shape']:12} {'causal' if r['causal'] else 'nc    '} {cells}")
        print(f"    plan {r.get('plan', '')[:150]}")
    print("  pieces (µs): " + " | ".join(f"{k} {v}" for k, v in report.get("pieces", {}).items()))
    print("\n== do_bench ms (median, 2 input sets); x = cuDNN / ours")
    for r in report.get("bench", []):
        cud = r.get("sdpa cudnn")
        cells = []
        for k in ("oss", "oss cache off", "sdpa cudnn"):
            val = r.get(k)
            ratio = f" (x{cud / val:.2f})" if isinstance(val, float) and isinstance(cud, float) else ""
            cells.append(f"{k} {val}{ratio}")
        print(f"  {r['shape']:16} {'causal' if r['causal'] else 'nc    '} {r.get('plan', r.get('error', ''))[:60]:24} "
              + " | ".join(cells))
    print(f"[{time.time() - T0:5.1f} s] done")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        raise
