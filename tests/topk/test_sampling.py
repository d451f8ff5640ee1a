"""sample(): χ² against the exact distribution on CPU, reproducibility, per-row parameters, greedy, no sync.
"""

import math

import numpy as np
import pytest
import torch

import onlinesoftmax
from onlinesoftmax.topk import sample

LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.9, 0.3, -0.1, 0.05, -1.0, float("-inf"), -2.5, 0.6, 1.45])


def exact(logits, t=1.0, top_k=None, top_p=None):
    """fp64: temperature, then top-k (ties to the lower index), renormalise, then the top-p prefix."""
    z = logits.double().numpy() / t
    order = np.argsort(-z, kind="stable")
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    keep = np.ones_like(p, dtype=bool)
    if top_k is not None:
        keep[top_k:] = False
    w = np.where(keep, p, 0.0)
    if top_p is not None:
        before = np.cumsum(w) - w
        keep &= before < top_p * w.sum()
        keep[0] = True
    w = np.where(keep, p, 0.0)
    out = np.zeros_like(w)
    out[order] = w / w.sum()
    return out


def chi2_critical(df: int, z: float = 4.265) -> float:
    """Wilson–Hilferty upper quantile of χ²(df) at the normal quantile z (4.265 ≈ p = 1e-5)."""
    a = 2.0 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def assert_distribution(ids: torch.Tensor, probs: np.ndarray):
    n = ids.numel()
    counts = np.bincount(ids.numpy(), minlength=probs.size).astype(np.float64)
    assert counts[probs == 0].sum() == 0, f"sampled a token of probability 0: {counts}"
    live = probs > 0
    e = n * probs[live]
    stat = float(((counts[live] - e) ** 2 / e).sum())
    df = int(live.sum()) - 1
    if df > 0:
        assert stat < chi2_critical(df), f"chi2={stat:.1f} df={df} counts={counts} expected={n * probs}"


@pytest.mark.parametrize("t,top_k,top_p", [(1.0, None, None), (0.7, 5, None), (1.0, None, 0.8),
                                           (1.3, 8, 0.9), (2.0, 3, 0.5), (1.0, 1, None)])
def test_chi2_against_exact(t, top_k, top_p):
    n = 20000
    g = torch.Generator().manual_seed(1234)
    x = LOGITS.expand(n, -1).contiguous()
    ids, logp = sample(x, temperature=t, top_k=top_k, top_p=top_p, generator=g)
    probs = exact(LOGITS, t, top_k, top_p)
    assert ids.shape == (n,) and ids.dtype == torch.int64 and logp.dtype == torch.float32
    assert_distribution(ids, probs)
    want = torch.from_numpy(np.log(probs[ids.numpy()]))
    torch.testing.assert_close(logp.double(), want, rtol=1e-5, atol=1e-5)


def test_per_row_tensor_parameters():
    n = 12000
    x = LOGITS.expand(3 * n, -1).contiguous()
    t = torch.tensor([1.0, 0.5, 1.5]).repeat_interleave(n)
    k = torch.tensor([0, 4, 6]).repeat_interleave(n)           # 0 disables top-k on a row
    p = torch.tensor([0.7, 1.0, 0.95]).repeat_interleave(n)
    ids, _ = sample(x, temperature=t, top_k=k, top_p=p, generator=torch.Generator().manual_seed(7))
    for r, (tt, kk, pp) in enumerate([(1.0, None, 0.7), (0.5, 4, None), (1.5, 6, 0.95)]):
        assert_distribution(ids[r * n:(r + 1) * n], exact(LOGITS, tt, kk, pp))


def test_reproducible_greedy_and_shapes():
    x = torch.randn(4, 3, 100)
    a = sample(x, top_k=20, generator=torch.Generator().manual_seed(3))
    b = sample(x, top_k=20, generator=torch.Generator().manual_seed(3))
    c = sample(x, top_k=20, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].shape == (4, 3)
    assert not torch.equal(a[0], c[0])
    ids, logp = sample(x, temperature=0.0)
    assert torch.equal(ids, x.argmax(-1)) and torch.equal(logp, torch.zeros_like(logp))
    t = torch.tensor([0.0, 1.0, 0.0, 1.0]).repeat_interleave(3)
    g = torch.Generator().manual_seed(1)
    ids, logp = sample(x.reshape(12, 100), temperature=t, top_p=0.9, generator=g)
    assert torch.equal(ids[t == 0], x.reshape(12, 100).argmax(-1)[t == 0])
    assert onlinesoftmax.sample is sample


