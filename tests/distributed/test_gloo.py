"""The distributed ops in gloo process groups of 2 and 3 CPU processes (127.0.0.1, a free port, a time limit; the
processes are always reaped), against the single-process ops."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _worker import run_ranks  # noqa: E402


@pytest.mark.parametrize("P", [2, 3])
def test_vocab_parallel_gloo(P):
    run_ranks(P, ("check_vocab",))


@pytest.mark.parametrize("P", [2, 3])
def test_softmax_topk_grad_gloo(P):
    run_ranks(P, ("check_topk_grad",))


@pytest.mark.parametrize("P", [2, 3])
def test_vocab_parallel_edges_gloo(P):
    """An empty slice, non-finite logits, fp64 top-k, an out-of-range target (``_worker.check_vocab_edges``)."""
    run_ranks(P, ("check_vocab_edges",))


def test_cross_entropy_ignore_index_checked_gloo():
    run_ranks(2, ("check_ce_ignore_index",))


def test_double_backward_refused_gloo():
    """create_graph=True through any distributed op's backward: a RuntimeError naming it, as the single-GPU ops'
    (``_worker.check_double_backward``); second-order gradients were silently wrong."""
    run_ranks(2, ("check_double_backward",))


@pytest.mark.parametrize("P", [1, 2, 3])
def test_ring_attention_gloo(P):
    run_ranks(P, ("check_ring",))


def test_ring_attention_bad_args_gloo():
    """A batch, dtype or head-dim mismatch is an error naming distributed.attention, and the ring's next call is right
    (``_worker.check_ring_bad_args``)."""
    run_ranks(2, ("check_ring_bad_args",))


@pytest.mark.interpreter
def test_ring_attention_triton_zigzag_gloo():
    """The Triton kernels (the interpreter here) on a zigzag ring: the backward takes each half's lse, a strided
    slice (its Δ and dQ rows were laid out dense but indexed by the slice's strides: out of bounds)."""
    run_ranks(2, ("check_ring_triton",))


@pytest.mark.gpu
@pytest.mark.parametrize("P", [2, 4])
def test_distributed_gloo_shared_gpu(P):
    """Several processes sharing the one GPU over gloo: the same checks on CUDA tensors (bf16 ring attention on the
    Triton kernels)."""
    run_ranks(P, ("check_vocab", "check_ring"), device="cuda")


def test_bench_distributed_suite_on_cpu():
    """`onlinesoftmax bench distributed --device cpu`: 2 gloo processes time the vocabulary-parallel loss against
    gathering the logits, and the two ring layouts; every row has a time and the bytes it receives."""
    import torch

    from onlinesoftmax.bench.harness import BenchContext, run_case
    from onlinesoftmax.bench.suites.distributed import suite

    ctx = BenchContext(device=torch.device("cpu"), quick=True)
    cases = list(suite(ctx))
    assert [c.group for c in cases] == ["ce", "ring"]
    for case in cases:
        rows = run_case("distributed", case, ctx, 1.0, {})
        assert all(r.ok and r.ms > 0 for r in rows)
        assert all(isinstance(r.info["bytes received per call"], int) for r in rows)
    ce = {r.impl: r.info["bytes received per call"] for r in run_case("distributed", cases[0], ctx, 1.0, {})}
    assert ce["vocab-parallel cross_entropy"] < ce["all_gather + F.cross_entropy"]
