"""onlinesoftmax: softmax-shaped GPU kernels on the online normalizer state (m, d).

Importing this package never imports Triton or needs a GPU; kernels load on first use.
"""

from .state import SoftmaxState

__version__ = "0.1.0"

__all__ = ["SoftmaxState", "__version__"]
