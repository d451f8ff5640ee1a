"""Plans on hand-built targets (no GPU needed): which path and kernel each problem gets on the H200 (the tuned
tables), on the A100 and L4 (the portable kernels only) and in the interpreter (no coop), the eligibility rules
of the specialised kernels, forced knobs, the row view, and the exponential's constants."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from onlinesoftmax._triton.online import LN2_HI, LN2_LO, LOG2E
from onlinesoftmax.softmax import explain
from onlinesoftmax.softmax import launch as SL
from onlinesoftmax.softmax import tuned as T
from onlinesoftmax.softmax.geometry import row_geometry, rows_or_copy
from onlinesoftmax.softmax.plan import (
    LOG_SOFTMAX,
    LOGSUMEXP,
    SOFTMAX,
    Knobs,
    backward_plan,
    bf16x2_bwd_ok,
    bf16x2_ok,
    choose_path,
    chunking,
    few_rows,
    forward_plan,
    max_chunks,
    reg_fits,
    smem_bwd_config,
    smem_bwd_ok,
    smem_config,
    smem_ok,
)
from onlinesoftmax.target import A100, H200, INTERPRETER, L4

from ._helpers import backward_problem, forward_problem

H200_INTERPRETED = dataclasses.replace(H200, interpret=True)     # the old tests' "132 SMs, interpreter"
GIB = 1 << 30
SPECIALISED = {"smem", "pipe", "stream"}      # the sm_90 kernels (Gluon cp.async, shared-memory tables)


# ---- the row view --------------------------------------------------------------------------------------------
def test_row_geometry_avoids_copies():
    x = torch.randn(4, 9, 5)
    assert row_geometry([x], 1) == (20, 9, 5, [(45, 1, 5)])
    assert row_geometry([x.transpose(0, 2)], 2) == (45, 4, 9, [(1, 5, 45)])
    assert row_geometry([x[:, :, ::2]], 2) == (36, 3, 1, [(5, 0, 2)])
    # three groups of dims that do not fold: no view, the op copies
    y = torch.randn(4, 6, 8, 10)[::2, :, :, ::2]
    assert row_geometry([y], 2) is None
    assert row_geometry([torch.randn(4, 6, 8, 10)[:, ::2, :, ::2]], 2) == (60, 8, 5, [(160, 2, 10)])
    (same,), geo = rows_or_copy([x], 1)                  # a view: the tensor itself
    assert same is x and geo == (20, 9, 5, [(45, 1, 5)])
    (copy,), geo = rows_or_copy([y], 2)                  # no view: a contiguous copy
    assert copy.is_contiguous() and torch.equal(copy, y) and geo == (60, 8, 5, [(40, 1, 5)])


# ---- paths and chunking on the H200 ------------------------------------------------------------------------------
@pytest.mark.parametrize("m,n,path", [
    (65536, 1024, "rows"), (16384, 4096, "rows"), (4096, 16384, "rows"), (2048, 32768, "rows"),
    (512, 131072, "coop"), (256, 262144, "coop"), (1, 262144, "coop"), (32, 151936, "coop"),
    (8, 128256, "coop"), (1, 4096, "rows"), (1, 16384, "rows"), (4, 3_000_000, "split"),
])
def test_path_choice_on_h200(m, n, path):
    assert choose_path(m, n, H200) == path


@pytest.mark.parametrize("m,n,path,chunk", [
    (4096, 32768, "coop", 4096), (2048, 65536, "coop", 4096), (1024, 131072, "coop", 16384),
    (8192, 16384, "rows", None), (32, 151936, "coop", T.COOP_CHUNK),
])
def test_bf16x2_path_and_chunk_on_h200(m, n, path, chunk):
    """bf16 rows the bf16x2 kernel can take: coop from N > BF16X2_ROW_MAX_N with their own chunk sizes;
    decode sizes keep the generic chunking."""
    words = not few_rows(m, H200)
    assert choose_path(m, n, H200, words=words) == path
    if chunk:
        assert chunking(m, n, H200, backward=False, words=words)[0] == chunk


def test_interpreter_uses_split_for_long_rows():
    for target in (INTERPRETER, H200_INTERPRETED):
        assert choose_path(512, 131072, target) == "split"


# ---- the shared-memory kernels on the H200 ----------------------------------------------------------------------
@pytest.mark.parametrize("m,n,size,mode,bf16x2,expect", [
    (2048, 131072, 4, SOFTMAX, False, T.SMEM_CONFIG[4]), (1024, 262144, 4, LOG_SOFTMAX, False, T.SMEM_CONFIG[4]),
    (4096, 131072, 2, SOFTMAX, True, T.SMEM_CONFIG[2]), (2048, 262144, 2, SOFTMAX, True, T.SMEM_CONFIG[2]),
    (4096, 131072, 2, LOG_SOFTMAX, True, T.SMEM_CONFIG[2]), (16384, 32768, 2, SOFTMAX, True, None),
    (8192, 65536, 2, SOFTMAX, True, T.SMEM_CONFIG[2]),
    (4096, 131072, 2, LOG_SOFTMAX, False, T.SMEM_CONFIG[2]), (32, 151936, 4, SOFTMAX, False, None),
    (2048, 128256, 4, SOFTMAX, False, T.SMEM_CONFIG[4]),
    (4096, 100000, 2, SOFTMAX, True, T.SMEM_CONFIG_MASKED[2]),
    (2048, 3 * 16384 + 4095, 4, SOFTMAX, False, T.SMEM_CONFIG_MASKED[4]),
    (2048, 3 * 16384 + 4096, 4, SOFTMAX, False, T.SMEM_CONFIG[4]),
])
def test_smem_kernel_choice_on_h200(m, n, size, mode, bf16x2, expect):
    """Many long rows take the shared-memory coop kernel, except bf16 rows under SMEM_BF16_MIN_N (bf16x2) and
    decode sizes; registers hold part of each chunk (REG) only where every chunk of the row covers them."""
    dtype = torch.float32 if size == 4 else torch.bfloat16 if bf16x2 else torch.float16
    assert smem_config(forward_problem(m, n, dtype, mode), H200, bf16x2) == expect


@pytest.mark.parametrize("m,n,size,log,expect", [
    (2048, 131072, 4, True, (16384, 8, 2, 4)), (4096, 131072, 2, False, (32768, 8, 2, 0)),
    (2048, 262144, 4, False, (10240, 4, 8, 0)), (4096, 131072, 2, True, (16384, 4, 2, 4)),
    (32, 131072, 2, False, None),                                          # decode sizes: the register kernels
    (2048, 32768, 4, False, (8192, 4, 4, 0)),       # 32768 = 3 x 10240 + 2048, under REG's 8 x 512: the next config
    (2048, 3 * 10240 + 4096, 4, False, (10240, 4, 8, 0)),
    (2048, 4 * 8192 + 2047, 4, False, (8192, 4, 0, 0)),     # under both: the last config, reg = 0
    (4096, 32768 + 4095, 2, False, (32768, 8, 0, 0)), (4096, 32768 + 4096, 2, True, (16384, 4, 2, 4)),
    (4096, 16384 + 2047, 2, True, (16384, 4, 0, 4)),          # last chunk under REG's 2 x 1024: reg 0, still RING
])
def test_smem_backward_choice_on_h200(m, n, size, log, expect):
    """Many long rows: the backward takes the shared-memory kernel with REG sub-tiles in registers, in the first
    SMEM_BWD_CONFIG entry whose REG the row's last chunk covers, else the last with reg = 0; decode sizes keep the
    register kernels."""
    dtype = torch.float32 if size == 4 else torch.bfloat16
    assert smem_bwd_config(backward_problem(m, n, dtype, log), H200) == expect


@pytest.mark.parametrize("dtype,m,n,op,expect", [
    (torch.bfloat16, 131072, 4096, "softmax", ("rows", "smem", 4)),
    (torch.float16, 32768, 16384, "log_softmax", ("rows", "smem", 4)),
    (torch.bfloat16, 16384, 32768, "softmax", ("rows", "smem", 16)),
    (torch.bfloat16, 16384, 20000, "softmax", ("rows", "smem", 16)),
    (torch.bfloat16, 32, 32768, "softmax", ("coop", "chunks", 4)),            # decode sizes: the coop path
    (torch.bfloat16, 16384, 32776, "softmax", ("coop", "bf16x2", 4)),         # longer than SMEM_ROWS
    (torch.bfloat16, 16384, 32752, "softmax", ("rows", "smem", 16)),
    (torch.bfloat16, 16384, 32762, "softmax", ("coop", "bf16x2", 4)),         # N not a multiple of 16
    (torch.float32, 16384, 16384, "softmax", ("rows", "rows", 32)),           # fp32 keeps registers
    (torch.bfloat16, 524288, 1024, "softmax", ("rows", "rows", 2)),
    (torch.bfloat16, 32768, 16384, "logsumexp", ("rows", "pipe", 8)),       # logsumexp: LSE_PIPE
])
def test_smem_rows_choice_on_h200(dtype, m, n, op, expect):
    """16-bit rows of SMEM_ROWS lengths (unit stride, N a multiple of 16) run the shared-memory kernel with the
    whole row in one program (no barrier); others, logsumexp and decode sizes do not. Plans on meta tensors."""
    plan = explain(torch.empty((m, n), dtype=dtype, device="meta"), op=op, target=H200)
    assert (plan.path, plan.kernel, plan.num_warps) == expect, plan
    if plan.kernel == "smem" and plan.path == "rows":
        assert plan.chunks == 1 and n <= plan.chunk < n + 8 * 32 * plan.num_warps, plan


def test_smem_plans_keep_coop_max_chunks():
    """A row needing more than COOP_MAX_CHUNKS shared-memory chunks (fp32 log-softmax backward at N = 2^20 with
    4096-element chunks: 256) does not take the smem kernel; its default 16384-element chunks (64) keep it."""
    p = backward_problem(4096, 1 << 20, torch.float32, log=True)
    plan = backward_plan(p, H200)
    assert plan.kernel == "smem" and plan.chunks <= max_chunks(H200) == T.COOP_MAX_CHUNKS, plan
    plan = backward_plan(p, H200, Knobs.of(chunk=4096))
    assert plan.kernel == "chunks" and plan.chunk == T.BWD_COOP_CHUNK, plan
    with pytest.raises(ValueError, match="power of two"):
        forward_plan(forward_problem(64, 1 << 16, torch.float32), H200, Knobs.of(path="coop", chunk=6144))
    with pytest.raises(ValueError, match="cannot wait for each other"):
        forward_plan(forward_problem(64, 1 << 20, torch.float32), H200, Knobs.of(path="coop", chunk=4096,
                                                                                   smem=False))


@pytest.mark.parametrize("case", ["bwd 256 chunks", "fwd 256 chunks", "fwd chunk 6144"])
def test_forced_smem_knobs_refused_leave_a_valid_register_plan(case):
    """A forced smem plan the kernel cannot take (too many chunks; REG sub-tiles past the row's last chunk) falls
    back to a register kernel with a plan that kernel can run: a power-of-two chunk, and on the coop path at most
    max_chunks chunks per row (they wait for each other at the row barrier: more may deadlock). The knobs that
    configured the refused plan do not carry over (here the register kernel's own chunking: 8192, 128 chunks, and
    8192 for 50256: 7 chunks)."""
    if case == "bwd 256 chunks":
        p, make, knobs = backward_problem(4096, 1 << 20, torch.float32, log=True), backward_plan, Knobs.of(chunk=4096)
    elif case == "fwd 256 chunks":
        p, make, knobs = forward_problem(4096, 1 << 20, torch.float32), forward_plan, Knobs.of(chunk=4096)
    else:       # as test_gpu_smem_register_tiles_past_the_row_fall_back: 50256 = 8 x 6144 + 1104 < 2 x 1024
        p, make = forward_problem(6, 50256, torch.float32), forward_plan
        knobs = Knobs.of(path="coop", smem=True, chunk=6144, num_warps=8, reg=2)
    plan = make(p, H200, knobs)
    assert plan.kernel in ("chunks", "bf16x2"), plan
    assert not plan.chunk & (plan.chunk - 1), plan
    assert plan.path != "coop" or plan.chunks <= max_chunks(H200), plan


def test_smem_backward_fp16_register_bound():
    """fp16 holds the backward's register sub-tiles as elements (WORDS is bf16's), where ptxas alone spills: its
    plan carries SMEM_BWD_F16_MAXNREG; bf16 and fp32, and fp16 without register sub-tiles, carry no bound (the
    sm_90a compile is checked in test_compile_sm90.py)."""
    for dtype, knobs, bound in ((torch.float16, Knobs(), T.SMEM_BWD_F16_MAXNREG), (torch.bfloat16, Knobs(), 0),
                                (torch.float32, Knobs(), 0), (torch.float16, Knobs.of(reg=0), 0)):
        p = backward_problem(GIB // (131072 * dtype.itemsize), 131072, dtype, log=False)
        plan = backward_plan(p, H200, knobs)
        assert plan.kernel == "smem" and plan.maxnreg == bound, (dtype, plan)
        assert SL.bind_backward(p, plan, H200).kernels[0].meta.get("maxnreg", 0) == bound


def test_smem_backward_eligibility():
    row = (131072, 0, 1)
    f32, bf = (torch.float32,) * 3, (torch.bfloat16,) * 3

    def ok(geos=(row, row, row), n=131072, dtypes=f32, align=16, target=H200):
        return smem_bwd_ok(backward_problem(2048, n, None, False, align, geos, dtypes), target)

    assert ok()
    assert ok(dtypes=bf)
    assert not ok(align=4)                                                  # a pointer off 16 bytes
    assert not ok(target=INTERPRETER) and not ok(target=H200_INTERPRETED)
    assert not ok(target=A100) and not ok(target=L4)                       # sm_90 only
    assert not ok(dtypes=(torch.float32, torch.bfloat16, torch.float32))
    assert not ok(n=131064)                                                 # N not a multiple of 16
    assert not ok(geos=(row, (131080, 0, 1), row))
    assert not ok(geos=(row, row, (131072, 0, 2)))
    assert not ok(dtypes=(torch.float64,) * 3)


def test_bf16x2_backward_eligibility():
    row = (65536, 0, 1)                       # (stride_outer, stride_inner, stride_n) of contiguous rows

    def ok(geos=(row, row, row), n=65536, align=4, target=H200):
        return bf16x2_bwd_ok(backward_problem(4096, n, torch.bfloat16, False, align, geos), target)

    assert ok() and ok(align=16)
    assert ok(target=A100) and ok(target=L4)                                # sm_80+
    assert not ok(target=INTERPRETER)
    assert not ok(align=1)                                                  # a pointer off a 4-byte boundary
    assert not ok(n=65535)                                                  # odd N
    assert not ok(geos=(row, (65537, 0, 1), row))                           # an odd row stride
    assert not ok(geos=(row, row, (1, 0, 4096)))                            # strided columns
    assert not bf16x2_bwd_ok(backward_problem(4096, 65536, torch.float32, False), H200)


def test_smem_kernel_eligibility():
    """Where the forward's shared-memory kernel may run (its sm_90a compile: test_compile_sm90.py)."""
    row = (131072, 0, 1)

    def ok(dtype=torch.float32, align=16, geo_x=row, n=131072, mode=SOFTMAX, target=H200):
        return smem_ok(forward_problem(2048, n, dtype, mode, align=align, geo_x=geo_x, geo_y=row), target)

    assert ok()
    assert ok(torch.bfloat16) and ok(torch.float16) and ok(mode=LOG_SOFTMAX)
    assert not ok(target=INTERPRETER) and not ok(target=H200_INTERPRETED)
    assert not ok(target=A100) and not ok(target=L4)                       # sm_90 only
    assert not ok(torch.float64)
    assert not ok(align=4)                                                  # x off 16 bytes
    assert not ok(geo_x=(131080, 0, 1))                                     # row stride not a multiple of 16
    assert not ok(geo_x=(131072, 0, 2))                                     # strided columns
    assert not ok(n=131064)                                                 # N not a multiple of 16
    assert not ok(mode=LOGSUMEXP)


