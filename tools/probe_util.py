"""What the probes share: error summaries, the comparisons their checks make, their inputs, references, timers
(``bench_ms``, ``bench`` / ``bench_graph``, ``copy_ceiling``), CUDA kernel times per call (``kernel_times``), and the
attention backward / decode / forward probes' check, compile-report and table helpers. Imported by the probes run as
``python tools/probe_x.py`` (their folder is first on sys.path, and their spawned workers inherit it)."""

from __future__ import annotations

import math
import traceback


def err_head(e: BaseException) -> str:
    """The first three lines of ``repr(e)``, at most 240 characters."""
    return " | ".join(repr(e).splitlines()[:3])[:240]


def err_line(e: BaseException) -> str:
    """The first three non-blank lines of the exception's last traceback line, at most 300 characters."""
    lines = [ln for ln in traceback.format_exception_only(type(e), e)[-1].splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:300]


def rel(a, b) -> float:
    """max |a − b| / max |b| over b's finite entries; inf when the finite patterns differ (a NaN: unwritten)."""
    import torch
    a, b = a.float(), b.float()
    fin = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), fin):
        return float("inf")
    if not fin.any():
        return 0.0
    return ((a[fin] - b[fin]).abs().max() / b[fin].abs().max().clamp_min(1e-6)).item()


def rel_norm(a, b) -> float:
    """‖a − b‖ / ‖b‖."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def poisoned(fn, shapes):
    """fn() after NaN-filled blocks of the outputs' sizes went back to the caching allocator (its torch.empty
    outputs reuse them); raises if any of its outputs (dq, dk, dv) has a NaN / inf."""
    import torch
    junk = [torch.full(s, float("nan"), device="cuda", dtype=dt) for s, dt in shapes]
    del junk
    out = fn()
    for name, t in zip(("dq", "dk", "dv"), out):
        if not torch.isfinite(t).all():
            raise RuntimeError(f"{name} has NaN / inf (unwritten or wrong)")
    return out


def inputs(B, H, Hkv, Sq, Sk, D, device, seed=0):
    """bf16 q, k, v, dO ([B, H, S, D] / [B, Hkv, S, D]) from a seeded generator on ``device``."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, H, Sq, D, device=device, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, Sk, D, device=device, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, Sk, D, device=device, dtype=torch.bfloat16, generator=g)
    do = torch.randn(B, H, Sq, D, device=device, dtype=torch.bfloat16, generator=g)
    return q, k, v, do


def forward(q, k, v, causal, window=None):
    """(o, lse) by the public call (whatever forward the plan picks: only the backward is probed)."""
    import onlinesoftmax as oss
    return oss.attention(q, k, v, causal=causal, window=window, return_lse=True, backend="triton")


def ref_backward(q, k, v, do, causal, window=None):
    """fp32 torch backward from the bf16 inputs (GQA by repeating k / v; the band aligned bottom-right)."""
    import torch
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = (qf @ kf.repeat_interleave(g, 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    Sq, Sk = q.shape[2], k.shape[2]
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=q.device)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= i
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
    s = s.masked_fill(~keep, -math.inf)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vf.repeat_interleave(g, 1)
    return torch.autograd.grad(o, (qf, kf, vf), do.float())


def ref_attention(q, k, v, causal, window, softcap):
    """(o, lse) of the torch path in fp32 from the inputs (the forward probes' reference)."""
    from onlinesoftmax.attention import api
    left, right = window
    return api._torch_attention(q.float(), k.float(), v.float(), q.shape[-1] ** -0.5, left, 0 if causal else right,
                                softcap)


def bad_result(r) -> bool:
    """A check's result is an error text or a relative error above 2e-2."""
    return isinstance(r, str) or not (max(r) <= 2e-2)


def poison():
    """NaN through the caching allocator's free blocks: an output the kernel leaves unwritten shows."""
    import torch
    x = torch.full((96 << 20,), float("nan"), dtype=torch.float32, device="cuda")
    del x


def bench_ms(fn, sets, warmup=10, rep=40):
    """do_bench median (ms) of fn over the input sets in turn (eager: host and device time)."""
    from triton.testing import do_bench
    state = [0]

    def call():
        state[0] += 1
        return fn(*sets[state[0] % len(sets)])
    return do_bench(call, warmup=warmup, rep=rep, return_mode="median")


def kernel_times(fn, calls: int = 10, width: int = 70) -> dict:
    """µs of CUDA time per call of ``fn`` by kernel name (its first ``width`` characters), from torch.profiler over
    ``calls`` calls after one warm-up call."""
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:width]] += e.device_time / calls
    return dict(out)


