"""Hugging Face transformers on onlinesoftmax: an attention implementation and a causal-LM loss without logits.

    from onlinesoftmax.integrations import transformers as osst
    osst.register()                                             # attn_implementation="onlinesoftmax"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="onlinesoftmax")
    loss = osst.causal_lm_loss(model, input_ids, labels, attention_mask=mask)

The attention function serves what a decoder layer passes: prefill and training (``onlinesoftmax.attention``, or
``attention_varlen`` when a padding mask is present), decoding with transformers' caches (q shorter than k and v:
causal aligned bottom-right, as ``onlinesoftmax.attention`` defines it; a static cache's unwritten slots left out),
GQA, the layer's sliding window and softcap, ``scaling``, attention sinks (``s_aux``: merged into each row's
normalizer; sinks per query, Inkling 2's, run the explicit fp32 attention with one warning). It reads the boolean
mask transformers builds for SDPA (registered for this implementation too) and recognises the masks it can express:
none, causal (with a sliding window), and those with padding at one end (left or right) that leaves each sequence's
keys one contiguous run. Any other mask, and an additive position bias (Inkling's ``position_bias``), runs SDPA
instead (the explicit fp32 scores where the layer has a softcap or sinks, which SDPA refuses), with one warning.
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


def _fallback(module, query, key, value, attention_mask, scaling, dropout, softcap, sinks, causal: bool, why: str,
              **kwargs):
    """A layer this implementation does not express: transformers' SDPA function, or where the layer has a softcap
    or attention sinks (which SDPA refuses) the explicit scores in fp32 (no mask: causal as SDPA's is_causal, top
    left, where more than one query; a ``position_bias`` added to the scores); one warning per reason."""
    _warn_once(why, f"onlinesoftmax attention: {why}; this layer runs "
               f"{'SDPA' if softcap is None and sinks is None else 'explicit fp32 attention'} instead")
    if softcap is None and sinks is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    g = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(g, 1).float(), value.repeat_interleave(g, 1).float()
    s = query.float() @ k.transpose(-1, -2) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if kwargs.get("position_bias") is not None:     # an additive bias per score (Inkling's relative positions)
        s = s + kwargs["position_bias"].float()
    if attention_mask is None and causal and query.shape[2] > 1:
        attention_mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()[None, None]
    if attention_mask is not None:
        m = attention_mask[:, :, :, : k.shape[-2]]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    if sinks is not None:                       # one more logit per head (or per query) in each row's softmax, no value
        sinks = sinks.float().reshape(1, -1, 1, 1) if sinks.dim() == 1 else sinks.float()
        s = torch.cat([s, sinks.expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)    # a row that attends nothing: zeros
    o = p[..., : k.shape[-2]] @ v
    return o.to(query.dtype).transpose(1, 2).contiguous(), None


def _with_sinks(fn, sinks: torch.Tensor | None, *args, **kwargs) -> torch.Tensor:
    """``fn(*args, **kwargs)`` (attention or attention_varlen) with the layer's attention sinks: a sink is one more
    score s_h per head with no value, so each row's normalizer grows from e^lse to e^lse + e^s_h and o scales by
    e^lse / (e^lse + e^s_h) = sigmoid(lse − s_h) (the row's (m, d) state merged with the sink's)."""
    if sinks is None:
        return fn(*args, **kwargs)
    o, lse = fn(*args, return_lse=True, **kwargs)
    if fn is _attention_varlen:                 # o [total_q, H, D], lse [H, total_q]
        w = torch.sigmoid(lse.transpose(0, 1) - sinks.float()[None, :])
    else:                                       # o [B, H, Sq, D], lse [B, H, Sq]
        w = torch.sigmoid(lse - sinks.float()[None, :, None])
    return (o.float() * w[..., None]).to(o.dtype)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      **kwargs):
    """transformers' attention-interface function: q ``[B, H, Sq, D]``, k / v ``[B, Hkv, Sk, D]`` (GQA: not
    repeated) -> ``(o [B, Sq, H, D], None)``. Attention sinks (``s_aux=`` / ``sinks=``, one score per head) are
    merged into each row's normalizer; sinks per query (``[B, H, Sq, 1]``) run the explicit fp32 attention."""
    if dropout and module.training:
        raise ValueError("onlinesoftmax attention: dropout > 0 in training is not supported (set the model's "
                         "attention dropout probability to 0: config.attention_dropout, or attn_pdrop for GPT-2)")
    if kwargs.get("output_attentions"):
        raise ValueError("onlinesoftmax attention: output_attentions=True needs the attention weights, which this "
                         "implementation never forms; use attn_implementation='eager'")
    s_aux, sinks = kwargs.pop("s_aux", None), kwargs.pop("sinks", None)
    sinks = s_aux if s_aux is not None else sinks
    softcap = softcap or None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    fallback = dict(module=module, query=query, key=key, value=value, attention_mask=attention_mask, scaling=scaling,
                    dropout=dropout, softcap=softcap, sinks=sinks, causal=causal, is_causal=is_causal, **kwargs)
    if value.shape[-1] != D:
        return _fallback(why="a value head dim unlike the query's arrived", **fallback)
    if kwargs.get("position_bias") is not None:
        return _fallback(why="an additive position bias arrived", **fallback)
    if sinks is not None and sinks.dim() != 1:
        return _fallback(why="attention sinks per query (Inkling 2's [B, H, Sq, 1]) arrived", **fallback)
    left = sliding_window - 1 if sliding_window else -1
    window = (left, 0 if causal else -1) if left >= 0 else None
    common = dict(scale=scaling, softcap=softcap, window=window)
    if attention_mask is None:
        if causal and 1 < Sq < Sk:
            # transformers skips the mask of an empty static cache's prefill for SDPA's top-left is_causal: the keys
            # past Sq are the cache's unwritten slots
            key, value = key[:, :, :Sq], value[:, :, :Sq]
        return _with_sinks(_attention, sinks, query, key, value, causal=causal, **common).transpose(1, 2), None
    if (attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
            or attention_mask.shape[0] not in (1, B)):
        return _fallback(why="a mask other than transformers' boolean [B, 1, Sq, Sk] SDPA mask arrived", **fallback)
    mask = attention_mask[:, 0, :, -Sk:] if attention_mask.shape[-1] > Sk else attention_mask[:, 0]
    mask = mask.expand(B, Sq, Sk)
    keep_k = mask.any(1)                                                  # [B, Sk]: keys some query attends
    used = keep_k.any(0)
    if Sk > 1 and not bool(used[-1]) and bool(used.any()):
        # trailing keys no query attends (a static cache's unwritten slots): dropped, down to the queries' own
        # (right padding in every row leaves its last keys unattended too, and they keep the queries' alignment)
        Sk = max(int(used.nonzero().max()) + 1, Sq)
        key, value, mask, keep_k = key[:, :, :Sk], value[:, :, :Sk], mask[..., :Sk], keep_k[:, :Sk]
    j = torch.arange(Sk, device=query.device)
    some = keep_k.any(-1)                                                 # no key attended: the run [Sk, 0)
    first = torch.where(some, keep_k.to(torch.int8).argmax(-1), Sk)
    last = torch.where(some, Sk - keep_k.flip(-1).to(torch.int8).argmax(-1), 0)
    run = (j[None, :] >= first[:, None]) & (j[None, :] < last[:, None])  # each sequence's keys: [first, last)
    pos_q = torch.arange(Sq, device=query.device)[None, :] + (Sk - Sq)
    keep_q = (pos_q >= first[:, None]) & (pos_q < last[:, None])          # the queries of real tokens
    want = _pattern(Sq, Sk, causal, left, query.device)[None] & run[:, None, :]
    # the rows of real queries must be exactly that (left padding: keys [first, Sk); right padding: [0, last));
    # padded query rows are left out (their outputs are zeros here, whatever SDPA's mask lets them see)
    if not torch.equal(mask[keep_q], want[keep_q]):
        return _fallback(why="a mask that is not causal / sliding-window with padding at one end arrived", **fallback)
    if bool(run.all()) and bool(keep_q.all()):
        return _with_sinks(_attention, sinks, query, key, value, causal=causal, **common).transpose(1, 2), None
    # padding: the real tokens of each sequence, packed (varlen); padded query rows get zeros
    q_rows = query.transpose(1, 2)[keep_q]                              # [total_q, H, D]
    k_rows = key.transpose(1, 2)[run]
    v_rows = value.transpose(1, 2)[run]
    zero = torch.zeros(1, dtype=torch.int32, device=query.device)
    cu_q = torch.cat([zero, keep_q.sum(-1).cumsum(0).to(torch.int32)])
    cu_k = torch.cat([zero, run.sum(-1).cumsum(0).to(torch.int32)])
    o_rows = _with_sinks(_attention_varlen, sinks, q_rows, k_rows, v_rows, cu_q, cu_k, Sq, Sk, causal=causal,
                         **common)
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


