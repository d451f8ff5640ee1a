"""Decoding attention over a KV cache (dense or paged) and the (o, lse) merge: public functions, custom ops,
``explain``.

Layers, bottom up: the Triton launches (``launch.py``, imported on first use) and the portable torch path ->
custom ops ``onlinesoftmax::attention_with_kvcache`` and ``onlinesoftmax::merge_attention_states`` with fake
implementations (``torch.compile(fullgraph=True)`` sees one op each) and the merge's autograd -> public functions,
which call the implementations directly in eager mode (decode is host-bound: the op dispatch costs more than the
launch).
"""

from __future__ import annotations

import functools

import torch

from .._autocast import any_autocast, autocast_boundary, autocast_on
from .._checks import (
    KERNEL_DTYPES,
    as_int,
    check_attention_scalars,
    check_bool,
    check_float_tensor,
    check_instance,
    check_kernel_inputs,
    check_window,
    fit_window,
)
from ..backend import resolve_backend, transforms_active, values_unreadable
from ..target import Target, target_of
from .plan import NO_KNOBS, TORCH_PLAN, Knobs, MergePlan, Plan, Problem, decode_plan, merge_plan

__all__ = ["attention_with_kvcache", "explain", "explain_merge", "merge_attention_states"]

CHECK_DTYPES = KERNEL_DTYPES + (torch.float64,)
MAX_HEAD_DIM = 256          # the split-KV kernels' tiles (as oss.attention's)


def _kernel_backend(which: str, backend: str | None, q: torch.Tensor, op: str) -> str:
    """``which`` narrowed to what the split-KV kernels take: float64 or a head dim past MAX_HEAD_DIM run on the torch
    path by default, and are an error naming ``op`` when backend="triton" asked for the kernels."""
    if which == "triton" and (q.dtype not in KERNEL_DTYPES or q.shape[-1] > MAX_HEAD_DIM):
        if backend is None:
            return "torch"
        check_kernel_inputs(q, op, "q and caches", MAX_HEAD_DIM)      # raises: backend="triton" asked for them
    return which


@functools.cache
def _kernels():
    """The Triton launches, imported on first use (``import onlinesoftmax`` never imports Triton)."""
    from . import launch

    return launch


# ---- merge_attention_states ---------------------------------------------------------------------------------
def _merge_torch(o_a, lse_a, o_b, lse_b):
    """The ⊕ in fp32 torch ops (fp64 for fp64 inputs): an empty side (lse −inf) weighs exactly 0 and its o is
    never multiplied."""
    acc = _acc(o_a, lse_a, o_b, lse_b)
    la, lb = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(la, lb)
    wa, wb = _merge_weights(la, lb)
    wa, wb = wa.unsqueeze(-1), wb.unsqueeze(-1)
    o = torch.where(wa > 0, wa * o_a.to(acc), 0.0) + torch.where(wb > 0, wb * o_b.to(acc), 0.0)
    # a NaN or +inf lse on either side: NaN, as the kernel (its weights are NaN there; the where above hid them)
    o = torch.where(torch.isnan(wa) | torch.isnan(wb), float("nan"), o)
    # contiguous, as the kernels' outputs and the fake implementation's (elementwise ops follow the inputs' strides)
    return o.to(o_a.dtype).contiguous(), lse.contiguous()


def _merge_weights(la, lb):
    """``w_x = e^(lse_x − m) / W``, ``m = max(lse_a, lse_b)``, ``W = e^(lse_a − m) + e^(lse_b − m)`` (0 where
    lse_x = −inf), as the kernel forms them: from the inputs' difference. ``e^(lse_x − lse)`` with the merged lse
    rounded to fp32 is off by up to e^(ulp / 2): 26 % at |lse| ~ 1e7."""
    m = torch.maximum(la, lb)
    ref = torch.where(torch.isinf(m), 0.0, m)
    ea = torch.where(la == float("-inf"), 0.0, torch.exp(la - ref))
    eb = torch.where(lb == float("-inf"), 0.0, torch.exp(lb - ref))
    W = ea + eb
    W = torch.where(W > 0, W, 1.0)
    return ea / W, eb / W


