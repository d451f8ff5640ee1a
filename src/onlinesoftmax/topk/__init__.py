"""The top-k family: fused softmax + top-k (``api.py``: ``softmax_topk``, ``explain``) and sampling
(``sampling.py``); ``plan.py`` chooses the launches, ``kernels.py`` holds them, ``launch.py`` binds them."""

from .api import TopK, explain, softmax_topk
from .sampling import sample

__all__ = ["TopK", "explain", "sample", "softmax_topk"]
