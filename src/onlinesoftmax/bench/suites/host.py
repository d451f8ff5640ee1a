"""Suite ``host``: host time per eager call, ours and torch's side by side, with and without autograd (a 4 x 1024
softmax: the device work is a few µs, so a Python loop of such calls is bound by what the host spends per call:
argument checks, plan look-up, the launch, and with a gradient the autograd graph node). Goals: with a gradient,
at most 2x torch's host time; softmax at most 1.3x torch.softmax's and ``softmax_topk(x, 50)`` at most
torch.topk's without one (issue 28)."""

from __future__ import annotations

import torch

from ...softmax.api import log_softmax, logsumexp, softmax
from ...topk.api import softmax_topk
from ..harness import BenchContext, Case, register_suite

SHAPE = (4, 1024)


def _same_topk(out, peer):
    """``softmax_topk``'s (p, ids, lse) or ``torch.topk``'s (values, ids) against ``torch.topk``'s: the same ids
    wherever a value is not tied with a neighbour (torch.topk does not fix the order of ties), and
    p = e^(value − lse)."""
    values, peer_ids = peer
    tied = torch.zeros_like(values, dtype=torch.bool)
    eq = values[..., 1:] == values[..., :-1]
    tied[..., 1:] |= eq
    tied[..., :-1] |= eq
    torch.testing.assert_close(out[1][~tied], peer_ids[~tied], rtol=0, atol=0)
    if len(out) == 3:
        torch.testing.assert_close(out[0], torch.exp(values.float() - out[2].unsqueeze(-1)), rtol=1e-5, atol=1e-7)


@register_suite("host", x_label="-")
def suite(ctx: BenchContext):
    dev = ctx.device
    for dtype in (torch.float32,):
        for grad in (False, True):
            def make(grad=grad, dtype=dtype):
                return (torch.randn(*SHAPE, device=dev, dtype=dtype).requires_grad_(grad),)

            tag = "requires_grad" if grad else "no grad"
            for op, ours, theirs in (("softmax", softmax, torch.softmax), ("log_softmax", log_softmax,
                                                                             torch.log_softmax),
                                     ("logsumexp", logsumexp, torch.logsumexp)):
                yield Case(label=f"{op} {tag}", shape=SHAPE, dtype=dtype, make_inputs=make, timing="host",
                           impls={"onlinesoftmax": lambda x, f=ours: f(x, -1), "torch": lambda x, f=theirs: f(x, -1)},
                           peer="torch", group=tag)
            if not grad:
                yield Case(label="softmax_topk k=50 no grad", shape=SHAPE, dtype=dtype, make_inputs=make,
                           timing="host", peer="torch", group=tag,
                           impls={"onlinesoftmax": lambda x: softmax_topk(x, 50),
                                  "torch": lambda x: torch.topk(x, 50, dim=-1)}, check=_same_topk)
            if grad:     # forward and backward, as a training step calls them
                def fwd_bwd(x, f):
                    y = f(x, -1)
                    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
                    return g
                yield Case(label="softmax forward + backward", shape=SHAPE, dtype=dtype, make_inputs=make,
                           timing="host", peer="torch", group=tag,
                           impls={"onlinesoftmax": lambda x: fwd_bwd(x, softmax),
                                  "torch": lambda x: fwd_bwd(x, torch.softmax)})
