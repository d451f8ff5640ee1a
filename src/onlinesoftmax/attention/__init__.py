"""Attention on the online-softmax state (m, d, o): ``attention`` (SDPA layout), ``attention_varlen`` (packed
sequences), ``explain`` (the plan a call runs). Importing this package never imports Triton."""

from .api import attention, attention_varlen, explain

__all__ = ["attention", "attention_varlen", "explain"]
