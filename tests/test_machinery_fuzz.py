"""The public ops inside PyTorch's machinery: forward-mode AD (``torch.autograd.forward_ad``) on both backends,
``attention_with_kvcache`` compiled with a gradient, ``sample`` under ``torch.func.vmap``, ``attention_varlen``
exported with dynamic shapes, a small model compiled and trained."""

import pytest
import torch
import torch.autograd.forward_ad as fwad

import onlinesoftmax as oss

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.interpreter)]


def _targets(n, V):
    t = torch.arange(n) % V
    t[0] = -100
    return t


# op name -> (f(*float inputs, backend), the float inputs): every input differentiable
def _cases():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    return {
        "softmax": (lambda x, be: oss.softmax(x, 1, backend=be), [torch.randn(2, 3, 5)]),
        "log_softmax": (lambda x, be: oss.log_softmax(x, backend=be), [torch.randn(2, 3, 5)]),
        "logsumexp": (lambda x, be: oss.logsumexp(x, (0, 2), backend=be), [torch.randn(2, 3, 5)]),
        "softmax_topk": (lambda x, be: oss.softmax_topk(x, 3, backend=be).values, [torch.randn(2, 3, 7)]),
        "attention": (lambda q, k, v, be: oss.attention(q, k, v, causal=True, backend=be),
                      [torch.randn(2, 2, 3, 8), torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8)]),
        "attention_varlen": (lambda q, k, v, be: oss.attention_varlen(q, k, v, cu, cu, 3, 3, backend=be),
                             [torch.randn(5, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)]),
        "attention_with_kvcache": (
            lambda q, k, v, be: oss.attention_with_kvcache(q, k, v, torch.tensor([3, 5], dtype=torch.int32),
                                                           backend=be),
            [torch.randn(2, 2, 1, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)]),
        "merge_attention_states": (lambda oa, la, ob, lb, be: oss.merge_attention_states(oa, la, ob, lb,
                                                                                         backend=be)[0],
                                   [torch.randn(2, 3, 8), torch.randn(2, 3), torch.randn(2, 3, 8),
                                    torch.randn(2, 3)]),
        "cross_entropy": (lambda x, be: oss.cross_entropy(x, _targets(6, 11), reduction="none", backend=be),
                          [torch.randn(6, 11)]),
        "linear_cross_entropy": (lambda h, w, be: oss.linear_cross_entropy(h, w, _targets(6, 13), backend=be),
                                 [torch.randn(6, 8), torch.randn(13, 8)]),
    }


CASES = sorted(_cases())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_forward_ad_dual_tensors(name, requires_grad, backend):
    """Dual tensors (torch.autograd.forward_ad): the output's tangent is J·t, as torch.func.jvp of the torch path.
    On the Triton path the kernels ran on the primals and the tangent was dropped (None: a silent wrong answer);
    with inputs requiring grad every op's eager autograd.Function raised torch's "must implement the jvp" (naming
    no op), linear_cross_entropy's matmuls "mm_out ... does not support forward AD"."""
    f, xs = _cases()[name]
    ts = [torch.randn_like(x) for x in xs]
    _, want = torch.func.jvp(lambda *a: f(*a, "torch"), tuple(xs), tuple(ts))
    with fwad.dual_level():
        duals = [fwad.make_dual(x.clone().requires_grad_(requires_grad), t) for x, t in zip(xs, ts)]
        y = f(*duals, backend)
        got = fwad.unpack_dual(y).tangent
    assert got is not None, f"{name}: the output has no tangent"
    # fp32 inputs: the backends' primal outputs agree to a few fp32 ulps, and so do their tangents
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paged,backend", [(False, "torch"),
                                           pytest.param(True, "triton", marks=pytest.mark.interpreter)])
