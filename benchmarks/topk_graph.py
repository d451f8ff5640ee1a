"""GPU time per call of softmax_topk and its torch peers, without the host: ``CALLS`` calls on distinct inputs
(each larger than L2 at B = 256, so every call reads x from DRAM) captured in one CUDA graph, the replay timed by
``do_bench`` (median) and divided by ``CALLS``. Eager ``do_bench`` medians of the same ops beside it.

``PYTHONPATH=src python benchmarks/topk_graph.py [B V k ...]`` on the GPU machine (default: the goal shape).
"""

from __future__ import annotations

import sys

import torch
from triton.testing import do_bench

import onlinesoftmax as oss

CALLS = 20


def main(args):
    shapes = [tuple(int(v) for v in args[i:i + 3]) for i in range(0, len(args), 3)] or [(256, 128256, 50)]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; {CALLS} calls per graph, distinct inputs")
    for B, V, k in shapes:
        xs = [torch.randn(B, V, device="cuda") for _ in range(CALLS)]
        ops = {"softmax_topk": lambda x: oss.softmax_topk(x, k),
               "torch.softmax→topk": lambda x: torch.softmax(x, -1).topk(k, -1),
               "torch.topk": lambda x: torch.topk(x, k, -1)}
        ref = torch.sort(xs[0], dim=-1, descending=True, stable=True)[1][:, :k]
        assert torch.equal(oss.softmax_topk(xs[0], k).indices, ref)
        res = {}
        for name, op in ops.items():
            for x in xs[:2]:
                op(x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for x in xs:
                    op(x)
            graph_us = do_bench(g.replay, return_mode="median") * 1e3 / CALLS
            i = [0]

            def eager(op=op, xs=xs):
                i[0] += 1
                return op(xs[i[0] % CALLS])
            eager_us = [do_bench(eager, return_mode="median") * 1e3 for _ in range(3)]
            res[name] = graph_us
            print(f"B{B} V{V} k{k} {name:20s} graph {graph_us:7.1f} us/call | eager do_bench "
                  + " / ".join(f"{u:.1f}" for u in eager_us), flush=True)
        print(f"B{B} V{V} k{k}: graph ratios: vs softmax→topk {res['torch.softmax→topk'] / res['softmax_topk']:.2f}x,"
              f" vs topk {res['torch.topk'] / res['softmax_topk']:.2f}x; read-once floor "
              f"{B * V * 4 / 4.25e12 * 1e6:.1f} us", flush=True)
        del xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