def test_sample_errors():
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="top_p"):
        sample(x, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        sample(x, top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        sample(x, temperature=-1.0)
    with pytest.raises(ValueError, match="one per row"):
        sample(x, temperature=torch.ones(3))


def _raises(exc, match, **kw):
    x = kw.pop("x", torch.randn(2, 10))
    with pytest.raises(exc, match=match) as e:
        sample(x, **kw)
    assert str(e.value).startswith("sample: "), str(e.value)      # the error names the function


def test_sample_argument_validation():
    """Python values always, tensors' dtypes and sizes always, tensors' values where they are on the CPU (free to
    read); each error names ``sample``. (NaN temperature returned id 0 with logprob NaN, per-row tensors out of
    range and a float top_k tensor were taken silently, an int tensor of logits raised without naming sample.)"""
    _raises(ValueError, "temperature", temperature=float("nan"))
    _raises(ValueError, "temperature", temperature=float("inf"))
    _raises(ValueError, "temperature", temperature=-0.5)
    _raises(TypeError, "temperature", temperature="1")
    _raises(TypeError, "temperature", temperature=True)
    _raises(ValueError, "temperature", temperature=torch.tensor([-1.0, 1.0]))
    _raises(ValueError, "temperature", temperature=torch.tensor([float("nan"), 1.0]))
    _raises(TypeError, "temperature", temperature=torch.tensor([True, False]))
    _raises(ValueError, "top_p", top_p=0.0)
    _raises(ValueError, "top_p", top_p=1.5)
    _raises(ValueError, "top_p", top_p=float("nan"))
    _raises(TypeError, "top_p", top_p="0.5")
    _raises(ValueError, "top_p", top_p=torch.tensor([0.0, 1.0]))
    _raises(ValueError, "top_p", top_p=torch.tensor([0.5, 1.5]))
    _raises(ValueError, "top_k", top_k=0)
    _raises(TypeError, "top_k", top_k=5.0)
    _raises(TypeError, "top_k", top_k=True)
    _raises(TypeError, "top_k", top_k=torch.tensor([2.0, 3.0]))
    _raises(TypeError, "top_k", top_k=torch.tensor([True, False]))
    _raises(ValueError, "one per row", top_k=torch.tensor([1, 2, 3]))
    _raises(ValueError, "one per row", temperature=torch.ones(3))
    _raises(TypeError, "logits", x=torch.ones(2, 3, dtype=torch.int32))
    _raises(TypeError, "logits", x=[[1.0, 2.0]])
    _raises(ValueError, "non-empty", x=torch.empty(2, 0))
    _raises(TypeError, "generator", generator=3)
    # valid values pass: per-row ints and floats, the bounds themselves, a one-element tensor for every row
    ids, logp = sample(torch.randn(2, 10), temperature=torch.tensor([0, 2]), top_p=torch.tensor([1.0, 0.5]),
                       top_k=torch.tensor([0, 3]))
    assert ids.shape == (2,) and torch.isfinite(logp).all()
    assert sample(torch.randn(3, 10), temperature=torch.tensor(0.5), top_k=20)[0].shape == (3,)


@pytest.mark.parametrize("kw", [{}, {"top_k": 3}, {"top_p": 0.9}, {"top_k": 4, "top_p": 0.8},
                                {"top_k": torch.tensor([2, 0, 5, 1, 3])}, {"temperature": 0.0},
                                {"temperature": torch.tensor([0.0, 1.0, 0.0, 2.0, 0.5]), "top_k": 3},
                                {"temperature": 0.5, "top_p": 0.5}])
def test_rows_without_a_distribution(kw):
    """A row with a NaN logit, a +inf logit or no logit above -inf (torch.softmax is NaN there) gets id -1 and
    logprob NaN on every path, greedy rows included; the other rows are sampled as usual. (An all -inf row gave
    an id and logprob NaN: an id that looks valid.)"""
    x = torch.randn(5, 12)
    x[0] = float("-inf")
    x[2, 3] = float("nan")
    x[4, 7] = float("inf")
    x[1, ::2] = float("-inf")                                     # masked, but a distribution
    ids, logp = sample(x, generator=torch.Generator().manual_seed(0), **kw)
    assert ids[[0, 2, 4]].tolist() == [-1, -1, -1] and torch.isnan(logp[[0, 2, 4]]).all()
    assert (ids[[1, 3]] >= 0).all() and torch.isfinite(logp[[1, 3]]).all() and ids[1] % 2 == 1


def test_large_logits_logprob():
    """log p = (z − m) − log d on the whole-row path: z − lse lost log d at a large lse (logp 0 for [1e8, 1e8])."""
    x = torch.tensor([[1e8, 1e8], [1e4, 1e4], [-3e7, -3e7]])
    for kw in ({}, {"top_k": 2}, {"top_p": 1.0}):
        _, logp = sample(x, generator=torch.Generator().manual_seed(0), **kw)
        torch.testing.assert_close(logp, torch.full((3,), -math.log(2)), rtol=1e-6, atol=0)


@pytest.mark.slow
def test_cpu_sample_speed():
    """top_k = 50, top_p = 0.9 at 128 x 32000 on one thread against torch's chain (softmax -> topk -> top-p mask ->
    multinomial): a loose bound, the machine may be shared (0.7x measured; 27.5x before)."""
    import time

    def chain(x):
        p, idx = torch.softmax(x, -1).topk(50, -1)
        keep = (p.cumsum(-1) - p) < 0.9 * p.sum(-1, keepdim=True)
        p = torch.where(keep, p, torch.zeros_like(p))
        return idx.gather(-1, torch.multinomial(p, 1))

    def best(f):
        f()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(128, 32000) * 3
        ours, ref = best(lambda: sample(x, top_k=50, top_p=0.9)), best(lambda: chain(x))
    finally:
        torch.set_num_threads(threads)
    assert ours < 2.0 * ref, (ours, ref)


@pytest.mark.gpu
def test_gpu_no_sync_graph_and_chi2():
    n = 40000
    x = LOGITS.cuda().expand(n, -1).contiguous()
    g = torch.Generator(device="cuda").manual_seed(5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, logp = sample(x, temperature=0.8, top_k=6, top_p=0.9, generator=g)
        sample(x, temperature=torch.full((n,), 0.8, device="cuda"), top_k=torch.full((n,), 6, device="cuda"),
               generator=g)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert_distribution(ids.cpu(), exact(LOGITS, 0.8, 6, 0.9))
    static = torch.randn(64, 128256, device="cuda")
    sample(static, top_k=50)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_ids, _ = sample(static, top_k=50, temperature=0.0)
    static.copy_(torch.randn_like(static))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_ids, static.argmax(-1))


@pytest.mark.gpu
def test_gpu_device_tensor_parameters_out_of_range():
    """Per-row tensors on the device are not read by the host (no sync): a row whose temperature or top_p is out of
    range gets id -1 and logprob NaN, the others are sampled; the same rows on the CPU raise."""
    x = torch.randn(6, 100, device="cuda")
    t = torch.tensor([1.0, -1.0, float("nan"), 0.0, 1.0, 1.0], device="cuda")
    p = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.0, 1.5], device="cuda")
    k = torch.full((6,), 20, device="cuda")
    sample(x, temperature=t, top_p=p, top_k=k)    # refills the graph reserve the earlier tests' captures took (a sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, logp = sample(x, temperature=t, top_p=p, top_k=k)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ids.cpu().tolist()[1:3] == [-1, -1] and ids.cpu().tolist()[4:] == [-1, -1]
    assert torch.isnan(logp[[1, 2, 4, 5]]).all() and torch.isfinite(logp[[0, 3]]).all()
    assert ids[3] == x[3].argmax() and ids[0] >= 0
    with pytest.raises(ValueError, match="temperature"):
        sample(x.cpu(), temperature=t.cpu())


