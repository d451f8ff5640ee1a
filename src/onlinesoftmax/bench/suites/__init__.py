"""Benchmark suites. Each module registers itself with ``@register_suite``; import it here."""

from . import softmax  # noqa: F401
