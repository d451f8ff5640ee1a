"""softmax, log_softmax and logsumexp on misaligned tensors (``pytest -m gpu
tests/softmax/test_softmax_misaligned.py``).

x and dy starting 2 or 4 bytes past a 16-byte boundary (``buf[1:]``): 16-byte vector loads, cp.async and the bf16
word kernels need aligned rows, and a launch bound for an aligned x is replayed by shape (``api._softmax_call``)
only on aligned pointers. Each misaligned call must match fp64 as closely as torch eager (the family's bound) and
the aligned call's output within rounding; an aligned call after it gives the first call's bits.
"""

import pytest
import torch
from big_inputs import misaligned

from ._helpers import DEV, FNS, assert_matches_low_precision_eager


def _grad(fn, x, g, backend):
    a = x.detach().requires_grad_()
    fn(a, -1, backend=backend).backward(g)
    return a.grad


def _check(name, x, backend=None):
    """Forward (and for softmax / log_softmax the backward) of x aligned, misaligned, aligned again."""
    fn, torch_fn = FNS[name][0], FNS[name][1]
    xm = misaligned(x)
    first, mis, again = (fn(t, -1, backend=backend) for t in (x, xm, x))
    for out in (first, mis):
        assert_matches_low_precision_eager(name, out, x, -1)
    assert torch.equal(again, first)
    eps = torch.finfo(x.dtype).eps
    torch.testing.assert_close(mis.double(), first.double(), rtol=2 * eps, atol=2 * eps)
    g = torch.randn(first.shape, device=x.device).to(x.dtype)
    r = x.double().requires_grad_()
    torch_fn(r, -1).backward(g.double())
    e = x.clone().requires_grad_()
    torch_fn(e, -1).backward(g)
    bound = 2 * (e.grad.double() - r.grad).abs().max() + 2 * eps * r.grad.abs().max()
    gm = misaligned(g) if g.dim() else g
    for xx, gg in ((x, g), (xm, g), (x, gm), (xm, gm)):
        dx = _grad(fn, xx, gg, backend)
        assert (dx.double() - r.grad).abs().max() <= bound, (name, xx.data_ptr() % 16, gg.data_ptr() % 16)


def test_misaligned_small(kernel_device):
    """Interpreter: rows of 300 (bf16) and 50000 (fp32: the split rows)."""
    for name in FNS:
        _check(name, torch.randn(5, 300, device=kernel_device).bfloat16(), backend="triton")
    _check("softmax", torch.randn(2, 5000, device=kernel_device), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FNS))
@pytest.mark.parametrize("m,n", [(64, 1000), (8, 4096), (300, 131072), (4, 151936), (600, 32768)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_gpu_misaligned(name, m, n, dtype):
    """Rows in registers, whole rows in shared memory, the coop kernels (bf16 words at 300 × 131072), decode sizes."""
    _check(name, (torch.randn(m, n, device=DEV) * 4).to(dtype))
