"""A bound kernel (``_triton.launch.BoundKernel``) replays the variant Triton compiled at its first launch, with the
specialisation of that launch's integers (== 1, divisible by 16, 64-bit): a cached bound kernel that later gets an
integer of another specialisation runs code compiled for the wrong value (a stride taken as 1: a silent wrong
answer; a row stride taken as 16-divisible: misaligned vector loads). Here every family's public calls run with
strides and sizes of several specialisations through one cache, and each bound kernel must see one
specialisation of its integer arguments across its calls. On the CPU the launches go through the interpreter,
which does not specialise; this records what the GPU would replay."""

import collections

import pytest
import torch

import onlinesoftmax as oss
from onlinesoftmax._triton import launch as TL
from onlinesoftmax._triton.host import int_spec

# fp32 attention on CUDA runs on TF32 tensor cores (10-bit mantissa): agreement with the torch path is to ~1e-3 there
ATOL = 1e-4 if not torch.cuda.is_available() else 1e-2


@pytest.fixture
def specs(monkeypatch):
    seen: dict = collections.defaultdict(set)
    call = TL.BoundKernel.__call__

    def spy(self, args, check, device):
        ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
        seen[(id(self), self.fn.__name__)].add(int_spec(*ints))
        return call(self, args, check, device)

    monkeypatch.setattr(TL.BoundKernel, "__call__", spy)
    return seen


def _one_spec_each(seen):
    assert seen, "no bound kernel launched"
    mixed = {name: s for (_, name), s in seen.items() if len(s) > 1}
    assert not mixed, f"bound kernels replayed across integer specialisations: {mixed}"


def _layouts(B, V, dtype=torch.float32):
    """[B, V] tensors, the same values in three layouts: row stride V (== 1 / 16-divisible or not with V),
    transposed (column stride B), and a slice of wider rows (row stride V + 3)."""
    x = torch.randn(B, V, dtype=dtype)
    return [x, x.t().contiguous().t(), torch.cat([x, x[:, :3]], 1)[:, :V]]


def test_softmax_topk_forward_and_backward(specs, kernel_device):
    for B, V in ((4, 300), (3, 64)):
        for x in _layouts(B, V):
            xr = x.to(kernel_device).detach().requires_grad_()
            r = oss.softmax_topk(xr, 5, backend="triton")
            (r.values.sum() + r.lse.sum()).backward()
            xt = x.detach().clone().requires_grad_()
            t = oss.softmax_topk(xt, 5, backend="torch")
            (t.values.sum() + t.lse.sum()).backward()
            torch.testing.assert_close(xr.grad.cpu(), xt.grad)
    _one_spec_each(specs)


def test_softmax_and_losses(specs, kernel_device):
    for B, V in ((4, 48), (3, 50)):
        for x in _layouts(B, V):
            xd = x.to(kernel_device).detach().requires_grad_()
            oss.softmax(xd, -1, backend="triton").sum().backward()
            oss.logsumexp(xd.detach(), -1, backend="triton")
            t = torch.randint(0, V, (B,), device=kernel_device)
            oss.cross_entropy(xd, t, backend="triton").backward()
    _one_spec_each(specs)


def test_sample(specs, kernel_device):
    for B, V in ((4, 300), (2, 64)):
        for x in _layouts(B, V):
            u = torch.rand(B)
            ids, _ = oss.sample(x.to(kernel_device), temperature=0.7, top_k=8, top_p=0.9, uniform=u.to(kernel_device),
                                backend="triton")
            want, _ = oss.sample(x, temperature=0.7, top_k=8, top_p=0.9, uniform=u, backend="torch")
            assert torch.equal(ids.cpu(), want)
    _one_spec_each(specs)


def _heads(B, H, S, D, bshd):
    """[B, H, S, D] q / k / v, as is or seen from a [B, S, H, D] buffer."""
    if bshd:
        return torch.randn(B, S, H, D).transpose(1, 2)
    return torch.randn(B, H, S, D)


def test_attention_forward_and_backward(specs, kernel_device):
    for S in (16, 13):
        for bshd in (False, True):
            q, k, v = (_heads(1, 2, S, 16, bshd).to(kernel_device).requires_grad_() for _ in range(3))
            o = oss.attention(q, k, v, causal=True, backend="triton")
            o.sum().backward()
            qt, kt, vt = (t.detach().clone().cpu().requires_grad_() for t in (q, k, v))
            ot = oss.attention(qt, kt, vt, causal=True, backend="torch")
            ot.sum().backward()
            torch.testing.assert_close(o.detach().cpu(), ot.detach(), atol=ATOL, rtol=ATOL)
            torch.testing.assert_close(q.grad.cpu(), qt.grad, atol=ATOL, rtol=ATOL)
    _one_spec_each(specs)


