"""Time kernel variants of the softmax family on the GPU, side by side with torch and the copy ceiling.

Each variant is a launcher config (path, tile, waves, chunk, num_warps). Every variant's output is checked
against torch before timing. Prints a table and writes JSON to the folder given as argv[1].

    PYTHONPATH=src python benchmarks/tune_softmax.py $OUT          # the whole sweep
    PYTHONPATH=src python benchmarks/tune_softmax.py $OUT long     # forward long rows only: coop chunk x warps
    PYTHONPATH=src python benchmarks/tune_softmax.py $OUT bf16x2   # bf16 coop: packed-word kernel vs generic
    PYTHONPATH=src python benchmarks/tune_softmax.py $OUT gib 1    # 1 GiB tensors: GIB_SWEEPS and the `gib ==` sets
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

import onlinesoftmax as oss
from onlinesoftmax.bench.harness import copy_ceiling_gbps, environment
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

MB256 = 256 << 20
GIB = 1 << 30
L2_ROTATE = 200 << 20


# `gib` sweeps: 1 GiB per tensor (the issue asks >= 256 MB; at 256 MB our kernels lose 3-4 points to the fixed
# ramp and tail, against a 2 GiB copy). Set 1: the shapes below 97 % at 1 GiB in a first probe. Set 2: more warps
# per tile, after set 1 found 16 warps better than 8 at fp32 N = 4K.
GIB_SWEEPS = {
    "1": {
        (torch.float32, 1024): {"tile=2048": {"tile": 2048}, "tile=8192": {"tile": 8192},
                                "tile=8192 w=16": {"tile": 8192, "num_warps": 16},
                                "tile=4096 w=4": {"num_warps": 4}, "prefetch": {"prefetch": True}},
        (torch.float32, 4096): {"w=4": {"num_warps": 4}, "w=16": {"num_warps": 16},
                                "tile=8192": {"tile": 8192}, "tile=8192 w=32": {"tile": 8192, "num_warps": 32},
                                "prefetch tile=4096": {"prefetch": True, "tile": 4096}},
        (torch.bfloat16, 1024): {"waves=1": {"waves": 1}, "waves=4": {"waves": 4},
                                 "tile=4096": {"tile": 4096}, "tile=16384": {"tile": 16384},
                                 "no prefetch tile=4096": {"prefetch": False, "tile": 4096},
                                 "no prefetch tile=8192": {"prefetch": False, "tile": 8192}},
        (torch.bfloat16, 16384): {"rows w=16": {"path": "rows", "num_warps": 16},
                                  "bf16x2 chunk=4096 w=4": {"path": "coop", "chunk": 4096, "num_warps": 4},
                                  "bf16x2 chunk=8192 w=4": {"path": "coop", "chunk": 8192, "num_warps": 4},
                                  "bf16x2 chunk=8192 w=8": {"path": "coop", "chunk": 8192, "num_warps": 8},
                                  "generic coop chunk=8192 w=8": {"path": "coop", "bf16x2": False,
                                                                  "chunk": 8192, "num_warps": 8}},
        (torch.bfloat16, 32768): {"rows": {"path": "rows"},
                                  "bf16x2 chunk=8192 w=4": {"path": "coop", "chunk": 8192, "num_warps": 4},
                                  "bf16x2 chunk=8192 w=8": {"path": "coop", "chunk": 8192, "num_warps": 8},
                                  "bf16x2 chunk=16384 w=8": {"path": "coop", "chunk": 16384, "num_warps": 8}},
    },
    "2": {
        (torch.float32, 1024): {"tile=4096 w=16": {"num_warps": 16}},
        (torch.float32, 4096): {"w=16": {"num_warps": 16}, "w=32": {"num_warps": 32}},
        (torch.float32, 16384): {"w=16": {"num_warps": 16}},
        (torch.bfloat16, 1024): {"w=8": {"num_warps": 8}, "w=32": {"num_warps": 32}, "waves=3": {"waves": 3}},
        (torch.bfloat16, 4096): {"w=4": {"num_warps": 4}, "w=16": {"num_warps": 16}},
        (torch.bfloat16, 16384): {"w=8": {"num_warps": 8}, "w=16": {"num_warps": 16}},
    },
}

def inputs(m, n, dtype, bwd=False):
    per = m * n * torch.finfo(dtype).bits // 8 * (2 if bwd else 1)
    sets = []
    for _ in range(max(1, min(8, L2_ROTATE // max(per, 1)))):
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        sets.append((torch.softmax(x.float(), -1).to(dtype), torch.randn_like(x)) if bwd else (x,))
    return sets


def timed(fn, sets):
    i = [0]

    def call():
        i[0] += 1
        return fn(*sets[i[0] % len(sets)])

    return do_bench(call, warmup=25, rep=100, return_mode="median")


def fwd_variant(cfg, mode=K.SOFTMAX):
    """A forward launch with ``cfg`` overrides; its plan is built once per layout and reused, as a default call's
    is, so decode-sized timings are not host-bound on plan building."""
    plans = {}

    def run(x):
        out = torch.empty(x.shape[0], device=x.device) if mode == K.LOGSUMEXP else torch.empty_like(x)
        m, n, inner, (gx, gy) = row_geometry([x, out if mode != K.LOGSUMEXP else x], 1)
        if cfg is None:
            K.forward(x, out, gx, gy, m, n, inner, mode)
            return out
        key = (x.shape, x.dtype, x.stride())
        if key not in plans:
            words = x.dtype == torch.bfloat16 and not (x.data_ptr() | out.data_ptr()) & 3
            plans[key] = K._forward_plan(dict(cfg), x, out, gx, gy, m, n, inner, mode, words)
        K._run(plans[key], (x, out), x.device)
        return out
    return run


def bwd_variant(cfg, log=False):
    def run(y, dy):
        dx = torch.empty_like(y)
        m, n, inner, (g1, g2, g3) = row_geometry([y, dy, dx], 1)
        K.backward(y, dy, dx, g1, g2, g3, m, n, inner, log, config=cfg)
        return dx
    return run


def smem_bwd_variant(chunk, warps, log=False, **knobs):
    """A backward launch forced onto the shared-memory kernel (path coop, smem) with ``chunk`` elements per
    program, ``warps`` warps and further plan ``knobs`` (reg, ring, ...)."""
    return bwd_variant({"path": "coop", "smem": True, "chunk": chunk, "num_warps": warps, **knobs}, log)


def graph_and_overhead(m, n, dtype, name, fn, x):
    """Decode sizes are launch-bound: time the call replayed from a CUDA graph (GPU time only) and the
    host time per call of a loop of eager calls (what an eager decoder pays)."""
    import time

    fn(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    graph_us = do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fn(x)
    host_us = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"grf  {m:>6}x{n:<7} {str(dtype)[6:]:9} {name:34} graph replay {graph_us:7.1f} us, "
          f"host per eager call {host_us:6.1f} us")
    GRAPH_ROWS.append(dict(m=m, n=n, dtype=str(dtype), impl=name, graph_us=graph_us, host_us=host_us))


GRAPH_ROWS = []


def main(out_dir, only_long=False, bf16x2=False, gib=None):
    env = environment()
    ceiling = copy_ceiling_gbps(torch.device("cuda"))
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}  copy ceiling {ceiling:.0f} GB/s")
    rows = []

    def save(name):
        with open(f"{out_dir}/{name}.json", "w") as f:
            json.dump({"env": env, "copy_ceiling_gbps": ceiling, "rows": rows}, f, indent=1)

    def fwd_baseline(kind, m, n, dtype):
        """Softmax inputs at (m, n): rows torch and our default under ``kind``, then (sets, reference, bytes)."""
        sets = inputs(m, n, dtype)
        ref = torch.softmax(sets[0][0], -1)
        nb = 2 * m * n * torch.finfo(dtype).bits // 8
        record(kind, m, n, dtype, "torch", lambda x: torch.softmax(x, -1), sets, nb, ref)
        record(kind, m, n, dtype, "default", fwd_variant(None), sets, nb, ref)
        return sets, ref, nb

    def lse_baseline(m, n, dtype):
        """logsumexp inputs at (m, n): rows torch and our default, then (sets, reference, bytes read) for variants."""
        sets = inputs(m, n, dtype)
        ref = torch.logsumexp(sets[0][0], -1)
        nb = m * n * torch.finfo(dtype).bits // 8
        record("lse", m, n, dtype, "torch", lambda x: torch.logsumexp(x, -1), sets, nb, ref)
        record("lse", m, n, dtype, "default", fwd_variant(None, K.LOGSUMEXP), sets, nb, ref)
        return sets, ref, nb

    def bwd_baseline(m, n, dtype, log=False):
        """Backward inputs at (m, n): rows torch and our default, then (sets, reference, bytes) for variants.
        ``log``: log-softmax's backward (kind lbwd), fed the same probabilities as y."""
        bsets = inputs(m, n, dtype, bwd=True)
        torch_bwd = torch._log_softmax_backward_data if log else torch._softmax_backward_data
        bref = torch_bwd(bsets[0][1], bsets[0][0], -1, dtype)
        nb3 = 3 * m * n * torch.finfo(dtype).bits // 8
        kind = "lbwd" if log else "bwd"
        record(kind, m, n, dtype, "torch", lambda y, dy: torch_bwd(dy, y, -1, y.dtype), bsets, nb3, bref)
        record(kind, m, n, dtype, "default", bwd_variant(None, log), bsets, nb3, bref)
        return bsets, bref, nb3

    def record(kind, m, n, dtype, name, fn, sets, nbytes, ref):
        try:
            out = fn(*sets[0])
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            info = K.last_launch() if name != "torch" else {}
            ms = timed(fn, sets)
        except Exception as e:  # a variant that fails to compile or run is reported, not fatal
            print(f"{kind:4} {m:>6}x{n:<7} {str(dtype)[6:]:9} {name:34} FAILED {type(e).__name__}: {e}"[:200])
            return
        gbps = nbytes / (ms * 1e-3) / 1e9
        r = dict(kind=kind, m=m, n=n, dtype=str(dtype), variant=name, us=ms * 1e3, gbps=gbps,
                 pct=100 * gbps / ceiling, max_err=err, launch=info)
        rows.append(r)
        print(f"{kind:4} {m:>6}x{n:<7} {str(dtype)[6:]:9} {name:34} {ms*1e3:9.1f} us {gbps:7.0f} GB/s "
              f"{r['pct']:5.1f}%  err {err:.1e}  regs {info.get('regs')} spills {info.get('spills')}")

    if bf16x2:
        bf = torch.bfloat16
        for n in (131072, 262144, 32768, 65536):
            m = MB256 // (n * 2)
            sets = inputs(m, n, bf)
            nb = 2 * m * n * 2
            for mode, fn in ((K.SOFTMAX, torch.softmax), (K.LOG_SOFTMAX, torch.log_softmax)):
                kind = "fwd" if mode == K.SOFTMAX else "log"
                ref = fn(sets[0][0], -1)
                record(kind, m, n, bf, "torch", lambda x, fn=fn: fn(x, -1), sets, nb, ref)
                record(kind, m, n, bf, "default", fwd_variant(None, mode), sets, nb, ref)
                record(kind, m, n, bf, "generic coop", fwd_variant({"path": "coop", "bf16x2": False}, mode), sets,
                       nb, ref)
                for chunk, w in ((16384, 8), (8192, 4), (4096, 4), (16384, 16), (8192, 2)):
                    record(kind, m, n, bf, f"bf16x2 chunk={chunk} w={w}",
                           fwd_variant(dict(path="coop", bf16x2=True, chunk=chunk, num_warps=w), mode),
                           sets, nb, ref)
            del sets
        for m in (1, 8, 32):
            for n in (128256, 262144):
                sets = inputs(m, n, bf)
                ref = torch.softmax(sets[0][0], -1)
                nb = 2 * m * n * 2
                record("dec", m, n, bf, "torch", lambda x: torch.softmax(x, -1), sets, nb, ref)
                record("dec", m, n, bf, "default", fwd_variant(None), sets, nb, ref)
                record("dec", m, n, bf, "generic coop", fwd_variant({"bf16x2": False}), sets, nb, ref)
        save("tune_bf16x2")
        return
    if gib in ("bwd", "bwd16"):   # softmax backward (reads y, dy, writes dx) at 1 GiB per tensor
        for dtype in (torch.float32, torch.bfloat16) if gib == "bwd" else (torch.bfloat16,):
            size = torch.finfo(dtype).bits // 8
            for n in (1024, 4096, 16384, 32768, 131072, 262144) if gib == "bwd" else (32768, 131072, 262144):
                m = GIB // (n * size)
                bsets, bref, nb3 = bwd_baseline(m, n, dtype)
                if n <= K.ROW_MAX_N // K.BWD_CHUNK_SCALE:
                    variants = {"waves=2": {"waves": 2}, "waves=8": {"waves": 8}, "tile=4096": {"tile": 4096},
                                "tile=1024": {"tile": 1024}}
                else:
                    variants = {f"coop chunk={c} w={w}": {"path": "coop", "chunk": c, "num_warps": w}
                                for c, w in ((2048, 4), (4096, 4), (8192, 8), (8192, 16))}
                    if dtype == torch.bfloat16:   # the packed-word kernel (set "bwd16": after its first version)
                        variants = {f"bf16x2 chunk={c} w={w}": {"path": "coop", "bf16x2": True, "chunk": c,
                                                                "num_warps": w}
                                    for c, w in ((4096, 4), (8192, 8), (16384, 16), (8192, 4), (16384, 8))}
                        variants["generic coop chunk=8192 w=8"] = {"path": "coop", "bf16x2": False, "chunk": 8192,
                                                                   "num_warps": 8}
                with_log = [name for name in variants if "bf16x2" in name or "generic" in name]
                if with_log:
                    lref = torch._log_softmax_backward_data(bsets[0][1], bsets[0][0], -1, dtype)
                for name, cfg in variants.items():
                    record("bwd", m, n, dtype, name, bwd_variant(cfg), bsets, nb3, bref)
                    if name in with_log:
                        record("lbwd", m, n, dtype, name, bwd_variant(cfg, log=True), bsets, nb3, lref)
                del bsets, bref
        save(f"tune_gib_{gib}")
        return
    if gib == "smem":     # the coop kernel with the chunk in shared memory (kernels/softmax_smem.py), 1 GiB
        neighbours = {4: ((4096, 2), (6144, 2), (8192, 2), (4096, 4)), 2: ((4096, 2), (4096, 1), (8192, 1),
                                                                           (6144, 2), (8192, 4))}
        for dtype, n in ((torch.float32, 131072), (torch.float32, 262144), (torch.bfloat16, 131072),
                         (torch.bfloat16, 262144), (torch.bfloat16, 65536)):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            variants = {"registers": {"path": "coop", "smem": False}}
            variants.update({f"smem chunk={c} w={w}": {"path": "coop", "smem": True, "chunk": c, "num_warps": w}
                             for c, w in neighbours[size]})
            for name, cfg in variants.items():
                record("fwd", m, n, dtype, name, fwd_variant(cfg), sets, nb, ref)
            lref = torch.log_softmax(sets[0][0], -1)
            for name, cfg in (("default", None), ("registers", variants["registers"])):
                record("log", m, n, dtype, name, fwd_variant(cfg, K.LOG_SOFTMAX), sets, nb, lref)
            del sets
        bwd_variants = {4: ((4096, 4), (2048, 2), (4096, 2), (8192, 4)), 2: ((8192, 2), (4096, 2), (4096, 1),
                                                                          (8192, 4))}
        for dtype, n in ((torch.float32, 131072), (torch.float32, 262144), (torch.bfloat16, 131072),
                         (torch.bfloat16, 262144)):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            bsets, bref, nb3 = bwd_baseline(m, n, dtype)
            for c, w in bwd_variants[size]:
                record("bwd", m, n, dtype, f"smem chunk={c} w={w}",
                       smem_bwd_variant(c, w), bsets, nb3, bref)
            lref = torch._log_softmax_backward_data(bsets[0][1], bsets[0][0], -1, dtype)
            record("lbwd", m, n, dtype, "default", bwd_variant(None, log=True), bsets, nb3, lref)
            c, w = bwd_variants[size][0]
            record("lbwd", m, n, dtype, f"smem chunk={c} w={w}",
                   smem_bwd_variant(c, w, log=True), bsets, nb3, lref)
            del bsets, bref
        save("tune_gib_smem")
        return
    if gib == "hybrid":   # long rows: the smem coop kernel with the chunk's last `reg` sub-tiles held in registers
        # (REG; bf16: as int32 words, WORDS), so an SM holds shared memory plus registers. Run 1 at 68c50af
        # (tune-gib-hybrid-68c50af.log): fp32 +1.9 / +2.4 points at N = 128K / 256K (16384 w=8 reg=4); bf16 lost
        # 4-9 points (unpacked bf16: 64-162 registers). Run 2 at 11dece4: fp32 94.4 / 92.3 % (16384 w=8 reg=4)
        # against 92.4 / 89.8; bf16 words 85.6 / 85.5 % (16384 w=4 reg=4) against 84.5 / 83.9. Run 3: around both.
        hybrid = {4: ((11264, 4, 0), (16384, 8, 4), (13312, 4, 4), (15360, 4, 8), (12288, 4, 4), (14336, 4, 4),
                      (16384, 4, 4)),
                  2: ((8192, 2, 0), (16384, 4, 4), (16384, 4, 8), (12288, 4, 4), (20480, 4, 4), (16384, 8, 2),
                      (32768, 8, 4), (24576, 8, 4))}
        for dtype, n in ((torch.float32, 131072), (torch.float32, 262144), (torch.bfloat16, 131072),
                         (torch.bfloat16, 262144)):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for c, w, r in hybrid[size]:
                record("fwd", m, n, dtype, f"smem chunk={c} w={w} reg={r}",
                       fwd_variant({"path": "coop", "smem": True, "chunk": c, "num_warps": w, "reg": r}), sets, nb,
                       ref)
            lref = torch.log_softmax(sets[0][0], -1)
            for c, w, r in hybrid[size][:3]:
                record("log", m, n, dtype, f"smem chunk={c} w={w} reg={r}", fwd_variant(
                    {"path": "coop", "smem": True, "chunk": c, "num_warps": w, "reg": r}, K.LOG_SOFTMAX), sets, nb,
                    lref)
            del sets
        save("tune_gib_hybrid")
        return

    if gib == "pipe":     # logsumexp: whole rows with the next row in flight (logsumexp_rows_pipe_kernel) against the
        # register kernels. Run 1 at 77f31cb (tune-gib-pipe-77f31cb.log) also timed softmax and log-softmax through
        # the same pipeline (82-92 %, against 94.7-98.1 %) and chose LSE_PIPE; run 2: the lengths between
        sweep = {(torch.float32, 1024): ((1, 32), (2, 16)),
                 (torch.float32, 2048): ((2, 16), (1, 32), (4, 8)),
                 (torch.float32, 8192): ((4, 4), (8, 3), (8, 2), (4, 6)),
                 (torch.bfloat16, 2048): ((1, 32), (2, 16), (2, 8)),
                 (torch.bfloat16, 8192): ((4, 6), (4, 4), (8, 3), (2, 8)),
                 (torch.bfloat16, 32768): ((16, 1), (8, 1), (32, 1))}
        for (dtype, n), variants in sweep.items():
            m = GIB // (n * torch.finfo(dtype).bits // 8)
            sets, ref, nb = lse_baseline(m, n, dtype)
            record("lse", m, n, dtype, "registers", fwd_variant({"pipe": False}, K.LOGSUMEXP), sets, nb, ref)
            for w, c in variants:
                record("lse", m, n, dtype, f"pipe w={w} ctas={c}",
                       fwd_variant({"path": "rows", "pipe": True, "num_warps": w, "ctas": c}, K.LOGSUMEXP), sets, nb,
                       ref)
            del sets
        save("tune_gib_pipe")
        return
    if gib == "stream":   # logsumexp_stream_kernel (LSE_STREAM) at other lengths and configs (warps, 16-byte
        # loads per thread per tile, programs per SM), against the default plan (stream=False: the pipe kernel)
        cases = ((torch.bfloat16, 1024, ((2, 2, 16), (1, 4, 32), (4, 1, 16))),
                 (torch.bfloat16, 4096, ((4, 4, 8), (4, 2, 8), (2, 4, 16), (8, 2, 4))),
                 (torch.bfloat16, 16384, ((8, 4, 4), (4, 4, 8), (8, 2, 8))),
                 (torch.bfloat16, 20000, ((8, 4, 4), (4, 4, 8))),
                 (torch.bfloat16, 32768, ((8, 4, 4), (4, 4, 8), (8, 4, 6))),
                 (torch.float16, 131072, ((8, 4, 4),)),
                 (torch.bfloat16, 262144, ((8, 4, 4), (8, 4, 6), (16, 4, 2), (8, 8, 2))))
        for dtype, n, variants in cases:
            m = GIB // (n * torch.finfo(dtype).bits // 8)
            sets, ref, nb = lse_baseline(m, n, dtype)
            record("lse", m, n, dtype, "stream=False", fwd_variant({"stream": False}, K.LOGSUMEXP), sets, nb, ref)
            for w, loads, c in variants:
                record("lse", m, n, dtype, f"stream w={w} loads={loads} ctas={c}",
                       fwd_variant({"stream": True, "num_warps": w, "loads": loads, "ctas": c}, K.LOGSUMEXP),
                       sets, nb, ref)
            del sets
        save("tune_gib_stream")
        return
    if gib == "bwdreg":   # softmax backward, long rows: the smem coop kernel with its first `reg` sub-tiles of y and
        # dy in registers, (chunk, warps, reg), against the default plan of the time (no REG; run at da9bbb6)
        cases = ((torch.bfloat16, ((8192, 4, 0), (8192, 4, 4), (12288, 4, 4), (10240, 4, 2), (12288, 4, 2),
                                   (16384, 4, 4), (16384, 8, 4))),
                 (torch.float32, ((4096, 4, 0), (8192, 4, 4), (6144, 4, 2), (8192, 8, 4), (12288, 8, 4),
                                  (10240, 8, 2))))
        for dtype, variants in cases:
            for n in (131072, 262144):
                m = GIB // (n * torch.finfo(dtype).bits // 8)
                bsets, bref, nb3 = bwd_baseline(m, n, dtype)
                for chunk, w, reg in variants:
                    record("bwd", m, n, dtype, f"smem chunk={chunk} w={w} reg={reg}",
                           smem_bwd_variant(chunk, w, reg=reg), bsets, nb3, bref)
                del bsets, bref
        save("tune_gib_bwdreg")
        return
    if gib == "bwdreg2":  # (run at f9ec1ff, before bwd_baseline took `log`: no torch rows then) around run 1's best
        # (bf16 16384 w=4 reg=4, fp32 8192 w=4 reg=4), log-softmax too, and the lengths the backward's coop path also
        # takes (32K) or whose chunks do not divide N (128256)
        variants = {2: ((16384, 4, 4), (16384, 4, 2), (20480, 4, 4), (24576, 4, 4), (16384, 2, 4), (32768, 8, 2)),
                    4: ((8192, 4, 4), (8192, 4, 2), (10240, 4, 4), (12288, 4, 4), (8192, 4, 8), (16384, 8, 2))}
        for dtype in (torch.bfloat16, torch.float32):
            for log, lengths in ((False, (131072, 262144, 32768, 128256)), (True, (131072, 262144))):
                for n in lengths:
                    m = GIB // (n * torch.finfo(dtype).bits // 8)
                    bsets, bref, nb3 = bwd_baseline(m, n, dtype, log)
                    for chunk, w, reg in variants[dtype.itemsize]:
                        record("lbwd" if log else "bwd", m, n, dtype, f"smem chunk={chunk} w={w} reg={reg}",
                               smem_bwd_variant(chunk, w, log, reg=reg), bsets, nb3, bref)
                    del bsets, bref
        save("tune_gib_bwdreg2")
        return
    if gib == "bwdreg3":  # fp32 softmax backward, the default (8192, 4 warps, reg 4: 4 programs, 256 KB per SM)
        # against chunks that hold more per SM: 7168 (5 programs, 280 KB), 9216 (4, 288 KB), 10240 with reg 8 (320 KB)
        for n in (262144, 131072):
            m = GIB // (n * 4)
            bsets, bref, nb3 = bwd_baseline(m, n, torch.float32)
            for chunk, w, reg in ((7168, 4, 4), (9216, 4, 4), (10240, 4, 8), (8192, 4, 4)):
                record("bwd", m, n, torch.float32, f"smem chunk={chunk} w={w} reg={reg}",
                       smem_bwd_variant(chunk, w, reg=reg), bsets, nb3, bref)
            del bsets, bref
        save("tune_gib_bwdreg3")
        return
    if gib == "ring":     # log-softmax backward, long rows: y streamed through a ring of `ring` sub-tiles after
        # step 1 (RING: only dy held through the row barrier) against the default (y and dy held), (chunk, warps,
        # reg, ring); the softmax backward's default beside it on the same inputs
        variants = {4: ((16384, 8, 2, 4), (16384, 8, 2, 2), (12288, 8, 2, 4), (8192, 8, 2, 4), (8192, 4, 4, 4),
                        (16384, 4, 4, 4), (10240, 4, 8, 4)),
                    2: ((32768, 8, 2, 4), (32768, 8, 2, 2), (24576, 8, 2, 4), (16384, 8, 2, 4), (16384, 4, 2, 4),
                        (32768, 4, 4, 4), (16384, 4, 2, 8))}
        for dtype in (torch.float32, torch.bfloat16):
            for n in (131072, 262144, 32768):
                m = GIB // (n * torch.finfo(dtype).bits // 8)
                bsets, bref, nb3 = bwd_baseline(m, n, dtype, log=True)
                record("bwd", m, n, dtype, "softmax default", bwd_variant(None), bsets, nb3,
                       torch._softmax_backward_data(bsets[0][1], bsets[0][0], -1, dtype))
                for chunk, w, reg, ring in variants[dtype.itemsize]:
                    record("lbwd", m, n, dtype, f"smem chunk={chunk} w={w} reg={reg} ring={ring}",
                           smem_bwd_variant(chunk, w, True, reg=reg, ring=ring), bsets, nb3, bref)
                del bsets, bref
        save("tune_gib_ring")
        return
    if gib == "lrows":    # log-softmax backward, rows up to 32K: the register rows kernel's tiles and warps against
        # the shared-memory kernel holding the whole row (C = 1: no barrier) with its ring of y, (warps, reg, ring)
        smem = {(4, 1024): ((2, 0, 2), (2, 1, 2), (1, 0, 2), (4, 0, 1)),
                (2, 1024): ((1, 0, 2), (1, 1, 2), (2, 0, 1), (1, 0, 4)),
                (4, 4096): ((4, 0, 2), (4, 2, 2), (2, 2, 4), (8, 0, 2)),
                (2, 4096): ((2, 0, 2), (2, 2, 2), (4, 0, 2), (1, 2, 4)),
                (4, 16384): ((8, 2, 4), (4, 4, 4), (4, 2, 4), (16, 0, 2)),
                (2, 16384): ((4, 2, 4), (8, 2, 4), (2, 2, 4), (4, 0, 4)),
                (4, 32768): ((8, 2, 4), (8, 4, 4), (16, 2, 4)),
                (2, 32768): ((4, 2, 4), (8, 2, 4), (8, 2, 8))}
        register = {"tile=4096": {"tile": 4096}, "tile=1024": {"tile": 1024}, "w=8": {"num_warps": 8},
                    "waves=8": {"waves": 8}}
        for dtype in (torch.float32, torch.bfloat16):
            for n in (1024, 4096, 16384, 32768):
                m = GIB // (n * torch.finfo(dtype).bits // 8)
                bsets, bref, nb3 = bwd_baseline(m, n, dtype, log=True)
                if n < 32768:
                    for name, cfg in register.items():
                        record("lbwd", m, n, dtype, f"rows {name}", bwd_variant(cfg, log=True), bsets, nb3, bref)
                for w, reg, ring in smem[dtype.itemsize, n]:
                    record("lbwd", m, n, dtype, f"smem row w={w} reg={reg} ring={ring}",
                           smem_bwd_variant(n, w, True, reg=reg, ring=ring), bsets, nb3, bref)
                del bsets, bref
        save("tune_gib_lrows")
        return
    if gib == "brows":    # softmax backward, rows up to 16K: the smem kernel holding the whole row (C = 1, y and dy
        # in shared memory, no ring: softmax's s_c needs both) against the register rows kernel, (warps, reg)
        smem = {(4, 1024): ((2, 0), (4, 0), (2, 1)), (2, 1024): ((1, 0), (2, 0), (1, 1)),
                (4, 4096): ((4, 0), (4, 2), (8, 0)), (2, 4096): ((2, 0), (4, 0), (2, 2)),
                (4, 16384): ((4, 4), (8, 2), (16, 0)), (2, 16384): ((4, 2), (8, 2), (2, 2))}
        for dtype in (torch.float32, torch.bfloat16):
            for n in (1024, 4096, 16384):
                m = GIB // (n * torch.finfo(dtype).bits // 8)
                bsets, bref, nb3 = bwd_baseline(m, n, dtype)
                for w, reg in smem[dtype.itemsize, n]:
                    record("bwd", m, n, dtype, f"smem row w={w} reg={reg}",
                           smem_bwd_variant(n, w, reg=reg, ring=0), bsets, nb3, bref)
                del bsets, bref
        save("tune_gib_brows")
        return
    if gib == "fp16bwd2":  # fp16 backward on bf16 plans (SMEM_BWD_ROWS, SMEM_BWD_CONFIG with RING), both modes
        for n in (1024, 4096, 16384, 131072, 262144):
            m = GIB // (n * 2)
            for log in (False, True):
                bwd_baseline(m, n, torch.float16, log)
        save("tune_gib_fp16bwd2")
        return
    if gib == "mix":      # the ceiling by read / write mix: torch's own elementwise kernels at 1 GiB per tensor,
        # over the 1:1 copy ceiling: a copy (1 read : 1 write, the forward's mix), y + dy (2 : 1, the backward's),
        # a sum (read only, logsumexp's). The backward is scored against the 1:1 copy; this says how far apart
        # the mixes themselves are on this GPU
        for dtype, n in ((torch.float32, 131072), (torch.bfloat16, 131072)):
            m = GIB // (n * torch.finfo(dtype).bits // 8)
            bsets = inputs(m, n, dtype, bwd=True)
            nb = m * n * torch.finfo(dtype).bits // 8
            y0, dy0 = bsets[0]
            record("mix", m, n, dtype, "copy (1R 1W)", lambda y, dy: y.clone(), bsets, 2 * nb, y0)
            record("mix", m, n, dtype, "y + dy (2R 1W)", lambda y, dy: y + dy, bsets, 3 * nb, y0 + dy0)
            record("mix", m, n, dtype, "sum (1R)", lambda y, dy: y.sum(dtype=torch.float32), bsets, nb,
                   y0.sum(dtype=torch.float32))
            del bsets
        save("tune_gib_mix")
        return
    if gib == "fp16":     # fp16 takes the 16-bit plans chosen on bf16 (SMEM_CONFIG, SMEM_ROWS, SMEM_BWD_CONFIG, ...):
        # softmax, log-softmax and the softmax backward at the six goal lengths, fp16 then bf16, against torch
        for n in (1024, 4096, 16384, 32768, 131072, 262144):
            for dtype in (torch.float16, torch.bfloat16):
                m = GIB // (n * 2)
                sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
                lref = torch.log_softmax(sets[0][0].float(), -1)
                record("log", m, n, dtype, "torch", lambda x: torch.log_softmax(x, -1), sets, nb, lref)
                record("log", m, n, dtype, "default", fwd_variant(None, K.LOG_SOFTMAX), sets, nb, lref)
                del sets, ref, lref
                bwd_baseline(m, n, dtype)
        save("tune_gib_fp16")
        return
    if gib == "fp16bwd":  # fp16's backward register sub-tiles under SMEM_BWD_F16_MAXNREG (the default) against
        # ptxas's own register choice (maxnreg=0: 64 registers and a spill at 32768 / 8 / 2), bf16 beside
        for n in (32768, 131072, 262144):
            m = GIB // (n * 2)
            for log in (False, True):
                bsets, bref, nb3 = bwd_baseline(m, n, torch.float16, log)
                record("lbwd" if log else "bwd", m, n, torch.float16, "maxnreg=0 (ptxas's choice)",
                       bwd_variant({"maxnreg": 0}, log), bsets, nb3, bref)
                del bsets, bref
                bwd_baseline(m, n, torch.bfloat16, log)
        save("tune_gib_fp16bwd")
        return
    if gib == "bwdbound":  # a register bound (maxnreg) on the backward smem kernel for the other dtypes and modes,
        # after fp16 log-softmax gained 5-7 points with it without having spilled (tune-gib-fp16bwd-c70f4ec.log)
        for dtype, log in ((torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)):
            for n in (131072, 262144):
                m = GIB // (n * torch.finfo(dtype).bits // 8)
                bsets, bref, nb3 = bwd_baseline(m, n, dtype, log)
                for bound in (96, 128):
                    record("lbwd" if log else "bwd", m, n, dtype, f"maxnreg={bound}",
                           bwd_variant({"maxnreg": bound}, log), bsets, nb3, bref)
                del bsets, bref
        save("tune_gib_bwdbound")
        return
    if gib == "fwdbound":  # (experiment) a register bound on the forward smem kernel: fp32 up to the 64 its 4
        # programs of 8 warps allow; 16-bit below ptxas's choice (bf16 64, fp16 72 registers), for a 9th program
        for dtype, bounds in ((torch.float32, (64,)), (torch.bfloat16, (56,)), (torch.float16, (64, 56))):
            for n in (131072, 262144):
                m = GIB // (n * torch.finfo(dtype).bits // 8)
                sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
                for bound in bounds:
                    record("fwd", m, n, dtype, f"maxnreg={bound}", fwd_variant({"maxnreg": bound}), sets, nb, ref)
                del sets, ref
        save("tune_gib_fwdbound")
        return
    if gib == "rowsreg":  # (experiment) the 16-bit shared-memory rows kernel (one program per row, no barrier) with
        # its first REG sub-tiles in registers: a smaller shared-memory footprint, so more programs per SM (bf16 16K
        # at 4 warps: 6 programs / 192 KB held by shared memory; reg 1-2: 7, reg 4 under 56 registers: 9 / 288 KB;
        # bf16 32K at 16 warps: 2 programs by registers (41 -> 48 allocated), 3 under 40)
        cases = ((torch.bfloat16, 16384, ((4, 1, None), (4, 2, None), (4, 4, None), (4, 4, 0), (8, 2, None))),
                 (torch.float16, 16384, ((4, 2, None), (4, 4, None))),
                 (torch.bfloat16, 32768, ((16, 0, 40), (8, 4, None), (8, 2, None))))
        for dtype, n, variants in cases:
            m = GIB // (n * torch.finfo(dtype).bits // 8)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for w, r, bound in variants:
                cfg = {"num_warps": w, "reg": r, **({} if bound is None else {"maxnreg": bound})}
                record("fwd", m, n, dtype, f"rows smem w={w} reg={r} maxnreg={bound}", fwd_variant(cfg), sets, nb,
                       ref)
            del sets
        save("tune_gib_rowsreg")
        return
    if gib == "whole":    # long rows in few large chunks: one program per SM holding a whole bf16 128K row (C = 1,
        # no barrier) or half / a quarter of a row (C = 2 / 4), shared memory plus REG sub-tiles in registers
        # (chunk, warps, reg, keep_e); sm_90a: none of these spills (16 warps reg 8: 107 registers, 192 KB shared)
        cases = ((torch.bfloat16, 131072, ((131072, 16, 8, True), (131072, 16, 8, False), (131072, 32, 4, True),
                                           (65536, 16, 4, True), (65536, 8, 4, True))),
                 (torch.bfloat16, 262144, ((131072, 16, 8, True), (65536, 16, 4, True))),
                 (torch.float32, 131072, ((65536, 16, 16, False), (65536, 32, 8, False), (32768, 8, 8, False))),
                 (torch.float32, 262144, ((65536, 16, 16, False), (32768, 8, 8, False))))
        for dtype, n, variants in cases:
            m = GIB // (n * torch.finfo(dtype).bits // 8)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for c, w, r, keep in variants:
                record("fwd", m, n, dtype, f"smem chunk={c} w={w} reg={r} keep={keep:d}",
                       fwd_variant({"path": "coop", "smem": True, "chunk": c, "num_warps": w, "reg": r,
                                    "keep_e": keep}), sets, nb, ref)
            del sets
        save("tune_gib_whole")
        return
    if gib == "keep":     # 16-bit softmax in the shared-memory kernel: e_j kept in x's place (KEEP_E) against the
        # second exponential
        for dtype, n in ((torch.bfloat16, 131072), (torch.bfloat16, 262144), (torch.bfloat16, 128256),
                         (torch.float16, 131072), (torch.bfloat16, 16384), (torch.bfloat16, 4096),
                         (torch.bfloat16, 32768)):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for keep in (True, False):
                record("fwd", m, n, dtype, f"keep_e={keep}", fwd_variant({"keep_e": keep}), sets, nb, ref)
            del sets
        save("tune_gib_keep")
        return
    if gib == "masked":   # rows whose chunks do not divide N (LLM vocabularies): the hybrid default (REG) against
        # the shared-memory-only chunks (SMEM_CONFIG_MASKED)
        for dtype in (torch.float32, torch.bfloat16):
            size = torch.finfo(dtype).bits // 8
            for n in (128256, 151936):
                m = GIB // (n * size)
                sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
                c, w, r = K.SMEM_CONFIG_MASKED[size]
                record("fwd", m, n, dtype, f"smem chunk={c} w={w} reg={r}",
                       fwd_variant({"path": "coop", "smem": True, "chunk": c, "num_warps": w, "reg": r}), sets, nb,
                       ref)
                del sets
        save("tune_gib_masked")
        return
    if gib == "rows1":    # rows held whole: one row per program at N = 1K, 16-bit rows in shared memory (C = 1). Run
        # at c1d6159 as set "slots", which also timed a since-reverted exchange of (m_c, d_c) (tune-gib-slots-*.log)
        sweep = {
            (torch.bfloat16, 32768): {"smem C=1 w=4": {"smem": True, "chunk": 32768, "num_warps": 4},
                                      "smem C=1 w=8": {"smem": True, "chunk": 32768, "num_warps": 8},
                                      "smem C=1 w=16": {"smem": True, "chunk": 32768, "num_warps": 16}},
            (torch.bfloat16, 16384): {"smem C=1 w=4": {"path": "coop", "smem": True, "chunk": 16384, "num_warps": 4},
                                      "smem C=1 w=8": {"path": "coop", "smem": True, "chunk": 16384, "num_warps": 8},
                                      "smem C=1 w=2": {"path": "coop", "smem": True, "chunk": 16384, "num_warps": 2}},
            (torch.float32, 16384): {"smem C=1 w=8": {"path": "coop", "smem": True, "chunk": 16384, "num_warps": 8}},
            (torch.bfloat16, 4096): {"smem C=1 w=2": {"path": "coop", "smem": True, "chunk": 4096, "num_warps": 2},
                                     "smem C=1 w=4": {"path": "coop", "smem": True, "chunk": 4096, "num_warps": 4}},
            (torch.float32, 1024): {"tile=1024 w=2": {"tile": 1024, "num_warps": 2},
                                    "tile=1024 w=4": {"tile": 1024, "num_warps": 4},
                                    "tile=1024 w=8": {"tile": 1024, "num_warps": 8},
                                    "tile=2048 w=4": {"tile": 2048, "num_warps": 4}},
            (torch.bfloat16, 1024): {"tile=1024 w=2": {"prefetch": False, "tile": 1024, "num_warps": 2},
                                     "tile=1024 w=4": {"prefetch": False, "tile": 1024, "num_warps": 4},
                                     "tile=2048 w=4": {"prefetch": False, "tile": 2048, "num_warps": 4},
                                     "tile=2048 w=8": {"prefetch": False, "tile": 2048, "num_warps": 8}},
        }
        for (dtype, n), variants in sweep.items():
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for name, cfg in variants.items():
                cfg = cfg if "path" in cfg or "smem" not in cfg else {"path": "coop", **cfg}
                record("fwd", m, n, dtype, name, fwd_variant(cfg), sets, nb, ref)
            del sets
        save("tune_gib_rows1")
        return
    if gib == "rows2":    # after one row per program (ONE_ROW_MIN_N) and SMEM_ROWS: logsumexp and backward at N = 1K,
        # long rows with larger shared-memory chunks, log-softmax on the new paths
        for dtype in (torch.float32, torch.bfloat16):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (1024 * size)
            sets = inputs(m, 1024, dtype)
            ref = torch.logsumexp(sets[0][0].float(), -1)
            record("lse", m, 1024, dtype, "torch", lambda x: torch.logsumexp(x, -1), sets, m * 1024 * size, ref)
            old = {"tile": 8192, "prefetch": True} if size == 2 else {"tile": 4096, "prefetch": False, "num_warps": 8}
            for name, cfg in (("default", None), ("old", old), ("w=2", {"num_warps": 2}), ("w=4", {"num_warps": 4}),
                              ("w=8", {"num_warps": 8}), ("tile=2048 w=4", {"tile": 2048, "num_warps": 4})):
                record("lse", m, 1024, dtype, name, fwd_variant(cfg, K.LOGSUMEXP), sets, m * 1024 * size, ref)
            lref = torch.log_softmax(sets[0][0], -1)
            record("log", m, 1024, dtype, "default", fwd_variant(None, K.LOG_SOFTMAX), sets, 2 * m * 1024 * size, lref)
            del sets
            bsets, bref, nb3 = bwd_baseline(m, 1024, dtype)
            for name, cfg in (("tile=1024 w=1", {"tile": 1024, "num_warps": 1}),
                              ("tile=1024 w=2", {"tile": 1024, "num_warps": 2}),
                              ("tile=1024 w=4", {"tile": 1024, "num_warps": 4}),
                              ("tile=2048 w=4", {"tile": 2048, "num_warps": 4})):
                record("bwd", m, 1024, dtype, name, bwd_variant(cfg), bsets, nb3, bref)
            del bsets
        for dtype, n in ((torch.bfloat16, 4096), (torch.bfloat16, 16384), (torch.bfloat16, 32768)):
            m = GIB // (n * 2)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            record("log", m, n, dtype, "default", fwd_variant(None, K.LOG_SOFTMAX), sets, nb,
                   torch.log_softmax(sets[0][0], -1))
            del sets
        long = {4: ((11264, 4), (16384, 8), (16384, 16), (22528, 8)),
                2: ((8192, 2), (16384, 4), (16384, 8), (32768, 8), (32768, 16))}
        for dtype, n in ((torch.float32, 131072), (torch.float32, 262144), (torch.bfloat16, 65536),
                         (torch.bfloat16, 131072), (torch.bfloat16, 262144)):
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for c, w in long[size]:
                record("fwd", m, n, dtype, f"smem chunk={c} w={w}",
                       fwd_variant({"path": "coop", "smem": True, "chunk": c, "num_warps": w}), sets, nb, ref)
            del sets
        save("tune_gib_rows2")
        return
    if gib == "decode":   # decode sizes through the shared-memory coop kernel (SMEM_CONFIG stops at few rows).
        # Run at bb55d03 (tune-gib-decode-bb55d03.log): no variant beat the default by more than 2.0 us of graph
        # replay (fp32 32 x 262144: 28.1 vs 29.5 us; bf16 32 x 262144: 18.9 vs 20.9), most were slower.
        for dtype in (torch.float32, torch.bfloat16):
            for m in (1, 8, 32):
                for n in (128256, 151936, 262144):
                    x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
                    variants = {"torch": lambda x: torch.softmax(x, -1), "default": fwd_variant(None)}
                    for c in (2048, 4096, 8192):
                        for w in (2, 4):
                            variants[f"smem chunk={c} w={w}"] = fwd_variant(
                                {"path": "coop", "smem": True, "chunk": c, "num_warps": w})
                    for name, fn in variants.items():
                        try:
                            torch.testing.assert_close(fn(x), torch.softmax(x, -1))
                        except Exception as e:  # a variant that cannot run here is reported, not fatal
                            print(f"grf  {m:>6}x{n:<7} {str(dtype)[6:]:9} {name:34} FAILED {type(e).__name__}")
                            continue
                        graph_and_overhead(m, n, dtype, name, fn, x)
        with open(f"{out_dir}/tune_gib_decode.json", "w") as f:
            json.dump({"env": env, "copy_ceiling_gbps": ceiling, "graph": GRAPH_ROWS}, f, indent=1)
        return
    if gib == "lse":      # logsumexp (reads x, writes M values): the persistent prefetching loop, chunk sizes
        for dtype in (torch.float32, torch.bfloat16):
            size = torch.finfo(dtype).bits // 8
            for n in (1024, 4096, 16384, 32768, 131072, 262144):
                m = GIB // (n * size)
                sets = inputs(m, n, dtype)
                ref = torch.logsumexp(sets[0][0].float(), -1)
                nb = m * n * size
                record("lse", m, n, dtype, "torch", lambda x: torch.logsumexp(x, -1), sets, nb, ref)
                record("lse", m, n, dtype, "default", fwd_variant(None, K.LOGSUMEXP), sets, nb, ref)
                if n <= K.ROW_MAX_N:
                    variants = {f"prefetch tile={t} waves={w}": {"prefetch": True, "tile": max(t, n), "waves": w}
                                for t in (4096, 8192, 16384) for w in (2, 4)}
                else:
                    variants = {f"chunks chunk={c} w={w}": {"path": "chunks", "chunk": c, "num_warps": w}
                                for c, w in ((2048, 4), (4096, 4), (4096, 8), (16384, 8), (32768, 16))}
                for name, cfg in variants.items():
                    record("lse", m, n, dtype, name, fwd_variant(cfg, K.LOGSUMEXP), sets, nb, ref)
                del sets
        save("tune_gib_lse")
        return
    if gib:
        sweeps = GIB_SWEEPS[gib]
        for (dtype, n), variants in sweeps.items():
            size = torch.finfo(dtype).bits // 8
            m = GIB // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            for name, cfg in variants.items():
                record("fwd", m, n, dtype, name, fwd_variant(cfg), sets, nb, ref)
            if dtype == torch.bfloat16:
                record("log", m, n, dtype, "default", fwd_variant(None, K.LOG_SOFTMAX), sets, nb,
                       torch.log_softmax(sets[0][0], -1))
            del sets
        save(f"tune_gib{gib}")
        return
    if only_long:
        for dtype, n in ((torch.bfloat16, 32768), (torch.float32, 131072), (torch.float32, 262144),
                         (torch.bfloat16, 131072), (torch.bfloat16, 262144)):
            size = torch.finfo(dtype).bits // 8
            m = MB256 // (n * size)
            sets = inputs(m, n, dtype)
            ref = torch.softmax(sets[0][0], -1)
            nb = 2 * m * n * size
            record("fwd", m, n, dtype, "default", fwd_variant(None), sets, nb, ref)
            for chunk in (8192, 16384, 32768):
                for w in (8, 16, 32):
                    record("fwd", m, n, dtype, f"coop chunk={chunk} w={w}",
                           fwd_variant({"path": "coop", "chunk": chunk, "num_warps": w}), sets, nb, ref)
            del sets
        save("tune_long")
        return
    for dtype in (torch.float32, torch.bfloat16):
        size = torch.finfo(dtype).bits // 8
        for n in (1024, 4096, 16384, 32768, 131072, 262144):
            m = MB256 // (n * size)
            sets, ref, nb = fwd_baseline("fwd", m, n, dtype)
            if n <= K.ROW_MAX_N:
                variants = {"no prefetch, grid=tiles": {"prefetch": False},
                            "prefetch waves=1": {"waves": 1}, "prefetch waves=4": {"waves": 4},
                            "prefetch tile=4096": {"tile": 4096}, "prefetch tile=16384": {"tile": 16384},
                            "no prefetch tile=4096": {"prefetch": False, "tile": 4096}}
                if n >= 16384:
                    variants["prefetch warps=32"] = {"num_warps": 32}
                    variants["no prefetch warps=32"] = {"num_warps": 32, "prefetch": False}
                for name, cfg in variants.items():
                    record("fwd", m, n, dtype, name, fwd_variant(cfg), sets, nb, ref)
            else:
                for chunk, w in ((4096, 4), (8192, 8), (8192, 16), (16384, 8)):
                    record("fwd", m, n, dtype, f"coop chunk={chunk} w={w}",
                           fwd_variant({"path": "coop", "chunk": chunk, "num_warps": w}), sets, nb, ref)
            lse_ref = torch.logsumexp(sets[0][0].float(), -1)
            record("lse", m, n, dtype, "torch", lambda x: torch.logsumexp(x, -1), sets, nb // 2, lse_ref)
            record("lse", m, n, dtype, "default", fwd_variant(None, K.LOGSUMEXP), sets, nb // 2, lse_ref)
            record("log", m, n, dtype, "default", fwd_variant(None, K.LOG_SOFTMAX), sets, nb,
                   torch.log_softmax(sets[0][0], -1))
            del sets
            bsets, bref, nb3 = bwd_baseline(m, n, dtype)
            if n > K.ROW_MAX_N // K.BWD_CHUNK_SCALE:
                for chunk in (2048, 8192):
                    record("bwd", m, n, dtype, f"coop chunk={chunk}",
                           bwd_variant({"path": "coop", "chunk": chunk, "num_warps": max(4, chunk // 512)}),
                           bsets, nb3, bref)
            del bsets
        for m in (1, 8, 32):
            for n in (128256, 151936, 262144):
                sets, ref, nb = fwd_baseline("dec", m, n, dtype)
                for chunk in (1024, 2048, 8192):
                    record("dec", m, n, dtype, f"coop chunk={chunk}",
                           fwd_variant({"path": "coop", "chunk": chunk, "num_warps": max(4, chunk // 1024)}),
                           sets, nb, ref)
                for name, fn in (("torch", lambda x: torch.softmax(x, -1)), ("onlinesoftmax", oss.softmax)):
                    graph_and_overhead(m, n, dtype, name, fn, sets[0][0])
    with open(f"{out_dir}/tune_softmax.json", "w") as f:
        json.dump({"env": env, "copy_ceiling_gbps": ceiling, "rows": rows, "graph": GRAPH_ROWS}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".", only_long=sys.argv[2:] == ["long"],
         bf16x2=sys.argv[2:] == ["bf16x2"], gib=sys.argv[3] if sys.argv[2:3] == ["gib"] else None)
