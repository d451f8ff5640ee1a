"""A Llama-3-8B-shaped transformers model (random weights, 4 decoder layers, bf16) on onlinesoftmax's attention and
loss, against transformers' "sdpa" attention and the model's own loss: prefill, a training step, greedy decoding.

    PYTHONPATH=src python examples/transformers_llama.py                 # the H200 figures (bf16, CUDA)
    PYTHONPATH=src python examples/transformers_llama.py --small --device cpu   # a smoke run of the same code

Prints one table; ``--json PATH`` also writes it (with the device and versions) for ``benchmarks/results/``.
Rows: prefill of B x S tokens (forward, no cache), a training step (forward + backward: ``causal_lm_loss``, which never
builds the [tokens, vocab] logits, against ``model(input_ids, labels=labels).loss``), greedy decoding of N new tokens
from a P-token prompt (tokens/s). Time: median of ``--reps`` rounds after one warm-up call each, every round calling
both implementations in alternating order (a shared machine's host speed drifts over seconds); peak: the CUDA
allocator's peak over one call, above what the models and inputs hold. ``--breakdown`` also profiles one training
step of each implementation (torch.profiler) and prints its GPU time by kind of kernel: attention, matmul, loss,
other.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import time

import torch

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, rope_theta=500000.0, max_position_embeddings=8192)
SMALL = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, max_position_embeddings=512)


def build(impl: str, small: bool, layers: int, dtype, device):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**(SMALL if small else LLAMA3_8B), num_hidden_layers=layers,
                                   attention_dropout=0.0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=dtype).to(device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fns: dict, device, reps: int) -> dict:
    """{name: (median seconds, peak bytes above the start)} of each ``fns[name]()``: one warm-up call each, then
    ``reps`` rounds that call every function once, in alternating order (the host's speed drifts by up to 2x over
    seconds on a shared machine: interleaving gives every implementation the same drift)."""
    for fn in fns.values():
        fn()
    _sync(device)
    times = {name: [] for name in fns}
    for r in range(reps):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0 = time.perf_counter()
            fns[name]()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, fn in fns.items():
        peak = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            fn()
            _sync(device)
            peak = torch.cuda.max_memory_allocated(device) - base
        out[name] = (statistics.median(times[name]), peak)
    return out


# kernel (or, on CPU, aten op) name -> kind, first match wins: ours, FlashAttention's, cuDNN's, cuBLAS's, CUTLASS's
KINDS = (("attention", re.compile(r"attention_|flash|fmha|attn|sdpa|scaled_dot_product", re.I)),
         ("loss", re.compile(r"^ce_|cross_entropy|nll_loss|log_softmax|logsumexp|scale_rows", re.I)),
         ("matmul", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|aten::(mm|addmm|bmm|baddbmm)$", re.I)))


def breakdown(step, device) -> dict:
    """Milliseconds of one ``step()`` by kind of kernel (``KINDS``; the rest is "other"): the GPU's kernel times
    on CUDA, the ops' self times on CPU."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    step()
    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        _sync(device)
    out = {"attention": 0.0, "loss": 0.0, "matmul": 0.0, "other": 0.0}
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if not us:
            continue
        kind = next((k for k, rx in KINDS if rx.search(e.key)), "other")
        out[kind] += us / 1e3
    return out


IMPLS = ("sdpa", "onlinesoftmax")


