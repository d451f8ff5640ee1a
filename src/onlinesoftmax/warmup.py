"""``onlinesoftmax.warmup``: compile, before the first request needs them, the kernels a decode loop or a server
calls: ``softmax_topk`` / ``sample`` for a vocabulary (``topk/warmup.py``), and the softmax family's forward for
row lengths N at every row count up to ``max_rows`` (``softmax.launch.warmup_rows``: one call per compiled variant,
a handful per N). After it, a first call with a new k of a compiled bucket, a new batch size or a new row count
launches without compiling."""

from __future__ import annotations

import torch

from ._checks import check_dtypes, check_ints
from .topk.warmup import BATCH_CLASSES
from .topk.warmup import warmup as topk_warmup

SOFTMAX_OPS = ("softmax", "log_softmax", "logsumexp")


def warmup(vocab_size: int | None = None, *, top_k=(50,), batch_sizes=BATCH_CLASSES, dtypes=(torch.float32,),
           sampling: bool = True, softmax_sizes=(), softmax_ops=("softmax",), max_rows: int = 1024,
           device=None) -> int:
    """Compile ahead of time. ``vocab_size``: ``softmax_topk`` per k bucket of ``top_k`` and ``sample``'s paths
    (with ``sampling``), per batch class and dtype (``onlinesoftmax.topk.warmup``). ``softmax_sizes``: row lengths N
    for ``softmax_ops`` (any of softmax, log_softmax, logsumexp) on contiguous ``[M, N]`` rows, every M up to
    ``max_rows``, per dtype. Each sequence argument also takes a single value (``top_k=50``, ``dtypes=torch.bfloat16``,
    ``softmax_ops="log_softmax"``); every argument is checked before anything runs. Returns the number of calls
    made."""
    from .softmax.api import log_softmax, logsumexp, softmax
    from .target import target_of

    if device is None:
        if not torch.cuda.is_available():
            raise RuntimeError("warmup: no CUDA device to compile for; pass device= (device='cpu' warms the "
                               "interpreter's or the torch path's calls)")
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1):
        raise ValueError(f"warmup: vocab_size must be an int >= 1 (or None), got {vocab_size!r}")
    top_k, batch_sizes = check_ints(top_k, "warmup: top_k"), check_ints(batch_sizes, "warmup: batch_sizes")
    dtypes = check_dtypes(dtypes, "warmup: dtypes")
    softmax_sizes = check_ints(softmax_sizes, "warmup: softmax_sizes")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"warmup: max_rows must be an int >= 1, got {max_rows!r}")
    ops = {"softmax": (softmax, 0), "log_softmax": (log_softmax, 1), "logsumexp": (logsumexp, 2)}
    softmax_ops = (softmax_ops,) if isinstance(softmax_ops, str) else tuple(softmax_ops)
    for name in softmax_ops:
        if not isinstance(name, str) or name not in ops:
            raise ValueError(f"warmup: softmax_ops must name ops of {SOFTMAX_OPS}, got {name!r}")
    calls = 0
    if vocab_size is not None:
        calls += topk_warmup(vocab_size, top_k=top_k, batch_sizes=batch_sizes, dtypes=dtypes, sampling=sampling,
                             device=device)
    if softmax_sizes:
        from .softmax.launch import warmup_rows

        target = target_of(device)
        for N in softmax_sizes:
            for dtype in dtypes:
                for name in softmax_ops:
                    fn, mode = ops[name]
                    for M in warmup_rows(N, dtype, mode, max_rows, target):
                        fn(torch.randn(M, N, device=device).to(dtype), -1)
                        calls += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return calls
