"""Host time of the decode loop transformers runs on ``oss.attention``, measured on a machine without a GPU.

examples/transformers_llama.py decodes 256 tokens at batch 8 from a 2048-token prompt on a Llama-3-8B-shaped model
(4 layers, bf16): 1024 attention calls, q ``[8, 32, 1, 128]`` (a ``[B, 1, H, D]`` projection transposed), k / v of
transformers' DynamicCache ``[8, 8, S, 128]`` (contiguous: ``torch.cat`` each step), S = 2049 ... 2304 (each layer
sees the same S once per token). This replays that loop on CPU tensors as it would run on an H200:

* the kernels are Triton ``JITFunction``s (no ``TRITON_INTERPRET``): a launch that takes Triton's own path
  (``fn[grid](...)``: argument binding, specialisation, the kernel-cache key, launch metadata) runs it for real
  against a stub driver (sm_90 target) whose "compile" is a stub kernel and whose launcher is a no-op that mimics
  ``CudaLauncher.__call__``; a :class:`BoundKernel` replays the stub through its own fast path;
* ``target_of`` is the H200, ``resolve_backend`` says "triton" for these CPU tensors, the launch module's current
  device / stream are 0.

Left out (the same on either tree's path, or the GPU's alone): the C launcher's argument parsing and the driver's
launch; CUDA's allocation and fill kernels behind ``torch.empty`` / ``torch.full`` (CPU ones here: see the op
counts, which say how many of each a call makes); ``torch.cuda.is_current_stream_capturing`` (a CPU device never
asks).

Checks, beside the times: every launch a bound kernel replays must be the variant Triton's own path would have picked
for those arguments (the kernel-cache key ``JITFunction.run`` computes, constexprs and the specialisation of every
run-time integer and pointer: a mismatch is a wrong kernel on the GPU), and the set of (kernel, key) the loop
launches, i.e. the kernels the GPU runs, is printed so that two trees can be compared (``--keys FILE``).

    PYTHONPATH=src python tools/hostcost_decode_cpu.py [--tokens 256] [--layers 4] [--keys FILE]
    PYTHONPATH=/work/main/src python tools/hostcost_decode_cpu.py          # another tree, for before / after

Passes: ``warm-up`` (S = 4096 ... 4127: every Triton variant seen, nothing of the loop's S), ``first`` (the loop's S,
never seen: what a server meets), ``again`` (the same S once more: what the example's timed runs meet, its warm-up
run having seen them). µs per call: the mean over the loop's calls of each call's least time in ``--reps`` runs of
a pass (fresh caches for ``first`` each time): what a quiet machine gives, on a machine other work shares.
``--check``: no timing; growing lengths over several shapes and dtypes, exit 1 on a replayed variant that is not
Triton's own (tests/decode/test_host_reuse.py runs it).
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import os
import sys
import time
import types

os.environ.pop("TRITON_INTERPRET", None)      # JITFunctions, not the interpreter

import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.jit as tjit  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import LazyDict  # noqa: E402

CUDA0 = torch.device("cuda", 0)
SM90 = GPUTarget("cuda", 90, 32)
B, H, HKV, D = 8, 32, 8, 128


# ---- the stub GPU -------------------------------------------------------------------------------------------
class StubDriver:
    """What ``JITFunction.run`` asks of the active driver."""

    utils = types.SimpleNamespace(fill_tma_descriptor=lambda *a: ("map",))

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return SM90


def _launch(gx, gy, gz, stream, function, coop, pdl, gscratch, pscratch, packed, meta, enter, exit_, *args):
    """The C launcher's Python-visible work: the enter / exit hooks (Triton's own path passes its HookChain)."""
    if enter is not None and meta is not None:
        enter(meta)
    if exit_ is not None and meta is not None:
        exit_(meta)


class StubRun:
    """``CudaLauncher``: its ``__call__`` (scratch sizes, then ``launch``) around the no-op above."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False
    launch = staticmethod(_launch)

    def __call__(self, gx, gy, gz, stream, function, *args):
        def scratch(size):
            return None if size <= 0 else size
        g, p = scratch(self.global_scratch_size), scratch(self.profile_scratch_size)
        self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl, g, p, *args)


