"""Host time of one softmax_topk call (enqueue only: 200 calls back to back, then one synchronize), beside
torch.topk and a bare torch.empty, and a cProfile of 300 calls at 1 x 128256, k = 50.

``PYTHONPATH=src python benchmarks/topk_host.py`` on the GPU machine.
"""

import cProfile
import io
import pstats
import time

import torch

import onlinesoftmax as oss

for B, V, k in ((1, 128256, 50), (256, 128256, 50), (1, 128256, 1024)):
    x = torch.randn(B, V, device="cuda")
    for _ in range(20):
        oss.softmax_topk(x, k)
    torch.cuda.synchronize()
    for name, fn in (("ours", lambda: oss.softmax_topk(x, k)), ("torch.topk", lambda: torch.topk(x, k)),
                     ("empty", lambda: torch.empty(B, k, device="cuda"))):
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"B{B} V{V} k{k} {name}: host {1e6 * (t1 - t0) / n:.1f} us/call (enqueue)", flush=True)
x = torch.randn(1, 128256, device="cuda")
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    oss.softmax_topk(x, 50)
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
print(s.getvalue())
