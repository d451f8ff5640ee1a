"""softmax_topk and sample past 2^31 elements and on misaligned logits (``pytest -m gpu
tests/topk/test_topk_large.py``).

* Offsets: ``x [M, V]`` bf16 with ``M·V > 2^31`` (4.3 GB, 8.6 GB with the gradient). A kernel that forms
  ``row · stride`` in 32 bits reads another row (or faults) there: only the rows ending past 2^31 are checked,
  against fp64 / torch on those rows — top-k values, indices (ties to the lower index: a stable sort), lse, the
  gradient through values and lse; ``sample``'s greedy rows exactly (the first index of the largest logit,
  log-probability 0), drawn rows by their uniform (the first kept token whose running mass passes it, the
  reference's inverse CDF) with top-k, top-p (the row kernel) and a temperature, and their log-probabilities.
* Alignment: logits starting 2 or 4 bytes past a 16-byte boundary (``buf[1:]``): the same checks on every row, and
  an aligned call after them bit for bit as the first (a launch bound for aligned pointers is not replayed on a
  misaligned one, nor the other way round).

The private helpers take the sizes: small calls run them on the CPU (the interpreter) to keep them honest.
"""

import numpy as np
import pytest
import torch
from big_inputs import free, misaligned, past_2_31, rel

import onlinesoftmax as oss
from onlinesoftmax.reference import sampling as sref
from onlinesoftmax.topk import explain


def _topk_rows(x, k, rows, backend=None):
    """softmax_topk of ``x`` with and without a gradient; rows ``rows`` against the fp64 reference on them."""
    dev = x.device
    xs = x[rows].double()
    want_idx = torch.sort(xs, stable=True, dim=-1, descending=True).indices[:, :k]   # ties: the lower index first
    out = oss.softmax_topk(x, k, backend=backend)
    assert torch.equal(out.indices[rows], want_idx)
    xs.requires_grad_()
    p = torch.softmax(xs, -1)
    want_v, want_l = p.gather(1, want_idx), torch.logsumexp(xs, -1)
    torch.testing.assert_close(out.values[rows].double(), want_v.detach(), rtol=2e-5, atol=1e-12)
    torch.testing.assert_close(out.lse[rows].double(), want_l.detach(), rtol=1e-5, atol=1e-6)
    del out
    xl = x.detach().requires_grad_()
    out = oss.softmax_topk(xl, k, backend=backend)
    dv = torch.randn(x.shape[0], k, device=dev)
    dl = torch.randn(x.shape[0], device=dev)
    ((out.values * dv).sum() + (out.lse * dl).sum()).backward()
    assert torch.equal(out.indices[rows], want_idx)
    ((want_v * dv[rows].double()).sum() + (want_l * dl[rows].double()).sum()).backward()
    g = xl.grad[rows]
    assert not torch.isnan(g).any()
    assert rel(g, xs.grad) < (8e-3 if x.dtype != torch.float32 else 1e-5), rel(g, xs.grad)
    return out.values.detach(), out.indices, out.lse.detach(), xl.grad


SAMPLE_OPTS = [dict(top_k=50), dict(top_p=0.9), dict(temperature=0.7, top_k=100, top_p=0.95, min_p=0.01)]


def _sample_rows(x, rows, backend=None):
    """sample: greedy (temperature 0) rows exactly; rows drawn with given uniforms against the reference's
    inverse CDF (ids where the uniform is not within 1e-5 of a boundary of the CDF) and their log-probabilities."""
    ids, logp = oss.sample(x, temperature=0.0, backend=backend)
    want = torch.sort(x[rows].float(), stable=True, dim=-1, descending=True).indices[:, 0]
    assert torch.equal(ids[rows], want) and (logp[rows] == 0).all()
    u = torch.rand(x.shape[0], device=x.device)
    out = []
    for opts in SAMPLE_OPTS:
        ids, logp = oss.sample(x, uniform=u, backend=backend, **opts)
        out.append((ids, logp))
        for r in range(x.shape[0])[rows]:
            probs = sref.sample_distribution(x[r].float().cpu().numpy(), **opts)
            i, gap = sref.sample_draw(probs, u[r].item())
            got = int(ids[r])
            assert 0 <= got < x.shape[1] and probs[got] > 0, (opts, r, got)
            if gap > 1e-5:
                assert got == i, (opts, r, got, i)
            np.testing.assert_allclose(logp[r].item(), np.log(probs[got]), rtol=1e-4, atol=1e-5)
    return out


