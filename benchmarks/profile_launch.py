"""Where the host time of one eager decode-sized call goes (cProfile over 300 calls).

    PYTHONPATH=src python benchmarks/profile_launch.py
"""

import cProfile
import pstats

import torch

import onlinesoftmax as oss

x = torch.randn(1, 128256, device="cuda")
for _ in range(20):
    oss.softmax(x)
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(300):
    oss.softmax(x)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(25)
