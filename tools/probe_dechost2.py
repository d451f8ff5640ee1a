"""Host cost of an eager decode call (issues 26 / 30): ``decode.launch.DecodeCall`` (the lanes: C launchers with int
pointers, a full cache's lengths from a table) against the ``BoundKernel`` route main runs, SDPA, and
``attention_with_kvcache`` on a preallocated cache. H200, <= 150 s.

1. checks, poisoned outputs (NaN blocks handed back to the allocator first): the lanes against the BoundKernel route
   (bit for bit) and the fp64 reference, dense / paged x split / balanced x Sq 1 / 4; a growing cache of 40 steps;
   a CUDA graph captured after the lanes are bound, replayed after cache_seqlens change;
2. host µs per call (perf_counter around the call, no sync; mean over 512 calls of a cache grown by torch.cat, and
   over 1000 calls at one length) and wall µs per step of probe_tf_decode's attention_loop (128 steps from S = 2048):
   q [8, 32, 1, 128] bf16, k / v [8, 8, S, 128];
3. DIR/probe_dechost2.json, a table printed last.

    PYTHONPATH=src python tools/probe_dechost2.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_util import attention_loop, err_head  # noqa: E402

import onlinesoftmax as oss  # noqa: E402
from onlinesoftmax.attention import api as aapi  # noqa: E402
from onlinesoftmax.decode import launch  # noqa: E402
from onlinesoftmax.decode.plan import Knobs, decode_plan  # noqa: E402
from onlinesoftmax.reference import decode as ref  # noqa: E402
from onlinesoftmax.target import target_of  # noqa: E402

DEV = torch.device("cuda")
B, H, HKV, D = 8, 32, 8, 128
SCALE = D ** -0.5


def poison(nbytes=64 << 20):
    """NaN-filled blocks back to the caching allocator: the next outputs reuse them."""
    blocks = [torch.full((n // 4,), float("nan"), device=DEV) for n in (1 << 16, 1 << 20, nbytes)]
    del blocks


def ref_err(o, lse, q, k, v, sl, bt):
    ro, rl = ref.attention_with_kvcache(q, k, v, sl, bt)
    if torch.isnan(o).any() or (lse is not None and torch.isnan(lse).any()):
        return float("inf"), float("inf")
    lowp = (ro.to(o.dtype).double() - ro).abs().max().item()
    err = (o.double() - ro).abs().max().item()
    fin = torch.isfinite(rl)
    lerr = (lse.double() - rl)[fin].abs().max().item() if lse is not None and fin.any() else 0.0
    return err / (2 * lowp + 2e-2), lerr           # <= 1: within the tests' bf16 tolerance


def make_cache(S, lens, page):
    k = torch.randn(B, HKV, S, D, device=DEV).bfloat16()
    v = torch.randn_like(k)
    sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
    if not page:
        return k, v, sl, None
    mp = -(-S // page)
    perm = torch.randperm(B * mp, device=DEV).int()
    table = perm.reshape(B, mp).contiguous()
    kp = torch.empty(B * mp, HKV, page, D, device=DEV, dtype=torch.bfloat16)
    vp = torch.empty_like(kp)
    kpad = F.pad(k, (0, 0, 0, mp * page - S)).reshape(B, HKV, mp, page, D).permute(0, 2, 1, 3, 4).reshape(-1, HKV,
                                                                                                            page, D)
    vpad = F.pad(v, (0, 0, 0, mp * page - S)).reshape(B, HKV, mp, page, D).permute(0, 2, 1, 3, 4).reshape(-1, HKV,
                                                                                                            page, D)
    kp[perm.long()] = kpad
    vp[perm.long()] = vpad
    return kp, vp, sl, table


def set_plan(balanced):
    """decode_plan with the balanced knob (None: the default) for DecodeCall; bound calls dropped."""
    target = target_of(DEV)
    launch.cached_plan = (REAL_PLAN if balanced is None else
                          (lambda p, device: decode_plan(p, target, Knobs.of(balanced=balanced))))
    launch._calls.clear()


REAL_PLAN = launch.cached_plan


def check_lanes(res):
    S = 5000
    lens = [S, 1, 77, 4999, 2048, 3000, 17, 5000]
    for page in (0, 16):
        k, v, sl, bt = make_cache(S, lens, page)
        for balanced in (False, True):
            for Sq in (1, 4):
                name = f"lanes {'paged16' if page else 'dense'} {'balanced' if balanced else 'split'} Sq{Sq}"
                try:
                    set_plan(balanced)
                    worst_bits, worst = True, 0.0
                    for need_lse in (True, False):
                        for _ in range(3):
                            q = torch.randn(B, H, Sq, D, device=DEV).bfloat16()
                            poison()
                            o, lse = launch.attention_decode(q, k, v, sl, bt, True, SCALE, -1, -1, 0.0, need_lse)
                            bound = [c for c in launch._calls.values() if c.need_lse == need_lse][0].last[1]
                            poison()
                            o2, lse2 = launch.attention_split_kv(q, k, v, sl, bt, True, SCALE, -1, -1, 0.0,
                                                                 bound.plan)
                            worst_bits &= torch.equal(o, o2) and (lse is None or torch.equal(lse, lse2))
                        e, le = ref_err(o, lse if need_lse else lse2, q, k, v, sl, bt)
                        worst = max(worst, e)
                    ok = worst_bits and worst <= 1 and bound.lanes is not None and bound.plan.balanced == balanced
                    res[name] = dict(ok=ok, bitwise=worst_bits, ref_err_over_tol=worst, lanes=bound.lanes is not None)
                except Exception as e:  # noqa: BLE001
                    res[name] = dict(ok=False, error=err_head(e))
                    traceback.print_exc(limit=3)
    set_plan(None)


def check_loop(res):
    for balanced in (None, False):
        name = f"growing loop 40 steps {'default' if balanced is None else 'split'}"
        try:
            set_plan(balanced)
            q = torch.randn(B, 1, H, D, device=DEV).bfloat16().transpose(1, 2)
            k = torch.randn(B, HKV, 2047, D, device=DEV).bfloat16()
            v = torch.randn_like(k)
            bits = True
            for _ in range(40):
                k = torch.cat([k, torch.randn(B, HKV, 1, D, device=DEV).bfloat16()], 2)
                v = torch.cat([v, torch.randn(B, HKV, 1, D, device=DEV).bfloat16()], 2)
                poison()
                o, lse = oss.attention(q, k, v, causal=True, return_lse=True)
                lens = launch.uniform_lengths(B, k.shape[2], DEV)
                plan = next(iter(launch._calls.values())).last[1].plan
                o2, lse2 = launch.attention_split_kv(q, k, v, lens, None, True, SCALE, -1, -1, 0.0, plan)
                bits &= torch.equal(o, o2) and torch.equal(lse, lse2)
            e, _ = ref_err(o, lse, q, k, v, lens, None)
            res[name] = dict(ok=bits and e <= 1, bitwise=bits, ref_err_over_tol=e)
        except Exception as e:  # noqa: BLE001
            res[name] = dict(ok=False, error=err_head(e))
            traceback.print_exc(limit=3)
    set_plan(None)


def check_graph(res):
    S = 4096
    for page in (0, 16):
        name = f"graph capture after lanes {'paged16' if page else 'dense'}"
        try:
            k, v, sl, bt = make_cache(S, [S] * B, page)
            q = torch.randn(B, H, 1, D, device=DEV).bfloat16()
            for _ in range(2):
                oss.attention_with_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                og, lg = oss.attention_with_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
            bits, worst = True, 0.0
            for lens in ([S] * B, [1, 17, 4000, 2, 9, 4095, 3000, 5]):
                sl.copy_(torch.tensor(lens, dtype=torch.int32))
                og.fill_(float("nan"))
                graph.replay()
                o, lse = oss.attention_with_kvcache(q, k, v, sl, block_table=bt, return_lse=True)
                torch.cuda.synchronize()
                bits &= torch.equal(og, o) and torch.equal(lg, lse)
                worst = max(worst, ref_err(og, lg, q, k, v, sl, bt)[0])
            res[name] = dict(ok=bits and worst <= 1, bitwise=bits, ref_err_over_tol=worst)
        except Exception as e:  # noqa: BLE001
            res[name] = dict(ok=False, error=err_head(e))
            traceback.print_exc(limit=3)


# ---- timing -----------------------------------------------------------------------------------------------------
def main_route(q, k, v):
    """main's launches: the BoundKernel route with uniform_lengths' fill, as attention() ran it (its checks too)."""
    aapi._prepare(q, k, v, True, None, None, None, None)
    aapi._decode_call(q, k, v)
    lens = launch.uniform_lengths(q.shape[0], k.shape[2], q.device)
    return launch.attention_split_kv(q, k, v, lens, None, True, SCALE, -1, -1, 0.0, need_lse=False)[0]


def new_route(q, k, v):
    return oss.attention(q, k, v, causal=True)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def growing(fn, steps, S0=2048):
    """(host µs per call, wall µs per step) of fn(q, k, v) as k / v grow by one key a step (torch.cat), the second of
    two passes (probe_util.attention_loop)."""
    return attention_loop(fn, steps, S0, B, H, HKV, D)


def kvcache_loop(route, steps, S0=2048):
    """attention_with_kvcache on a preallocated cache: the new key written in place and cache_seqlens += 1 each step
    (outside the host timer, inside the wall)."""
    S_max = S0 + steps + 16
    q = torch.randn(B, H, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, HKV, S_max, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    new = torch.randn(B, HKV, D, device=DEV, dtype=torch.bfloat16)
    out = {}
    for _ in range(2):
        sl = torch.full((B,), S0, dtype=torch.int32, device=DEV)
        torch.cuda.synchronize()
        host = 0.0
        t0 = time.perf_counter()
        for i in range(steps):
            k[:, :, S0 + i] = new
            v[:, :, S0 + i] = new
            sl.add_(1)
            t1 = time.perf_counter()
            route(q, k, v, sl)
            host += time.perf_counter() - t1
        torch.cuda.synchronize()
        out = dict(host_us=host / steps * 1e6, step_us=(time.perf_counter() - t0) / steps * 1e6)
    return out


def fixed(fn, n=1000, S=2100):
    """host µs per call at one length (no cat between calls), the mean of n, after 20 warm-up calls."""
    q = torch.randn(B, H, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, HKV, S, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for _ in range(20):
        fn(q, k, v)
    torch.cuda.synchronize()
    clock = time.perf_counter
    host = 0.0
    for _ in range(n):
        t1 = clock()
        fn(q, k, v)
        host += clock() - t1
        if _ % 64 == 63:
            torch.cuda.synchronize()            # the queue never fills
    torch.cuda.synchronize()
    return host / n * 1e6


def timings(res):
    def kv_new(q, k, v, sl):
        return oss.attention_with_kvcache(q, k, v, sl)

    def kv_bound(q, k, v, sl):
        return launch.attention_split_kv(q, k, v, sl, None, True, SCALE, -1, -1, 0.0, need_lse=False)[0]

    rows = {"main route (BoundKernel, uniform_lengths)": main_route, "new route (oss.attention, DecodeCall)":
            new_route, "SDPA": sdpa}
    for name, fn in rows.items():
        try:
            g512 = growing(fn, 512)
            g128 = growing(fn, 128)
            res[name] = dict(host_us_512=g512["host_us"], host_us_128=g128["host_us"], step_us_128=g128["step_us"],
                             host_us_fixed=fixed(fn))
        except Exception as e:  # noqa: BLE001
            res[name] = dict(error=err_head(e))
            traceback.print_exc(limit=3)
    for name, fn in (("kvcache new (attention_with_kvcache)", kv_new),
                     ("kvcache bound route (attention_split_kv)", kv_bound)):
        try:
            g512 = kvcache_loop(fn, 512)
            g128 = kvcache_loop(fn, 128)
            res[name] = dict(host_us_512=g512["host_us"], host_us_128=g128["host_us"], step_us_128=g128["step_us"])
        except Exception as e:  # noqa: BLE001
            res[name] = dict(error=err_head(e))
            traceback.print_exc(limit=3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit,
                date=time.strftime("%Y-%m-%d %H:%M"))
    import triton
    meta["triton"] = triton.__version__
    checks, times = {}, {}
    for fn in (check_lanes, check_loop, check_graph):
        try:
            fn(checks)
        except Exception as e:  # noqa: BLE001
            checks[fn.__name__] = dict(ok=False, error=err_head(e))
        print(f"[{time.time() - t0:5.1f} s] {fn.__name__}", flush=True)
    timings(times)
    print(f"[{time.time() - t0:5.1f} s] timings", flush=True)
    out = dict(meta=meta, checks=checks, times=times, seconds=time.time() - t0)
    with open(os.path.join(args.out, "probe_dechost2.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n{meta}")
    print("checks (ref_err_over_tol <= 1: within the tests' bf16 tolerance; bitwise: lanes == BoundKernel route)")
    for name, r in checks.items():
        extra = r.get("error") or f"bitwise {r.get('bitwise')} ref/tol {r.get('ref_err_over_tol', 0):.3f}"
        print(f"  {'OK  ' if r.get('ok') else 'FAIL'} {name:48s} {extra}")
    print("\nq [8, 32, 1, 128] bf16, k / v [8, 8, S, 128], S from 2048: host µs per call (no sync), wall µs per step")
    print(f"  {'route':44s} {'host512':>8s} {'host128':>8s} {'fixed':>8s} {'step128':>8s}")
    for name, r in times.items():
        if "error" in r:
            print(f"  {name:44s} ERROR {r['error']}")
            continue
        fx = r.get("host_us_fixed", float("nan"))
        print(f"  {name:44s} {r['host_us_512']:8.1f} {r['host_us_128']:8.1f} {fx:8.1f} {r['step_us_128']:8.1f}")
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
