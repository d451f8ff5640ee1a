"""Runs in each spawned rank of the gloo tests: the vocabulary-parallel ops on this rank's slice of inputs every rank
builds alike, against the single-process ops on the full rows. Raises on the first mismatch; every rank makes the
same calls (an error raised before a collective is raised on all of them). ``run_ranks`` (the tests' side) spawns
the ranks."""

import datetime
import socket
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import onlinesoftmax as oss
from onlinesoftmax import distributed as D

NAN, INF = float("nan"), float("inf")


def widths(V: int, P: int) -> list[int]:
    """Uneven slices, one of them possibly empty when V is small."""
    base = [max(0, V // P + (r - P // 2) * (V // (3 * P))) for r in range(P)]
    base[-1] = V - sum(base[:-1])
    assert min(base) >= 0 and sum(base) == V
    return base


def _slice(x, rank, ws):
    lo = sum(ws[:rank])
    return x[..., lo:lo + ws[rank]]


def check_vocab(rank: int, P: int, device: str):
    gen = torch.Generator().manual_seed(1234)
    V = 97
    x = torch.randn(3, 5, V, generator=gen) * 3
    x[0, 0] = -INF                              # all masked
    x[0, 1, 7] = NAN
    x[0, 2, 50] = INF
    x[0, 3, ::3] = 2.5                          # ties across slices
    x[1, 0] = 1e8                               # large logits: e^(x - m) / d, not e^(x - lse)
    x[1, 1, 30:] = -INF
    ws = widths(V, P)
    xs = _slice(x, rank, ws).to(device)
    for fn, ref in ((D.softmax, torch.softmax), (D.log_softmax, torch.log_softmax)):
        got = fn(xs).cpu()
        torch.testing.assert_close(got, _slice(ref(x, -1), rank, ws), equal_nan=True, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(D.logsumexp(xs).cpu(), torch.logsumexp(x, -1), equal_nan=True)
    assert D.logsumexp(xs, keepdim=True).shape == (3, 5, 1)
    for k in (1, 4, 40):                        # 40 exceeds the smallest slices
        top = D.softmax_topk(xs, k)
        want = oss.softmax_topk(x, k, backend="torch")
        torch.testing.assert_close(top.indices.cpu(), want.indices)
        p = torch.softmax(x.double(), -1).gather(-1, want.indices).float()     # fp64 probabilities at the indices
        torch.testing.assert_close(top.values.cpu(), p, equal_nan=True, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(top.lse.cpu(), want.lse, equal_nan=True)
    # gradients, finite rows only
    xg = torch.randn(4, V, generator=gen, dtype=torch.float64)
    w = torch.randn(4, V, generator=gen, dtype=torch.float64)
    for fn, ref in ((D.softmax, torch.softmax), (D.log_softmax, torch.log_softmax)):
        a = _slice(xg, rank, ws).to(device).requires_grad_()
        (fn(a) * _slice(w, rank, ws).to(device)).sum().backward()
        b = xg.clone().requires_grad_()
        (ref(b, -1) * w).sum().backward()
        torch.testing.assert_close(a.grad.cpu(), _slice(b.grad, rank, ws))
    a = _slice(xg, rank, ws).to(device).requires_grad_()
    (D.logsumexp(a) * w[:, 0].to(device)).sum().backward()
    b = xg.clone().requires_grad_()
    (torch.logsumexp(b, -1) * w[:, 0]).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), _slice(b.grad, rank, ws))
    # cross-entropy: loss and gradient, ignore_index, smoothing, every reduction, all ignored
    logits = torch.randn(6, V, generator=gen, dtype=torch.float64)
    target = torch.randint(0, V, (6,), generator=gen)
    target[2] = -100
    for red in ("mean", "sum", "none"):
        for eps in (0.0, 0.1):
            a = _slice(logits, rank, ws).to(device).requires_grad_()
            loss = D.cross_entropy(a, target.to(device), reduction=red, label_smoothing=eps)
            b = logits.clone().requires_grad_()
            want = torch.nn.functional.cross_entropy(b, target, reduction=red, label_smoothing=eps)
            torch.testing.assert_close(loss.cpu(), want)
            (loss * (torch.arange(6, device=device) + 1 if red == "none" else 1)).sum().backward()
            (want * (torch.arange(6) + 1 if red == "none" else 1)).sum().backward()
            torch.testing.assert_close(a.grad.cpu(), _slice(b.grad, rank, ws))
    none = torch.full((6,), -100)
    a = _slice(logits, rank, ws).to(device).requires_grad_()
    loss = D.cross_entropy(a, none.to(device))
    assert torch.isnan(loss)
    D.cross_entropy(a, none.to(device), reduction="sum").backward()
    assert (a.grad == 0).all()


def check_topk_grad(rank: int, P: int, device: str):
    """softmax_topk's values and lse are differentiable in x_shard, as onlinesoftmax.softmax_topk's (they came back
    detached: no gradient, silently); k past the narrowest slice and an empty slice, through values, lse or both."""
    gen = torch.Generator().manual_seed(21)
    for V in (13, P - 1):                       # P - 1: an empty slice
        ws = widths(V, P)
        x = torch.randn(2, 3, V, generator=gen, dtype=torch.float64)
        k = min(5, V)
        dv, dl = torch.randn(2, 3, k, generator=gen, dtype=torch.float64), torch.randn(2, 3, generator=gen,
                                                                                        dtype=torch.float64)
        for use in ("values", "lse", "both"):
            a = _slice(x, rank, ws).to(device).requires_grad_()
            b = x.clone().requires_grad_()
            for t, xx in ((D.softmax_topk(a, k), a), (oss.softmax_topk(b, k, backend="torch"), b)):
                loss = (t.values.double() * dv.to(xx.device)).sum() if use != "lse" else 0
                loss = loss + ((t.lse.double() * dl.to(xx.device)).sum() if use != "values" else 0)
                loss.backward()
            torch.testing.assert_close(a.grad.cpu(), _slice(b.grad, rank, ws), rtol=1e-5, atol=1e-6)


def check_vocab_edges(rank: int, P: int, device: str):
    """An empty slice on the last rank; −inf off the target at ε = 0 (a finite loss), +inf in a row (a NaN loss and a
    NaN gradient row; an ignored row's gradient 0), fp64 top-k past fp32's resolution, an out-of-range target."""
    V = 12
    ws = [V // (P - 1)] * (P - 1) + [0]
    ws[0] += V - sum(ws)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, V, generator=gen, dtype=torch.float64)
    xs = _slice(x, rank, ws).to(device)
    assert xs.shape[-1] == ws[rank]
    torch.testing.assert_close(D.softmax(xs).cpu(), _slice(torch.softmax(x, -1), rank, ws))
    torch.testing.assert_close(D.log_softmax(xs).cpu(), _slice(torch.log_softmax(x, -1), rank, ws))
    torch.testing.assert_close(D.logsumexp(xs).cpu(), torch.logsumexp(x, -1))
    top = D.softmax_topk(xs, 3)
    torch.testing.assert_close(top.indices.cpu(), oss.softmax_topk(x, 3, backend="torch").indices)
    # fp64 logits whose differences fp32 cannot hold: ranked and normalised in fp64
    big = torch.tensor([[1e8, 1e8 + 1, 0.0, 1e8 - 0.5] * 3], dtype=torch.float64)
    tb = D.softmax_topk(_slice(big, rank, ws).to(device), 2)
    assert tb.indices.cpu().tolist() == [[1, 5]], tb.indices
    torch.testing.assert_close(tb.values.cpu(), torch.softmax(big, -1)[:, [1, 5]].float())
    # cross-entropy with special values
    logits = torch.randn(5, V, generator=gen, dtype=torch.float64)
    target = torch.tensor([1, 2, 3, 4, -100])
    logits[0, 5] = -INF                         # off the target, ε = 0: a finite loss
    logits[1, 6] = INF                          # off the target: NaN
    logits[2, 3] = INF                          # on the target: NaN
    logits[4, 0] = INF                          # an ignored row: loss 0, gradient 0
    for eps in (0.0, 0.1):
        a = _slice(logits, rank, ws).to(device).requires_grad_()
        loss = D.cross_entropy(a, target.to(device), reduction="none", label_smoothing=eps)
        b = logits.clone().requires_grad_()
        want = torch.nn.functional.cross_entropy(b, target, reduction="none", label_smoothing=eps)
        torch.testing.assert_close(loss.cpu(), want, equal_nan=True)
        loss[[0, 3]].sum().backward()
        want[[0, 3]].sum().backward()
        torch.testing.assert_close(a.grad.cpu()[[0, 3]], _slice(b.grad, rank, ws)[[0, 3]])
        a.grad = None
        D.cross_entropy(a, target.to(device), reduction="none", label_smoothing=eps).sum().backward()
        assert a.grad[1:3].isnan().all() and (a.grad[4] == 0).all()
    if device == "cpu":
        try:
            D.cross_entropy(xs, torch.tensor([0, 1, V, 2]))
            raise AssertionError("an out-of-range target was accepted")
        except IndexError as e:
            assert "distributed.cross_entropy" in str(e) and str(V) in str(e)


def check_ce_ignore_index(rank: int, P: int, device: str):
    """ignore_index not an int: a TypeError naming distributed.cross_entropy and the argument (None ended in torch's
    TypeError from torch.where, 1.5 or a 1-d tensor ignored nothing), as onlinesoftmax.cross_entropy; past int64 a
    ValueError."""
    x = torch.randn(3, 4).to(device)
    t = torch.tensor([0, 1, 2], device=device)
    for bad, err in ((None, TypeError), (1.5, TypeError), (torch.tensor([1]), TypeError), (True, TypeError),
                     (2**63, ValueError)):
        try:
            D.cross_entropy(x, t, ignore_index=bad)
            raise AssertionError(f"ignore_index={bad!r} was accepted")
        except err as e:
            assert str(e).startswith("distributed.cross_entropy: ignore_index"), e


def check_double_backward(rank: int, P: int, device: str):
    """create_graph=True through every distributed op's backward: a RuntimeError naming the op (the backwards ran,
    and a second backward gave wrong second-order gradients with no error: the all_reduce in softmax's backward
    has no autograd, the gathered row state (m, d) entered as a constant); a plain backward still runs."""
    x = torch.randn(3, 4, dtype=torch.float64, device=device)
    t = torch.tensor([0, 5, 2], device=device)          # (global targets: 5 is past a 4-wide slice)
    q = torch.randn(1, 2, 2, 8, dtype=torch.float64, device=device)
    ops = {"distributed.softmax": lambda a: D.softmax(a),
           "distributed.log_softmax": lambda a: D.log_softmax(a),
           "distributed.logsumexp": lambda a: D.logsumexp(a),
           "distributed.softmax_topk": lambda a: D.softmax_topk(a, 2).values,
           "distributed.cross_entropy": lambda a: D.cross_entropy(a, t),
           "distributed.attention": lambda a: D.attention(a, a[:, :1], a[:, :1], backend="torch")}
    for name, f in ops.items():
        a = (q if name == "distributed.attention" else x).clone().requires_grad_()
        y = f(a)
        (g,) = torch.autograd.grad((y * y).sum(), a, create_graph=False, retain_graph=True)
        assert g.isfinite().all() and not g.requires_grad
        try:
            torch.autograd.grad((y * y).sum(), a, create_graph=True)
            raise AssertionError(f"{name}: create_graph=True was accepted")
        except RuntimeError as e:
            assert str(e).startswith(f"{name}: double backward (create_graph=True) is not supported"), e


def _positions(layout: str, rank: int, P: int, S: int) -> torch.Tensor:
    if layout == "contiguous":
        return torch.arange(rank * S // P, (rank + 1) * S // P)
    c = S // (2 * P)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * P - 1 - rank) * c, (2 * P - rank) * c)])


def check_ring(rank: int, P: int, device: str):
    gen = torch.Generator().manual_seed(99)
    B, H, Hkv, Dh = 2, 4, 2, 8
    S = 2 * P * 3
    q = torch.randn(B, H, S, Dh, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, Dh, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, Dh, generator=gen, dtype=torch.float64)
    do = torch.randn(B, H, S, Dh, generator=gen, dtype=torch.float64)
    backend = "torch" if device == "cpu" else None
    for layout in ("contiguous", "zigzag"):
        pos = _positions(layout, rank, P, S)
        for causal in (False, True):
            qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
            o_ref, lse_ref = oss.attention(qa, ka, va, causal=causal, return_lse=True, backend="torch")
            (o_ref * do).sum().backward()
            dt = torch.float64 if device == "cpu" else torch.bfloat16
            # the ring accumulates o and merges states in fp32 (lse is float32), as the kernels do
            tol = dict(rtol=2e-5, atol=2e-6) if device == "cpu" else dict(rtol=3e-2, atol=3e-2)
            ql, kl, vl = (t[:, :, pos].to(device, dt).requires_grad_() for t in (q, k, v))
            o, lse = D.attention(ql, kl, vl, causal=causal, layout=layout, return_lse=True, backend=backend)
            torch.testing.assert_close(o.double().cpu(), o_ref.detach()[:, :, pos], **tol)
            torch.testing.assert_close(lse.double().cpu(), lse_ref.detach()[:, :, pos].double(), **tol)
            (o * do[:, :, pos].to(device, dt)).sum().backward()
            for mine, ref in ((ql, qa), (kl, ka), (vl, va)):
                torch.testing.assert_close(mine.grad.double().cpu(), ref.grad[:, :, pos], **tol)


def check_ring_triton(rank: int, P: int, device: str):
    gen = torch.Generator().manual_seed(5)
    B, H, Dh, S = 1, 2, 16, 4 * P
    q, k, v, do = (torch.randn(B, H, S, Dh, generator=gen) for _ in range(4))
    pos = _positions("zigzag", rank, P, S)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    o_ref = oss.attention(qa, ka, va, causal=True, backend="torch")
    (o_ref * do).sum().backward()
    ql, kl, vl = (t[:, :, pos].to(device).requires_grad_() for t in (q, k, v))
    o = D.attention(ql, kl, vl, causal=True, layout="zigzag", backend="triton")
    (o * do[:, :, pos].to(device)).sum().backward()
    tol = dict(rtol=1e-4, atol=1e-5) if device == "cpu" else dict(rtol=3e-3, atol=3e-3)
    torch.testing.assert_close(o.detach().cpu(), o_ref.detach()[:, :, pos], **tol)
    for mine, ref in ((ql, qa), (kl, ka), (vl, va)):
        torch.testing.assert_close(mine.grad.cpu(), ref.grad[:, :, pos], **tol)


def check_ring_bad_args(rank: int, P: int, device: str):
    """Arguments the per-block ``onlinesoftmax.attention`` would reject are errors naming distributed.attention before
    the ring starts (raised from the first block, they left its send and receive in flight: the next call took that
    stale block or waited for ever), and the next call is right."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 2, 4, 8, generator=gen) for _ in range(3))
    for kw, err in ((dict(q=q[:1]), ValueError), (dict(k=k.double(), v=v.double()), TypeError),
                    (dict(q=q[..., :0], k=k[..., :0], v=v[..., :0]), ValueError)):
        args = dict(q=q, k=k, v=v) | kw
        try:
            D.attention(args["q"], args["k"], args["v"], causal=True)
            raise AssertionError(f"distributed.attention accepted {list(kw)}")
        except err as e:
            assert str(e).startswith("distributed.attention: "), e
    S = 4 * P
    qf, kf, vf = (torch.randn(2, 2, S, 8, generator=gen) for _ in range(3))
    pos = _positions("contiguous", rank, P, S)
    o = D.attention(qf[:, :, pos], kf[:, :, pos], vf[:, :, pos], causal=True, backend="torch")
    want = oss.attention(qf, kf, vf, causal=True, backend="torch")[:, :, pos]
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-6)


def check_arguments(rank: int, P: int, device: str):
    """The distributed ops' arguments as torch takes them (NumPy numbers, 0-d tensors) and bool flags that must be
    bools, against the single-process ops (test_distributed_api_fuzz)."""
    gen = torch.Generator().manual_seed(7)
    x, t = torch.randn(3, 4 * P, generator=gen), torch.tensor([0, 3, 2 * P])
    shard = x[:, 4 * rank:4 * rank + 4]
    top = D.softmax_topk(shard, np.int64(3))
    want = oss.softmax_topk(x, 3, backend="torch")
    torch.testing.assert_close(top.values, want.values)
    assert torch.equal(top.indices, want.indices)
    loss = D.cross_entropy(shard, t, ignore_index=np.int64(3), label_smoothing=np.float32(0.25))
    want = oss.cross_entropy(x, t, ignore_index=3, label_smoothing=0.25, backend="torch")
    torch.testing.assert_close(loss, want)
    with pytest.raises(TypeError, match="^distributed.cross_entropy: ignore_index must be an int, got float"):
        D.cross_entropy(shard, t, ignore_index=3.0)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="^distributed.logsumexp: keepdim must be a bool"):
            D.logsumexp(shard, keepdim=bad)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen) for _ in range(3))
    with pytest.raises(TypeError, match="^distributed.attention: return_lse must be a bool"):
        D.attention(q, k, v, return_lse=None)
    o = D.attention(q, k, v, scale=np.float32(0.5), backend="torch")
    o_ref = D.attention(q, k, v, scale=0.5, backend="torch")
    torch.testing.assert_close(o, o_ref)


def main(rank: int, P: int, port: int, device: str, checks: tuple):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for name in checks:
            globals()[name](rank, P, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()


TIME_LIMIT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(P: int, checks: tuple, device: str = "cpu"):
    """P spawned ranks (127.0.0.1, a free port) run ``checks`` (names of this module's functions) in a gloo group;
    a TimeoutError past TIME_LIMIT_S; the processes are always reaped."""
    ctx = mp.start_processes(main, args=(P, _free_port(), device, checks), nprocs=P, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIME_LIMIT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{P} ranks did not finish {checks} in {TIME_LIMIT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
