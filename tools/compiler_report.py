"""Compiler report: every kernel the plans launch for a set of problems, compiled here for a GPU architecture (no
GPU needed: Triton's ptxas and cuobjdump), with registers, stack frame (spills), shared memory, the SASS instruction
count and a hash of the SASS (to show that a change left the machine code as it was).

    PYTHONPATH=src python tools/compiler_report.py [--arch 90|80|89] [--family softmax|topk] [--json FILE]

The problems: the softmax goal shapes (1 GiB per tensor; softmax, log-softmax, logsumexp, both backwards; fp32,
bf16, fp16; N = 1K ... 256K, 100000, 128256) and decode shapes (1 / 8 / 32 rows of 128256 / 151936 / 262144), and
top-k at k in {1, 50, 256, 1024} over B in {1, 32, 256} x V in {32000, 128256, 262144}. Plans are made for the
hand-built target of the architecture (onlinesoftmax.target), launches specialised as a real launch is (sizes
equal to 1 as constants, pointers and sizes divisible by 16 marked so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from onlinesoftmax import target as targets  # noqa: E402
from onlinesoftmax.softmax import launch as SL  # noqa: E402
from onlinesoftmax.softmax.geometry import row_geometry  # noqa: E402
from onlinesoftmax.softmax.plan import LOG_SOFTMAX, LOGSUMEXP, SOFTMAX, Backward, Forward, backward_plan, forward_plan  # noqa: E402
from onlinesoftmax.topk import launch as TL  # noqa: E402
from onlinesoftmax.topk.plan import topk_plan  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGETS = {90: targets.H200, 80: targets.A100, 89: targets.L4}
PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
       torch.int32: "*i32", torch.int64: "*i64", torch.uint8: "*u8"}
GIB = 1 << 30


def cubin_report(compiled) -> tuple[tuple[int, int, int], str]:
    """((registers, stack frame bytes, shared bytes), SASS text) of a compiled kernel, read with cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    return tuple(int(g) for g in m.groups()), sass


def compile_launch(fn, args: tuple, meta: dict, arch: int, keep_sass: bool = False) -> dict:
    """``fn`` specialised as a launch with ``args`` gets it, compiled for sm_<arch>: resources and a SASS digest
    (``keep_sass``: and the SASS text, under "sass_text")."""
    sig, const, attrs = {}, {}, {}
    runtime = [p for p in fn.params if not p.is_constexpr]
    for p, a in zip(runtime, args):
        if isinstance(a, torch.Tensor):
            sig[p.name] = PTR[a.dtype]
            attrs[(fn.arg_names.index(p.name),)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[p.name] = "fp32"
        elif p.do_not_specialize:
            sig[p.name] = "i32" if abs(a) < 2**31 else "i64"
        elif a == 1:
            sig[p.name], const[p.name] = "constexpr", 1
        else:
            sig[p.name] = "i32" if abs(a) < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(fn.arg_names.index(p.name),)] = [["tt.divisibility", 16]]
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", meta[p.name]
    sig = {n: sig[n] for n in fn.arg_names}
    options = {k: v for k, v in meta.items() if k in ("num_warps", "num_stages", "maxnreg")}
    source = GluonASTSource if fn.is_gluon() else ASTSource
    compiled = triton.compile(source(fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32), options=options)
    (regs, stack, shared), sass = cubin_report(compiled)
    body = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split("/*")[0].strip() for line in sass.splitlines()
            if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)]
    body = [b for b in body if b]
    r = dict(regs=regs, stack=stack, shared=max(shared, compiled.metadata.shared), instructions=len(body),
             sass=hashlib.sha1("\n".join(body).encode()).hexdigest()[:16])
    if keep_sass:
        r["sass_text"] = sass
    return r


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _key(fn, meta: dict, args: tuple) -> str:
    return json.dumps([fn.__name__, sorted((k, str(v)) for k, v in meta.items()),
                       [str(a.dtype) if isinstance(a, torch.Tensor) else "f" if isinstance(a, float)
                        else [a == 1, a % 16 == 0] for a in args]])