def _acc(*ts) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def _merge_backend(backend: str | None, op: str, *states: torch.Tensor) -> str:
    """The merge's path: float64 states take the torch path by default (the kernel merges in fp32) and are an error
    naming ``op`` with backend="triton"."""
    which = resolve_backend(backend, states[0], op)
    if which == "triton" and _acc(*states) == torch.float64:
        if backend == "triton":
            raise TypeError(f"{op}: backend='triton' takes float16, bfloat16 or float32 states, got float64 "
                            "(use backend='torch')")
        return "torch"
    return which


def _check_merge(o_a, lse_a, o_b, lse_b):
    for t, n in ((o_a, "o_a"), (o_b, "o_b"), (lse_a, "lse_a"), (lse_b, "lse_b")):
        check_float_tensor(t, f"merge_attention_states: {n}")
    if o_a.dim() < 1 or o_a.shape != o_b.shape:
        raise ValueError(f"merge_attention_states: o_a and o_b must have one shape [..., D], got "
                         f"{tuple(o_a.shape)} and {tuple(o_b.shape)}")
    for t, n in ((lse_a, "lse_a"), (lse_b, "lse_b")):
        if t.shape != o_a.shape[:-1]:
            raise ValueError(f"merge_attention_states: {n} must have shape o.shape[:-1] = {tuple(o_a.shape[:-1])}, "
                             f"got {tuple(t.shape)}")
        if t.device != o_a.device:
            raise ValueError(f"merge_attention_states: {n} is on {t.device}, o_a on {o_a.device}")
    if o_b.device != o_a.device:
        raise ValueError(f"merge_attention_states: o_b is on {o_b.device}, o_a on {o_a.device}")