def test_bf16x2_eligibility():
    """The forward's packed kernel: sm_80+, bf16 in and out, 4-byte aligned, unit-stride rows of even strides and
    even N, an output per element."""
    def ok(n=65536, align=4, out_dtype=None, mode=SOFTMAX, target=H200, geo_x=None):
        return bf16x2_ok(forward_problem(4096, n, torch.bfloat16, mode, out_dtype, align, geo_x), target)

    assert ok() and ok(target=A100) and ok(target=L4) and ok(mode=LOG_SOFTMAX)
    assert not ok(target=INTERPRETER)
    assert not ok(align=1) and not ok(n=65535) and not ok(out_dtype=torch.float32) and not ok(mode=LOGSUMEXP)
    assert not ok(geo_x=(65537, 0, 1)) and not ok(geo_x=(1, 0, 4096))


@pytest.mark.parametrize("dtype,out_dtype,m,n,mode,keep,bound", [
    (torch.bfloat16, torch.bfloat16, 4096, 131072, SOFTMAX, True, T.SMEM_BF16_MAXNREG),
    (torch.float16, torch.float16, 4185, 128256, SOFTMAX, True, 0),           # fp16 spills under the bound
    (torch.bfloat16, torch.bfloat16, 4096, 131072, LOG_SOFTMAX, False, T.SMEM_BF16_MAXNREG),  # no second exp
    (torch.bfloat16, torch.float32, 4096, 131072, SOFTMAX, False, 0),        # fp32 y: e must not be rounded
    (torch.float32, torch.float32, 2048, 131072, SOFTMAX, False, 0),
    (torch.bfloat16, torch.bfloat16, 32768, 16384, SOFTMAX, False, 0),       # whole rows (SMEM_ROWS)
])
def test_smem_keep_e_and_register_bound_on_h200(dtype, out_dtype, m, n, mode, keep, bound):
    """KEEP_E in the shared-memory kernel: 16-bit softmax with y of x's dtype, in coop chunks only; the register
    bound SMEM_BF16_MAXNREG where bf16 register sub-tiles are held as words (a 9th program per SM)."""
    p = forward_problem(m, n, dtype, mode, out_dtype)
    plan = forward_plan(p, H200)
    assert plan.kernel == "smem" and plan.keep_e is keep and plan.maxnreg == bound, plan
    assert SL.bind_forward(p, plan, H200).kernels[0].meta.get("maxnreg", 0) == bound


