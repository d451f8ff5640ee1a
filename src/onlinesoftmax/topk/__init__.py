"""The top-k family: fused softmax + top-k (``api.py``: ``softmax_topk``, ``explain``) and sampling
(``sampling.py``: ``sample``, on ``sampling_kernels.py`` bound by ``sampling_launch.py``); ``plan.py`` chooses the
launches, ``kernels.py`` holds them, ``launch.py`` binds them; ``warmup.py`` compiles them ahead of time."""

from .api import TopK, explain, softmax_topk
from .sampling import explain_sample, sample
from .warmup import warmup

__all__ = ["TopK", "explain", "explain_sample", "sample", "softmax_topk", "warmup"]
