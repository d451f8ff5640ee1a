"""Every public op inside the PyTorch machinery a training or serving loop puts around it: torch.autocast,
inference_mode / no_grad, deterministic mode, torch.export and torch.compile(dynamic=True) with changing shapes,
activation checkpointing, non-leaf inputs, hooks and tensor subclasses, double backward. Both backends (Triton
through the interpreter on CPU tensors), at small sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import onlinesoftmax as oss
from onlinesoftmax._autocast import _torch_autocasts, autocast_boundary

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.interpreter)]
BF16 = torch.bfloat16


def _cases(be: str, B: int = 2) -> dict:
    """name -> (fn, inputs, differentiable): each op on small inputs whose dim 0 is the batch ``B``."""
    t = torch.randint(0, 32, (3 * B,))          # the losses' targets are inputs: their batch changes too
    cu = torch.tensor([0, 3, 5 * B], dtype=torch.int32)
    seqlens = torch.randint(1, 48, (B,), dtype=torch.int32)
    return {
        "softmax": (lambda x: oss.softmax(x, backend=be), [torch.randn(B, 40)], True),
        "log_softmax": (lambda x: oss.log_softmax(x, dim=0, backend=be), [torch.randn(B, 40)], True),
        "logsumexp": (lambda x: oss.logsumexp(x, backend=be), [torch.randn(B, 40)], True),
        "softmax_topk": (lambda x: oss.softmax_topk(x, 3, backend=be).values, [torch.randn(B, 40)], True),
        "sample": (lambda x, u: oss.sample(x, top_p=0.9, uniform=u, backend=be)[1],
                   [torch.randn(B, 40), torch.rand(B)], False),
        "attention": (lambda q, k, v: oss.attention(q, k, v, causal=True, backend=be),
                      [torch.randn(B, 2, 8, 16), torch.randn(B, 1, 12, 16), torch.randn(B, 1, 12, 16)], True),
        "attention_varlen": (lambda q, k, v: oss.attention_varlen(q, k, v, cu, cu, 5 * B, 5 * B, causal=True,
                                                                  backend=be),
                             [torch.randn(5 * B, 2, 16), torch.randn(5 * B, 2, 16), torch.randn(5 * B, 2, 16)], True),
        "attention_with_kvcache": (lambda q, k, v, n: oss.attention_with_kvcache(q, k, v, n, backend=be),
                                   [torch.randn(B, 2, 1, 16), torch.randn(B, 1, 48, 16), torch.randn(B, 1, 48, 16),
                                    seqlens], True),
        "merge_attention_states": (lambda a, la, b, lb: oss.merge_attention_states(a, la, b, lb, backend=be)[0],
                                   [torch.randn(B, 3, 16), torch.randn(B, 3), torch.randn(B, 3, 16), torch.randn(B, 3)],
                                   True),
        "cross_entropy": (lambda x, t: oss.cross_entropy(x, t, backend=be), [torch.randn(3 * B, 32), t], True),
        "linear_cross_entropy": (lambda h, w, b, t: oss.linear_cross_entropy(h, w, t, bias=b, backend=be),
                                 [torch.randn(3 * B, 16), torch.randn(32, 16), torch.randn(32), t], True),
        "linear_cross_entropy_none": (lambda h, w, t: oss.linear_cross_entropy(h, w, t, reduction="none",
                                                                             backend=be),
                                      [torch.randn(3 * B, 16), torch.randn(32, 16), t], True),
        "SoftmaxState": (lambda x: oss.SoftmaxState.from_tensor(x).combine(oss.SoftmaxState.from_tensor(2 * x))
                         .logsumexp(), [torch.randn(B, 40)], True),
    }


NAMES = list(_cases("torch"))
GRAD_NAMES = [n for n, c in _cases("torch").items() if c[2]]


def _leaves(ins, grad=True, wrap=None):
    """Copies of ``ins``, the floating ones requiring grad (``grad``) and passed through ``wrap``."""
    out = []
    for i in ins:
        i = i.detach().clone()
        if i.is_floating_point():
            i = wrap(i) if wrap is not None else i.requires_grad_(grad)
        out.append(i)
    return out


def _grads(fn, ins, w=None):
    """(output, gradients of Σ w·output with respect to the floating inputs)."""
    y = fn(*ins)
    w = torch.ones_like(y, dtype=torch.float32) if w is None else w
    return y, torch.autograd.grad((y.float() * w).sum(), [i for i in ins if i.requires_grad], allow_unused=True)


def _same(a, b, atol=1e-5):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-4, equal_nan=True)


# ---- torch.autocast -------------------------------------------------------------------------------------------
def test_autocast_policies_follow_torchs_op_lists():
    """The boundary applies a policy where torch's autocast has a kernel for the op stood in for: SDPA and linear in
    the low-precision dtype everywhere, softmax / log_softmax / logsumexp in fp32 on CUDA only (the CPU's autocast
    leaves them alone), cross_entropy_loss in fp32 on the CPU (on CUDA through log_softmax and nll_loss)."""
    for op in ("aten::scaled_dot_product_attention", "aten::linear"):
        assert {"cpu", "cuda"} <= _torch_autocasts(op)
    for op in ("aten::softmax.int", "aten::log_softmax.int", "aten::logsumexp"):
        assert "cuda" in _torch_autocasts(op) and "cpu" not in _torch_autocasts(op)
    with torch.autocast("cpu", dtype=BF16):
        x = torch.randn(4, 8)
        assert F.scaled_dot_product_attention(x[None], x[None], x[None]).dtype == BF16
        assert F.softmax(x.to(BF16), -1).dtype == BF16
        assert F.cross_entropy(x.to(BF16), torch.zeros(4, dtype=torch.long)).dtype == torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["attention", "attention_varlen", "attention_with_kvcache"])
def test_autocast_attention_casts_as_sdpa(op, backend):
    """Under autocast an attention op takes q, k, v as SDPA does: cast to the autocast dtype (a fp32 q from a rotary
    embedding beside bf16 k, v was a TypeError), output in that dtype, gradients in each input's own dtype; the
    same values as the op on the cast inputs without autocast."""
    fn, (q, k, v, *rest), _ = _cases(backend)[op]
    q, k, v = q.requires_grad_(), k.to(BF16).requires_grad_(), v.to(BF16).requires_grad_()
    with torch.autocast("cpu", dtype=BF16):
        o, grads = _grads(fn, [q, k, v, *rest])
    ins = _leaves([q.to(BF16), k, v, *rest])
    ref, ref_grads = _grads(fn, ins)
    assert o.dtype == BF16
    _same(o, ref, atol=0)
    assert [g.dtype for g in grads] == [torch.float32, BF16, BF16]
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r.to(g.dtype), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_attention_torch_path_accumulates_in_fp32(backend):
    """Inside the op autocast is off: the torch path's fp32 score and value matmuls stay fp32 (autocast made them
    bf16 matmuls: o off by a bf16 rounding of every score); both backends give what they give without autocast."""
    fn, ins, _ = _cases(backend)["attention"]
    ins = [i.to(BF16) for i in ins]
    with torch.autocast("cpu", dtype=BF16):
        o = fn(*ins)
    _same(o, fn(*ins), atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_linear_cross_entropy_casts_as_linear(backend):
    """hidden from an autocast matmul (bf16) against an fp32 weight and bias (parameters) was a TypeError; now
    they are cast as F.linear casts them and the loss is fp32, as F.cross_entropy(F.linear(...)) under autocast;
    gradients in the parameters' fp32."""
    t = torch.randint(0, 32, (6,))
    h = torch.randn(6, 16, dtype=BF16, requires_grad=True)
    w, b = torch.nn.Parameter(torch.randn(32, 16)), torch.nn.Parameter(torch.randn(32))
    with torch.autocast("cpu", dtype=BF16):
        loss = oss.linear_cross_entropy(h, w, t, bias=b, backend=backend)
        ref = F.cross_entropy(F.linear(h, w, b), t)
    assert loss.dtype == ref.dtype == torch.float32
    got = torch.autograd.grad(loss, [h, w, b])
    want = torch.autograd.grad(ref, [h, w, b])
    assert [g.dtype for g in got] == [BF16, torch.float32, torch.float32]
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=1e-2)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_softmax_family_and_losses(backend):
    """On the CPU torch's autocast leaves softmax, log_softmax and logsumexp alone, and so do ours (x's dtype);
    cross_entropy returns fp32 as F.cross_entropy does; merge, topk and sample run as without autocast."""
    x = torch.randn(4, 40, dtype=BF16)

    def run():
        return [oss.softmax(x, backend=backend), oss.log_softmax(x, backend=backend),
                oss.logsumexp(x, backend=backend), oss.cross_entropy(x, torch.arange(4), backend=backend),
                oss.softmax_topk(x.float(), 3, backend=backend).values]

    with torch.autocast("cpu", dtype=BF16):
        got = run()
        assert got[0].dtype == F.softmax(x, -1).dtype
    for g, w in zip(got, run()):
        _same(g, w, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_fp32_policies(backend):
    """Where torch's autocast runs softmax / log_softmax in fp32 (CUDA: ``dtype=float32`` unless given) and logsumexp
    in fp32, ours do the same: the policies at work on the CPU through an op that the CPU's autocast lists."""
    x = torch.randn(4, 40, dtype=BF16)
    sm = autocast_boundary("aten::linear", "fp32_out", ("x",))(oss.softmax)
    lse = autocast_boundary("aten::linear", "fp32", ("x",))(oss.logsumexp.__wrapped__)
    with torch.autocast("cpu", dtype=BF16):
        y, y16, z = sm(x, backend=backend), sm(x, dtype=BF16, backend=backend), lse(x, backend=backend)
    _same(y, oss.softmax(x, dtype=torch.float32, backend=backend), atol=0)
    assert y16.dtype == BF16 and z.dtype == torch.float32
    _same(z, oss.logsumexp(x.float(), backend=backend), atol=0)


def test_autocast_compiled_module():
    """A module with an attention block (bf16 q, k, v from an autocast linear) and a linear cross-entropy head (an
    fp32 weight) compiles whole (fullgraph) under autocast, with the dtypes and values of the eager call."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.head = torch.nn.Parameter(torch.randn(32, 16))

        def forward(self, x, t):
            q, k, v = self.qkv(x).view(x.shape[0], 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
            o = oss.attention(q, k, v, causal=True, backend="torch")
            return oss.linear_cross_entropy(o.transpose(1, 2).reshape(-1, 16), self.head, t.reshape(-1),
                                            backend="torch")

    m, x, t = Block(), torch.randn(2, 6, 16), torch.randint(0, 32, (2, 6))
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=BF16):
        got, want = compiled(x, t), m(x, t)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    g = torch.autograd.grad(got, m.head)[0]
    assert g.dtype == torch.float32 and torch.isfinite(g).all()


# ---- inference_mode, no_grad ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_mode_and_no_grad(backend):
    """Under no_grad and inference_mode: the values of a plain call, no autograd graph (inputs requiring grad);
    inference tensors made there taken as inputs after it."""
    for name, (fn, ins, grad) in _cases(backend).items():
        ref = fn(*ins)
        leaves = _leaves(ins, grad)
        with torch.no_grad():
            y = fn(*leaves)
        assert y.grad_fn is None and not y.requires_grad, name
        _same(y, ref)
        with torch.inference_mode():
            y = fn(*leaves)
            frozen = [i.clone() for i in ins]
        assert y.is_inference() and not y.requires_grad, name
        _same(y, ref)
        _same(fn(*frozen), ref)


# ---- deterministic mode -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_mode(backend):
    """torch.use_deterministic_algorithms(True): every op runs (none raises: the only atomics, the attention
    backward's dQ accumulation, are planned out there) with the same outputs and gradients, torch.empty's memory
    filled with NaN in that mode (no op reads memory it did not write)."""
    assert torch.utils.deterministic.fill_uninitialized_memory
    for name, (fn, ins, grad) in _cases(backend).items():
        before = _grads(fn, _leaves(ins)) if grad else (fn(*ins), ())
        torch.use_deterministic_algorithms(True)
        try:
            after = _grads(fn, _leaves(ins)) if grad else (fn(*ins), ())
        finally:
            torch.use_deterministic_algorithms(False)
        for a, b in zip((before[0], *before[1]), (after[0], *after[1])):
            assert (a is None and b is None) or torch.equal(a, b), name


def test_deterministic_mode_attention_plans():
    """The policy: in deterministic mode the attention backward runs the split dK/dV and dQ kernels (no fp32
    atomics) on every target, and asking for the atomic (sm90) kernel is refused naming the mode."""
    from onlinesoftmax.attention import api
    from onlinesoftmax.attention.plan import Knobs, plan_attention, plan_backward
    from onlinesoftmax.target import H200

    q = torch.randn(1, 4, 256, 128, dtype=BF16)
    torch.use_deterministic_algorithms(True)
    try:
        p = api._problem(q, q, True, (-1, -1), None, False)
    finally:
        torch.use_deterministic_algorithms(False)
    assert p.deterministic
    b = plan_attention(p, H200, "triton").backward
    assert b.kernel == "triton" and not b.dq_atomic
    with pytest.raises(ValueError, match="deterministic"):
        plan_backward(p, H200, Knobs(backward={"kernel": "sm90"}))


# ---- export and compile -------------------------------------------------------------------------------------------
class _Op(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)




@pytest.mark.parametrize("backend", BACKENDS)
def test_export_dynamic_batch(backend):
    """torch.export.export with a dynamic batch dim: the exported program gives the eager values at other batches
    (varlen's export: tests/test_machinery_fuzz.py)."""
    for name in NAMES:
        if name == "attention_varlen":
            continue
        fn, ins, _ = _cases(backend, 3)[name]
        head = name.startswith("linear")          # the head's weight (and bias), between hidden and target: static
        dims = tuple(None if head and 0 < i < len(ins) - 1 else {0: torch.export.Dim.DYNAMIC} for i in range(len(ins)))
        m = torch.export.export(_Op(fn), tuple(ins), dynamic_shapes=(dims,)).module()
        for B in (3, 5):
            fn, ins, _ = _cases(backend, B)[name]
            torch.manual_seed(B)
            _same(m(*ins), fn(*ins))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_dynamic_recompiles_once_at_most(backend):
    """torch.compile(fullgraph=True, dynamic=True) of each op, forward and backward, at batches 3, 4 and 6: the
    eager values and gradients, and at most one recompile (the first change of a dim)."""
    from torch._dynamo.utils import counters

    for name in NAMES:
        if name in ("attention_varlen", "linear_cross_entropy_none"):
            continue            # varlen's SymInt max_seqlen: tests/test_machinery_fuzz.py; "none": as the "mean" one
        torch._dynamo.reset()
        counters.clear()
        compiled = None
        for B in (3, 4, 6):
            fn, ins, grad = _cases(backend, B)[name]
            if compiled is None:
                compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
            if grad:
                w = torch.randn(fn(*ins).shape)
                got, want = _grads(compiled, _leaves(ins), w), _grads(fn, _leaves(ins), w)
                for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
                    _same(a, b)
            else:
                _same(compiled(*ins), fn(*ins))
        assert counters["stats"]["unique_graphs"] <= 2, name


# ---- checkpointing, non-leaf inputs, hooks, subclasses, double backward ---------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint(backend):
    """torch.utils.checkpoint (non-reentrant) around each differentiable op: the gradients of the plain call."""
    for name in GRAD_NAMES:
        fn, ins, _ = _cases(backend)[name]
        w = torch.randn(fn(*ins).shape)
        _, want = _grads(fn, _leaves(ins), w)
        _, got = _grads(lambda *a: checkpoint(fn, *a, use_reentrant=False), _leaves(ins), w)
        for a, b in zip(got, want):
            _same(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_leaf_views_hooks_and_subclasses(backend):
    """Inputs that are non-leaf views of a larger tensor (retain_grad on them), a hook and retain_grad on the
    output, nn.Parameter and a plain Tensor subclass as inputs: the gradients of leaf inputs."""
    class Sub(torch.Tensor):
        pass

    for name in GRAD_NAMES:
        fn, ins, _ = _cases(backend)[name]
        w = torch.randn(fn(*ins).shape)
        _, want = _grads(fn, _leaves(ins), w)
        big = _leaves([torch.cat([i, i]) for i in ins])
        views = [b[: i.shape[0]] * 1.0 if b.requires_grad else i for b, i in zip(big, ins)]
        for v in views:
            if v.requires_grad:
                v.retain_grad()
        y = fn(*views)
        seen = []
        y.register_hook(lambda g: seen.append(g) or g * 2)
        y.retain_grad()
        (y.float() * w).sum().backward()
        assert len(seen) == 1 and y.grad is not None, name
        for b, v, r in zip([b for b in big if b.requires_grad], [v for v in views if v.requires_grad], want):
            _same(v.grad / 2, r)
            _same(b.grad[: r.shape[0]], v.grad)
            assert not b.grad[r.shape[0]:].any()
        for wrap in (torch.nn.Parameter, lambda t: t.as_subclass(Sub).requires_grad_()):
            leaves = _leaves(ins, wrap=wrap)
            _, got = _grads(fn, leaves, w)
            for a, r in zip(got, want):
                _same(a.as_subclass(torch.Tensor), r)


@pytest.mark.parametrize("name, backends", [
    ("attention", ("triton",)), ("attention_varlen", ("triton",)), ("cross_entropy", ("triton",)),
    ("linear_cross_entropy", ("torch", "triton")), ("softmax_topk", ("torch", "triton"))])
@pytest.mark.interpreter
def test_double_backward_refused_naming_the_op(name, backends):
    """create_graph=True through a backward that has no graph to give is a RuntimeError naming the op (not a
    silently missing second-order term)."""
    for be in backends:
        fn, ins, _ = _cases(be)[name]
        leaves = _leaves(ins)
        y = fn(*leaves)
        with pytest.raises(RuntimeError, match=f"{name}: double backward"):
            torch.autograd.grad(y.float().sum(), [i for i in leaves if i.requires_grad], create_graph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_where_supported(backend):
    """The ops whose backward is written in torch ops differentiate twice: a gradient penalty's gradient matches
    torch's reference ops'."""
    x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    for ours, ref in ((oss.softmax, torch.softmax), (oss.log_softmax, torch.log_softmax),
                      (oss.logsumexp, torch.logsumexp)):
        got = []
        for f in (lambda x: ours(x, -1, backend=backend), lambda x: ref(x, -1)):
            (g,) = torch.autograd.grad((f(x) * torch.arange(10.0, dtype=x.dtype)[:f(x).shape[-1]]).sum(), x,
                                       create_graph=True)
            got.append(torch.autograd.grad(g.pow(2).sum(), x)[0])
        torch.testing.assert_close(*got)


@pytest.mark.gpu
def test_gpu_autocast_as_torch():
    """Under CUDA autocast (bf16) each op returns torch's dtype for the op it stands in for, with the values of the
    call on the inputs torch's autocast would have given it: softmax / log_softmax fp32 (torch's fp32 list), logsumexp
    fp32, attention bf16 from fp32 q and bf16 k, v (SDPA's cast), linear_cross_entropy from a bf16 hidden and an fp32
    weight (F.linear's cast), fp32 loss."""
    dev = "cuda"
    x = torch.randn(8, 1000, device=dev, dtype=BF16)
    q = torch.randn(2, 4, 64, 64, device=dev)
    k, v = (torch.randn(2, 2, 80, 64, device=dev, dtype=BF16) for _ in range(2))
    h, w = torch.randn(64, 32, device=dev, dtype=BF16), torch.randn(100, 32, device=dev)
    t = torch.randint(0, 100, (64,), device=dev)
    with torch.autocast("cuda", dtype=BF16):
        sm, lsm, lse = oss.softmax(x), oss.log_softmax(x), oss.logsumexp(x)
        want_dtypes = torch.softmax(x, -1).dtype, torch.log_softmax(x, -1).dtype, torch.logsumexp(x, -1).dtype
        o = oss.attention(q, k, v, causal=True)
        loss = oss.linear_cross_entropy(h, w, t)
    assert (sm.dtype, lsm.dtype, lse.dtype) == want_dtypes == (torch.float32,) * 3
    _same(sm, oss.softmax(x, dtype=torch.float32), atol=0)
    _same(lsm, oss.log_softmax(x, dtype=torch.float32), atol=0)
    _same(lse, oss.logsumexp(x.float()), atol=0)
    assert o.dtype == BF16
    _same(o, oss.attention(q.to(BF16), k, v, causal=True), atol=0)
    assert loss.dtype == torch.float32
    _same(loss, oss.linear_cross_entropy(h, w.to(BF16), t), atol=0)


def test_autocast_with_meta_tensors():
    """Shape propagation on meta tensors inside a CPU autocast region: torch's ops run as without autocast there
    (meta is no autocast device type), and so do ours (torch.is_autocast_enabled("meta") raised before)."""
    q, x = torch.empty(1, 2, 8, 16, device="meta"), torch.empty(3, 40, device="meta")
    with torch.autocast("cpu", dtype=BF16):
        o, y = oss.attention(q, q, q, causal=True), oss.softmax(x)
        loss = oss.linear_cross_entropy(torch.empty(6, 16, device="meta"), torch.empty(32, 16, device="meta"),
                                        torch.empty(6, dtype=torch.long, device="meta"))
    assert o.shape == q.shape and o.dtype == q.dtype and y.shape == x.shape and loss.shape == ()


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp", "softmax_topk", "sample"])
def test_meta_tensors_with_backend_triton(name):
    """backend="triton" on meta tensors (shape propagation) gives the shapes and dtypes of the call on real
    tensors (resolve_backend: the torch path's ops; under the interpreter the kernels failed to read the meta
    tensor's data)."""
    x = torch.randn(4, 100)
    run = {"softmax": lambda t: oss.softmax(t, backend="triton"),
           "log_softmax": lambda t: oss.log_softmax(t, dim=0, backend="triton"),
           "logsumexp": lambda t: oss.logsumexp(t, backend="triton"),
           "softmax_topk": lambda t: tuple(oss.softmax_topk(t, 5, backend="triton")),
           "sample": lambda t: oss.sample(t, top_k=5, backend="triton")}[name]
    got, want = run(x.to("meta")), run(x)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.is_meta and g.shape == w.shape and g.dtype == w.dtype
