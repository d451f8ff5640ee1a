"""What a PyTorch user calls: torch's positional signatures, double backward, and the eager autograd path."""

import pytest
import torch

import onlinesoftmax as oss


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("fn", [oss.softmax, oss.log_softmax, oss.logsumexp], ids=lambda f: f.__name__)
def test_double_backward(kernel_device, backend, fn):
    """gradgradcheck used to raise "no autograd formula was registered for onlinesoftmax.softmax_backward"."""
    x = torch.randn(3, 11, dtype=torch.float64, device=kernel_device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fn(t, -1, backend=backend), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fn(t, -1, backend=backend), (x,))


@pytest.mark.parametrize("log", [False, True])
def test_double_backward_through_the_custom_op(log):
    """The op torch.compile sees: its backward op is differentiable too."""
    x = torch.randn(2, 9, dtype=torch.float64, requires_grad=True)
    op = lambda t: torch.ops.onlinesoftmax.softmax(t, 1, int(log), torch.float64, "torch")   # noqa: E731
    assert torch.autograd.gradgradcheck(op, (x,))


def test_torch_positional_signatures():
    """``logsumexp(x, -1, True)`` and ``softmax(x, -1, torch.float64)`` raised TypeError (keyword-only)."""
    x = torch.randn(4, 5)
    assert oss.logsumexp(x, -1, True).shape == torch.logsumexp(x, -1, True).shape == (4, 1)
    assert oss.softmax(x, -1, torch.float64).dtype == torch.float64
    assert oss.log_softmax(x, 1, torch.float64).dtype == torch.float64
    torch.testing.assert_close(oss.softmax(x, 0, torch.float64), torch.softmax(x, 0, torch.float64))


def test_eager_grad_uses_the_autograd_function():
    """An eager call that needs a gradient goes through the lean autograd.Function, not the custom op's registered
    autograd (that one cost about ten times torch's host time per call)."""
    x = torch.randn(4, 6, requires_grad=True)
    y = oss.softmax(x, -1)
    assert type(y.grad_fn).__name__ == "_EagerSoftmaxBackward"
    assert type(oss.logsumexp(x, -1).grad_fn).__name__ == "_EagerLogsumexpBackward"          # fp32: no cast after
    assert type(oss.logsumexp(x.bfloat16(), -1).grad_fn.next_functions[0][0]).__name__ == "_EagerLogsumexpBackward"
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-6, rtol=0)     # softmax rows sum to 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_logsumexp_output_takes_in_place_ops(kernel_device, backend):
    """The kernel's [M] result was reshaped inside the autograd.Function: ``lse += 1`` on an output that needs a
    gradient raised "Output 0 of _EagerLogsumexp is a view and is being modified inplace". As torch.logsumexp's, it
    takes the op, and a backward through it then raises torch's version-counter error."""
    x = torch.randn(3, 4, 5, device=kernel_device, requires_grad=True)
    lse = oss.logsumexp(x, -1, backend=backend)
    lse += 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        lse.sum().backward()
    lse = oss.logsumexp(x, 1, backend=backend)
    lse.sum().backward()
    with torch.no_grad():
        lse -= 1                                    # after the backward, as a running statistic would be
    torch.testing.assert_close(lse, torch.logsumexp(x, 1) - 1)
