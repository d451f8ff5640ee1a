"""Where the time of one cross-entropy forward + backward goes (torch.profiler, CUDA kernels), for ours and Liger.

    PYTHONPATH=src python benchmarks/losses_probe.py      (on the GPU machine; Liger optional)
"""

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import onlinesoftmax as oss


def one(fn, x, t):
    x.grad = None
    fn(x, t).backward()


def main():
    impls = {"oss": lambda x, t: oss.cross_entropy(x, t),
             "torch.compile": torch.compile(lambda x, t: F.cross_entropy(x.float(), t), dynamic=False)}
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
        impls["liger"] = lambda x, t: liger_cross_entropy(x, t)
    except ImportError:
        pass
    for V in (32000, 128256):
        x = torch.randn(8192, V, device="cuda", dtype=torch.bfloat16).requires_grad_()
        t = torch.randint(0, V, (8192,), device="cuda")
        for name, fn in impls.items():
            if name == "torch.compile" and V != 128256:
                continue
            for _ in range(3):
                one(fn, x, t)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                one(fn, x, t)
                torch.cuda.synchronize()
            print(f"== V={V} {name}")
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
                print(f"  {e.device_time_total / e.count:9.1f} us x{e.count}  {e.key[:90]}")


if __name__ == "__main__":
    main()