@pytest.mark.parametrize("dtype,n,log,align,expect", [
    (torch.float32, 1024, True, 16, ("smem", 4, 0, 1)), (torch.bfloat16, 1024, True, 16, ("smem", 1, 0, 2)),
    (torch.float32, 4096, True, 16, ("smem", 4, 0, 2)), (torch.bfloat16, 4096, True, 16, ("smem", 2, 0, 2)),
    (torch.float32, 16384, True, 16, ("smem", 4, 2, 4)), (torch.bfloat16, 16384, True, 16, ("smem", 2, 2, 4)),
    (torch.float16, 12672, True, 16, ("smem", 2, 2, 4)),
    (torch.float32, 1000, True, 16, None),          # N not a multiple of 16
    (torch.float32, 512, True, 16, None),           # shorter than SMEM_BWD_ROWS
    (torch.bfloat16, 4096, True, 4, None),          # a pointer off 16 bytes
    (torch.float32, 1024, False, 16, ("smem", 4, 0, 0)), (torch.bfloat16, 4096, False, 16, ("smem", 2, 0, 0)),
    (torch.float32, 16384, False, 16, ("smem", 16, 0, 0)), (torch.bfloat16, 16384, False, 16, ("smem", 4, 2, 0)),
    (torch.float32, 4095, False, 16, None),
])
def test_smem_backward_rows_choice_on_h200(dtype, n, log, align, expect):
    """The backward of rows of 1K-16K takes the smem kernel holding a whole row (C = 1, SMEM_BWD_ROWS: y and dy in
    shared memory; log-softmax: dy, y through its ring), with its warps, reg and ring; the others keep the
    register rows kernel."""
    plan = backward_plan(backward_problem(GIB // (n * dtype.itemsize), n, dtype, log, align), H200)
    assert plan.path == "rows", plan
    if expect is None:
        assert plan.kernel == "rows" and plan.block_m > 0, plan
    else:
        assert (plan.kernel, plan.num_warps, plan.reg, plan.ring) == expect and plan.chunks == 1, plan
        assert n <= plan.chunk < n + 16 // dtype.itemsize * 32 * plan.num_warps, plan


@pytest.mark.parametrize("dtype,n,knobs,reg", [
    (torch.bfloat16, 131072, dict(chunk=12288, num_warps=4, reg=4), 4),
    (torch.float32, 131072, dict(chunk=8192, num_warps=4, reg=4), 4),
    (torch.bfloat16, 131072, dict(chunk=4096, num_warps=4, reg=4), None),    # no sub-tile left in shared memory
    (torch.bfloat16, 131072, dict(chunk=8192, num_warps=4, reg=3), None),    # not a power of two
    (torch.float32, 3 * 8192 + 1008, dict(chunk=8192, num_warps=4, reg=2), None),   # last chunk below 2 x 512
])
def test_smem_backward_register_tiles_plan(dtype, n, knobs, reg):
    """Forced `reg` sub-tiles of y and dy in registers in the backward smem kernel; where they cannot be held the
    plan falls back to a register kernel."""
    plan = backward_plan(backward_problem(4096, n, dtype, False), H200, Knobs.of(path="coop", smem=True, **knobs))
    assert (plan.kernel == "smem" and plan.reg) == (reg or False), plan


# ---- logsumexp on the H200 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,m,n,align,expect", [
    (torch.bfloat16, 524288, 1024, 16, ("pipe", 1, 132 * 32)),
    (torch.bfloat16, 65536, 8192, 16, ("pipe", 4, 132 * 4)),
    (torch.bfloat16, 32768, 16384, 16, ("pipe", 8, 132 * 3)),
    (torch.bfloat16, 16384, 32768, 16, ("stream", 4, 132 * 8)),     # LSE_STREAM: the streaming kernel
    (torch.bfloat16, 16384, 20000, 16, ("stream", 4, 132 * 8)),     # 20000 = 16 x 1250: a partial tile
    (torch.bfloat16, 16384, 65520, 16, ("stream", 4, 132 * 8)),
    (torch.float16, 4096, 131072, 16, ("stream", 8, 132 * 4)),      # from 64K: longer tiles
    (torch.bfloat16, 300, 262144, 16, ("stream", 8, 300)),           # fewer rows than programs
    (torch.float32, 1024, 262144, 16, ("chunks", 8, None)),         # fp32 long rows: chunks
    (torch.bfloat16, 4096, 131080, 16, ("chunks", 8, None)),        # N not a multiple of 16
    (torch.bfloat16, 4096, 131072, 4, ("chunks", 8, None)),         # x 8 bytes off a 16-byte boundary
    (torch.float32, 32768, 8192, 16, ("pipe", 8, 132 * 2)),
    (torch.float32, 100, 16384, 16, ("pipe", 8, 100)),              # fewer rows than programs
    (torch.float32, 262144, 1024, 16, ("rows", 4, None)),          # fp32 1K / 2K: the register kernel
    (torch.bfloat16, 65536, 8200, 16, ("rows", 16, None)),         # N past 8192 and not a multiple of 16
    (torch.bfloat16, 65536, 8192, 4, ("rows", 16, None)),          # x 8 bytes off a 16-byte boundary
    (torch.bfloat16, 32, 32768, 16, ("chunks", 4, None)),          # decode sizes: chunks
])
def test_logsumexp_pipe_choice_on_h200(dtype, m, n, align, expect):
    """LSE_PIPE and LSE_STREAM: (kernel, warps, grid) of the logsumexp plan (``align``: the bytes dividing x's data
    pointer)."""
    plan = forward_plan(forward_problem(m, n, dtype, LOGSUMEXP, align=align), H200)
    grid = plan.grid if plan.kernel in ("pipe", "stream") else None
    assert (plan.kernel, plan.num_warps, grid) == expect, plan


