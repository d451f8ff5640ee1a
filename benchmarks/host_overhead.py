"""Host time per eager call at a decode size (the GPU is not the limit here): onlinesoftmax.softmax against
torch.softmax, each layer of our call path alone, and a cProfile of our call. Prints only.

    PYTHONPATH=src python benchmarks/host_overhead.py
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

import onlinesoftmax as oss
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.kernels._launch import stream_scratch
from onlinesoftmax.ops.softmax import _prepare, _rows_or_copy


def per_call_us(fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def main():
    x = torch.randn(8, 151936, device="cuda")
    y = torch.empty_like(x)
    (_, _), (M, N, inner, (gx, gy)) = _rows_or_copy([x, y], 1)
    rows = {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "torch.empty_like": lambda: torch.empty_like(x),
        "oss.softmax": lambda: oss.softmax(x, -1),
        "_prepare": lambda: _prepare("softmax", x, -1, None, None),
        "_rows_or_copy": lambda: _rows_or_copy([x, y], 1),
        "K.forward (plan cached)": lambda: K.forward(x, y, gx, gy, M, N, inner, 0),
        "stream_scratch": lambda: stream_scratch(("softmax", torch.float32), x.device,
                                                 ((1024, torch.int32), (1024, torch.int32),
                                                  (1 << 16, torch.float32), (1 << 16, torch.float32))),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "torch.cuda.current_stream": torch.cuda.current_stream,
    }
    for name, fn in rows.items():
        print(f"{name:32} {per_call_us(fn):7.2f} us per call", flush=True)
    print(K.last_launch())
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        oss.softmax(x, -1)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