GPU_MIXES = [dict(temperature=0.8, top_k=6, top_p=0.9), dict(top_p=0.8), dict(min_p=0.2), dict(),
             dict(temperature=1.3, top_k=8, top_p=0.9, min_p=0.1), dict(top_k=1)]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", GPU_MIXES, ids=[str(m) for m in GPU_MIXES])
@pytest.mark.parametrize("wide", [False, True])
def test_gpu_chi2_every_mix(kw, wide):
    """χ² against the fp64 distribution on the kernels. ``wide``: the 12 logits inside a 300-wide row of -inf
    masks (V > 64 candidates: top-p / min-p / no filter take the exact row kernel)."""
    from onlinesoftmax.reference import sample_distribution

    n = 60000
    row = LOGITS if not wide else torch.cat([LOGITS, torch.full((288,), float("-inf"))])
    x = row.cuda().expand(n, -1).contiguous()
    ids, logp = sample(x, generator=torch.Generator(device="cuda").manual_seed(11), **kw)
    probs = sample_distribution(row.numpy(), kw.get("temperature", 1.0), kw.get("top_k"), kw.get("top_p"),
                                kw.get("min_p"))
    assert_distribution(ids.cpu(), probs)
    torch.testing.assert_close(logp.cpu().double(), torch.from_numpy(np.log(probs[ids.cpu().numpy()])),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_generator_errors_name_sample():
    """A generator that is not one (fast path and checked path alike), and a CPU generator for CUDA logits (greedy
    calls too: the generator is checked whatever the parameters)."""
    x = torch.randn(4, 1000, device="cuda")
    for kw in ({}, {"top_k": 5}, {"top_k": torch.tensor([1, 2, 3, 4], device="cuda")}, {"temperature": 0.0}):
        with pytest.raises(TypeError, match="^sample: generator"):
            sample(x, generator=3, **kw)
        with pytest.raises(ValueError, match="^sample: generator is a cpu generator"):
            sample(x, generator=torch.Generator().manual_seed(0), **kw)


@pytest.mark.gpu
def test_gpu_reproducible_and_graph_replays_follow_per_row_tensors():
    """Same generator state, same ids; a captured call replays with per-row tensors (and uniforms) changed in
    place between replays, and matches the eager call on the same values; no call synchronises."""
    B, V = 16, 128256
    x = torch.randn(B, V, device="cuda") * 3
    a = sample(x, temperature=0.8, top_k=50, top_p=0.9, generator=torch.Generator(device="cuda").manual_seed(3))
    b = sample(x, temperature=0.8, top_k=50, top_p=0.9, generator=torch.Generator(device="cuda").manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    t = torch.full((B,), 0.8, device="cuda")
    k = torch.full((B,), 40, device="cuda")
    p = torch.full((B,), 0.9, device="cuda")
    q = torch.zeros(B, device="cuda")
    u = torch.rand(B, device="cuda")
    kw = dict(temperature=t, top_k=k, top_p=p, min_p=q, uniform=u)
    sample(x, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            g_ids, g_logp = sample(x, **kw)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for step in range(3):
        t.copy_(torch.rand(B, device="cuda") + 0.3)
        t[0] = 0.0                                                   # greedy row
        k.copy_(torch.randint(-1, 2000, (B,), device="cuda"))       # inside, past the candidates, off
        p.copy_(torch.rand(B, device="cuda") * 0.9 + 0.1)
        q.copy_(torch.rand(B, device="cuda") * 0.1)
        u.copy_(torch.rand(B, device="cuda"))
        graph.replay()
        e_ids, e_logp = sample(x, **kw)
        torch.cuda.synchronize()
        assert torch.equal(g_ids, e_ids), step
        torch.testing.assert_close(g_logp, e_logp, rtol=0, atol=0)
        assert g_ids[0] == x[0].argmax()


@pytest.mark.gpu
def test_gpu_no_compile_stall_after_warmup():
    """After ``warmup``, a first call with a new k (same bucket), a new B, or new parameter kinds takes <= 50 ms
    (k, B and the chunk counts are run-time arguments of the kernels)."""
    import time

    V = 128256
    onlinesoftmax.warmup(V, top_k=(50,), batch_sizes=(1, 256))
    cases = [(5, dict(top_k=37)), (77, dict(top_k=50, top_p=0.8)), (300, dict(top_k=33, temperature=0.5)),
             (3, dict(top_p=0.95)), (9, dict(min_p=0.1, temperature=1.2)), (130, dict(temperature=0.0))]
    for B, kw in cases:
        x = torch.randn(B, V, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sample(x, **kw)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        assert ms <= 50, (B, kw, ms)
    for B, k in ((7, 41), (200, 60)):
        x = torch.randn(B, V, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        onlinesoftmax.softmax_topk(x, k)
        torch.cuda.synchronize()
        assert (time.perf_counter() - t0) * 1e3 <= 50, (B, k)


@pytest.mark.gpu
def test_gpu_default_capture_after_warmup():
    """The default knobs and generator: after ``warmup``, a first capture of ``sample`` compiles nothing (Triton's
    in-process caches of the sampling kernels cleared first, so earlier tests cannot have compiled them; the capture
    takes < 1 s and adds no compiled kernel), draws in the kernels (its replay slots held: ``graph_draw`` "kernel"),
    and its replays draw fresh ids of the kept set with their log-probabilities."""
    import time

    from onlinesoftmax.reference import sample_distribution
    from onlinesoftmax.topk import sampling, sampling_launch
    from onlinesoftmax.topk.sampling_kernels import _sample_kernel, _sample_merge_kernel, _sample_row_kernel

    kernels = (_sample_kernel, _sample_merge_kernel, _sample_row_kernel)

    def compiled():
        return sum(len(c[0]) for fn in kernels for c in fn.device_caches.values())

    for fn in kernels:
        fn.device_caches.clear()
    sampling_launch._calls.clear()
    V, B = 128256, 8
    onlinesoftmax.warmup(V, top_k=(50,), batch_sizes=(B,))
    x = torch.randn(B, V, device="cuda")
    n_compiled, n_slots = compiled(), len(sampling._graph_slots)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.cuda.graph(graph):
        ids, logp = sample(x, temperature=0.8, top_k=50, top_p=0.9)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    assert took < 1.0 and compiled() == n_compiled, (took, compiled(), n_compiled)
    assert len(sampling._graph_slots) == n_slots + 1
    xs = x.double().cpu().numpy()
    probs = [sample_distribution(xs[r], 0.8, 50, 0.9, None) for r in range(B)]
    seen = set()
    for n in range(6):
        ids.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        got, lp = ids.cpu().tolist(), logp.cpu().tolist()
        for r in range(B):
            assert 0 <= got[r] < V and probs[r][got[r]] > 0, (n, r, got[r])
            assert abs(lp[r] - math.log(probs[r][got[r]])) <= 1e-4, (n, r, lp[r])
        seen.add(tuple(got))
    assert len(seen) == 6, seen


@pytest.mark.gpu
def test_gpu_kernel_draw_chi2_reproducible_and_graph_safe():
    """``SampleKnobs(draw="kernel")``: χ² against the exact distribution over many rows, the same ids for the same
    generator seed (other ids for another, and the generator's offset moved on), and a captured call (pinned to
    ``graph_draw="torch"``: a captured ``torch.rand``; the default's captured draw is tested below) draws anew on
    every replay."""
    from onlinesoftmax.reference import sample_distribution
    from onlinesoftmax.topk.plan import SampleKnobs
    from onlinesoftmax.topk.sampling import _warm_capture_draw

    knobs = SampleKnobs(draw="kernel", graph_draw="torch")
    n = 60000
    x = LOGITS.cuda().expand(n, -1).contiguous()
    kw = dict(temperature=0.9, top_k=8, top_p=0.95)
    ids, logp = sample(x, generator=torch.Generator(device="cuda").manual_seed(5), knobs=knobs, **kw)
    probs = sample_distribution(LOGITS.numpy(), 0.9, 8, 0.95, None)
    assert_distribution(ids.cpu(), probs)
    g = torch.Generator(device="cuda").manual_seed(5)
    a = sample(x, generator=g, knobs=knobs, **kw)[0]
    assert g.get_offset() == 4
    assert torch.equal(a, ids) and not torch.equal(sample(x, generator=g, knobs=knobs, **kw)[0], ids)
    y = torch.randn(64, 128256, device="cuda")
    sample(y, top_k=50, knobs=knobs)
    _warm_capture_draw(y, top_k=50, knobs=knobs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_ids, _ = sample(y, top_k=50, knobs=knobs)
    seen = set()
    for _ in range(4):
        graph.replay()
        torch.cuda.synchronize()
        seen.add(tuple(g_ids.tolist()))
    assert len(seen) == 4


@pytest.mark.gpu
def test_gpu_graph_draw_replays():
    """``SampleKnobs(graph_draw="kernel")`` (the default): a captured call draws in the kernel (no ``torch.rand``
    node), with no host synchronisation at capture or replay; replay n equals the eager call with ``uniform=`` the
    Philox u at counter (offset at capture) / 4 + n (distinct uniforms per replay, per-row tensors changed between
    replays); the generator's offset moved on by ``GRAPH_RESERVE``; χ² of the replays' ids against the exact
    distribution."""
    from onlinesoftmax.reference import philox_uniform, sample_distribution
    from onlinesoftmax.topk.plan import SampleKnobs
    from onlinesoftmax.topk.sampling import GRAPH_RESERVE, _warm_capture_draw

    knobs = SampleKnobs(graph_draw="kernel")
    B, V, seed, off = 8, 128256, 1234, 28
    x = torch.randn(B, V, device="cuda")
    t, p, q = (torch.full((B, 1), 0.8, device="cuda"), torch.full((B, 1), 0.9, device="cuda"),
               torch.zeros(B, 1, device="cuda"))
    kw = dict(temperature=t.view(-1), top_k=50, top_p=p.view(-1), min_p=q.view(-1))
    assert _warm_capture_draw(x, knobs=knobs, **kw)         # compiles the captured kernels (PHILOX 2)
    g = torch.Generator(device="cuda").manual_seed(seed)
    g.set_offset(off)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            g_ids, g_logp = sample(x, generator=g, knobs=knobs, **kw)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert g.get_offset() == off + GRAPH_RESERVE
    for n in range(4):
        t.copy_(torch.rand(B, 1, device="cuda") + 0.3)
        p.copy_(torch.rand(B, 1, device="cuda") * 0.9 + 0.1)
        q.copy_(torch.rand(B, 1, device="cuda") * 0.05)
        torch.cuda.set_sync_debug_mode("error")
        try:
            graph.replay()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        u = torch.tensor([philox_uniform(seed, off + 4 * n, r) for r in range(B)], device="cuda")
        e_ids, e_logp = sample(x, uniform=u, knobs=knobs, **kw)
        torch.cuda.synchronize()
        assert torch.equal(g_ids, e_ids) and torch.equal(g_logp, e_logp), n
    n_rows = 30000
    xs = LOGITS.cuda().expand(n_rows, -1).contiguous()
    assert _warm_capture_draw(xs, temperature=0.9, top_k=8, top_p=0.95, knobs=knobs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c_ids, _ = sample(xs, temperature=0.9, top_k=8, top_p=0.95, knobs=knobs)
    ids = []
    for _ in range(5):
        graph.replay()
        ids.append(c_ids.cpu())
    assert len({tuple(i[:32].tolist()) for i in ids}) == 5
    assert_distribution(torch.cat(ids), sample_distribution(LOGITS.double().numpy(), 0.9, 8, 0.95, None))


@pytest.mark.gpu
def test_gpu_fast_path_matches_the_checked_path(monkeypatch):
    """The generate loop's call ([B, V] CUDA logits, Python parameters in range, no knobs) skips ``_arguments``
    and gives what the checked path gives (same ids, log-probabilities and generator offset); every other call
    (greedy, an int temperature, a tensor parameter, 3-D or fp64 logits, a uniform, explicit knobs) takes the
    checked path; out-of-range Python values still raise; top_k past the fused kernels takes the sort path from
    either. (Few kernel variants: each new one compiles for seconds.)"""
    from onlinesoftmax.topk import sampling
    from onlinesoftmax.topk.plan import SampleKnobs

    class Checked(Exception):
        pass

    calls = []
    checked = sampling._arguments
    monkeypatch.setattr(sampling, "_arguments", lambda *a: calls.append(1) or checked(*a))
    x = torch.randn(8, 128256, device="cuda") * 2
    for kw, dtypes in (({"temperature": 0.8, "top_k": 50, "top_p": 0.9}, (torch.float32, torch.bfloat16)),
                       ({"temperature": 0.7, "top_p": 0.9}, (torch.float32,)), ({"top_k": 4096}, (torch.float32,)),
                       ({"top_k": 1, "min_p": 0.0, "top_p": 1.0}, (torch.float32,))):
        g1, g2 = (torch.Generator(device="cuda").manual_seed(7) for _ in range(2))
        for dtype in dtypes:
            n = len(calls)
            a = sample(x.to(dtype), generator=g1, **kw)
            assert len(calls) == n, kw
            b = sample(x.to(dtype), generator=g2, knobs=SampleKnobs(), **kw)
            assert len(calls) == n + 1
            torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
            torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
            assert g1.get_offset() == g2.get_offset()

    def stop(*a):
        raise Checked

    monkeypatch.setattr(sampling, "_arguments", stop)
    for args, kw in ((x, {"temperature": 0.0}), (x, {"temperature": 1}), (x, {"top_p": torch.tensor(0.9)}),
                     (x[None], {}), (x.double(), {}), (x, {"uniform": torch.rand(8, device="cuda")}),
                     (x, {"knobs": SampleKnobs()}), (x, {"backend": "triton"}), (x[:, :0], {}), (x, {"top_k": 0}),
                     (x, {"temperature": float("nan")}), (x, {"top_p": 1.5}), (x, {"min_p": -0.1})):
        with pytest.raises(Checked):
            sample(args, **kw)
    monkeypatch.setattr(sampling, "_arguments", checked)
    for kw in ({"temperature": float("nan")}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5},
               {"min_p": -0.1}, {"top_k": 0}, {"top_k": True}):
        with pytest.raises((ValueError, TypeError), match="sample: "):
            sample(x, **kw)


# ---- torch.compile -----------------------------------------------------------------------------------------------
def _sample_fn(backend):
    def f(x, u, t, k, p, q):
        return sample(x, uniform=u, temperature=t, top_k=k, top_p=p, min_p=q, backend=backend)
    return f


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_compile_fullgraph_matches_eager(backend, kernel_device):
    """One custom op (``onlinesoftmax::sample``) under torch.compile(fullgraph=True), the same ids and
    log-probabilities as eager for the same draws: Python parameters that change between calls (torch.compile
    then makes them dynamic), per-row tensors, leading dims, greedy calls; the draws in the graph by default."""
    torch._dynamo.reset()       # the recompiles below count per code object (f's, shared by both backends)
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    x = torch.randn(6, 300, device=dev)
    u = torch.rand(6, device=dev)
    f = _sample_fn(backend)
    c = torch.compile(f, fullgraph=True, backend="aot_eager")
    per_row = (torch.tensor([0.0, 1.0, 2.0, 0.5, 1.0, 0.7], device=dev), torch.tensor([0, 3, 5, 1, 2, 40], device=dev),
               torch.tensor([1.0, 0.5, 0.9, 0.2, 1.0, 0.95], device=dev), None)
    for args in ((0.8, 5, 0.9, None), (0.0, 5, 0.9, None), (1.3, 7, 0.5, 0.05), (0.5, None, 0.7, None),
                 (1.0, None, None, 0.2), per_row):
        a, b = c(x, u, *args), f(x, u, *args)
        assert torch.equal(a[0], b[0]), args
        torch.testing.assert_close(a[1], b[1], equal_nan=True)
    x3 = x.reshape(2, 3, 300)
    a = torch.compile(lambda x: sample(x, temperature=0.0, backend=backend), fullgraph=True, backend="aot_eager")(x3)
    assert a[0].shape == (2, 3) and torch.equal(a[0], x3.argmax(-1)) and (a[1] == 0).all()
    torch.manual_seed(5)
    ids, logp = torch.compile(lambda x: sample(x, top_k=20, backend=backend), fullgraph=True, backend="aot_eager")(x)
    top = x.topk(20, -1).indices
    assert ids.shape == (6,) and (ids.unsqueeze(-1) == top).any(-1).all() and torch.isfinite(logp).all()


def test_outputs_carry_no_gradient():
    x = torch.randn(3, 20, requires_grad=True)
    for kw in ({}, {"top_k": 5}, {"top_p": 0.5}, {"temperature": torch.full((3,), 0.7, requires_grad=True)}):
        ids, logp = sample(x, **kw)
        assert not logp.requires_grad and not ids.requires_grad


def test_compile_rejects_generator_and_knobs():
    x, g = torch.randn(2, 30), torch.Generator()
    with pytest.raises(Exception, match="generator is not supported under torch.compile"):
        torch.compile(lambda x: sample(x, generator=g), fullgraph=True, backend="aot_eager")(x)
    from onlinesoftmax.topk.plan import SampleKnobs

    with pytest.raises(Exception, match="knobs are not supported under torch.compile"):
        torch.compile(lambda x: sample(x, knobs=SampleKnobs()), fullgraph=True, backend="aot_eager")(x)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sample_opcheck(backend, kernel_device):
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    x, u = torch.randn(4, 100, device=dev), torch.rand(4, device=dev)
    t = torch.full((4, 1), 0.7, device=dev)
    for args in ((None, 0.8, None, 5, None, 0.9, None, -1.0, u), (t, 0.0, None, 0, None, -1.0, None, 0.1, u),
                 (None, 0.0, None, 0, None, -1.0, None, -1.0, None)):
        torch.library.opcheck(torch.ops.onlinesoftmax.sample.default, (x, *args, backend))


@pytest.mark.gpu
def test_gpu_compile_inductor_matches_eager():
    x = torch.randn(8, 128256, device="cuda")
    u = torch.rand(8, device="cuda")
    f = _sample_fn(None)
    c = torch.compile(f, fullgraph=True)
    for args in ((0.8, 50, 0.9, None), (1.0, None, 0.9, None), (0.7, 50, None, 0.1)):
        a, b = c(x, u, *args), f(x, u, *args)
        assert torch.equal(a[0], b[0]), args
        torch.testing.assert_close(a[1], b[1])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tiny_temperatures_take_the_argmax(backend, kernel_device):
    """T -> 0 is greedy in the limit: down to 1e-30 (x·log2(e) / T still finite) the argmax with log-probability
    0, a Python value or a per-row tensor; with top_k, ties of the max share the mass (x / T rounded as torch
    rounds). The rows took -1 (no distribution) from T ≈ 1e-9 on the kernels before."""
    dev = kernel_device if backend == "triton" else torch.device("cpu")
    x = torch.randn(4, 300, device=dev)
    for T in (1e-4, 1e-10, 1e-20, 1e-30):
        for t in (T, torch.full((4,), T, device=dev)):
            ids, logp = sample(x, temperature=t, backend=backend)
            assert torch.equal(ids, x.argmax(-1)) and (logp == 0).all(), T
    flat = torch.ones(2, 300, device=dev)
    ids, logp = sample(flat, temperature=1e-10, top_k=50, backend=backend)
    assert (ids < 50).all() and torch.allclose(logp, torch.full_like(logp, -math.log(50)))


def test_tiny_temperature_ties_past_the_candidates(kernel_device):
    """More than K = 64 ties at the max at a tiny T, with top-p / min-p past them: the row kernel decides the row.
    Its p = 2^(x·c − lse2) lost lse2 to the lse conversion there (ulps of 2^30: the row came back -1 on the
    interpreter); the nucleus is the first ceil(top_p · n) ties (exact masses: 270 of 300 flat entries at 0.9)."""
    u = torch.tensor([0.0, 0.5, 0.999], device=kernel_device)
    ids, logp = sample(torch.ones(3, 300, device=kernel_device), temperature=1e-10, top_p=0.9, uniform=u,
                       backend="triton")
    assert (ids >= 0).all() and (ids < 271).all() and ids[0] == 0
    assert (logp.cpu() >= -math.log(271)).all() and (logp.cpu() <= -math.log(270) + 1e-6).all()
    x = torch.randn(3, 300, device=kernel_device)
    x[:, 7:80] = 5.0                                                # 73 ties at the max
    ids, logp = sample(x, temperature=1e-10, top_p=0.5, uniform=u, backend="triton")
    assert ids.tolist() == [7, 7 + 18, 7 + 36]                      # 37 of the 73 ties kept: 0.5 · 73 = 36.5
    torch.testing.assert_close(logp.cpu(), torch.full((3,), -math.log(37)))
    ids, logp = sample(x, temperature=1e-10, top_k=100, min_p=0.5, uniform=u, backend="triton")
    assert ids.tolist() == [7, 7 + 36, 7 + 72]                      # min-p keeps the ties, no other entry
    torch.testing.assert_close(logp.cpu(), torch.full((3,), -math.log(73)))


def test_uniform_as_a_python_float(kernel_device):
    """``uniform=0.5``: one draw for every row, as a one-value tensor; other types a TypeError naming sample."""
    x = torch.randn(3, 300, device=kernel_device)
    for backend in ("torch", "triton"):
        a = sample(x, top_k=20, uniform=0.5, backend=backend)
        b = sample(x, top_k=20, uniform=torch.tensor(0.5, device=kernel_device), backend=backend)
        assert torch.equal(a[0], b[0])
    with pytest.raises(ValueError, match="sample: uniform must be in"):
        sample(x, uniform=1.5)
    with pytest.raises(TypeError, match="sample: uniform must be a float tensor, a float or None"):
        sample(x, uniform="0.5")


@pytest.mark.interpreter
def test_knobs_type_and_numpy_top_k():
    """``knobs`` of another type: a TypeError naming it on both backends (the torch path ignored it, the kernels'
    an AttributeError); a NumPy integer top_k is taken as the Python int (NumPy floats already were)."""
    x = torch.randn(2, 20)
    u = torch.rand(2)
    for backend in ("torch", "triton"):
        with pytest.raises(TypeError, match="sample: knobs must be a SampleKnobs"):
            sample(x, knobs="fast", backend=backend)
        ids, _ = sample(x, top_k=np.int64(3), uniform=u, backend=backend)
        torch.testing.assert_close(ids, sample(x, top_k=3, uniform=u, backend=backend)[0])
