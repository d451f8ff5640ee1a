"""Benchmark suites. Each module registers itself with ``@register_suite``; import it here."""

from . import cpu, host, softmax  # noqa: F401
from .attention import suite as _attention_suite  # noqa: F401
from .decode import suite as _decode_suite  # noqa: F401
from .distributed import suite as _distributed_suite  # noqa: F401
from .ladder import suite as _ladder_suite  # noqa: F401
from .losses import suite as _losses_suite  # noqa: F401
from .sampling import suite as _sampling_suite  # noqa: F401
from .topk import suite as _topk_suite  # noqa: F401