def test_kvcache_and_merge(specs, kernel_device):
    for s_max in (32, 40):
        for bshd in (False, True):
            k, v = (_heads(2, 1, s_max, 16, bshd).to(kernel_device) for _ in range(2))
            q = torch.randn(2, 2, 1, 16, device=kernel_device)
            lens = torch.tensor([5, s_max - 1], dtype=torch.int32, device=kernel_device)
            o, lse = oss.attention_with_kvcache(q, k, v, lens, return_lse=True, backend="triton")
            ot, lt = oss.attention_with_kvcache(q.cpu(), k.cpu(), v.cpu(), lens.cpu(), return_lse=True,
                                                backend="torch")
            torch.testing.assert_close(o.cpu(), ot, atol=1e-5, rtol=1e-5)
            m, ml = oss.merge_attention_states(o, lse, o.flip(0), lse.flip(0), backend="triton")
            mt, mlt = oss.merge_attention_states(ot, lt, ot.flip(0), lt.flip(0), backend="torch")
            torch.testing.assert_close(m.cpu(), mt, atol=1e-5, rtol=1e-5)
    _one_spec_each(specs)


def test_linear_cross_entropy(specs, kernel_device):
    for N, D, V in ((8, 16, 50), (5, 32, 64)):
        h = torch.randn(N + 2, D)[1:-1].to(kernel_device).requires_grad_()
        w = torch.randn(V, D).to(kernel_device).requires_grad_()
        t = torch.randint(0, V, (N,), device=kernel_device)
        loss = oss.linear_cross_entropy(h, w, t, backend="triton")
        loss.backward()
        ht, wt = h.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
        lt = oss.linear_cross_entropy(ht, wt, t.cpu(), backend="torch")
        lt.backward()
        torch.testing.assert_close(loss.detach().cpu(), lt.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(h.grad.cpu(), ht.grad, atol=1e-5, rtol=1e-5)
    _one_spec_each(specs)


def test_varlen_and_paged(specs, kernel_device):
    for lens, bshd in (((5, 0, 11), False), ((16, 7, 32), True)):
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        T = int(cu[-1])
        q, k, v = (torch.randn(T, 2, 16) for _ in range(3))
        if bshd:                                             # rows of a wider buffer: row stride 48, not 32
            q, k, v = (torch.cat([t, t[:, :1]], 1)[:, :2] for t in (q, k, v))
        o = oss.attention_varlen(q.to(kernel_device), k.to(kernel_device), v.to(kernel_device), cu.to(kernel_device),
                                 cu.to(kernel_device), max(lens), max(lens), causal=True, backend="triton")
        ot = oss.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, backend="torch")
        torch.testing.assert_close(o.cpu(), ot, atol=ATOL, rtol=ATOL)
    for page, n_pages in ((16, 9), (8, 13)):
        kc, vc = (torch.randn(n_pages, 1, page, 16) for _ in range(2))
        table = torch.randperm(n_pages - 1)[:6].reshape(2, 3).int()
        lens = torch.tensor([page + 3, 3 * page - 1], dtype=torch.int32)
        q = torch.randn(2, 2, 1, 16)
        o = oss.attention_with_kvcache(q.to(kernel_device), kc.to(kernel_device), vc.to(kernel_device),
                                       lens.to(kernel_device), block_table=table.to(kernel_device), backend="triton")
        ot = oss.attention_with_kvcache(q, kc, vc, lens, block_table=table, backend="torch")
        torch.testing.assert_close(o.cpu(), ot, atol=1e-5, rtol=1e-5)
    _one_spec_each(specs)


def test_compiled_variant_per_pointer_alignment(monkeypatch):
    """Triton specialises each pointer on 16-byte alignment: a kernel compiled with q misaligned assumes k aligned.
    A later launch with k misaligned (q aligned) must compile its own variant, not replay that one (on the H200 the
    replay faulted: "misaligned address", attention_with_kvcache with q, then k_cache, misaligned)."""
    from types import SimpleNamespace

    compiled, launched = [], []

    class FakeFn:
        params = ()

        def __getitem__(self, grid):
            def compile_and_run(*args, **meta):
                run = SimpleNamespace(launch=lambda *a: launched.append(a), global_scratch_size=0,
                                      profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
                compiled.append(args)
                return SimpleNamespace(run=run, function=None, packed_metadata=None)
            return compile_and_run

    class Ptr:
        def __init__(self, addr):
            self.addr, self.dtype = addr, torch.bfloat16

        def data_ptr(self):
            return self.addr

    monkeypatch.setattr(TL, "current_device", lambda: 0)
    monkeypatch.setattr(TL, "current_stream", lambda index: 0)
    monkeypatch.setattr(TL, "hooks_installed", lambda: False)
    bk = TL.BoundKernel(FakeFn(), (1,), {})
    bk.interpret = False
    cuda = torch.device("cuda", 0)
    for q, k in ((4096 + 2, 8192), (4096, 8192 + 2), (4096 + 2, 8192), (4096, 8192), (4096, 8192 + 2),
                 (4096 + 6, 8192 + 14)):
        bk((q, k), (Ptr(q), Ptr(k)), cuda)
    assert len(compiled) == 4            # q misaligned, k misaligned, both aligned, both misaligned
    assert len(launched) == 2            # the repeats of the first two replay their own variants
    assert TL.compile_key(0, (Ptr(16), Ptr(32))) == (0, True, torch.bfloat16, torch.bfloat16)
