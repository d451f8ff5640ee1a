"""Suite ``ladder``: the seed tutorial's CUDA C++ V0–V4 re-measured, and the paper's online-vs-safe step.

1. The seed's table (A100 80GB, 4096 x 4096 fp32) beside ours at 4096 x 4096 and 32768 x 4096 fp32: every
   version, the three-pass safe softmax at the V1/V2 level, this project's Triton softmax (when
   ``onlinesoftmax.softmax`` exists) and torch.softmax. Peer: V0, so "× peer" is the seed's speed-up over V0.
   Extra columns (``Case.impl_info``): idea, global passes, the seed's A100 %, and registers / resident
   blocks per SM / occupancy read from the device (cudaFuncGetAttributes + the occupancy API).
2. V3's (block, vec) instantiations at the large size (what the default plan was chosen from).
3. Online vs safe (paper §5: ≈1.3× at large batch, ≈1.15× at small): N = 256 … 65536 at M·N = 2^26
   (large batch) and M = 16 (small batch), one case per level (V1: scalar, V2: float4) with the safe kernel
   as peer, so "× peer" is the online speed-up. The PNG plots GB/s against N.

Bytes: read x once + write y once (8·M·N for fp32), whatever the kernel's passes; the passes column says
how many times it actually reads x.
"""

from __future__ import annotations

import torch

from ..harness import BenchContext, Case, Skip, register_suite

SEED_SHAPES = ((4096, 4096), (32768, 4096))
SEED_SHAPES_QUICK = ((4096, 4096),)
ONLINE_VS_SAFE_N = tuple(2**k for k in range(8, 17))      # 256 … 65536
ONLINE_VS_SAFE_N_QUICK = (256, 4096, 65536)
LARGE_BATCH_ELEMS = 1 << 26
SMALL_BATCH_M = 16
V3_SWEEP = ((128, 8), (256, 4), (512, 2), (1024, 1))     # capacity 4096 each


def _label(name: str) -> str:
    return name.replace("safe_v", "safe V").replace("v", "V") if name.startswith(("v", "safe")) else name


def _device_info(ladder, version: str, n: int, m: int, **kw) -> dict:
    try:
        k = ladder.kernel_info(version, n=n, m=m, **kw)
    except Exception as e:  # reported, not fatal: the timing still runs
        return {"kernel": f"? ({type(e).__name__})"}
    out = {"kernel": k["kernel"], "regs": k["regs"], "local B": k["local_bytes"],
           "blocks/SM": k["blocks_per_sm"], "occupancy": f"{100 * k['occupancy']:.0f}%"}
    if "grid" in k:
        out["kernel"] += f" grid {k['grid']}"
    return out


def _make(ctx: BenchContext, m: int, n: int):
    return lambda: (torch.randn(m, n, device=ctx.device, dtype=torch.float32),)


@register_suite("ladder")
def suite(ctx: BenchContext):
    if not ctx.is_cuda:
        raise Skip("the seed's CUDA C++ kernels need a CUDA GPU")
    if not ctx.want(torch.float32):
        raise Skip("fp32 only")
    import onlinesoftmax
    from onlinesoftmax import ladder

    seed_shapes = SEED_SHAPES_QUICK if ctx.quick else SEED_SHAPES
    for m, n in seed_shapes:
        impls, info = {}, {}
        for name, meta in ladder.VERSIONS.items():
            label = _label(name)
            impls[label] = ladder.FUNCTIONS[name]
            a100 = meta["seed_a100"]
            info[label] = {"idea": meta["idea"], "passes": meta["passes"],
                           "seed A100 %": "-" if a100 is None else a100, **_device_info(ladder, name, n, m)}
        if hasattr(onlinesoftmax, "softmax"):
            impls["Triton (onlinesoftmax.softmax)"] = lambda x: onlinesoftmax.softmax(x, dim=-1)
            info["Triton (onlinesoftmax.softmax)"] = {"idea": "this project's Triton kernel", "passes": "-",
                                                      "seed A100 %": "-"}
        impls["torch.softmax"] = lambda x: torch.softmax(x, dim=-1)
        info["torch.softmax"] = {"idea": "PyTorch", "passes": "-", "seed A100 %": "-"}
        # I/O: read x (M·N fp32) + write y (M·N fp32)
        yield Case(label=f"seed table {m}x{n}", shape=(m, n), dtype=torch.float32,
                   make_inputs=_make(ctx, m, n), impls=impls, peer="V0", bytes=8 * m * n, impl_info=info)

    if not ctx.quick:
        m, n = SEED_SHAPES[-1]
        impls, info = {}, {}
        for b, v in V3_SWEEP:
            label = f"V3<{b},{v}>"
            impls[label] = lambda x, cfg=(b, v): ladder.v3(x, config=cfg)
            info[label] = _device_info(ladder, "v3", n, m, config=(b, v))
        yield Case(label=f"V3 configs {m}x{n}", shape=(m, n), dtype=torch.float32,
                   make_inputs=_make(ctx, m, n), impls=impls, peer="V3<256,4>", bytes=8 * m * n,
                   impl_info=info)

    ns = ONLINE_VS_SAFE_N_QUICK if ctx.quick else ONLINE_VS_SAFE_N
    elems = LARGE_BATCH_ELEMS >> (2 if ctx.quick else 0)
    for batch, group in (("large", f"large batch, M·N = 2^{elems.bit_length() - 1}"),
                         ("small", f"small batch, M = {SMALL_BATCH_M}")):
        for n in ns:
            m = max(1, elems // n) if batch == "large" else SMALL_BATCH_M
            for level in ("v1", "v2"):
                safe, online = _label("safe_" + level), _label(level)
                yield Case(label=f"online vs safe {level.upper()} {m}x{n}", shape=(m, n), dtype=torch.float32,
                           make_inputs=_make(ctx, m, n), x=n, group=group, bytes=8 * m * n, peer=safe,
                           impls={safe: ladder.FUNCTIONS["safe_" + level], online: ladder.FUNCTIONS[level]})
