"""What the softmax tests share: the fp64 references and the tolerance rule, the row problems plans are made for,
and the launches with the plan they ran.

Tolerance rule: our worst relative error against fp64 may not exceed twice torch eager's in the same dtype, plus 4
eps of the output dtype (``assert_matches_low_precision_eager``). Without CUDA the Triton kernels run in the
interpreter (small sizes); with CUDA the same tests run there.
"""

import numpy as np
import torch

import onlinesoftmax as oss
from onlinesoftmax import reference as ref
from onlinesoftmax.softmax import launch as SL
from onlinesoftmax.softmax.geometry import rows_or_copy
from onlinesoftmax.softmax.plan import LOGSUMEXP, SOFTMAX, Backward, Forward

HAS_CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if HAS_CUDA else "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BACKENDS = ["torch", "triton"]
FNS = {
    "softmax": (oss.softmax, torch.softmax, ref.softmax),
    "log_softmax": (oss.log_softmax, torch.log_softmax, ref.log_softmax),
    "logsumexp": (oss.logsumexp, torch.logsumexp, ref.logsumexp),
}


def fp64_ref(name, x, dim):
    return torch.from_numpy(np.asarray(FNS[name][2](x.double().cpu().numpy(), axis=dim)))


def assert_matches_low_precision_eager(name, out, x, dim, out_dtype=None):
    """max |ours - fp64| / |fp64| <= 2 x the same for torch eager + 4 eps; NaN and inf exactly as the reference."""
    expect = fp64_ref(name, x, dim)
    kw = {} if name == "logsumexp" or out_dtype is None else {"dtype": out_dtype}
    eager = FNS[name][1](x, dim, **kw).double().cpu()
    got = out.double().cpu()
    assert got.shape == expect.shape
    assert out.dtype == (out_dtype or x.dtype)
    nan = torch.isnan(expect)
    assert torch.equal(torch.isnan(got), nan), "NaN pattern differs from torch's"
    inf = torch.isinf(expect)
    assert torch.equal(got[inf], expect[inf]), "infinities differ"
    fin = ~(nan | inf)
    # relative error (absolute below 1 for log outputs), compared as the worst case over the tensor
    floor = torch.finfo(out.dtype).tiny if name == "softmax" else 1.0
    scale = expect[fin].abs().clamp_min(floor)
    ours = ((got[fin] - expect[fin]).abs() / scale).max() if fin.any() else 0.0
    theirs = ((eager[fin] - expect[fin]).abs() / scale).max() if fin.any() else 0.0
    bound = 2 * theirs + 4 * torch.finfo(out.dtype).eps
    assert ours <= bound, f"{name}: worst relative error {ours:.3e} > bound {bound:.3e} (torch eager {theirs:.3e})"


def assert_grad_like_eager(fn, torch_fn, x, g, backend, **kw):
    """Gradient error vs fp64 autograd <= 2 x torch eager's in x's dtype + 2 eps x max|dx| (the Triton
    interpreter rounds to bf16/fp16 by truncation, up to one more unit than the GPU). Returns our gradient."""
    a = x.clone().requires_grad_()
    fn(a, -1, backend=backend, **kw).backward(g)
    e = x.clone().requires_grad_()
    torch_fn(e, -1).backward(g)
    r = x.double().requires_grad_()
    torch_fn(r, -1).backward(g.double())
    ours = (a.grad.double() - r.grad).abs().max()
    theirs = (e.grad.double() - r.grad).abs().max()
    bound = 2 * theirs + 2 * torch.finfo(x.dtype).eps * r.grad.abs().max()
    assert ours <= bound, f"{fn.__name__}: grad error {ours:.3e} > {bound:.3e} (torch eager {theirs:.3e})"
    return a.grad


def assert_dx_within_eager(dx, eager, y64, dy64, log):
    """dx against the fp64 backward of (y, dy), within twice the error of torch's eager dx (same inputs) plus 4 eps
    of max |dx|: softmax dx = y·(dy − Σ y·dy), log-softmax dx = dy − e^y·Σ dy."""
    ref = dy64 - y64.exp() * dy64.sum(-1, keepdim=True) if log else y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    ours, theirs = (dx.double() - ref).abs().max(), (eager.double() - ref).abs().max()
    assert ours <= 2 * theirs + 4 * torch.finfo(dx.dtype).eps * ref.abs().max(), (ours, theirs)


# ---- problems built by hand (plans on hand-built targets) ---------------------------------------------------------
def rows(n: int) -> tuple:
    """The row view (stride_outer, stride_inner, stride_n) of contiguous rows of n."""
    return (n, 0, 1)


def forward_problem(m, n, dtype, mode=SOFTMAX, out_dtype=None, align=16, geo_x=None, geo_y=None) -> Forward:
    """m contiguous rows of n (unless ``geo_*``); ``align``: the bytes dividing x's and y's data pointers."""
    geo_y = (0, 0, 0) if mode == LOGSUMEXP else geo_y or rows(n)
    return Forward(m, n, 1, geo_x or rows(n), geo_y, mode, dtype, out_dtype or dtype, align)


def backward_problem(m, n, dtype, log, align=16, geos=None, dtypes=None) -> Backward:
    """The backward of m contiguous rows of n: y, dy, dx of ``dtype`` (unless ``dtypes``)."""
    return Backward(m, n, 1, *(geos or (rows(n),) * 3), log, dtypes or (dtype,) * 3, align)


# ---- launches with the plan that ran ------------------------------------------------------------------------------
def run_forward(x, dim, mode, knobs=None, out_dtype=None):
    """launch.forward on x's row view as the op makes it: (output, the plan that ran)."""
    dim %= x.dim()
    if mode == LOGSUMEXP:
        (xr,), (M, N, inner, (gx,)) = rows_or_copy([x], dim)
        out = torch.empty(M, dtype=out_dtype or x.dtype, device=x.device)
        plan = SL.forward(xr, out, gx, None, M, N, inner, mode, knobs)
        return out.reshape(x.shape[:dim] + x.shape[dim + 1:]), plan
    (xr, out), (M, N, inner, (gx, gy)) = rows_or_copy([x, torch.empty_like(x, dtype=out_dtype or x.dtype)], dim)
    plan = SL.forward(xr, out, gx, gy, M, N, inner, mode, knobs)
    return out, plan


def run_backward(y, dy, log, knobs=None, dim=-1):
    """launch.backward on (y, dy) as the op's backward runs it: (dx, the plan that ran)."""
    (y, dy, dx), (M, N, inner, (gy, gdy, gdx)) = rows_or_copy([y, dy, torch.empty_like(y)], dim % y.dim())
    plan = SL.backward(y, dy, dx, gy, gdy, gdx, M, N, inner, log, knobs)
    return dx, plan
