"""Ops across ranks of a torch.distributed process group (NCCL on GPUs, gloo on CPU): the (m, d) state and the
(o, lse) merge are associative, so a row split across ranks is normalised with O(rows) communication.

``vocab_parallel``: rank r holds a contiguous slice of the last dim (slices in rank order, any sizes).
``context_parallel``: ring attention over a sequence split across the ranks ("contiguous" or "zigzag").
"""

from .context_parallel import attention
from .vocab_parallel import cross_entropy, log_softmax, logsumexp, softmax, softmax_topk

__all__ = ["attention", "cross_entropy", "log_softmax", "logsumexp", "softmax", "softmax_topk"]
