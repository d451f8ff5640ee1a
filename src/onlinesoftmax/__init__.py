"""onlinesoftmax: softmax-shaped GPU kernels on the online normalizer state (m, d).

Importing this package never imports Triton or needs a GPU; kernels load on first use.
"""

from .attention import attention, attention_varlen
from .ops.sampling import sample
from .ops.softmax import log_softmax, logsumexp, softmax
from .ops.topk import TopK, softmax_topk
from .state import SoftmaxState

__version__ = "0.1.0"

__all__ = ["SoftmaxState", "__version__", "log_softmax", "logsumexp", "softmax"]
__all__ += ["TopK", "sample", "softmax_topk"]
__all__ += ["attention", "attention_varlen"]
