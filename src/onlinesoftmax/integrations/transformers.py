"""Hugging Face transformers on onlinesoftmax: an attention implementation and a causal-LM loss without logits.

    from onlinesoftmax.integrations import transformers as osst
    osst.register()                                             # attn_implementation="onlinesoftmax"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="onlinesoftmax")
    loss = osst.causal_lm_loss(model, input_ids, labels, attention_mask=mask)

The attention function serves what a decoder layer passes: prefill and training (``onlinesoftmax.attention``, or
``attention_varlen`` when a padding mask is present), decoding with transformers' caches (q shorter than k and v:
causal aligned bottom-right, as ``onlinesoftmax.attention`` defines it), GQA, the layer's sliding window and softcap,
``scaling``. It reads the boolean mask transformers builds for SDPA (registered for this implementation too) and
recognises the masks it can express: none, causal (with a sliding window), and those with key padding that leaves
each sequence's keys one contiguous run. Any other mask runs SDPA instead, with one warning.
"""

from __future__ import annotations

import warnings

import torch

from .. import attention as _attention
from .. import attention_varlen as _attention_varlen
from .. import linear_cross_entropy as _linear_cross_entropy
from ..losses.plan import LCEKnobs

NAME = "onlinesoftmax"
# causal_lm_loss's linear cross-entropy: the "tokens" scheme with a logits tile of up to 1 GiB (three LM-head GEMMs
# at full size; the library's 60 MiB "vocab" default recomputes one, the price of a small buffer). A training step
# holds far more than the tile: H200, Llama-3-8B-shaped with 4 layers, 8 x 4096 tokens, bf16
# (tools/probe_tf_train.py at 091dff7, medians of 3 interleaved rounds): 525.9 ms against 600.9 with the default
# and 570.8 for "sdpa" + the model's own loss, the same peak (29181 MiB against sdpa's 74227); 0.5 GiB 536.7, 2 GiB
# 527.7, "vocab" with a 2 GiB budget 579.6.
LOSS_KNOBS = LCEKnobs(scheme="tokens", tile_bytes=1 << 30)
_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def _pattern(Sq: int, Sk: int, causal: bool, left: int, device) -> torch.Tensor:
    """[Sq, Sk] bool: query i attends key j (bottom-right aligned: j <= i + Sk - Sq; window: j >= i + Sk - Sq -
    left)."""
    i = torch.arange(Sq, device=device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=device)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    return keep


def _as_sdpa(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      **kwargs):
    """transformers' attention-interface function: q ``[B, H, Sq, D]``, k / v ``[B, Hkv, Sk, D]`` (GQA: not
    repeated) -> ``(o [B, Sq, H, D], None)``."""
    if dropout and module.training:
        raise ValueError("onlinesoftmax attention: dropout > 0 in training is not supported (set the model's "
                         "attention_dropout to 0)")
    if kwargs.get("output_attentions"):
        raise ValueError("onlinesoftmax attention: output_attentions=True needs the attention weights, which this "
                         "implementation never forms; use attn_implementation='eager'")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    left = sliding_window - 1 if sliding_window else -1
    window = (left, 0 if causal else -1) if left >= 0 else None
    common = dict(scale=scaling, softcap=softcap or None, window=window)
    if attention_mask is None:
        o = _attention(query, key, value, causal=causal, **common)
        return o.transpose(1, 2), None
    if attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        _warn_once("mask", "onlinesoftmax attention: a mask other than transformers' boolean [B, 1, Sq, Sk] SDPA mask "
                   "arrived; this layer runs SDPA instead")
        return _as_sdpa(module, query, key, value, attention_mask, scaling, dropout, is_causal=is_causal,
                        softcap=softcap, **kwargs)
    mask = attention_mask[:, 0, :, -Sk:] if attention_mask.shape[-1] > Sk else attention_mask[:, 0]
    pattern = _pattern(Sq, Sk, causal, left, query.device)
    keep_k = mask.any(1)                                                  # [B, Sk]: keys some query attends
    first = torch.where(keep_k.any(-1), keep_k.to(torch.int8).argmax(-1), torch.full_like(keep_k[:, 0], Sk,
                                                                                         dtype=torch.int64))
    suffix = torch.arange(Sk, device=query.device)[None, :] >= first[:, None]    # left padding: keys [first, Sk)
    pos_q = torch.arange(Sq, device=query.device)[None, :] + (Sk - Sq)
    keep_q = pos_q >= first[:, None]                                     # the queries of real tokens
    want = pattern[None] & suffix[:, None, :]
    # the rows of real queries must be exactly that; padded query rows are left out (their outputs are zeros here,
    # whatever SDPA's mask lets them see)
    if not torch.equal(mask[keep_q], want[keep_q]):
        _warn_once("pattern", "onlinesoftmax attention: a mask that is not causal / sliding-window plus left padding "
                   "arrived; this layer runs SDPA instead")
        return _as_sdpa(module, query, key, value, attention_mask, scaling, dropout, is_causal=is_causal,
                        softcap=softcap, **kwargs)
    if bool(suffix.all()):
        o = _attention(query, key, value, causal=causal, **common)
        return o.transpose(1, 2), None
    # key padding: the real tokens of each sequence, packed (varlen); padded query rows get zeros
    q_rows = query.transpose(1, 2)[keep_q]                              # [total_q, H, D]
    k_rows = key.transpose(1, 2)[suffix]
    v_rows = value.transpose(1, 2)[suffix]
    zero = torch.zeros(1, dtype=torch.int32, device=query.device)
    cu_q = torch.cat([zero, keep_q.sum(-1).cumsum(0).to(torch.int32)])
    cu_k = torch.cat([zero, suffix.sum(-1).cumsum(0).to(torch.int32)])
    o_rows = _attention_varlen(q_rows, k_rows, v_rows, cu_q, cu_k, Sq, Sk, causal=causal, **common)
    out = query.new_zeros(B, Sq, H, value.shape[-1])
    out[keep_q] = o_rows
    return out, None


def register() -> None:
    """Add ``attn_implementation="onlinesoftmax"`` to transformers' AttentionInterface, and its mask (transformers'
    boolean SDPA mask) to the AttentionMaskInterface. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def causal_lm_loss(model, input_ids, labels, *, attention_mask=None, ignore_index: int = -100,
                   num_items_in_batch=None, knobs: LCEKnobs | None = LOSS_KNOBS, **model_kwargs):
    """``model(input_ids, labels=labels).loss`` without the ``[tokens, vocab]`` logits: the base model's hidden states
    and ``onlinesoftmax.linear_cross_entropy`` against ``model.lm_head``; labels shifted as transformers does
    (token t predicts label t + 1, the last position ignored), the model's final logit softcap applied, the mean
    over non-ignored tokens (``num_items_in_batch``: their sum over it, as transformers' gradient accumulation).
    ``knobs``: the loss's ``LCEKnobs`` (default ``LOSS_KNOBS``: a logits tile of up to 1 GiB; None: the library's
    60 MiB default)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    out = base(input_ids=input_ids, attention_mask=attention_mask, **model_kwargs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    head = model.get_output_embeddings()
    shift = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = _linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, shift.reshape(-1).to(hidden.device),
                                 bias=head.bias, ignore_index=ignore_index, reduction=reduction, softcap=softcap,
                                 knobs=knobs)
    return loss / num_items_in_batch if num_items_in_batch is not None else loss
