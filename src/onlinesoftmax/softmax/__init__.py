"""The softmax family: softmax, log-softmax and logsumexp along one dim, forward and backward.

``api.py`` holds the public functions; ``plan.py`` chooses a kernel for a problem on a target; ``kernels/rows.py``
is the readable kernel (whole rows in registers); ``launch.py`` binds a plan to its kernels.
"""

from .api import explain, log_softmax, logsumexp, softmax

__all__ = ["explain", "log_softmax", "logsumexp", "softmax"]
