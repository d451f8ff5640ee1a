"""Benchmark harness: ``onlinesoftmax bench`` (see :mod:`onlinesoftmax.bench.harness`)."""

from .harness import SUITES, BenchContext, Case, Row, register_suite

__all__ = ["SUITES", "BenchContext", "Case", "Row", "register_suite"]
