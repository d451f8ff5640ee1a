"""Is the transformers decode gap (issue 30: greedy decoding 0.88-0.92x "sdpa" with the same GPU time) in the
attention call or around it? H200, <= 150 s. The example's model (Llama-3-8B-shaped, 4 layers, bf16) generates 256
tokens from an 8 x 2048 prompt, rounds of A / B / C / ... in one process, with attention functions registered under
timing wrappers (host seconds inside the attention function per call, measured in place):

* ``sdpa``: transformers' own SDPA function; ``oss``: onlinesoftmax's; ``oss_sdpa``: a registered function that
  calls ``F.scaled_dot_product_attention`` the way onlinesoftmax's decode branch calls ``attention``.

After each generate: host µs of 20000 ``as_strided`` and 2000 small CUDA adds (is the host itself slower after a
run?), the threads of the process, the garbage collections the run made. A last round runs with ``gc.disable()``.

    PYTHONPATH=src python tools/probe_tf_decode2.py --out DIR
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def _micro():
    x = torch.empty(64, 64)
    t0 = time.perf_counter()
    for _ in range(20000):
        x.as_strided((32, 32), (64, 1))
    cpu = (time.perf_counter() - t0) / 20000 * 1e6
    y = torch.ones(16, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        torch.add(y, y)
    launch = (time.perf_counter() - t0) / 2000 * 1e6
    torch.cuda.synchronize()
    return round(cpu, 3), round(launch, 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers_llama import build

    from onlinesoftmax.integrations import transformers as osst

    def oss_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
        o = F.scaled_dot_product_attention(query, key, value, is_causal=query.shape[2] > 1, scale=scaling,
                                           enable_gqa=True)
        return o.transpose(1, 2), None

    inside = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            r = fn(*a, **kw)
            acc = inside.setdefault(name, [0.0, 0])
            acc[0] += time.perf_counter() - t0
            acc[1] += 1
            return r
        return wrapper

    for name, fn in (("t_sdpa", sdpa_attention_forward), ("t_oss", osst.attention_forward),
                     ("t_oss_sdpa", oss_sdpa)):
        AttentionInterface.register(name, timed(name, fn))
        AttentionMaskInterface.register(name, sdpa_mask)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 128256, (8, 2048), generator=g).cuda()
    kw = dict(attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=args.new_tokens,
              min_new_tokens=args.new_tokens, pad_token_id=0)
    models = {}
    for impl in ("t_sdpa", "t_oss", "t_oss_sdpa"):
        with torch.device("cuda"):
            models[impl] = build(impl, False, 4, torch.bfloat16, torch.device("cuda")).eval()
        with torch.no_grad():
            models[impl].generate(prompt, **kw)             # warm: compiles, binds every length class
        torch.cuda.synchronize()
    print("micro (as_strided us, small add us) after building:", _micro(), flush=True)
    rows = []
    for rnd in range(args.rounds + 1):
        nogc = rnd == args.rounds
        if nogc:
            gc.collect()
            gc.disable()
        for impl, model in models.items():
            inside.clear()
            c0 = sum(s["collections"] for s in gc.get_stats())
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(prompt, **kw)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            c1 = sum(s["collections"] for s in gc.get_stats())
            s, n = inside[impl]
            row = dict(round=rnd, gc_off=nogc, impl=impl, wall_ms=round(wall * 1e3, 1),
                       per_token_ms=round(wall * 1e3 / args.new_tokens, 3), attn_calls=n,
                       attn_host_us=round(s / n * 1e6, 2), attn_share=round(s / wall, 3),
                       rest_ms=round((wall - s) * 1e3, 1), gc_collections=c1 - c0,
                       threads=len(os.listdir("/proc/self/task")), micro=_micro())
            rows.append(row)
            print(row, flush=True)
        if nogc:
            gc.enable()
    with open(os.path.join(args.out, "probe_tf_decode2.json"), "w") as f:
        json.dump(dict(rows=rows, command="PYTHONPATH=src python tools/probe_tf_decode2.py",
                       commit=os.environ.get("ONLINESOFTMAX_COMMIT", "")), f, indent=1)


if __name__ == "__main__":
    main()