# ---- forced kernels ------------------------------------------------------------------------------------------
def test_forced_kernels_without_a_table_entry_need_knobs():
    """pipe / stream / coop-backward smem forced where their table has no entry: every value must come from the
    knobs (the *_FALLBACK tables are gone), else ValueError."""
    lse = forward_problem(4096, 1024, torch.float32, LOGSUMEXP)            # fp32 1K: no LSE_PIPE entry
    assert forward_plan(lse, H200).kernel == "rows"
    with pytest.raises(ValueError, match="LSE_PIPE"):
        forward_plan(lse, H200, Knobs.of(pipe=True))
    with pytest.raises(ValueError, match="ctas"):
        forward_plan(lse, H200, Knobs.of(pipe=True, num_warps=4))
    plan = forward_plan(lse, H200, Knobs.of(pipe=True, num_warps=4, ctas=4))
    assert (plan.kernel, plan.num_warps, plan.grid) == ("pipe", 4, 4 * 132), plan
    lse = forward_problem(1024, 262144, torch.float32, LOGSUMEXP)          # fp32: no LSE_STREAM entry
    assert forward_plan(lse, H200).kernel == "chunks"
    with pytest.raises(ValueError, match="LSE_STREAM"):
        forward_plan(lse, H200, Knobs.of(stream=True))
    plan = forward_plan(lse, H200, Knobs.of(stream=True, num_warps=4, loads=4, ctas=8))
    assert (plan.kernel, plan.num_warps, plan.tile, plan.grid) == ("stream", 4, 4 * 4 * 32 * 4, 1024), plan
    bwd = backward_problem(32, 131072, torch.float32, False)               # decode sizes: no SMEM_BWD_CONFIG entry
    assert backward_plan(bwd, H200).kernel == "chunks"
    with pytest.raises(ValueError, match="SMEM_BWD_CONFIG"):
        backward_plan(bwd, H200, Knobs.of(smem=True))
    plan = backward_plan(bwd, H200, Knobs.of(smem=True, chunk=4096, num_warps=4, reg=0, ring=0))
    assert (plan.path, plan.kernel, plan.chunk, plan.chunks) == ("coop", "smem", 4096, 32), plan