def _merge_impl(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
                backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "torch" or _acc(o_a, lse_a, o_b, lse_b) == torch.float64 or o_a.numel() == 0:
        return _merge_torch(o_a, lse_a, o_b, lse_b)
    return _kernels().merge_states(o_a, lse_a, o_b, lse_b)


_merge_op = torch.library.custom_op("onlinesoftmax::merge_attention_states", _merge_impl, mutates_args=())


@_merge_op.register_fake
def _(o_a, lse_a, o_b, lse_b, backend):
    return (torch.empty(o_a.shape, dtype=o_a.dtype, device=o_a.device),
            torch.empty(o_a.shape[:-1], dtype=_acc(o_a, lse_a, o_b, lse_b), device=o_a.device))


def _merge_grads(o_a, lse_a, o_b, lse_b, o, lse, do, dlse):
    """o = wa·o_a + wb·o_b, lse = logaddexp(lse_a, lse_b), w_x = e^(lse_x − lse): do_x = w_x·do and
    dlse_x = w_x·(dlse + Σ_D do·(o_x − o)) (∂w_a/∂lse_a = w_a(1 − w_a), ∂w_b/∂lse_a = −w_a·w_b)."""
    acc = _acc(o_a, lse_a, o_b, lse_b)
    la, lb = lse_a.to(acc), lse_b.to(acc)
    wa, wb = _merge_weights(la, lb)
    dof = do.to(acc) if do is not None else torch.zeros(o.shape, device=o.device, dtype=acc)
    dl = dlse.to(acc) if dlse is not None else torch.zeros_like(wa)
    of = o.to(acc)

    def side(w, ox):
        t = torch.where(w.unsqueeze(-1) > 0, dof * (ox.to(acc) - of), 0.0).sum(-1)
        return w.unsqueeze(-1) * dof, w * (dl + t)

    doa, dla = side(wa, o_a)
    dob, dlb = side(wb, o_b)
    return doa.to(o_a.dtype), dla.to(lse_a.dtype), dob.to(o_b.dtype), dlb.to(lse_b.dtype)


def _merge_setup(ctx, inputs, output):
    o_a, lse_a, o_b, lse_b, _ = inputs
    ctx.save_for_backward(o_a, lse_a, o_b, lse_b, *output)


def _merge_backward(ctx, do, dlse):
    return (*_merge_grads(*ctx.saved_tensors, do, dlse), None)


torch.library.register_autograd("onlinesoftmax::merge_attention_states", _merge_backward, setup_context=_merge_setup)


def merge_attention_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor, *,
                           backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ⊕ of two attention states over disjoint key sets (cascade attention: a shared prefix and each suffix).

    Parameters
    ----------
    o_a, o_b : ``[..., S, D]`` (any leading shape), each normalised over its own keys.
    lse_a, lse_b : float32 ``o.shape[:-1]``, natural-log logsumexp of each side's scores; −inf = no key.

    Returns
    -------
    ``(o, lse)``: ``lse = logaddexp(lse_a, lse_b)`` (float32) and ``o = o_a·e^(lse_a − lse) + o_b·e^(lse_b − lse)``,
    computed in fp32 and cast to o_a's dtype. When one side is empty (lse −inf) the other comes back unchanged,
    whatever the empty side's o holds; both empty give o = 0, lse = −inf, never NaN. Differentiable in all four
    inputs. A float64 state (o or lse) merges in float64 (lse float64) on the torch path; ``backend="triton"``
    refuses it.

    Example
    -------
    >>> o, lse = merge_attention_states(o_prefix, lse_prefix, o_suffix, lse_suffix)
    """
    _check_merge(o_a, lse_a, o_b, lse_b)
    which = _merge_backend(backend, "merge_attention_states", o_a, lse_a, o_b, lse_b)
    if transforms_active():      # torch.func transforms, forward AD: torch's ops, which compose with them
        return _merge_torch(o_a, lse_a, o_b, lse_b)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (o_a, lse_a, o_b, lse_b))
    if grad or torch.compiler.is_compiling():
        return torch.ops.onlinesoftmax.merge_attention_states(o_a, lse_a, o_b, lse_b, which)
    return _merge_impl(o_a, lse_a, o_b, lse_b, which)


def explain_merge(o_a: torch.Tensor, *, backend: str | None = None, target: Target | None = None) -> MergePlan:
    """The plan ``merge_attention_states`` runs for states shaped like ``o_a``: ``path`` "torch" or "triton"."""
    check_float_tensor(o_a, "explain(merge_attention_states): o_a")
    if o_a.dim() < 1:
        raise ValueError("explain(merge_attention_states): o_a must have shape [..., D], got a 0-d tensor")
    check_instance(target, Target, "explain(merge_attention_states): target")
    if target is None and _merge_backend(backend, "explain(merge_attention_states)", o_a) == "torch":
        return MergePlan("torch")
    D = o_a.shape[-1]
    return merge_plan(o_a.numel() // max(D, 1), D, target or target_of(o_a.device))


# ---- attention_with_kvcache ---------------------------------------------------------------------------------
def _torch_kvcache(q, k, v, seqlens, block_table, causal, scale, left, right, softcap):
    """The portable path: every sequence over all S_max slots of its cache, the slots at or past cache_seqlens[b]
    masked (scores −inf, keys and values zeroed before any product: they may hold NaN; pages past a sequence's last
    read as page 0), scores in fp32 (fp64 for fp64), masked softmax; a row without a key gives 0, −inf. Where the
    lengths are readable (eager) the slots past the longest are cut first; otherwise no host read of
    cache_seqlens: torch.compile traces it (its backward too) and torch.func transforms compose with it."""
    B, H, Sq, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s_max = block_table.shape[1] * k.shape[2] if block_table is not None else k.shape[2]
    if B and not values_unreadable(seqlens):    # eager: the slots up to the longest sequence only
        s_max = max(0, min(s_max, int(seqlens.max())))
        if block_table is None:
            k, v = k[:, :, :s_max], v[:, :, :s_max]
        else:
            block_table = block_table[:, :-(-s_max // k.shape[2])]
    if block_table is not None:
        n_pages, page = block_table.shape[1], k.shape[2]
        if k.shape[0] == 0:         # no page at all: every length is 0
            return q.new_zeros(q.shape), q.new_full((B, H, Sq), float("-inf"), dtype=torch.float32)
        used = torch.arange(n_pages, device=q.device) * page < seqlens.unsqueeze(1)
        pages = torch.where(used, block_table, 0).long()                         # [B, max_pages]
        k = k[pages].transpose(1, 2).reshape(B, Hkv, n_pages * page, D)
        v = v[pages].transpose(1, 2).reshape(B, Hkv, n_pages * page, D)
    S = k.shape[2]
    L = seqlens.long().clamp(max=S).view(B, 1, 1, 1)
    j = torch.arange(S, device=q.device)
    slot = (j < L).transpose(-1, -2)                                                # [B, 1, S, 1]: a valid key
    # query head h = hkv·G + g reads kv head hkv: q as [B, Hkv, G, Sq, D] against the cache's [B, Hkv, 1, S, D]
    # (the cache read once per kv head, not copied G times)
    kf = torch.where(slot, k.to(acc), 0.0).unsqueeze(2)
    vf = torch.where(slot, v.to(acc), 0.0).unsqueeze(2)
    s = torch.matmul(q.to(acc).reshape(B, Hkv, G, Sq, D), kf.transpose(-1, -2)) * scale    # [B, Hkv, G, Sq, S]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    L = L.unsqueeze(-1)                                                             # [B, 1, 1, 1, 1]
    qpos = L - Sq + torch.arange(Sq, device=q.device).unsqueeze(-1)                  # [B, 1, 1, Sq, 1]
    ok = j < L
    if causal:
        ok = ok & (j <= qpos)
    if left >= 0:
        ok = ok & (j >= qpos - left)
    if right >= 0:
        ok = ok & (j <= qpos + right)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(lse == float("-inf"), 0.0, lse).unsqueeze(-1))
    return torch.matmul(p, vf).reshape(B, H, Sq, D).to(q.dtype), lse.reshape(B, H, Sq).float()


def _kvcache_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                  block_table: torch.Tensor | None, causal: bool, scale: float, left: int, right: int,
                  softcap: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "torch":
        return _torch_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, left, right, softcap)
    return _kernels().attention_decode(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, left, right,
                                       softcap, True)


_kvcache_op = torch.library.custom_op("onlinesoftmax::attention_with_kvcache", _kvcache_impl, mutates_args=())


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, left, right, softcap, backend):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _check_pages(cache_seqlens: torch.Tensor, block_table: torch.Tensor, num_pages: int, page: int) -> None:
    """On the CPU (free to read): every page a sequence reads (the first ⌈min(len, max_pages·page) / page⌉ entries
    of its row) is in [0, num_pages), else an ``IndexError`` naming it (a negative entry would index from the end).
    On a GPU the entries are not read by the host (no synchronisation)."""
    if cache_seqlens.device.type != "cpu" or block_table.numel() == 0 or values_unreadable(cache_seqlens):
        return
    n = (cache_seqlens.long().clamp(0, block_table.shape[1] * page) + page - 1) // page
    used = torch.arange(block_table.shape[1]) < n.unsqueeze(1)
    bad = used & ((block_table < 0) | (block_table >= num_pages))
    if bad.any():
        b, i = (int(x) for x in bad.nonzero()[0])
        raise IndexError(f"attention_with_kvcache: block_table[{b}, {i}] = {int(block_table[b, i])} is not a page "
                         f"of the cache (0 <= page < {num_pages}), and sequence {b} reads it")


def _described(t) -> str:
    """An index argument as an error message names it: a tensor's dtype and shape, else its type."""
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).replace('torch.', '')} of shape {tuple(t.shape)}"
    return type(t).__name__


