"""The ladder's kernels as functions on CUDA fp32 tensors: softmax over the last dimension.

Each function checks its arguments (errors name the argument), makes the input a contiguous (M, N) matrix,
allocates the output with the input's address modulo 16 (the float4 versions need x and y to share their
alignment; see ``split_row`` in common.cu), and launches on torch's current stream.
"""

from __future__ import annotations

import ctypes

import torch

from .._checks import check_float_tensor
from ._build import LadderUnavailable, library

INT_MAX = 2**31 - 1

# V3 (block, vec) instantiations (v3.cu) and the plan: the smallest capacity 4·vec·block that holds the row,
# aiming at 16 cached floats per thread (4 float4: 32 registers, full occupancy by ptxas -v).
V3_CONFIGS = tuple((b, v) for b in (128, 256, 512, 1024) for v in (1, 2, 4, 8))
V3_PLAN = ((128, 1), (128, 2), (128, 4), (256, 4), (512, 4), (1024, 4), (1024, 8))
V3_MAX_N = max(4 * b * v for b, v in V3_PLAN)          # 32768: past it V3 falls back to V2
V1_BLOCKS = (64, 96, 128, 192, 256, 512, 1024)

# What each version is (the seed's table; seed_a100 = % of peak bandwidth on an A100 80GB at 4096 x 4096).
VERSIONS = {
    "v0": dict(idea="one thread per row", passes=2, seed_a100=7),
    "v1": dict(idea="block per row, two-level warp-shuffle (m, d) merge", passes=2, seed_a100=58),
    "v2": dict(idea="V1 + float4 loads/stores", passes=2, seed_a100=70),
    "v3": dict(idea="row cached in registers (one global read)", passes=1, seed_a100=82),
    "v4": dict(idea="V2 + grid-stride over rows", passes=2, seed_a100=72),
    "safe_v1": dict(idea="three-pass safe softmax, V1 level", passes=3, seed_a100=None),
    "safe_v2": dict(idea="three-pass safe softmax, V2 level (float4)", passes=3, seed_a100=None),
}
_VECTORIZED = {"v2", "v3", "v4", "safe_v2"}


def v3_config(n: int) -> tuple[int, int] | None:
    """V3's (block, vec) for rows of ``n`` elements, or None when the row does not fit (V2 runs then)."""
    for b, v in V3_PLAN:
        if n <= 4 * b * v:
            return b, v
    return None


def plan(version: str, n: int, *, block: int | None = None, config: tuple[int, int] | None = None) -> str:
    """Which kernel ``version`` launches for rows of ``n`` elements, e.g. ``'v3<256,4>'`` or ``'v2'``."""
    if version not in VERSIONS:
        raise ValueError(f"ladder.plan: version must be one of {sorted(VERSIONS)}, got {version!r}")
    if version == "v1":
        return f"v1<{block or 256}>"
    if version == "v3":
        cfg = config or v3_config(n)
        return "v2" if cfg is None else f"v3<{cfg[0]},{cfg[1]}>"
    return version


def _stream_and_device(x: torch.Tensor) -> tuple[int, int]:
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return torch.cuda.current_stream(x.device).cuda_stream, dev


def _check_input(x, op: str) -> None:
    check_float_tensor(x, "x", (torch.float32,))
    if not x.is_cuda:
        if not torch.cuda.is_available():
            raise LadderUnavailable(f"ladder.{op} runs CUDA C++ kernels and needs an NVIDIA GPU; "
                                    "torch.cuda.is_available() is False here")
        raise ValueError(f"ladder.{op}: x must be a CUDA tensor, got a tensor on {x.device}")
    n = x.shape[-1] if x.dim() else 1
    if n > INT_MAX:
        raise ValueError(f"ladder.{op}: x has rows of {n} elements; the kernels take at most 2^31 - 1")


def _alloc_out(x2: torch.Tensor) -> torch.Tensor:
    """An (M, N) fp32 tensor whose address is x2's modulo 16 (fresh allocations are 16-byte aligned)."""
    want = x2.data_ptr() % 16
    if want == 0:
        return torch.empty_like(x2)
    buf = torch.empty(x2.numel() + 3, dtype=x2.dtype, device=x2.device)
    k = ((want - buf.data_ptr() % 16) % 16) // 4
    return buf[k:k + x2.numel()].view(x2.shape)


def _check_out(out, x2: torch.Tensor, shape, op: str, vectorized: bool) -> torch.Tensor:
    check_float_tensor(out, "out", (torch.float32,))
    if out.device != x2.device or tuple(out.shape) != tuple(shape) or not out.is_contiguous():
        raise ValueError(f"ladder.{op}: out must be a contiguous tensor of shape {tuple(shape)} on "
                         f"{x2.device}, got shape {tuple(out.shape)} on {out.device} "
                         f"(contiguous={out.is_contiguous()})")
    if vectorized and (out.data_ptr() - x2.data_ptr()) % 16:
        raise ValueError(f"ladder.{op}: out must have the same address as x modulo 16 bytes (the float4 "
                         f"kernels load and store the same vectors); got x % 16 = {x2.data_ptr() % 16}, "
                         f"out % 16 = {out.data_ptr() % 16}")
    return out.view(x2.shape)


