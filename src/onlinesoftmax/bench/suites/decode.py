"""Suite ``decode``: attention of new query rows over a KV cache (bf16, D = 128), and the (o, lse) merge.

GB/s counts K and V read once (``2·B·Hkv·Sk·D·2`` bytes; variable lengths: valid keys only); % of the copy ceiling
measured in the same run. Peers: torch SDPA with its cuDNN and flash backends over the dense cache (every slot
valid; no peer here serves a paged cache or variable lengths, flash-attn and FlashInfer not being installed).

* ``B{B} H{H}/{Hkv} Sk{Sk}``: dense, dense replayed from a CUDA graph, paged with page sizes 16 and 256 (pages
  shuffled), Sq = 1; peer SDPA cuDNN.
* ``... Sq4``: speculative decoding, Sq = 4 dense and paged, against our Sq = 1 (the last of the 4 query rows is
  the Sq = 1 row: it is what the check compares).
* ``... var``: lengths drawn from 1 to Sk in one batch, dense and paged 16; peer: our dense call.
* ``merge``: ``merge_attention_states`` over 2 × 512 MiB of bf16 o; peer: the same ⊕ in eager torch ops.
"""

from __future__ import annotations

import torch

from ...decode import attention_with_kvcache, merge_attention_states
from ...decode.api import _merge_torch
from ..harness import BenchContext, Case, register_suite

GOAL_SHAPES = [(8, 32, 32, 32768), (1, 32, 32, 131072), (8, 32, 8, 32768), (64, 32, 8, 4096)]
SWEEP_SK = [4096, 16384, 65536]             # the curve of GB/s against context length: (8, 32, 8, Sk)
D = 128


def _paged(k: torch.Tensor, v: torch.Tensor, page: int, gen: torch.Generator):
    """The dense caches [B, Hkv, S, D] as shuffled pages [B·S/page, Hkv, page, D] and their block table."""
    B, Hkv, S, D_ = k.shape
    n = S // page
    perm = torch.randperm(B * n, generator=gen).to(k.device)
    out = []
    for c in (k, v):
        pages = torch.empty((B * n, Hkv, page, D_), dtype=c.dtype, device=c.device)
        pages[perm] = c.reshape(B, Hkv, n, page, D_).permute(0, 2, 1, 3, 4).reshape(B * n, Hkv, page, D_)
        out.append(pages)
    return out[0], out[1], perm.int().reshape(B, n)


def _graphed(fn):
    """fn replayed from a CUDA graph captured once per input set (keyed by the tensors' addresses)."""
    graphs = {}

    def run(*args):
        key = tuple(a.data_ptr() for a in args if isinstance(a, torch.Tensor))
        entry = graphs.get(key)
        if entry is None:
            fn(*args)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(*args)
            entry = graphs[key] = (graph, out)
        entry[0].replay()
        return entry[1]
    return run


