"""Our softmax at 256 MB and at 1 GiB per tensor, and the device copy at 256 MB / 1 GiB / 2 GiB source: how much
the tensor size alone moves the % of copy (do_bench medians, 200 ms each; two input sets rotate at 256 MB).

    PYTHONPATH=src python benchmarks/size_probe.py
"""

import torch
from triton.testing import do_bench

import onlinesoftmax as oss


def bench(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_gbps(nbytes):
    src = torch.empty(nbytes // 4, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return 2 * nbytes / bench(lambda: dst.copy_(src)) / 1e6


def softmax_gbps(m, n, dtype, sets):
    xs = [torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(sets)]
    i = [0]

    def call():
        i[0] += 1
        return oss.softmax(xs[i[0] % len(xs)], -1)

    t = bench(call)
    return 2 * m * n * dtype.itemsize / t / 1e6, t


def main():
    print("copy GB/s at 256MB / 1GiB / 2GiB source:", [round(copy_gbps(b)) for b in (256 << 20, 1 << 30, 2 << 30)])
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1024, 4096, 16384, 32768, 131072, 262144):
            row = []
            for mb in (256, 1024):
                m = (mb << 20) // (n * dtype.itemsize)
                gbps, t = softmax_gbps(m, n, dtype, 1 if mb == 1024 else 2)
                row.append(f"{mb}MB {gbps:.0f} GB/s ({t * 1e3:.1f} us)")
            print(dtype, n, " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