def measure_all(args, ids, prompt, device, dtype) -> tuple[list[dict], dict]:
    """The three measurements, each interleaving the two attention implementations, and their greedy tokens."""
    from onlinesoftmax.integrations import transformers as osst

    B, S = ids.shape
    models = {impl: build(impl, args.small, args.layers, dtype, device) for impl in IMPLS}
    rows = []

    def add(case, res, tokens):
        for impl, (t, peak) in res.items():
            rows.append(dict(case=case, impl=impl, seconds=t, peak_bytes=peak, tokens_per_s=tokens / t))

    for m in models.values():
        m.eval()
    with torch.no_grad():
        res = measure({impl: (lambda m=m: m(ids, use_cache=False).logits) for impl, m in models.items()}, device,
                      args.reps)
    add(f"prefill {B}x{S}", res, B * S)

    def step(impl):
        model = models[impl]
        if impl == "onlinesoftmax":
            loss = osst.causal_lm_loss(model, ids, ids, use_cache=False)
        else:
            loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    for m in models.values():
        m.train()
    add(f"training step {B}x{S}", measure({impl: (lambda i=impl: step(i)) for impl in IMPLS}, device, args.reps),
        B * S)
    if args.breakdown:
        for r in rows[-len(IMPLS):]:
            r["gpu ms by kind"] = breakdown(lambda i=r["impl"]: step(i), device)
    tokens = {}

    def gen(impl):
        with torch.no_grad():
            tokens[impl] = models[impl].generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                                 pad_token_id=0)

    for m in models.values():
        m.eval()
    res = measure({impl: (lambda i=impl: gen(i)) for impl in IMPLS}, device, args.reps)
    add(f"greedy decode {prompt.shape[0]}x{args.new_tokens} from {prompt.shape[1]}", res,
        prompt.shape[0] * args.new_tokens)
    return rows, tokens


def run(args) -> list[dict]:
    from onlinesoftmax.integrations import transformers as osst

    osst.register()
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(1)
    vocab = (SMALL if args.small else LLAMA3_8B)["vocab_size"]
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)
    prompt = torch.randint(0, vocab, (args.decode_batch, args.prompt), generator=g).to(device)
    rows, tokens = measure_all(args, ids, prompt, device, dtype)
    same = torch.equal(tokens["sdpa"], tokens["onlinesoftmax"])
    # bf16 greedy decoding of random weights meets near-ties of the argmax: one rounding apart, the sequences part
    # there. Reported: the new tokens each sequence shares with sdpa's before they part (all = identical)
    new = slice(prompt.shape[1], None)
    differ = tokens["sdpa"][:, new] != tokens["onlinesoftmax"][:, new]
    shared = torch.where(differ.any(1), differ.int().argmax(1), differ.shape[1]).tolist()
    for r in rows:
        greedy = r["case"].startswith("greedy")
        r["greedy tokens identical"] = same if greedy else None
        r["new tokens shared before parting"] = shared if greedy else None
    return rows


def table(rows) -> str:
    by = {}
    for r in rows:
        by.setdefault(r["case"], {})[r["impl"]] = r
    lines = ["| case | sdpa ms | onlinesoftmax ms | speed-up | sdpa peak MiB | onlinesoftmax peak MiB "
             "| tokens/s (ours) |", "|---|---|---|---|---|---|---|"]
    for case, d in by.items():
        a, b = d["sdpa"], d["onlinesoftmax"]

        def mib(v):
            return "-" if v is None else f"{v / 2**20:.0f}"
        lines.append(f"| {case} | {a['seconds'] * 1e3:.1f} | {b['seconds'] * 1e3:.1f} | "
                     f"{a['seconds'] / b['seconds']:.2f}x | {mib(a['peak_bytes'])} | {mib(b['peak_bytes'])} | "
                     f"{b['tokens_per_s']:.0f} |")
    kinds = [(r["impl"], r["gpu ms by kind"]) for r in rows if r.get("gpu ms by kind")]
    if kinds:
        lines += ["", "training step, ms by kind of kernel (torch.profiler, one step):", "",
                  "| impl | " + " | ".join(kinds[0][1]) + " | total |", "|---" * (len(kinds[0][1]) + 2) + "|"]
        lines += [f"| {impl} | " + " | ".join(f"{v:.1f}" for v in d.values()) + f" | {sum(d.values()):.1f} |"
                  for impl, d in kinds]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="a tiny config (a smoke run: CPU, CI)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--decode-batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--breakdown", action="store_true", help="profile one training step per implementation")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    rows = run(args)
    print(table(rows))
    same = next(r["greedy tokens identical"] for r in rows if r["greedy tokens identical"] is not None)
    shared = next(r["new tokens shared before parting"] for r in rows if r["greedy tokens identical"] is not None)
    print(f"greedy tokens identical to sdpa's: {same}; new tokens per sequence shared before parting: {shared}")
    if args.json:
        import transformers

        env = dict(device=torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
                   torch=torch.__version__, transformers=transformers.__version__, args=vars(args),
                   date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        with open(args.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