def test_topk_and_sample_helpers_small(kernel_device):
    """The helpers at 4 rows of 500 (the interpreter on the CPU)."""
    x = (torch.randn(4, 500) * 3).bfloat16().to(kernel_device)
    _topk_rows(x, 20, slice(2, 4), backend="triton")
    _sample_rows(x, slice(2, 4), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("V,k", [(128256, 50), (262144, 1024), (151936, 8), (32000, 1)])
def test_gpu_softmax_topk_more_than_2_31_elements(V, k):
    """bf16 [M, V], M·V > 2^31: the rows past 2^31 (values, indices, lse, dx) as the reference's (the fused
    kernels: explain says "filter"; the two-level merge at k = 1024)."""
    M, first = past_2_31(V)
    x = (torch.randn(M, V, device="cuda") * 3).bfloat16()
    assert explain(x, k).path == "filter"
    _topk_rows(x, k, slice(first, M))
    del x
    free()


@pytest.mark.gpu
@pytest.mark.parametrize("V", [128256, 151936])
def test_gpu_sample_more_than_2_31_elements(V):
    """bf16 [M, V], M·V > 2^31: greedy, top-k, top-p (the row kernel) and mixed draws on the rows past 2^31."""
    M, first = past_2_31(V)
    x = (torch.randn(M, V, device="cuda") * 3).bfloat16()
    _sample_rows(x, slice(first, M))
    del x
    free()


@pytest.mark.gpu
@pytest.mark.parametrize("V,k,dtype", [(128256, 50, torch.bfloat16), (262144, 1024, torch.bfloat16),
                                       (151936, 8, torch.float32), (32000, 1, torch.float16),
                                       (50257, 64, torch.bfloat16)])
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_softmax_topk_misaligned(V, k, dtype, B):
    """x aligned, then 1 element past a 16-byte boundary, then aligned again: every row as the reference's, the
    misaligned values / lse within rounding of the aligned ones (the same indices), the last call bit for bit."""
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
    rows = slice(0, B)
    first = _topk_rows(x, k, rows)
    mis = _topk_rows(misaligned(x), k, rows)
    assert torch.equal(mis[1], first[1])
    torch.testing.assert_close(mis[0], first[0], rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(mis[2], first[2], rtol=1e-6, atol=1e-6)
    again = _topk_rows(x, k, rows)
    assert all(torch.equal(a, b) for a, b in zip(again[:3], first[:3]))


@pytest.mark.gpu
@pytest.mark.parametrize("B,V,dtype", [(64, 128256, torch.bfloat16), (1, 151936, torch.float32)])  # 111 / 173 s
def test_gpu_sample_misaligned(B, V, dtype):
    """sample on logits 1 element past a 16-byte boundary between aligned calls: every row as the reference's
    (greedy exactly, draws by their uniforms), the aligned calls' ids the same before and after."""
    x = (torch.randn(B, V, device="cuda") * 3).to(dtype)
    rows = slice(0, B, 9)           # every 9th row against the reference (~0.2 s of NumPy per row and option)
    torch.manual_seed(1)
    first = _sample_rows(x, rows)
    torch.manual_seed(1)
    _sample_rows(misaligned(x), rows)
    torch.manual_seed(1)
    again = _sample_rows(x, rows)
    for (i1, l1), (i2, l2) in zip(first, again):
        assert torch.equal(i1, i2) and torch.equal(l1, l2)