def _index_tensor(t, name: str, f: str) -> None:
    """An index argument of an integer dtype (int32 is what the kernels read; another is converted), else a
    TypeError naming it."""
    if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        want = "an int32 tensor of shape [B]" if name == "cache_seqlens" else "an int32 tensor [B, max_pages]"
        raise TypeError(f"{f}: {name} must be {want} (or another integer dtype), got {_described(t)}")


def _check_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale, softcap, causal=True, window=None,
                   return_lse=False):
    """Shapes, dtypes and devices; a tensor's values only on the CPU (the block table's pages): nothing here
    synchronises with a GPU. Returns ``(cache_seqlens, block_table, scale, softcap, (left, right))``: the index
    tensors as int32 (an int or a 0-d cache_seqlens as one length for every sequence, as FlashAttention's int),
    scale and softcap as Python floats or None, the window cut to the cache (``fit_window``)."""
    f = "attention_with_kvcache"
    Tensor, dev = torch.Tensor, getattr(q, "device", None)
    if not (isinstance(q, Tensor) and isinstance(k_cache, Tensor) and isinstance(v_cache, Tensor)
            and q.dtype in CHECK_DTYPES and k_cache.dtype in CHECK_DTYPES and v_cache.dtype in CHECK_DTYPES
            and q.dim() == 4 and k_cache.dim() == 4 and v_cache.dim() == 4
            and k_cache.device == dev and v_cache.device == dev):          # else: which one, in order
        for t, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
            check_float_tensor(t, f"{f}: {n}", CHECK_DTYPES)
            if t.dim() != 4:
                raise ValueError(f"{f}: {n} must be 4-D, got shape {tuple(t.shape)}")
            if t.device != q.device:
                raise ValueError(f"{f}: {n} is on {t.device}, q on {q.device}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"{f}: q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, "
                        f"{v_cache.dtype}")
    B, H, Sq, D = q.shape
    ks = k_cache.shape
    if ks != v_cache.shape:
        raise ValueError(f"{f}: k_cache and v_cache must have one shape, got {tuple(ks)} and "
                         f"{tuple(v_cache.shape)}")
    Hkv = ks[1]
    if D < 1:
        raise ValueError(f"{f}: the head dim (last dim of q) must be at least 1, got {D}")
    if ks[3] != D:
        raise ValueError(f"{f}: the caches' head dim {ks[3]} differs from q's {D}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"{f}: q's {H} heads must be a multiple of the caches' {Hkv} (GQA)")
    if not isinstance(cache_seqlens, torch.Tensor):
        try:
            n = as_int(cache_seqlens, f"{f}: cache_seqlens")
        except TypeError:
            raise TypeError(f"{f}: cache_seqlens must be an int32 tensor of shape [B] = [{B}] or an int, got "
                            f"{_described(cache_seqlens)}") from None
        cache_seqlens = torch.full((B,), n, dtype=torch.int32, device=dev)
    if cache_seqlens.dtype != torch.int32:
        _index_tensor(cache_seqlens, "cache_seqlens", f)
    if cache_seqlens.dim() == 0:            # one length for every sequence, as an int
        cache_seqlens = cache_seqlens.expand(B)
    if cache_seqlens.shape != (B,):
        raise TypeError(f"{f}: cache_seqlens must be an int32 tensor of shape [B] = [{B}], got "
                        f"{_described(cache_seqlens)}")
    if cache_seqlens.device != dev:
        raise ValueError(f"{f}: cache_seqlens is on {cache_seqlens.device}, q on {dev}")
    if block_table is None:
        if ks[0] != B:
            raise ValueError(f"{f}: a dense cache is [B, Hkv, S_max, D] with B = {B}, got {tuple(ks)}")
        s_max, cache = ks[2], "the dense cache's S_max"
    else:
        if not (isinstance(block_table, torch.Tensor) and block_table.dtype == torch.int32):
            _index_tensor(block_table, "block_table", f)
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise TypeError(f"{f}: block_table must be an int32 tensor [B, max_pages] with B = {B}, got "
                            f"{_described(block_table)}")
        if block_table.device != dev:
            raise ValueError(f"{f}: block_table is on {block_table.device}, q on {dev}")
        if not 1 <= ks[2] <= 256:
            raise ValueError(f"{f}: page size must be in [1, 256], got {ks[2]}")
        _check_pages(cache_seqlens, block_table, ks[0], ks[2])
        s_max, cache = block_table.shape[1] * ks[2], "the paged cache's max_pages · page_size"
    if cache_seqlens.device.type == "cpu" and cache_seqlens.numel() and not values_unreadable(cache_seqlens):
        if int(cache_seqlens.min()) < 0:
            raise ValueError(f"{f}: cache_seqlens holds {int(cache_seqlens.min())}, a negative length")
        if int(cache_seqlens.max()) > s_max:
            raise ValueError(f"{f}: cache_seqlens holds {int(cache_seqlens.max())}, past {cache} = {s_max}")
    scale, softcap = check_attention_scalars(scale, softcap, f)
    if type(causal) is not bool:            # (messages built only on failure: a decode step's host cost)
        check_bool(causal, f"{f}: causal")
    if type(return_lse) is not bool:
        check_bool(return_lse, f"{f}: return_lse")
    window = (-1, -1) if window is None else fit_window(*check_window(window, f), Sq, s_max)
    # the values were checked above where readable (the CPU); the kernels read int32
    if cache_seqlens.dtype != torch.int32:
        cache_seqlens = cache_seqlens.to(torch.int32)
    if block_table is not None and block_table.dtype != torch.int32:
        block_table = block_table.to(torch.int32)
    return cache_seqlens, block_table, scale, softcap, window


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: torch.Tensor, *, block_table: torch.Tensor | None = None,
                           causal: bool = True, scale: float | None = None, window: tuple[int, int] | None = None,
                           softcap: float | None = None, return_lse: bool = False, backend: str | None = None):
    """Attention of a few new query rows over a KV cache (decoding; speculative decoding with Sq > 1).

    Parameters
    ----------
    q : ``[B, H, Sq, D]``, fp16 / bf16 / fp32, any strides (float64 or D > 256: the torch path by default, an error
        with ``backend="triton"``).
    k_cache, v_cache : dense ``[B, Hkv, S_max, D]``, or paged ``[num_pages, Hkv, page_size, D]`` with
        ``block_table``; any strides (a ``[B, S_max, Hkv, D]`` buffer viewed as ``[B, Hkv, S_max, D]`` works; a
        head-dim-outermost buffer of more than 2^31 / D rows is copied to a contiguous one first).
        Query head h reads kv head ``h // (H // Hkv)``.
    cache_seqlens : int32 ``[B]``: valid keys of sequence b, the Sq new tokens included, from 0 to the cache's
        ``S_max`` or ``max_pages · page_size`` (checked for CPU tensors); another integer dtype is converted, an
        int (or a 0-d tensor) is the length of every sequence (as FlashAttention's int). Slots at or past it (and
        pages past its last) are never read; they may hold NaN.
    block_table : int32 ``[B, max_pages]`` (another integer dtype is converted): key j of sequence b is at page
        ``block_table[b, j // page_size]``, slot ``j % page_size``. Page sizes 1 to 256. The pages a sequence reads
        must be in ``[0, num_pages)`` (checked for CPU tensors; entries past a sequence's last page are never read).
    causal : query i attends key j iff ``j <= cache_seqlens[b] − Sq + i`` (bottom-right aligned; torch SDPA's
        ``is_causal`` aligns top-left).
    scale : default ``D ** -0.5``; ``softcap=c``: scores ``c·tanh(s / c)``; ``window=(left, right)`` (−1 unbounded):
        query i attends key j iff ``p − left <= j <= p + right`` with ``p = cache_seqlens[b] − Sq + i``, ANDed with
        causal. As ``oss.attention`` with ``Sk = cache_seqlens[b]``.
    return_lse : also return the rows' lse. ``backend``: None (the kernels on CUDA, torch ops elsewhere),
        ``"torch"`` or ``"triton"``.

    Returns
    -------
    o ``[B, H, Sq, D]`` in q's dtype, or ``(o, lse)`` with lse float32 ``[B, H, Sq]`` (natural log). A row with no
    attended key gives o = 0 and lse = −inf. On CUDA fp32 inputs take full fp32 dot products (no TF32).
    Differentiable in q, k_cache and v_cache: with grad mode on and one of them requiring grad, calls take the
    torch path (torch ops, eager or traced by torch.compile; the decode kernels have no backward).

    The split count comes from shapes (the cache's ``S_max`` or ``max_pages · page_size``), never from the values
    of ``cache_seqlens``: no host synchronisation, and a CUDA graph captured once replays correctly after
    ``cache_seqlens`` and ``block_table`` change. Under ``torch.autocast`` q and the caches are cast as
    ``scaled_dot_product_attention``'s (to the autocast dtype: keep the cache in it, or each call copies it).
    """
    if any_autocast() and autocast_on(q):   # inline, not a decorator: a decode step's host cost
        return _kvcache_autocast(q, k_cache, v_cache, cache_seqlens, block_table=block_table, causal=causal,
                                 scale=scale, window=window, softcap=softcap, return_lse=return_lse, backend=backend)
    cache_seqlens, block_table, scale, softcap, (left, right) = _check_kvcache(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, softcap, causal, window, return_lse)
    which = _kernel_backend(resolve_backend(backend, q, "attention_with_kvcache"), backend, q, "attention_with_kvcache")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    cap = float(softcap or 0.0)
    # the kernels read lengths[b] and table[b, i] at unit inner stride (the table's row stride is an argument)
    cache_seqlens = cache_seqlens.contiguous()
    if block_table is not None and block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    args = (q, k_cache, v_cache, cache_seqlens, block_table, bool(causal), scale, left, right, cap, which)
    # torch.func transforms, or a gradient to take (eager or compiled: the op has no autograd, the kernels no
    # backward): the torch path, whose ops compose with the transforms and autograd
    if transforms_active() or (torch.is_grad_enabled()
                              and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad)):
        o, lse = _torch_kvcache(*args[:-1])
    elif torch.compiler.is_compiling() or values_unreadable(cache_seqlens):
        o, lse = torch.ops.onlinesoftmax.attention_with_kvcache(*args)      # meta and fake tensors: its fake impl
    elif which == "torch":
        o, lse = _torch_kvcache(*args[:-1])
    else:
        o, lse = _kernels().attention_decode(*args[:-1], return_lse)
    return (o, lse) if return_lse else o