def test_misspelled_knob_is_an_error():
    with pytest.raises(TypeError):
        Knobs.of(chunks=3)                  # the knob is `chunk`
    assert Knobs.of(chunk=3).chunk == 3


# ---- other targets: A100 (sm_80), L4 (sm_89), the interpreter ---------------------------------------------------
# problems for which the H200 takes an sm_90 kernel: (label, forward or backward problem)
SM90_PROBLEMS = [
    ("smem rows bf16", forward_problem(16384, 32768, torch.bfloat16)),
    ("smem rows fp16 log", forward_problem(32768, 16384, torch.float16, LOG_SOFTMAX)),
    ("smem coop fp32", forward_problem(2048, 131072, torch.float32)),
    ("smem coop bf16", forward_problem(4096, 131072, torch.bfloat16)),
    ("smem coop fp16 log", forward_problem(4096, 131072, torch.float16, LOG_SOFTMAX)),
    ("lse pipe bf16", forward_problem(32768, 16384, torch.bfloat16, LOGSUMEXP)),
    ("lse pipe fp32", forward_problem(32768, 8192, torch.float32, LOGSUMEXP)),
    ("lse stream bf16", forward_problem(16384, 32768, torch.bfloat16, LOGSUMEXP)),
    ("lse stream fp16", forward_problem(4096, 131072, torch.float16, LOGSUMEXP)),
    ("bwd smem rows fp32 log", backward_problem(65536, 4096, torch.float32, True)),
    ("bwd smem rows bf16", backward_problem(32768, 16384, torch.bfloat16, False)),
    ("bwd smem coop fp32 log", backward_problem(2048, 131072, torch.float32, True)),
    ("bwd smem coop bf16", backward_problem(4096, 131072, torch.bfloat16, False)),
]
FORCED = [Knobs(), Knobs.of(smem=True), Knobs.of(path="coop", smem=True), Knobs.of(pipe=True),
          Knobs.of(stream=True), Knobs.of(pipe=True, num_warps=4, ctas=4),
          Knobs.of(stream=True, num_warps=4, loads=4, ctas=8)]


