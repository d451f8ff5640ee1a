"""``warmup``: compile the decode loop's kernels (``softmax_topk``, ``sample``) before the first request needs them.

A kernel compiles once per set of compile-time constants: here the plan's tile sizes (k rounded up to a power of
two, >= 16; the chunk size, from V; the merge's warps, which change between B <= 128 and B > 128), the logits'
dtype, and whether a temperature is folded in. k itself, B and the per-chunk counts are run-time arguments, so a
later call with another k of a compiled bucket, or another B of a compiled class, launches at once.
"""

from __future__ import annotations

import torch

from .._checks import check_dtypes, check_ints
from .._triton.host import pow2
from .api import softmax_topk
from .plan import MIN_KP
from .sampling import _warm_capture_draw, sample

BATCH_CLASSES = (1, 256)        # one B on each side of the merge's few-rows rule (plan.MERGE_FEW_ROWS = 128)


def warmup(vocab_size: int, *, top_k=(50,), batch_sizes=BATCH_CLASSES, dtypes=(torch.float32,),
           sampling: bool = True, device=None) -> int:
    """Run ``softmax_topk`` (and with ``sampling``, ``sample``'s kernel paths: an int top_k with and without a
    temperature (the fused merge and step 2 compile per temperature mode);
    top-p, min-p and per-row top-k on 64 candidates; the exact row kernel) once per k bucket of ``top_k``, batch
    size and dtype, on ``device`` (default: the current CUDA device). Each ``sample`` call that draws is followed by
    an eager launch of the kernels the same call launches when captured into a CUDA graph (their draw differs:
    ``sampling._warm_capture_draw``), so a first capture compiles nothing either. Returns the number of calls made.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"warmup: vocab_size must be an int >= 1, got {vocab_size!r}")
    top_k, batch_sizes = check_ints(top_k, "warmup: top_k"), check_ints(batch_sizes, "warmup: batch_sizes")
    dtypes = check_dtypes(dtypes, "warmup: dtypes")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    buckets = sorted({max(MIN_KP, pow2(min(k, vocab_size))) for k in top_k})
    calls = 0
    for dtype in dtypes:
        for B in batch_sizes:
            x = torch.randn(B, vocab_size, device=device).to(dtype)
            mixes = []
            for kp in buckets:
                k = min(kp, vocab_size)
                softmax_topk(x, k)
                calls += 1
                if sampling:        # the fused merge + step 2 with and without a temperature folded in
                    mixes += [dict(temperature=0.7, top_k=k, top_p=0.9), dict(top_k=k)]
            if sampling:
                mixes += [dict(temperature=0.7, top_p=0.9, min_p=0.05),
                          dict(temperature=torch.full((B,), 0.7, device=device),
                               top_k=torch.full((B,), 100, device=device)),
                          dict(temperature=0.0)]
            for kw in mixes:
                sample(x, **kw)
                calls += 1 + _warm_capture_draw(x, **kw)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return calls
