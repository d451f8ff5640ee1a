"""Exact NumPy references (fp64 by default): the seeds' algorithms, transcribed, and the tests' oracle.

Optimised code never imports this package; tests compare every backend against it.
"""

from .sampling import philox_uniform as philox_uniform
from .sampling import sample_distribution as sample_distribution
from .sampling import sample_draw as sample_draw
from .softmax import (
    chunked_online_softmax,
    log_softmax,
    logsumexp,
    naive_softmax,
    online_normalizer,
    online_softmax,
    safe_softmax,
    softmax,
    state_combine,
    tree_reduce_states,
)
from .topk import softmax_topk as softmax_topk

__all__ = [
    "chunked_online_softmax",
    "log_softmax",
    "logsumexp",
    "naive_softmax",
    "online_normalizer",
    "online_softmax",
    "philox_uniform",
    "safe_softmax",
    "sample_distribution",
    "sample_draw",
    "softmax",
    "state_combine",
    "tree_reduce_states",
]
