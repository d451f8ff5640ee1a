"""sample(): χ² against the exact distribution on CPU, reproducibility, per-row parameters, greedy, no sync.
"""

import math

import numpy as np
import pytest
import torch

import onlinesoftmax
from onlinesoftmax.topk import sample

LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.9, 0.3, -0.1, 0.05, -1.0, float("-inf"), -2.5, 0.6, 1.45])


def exact(logits, t=1.0, top_k=None, top_p=None):
    """fp64: temperature, then top-k (ties to the lower index), renormalise, then the top-p prefix."""
    z = logits.double().numpy() / t
    order = np.argsort(-z, kind="stable")
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    keep = np.ones_like(p, dtype=bool)
    if top_k is not None:
        keep[top_k:] = False
    w = np.where(keep, p, 0.0)
    if top_p is not None:
        before = np.cumsum(w) - w
        keep &= before < top_p * w.sum()
        keep[0] = True
    w = np.where(keep, p, 0.0)
    out = np.zeros_like(w)
    out[order] = w / w.sum()
    return out


def chi2_critical(df: int, z: float = 4.265) -> float:
    """Wilson–Hilferty upper quantile of χ²(df) at the normal quantile z (4.265 ≈ p = 1e-5)."""
    a = 2.0 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def assert_distribution(ids: torch.Tensor, probs: np.ndarray):
    n = ids.numel()
    counts = np.bincount(ids.numpy(), minlength=probs.size).astype(np.float64)
    assert counts[probs == 0].sum() == 0, f"sampled a token of probability 0: {counts}"
    live = probs > 0
    e = n * probs[live]
    stat = float(((counts[live] - e) ** 2 / e).sum())
    df = int(live.sum()) - 1
    if df > 0:
        assert stat < chi2_critical(df), f"chi2={stat:.1f} df={df} counts={counts} expected={n * probs}"


@pytest.mark.parametrize("t,top_k,top_p", [(1.0, None, None), (0.7, 5, None), (1.0, None, 0.8),
                                           (1.3, 8, 0.9), (2.0, 3, 0.5), (1.0, 1, None)])
def test_chi2_against_exact(t, top_k, top_p):
    n = 20000
    g = torch.Generator().manual_seed(1234)
    x = LOGITS.expand(n, -1).contiguous()
    ids, logp = sample(x, temperature=t, top_k=top_k, top_p=top_p, generator=g)
    probs = exact(LOGITS, t, top_k, top_p)
    assert ids.shape == (n,) and ids.dtype == torch.int64 and logp.dtype == torch.float32
    assert_distribution(ids, probs)
    want = torch.from_numpy(np.log(probs[ids.numpy()]))
    torch.testing.assert_close(logp.double(), want, rtol=1e-5, atol=1e-5)


def test_per_row_tensor_parameters():
    n = 12000
    x = LOGITS.expand(3 * n, -1).contiguous()
    t = torch.tensor([1.0, 0.5, 1.5]).repeat_interleave(n)
    k = torch.tensor([0, 4, 6]).repeat_interleave(n)           # 0 disables top-k on a row
    p = torch.tensor([0.7, 1.0, 0.95]).repeat_interleave(n)
    ids, _ = sample(x, temperature=t, top_k=k, top_p=p, generator=torch.Generator().manual_seed(7))
    for r, (tt, kk, pp) in enumerate([(1.0, None, 0.7), (0.5, 4, None), (1.5, 6, 0.95)]):
        assert_distribution(ids[r * n:(r + 1) * n], exact(LOGITS, tt, kk, pp))


def test_reproducible_greedy_and_shapes():
    x = torch.randn(4, 3, 100)
    a = sample(x, top_k=20, generator=torch.Generator().manual_seed(3))
    b = sample(x, top_k=20, generator=torch.Generator().manual_seed(3))
    c = sample(x, top_k=20, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].shape == (4, 3)
    assert not torch.equal(a[0], c[0])
    ids, logp = sample(x, temperature=0.0)
    assert torch.equal(ids, x.argmax(-1)) and torch.equal(logp, torch.zeros_like(logp))
    t = torch.tensor([0.0, 1.0, 0.0, 1.0]).repeat_interleave(3)
    g = torch.Generator().manual_seed(1)
    ids, logp = sample(x.reshape(12, 100), temperature=t, top_p=0.9, generator=g)
    assert torch.equal(ids[t == 0], x.reshape(12, 100).argmax(-1)[t == 0])
    assert onlinesoftmax.sample is sample


def test_sample_errors():
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="top_p"):
        sample(x, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        sample(x, top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        sample(x, temperature=-1.0)
    with pytest.raises(ValueError, match="one per row"):
        sample(x, temperature=torch.ones(3))


@pytest.mark.gpu
def test_gpu_no_sync_graph_and_chi2():
    n = 40000
    x = LOGITS.cuda().expand(n, -1).contiguous()
    g = torch.Generator(device="cuda").manual_seed(5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, logp = sample(x, temperature=0.8, top_k=6, top_p=0.9, generator=g)
        sample(x, temperature=torch.full((n,), 0.8, device="cuda"), top_k=torch.full((n,), 6, device="cuda"),
               generator=g)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert_distribution(ids.cpu(), exact(LOGITS, 0.8, 6, 0.9))
    static = torch.randn(64, 128256, device="cuda")
    sample(static, top_k=50)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_ids, _ = sample(static, top_k=50, temperature=0.0)
    static.copy_(torch.randn_like(static))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_ids, static.argmax(-1))
