"""Where the transformers decode loop's time goes (issue 30, H200, <= 120 s): the Llama-3-8B-shaped example model
(4 layers, bf16) generating from an 8 x 2048 prompt with "sdpa" and "onlinesoftmax" attention, under torch.profiler
(the CPU ops and the CUDA kernels by self time), and the attention call alone in the same loop shape (q [8, 32, 1,
128] over k / v [8, 8, S, 128] grown by torch.cat each step, as DynamicCache does): host µs per call and device
time per step against SDPA.

    PYTHONPATH=src python tools/probe_tf_decode.py --out DIR
    PYTHONPATH=src python tools/probe_tf_decode.py --out DIR --new-tokens 256 --train-first --skip-loop
        (the example's decode rows: 256 tokens after a training step; the example measured 0.72x sdpa there)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from probe_util import attention_loop  # noqa: E402


def profile_generate(model, prompt, new_tokens, out_path):
    from torch.profiler import ProfilerActivity, profile

    kw = dict(attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new_tokens,
              min_new_tokens=new_tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompt, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(prompt, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model.generate(prompt, **kw)
            torch.cuda.synchronize()
    ka = prof.key_averages()
    cpu = ka.table(sort_by="self_cpu_time_total", row_limit=30)
    cuda = ka.table(sort_by="self_cuda_time_total", row_limit=20)
    with open(out_path, "w") as f:
        f.write(cpu + "\n\n" + cuda)
    return wall, cpu, cuda


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--impls", default="onlinesoftmax,sdpa")
    ap.add_argument("--train-first", action="store_true",
                    help="one training step of 8 x 4096 before generating (as examples/transformers_llama.py does)")
    ap.add_argument("--skip-loop", action="store_true", help="no attention-call loop")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from transformers_llama import build

    import onlinesoftmax as oss
    from onlinesoftmax.integrations import transformers as osst

    osst.register()
    res = {}
    if args.skip_loop:
        ours = sdpa = None
    else:
        ours = attention_loop(lambda q, k, v: oss.attention(q, k, v, causal=True))
        sdpa = attention_loop(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    res["attention loop"] = dict(ours=ours, sdpa=sdpa)
    print("attention loop (host us per call, wall us per step):", res["attention loop"], flush=True)
    from onlinesoftmax.decode import explain as decode_explain

    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(8, 8, 2100, 128, device="cuda", dtype=torch.bfloat16)
    explain = str(decode_explain(q, k, k, torch.full((8,), 2100, device="cuda", dtype=torch.int32)))
    res["decode plan at S = 2100"] = explain
    print(explain, flush=True)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 128256, (8, 2048), generator=g).cuda()
    for impl in args.impls.split(","):
        with torch.device("cuda"):      # random init on the GPU (the CPU's takes ~30 s per model)
            model = build(impl, False, 4, torch.bfloat16, torch.device("cuda"))
        if args.train_first:
            ids = torch.randint(0, 128256, (8, 4096), generator=g).cuda()
            model.train()
            loss = (osst.causal_lm_loss(model, ids, ids, use_cache=False) if impl == "onlinesoftmax"
                    else model(ids, labels=ids, use_cache=False).loss)
            loss.backward()
            model.zero_grad(set_to_none=True)
            del ids, loss
        model.eval()
        wall, cpu, cuda = profile_generate(model, prompt, args.new_tokens, os.path.join(args.out, f"{impl}.txt"))
        res[impl] = dict(wall_ms=wall * 1e3, per_token_ms=wall * 1e3 / args.new_tokens)
        print(f"== {impl}: generate {args.new_tokens} tokens {wall * 1e3:.1f} ms", flush=True)
        print(cpu[:6000], flush=True)
        print(cuda[:3000], flush=True)
        del model
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "probe_tf_decode.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
