"""The backward of ``softmax_topk``'s (values, lse) on the GPU machine: ours (``_topk_grad_kernel``: one read of x,
one write of dx, then a scatter of the k selected entries) beside torch's autograd of the same function
(``softmax(x.float()).gather(topk indices)`` and ``logsumexp``) and a copy of x (read + write: the fewest bytes a
backward that must read x moves), at a router's and a vocabulary's sizes. Each problem is checked against torch's
gradient first (max |Δ| / max |torch|). Backward alone: ``torch.autograd.grad`` over one retained graph per input
buffer; the inputs rotate through buffers past the L2 (``triton.testing.do_bench`` medians).

    PYTHONPATH=src python tools/probe_topk_grad.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton

import onlinesoftmax as oss

SHAPES = ((4096, 64, 8, torch.bfloat16), (16384, 128, 8, torch.bfloat16), (8, 128256, 50, torch.float32),
          (64, 128256, 50, torch.bfloat16))


def _torch_fn(x, k, i=None):
    p = torch.softmax(x.float(), -1)
    i = p.topk(k, -1).indices if i is None else i
    return p.gather(-1, i), torch.logsumexp(x.float(), -1)


def _device_us(fn, n=20) -> tuple[float, list]:
    """Kernel time per call of ``fn`` on the device (µs), and its three longest kernels (name, µs per call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in ev) / n
    top = sorted(ev, key=lambda e: -e.self_device_time_total)[:3]
    return total, [(e.key[:60], e.self_device_time_total / n) for e in top]


def _ours_fn(x, k):
    r = oss.softmax_topk(x, k)
    return r.values, r.lse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": []}
    for B, V, k, dtype in SHAPES:
        nbuf = max(2, -(-(128 << 20) // (B * V * dtype.itemsize)))
        xs = [torch.randn(B, V, device="cuda", dtype=dtype).requires_grad_() for _ in range(nbuf)]
        dv = torch.randn(B, k, device="cuda")
        dl = torch.randn(B, device="cuda")
        row = {"shape": [B, V, k], "dtype": str(dtype)}
        grads = {}
        for name, fn in (("ours", _ours_fn), ("torch", _torch_fn)):
            outs = [fn(x, k) for x in xs]
            if name == "torch":     # our indices: ties (bf16 rows have many) select the same entries
                i0 = oss.softmax_topk(xs[0].detach(), k).indices
                g_outs = _torch_fn(xs[0], k, i0)
            else:
                g_outs = outs[0]
            grads[name] = torch.autograd.grad(g_outs, xs[0], (dv, dl), retain_graph=True)[0]
            it = iter(range(1 << 30))

            def bwd(outs=outs):
                j = next(it) % nbuf
                torch.autograd.grad(outs[j], xs[j], (dv, dl), retain_graph=True)

            def fwd_bwd(fn=fn):
                j = next(it) % nbuf
                torch.autograd.grad(fn(xs[j], k), xs[j], (dv, dl))

            row[f"{name} backward us"] = triton.testing.do_bench(bwd, warmup=50, rep=300) * 1e3
            row[f"{name} forward+backward us"] = triton.testing.do_bench(fwd_bwd, warmup=50, rep=300) * 1e3
            row[f"{name} backward device us"], row[f"{name} backward kernels"] = _device_us(bwd)
            row[f"{name} forward+backward device us"], _ = _device_us(fwd_bwd)
            del outs
        ys = [torch.empty_like(x) for x in xs]
        it2 = iter(range(1 << 30))

        def copy():
            j = next(it2) % nbuf
            ys[j].copy_(xs[j].detach())

        row["copy us"] = triton.testing.do_bench(copy, warmup=50, rep=300) * 1e3
        g, t = grads["ours"].float(), grads["torch"].float()
        row["rel err vs torch"] = ((g - t).abs().max() / t.abs().max()).item()
        row["copy device us"], _ = _device_us(copy)
        for t in ("backward", "forward+backward"):
            for u in ("us", "device us"):
                row[f"torch / ours {t} {u}"] = row[f"torch {t} {u}"] / row[f"ours {t} {u}"]
        row["ours backward device / copy device"] = row["ours backward device us"] / row["copy device us"]
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(ap.parse_args().out, exist_ok=True)
    with open(os.path.join(ap.parse_args().out, "probe_topk_grad.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