def _plan(p, target, knobs=Knobs()):
    return (backward_plan if hasattr(p, "geo_dy") else forward_plan)(p, target, knobs)


@pytest.mark.parametrize("label,p", SM90_PROBLEMS, ids=[lb for lb, _ in SM90_PROBLEMS])
def test_sm90_kernels_on_sm90_only(label, p):
    """The shared-memory and Gluon kernels run on sm_90 only: the H200 takes them for these problems; the A100,
    the L4 and the interpreter never do, even when forced."""
    assert _plan(p, H200).kernel in SPECIALISED, label
    for target in (A100, L4, INTERPRETER, H200_INTERPRETED):
        for knobs in FORCED:
            try:
                plan = _plan(p, target, knobs)
            except ValueError as e:
                # programs run one after another there: a forced coop row (its programs wait for each other) is
                # refused rather than planned into a hang
                assert target.interpret and knobs.path == "coop" and "cannot wait" in str(e), (label, target, e)
                continue
            assert plan.kernel not in SPECIALISED, (label, target, knobs, plan)


@pytest.mark.parametrize("target", [A100, L4], ids=["A100", "L4"])
def test_bf16x2_on_sm80_and_later(target):
    """Many bf16 coop rows take the packed kernels on sm_80+ (the H200 holds these rows in shared memory instead;
    the interpreter keeps them in the register kernels); a pointer off a 4-byte boundary, fp16 and decode sizes
    take the generic kernels."""
    def kernel(p, t=target):
        plan = (backward_plan if hasattr(p, "geo_dy") else forward_plan)(p, t)
        return plan.path, plan.kernel

    p = forward_problem(4096, 32768, torch.bfloat16)          # past BF16X2_ROW_MAX_N: coop for the packed kernel
    assert kernel(p) == ("coop", "bf16x2") and forward_plan(p, target).chunk == T.BF16X2_SHORT_CHUNK
    assert kernel(p, H200) == ("rows", "smem") and kernel(p, INTERPRETER) == ("rows", "rows")
    assert kernel(forward_problem(4096, 32768, torch.bfloat16, align=1)) == ("rows", "rows")
    assert kernel(forward_problem(4096, 32768, torch.float16)) == ("rows", "rows")
    p = forward_problem(4096, 65536, torch.bfloat16)
    assert kernel(p) == ("coop", "bf16x2") and kernel(p, H200) == ("coop", "smem")
    assert kernel(p, INTERPRETER) == ("split", "chunks")
    assert kernel(forward_problem(4096, 65536, torch.bfloat16, align=1)) == ("coop", "chunks")
    assert kernel(forward_problem(4096, 65536, torch.float16)) == ("coop", "chunks")
    assert kernel(forward_problem(4, 131072, torch.bfloat16)) == ("coop", "chunks")          # decode sizes
    b = backward_problem(4096, 131072, torch.bfloat16, False)
    assert kernel(b) == ("coop", "bf16x2") and backward_plan(b, target).chunk == T.BWD_BF16X2_CHUNK
    assert kernel(b, H200) == ("coop", "smem") and kernel(b, INTERPRETER) == ("split", "chunks")
    assert kernel(backward_problem(4096, 131072, torch.bfloat16, False, align=1)) == ("coop", "chunks")
    assert kernel(backward_problem(4096, 131072, torch.float16, False)) == ("coop", "chunks")