# ---- the attention backward probes (probe_attnbwd*.py, probe_bwdpers.py) ------------------------------------------
def varlen_backward(lens, H, Hkv, D, kw, seed, p, plan):
    """(got, want) gradients on packed sequences of ``lens``: the backward of ``plan`` (problem ``p``) vs fp32 torch
    per sequence."""
    import torch

    import onlinesoftmax as oss
    from onlinesoftmax.attention import api
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    S = max(lens)
    o, lse = oss.attention_varlen(q, k, v, cu, cu, S, S, return_lse=True, backend="triton", **kw)
    causal = kw.get("causal", False)
    shapes = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
    got = poisoned(lambda: api._backward_triton(do, None, q, k, v, o, lse, p, plan, D ** -0.5, 0.0, (cu, cu)), shapes)
    want = [torch.zeros(t.shape, dtype=torch.float32, device="cuda") for t in (q, k, v)]
    for b, n in enumerate(lens):
        if n == 0:
            continue
        s0 = int(cu[b])
        sl = slice(s0, s0 + n)
        qs, ks, vs, ds = (t[sl].transpose(0, 1).unsqueeze(0) for t in (q, k, v, do))
        for w, gi in zip(want, ref_backward(qs, ks, vs, ds, causal, kw.get("window"))):
            w[sl] = gi[0].transpose(0, 1)
    return got, want


def record_launches(descriptors=False) -> list:
    """The kernel launches from here on recorded as (fn, args, meta, TMA boxes), not run (``descriptors``: the
    DescriptorKernel ones too); the api's TMA check and allocator stubbed out for meta tensors."""
    from onlinesoftmax._triton import launch
    from onlinesoftmax.attention import api
    recorded = []
    launch.BoundKernel.__call__ = lambda self, args, check, device: recorded.append((self.fn, args, self.meta, ()))
    if descriptors:
        launch.DescriptorKernel.__call__ = lambda self, args, check, device: recorded.append(
            (self.fn, args, self.meta, self.boxes))
    api._tma_ok = lambda *ts: True                       # meta tensors have no data pointer
    api._ensure_allocator = lambda: None
    return recorded


