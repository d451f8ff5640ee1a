"""Losses on the online normalizer state: ``cross_entropy`` and ``linear_cross_entropy`` (class dim last).

``explain(fn, *args, **kwargs)`` returns the plan ``fn(*args, **kwargs)`` would run (a
:class:`~onlinesoftmax.losses.plan.CEPlan` or :class:`~onlinesoftmax.losses.plan.LCEPlan`).
"""

from .cross_entropy import cross_entropy, explain_cross_entropy
from .linear_cross_entropy import explain_linear_cross_entropy, linear_cross_entropy
from .plan import CEKnobs, CEPlan, LCEKnobs, LCEPlan

__all__ = ["CEKnobs", "CEPlan", "LCEKnobs", "LCEPlan", "cross_entropy", "explain", "linear_cross_entropy"]


def explain(fn, *args, **kwargs):
    """The plan of ``fn(*args, **kwargs)`` for ``fn`` in (cross_entropy, linear_cross_entropy); also takes
    ``need_grad=`` and ``target_gpu=`` (a :class:`~onlinesoftmax.target.Target`, e.g. ``A100``)."""
    if fn is cross_entropy:
        return explain_cross_entropy(*args, **kwargs)
    if fn is linear_cross_entropy:
        return explain_linear_cross_entropy(*args, **kwargs)
    raise TypeError(f"explain: fn must be cross_entropy or linear_cross_entropy, got {fn!r}")