_UNSUPPORTED_HEAD_CONFIG = ("logits_mup_width_multiplier", "unpadded_vocab_size")


def _logit_scale(model) -> float:
    """The factor a causal-LM head multiplies its logits by before the softcap: Cohere's ``logit_scale`` (kept on the
    model), Granite's ``1 / config.logits_scaling`` (HyperCLOVAX's ``logits_scaling`` is a multiplier), Falcon-H1's
    ``lm_head_multiplier``; 1 for the others."""
    scale = getattr(model, "logit_scale", None)
    if scale is None:
        scale = getattr(model.config, "logit_scale", None)
    scale = 1.0 if scale is None else float(scale)
    mult = getattr(model.config, "lm_head_multiplier", None)
    scale = scale * float(mult) if mult is not None else scale
    div = getattr(model.config, "logits_scaling", None)
    if div is None:
        return scale
    return scale * float(div) if model.config.model_type == "hyperclovax" else scale / float(div)


def _decoder(model):
    """The base model whose ``last_hidden_state`` the head reads: ``model.get_decoder()``, or ``model.model`` where
    that lookup answers the causal LM itself (Llama 4's and Mllama's ``base_model_prefix`` names no attribute: the
    "hidden states" would be the logits)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    if base is None or base is model:
        base = getattr(model, "model", None)
    if not isinstance(base, torch.nn.Module) or base is model:
        raise NotImplementedError(f"causal_lm_loss: {type(model).__name__} has no base model this loss finds "
                                  "(get_decoder() or .model); use model(..., labels=...).loss")
    return base


_BALANCE_ARGS = ["gate_logits", "num_experts", "top_k", "attention_mask"]


def _router_balance_loss(model):
    """The load-balancing loss an MoE causal LM adds to its loss when it outputs router logits (Mixtral, Qwen-MoE,
    OLMoE, GPT-OSS, ...): its modeling module's ``load_balancing_loss_func(router_logits, num_experts, top_k,
    attention_mask)``, weighted by ``model.router_aux_loss_coef``. A model that adds another one (a different
    function or coefficient) is a ``NotImplementedError``, not a loss without it."""
    import inspect
    import sys

    for cls in type(model).__mro__:
        fn = getattr(sys.modules.get(cls.__module__), "load_balancing_loss_func", None)
        if fn is not None:
            break
    ok = fn is not None and all(hasattr(model, a) for a in ("router_aux_loss_coef", "num_experts",
                                                             "num_experts_per_tok"))
    if not ok or list(inspect.signature(fn).parameters)[:4] != _BALANCE_ARGS:
        raise NotImplementedError(f"causal_lm_loss: {type(model).__name__} adds a router load-balancing loss "
                                  "(output_router_logits=True) this loss does not reproduce; use "
                                  "model(..., labels=...).loss")
    return fn


def causal_lm_loss(model, input_ids, labels, *, attention_mask=None, ignore_index: int = -100,
                   num_items_in_batch=None, knobs: LCEKnobs | None = LOSS_KNOBS, **model_kwargs):
    """``model(input_ids, labels=labels).loss`` without the ``[tokens, vocab]`` logits: the base model's hidden states
    and ``onlinesoftmax.linear_cross_entropy`` against ``model.lm_head``; labels shifted as transformers does
    (token t predicts label t + 1, the last position ignored), the model's logit scale (Cohere's ``logit_scale``,
    Granite's and HyperCLOVAX's ``logits_scaling``, Falcon-H1's ``lm_head_multiplier``) and final logit softcap
    (``final_logit_softcapping``, RecurrentGemma's ``logits_soft_cap``) applied, the mean
    over non-ignored tokens (``num_items_in_batch``: their sum over it, as transformers' gradient accumulation);
    with ``output_router_logits`` (the config's or a keyword) an MoE model's router load-balancing loss is added as
    the model adds it (``router_aux_loss_coef`` x its ``load_balancing_loss_func``; another one is a
    ``NotImplementedError``).
    ``knobs``: the loss's ``LCEKnobs`` (default ``LOSS_KNOBS``: a logits tile of up to 1 GiB; None: the library's
    60 MiB default). A model whose logits are not ``model.lm_head(hidden)`` (a head transform first, as BERT-style
    heads; an unpadded-vocabulary cut or width multiplier, as Inkling's) is a ``NotImplementedError``."""
    head = model.get_output_embeddings()
    # a head this loss does not reproduce would give another loss silently: a transform before the output layer
    # (BERT-style heads), logits cut to an unpadded vocabulary or scaled by a width multiplier (Inkling)
    if not isinstance(head, torch.nn.Linear) or getattr(model, "lm_head", None) is not head or any(
            getattr(model.config, a, None) is not None for a in _UNSUPPORTED_HEAD_CONFIG):
        raise NotImplementedError(f"causal_lm_loss: {type(model).__name__}'s logits are not model.lm_head(hidden) "
                                  "with a logit scale and softcap this loss knows; use model(..., labels=...).loss")
    router = model_kwargs.get("output_router_logits")
    router = getattr(model.config, "output_router_logits", False) if router is None else router
    balance = _router_balance_loss(model) if router else None
    if router:
        model_kwargs["output_router_logits"] = True
    out = _decoder(model)(input_ids=input_ids, attention_mask=attention_mask, **model_kwargs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    shift = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if softcap is None:
        softcap = getattr(model.config, "logits_soft_cap", None)       # RecurrentGemma's name for it
    reduction = "sum" if num_items_in_batch is not None else "mean"
    bias = head.bias
    scale = _logit_scale(model)
    if scale != 1.0:            # logits = scale · (h Wᵀ + b): h and b scaled instead
        hidden = hidden * scale
        bias = bias * scale if bias is not None else None
    loss = _linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, shift.reshape(-1).to(hidden.device),
                                 bias=bias, ignore_index=ignore_index, reduction=reduction, softcap=softcap,
                                 knobs=knobs)
    loss = loss / num_items_in_batch if num_items_in_batch is not None else loss
    if balance is not None:     # the MoE router's load-balancing loss, added as the model adds it
        loss = loss + model.router_aux_loss_coef * balance(out.router_logits, num_experts=model.num_experts,
                                                           top_k=model.num_experts_per_tok,
                                                           attention_mask=attention_mask).to(loss.device)
    return loss