def softmax_problems():
    for op in ("fwd", "log", "lse", "bwd", "lbwd"):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            for n in (1024, 4096, 16384, 32768, 131072, 262144, 128256, 100000):
                yield op, dt, None, n
            for m in (1, 8, 32):
                for n in (128256, 151936, 262144):
                    yield op, dt, m, n


def softmax_launches(target):
    """(label, plan, [(kernel, meta, args)]) of every softmax problem."""
    for op, dt, m, n in softmax_problems():
        m = m or GIB // (n * dt.itemsize)
        x = _meta((m, n), dt)
        if op in ("bwd", "lbwd"):
            M, N, inner, geos = row_geometry([x, x, x], 1)
            p = Backward(M, N, inner, *geos, op == "lbwd", (dt,) * 3)
            plan = backward_plan(p, target)
            launch, tensors = SL.bind_backward(p, plan, target), (x, x, x)
        else:
            mode = {"fwd": SOFTMAX, "log": LOG_SOFTMAX, "lse": LOGSUMEXP}[op]
            out = _meta((m,), dt) if mode == LOGSUMEXP else x
            M, N, inner, (gx, gy) = row_geometry([x, x], 1)
            p = Forward(M, N, inner, gx, (0, 0, 0) if mode == LOGSUMEXP else gy, mode, dt, dt)
            plan = forward_plan(p, target)
            launch, tensors = SL.bind_forward(p, plan, target), (x, out)
        ws = ()
        if launch.workspace is not None:
            rows, parts, wdt, pick = launch.workspace
            views = (_meta((max(rows, 1024),), torch.int32),) * 2 + (_meta((max(parts, 1 << 16),), wdt),) * 2
            ws = tuple(views[i] for i in pick)
        args = tensors + ws + launch.scalars
        yield f"{op} {str(dt)[6:]} {m}x{n}", plan, [(b.fn, b.meta, args) for b in launch.kernels]


def topk_launches(target):
    for k in (1, 50, 256, 1024):
        for B in (1, 32, 256):
            for V in (32000, 128256, 262144):
                plan = topk_plan(B, V, k, 4, target)
                if plan.path != "filter":
                    continue
                x = _meta((B, V), torch.float32)
                ws, ws2 = _meta((1 << 22,), torch.int32), _meta((1 << 20,), torch.int32)
                out = (_meta((B, k), torch.float32), _meta((B, k), torch.int64), _meta((B,), torch.float32))
                kernels = [(b.fn, b.meta, args(x, ws, ws2, out)) for b, args in TL._launches(plan, B, V, k, V, 1)]
                yield f"topk k={k} {B}x{V}", plan, kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, choices=sorted(TARGETS))
    ap.add_argument("--family", choices=("softmax", "topk"), action="append")
    ap.add_argument("--json", help="write every problem's kernels and every kernel's figures here")
    a = ap.parse_args()
    target = TARGETS[a.arch]
    families = a.family or ["softmax", "topk"]
    compiled, problems = {}, {}
    print(f"sm_{a.arch} ({target})")
    for fam in families:
        for label, plan, kernels in (softmax_launches if fam == "softmax" else topk_launches)(target):
            keys = []
            for fn, meta, args in kernels:
                key = _key(fn, meta, args)
                if key not in compiled:
                    compiled[key] = compile_launch(fn, args, meta, a.arch)
                c = compiled[key]
                keys.append(key)
                print(f"{label:28} {plan.path:6} {fn.__name__:32} warps {meta.get('num_warps'):2} | regs "
                      f"{c['regs']:3} stack {c['stack']:3} shared {c['shared'] // 1024:3} KB | SASS "
                      f"{c['instructions']:5} instr {c['sass']}", flush=True)
            problems[label] = dict(plan=str(plan), kernels=keys)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(arch=a.arch, kernels=compiled, problems=problems), f, indent=1)


if __name__ == "__main__":
    main()
