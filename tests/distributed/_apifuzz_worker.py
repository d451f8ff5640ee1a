"""Runs in each spawned rank of test_distributed_api_fuzz: the distributed ops' arguments as torch takes them (NumPy
numbers, 0-d tensors) and bool flags that must be bools, against the single-process ops. Raises on the first
mismatch; every rank makes the same calls (an error raised before a collective is raised on all of them)."""

import datetime

import numpy as np
import pytest
import torch
import torch.distributed as dist

import onlinesoftmax as oss
from onlinesoftmax import distributed as D


def check_arguments(rank: int, P: int):
    gen = torch.Generator().manual_seed(7)
    x, t = torch.randn(3, 4 * P, generator=gen), torch.tensor([0, 3, 2 * P])
    shard = x[:, 4 * rank:4 * rank + 4]
    top = D.softmax_topk(shard, np.int64(3))
    want = oss.softmax_topk(x, 3, backend="torch")
    torch.testing.assert_close(top.values, want.values)
    assert torch.equal(top.indices, want.indices)
    loss = D.cross_entropy(shard, t, ignore_index=np.int64(3), label_smoothing=np.float32(0.25))
    want = oss.cross_entropy(x, t, ignore_index=3, label_smoothing=0.25, backend="torch")
    torch.testing.assert_close(loss, want)
    with pytest.raises(TypeError, match="^distributed.cross_entropy: ignore_index must be an int, got float"):
        D.cross_entropy(shard, t, ignore_index=3.0)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="^distributed.logsumexp: keepdim must be a bool"):
            D.logsumexp(shard, keepdim=bad)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen) for _ in range(3))
    with pytest.raises(TypeError, match="^distributed.attention: return_lse must be a bool"):
        D.attention(q, k, v, return_lse=None)
    o = D.attention(q, k, v, scale=np.float32(0.5), backend="torch")
    o_ref = D.attention(q, k, v, scale=0.5, backend="torch")
    torch.testing.assert_close(o, o_ref)


def main(rank: int, P: int, port: int):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=60))
    try:
        check_arguments(rank, P)
        dist.barrier()
    finally:
        dist.destroy_process_group()