def test_max_chunks_per_target():
    """A row's chunks that may wait for each other: COOP_MAX_CHUNKS, and no more than one per SM."""
    assert max_chunks(H200) == T.COOP_MAX_CHUNKS == 128
    assert max_chunks(A100) == 108 and max_chunks(L4) == 58


@pytest.mark.parametrize("m,n,expect", [
    (512, 524288, {"H200": ("coop", 64), "A100": ("coop", 64), "L4": ("split", 64)}),     # COOP_CHUNK
    (512, 1 << 20, {"H200": ("coop", 128), "A100": ("split", 128), "L4": ("split", 128)}),
    (512, 262144, {"H200": ("coop", 32), "A100": ("coop", 32), "L4": ("coop", 32)}),
    # decode: the chunk grows (to COOP_CHUNK at most) until a row fits in max_chunks and M x C in 2 programs per SM
    (1, 262144, {"H200": ("coop", 128), "A100": ("coop", 64), "L4": ("coop", 32)}),
    (1, 1 << 20, {"H200": ("coop", 128), "A100": ("split", 128), "L4": ("split", 128)}),
    (32, 128256, {"H200": ("coop", 16), "A100": ("coop", 16), "L4": ("coop", 16)}),
])
def test_rows_past_max_chunks_split(m, n, expect):
    """Rows that need more chunks than may wait for each other (max_chunks: one per SM, L4 58, A100 108) take
    ``split`` (two launches, no waiting): forward (fp32 and bf16, register kernels), and backward (its own
    chunking: BWD_COOP_CHUNK, at decode sizes BWD_DECODE_CHUNK)."""
    targets = {"H200": H200, "A100": A100, "L4": L4}
    for name, (path, C) in expect.items():
        target = targets[name]
        assert chunking(m, n, target, backward=False)[1] == C, name
        assert (C > max_chunks(target)) == (path == "split") and choose_path(m, n, target) == path, name
        for dtype in (torch.float32, torch.bfloat16):
            plan = forward_plan(forward_problem(m, n, dtype), target, Knobs.of(smem=False, bf16x2=False))
            assert plan.path == path and plan.chunks == C, (name, plan)
        C = chunking(m, n, target, backward=True)[1]
        plan = backward_plan(backward_problem(m, n, torch.float32, False), target, Knobs.of(smem=False))
        assert plan.path == ("split" if C > max_chunks(target) else "coop") and plan.chunks == C, (name, plan)
    # backward decode chunks of BWD_DECODE_CHUNK: 1 x 262144 is 128 of them, 32 x 128256 63 (> L4's 58)
    assert [backward_plan(backward_problem(1, 262144, torch.float32, False), t).path for t in (H200, A100, L4)] \
        == ["coop", "split", "split"]
    assert backward_plan(backward_problem(32, 128256, torch.float32, False), L4).path == "split"


