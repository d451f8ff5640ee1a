"""Shape propagation under FakeTensorMode (CPU fake tensors, the default backend): every public op gives its
output shapes without reading values (the host-side checks and the CPU top-k's exact index search are skipped)."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import onlinesoftmax as oss


def test_ops_propagate_shapes_under_fake_tensor_mode():
    cases = {
        "softmax": (lambda: oss.softmax(torch.empty(4, 50), -1), (4, 50)),
        "softmax_topk": (lambda: oss.softmax_topk(torch.empty(4, 50), 5).values, (4, 5)),
        "sample": (lambda: oss.sample(torch.empty(4, 50), top_k=5)[0], (4,)),
        "cross_entropy": (lambda: oss.cross_entropy(torch.empty(4, 50), torch.zeros(4, dtype=torch.long)), ()),
        "linear_cross_entropy": (lambda: oss.linear_cross_entropy(torch.empty(4, 8), torch.empty(50, 8),
                                                                  torch.zeros(4, dtype=torch.long)), ()),
        "attention": (lambda: oss.attention(torch.empty(1, 2, 5, 16), torch.empty(1, 2, 7, 16),
                                            torch.empty(1, 2, 7, 16)), (1, 2, 5, 16)),
    }
    for name, (fn, shape) in cases.items():
        with FakeTensorMode():
            out = fn()
        assert tuple(out.shape) == shape, name
