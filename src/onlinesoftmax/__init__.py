"""onlinesoftmax: softmax-shaped GPU kernels on the online normalizer state (m, d).

Importing this package never imports Triton or needs a GPU; kernels load on first use.
"""

from .attention import attention, attention_varlen
from .decode import attention_with_kvcache, merge_attention_states
from .losses import cross_entropy, linear_cross_entropy
from .softmax.api import log_softmax, logsumexp, softmax
from .state import SoftmaxState
from .topk.api import TopK, softmax_topk
from .topk.sampling import sample
from .warmup import warmup

__version__ = "0.1.0"

__all__ = ["SoftmaxState", "__version__", "log_softmax", "logsumexp", "softmax"]
__all__ += ["TopK", "sample", "softmax_topk", "warmup"]
__all__ += ["cross_entropy", "linear_cross_entropy"]
__all__ += ["attention", "attention_varlen", "attention_with_kvcache", "merge_attention_states"]
