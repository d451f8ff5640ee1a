"""Suite ``state``: the (m, d) state on the portable torch path, logsumexp of rows vs torch.logsumexp."""

from __future__ import annotations

import torch

from ...state import SoftmaxState
from ..harness import BenchContext, Case, register_suite


@register_suite("state")
def suite(ctx: BenchContext):
    dtypes = [torch.float32] + ([torch.bfloat16] if ctx.is_cuda else [])
    ns = [1024, 4096] if ctx.quick else [1024, 4096, 16384, 65536]
    elems = (1 << 22 if ctx.quick else 1 << 26) if ctx.is_cuda else 1 << 20
    for dtype in dtypes:
        if not ctx.want(dtype):
            continue
        for n in ns:
            m = max(1, elems // n)
            # I/O: read x (M·N) + write lse (M, fp32)
            nbytes = m * n * torch.finfo(dtype).bits // 8 + m * 4
            yield Case(
                label=f"{m}x{n}", shape=(m, n), dtype=dtype, x=n, bytes=nbytes,
                make_inputs=lambda m=m, n=n, dtype=dtype: (
                    torch.randn(m, n, device=ctx.device, dtype=dtype),),
                impls={
                    "torch.logsumexp": lambda x: torch.logsumexp(x.float(), dim=-1),
                    "SoftmaxState": lambda x: SoftmaxState.from_tensor(x, -1).logsumexp(),
                },
                peer="torch.logsumexp")