def meta_backward_inputs(B, H, Hkv, S, D):
    """bf16 q, k, v, dO, o and fp32 lse of a backward call on the meta device."""
    import torch
    q, do = (torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
    k, v = (torch.empty(B, Hkv, S, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
    return q, k, v, do, torch.empty_like(q), q.new_empty((B, H, S), dtype=torch.float32)


def compile_launches(recorded, seen, skip=(), strict=False, extra=None):
    """(kernel name, 'regs … stack … smem … KB' or 'FAILED …') of each recorded launch compiled for sm_90a, once per
    specialisation (``seen``: their keys); kernels whose name holds a ``skip`` word are passed over; ``strict``: assert
    every runtime parameter has its argument; ``extra(compiled)``: more text after the resources."""
    import json
    import os
    import re
    import subprocess
    import tempfile

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    ptr = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
           torch.int64: "*i64"}
    nvbin = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for fn, args, meta, boxes in recorded:
        sig, const, attrs = {}, {}, {}
        runtime = [p for p in fn.params if not p.is_constexpr]
        if strict:
            assert len(runtime) == len(args), (fn.__name__, len(runtime), len(args))
        for j, (p, a) in enumerate(zip(runtime, args)):
            i = fn.arg_names.index(p.name)
            if j < len(boxes):          # a host TMA descriptor over a (block shape, layout)
                sig[p.name] = f"tensordesc<{ptr[a.dtype][1:]}{boxes[j][0]},{boxes[j][1]!r}>"
            elif isinstance(a, torch.Tensor):
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
        opts = {k_: meta[k_] for k_ in ("num_warps", "num_stages", "maxnreg") if k_ in meta}
        key = (fn.__name__, json.dumps(sorted((k_, str(v_)) for k_, v_ in const.items())), str(attrs), str(opts))
        if key in seen or any(w in fn.__name__ for w in skip):
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
            if extra is not None:
                out += f" {extra(c)}"
        except Exception as e:
            out = f"FAILED {err_line(e)}"
        yield fn.__name__, out


def compile_backward(variants, shapes, backward, descriptors=False, strict=False, extra=None):
    """--compile-only of the variant-by-head-dim probes: each (variant, H / Hkv, D, causal) of ``shapes`` at B = 1,
    S = 1024 through ``backward(name, q, k, v, do, o, lse, causal)`` on meta tensors; every new launch's sm_90a
    registers / stack / shared memory printed (Δ and dQ's cast left out; ``strict``, ``extra``: compile_launches')."""
    import os
    os.environ.pop("TRITON_INTERPRET", None)
    recorded = record_launches(descriptors)
    seen = set()
    for name in variants:
        for B, H, Hkv, S, D, causal in sorted({(1, H, Hkv, 1024, D, c) for _, H, Hkv, _, D, c in shapes}):
            if D not in variants[name][1]:
                continue
            q, k, v, do, o, lse = meta_backward_inputs(B, H, Hkv, S, D)
            recorded.clear()
            try:
                backward(name, q, k, v, do, o, lse, causal)
            except Exception as e:
                print(f"{name:18} D={D} causal={causal!s:5}: {err_line(e)}", flush=True)
                continue
            for kname, out in compile_launches(recorded, seen, skip=("delta", "cast"), strict=strict, extra=extra):
                print(f"{name:18} H{H}/{Hkv} D={D:3} causal={causal!s:5} {kname:28} {out}", flush=True)


def matmul_tflops(rep):
    """bf16 8192² matmul TFLOP/s (do_bench median over ``rep`` ms): what the device's tensor cores reach."""
    import torch
    from triton.testing import do_bench
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / (do_bench(lambda: a @ a, rep=rep, return_mode="median") * 1e-3) / 1e12


def record_check(report, bad, key, tag, fn, wrong=lambda m: m > 2e-2):
    """report["check"][key]: the relative errors of fn()'s (got, want) dq / dk / dv, or its error; ``tag`` into
    ``bad`` when the worst is ``wrong`` or fn raised."""
    try:
        got, want = fn()
        errs = [rel_norm(x, y) for x, y in zip(got, want)]
        report["check"][key] = errs
        if wrong(max(errs)):
            bad.add(tag)
            print(f"WRONG {key}: rel err dq/dk/dv {errs}", flush=True)
    except Exception as e:
        bad.add(tag)
        report["check"][key] = err_line(e)
        print(f"FAILED {key}: {err_line(e)}", flush=True)


def sdpa_backward_ms(q, k, v, do, causal, row, rep):
    """SDPA cuDNN's and flash's backward (do_bench medians over ``rep`` ms) into row["ms"], errors into row["err"]."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench
    peers = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for pname, be in peers.items():
        try:
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(be):
                og = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                                                      enable_gqa=q.shape[1] != k.shape[1])
            f = lambda og=og, ins=(qg, kg, vg): torch.autograd.grad(og, ins, do, retain_graph=True)  # noqa: E731
            f()
            row["ms"][pname] = do_bench(f, rep=rep, return_mode="median")
        except Exception as e:
            row["err"][pname] = err_line(e)
        og = qg = kg = vg = f = None


def print_rows_x_cudnn(report):
    """The TFLOP/s rows of a backward report, each over cuDNN's in brackets."""
    for r in report["rows"]:
        B, H, Hkv, S, D = r["shape"]
        t = r["tflops"]
        lab = f"{B},{H}/{Hkv},{S},{D}{' c' if r['causal'] else ''}"
        cud = t.get("cudnn")
        cells = " ".join(f"{n.replace(' ', '_')}={v:.0f}" + (f"({v / cud:.2f})" if cud else "")
                         for n, v in t.items())
        print(f"{lab:20} {cells}")


def print_check_summary(report, names, width, wrong=lambda m: m > 2e-2):
    """A backward report's errors (the first 8 timing ones, every failed check) and each variant's passed checks
    with its worst relative error."""
    errs = {f"{k} @ {r['shape']} c={r['causal']}": v for r in report["rows"] for k, v in r["err"].items()
            if isinstance(v, str)}
    for k, v in list(errs.items())[:8]:
        print(f"error {k}: {v}")
    for k, v in report["check"].items():
        if isinstance(v, str) or wrong(max(v)):
            print(f"check {k}: {v}")
    for name in names:
        vals = [max(v) for k, v in report["check"].items() if k.startswith(name + " |") and not isinstance(v, str)]
        print(f"check {name:<{width}}: {len(vals)} cases passed, worst rel err vs fp32 torch "
              f"{max(vals) if vals else float('nan'):.2e}")


def compile_or_run(doc, compile_only, device_run):
    """The backward probes' command line: ``--out DIR`` (default $OUT) for ``device_run``, or ``--compile-only``."""
    import argparse
    import os
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--compile-only", action="store_true", help="sm_90a compile of every variant's launches, no GPU")
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
    else:
        device_run(a.out)


# ---- the decode probes (probe_decode*.py and the ones importing probe_decode2) ------------------------------------
def log(*a):
    """print, flushed."""
    print(*a, flush=True)


def err_lines(e: BaseException, n: int = 3) -> str:
    """The first ``n`` non-blank lines of the exception's last traceback line, at most 400 characters."""
    lines = [ln for ln in "".join(traceback.format_exception_only(type(e), e)).splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:400]


def sync(dev):
    """torch.cuda.synchronize() when ``dev`` is "cuda"."""
    import torch
    if dev == "cuda":
        torch.cuda.synchronize()


def bench(fn, dev, warmup, rep):
    """ms of fn: on "cuda", do_bench's median after one call; elsewhere (--smoke: the interpreter) one call's time."""
    import time

    import triton.testing

    if dev != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    fn()
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def bench_graph(fn, dev, bench):
    """fn captured once into a CUDA graph, its replays timed by ``bench``; None off "cuda"."""
    import torch
    if dev != "cuda":
        return None
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return bench(g.replay)


def copy_ceiling(dev, bench, cpu_log2):
    """GB/s of a 1 GiB device copy (2^cpu_log2 bytes off "cuda"), read and write counted, timed by ``bench``."""
    import torch
    x = torch.empty(1 << (30 if dev == "cuda" else cpu_log2), dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    return 2 * x.numel() / bench(lambda: y.copy_(x)) / 1e6


def lengths(dist, B, S, gen, base):
    """B sequence lengths in [1, S]: ``full``, ``uni`` (uniform), ``skew`` (B/8 of S, the rest uniform in [1, S/16]),
    ``uni=`` / ``skew=`` (the uniform batch of base["uni"] / base["skew"]'s total)."""
    import torch
    if dist == "full":
        return [S] * B
    if dist in ("uni=", "skew="):
        src = base[dist[:-1]]
        return [max(1, round(sum(src) / B))] * B
    if dist == "uni":
        return torch.randint(1, S + 1, (B,), generator=gen).tolist()
    long = max(1, B // 8)
    return [S] * long + torch.randint(1, max(2, S // 16) + 1, (B - long,), generator=gen).tolist()


def paged_cache(B, Hkv, S, page, D, dtype, gen, dev, nan_spare=True):
    """k, v ``[B·S/page + 3, Hkv, page, D]`` and a shuffled block table; the 3 spare pages NaN (``nan_spare``)."""
    import torch
    n = S // page
    perm = torch.randperm(B * n, generator=gen).to(dev).int().reshape(B, n)
    out = []
    for _ in range(2):
        c = torch.randn(B * n + 3, Hkv, page, D, device=dev, dtype=dtype)
        if nan_spare:
            c[-3:] = float("nan")
        out.append(c)
    return out[0], out[1], perm.contiguous()


def decode_check_inputs(B, Hkv, S, G, Sq, page, D, gen, dev):
    """lens, seqlens, q and the bf16 k, v, block table (None: dense) of a decode check: lengths 0 / 1 / odd / full and
    random (Sq > 1: at least Sq), NaN in every slot past a length and in the spare pages (page 16 / 256 shuffled)."""
    import torch
    lens = [0 if Sq == 1 else Sq, 1 if Sq == 1 else Sq + 1, S, 3, S - 1] + torch.randint(
        Sq, S, (B - 5,), generator=gen).tolist()
    lens = [n | 1 if 0 < n < S else n for n in lens]
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(B, G * Hkv, Sq, D, device=dev, dtype=torch.bfloat16)
    if page:
        k, v, bt = paged_cache(B, Hkv, S, page, D, torch.bfloat16, gen, dev)
        for c in (k, v):
            for b, n in enumerate(lens):
                j = torch.arange(n, S, device=dev)
                c[bt[b].long()[j // page], :, j % page] = float("nan")
    else:
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        bt = None
        for b, n in enumerate(lens):
            k[b, :, n:] = float("nan")
            v[b, :, n:] = float("nan")
    return lens, sl, q, k, v, bt


def attention_loop(fn, steps=128, S0=2048, B=8, H=32, Hkv=8, D=128):
    """(host µs per call, wall µs per step with the device) of fn(q, k, v) as k / v grow by one key per step
    (torch.cat, as transformers' DynamicCache does), the second of two passes."""
    import time

    import torch
    dev = torch.device("cuda")
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k0 = torch.randn(B, Hkv, S0, D, device=dev, dtype=torch.bfloat16)
    v0 = torch.randn_like(k0)
    new = torch.randn(B, Hkv, 1, D, device=dev, dtype=torch.bfloat16)
    out = {}
    for _rep in range(2):                    # the first pass compiles and fills the caches
        k, v = k0, v0
        torch.cuda.synchronize()
        host = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            k, v = torch.cat([k, new], 2), torch.cat([v, new], 2)
            t1 = time.perf_counter()
            fn(q, k, v)
            host += time.perf_counter() - t1
        torch.cuda.synchronize()
        out = dict(host_us=host / steps * 1e6, step_us=(time.perf_counter() - t0) / steps * 1e6)
    return out


# ---- the attention forward probes (probe_fwd*.py) -----------------------------------------------------------------
def check_case(case, D, g, forward, knobs):
    """(rel. error of o, of lse) vs fp32 torch of ``forward(q, k, v, causal, window, softcap, knobs)`` on one of the
    forward probes' CASES at head dim D (fresh inputs from ``g``, outputs poisoned first), or the error's head."""
    import torch
    cname, B, H, Hkv, Sq, Sk, causal, window, softcap, dt, layout = case
    try:
        dtype = getattr(torch, dt)
        shp = (lambda h, s: (B, s, h, D)) if layout == "bshd" else (lambda h, s: (B, h, s, D))
        q, k, v = (torch.randn(shp(h, s), device="cuda", dtype=dtype, generator=g)
                   for h, s in ((H, Sq), (Hkv, Sk), (Hkv, Sk)))
        if layout == "bshd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        ro, rl = ref_attention(q, k, v, causal, window, softcap)
        poison()
        o, lse = forward(q, k, v, causal, window, softcap, knobs)
        torch.cuda.synchronize()
        return rel(o, ro), rel(lse, rl)
    except Exception as e:  # noqa: BLE001
        return err_head(e)


def run_checks(worker, jobs, deadline_s, report, width):
    """``worker`` on every job in spawned processes: report["checks"][name] = its seconds and results; the names
    whose results all pass (a worker that errs or does not report within ``deadline_s``, a hang, is left out)."""
    import multiprocessing as mp
    import time
    ok = set()
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        it = pool.imap_unordered(worker, jobs)
        deadline = time.time() + deadline_s
        for _ in jobs:
            try:
                name, secs, res = it.next(timeout=max(1.0, deadline - time.time()))
            except Exception as e:  # noqa: BLE001
                print(f"check workers incomplete: {err_head(e)}", flush=True)
                break
            report["checks"][name] = dict(s=secs, results=res)
            bad = {k: r for k, r in res.items() if bad_result(r)}
            if not bad:
                ok.add(name)
            print(f"check {name:{width}} {secs:5.1f} s {'ok' if not bad else 'FAIL ' + str(bad)[:400]}", flush=True)
        pool.terminate()
    return ok


def print_checks(report, width):
    """Each check worker's worst relative errors of (o, lse) and its failures."""
    print("\n== checks: worst relative error of (o, lse) vs fp32 torch over the cases (> 2e-2 or text: FAIL)")
    for name, c in report["checks"].items():
        worst = [r for r in c["results"].values() if not isinstance(r, str)]
        fails = {k: r for k, r in c["results"].items() if bad_result(r)}
        print(f"  {name:{width}} worst o {max((r[0] for r in worst), default=0):.2e} lse "
              f"{max((r[1] for r in worst), default=0):.2e}  {'FAIL ' + str(fails)[:300] if fails else 'ok'}")


def print_tflops_x_cudnn(report):
    """The TFLOP/s rows, each over SDPA cuDNN's in brackets."""
    print("\n== TFLOP/s (bf16; x cuDNN in brackets)")
    for r in report["rows"]:
        cud = r.get("sdpa cudnn")
        cells = []
        for k, val in r.items():
            if k in ("shape", "causal"):
                continue
            if isinstance(val, float) and isinstance(cud, float):
                cells.append(f"{k} {val:.0f} ({val / cud:.2f})")
            else:
                cells.append(f"{k} {str(val)[:60]}")
        print(f"  {r['shape']:16} {'causal' if r['causal'] else 'nc    '} " + " | ".join(cells))


def run_main(main):
    """main(); an exception's traceback printed before it propagates (the device log keeps it)."""
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        raise
