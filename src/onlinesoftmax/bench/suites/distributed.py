"""Suite ``distributed``: the vocabulary- and context-parallel ops across P processes, one per GPU over NCCL (or,
with ``--device cpu``, a small smoke run of 2 CPU processes over gloo), side by side in one run:

* vocabulary-parallel cross-entropy, forward + backward, each rank holding V / P of the vocabulary, against
  gathering the logits (all_gather) and calling F.cross_entropy, and against our single-process cross_entropy on
  the full logits: time, bytes each rank receives per call, peak memory per rank;
* ring attention, forward + backward, causal, zigzag against contiguous, against our single-process attention on
  the whole sequence where it fits: time and TFLOP/s per rank (4·B·H·S²·D / P per rank, halved for causal, backward
  counted as 2.5x the forward).

Every rank runs the same calls; the times are rank 0's medians of CUDA-synchronised loops after a barrier. The
numbers are checked against the single-process ops before they are timed.
"""

from __future__ import annotations

import os
import socket

import torch

from ..harness import BenchContext, Case, Skip, register_suite

GPU_CE = (8192, 128256)             # tokens, vocabulary (bf16)
GPU_RING = (1, 32, 128, (32768, 131072))   # B, H, D, sequence lengths (bf16, causal)
CPU_CE = (64, 1000)
CPU_RING = (1, 4, 16, (256,))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time(fn, device, reps: int, barrier: bool = True) -> float:
    import statistics
    import time

    import torch.distributed as dist

    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        if barrier:                 # every rank starts each call together
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _worker(rank: int, P: int, port: int, device_type: str, quick: bool, queue):
    import datetime

    import torch.distributed as dist
    import torch.nn.functional as F

    import onlinesoftmax as oss
    from onlinesoftmax import distributed as D

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=300))
    dt = torch.bfloat16 if device_type == "cuda" else torch.float32
    reps = 3 if quick or device_type == "cpu" else 10
    out = []
    try:
        # vocabulary-parallel cross-entropy
        N, V = CPU_CE if device_type == "cpu" else GPU_CE
        if quick and device_type == "cuda":
            N = N // 4
        w = V // P
        g = torch.Generator(device="cpu").manual_seed(0)
        full = (torch.randn(N, V, generator=g) * 2).to(device, dt)
        target = torch.randint(0, V, (N,), generator=g).to(device)
        shard = full[:, rank * w:(rank + 1) * w if rank < P - 1 else V].contiguous().requires_grad_()

        def ours():
            D.cross_entropy(shard, target).backward()

        def gathered():
            parts = [torch.empty(N, (w if r < P - 1 else V - w * (P - 1)), device=device, dtype=dt)
                     for r in range(P)]
            dist.all_gather(parts, shard.detach())
            x = torch.cat(parts, -1).requires_grad_()
            F.cross_entropy(x.float(), target).backward()

        want = F.cross_entropy(full.float(), target)
        got = D.cross_entropy(shard, target)
        torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
        rows = {}
        for name, fn in (("vocab-parallel cross_entropy", ours), ("all_gather + F.cross_entropy", gathered)):
            if device_type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ms = _time(fn, device, reps)
            peak = torch.cuda.max_memory_allocated(device) / 2**20 if device_type == "cuda" else None
            rows[name] = (ms, peak)
        if rank == 0:
            single = full.clone().requires_grad_()

            def one():
                oss.cross_entropy(single, target).backward()

            rows["single-process cross_entropy"] = (_time(one, device, reps, barrier=False), None)
        dist.barrier()
        gathered_bytes = (V - shard.shape[1]) * N * full.element_size()       # the other ranks' logits
        out.append(("ce", (N, V), rows, {"vocab-parallel cross_entropy": 16 * N * P + 8 * P,
                                           "all_gather + F.cross_entropy": gathered_bytes,
                                           "single-process cross_entropy": 0}))
        # ring attention
        B, H, Dh, lengths = CPU_RING if device_type == "cpu" else GPU_RING
        for S in lengths[:1] if quick else lengths:
            S_r = S // P
            q = torch.randn(B, H, S_r, Dh, device=device, dtype=dt, requires_grad=True)
            k = torch.randn(B, H, S_r, Dh, device=device, dtype=dt, requires_grad=True)
            v = torch.randn(B, H, S_r, Dh, device=device, dtype=dt, requires_grad=True)
            do = torch.randn_like(q)
            rows = {}
            for layout in ("zigzag", "contiguous"):
                def ring(layout=layout):
                    o = D.attention(q, k, v, causal=True, layout=layout)
                    torch.autograd.grad(o, (q, k, v), do)
                rows[f"ring {layout}"] = (_time(ring, device, reps), None)
            # received per rank: k/v blocks P - 1 times forward, P - 1 times backward, and the fp32 dK/dV P times
            block = 2 * B * H * S_r * Dh
            ring_bytes = block * (2 * (P - 1) * q.element_size() + 4 * P)
            out.append(("ring", (B, H, S, Dh), rows, {f"ring {lay}": ring_bytes for lay in ("zigzag", "contiguous")}))
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def _run(P: int, device_type: str, quick: bool):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(P, _free_port(), device_type, quick, queue), nprocs=P, join=True,
                       start_method="spawn")
    return queue.get()


@register_suite("distributed", x_label="-")
def suite(ctx: BenchContext):
    if ctx.is_cuda:
        P = torch.cuda.device_count()
        if P < 2:
            raise Skip(f"needs two or more GPUs (one process per GPU over NCCL); this machine has {P}")
    else:
        P = 2
    for kind, shape, rows, comm in _run(P, ctx.device.type, ctx.quick):
        label = (f"cross_entropy {shape[0]}x{shape[1]} over {P} ranks" if kind == "ce" else
                 f"ring attention B{shape[0]} H{shape[1]} S{shape[2]} D{shape[3]} causal over {P} ranks")
        if kind == "ring":
            B, H, S, Dh = shape
            flops = int(2 * B * H * S * S * Dh / P * 3.5)        # per rank: causal halves 4·S²·D, fwd + 2.5x bwd
        info = {name: {"bytes received per call": comm.get(name, "-"),
                       "peak MiB": "-" if peak is None else f"{peak:.0f}"} for name, (_, peak) in rows.items()}
        peer = next(iter(rows))
        yield Case(label=label, shape=shape, dtype=torch.bfloat16 if ctx.is_cuda else torch.float32,
                   make_inputs=lambda: (), impls={n: ms for n, (ms, _) in rows.items()}, peer=peer,
                   flops=flops if kind == "ring" else 0, timing="given", impl_info=info, group=kind)
