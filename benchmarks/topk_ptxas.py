"""Registers, stack frame (spills) and shared memory of the top-k kernels for the 45 goal shapes, compiled for
sm_90a here: no GPU needed (Triton's own ptxas and cuobjdump). ``PROBE=1``: the variants that
``benchmarks/topk_probe.py`` times instead of the 45 default plans; ``SASS=1 OPS=1``: instruction, barrier and
shuffle counts too.

``PYTHONPATH=src [JOBS=8] python benchmarks/topk_ptxas.py [> ptxas.txt]``. Every kernel the default plan launches
(stage 1, the exact path when apart, the merge or the tree's two merge levels), each distinct one compiled once in
parallel processes, with the specialisations a real launch gets (stride 1 as a constant, pointers and sizes
divisible by 16).
"""

from __future__ import annotations

import os
import re

os.environ.pop("TRITON_INTERPRET", None)

from cubin_tools import compile_sm90, cubin_report  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from onlinesoftmax.kernels import topk as kt  # noqa: E402

STAGE1_SIG = {"x_ptr": "*fp32", "ws_ptr": "*i32", "stride_b": "i32", "stride_v": "constexpr", "V": "i32",
              "k": "i32", "S": "i32", "BS": "i32"}
MERGE_SIG = {"x_ptr": "*fp32", "stride_b": "i32", "stride_v": "constexpr", "V": "i32", "ws_ptr": "*i32",
             "out_ptr": "*i32", "val_ptr": "*fp32", "ind_ptr": "*i64", "lse_ptr": "*fp32", "k": "i32", "S": "i32",
             "BS": "i32", "GS": "i32", "NG": "i32"}


def resources(fn, sig: dict, constexprs: dict, num_warps: int, maxnreg: int = 0) -> tuple[int, ...]:
    """(registers, stack frame bytes, shared bytes[, SASS instructions[, barriers, shuffles]]) of ``fn`` compiled for
    sm_90a; the instruction count (static: the code's size, 16 bytes each) with ``SASS=1`` in the environment, and
    with ``OPS=1`` too the static counts of ``BAR`` and ``SHFL`` (cross-warp and in-warp exchanges)."""
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or n in ("stride_b", "V")}
    src = ASTSource(fn, sig, dict(constexprs, stride_v=1), attrs)
    opts = dict(num_warps=num_warps, **(dict(maxnreg=maxnreg) if maxnreg else {}))
    res, sass = cubin_report(compile_sm90(src, opts), sass=os.environ.get("SASS") == "1")
    n_sass = (len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", sass, re.M)),) if sass else ()
    if sass and os.environ.get("OPS") == "1":
        ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, re.M)
        n_sass += (ops.count("BAR"), ops.count("SHFL"))
    return res + n_sass


EXACT_SIG = {"x_ptr": "*fp32", "ws_ptr": "*i32", "stride_b": "i32", "stride_v": "constexpr", "V": "i32",
             "k": "i32", "S": "i32", "BS": "i32"}


def _one(job):
    """Resources of one kernel (a worker process: the compiles run in parallel)."""
    name, constexprs, warps = job
    from onlinesoftmax.kernels import topk as kt

    fn, sig = {"stage1": (kt._topk_chunk_kernel, STAGE1_SIG), "exact": (kt._topk_exact_kernel, EXACT_SIG),
               "merge": (kt._topk_merge_kernel, MERGE_SIG)}[name]
    meta = dict(constexprs)
    return job, resources(fn, sig, meta, warps, meta.pop("MAXNREG", 0))


def kernels(cfg):
    """The kernels (name, constexprs, warps) that softmax_topk_2d launches for ``cfg``, labelled."""
    meta = (("BLOCK", cfg.block), ("R", cfg.cols), ("CAP", cfg.cap))
    cap = (("MAXNREG", cfg.maxnreg),) if cfg.maxnreg else ()
    out = [("stage 1", ("stage1", meta + (("FAST", True), ("RADIX", cfg.radix), ("PEEL", cfg.peel)) + cap,
                        cfg.num_warps))]
    if cfg.exact_apart:
        out.append(("exact", ("exact", meta, cfg.num_warps)))
    s = cfg.splits
    if cfg.tree:
        sp = kt._pow2(cfg.tree)
        m1 = (("SP", sp), ("CT", sp), ("FAST", True), ("EXACT", not cfg.exact_apart), ("OUT_STATE", True),
              ("ROWB", cfg.row_bound), ("W", cfg.cap))
        out.append(("merge 1", ("merge", meta + m1, cfg.tree_warps)))
        s = -(-s // cfg.tree)
    sp = kt._pow2(s)
    ct = max(1, min(sp, kt.MERGE_TILE // cfg.cap))
    exact = not cfg.exact_apart and not cfg.tree
    out.append(("merge" if not cfg.tree else "merge 2",
                ("merge", meta + (("SP", sp), ("CT", ct), ("FAST", True), ("EXACT", exact), ("OUT_STATE", False),
                          ("ROWB", cfg.row_bound), ("W", cfg.width or cfg.cap)),
                 cfg.merge_warps)))
    return out


def main():
    import multiprocessing as mp

    shapes = [(B, V, k) for B in (1, 32, 256) for V in (128256, 151936, 262144) for k in (1, 8, 50, 256, 1024)]
    plans = {s: kt.select_path(*s) for s in shapes}
    if os.environ.get("PROBE") == "1":      # the filter variants of benchmarks/topk_probe.py instead
        from topk_probe import VARIANTS
        plans = {(s, str(o)): kt.select_path(*s, **o) for s, vs in VARIANTS.items() for o in [{}] + vs}
        plans = {s: c for s, c in plans.items() if c.path == "filter"}
    jobs = sorted({job for cfg in plans.values() for _, job in kernels(cfg)}, key=lambda j: -dict(j[1])["CAP"])
    with mp.get_context("spawn").Pool(int(os.environ.get("JOBS", "8"))) as pool:
        res = dict(pool.map(_one, jobs))
    print("(B, V, k): configuration | each kernel (registers, stack bytes, shared bytes"
          + (", SASS instructions" if os.environ.get("SASS") == "1" else "")
          + (", BAR, SHFL)" if os.environ.get("SASS") == "1" and os.environ.get("OPS") == "1" else ")"))
    for s, cfg in plans.items():
        parts = " | ".join(f"{label} {res[job]}" for label, job in kernels(cfg))
        print(f"{s}: block {cfg.block} R {cfg.cols} CAP {cfg.cap} warps {cfg.num_warps} S {cfg.splits} "
              f"radix {cfg.radix} row bound {cfg.row_bound} maxnreg {cfg.maxnreg} "
              f"tree {cfg.tree} (warps {cfg.tree_warps}) merge warps {cfg.merge_warps} exact apart "
              f"{cfg.exact_apart} | {parts}", flush=True)


if __name__ == "__main__":
    main()