def _sdpa(backend_name: str | None):
    """SDPA over the dense cache (Sq = 1: every key attended, no mask); None: torch's own backend choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": [SDPBackend.CUDNN_ATTENTION], "flash": [SDPBackend.FLASH_ATTENTION], None: None}[backend_name]

    def run(q, k, v, *_):
        gqa = q.shape[1] != k.shape[1]
        if backends is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        with sdpa_kernel(backends):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    return run


def _ours(paged: int = 0, sq_slice: int | None = None):
    def run(q, k, v, sl, k16, v16, t16, k256, v256, t256):
        if paged == 16:
            k, v, table = k16, v16, t16
        elif paged == 256:
            k, v, table = k256, v256, t256
        else:
            table = None
        return attention_with_kvcache(q, k, v, sl, block_table=table)
    return run


def _inputs(ctx, B, H, Hkv, Sk, Sq=1, lens=None, pages=(16, 256)):
    gen = torch.Generator().manual_seed(B * 131 + Sk)
    dev, dt = ctx.device, torch.bfloat16
    q = torch.randn(B, H, Sq, D, device=dev, dtype=dt)
    k = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dt)
    v = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dt)
    sl = torch.tensor(lens if lens is not None else [Sk] * B, dtype=torch.int32, device=dev)
    out = [q, k, v, sl]
    for page in (16, 256):
        if page in pages and Sk % page == 0:
            out += list(_paged(k, v, page, gen))
        else:
            out += [None, None, None]
    return tuple(out)


def _check_last_row(out, ref):
    torch.testing.assert_close(out[..., -1:, :].float(), ref[..., -1:, :].float(), rtol=2e-2, atol=2e-2)


def _cases(ctx, B, H, Hkv, Sk, x_group):
    kv_bytes = 2 * B * Hkv * Sk * D * 2
    label = f"B{B} H{H}/{Hkv} Sk{Sk}"
    # the peer is SDPA with torch's own backend choice (it always runs); the cuDNN and flash rows beside it are
    # what the goal compares with (an error there is reported in its row, not fatal)
    impls = {"sdpa": _sdpa(None), "attention_with_kvcache": _ours(), "paged 16": _ours(16), "paged 256": _ours(256)}
    if ctx.is_cuda:
        impls.update({"sdpa-cudnn": _sdpa("cudnn"), "sdpa-flash": _sdpa("flash"),
                      "attention_with_kvcache (graph)": _graphed(_ours())})
    yield Case(label=label, shape=(B, H, Hkv, 1, Sk, D), dtype=torch.bfloat16, x=Sk, group=x_group,
               bytes=kv_bytes, make_inputs=lambda: _inputs(ctx, B, H, Hkv, Sk), impls=impls, peer="sdpa")

    def sq4(ctx=ctx):
        q1, *rest = _inputs(ctx, B, H, Hkv, Sk, Sq=1, pages=(16,))
        q4 = torch.randn(B, H, 4, D, device=ctx.device, dtype=torch.bfloat16)
        q4[:, :, -1:] = q1
        return (q1, q4, *rest)

    def sq(n, paged=0):
        def run(q1, q4, *rest):
            return _ours(paged)(q1 if n == 1 else q4, *rest)
        return run
    yield Case(label=label + " Sq4", shape=(B, H, Hkv, 4, Sk, D), dtype=torch.bfloat16, x=Sk,
               group=x_group + ", Sq 4", bytes=kv_bytes, make_inputs=sq4, check=_check_last_row,
               impls={"Sq 1": sq(1), "Sq 4": sq(4), "Sq 4 paged 16": sq(4, 16)}, peer="Sq 1")
    if Sk >= 4096 and B > 1:
        gen = torch.Generator().manual_seed(Sk)
        lens = torch.randint(1, Sk + 1, (B,), generator=gen).tolist()
        yield Case(label=label + " var", shape=(B, H, Hkv, 1, Sk, D), dtype=torch.bfloat16, x=Sk,
                   group=x_group + ", variable lengths", bytes=2 * Hkv * sum(lens) * D * 2,
                   make_inputs=lambda: _inputs(ctx, B, H, Hkv, Sk, lens=lens, pages=(16,)),
                   impls={"var dense": _ours(), "var paged 16": _ours(16)}, peer="var dense")


@register_suite("decode", x_label="Sk")
def suite(ctx: BenchContext):
    if not ctx.want(torch.bfloat16):
        return
    if ctx.is_cuda:
        shapes = GOAL_SHAPES[:1] + GOAL_SHAPES[3:] if ctx.quick else GOAL_SHAPES
        shapes = shapes + [(8, 32, 8, s) for s in SWEEP_SK if not ctx.quick]
        merge_shape = (16 if ctx.quick else 32, 32, 2048, 128)
    else:
        shapes, merge_shape = [(2, 8, 2, 1024)], (4, 8, 256, 64)
    for B, H, Hkv, Sk in shapes:
        yield from _cases(ctx, B, H, Hkv, Sk, f"B={B}, H={H}/{Hkv}")
    n = 1
    for s in merge_shape[:-1]:
        n *= s

    def merge_inputs():
        o = [torch.randn(merge_shape, device=ctx.device, dtype=torch.bfloat16) for _ in range(2)]
        lse = [torch.randn(merge_shape[:-1], device=ctx.device) for _ in range(2)]
        return o[0], lse[0], o[1], lse[1]
    # read o_a, o_b (bf16) and both lse (fp32), write o and lse
    nbytes = 3 * n * merge_shape[-1] * 2 + 3 * n * 4
    yield Case(label=f"merge {'x'.join(map(str, merge_shape))}", shape=merge_shape, dtype=torch.bfloat16,
               x=n * merge_shape[-1], group="merge", bytes=nbytes, make_inputs=merge_inputs,
               impls={"torch eager ⊕": _merge_torch, "merge_attention_states": merge_attention_states},
               peer="torch eager ⊕")