def test_kvcache_compiled_backward(paged, backend):
    """torch.compile(fullgraph=True, dynamic=True) of a loss through attention_with_kvcache with q, k_cache and
    v_cache requiring grad, at two batch sizes: the gradients of the eager call. It failed at compile time ("no
    autograd formula was registered" for onlinesoftmax::attention_with_kvcache: the compiled call took the custom
    op, which has no backward, and the torch path read cache_seqlens on the host)."""
    torch._dynamo.reset()

    def loss(q, k, v, lens, table):
        return (oss.attention_with_kvcache(q, k, v, lens, block_table=table, backend=backend) ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")   # AOT autograd failed
    for B in (2, 3):
        q = torch.randn(B, 4, 2, 8)
        lens = torch.tensor([5, 2, 7][:B], dtype=torch.int32)
        if paged:           # 4 pages of 2 slots per sequence, shuffled; pages past a sequence's last hold NaN
            k, v = torch.randn(4 * B + 1, 2, 2, 8), torch.randn(4 * B + 1, 2, 2, 8)
            table = torch.randperm(4 * B)[: 4 * B].reshape(B, 4).int()
            for b, n in enumerate(lens.tolist()):
                k[table[b, -(-n // 2):].long()] = float("nan")
        else:
            k, v, table = torch.randn(B, 2, 8, 8), torch.randn(B, 2, 8, 8), None
            for b, n in enumerate(lens.tolist()):       # slots at or past the length hold NaN: never read
                k[b, :, n:] = float("nan")
                v[b, :, n:] = float("nan")
        ins = [t.clone().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(loss(*ins, lens, table), ins)
        got = torch.autograd.grad(compiled(*ins, lens, table), ins)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert not any(torch.isnan(g).any() for g in got[:1])      # dq: no NaN from the unread slots


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_vmap(backend):
    """torch.func.vmap of sample: rows are independent, so the vmapped result is the eager call's on the stacked
    logits (per-row tensors and uniforms batched or not, vmapped on a non-leading dim). It raised "data-dependent
    control flow" (the CPU value checks) on both backends, "Cannot access storage of BatchedTensorImpl" on the
    kernels."""
    x, u = torch.randn(3, 4, 10), torch.rand(3, 4)
    top_k = torch.tensor([2, 0, 5, 10])
    kw = dict(temperature=0.7, top_p=0.9, backend=backend)
    want = oss.sample(x, uniform=u, top_k=top_k.repeat(3), **kw)
    got = torch.func.vmap(lambda x, u: oss.sample(x, uniform=u, top_k=top_k, **kw), in_dims=(1, 1))(
        x.transpose(0, 1).contiguous(), u.t().contiguous())
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    if backend == "triton":     # (each call costs seconds in the interpreter)
        return
    # an unbatched uniform shared by the vmapped logits; greedy rows draw nothing
    got = torch.func.vmap(lambda x: oss.sample(x, uniform=u[0], **kw))(x)
    assert torch.equal(got[0], oss.sample(x, uniform=u[0].expand(3, 4), **kw)[0])
    greedy = torch.func.vmap(lambda x: oss.sample(x, temperature=0.0, backend=backend))(x)
    assert torch.equal(greedy[0], x.argmax(-1))
    ids, _ = torch.func.vmap(lambda x: oss.sample(x, backend=backend), randomness="different")(x)
    assert ids.shape == (3, 4) and bool(((ids >= 0) & (ids < 10)).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_export_max_seqlen_from_shape(backend):
    """torch.export with a dynamic row count, max_seqlen taken from q's shape (a torch.SymInt there): the exported
    program runs at another size as the eager call. attention_varlen refused the SymInt ("max_seqlen_q must be an
    int >= 0, got s0"), though its custom op takes SymInt."""
    class Packed(torch.nn.Module):
        def forward(self, q, k, v):      # one sequence of all the rows
            n = q.shape[0]
            cu = torch.stack([torch.zeros((), dtype=torch.int32), torch.full((), n, dtype=torch.int32)])
            return oss.attention_varlen(q, k, v, cu, cu, n, n, causal=True, backend=backend)

    rows = torch.export.Dim("rows", min=3, max=64)
    qkv = [torch.randn(5, 2, 8) for _ in range(3)]
    ep = torch.export.export(Packed(), tuple(qkv), dynamic_shapes=({0: rows}, {0: rows}, {0: rows}))
    qkv = [torch.randn(7, 2, 8) for _ in range(3)]
    torch.testing.assert_close(ep.module()(*qkv), Packed()(*qkv), rtol=1e-5, atol=1e-5)


class _TinyLM(torch.nn.Module):
    """An attention block and both losses, every op of the forward on ``backend``."""

    def __init__(self, backend, V=11, D=16, H=2):
        super().__init__()
        self.backend, self.H = backend, H
        self.emb, self.qkv, self.out = torch.nn.Embedding(V, D), torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, V)

    def forward(self, ids, tgt):
        B, S = ids.shape
        be = self.backend
        x = self.emb(ids)
        q, k, v = self.qkv(x).view(B, S, 3, self.H, -1).permute(2, 0, 3, 1, 4)
        x = x + oss.attention(q, k, v, causal=True, backend=be).transpose(1, 2).reshape(B, S, -1)
        x = oss.softmax(x, -1, backend=be) + oss.log_softmax(x, -1, backend=be)
        h, t = x.reshape(B * S, -1), tgt.reshape(-1)
        return (oss.cross_entropy(self.out(h), t, backend=be)
                + oss.linear_cross_entropy(h, self.out.weight, t, bias=self.out.bias, backend=be)
                + oss.logsumexp(x, -1, backend=be).mean() + oss.softmax_topk(x, 2, backend=be).values.mean())


@pytest.mark.interpreter
def test_compiled_module_trains(backend="triton"):
    """torch.compile(fullgraph=True) of a small model over the ops (their custom ops and autograd on the kernels),
    batch dims marked dynamic, two SGD steps at two (batch, sequence) sizes: the parameters of the eager model's
    steps."""
    torch._dynamo.reset()
    eager = _TinyLM(backend)
    model = _TinyLM(backend)
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for B, S in ((2, 4), (3, 5)):
        ids, tgt = torch.randint(0, 11, (B, S)), torch.randint(0, 11, (B, S))
        torch._dynamo.mark_dynamic(ids, 0)
        torch._dynamo.mark_dynamic(tgt, 0)
        for f, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            f(ids, tgt).backward()
            opt.step()
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_compiled_logits_requiring_grad(backend):
    """A compiled step that samples from logits requiring grad (and backpropagates through another use of them):
    the draws carry no gradient, as in eager mode. It failed at compile time ("Trying to backward through
    onlinesoftmax.sample ... no autograd formula": the op was given the logits with their graph)."""
    torch._dynamo.reset()
    x = torch.randn(4, 10, requires_grad=True)
    u = torch.rand(4)

    def step(x):
        ids, logp = oss.sample(x, uniform=u, backend=backend)
        return ids, logp, (x ** 2).sum()

    ids, logp, loss = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    assert not logp.requires_grad
    loss.backward()
    assert torch.equal(ids, oss.sample(x.detach(), uniform=u, backend=backend)[0])
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_kvcache_vmap_over_cache_seqlens():
    """torch.func.vmap over cache_seqlens (one cache, several lengths): each slice is the call at that length. The
    torch path read the lengths on the host (``.tolist()`` of a BatchedTensor: "Cannot access data pointer of Tensor
    that doesn't have storage")."""
    q, k, v = torch.randn(2, 2, 1, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
    lens = torch.tensor([[3, 5], [6, 1], [0, 2]], dtype=torch.int32)
    o = torch.func.vmap(lambda n: oss.attention_with_kvcache(q, k, v, n, backend="torch"))(lens)
    for i in range(3):
        torch.testing.assert_close(o[i], oss.attention_with_kvcache(q, k, v, lens[i], backend="torch"))
