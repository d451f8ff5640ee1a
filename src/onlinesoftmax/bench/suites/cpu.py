"""Suite ``cpu``: every op on CPU tensors against torch's own CPU ops, on the shapes a CPU user runs (the LM head
of a small model: 128 x 32000 fp32, and 8 x 128256 for sampling). On the CPU the library runs its portable path,
which calls torch's kernels wherever the semantics match; this suite shows what that costs on top of torch (goal:
within 1.1x of torch for each op). Runs on the CPU whatever device the run names."""

from __future__ import annotations

import torch

from ...softmax.api import log_softmax, logsumexp, softmax
from ...topk.api import softmax_topk
from ...topk.sampling import sample
from ..harness import BenchContext, Case, Skip, register_suite

SHAPES = ((128, 32000), (8, 128256))
K, TOP_P = 50, 0.9


def _torch_sample(x, gen):
    """torch's own chain for top-k + top-p sampling: softmax -> topk -> top-p mask -> multinomial."""
    p, idx = torch.softmax(x, -1).topk(K, -1)
    keep = (p.cumsum(-1) - p) < TOP_P * p.sum(-1, keepdim=True)
    p = torch.where(keep, p, torch.zeros_like(p))
    pick = torch.multinomial(p, 1, generator=gen)
    return idx.gather(-1, pick).squeeze(-1), torch.log(p.gather(-1, pick) / p.sum(-1, keepdim=True)).squeeze(-1)


def _check_sample(out, ref):
    ids, logp = out
    assert ids.shape == ref[0].shape and torch.isfinite(logp).all() and (logp <= 0).all()


@register_suite("cpu", x_label="N")
def suite(ctx: BenchContext):
    if ctx.device.type != "cpu":
        raise Skip("a CPU suite: run it with --device cpu")
    if not ctx.want(torch.float32):
        raise Skip("fp32 only")
    shapes = SHAPES[:1] if ctx.quick else SHAPES
    gen = torch.Generator().manual_seed(0)
    for m, n in shapes:
        def make(m=m, n=n):
            return (torch.randn(m, n, generator=gen) * 3,)

        nbytes = 4 * m * n
        ops = {
            "softmax": ({"onlinesoftmax": lambda x: softmax(x, -1), "torch": lambda x: torch.softmax(x, -1)}, 2),
            "log_softmax": ({"onlinesoftmax": lambda x: log_softmax(x, -1),
                             "torch": lambda x: torch.log_softmax(x, -1)}, 2),
            "logsumexp": ({"onlinesoftmax": lambda x: logsumexp(x, -1), "torch": lambda x: torch.logsumexp(x, -1)},
                          1),
            f"softmax_topk k={K}": ({"onlinesoftmax": lambda x: softmax_topk(x, K)[:2],
                                     "torch": lambda x: tuple(torch.softmax(x, -1).topk(K, -1))}, 1),
        }
        for op, (impls, reads) in ops.items():
            yield Case(label=f"{op} {m}x{n}", shape=(m, n), dtype=torch.float32, make_inputs=make, impls=impls,
                       peer="torch", bytes=reads * nbytes, group=op)
        yield Case(label=f"sample top_k={K} top_p={TOP_P} {m}x{n}", shape=(m, n), dtype=torch.float32,
                   make_inputs=make, peer="torch", bytes=nbytes, group="sample", check=_check_sample,
                   impls={"onlinesoftmax": lambda x: sample(x, top_k=K, top_p=TOP_P, generator=gen),
                          "torch": lambda x: _torch_sample(x, gen)})