def _run(op: str, x, out, launch) -> torch.Tensor:
    _check_input(x, op)
    shape = x.shape
    n = shape[-1] if x.dim() else 1
    x2 = x.contiguous().view(-1, n) if x.numel() else x.reshape(-1, max(n, 1))
    vectorized = op in _VECTORIZED
    y2 = _alloc_out(x2) if out is None else _check_out(out, x2, shape, op, vectorized)
    m = x2.shape[0]
    if m and n:
        lib = library()
        stream, dev = _stream_and_device(x2)
        code = launch(lib, ctypes.c_void_p(x2.data_ptr()), ctypes.c_void_p(y2.data_ptr()), m, n,
                      ctypes.c_void_p(stream), dev)
        if code:
            raise RuntimeError(f"ladder.{op}: CUDA error {code} ({lib.ladder_error_string(code).decode()}) "
                               f"for x of shape {tuple(shape)}")
    return out if out is not None else y2.view(shape)


def v0(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Seed V0: one thread per row (softmax over the last dim of a CUDA fp32 tensor)."""
    return _run("v0", x, out, lambda lib, xp, yp, m, n, s, d: lib.ladder_v0(xp, yp, m, n, s, d))


def v1(x: torch.Tensor, *, block: int = 256, out: torch.Tensor | None = None) -> torch.Tensor:
    """Seed V1: one block per row, two-level warp-shuffle (m, d) merge. ``block`` in :data:`V1_BLOCKS`."""
    if block not in V1_BLOCKS:
        raise ValueError(f"ladder.v1: block must be one of {V1_BLOCKS}, got {block!r}")
    return _run("v1", x, out, lambda lib, xp, yp, m, n, s, d: lib.ladder_v1(xp, yp, m, n, block, s, d))


def v2(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Seed V2: V1 with float4 loads and stores (any N, any alignment: scalar head and tail)."""
    return _run("v2", x, out, lambda lib, xp, yp, m, n, s, d: lib.ladder_v2(xp, yp, m, n, s, d))


def v3(x: torch.Tensor, *, config: tuple[int, int] | None = None,
       out: torch.Tensor | None = None) -> torch.Tensor:
    """Seed V3: the row cached in registers, one global read. Rows longer than :data:`V3_MAX_N` run V2.

    ``config=(block, vec)`` picks an instantiation from :data:`V3_CONFIGS` (capacity 4·vec·block elements);
    by default :func:`v3_config` chooses. :func:`plan` says which kernel runs.
    """
    n = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 1
    if config is not None:
        if tuple(config) not in V3_CONFIGS:
            raise ValueError(f"ladder.v3: config must be one of {V3_CONFIGS}, got {config!r}")
        if n > 4 * config[0] * config[1]:
            raise ValueError(f"ladder.v3: config={tuple(config)} holds rows of at most "
                             f"{4 * config[0] * config[1]} elements, x has rows of {n}")
        cfg = tuple(config)
    else:
        cfg = v3_config(n)
    if cfg is None:
        return v2(x, out=out)
    block, vec = cfg
    return _run("v3", x, out,
                lambda lib, xp, yp, m, n_, s, d: lib.ladder_v3(xp, yp, m, n_, block, vec, s, d))


def v4(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Seed V4: V2 with a resident grid striding over the rows."""
    return _run("v4", x, out, lambda lib, xp, yp, m, n, s, d: lib.ladder_v4(xp, yp, m, n, s, d))


def safe_v1(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Three-pass safe softmax (max, sum, normalise), V1 structure (scalar loads)."""
    return _run("safe_v1", x, out, lambda lib, xp, yp, m, n, s, d: lib.ladder_safe_v1(xp, yp, m, n, s, d))


def safe_v2(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Three-pass safe softmax, V2 structure (float4)."""
    return _run("safe_v2", x, out, lambda lib, xp, yp, m, n, s, d: lib.ladder_safe_v2(xp, yp, m, n, s, d))


FUNCTIONS = {"v0": v0, "v1": v1, "v2": v2, "v3": v3, "v4": v4, "safe_v1": safe_v1, "safe_v2": safe_v2}


def kernel_info(version: str, *, n: int = 4096, m: int = 0, block: int = 256,
                config: tuple[int, int] | None = None, device: int | None = None) -> dict:
    """Registers, local memory and resident blocks per SM of the kernel ``version`` launches for rows of
    ``n`` (read from the device: cudaFuncGetAttributes and the occupancy API). Needs a GPU."""
    if not torch.cuda.is_available():
        raise LadderUnavailable("ladder.kernel_info reads the GPU's kernel attributes and needs a CUDA GPU")
    lib = library()
    dev = torch.cuda.current_device() if device is None else device
    regs, local, per_sm, blk, grid = (ctypes.c_int() for _ in range(5))
    with torch.cuda.device(dev):
        kernel = plan(version, n, block=block, config=config)
        if kernel.startswith("v1"):
            blk.value = block
            code = lib.ladder_v1_info(block, regs, local, per_sm)
        elif kernel.startswith("v3"):
            b, v = config or v3_config(n)
            blk.value = b
            code = lib.ladder_v3_info(b, v, regs, local, per_sm)
        elif kernel == "v4":
            code = lib.ladder_v4_info(dev, m, blk, grid, regs, local, per_sm)
        elif kernel in ("safe_v1", "safe_v2"):
            code = lib.ladder_safe_info(int(kernel == "safe_v2"), blk, regs, local, per_sm)
        else:
            code = getattr(lib, f"ladder_{kernel}_info")(blk, regs, local, per_sm)
    if code:
        raise RuntimeError(f"ladder.kernel_info({version!r}): CUDA error {code} "
                           f"({lib.ladder_error_string(code).decode()})")
    props = torch.cuda.get_device_properties(dev)
    warps = per_sm.value * blk.value // 32
    info = dict(kernel=kernel, block=blk.value, regs=regs.value, local_bytes=local.value,
                blocks_per_sm=per_sm.value, occupancy=warps / (props.max_threads_per_multi_processor // 32))
    if kernel == "v4":
        info["grid"] = grid.value
    return info