class StubKernel:
    """A compiled kernel: what ``JITFunction.run`` and ``BoundKernel._bind`` read, and the cache key it was
    "compiled" for."""

    def __init__(self, fn, key):
        self.fn, self.key, self.name = fn, key, fn.__name__
        self.function, self.packed_metadata, self.run = 0, (4, 1, 0), StubRun()

    def launch_metadata(self, grid, stream, *args):     # CompiledKernel.launch_metadata, its handles loaded
        if triton.knobs.runtime.launch_enter_hook is None:
            return None
        return LazyDict({"name": self.name, "function": self.function, "stream": stream})


class Recorder:
    """Per kernel: Triton's own path (launches, "compiles"), and each launch's key as Triton would compute it."""

    def __init__(self):
        self.compiles = collections.Counter()
        self.keys = set()           # (kernel, key) launched
        self.check = False
        self.mismatches = []

    def key_of(self, fn, args, meta):
        """The kernel-cache key ``JITFunction.run`` computes for ``fn[grid](*args, **meta)``."""
        kernel_cache, key_cache, _, _, binder = fn.device_caches[0]
        kw = dict(meta)
        kw["debug"] = kw.get("debug", fn.debug) or triton.knobs.runtime.debug
        kw["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
        _, specialization, options = binder(*args, **kw)
        return tjit.compute_cache_key(key_cache, specialization, options)


REC = Recorder()


def stub_gpu(modules) -> None:
    """Patch Triton and the package as the module docstring says; ``modules``: the package's loaded modules."""
    triton.runtime.driver.set_active(StubDriver())
    jits = set()
    for m in modules:
        for v in vars(m).values():
            if isinstance(v, tjit.JITFunction) and not getattr(v, "_stubbed", False):
                jits.add(v)
    for fn in jits:
        def compile_(key, signature, device, constexprs, options, attrs, warmup, fn=fn):
            kernel = StubKernel(fn, key)
            fn.device_caches[device][0][key] = kernel
            REC.compiles[fn.__name__] += 1
            return kernel
        fn._do_compile = compile_
        fn._stubbed = True
    from onlinesoftmax import target
    from onlinesoftmax._triton import launch

    real_target_of = target.target_of
    for m in modules:
        if m is not target and getattr(m, "target_of", None) is real_target_of:
            m.target_of = lambda device: target.H200
        if hasattr(m, "resolve_backend") and m.__name__ != "onlinesoftmax.backend":
            m.resolve_backend = lambda backend, x, op: backend or "triton"
    launch.current_device = lambda: 0
    launch.current_stream = lambda index: 0
    real_call = launch.BoundKernel.__call__

    def call(self, args, check, device):
        """On "cuda:0"; in check mode, the key of the kernel the launch replays against Triton's own."""
        compiled = real_call(self, args, check, CUDA0)
        if REC.check:
            want = REC.key_of(self.fn, args, self.meta)
            REC.keys.add((self.fn.__name__, want))
            if compiled.key != want:
                REC.mismatches.append((self.fn.__name__, compiled.key, want))
        return compiled

    launch.BoundKernel.__call__ = call


# ---- timing -------------------------------------------------------------------------------------------------
class Pieces:
    """Inclusive time per wrapped function (its label) and per decode call (``index``, set by ``run_pass``), for a
    breakdown pass; each wrapper costs ``overhead`` more."""

    def __init__(self):
        self.ns, self.calls, self.undo, self.index = {}, {}, [], 0

    def reset(self, n: int) -> None:
        for label in self.ns:
            self.ns[label], self.calls[label] = [0] * n, [0] * n

    def wrap(self, owner, name, label=None):
        fn = getattr(owner, name, None)
        if fn is None:
            return
        label = label or name
        self.ns.setdefault(label, [0])
        self.calls.setdefault(label, [0])
        clock, me = time.perf_counter_ns, self

        @functools.wraps(fn)
        def timed(*a, **k):
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                i = me.index
                me.ns[label][i] += clock() - t0
                me.calls[label][i] += 1
        setattr(owner, name, timed)
        self.undo.append((owner, name, fn))

    def unwrap(self):
        for owner, name, fn in reversed(self.undo):
            setattr(owner, name, fn)
        self.undo.clear()


def least(runs: list) -> list:
    """Per call index, the least of several runs' figures (the run least disturbed at that call)."""
    return [min(col) for col in zip(*runs)]


def overhead() -> float:
    """µs a Pieces wrapper adds per call (around a no-op), the least of 5 runs."""
    pieces = Pieces()
    box = types.SimpleNamespace(f=lambda: None)
    pieces.wrap(box, "f")
    pieces.reset(1)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(20000):
            box.f()
        best = min(best, (time.perf_counter_ns() - t0) / 2e4 / 1e3)
    pieces.unwrap()
    return best


def clear_caches(modules) -> None:
    """Every lru cache of the package (plans, bound launches, shape classes) and its decode memos: the state of a
    process that never saw these shapes; Triton's kernel caches stay (warm from the warm-up pass)."""
    for m in modules:
        for v in list(vars(m).values()):
            while not hasattr(v, "cache_clear") and hasattr(v, "__wrapped__"):     # under a Pieces wrapper
                v = v.__wrapped__
            if hasattr(v, "cache_clear") and getattr(v, "__module__", "").startswith("onlinesoftmax"):
                v.cache_clear()
        for name in ("_lengths",):
            memo = getattr(m, name, None)
            if isinstance(memo, dict):
                memo.clear()


def make_inputs(s_values, layers):
    """q and, per (S, layer), k / v views of one storage per layer (DynamicCache's contiguous ``[B, Hkv, S, D]``)."""
    q = torch.randn(B, 1, H, D).to(torch.bfloat16).transpose(1, 2)
    s_top = max(s_values)
    stores = [(torch.empty(B * HKV * s_top * D, dtype=torch.bfloat16),
               torch.empty(B * HKV * s_top * D, dtype=torch.bfloat16)) for _ in range(layers)]
    calls = []
    for S in s_values:
        shape, stride = (B, HKV, S, D), (HKV * S * D, S * D, D, 1)
        for ks, vs in stores:
            calls.append((S, ks.as_strided(shape, stride), vs.as_strided(shape, stride)))
    return q, calls


def run_pass(fn, q, calls, pieces: Pieces | None = None) -> list:
    """ns of each call ``fn(q, k, v)`` over ``calls`` (the views made before), in order."""
    gc.collect()
    gc.disable()
    clock, out = time.perf_counter_ns, []
    try:
        for i, (_, k, v) in enumerate(calls):
            if pieces is not None:
                pieces.index = i
            t0 = clock()
            fn(q, k, v)
            out.append(clock() - t0)
        return out
    finally:
        gc.enable()


def mean_us(ns: list) -> float:
    return sum(ns) / len(ns) / 1e3


def op_counts(fn, q, calls) -> dict:
    """aten ops per call (allocations, fills, copies: each a CUDA allocation or kernel on the GPU)."""
    from hostcost_util import AtenOps

    with AtenOps() as mode:
        for _, k, v in calls:
            fn(q, k, v)
    seen = collections.Counter(mode.ops)
    return {k: round(n / len(calls), 3) for k, n in sorted(seen.items())}


def check() -> int:
    """Growing S (across multiples of 16) through ``oss.attention`` for several shape classes and dtypes, then the
    first again: every launch's replayed variant against Triton's own key."""
    import onlinesoftmax as oss

    mods = [m for n, m in sys.modules.items() if n.startswith("onlinesoftmax") and m is not None]
    from onlinesoftmax.decode import launch  # noqa: F401  (the kernels, before the stubs)

    stub_gpu([m for n, m in sys.modules.items() if n.startswith("onlinesoftmax") and m is not None])
    REC.check = True
    cases = [(8, 32, 8, 128, torch.bfloat16), (8, 32, 8, 128, torch.float16), (4, 32, 8, 128, torch.bfloat16),
             (8, 16, 16, 64, torch.bfloat16), (2, 8, 1, 256, torch.float32), (300, 8, 8, 64, torch.bfloat16),
             (8, 32, 8, 128, torch.bfloat16)]
    for Bc, Hc, Hkvc, Dc, dt in cases:
        q = torch.randn(Bc, 1, Hc, Dc).to(dt).transpose(1, 2)
        for S in range(2049, 2068):         # decode dispatch: S - 1 >= 2048 keys
            store = torch.empty(Bc * Hkvc * S * Dc, dtype=dt)
            k = store.as_strided((Bc, Hkvc, S, Dc), (Hkvc * S * Dc, S * Dc, Dc, 1))
            oss.attention(q, k, k, causal=True)
            oss.attention(q, k[:, :, 1:], k[:, :, 1:], causal=True)      # a view: strides of S, shape S - 1
    del mods
    print(f"launches checked: {len(REC.keys)} (kernel, key) pairs; mismatches: {len(REC.mismatches)}")
    for m in REC.mismatches[:5]:
        print("  ", m[0])
    return 1 if REC.mismatches else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--keys", help="write the (kernel, Triton cache key) set the loop launches here (JSON)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--check", action="store_true", help="no timing: replay growing lengths over several shapes and "
                    "dtypes and exit 1 if a bound kernel replays another variant than Triton's own path would pick")
    args = ap.parse_args()
    if args.check:
        sys.exit(check())

    import onlinesoftmax as oss
    from onlinesoftmax.decode import api as dapi
    from onlinesoftmax.decode import launch as dlaunch
    from onlinesoftmax.integrations import transformers as osst

    mods = [m for n, m in sys.modules.items() if n.startswith("onlinesoftmax") and m is not None]
    stub_gpu(mods)
    module = types.SimpleNamespace(training=False, is_causal=True)
    scaling = D ** -0.5

    def integration(q, k, v):
        return osst.attention_forward(module, q, k, v, None, dropout=0.0, scaling=scaling, use_cache=True)

    def public(q, k, v):
        return oss.attention(q, k, v, causal=True, scale=scaling)

    lens = {}

    def kvcache(q, k, v):
        sl = lens.get(k.shape[2])
        if sl is None:
            sl = lens[k.shape[2]] = torch.full((B,), k.shape[2], dtype=torch.int32)
        return oss.attention_with_kvcache(q, k, v, sl, causal=True, scale=scaling, return_lse=True)

    entries = {"integration (attention_forward)": integration, "oss.attention": public,
               "attention_with_kvcache (cache_seqlens given)": kvcache}
    s_loop = list(range(args.prompt + 1, args.prompt + 1 + args.tokens))
    q, warm = make_inputs(list(range(4096, 4128)), args.layers)
    _, loop = make_inputs(s_loop, args.layers)
    mods = [m for n, m in sys.modules.items() if n.startswith("onlinesoftmax") and m is not None]

    REC.check = True
    for fn in entries.values():
        run_pass(fn, q, warm)
        run_pass(fn, q, loop)
    REC.check = False
    compiles_after_warmup = dict(REC.compiles)

    out = {"passes": {}, "pieces": {}, "ops per call": {}}
    for name, fn in entries.items():
        first, again = [], []
        for _ in range(args.reps):
            clear_caches(mods)
            run_pass(fn, q, warm)
            first.append(run_pass(fn, q, loop))
            again.append(run_pass(fn, q, loop))
        out["passes"][name] = {"first": mean_us(least(first)), "again": mean_us(least(again))}

    # the breakdown: inclusive µs per decode call of each wrapped piece, first and again passes
    from onlinesoftmax.attention import api as aapi

    pieces = Pieces()
    for owner, name in ((osst, "_attention"), (aapi, "_prepare"), (aapi, "_decode_call"), (aapi, "_decode_lengths"),
                        (dapi, "attention_with_kvcache"), (dapi, "_check_kvcache"), (dapi, "_kvcache_impl"),
                        (dlaunch, "attention_split_kv"), (dlaunch, "cached_plan"), (dlaunch, "_plan"),
                        (dlaunch, "_split_launches"), (dlaunch, "_balanced_launches"), (dlaunch, "_launches"),
                        (dlaunch, "_balanced"), (dlaunch, "stream_scratch"), (dlaunch, "uniform_lengths"),
                        (torch, "empty"), (torch, "full")):
        pieces.wrap(owner, name, f"{owner.__name__.split('.')[-1]}.{name}")
    jit_run = {}
    for m in mods:
        for v in vars(m).values():
            if isinstance(v, tjit.JITFunction) and v not in jit_run:
                jit_run[v] = v.run
                pieces.wrap(v, "run", "triton JITFunction.run (own path)")
    from onlinesoftmax._triton import launch

    pieces.wrap(launch.BoundKernel, "__call__", "BoundKernel.__call__ (incl. own path)")
    pieces.wrap(launch.BoundKernel, "__init__", "BoundKernel.__init__")
    n = len(loop)
    for label in ("first", "again"):
        runs = {k: [] for k in pieces.ns}
        for _ in range(args.reps):
            clear_caches(mods)
            run_pass(integration, q, warm)
            if label == "again":
                run_pass(integration, q, loop)
            pieces.reset(n)
            run_pass(integration, q, loop, pieces)
            for k in pieces.ns:
                runs[k].append(pieces.ns[k])
            calls = {k: sum(c) / n for k, c in pieces.calls.items()}
        out["pieces"][label] = {k: (mean_us(least(r)), calls[k]) for k, r in runs.items() if calls[k]}
    pieces.unwrap()
    for v in jit_run:
        v.__dict__.pop("run", None)
    clear_caches(mods)
    run_pass(integration, q, warm)
    out["ops per call"]["first"] = op_counts(integration, q, loop)
    out["ops per call"]["again"] = op_counts(integration, q, loop)

    out["triton own-path compiles (variants)"] = compiles_after_warmup
    out["keys launched"] = sorted(map(list, REC.keys))
    out["key mismatches"] = [list(m) for m in REC.mismatches]
    if args.keys:
        with open(args.keys, "w") as f:
            json.dump(sorted(map(list, REC.keys)), f, indent=0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)

    print(f"decode loop: B {B}, H {H} / {HKV}, D {D}, bf16, S {s_loop[0]}..{s_loop[-1]} x {args.layers} layers "
          f"= {len(loop)} calls; torch {torch.__version__}, triton {triton.__version__}")
    print(f"kernels launched (kernel, Triton key): {len(REC.keys)} distinct; stub compiles {compiles_after_warmup}")
    print(f"bound-kernel replays whose Triton key differs from Triton's own: {len(REC.mismatches)}")
    for label in ("first", "again"):
        print(f"\npieces, pass '{label}' (integration entry; inclusive µs per attention call, calls per call):")
        for k, (us, c) in sorted(out["pieces"][label].items(), key=lambda kv: -kv[1][0]):
            print(f"  {k:48s} {us:8.1f} µs  x{c:g}")
        print(f"  aten ops per call: {out['ops per call'][label]}")
    print(f"\n(each wrapper adds about {overhead():.2f} µs to the pieces around it)")
    print("\nµs per attention call (each call's least of --reps runs, mean over the loop; no wrappers)")
    print(f"  {'entry':48s} {'first':>8s} {'again':>8s}")
    for name, t in out["passes"].items():
        print(f"  {name:48s} {t['first']:8.1f} {t['again']:8.1f}")
    if REC.mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