@pytest.mark.parametrize("m,n", [(1, 262144), (8, 151936), (32, 128256), (600, 32768), (4096, 131072),
                                 (65536, 1024), (4, 3_000_000)])
def test_interpreter_target_never_coop(m, n):
    """The interpreter runs programs one after another: no plan whose programs wait for each other (coop), at
    decode and long-row sizes, any dtype, forward, logsumexp and backward."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for mode in (SOFTMAX, LOG_SOFTMAX, LOGSUMEXP):
            plan = forward_plan(forward_problem(m, n, dtype, mode), INTERPRETER)
            assert plan.path in ("rows", "split", "chunks") and plan.kernel in ("rows", "chunks"), plan
            assert not plan.fast_exp, plan
        for log in (False, True):
            plan = backward_plan(backward_problem(m, n, dtype, log), INTERPRETER)
            assert plan.path in ("rows", "split") and plan.kernel in ("rows", "chunks"), plan


# ---- the exponential ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,dtype,n,fast", [
    (SOFTMAX, torch.bfloat16, 512, False), (SOFTMAX, torch.bfloat16, 1024, True),
    (LOG_SOFTMAX, torch.bfloat16, 1024, True), (SOFTMAX, torch.float32, 4096, True),
    (LOGSUMEXP, torch.float32, 1024, True), (LOGSUMEXP, torch.float32, 2048, True),   # not LSE_PIPE lengths
])
def test_fast_exp_choice_on_h200(mode, dtype, n, fast):
    """The rows kernel takes ex2.approx.ftz except for softmax in the prefetching loop (measured slower there);
    the interpreter always takes tl.exp."""
    p = forward_problem(GIB // (n * dtype.itemsize), n, dtype, mode)
    for target, expect in ((H200, fast), (H200_INTERPRETED, False), (INTERPRETER, False)):
        plan = forward_plan(p, target)
        assert plan.path == "rows" and plan.kernel == "rows" and plan.fast_exp is expect, (target, plan)


@pytest.mark.parametrize("fast,mode,out_dtype,level", [
    (True, SOFTMAX, torch.float32, 2), (True, SOFTMAX, torch.bfloat16, 1), (True, SOFTMAX, torch.float16, 1),
    (True, LOG_SOFTMAX, torch.float32, 1), (True, LOGSUMEXP, torch.float32, 1),
    (False, SOFTMAX, torch.float32, 0), (False, LOG_SOFTMAX, torch.bfloat16, 0),
])
def test_exp_level(fast, mode, out_dtype, level):
    """The compensated exponential (FAST == 2) only where softmax writes e^(x - m) to an fp32 output."""
    assert SL.exp_level(fast, mode, out_dtype) == level


def test_compensated_exp_constants():
    """_exp's FAST == 2 in numpy with an exact 2^t (the hardware's ex2.approx adds its own ~2 ulp): LN2_HI + LN2_LO
    is ln 2 to fp32 twice, and the Cody-Waite e^z is within one fp32 eps of fp64 where the plain 2^(fp32 z·L) is
    off by more than 10 eps for large |z|."""
    L = np.float32(LOG2E.value)
    assert L == np.float32(1 / math.log(2))
    z = np.concatenate([np.linspace(-87, 0, 200_001), np.linspace(0, 88, 20_001)]).astype(np.float32)
    t = z * L                                                                   # fp32 product
    e = np.exp2(t.astype(np.float64)).astype(np.float32)
    hi, lo = (np.float64(np.float32(c.value)) for c in (LN2_HI, LN2_LO))
    assert hi + lo == np.float64(np.float32(math.log(2))) + np.float64(np.float32(math.log(2) - hi))
    u = (z.astype(np.float64) - t.astype(np.float64) * hi).astype(np.float32)  # fma(-t, LN2_HI, z)
    u = (u.astype(np.float64) - t.astype(np.float64) * lo).astype(np.float32)  # fma(-t, LN2_LO, u)
    y = (e.astype(np.float64) * u.astype(np.float64) + e).astype(np.float32)   # fma(e, u, e)
    exact = np.exp(z.astype(np.float64))
    eps = float(np.finfo(np.float32).eps)
    assert (np.abs(y - exact) / exact).max() <= 1.0 * eps
    assert (np.abs(e - exact) / exact).max() > 10 * eps


@pytest.mark.parametrize("n,chunk,reg_elems,fits", [
    (131072, 16384, 4096, True), (128256, 16384, 4096, True), (3 * 16384 + 4095, 16384, 4096, False),
    (3 * 16384 + 4096, 16384, 4096, True), (12672, 16384, 2048, True), (1000, 16384, 2048, False),
])
def test_register_sub_tiles_fit_every_chunk(n, chunk, reg_elems, fits):
    """REG keeps the first elements of every chunk in registers unmasked: the row's last chunk must cover them."""
    assert reg_fits(n, chunk, reg_elems) is fits