_kvcache_autocast = autocast_boundary("aten::scaled_dot_product_attention", "lower",
                                      ("q", "k_cache", "v_cache"))(attention_with_kvcache)


def attention_full_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, left: int,
                         right: int, softcap: float, need_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``oss.attention``'s decode dispatch: (o, lse or None) of q over all S keys of every sequence of the dense
    ``k``, ``v`` [B, Hkv, S, D] by the split-KV kernels (``attention_with_kvcache`` with cache_seqlens = S), the
    arguments checked by the caller (eager, no gradient, a kernel dtype)."""
    return _kernels().attention_decode(q, k, v, None, None, causal, scale, left, right, softcap, need_lse)


def kvcache_problem(q, k_cache, block_table) -> Problem:
    B, H, Sq, D = q.shape
    page = k_cache.shape[2] if block_table is not None else 0
    s_max = block_table.shape[1] * page if block_table is not None else k_cache.shape[2]
    return Problem(B, H, k_cache.shape[1], Sq, D, s_max, page, q.element_size())


def explain(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, *,
            block_table: torch.Tensor | None = None, backend: str | None = None, target: Target | None = None,
            knobs: Knobs = NO_KNOBS, causal: bool = True, scale: float | None = None, window=None,
            softcap: float | None = None, return_lse: bool = False) -> Plan:
    """The plan ``attention_with_kvcache`` runs for these arguments, without running it: ``path`` "split_kv"
    (``kernel`` "sm90" or "portable", ``splits`` key ranges per kv head) or "torch". ``target`` plans for another
    GPU (e.g. ``onlinesoftmax.target.H200`` for CPU or meta tensors). attention_with_kvcache's other keyword
    arguments are accepted (an unknown one is a TypeError) and do not change the plan."""
    _, block_table, *_ = _check_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale, softcap, causal,
                                        window, return_lse)
    check_instance(target, Target, "explain(attention_with_kvcache): target")
    check_instance(knobs, Knobs, "explain(attention_with_kvcache): knobs")
    op = "explain(attention_with_kvcache)"
    if target is None and _kernel_backend(resolve_backend(backend, q, op), backend, q, op) == "torch":
        return TORCH_PLAN
    return decode_plan(kvcache_problem(q, k_cache, block_table), target or target_of(q.device), knobs)


