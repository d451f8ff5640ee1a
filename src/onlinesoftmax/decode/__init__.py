"""Decoding attention over a KV cache (dense and paged, split-KV) and the (o, lse) merge of attention states."""

from .api import attention_with_kvcache, explain, explain_merge, merge_attention_states

__all__ = ["attention_with_kvcache", "explain", "explain_merge", "merge_attention_states"]
