"""sample() on both backends against the fp64 reference draw: with the same uniform per row, the same id (the
inverse CDF in index order), and the log-probability of the reference's kept distribution. Covers the kernels'
two steps (the candidates decide the row; the exact row kernel finishes it), per-row parameters, dtypes with ties,
strides and rows without a distribution. On CPU the kernels run in the interpreter (small sizes)."""

import numpy as np
import pytest
import torch

from onlinesoftmax.reference import philox_uniform, sample_distribution, sample_draw
from onlinesoftmax.topk import sample

BACKENDS = ("torch", "triton")


def _rows(v, B, cast=float):
    if v is None:
        return [None] * B
    if isinstance(v, torch.Tensor):
        return [cast(a) for a in v.reshape(-1).expand(B).tolist()]
    return [v] * B


def check_draws(x, u, *, temperature=1.0, top_k=None, top_p=None, min_p=None, backend, gap=1e-5, max_near=0.25,
                knobs=None):
    """ids and logprobs of ``sample`` against the reference, row by row. Rows whose u lies within ``gap`` of a
    boundary of the CDF (fp32 running sums round there) are only checked to draw a kept token with its
    log-probability; at most ``max_near`` of the rows may be such."""
    ids, logp = sample(x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, uniform=u,
                       backend=backend, knobs=knobs)
    B = x.shape[0]
    ts, ks, ps, qs = (_rows(temperature, B), _rows(top_k, B, int), _rows(top_p, B), _rows(min_p, B))
    xs = x.double().cpu().numpy()
    near = 0
    for r in range(B):
        probs = sample_distribution(xs[r], ts[r], ks[r], ps[r], qs[r])
        if probs is None:
            assert ids[r] == -1 and torch.isnan(logp[r]), r
            continue
        want, dist = sample_draw(probs, float(u[r]))
        got = int(ids[r])
        assert 0 <= got < x.shape[1] and probs[got] > 0, (r, got)
        if dist > gap:
            assert got == want, (r, got, want, dist)
        else:
            near += 1
        lp = 0.0 if ts[r] == 0 else np.log(probs[got])
        assert abs(float(logp[r]) - lp) <= 2e-5 + 2e-5 * abs(lp), (r, float(logp[r]), lp)
    assert near <= max_near * B, (near, B)


def _logits(B, V, dtype=torch.float32, scale=2.0, device="cpu"):
    return (torch.randn(B, V) * scale).to(dtype).to(device)


MIXES = [dict(), dict(top_k=5), dict(top_k=1), dict(top_k=5, top_p=0.5), dict(top_p=0.9), dict(top_p=0.05),
         dict(min_p=0.3), dict(min_p=0.01), dict(top_p=0.3, min_p=0.1), dict(top_k=40, top_p=0.95, min_p=0.05),
         dict(temperature=0.0), dict(temperature=0.6, top_k=8), dict(temperature=3.0, top_p=0.7)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw", MIXES, ids=[str(m) for m in MIXES])
@pytest.mark.parametrize("V", [12, 300])
def test_draw_matches_reference(kernel_device, backend, kw, V):
    """V = 12: the 64 candidates hold the row; V = 300: top-p / min-p / no filter past them take the row kernel."""
    B = 6
    x = _logits(B, V, device=kernel_device)
    u = torch.rand(B, device=kernel_device)
    check_draws(x, u, backend=backend, **kw)


FUSED_MIXES = [dict(top_k=5), dict(top_k=1), dict(top_k=5, top_p=0.5), dict(top_k=40, top_p=0.95, min_p=0.05),
               dict(temperature=0.0), dict(temperature=0.6, top_k=8, min_p=0.2)]


@pytest.mark.parametrize("kw", FUSED_MIXES, ids=[str(m) for m in FUSED_MIXES])
def test_fused_merge_draws_as_step_one(kernel_device, kw):
    """``fuse``: step 1 in the last merge's epilogue (an int top_k, greedy) draws the reference's ids, as the
    unfused step 1 does from the same candidates."""
    from onlinesoftmax.topk.plan import SampleKnobs

    B, V = 6, 300
    x = _logits(B, V, device=kernel_device)
    u = torch.rand(B, device=kernel_device)
    fused = SampleKnobs(fuse=True)
    check_draws(x, u, backend="triton", knobs=fused, **kw)
    a = sample(x, uniform=u, backend="triton", knobs=fused, **kw)
    b = sample(x, uniform=u, backend="triton", knobs=SampleKnobs(fuse=False), **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_fused_merge_per_row_parameters_and_ties(kernel_device):
    """The fused merge with per-row tensors where the candidates hold the row (K = V = 12: no row kernel), and on
    bf16 logits full of ties with an int top_k."""
    from onlinesoftmax.topk.plan import SampleKnobs

    d, fused = kernel_device, SampleKnobs(fuse=True)
    x = _logits(4, 12, device=d)
    u = torch.rand(4, device=d)
    t = torch.tensor([1.0, 0.0, 0.5, 2.0], device=d)
    p = torch.tensor([0.9, 1.0, 0.3, 0.7], device=d)
    k = torch.tensor([0, 3, 12, 5], device=d)
    check_draws(x, u, temperature=t, top_k=k, top_p=p, backend="triton", knobs=fused)
    xb = torch.randint(-6, 3, (4, 400)).to(torch.bfloat16).to(d)
    check_draws(xb, u, top_k=50, top_p=0.45, backend="triton", knobs=fused)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_row_parameters_match_reference(kernel_device, backend):
    """Each row its own temperature (0: greedy), top-k (0: off, 1, inside and past the 64 candidates, >= V),
    top-p and min-p, as device tensors."""
    B, V = 8, 300
    d = kernel_device
    x = _logits(B, V, device=d)
    u = torch.rand(B, device=d)
    t = torch.tensor([1.0, 0.0, 0.5, 2.0, 1.0, 1.3, 0.9, 1.0], device=d)
    k = torch.tensor([0, 3, 100, 70, 1, 300, 500, 20], device=d)
    p = torch.tensor([0.9, 1.0, 0.8, 0.99, 0.5, 1.0, 0.6, 0.3], device=d)
    q = torch.tensor([0.0, 0.2, 0.0, 0.05, 0.0, 0.3, 0.0, 0.1], device=d)
    check_draws(x, u, temperature=t, top_k=k, backend=backend)
    check_draws(x, u, top_k=k, top_p=p, backend=backend)
    check_draws(x, u, temperature=t, top_p=p, min_p=q, backend=backend)
    check_draws(x, u, temperature=t, top_k=k, top_p=p, min_p=q, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ties_in_half_precision_logits(kernel_device, backend, dtype):
    """bf16 / fp16 logits hold many equal values: the filters' boundaries fall inside runs of ties, cut by the
    index (top-k and top-p of the row kernel and of the candidates)."""
    B, V = 4, 400
    x = torch.randint(-6, 3, (B, V)).to(dtype).to(kernel_device)        # 9 values, about 44 copies each
    u = torch.rand(B, device=kernel_device)
    for kw in (dict(top_k=50), dict(top_k=torch.tensor([70, 100, 130, 5], device=kernel_device)),
               dict(top_p=0.6), dict(top_k=30, top_p=0.45), dict(min_p=0.3)):   # (no mass boundary at a tie)
        check_draws(x, u, backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_ends_inside_the_top_k_run_of_ties(kernel_device, backend):
    """The nucleus ends inside the run of ties the top-k cuts (top_k = 100 > the 64 candidates: the row kernel):
    top-p keeps fewer of the tied tokens than top-k did. top_p sits halfway between two steps of the sorted CDF."""
    V, n_ties = 300, 10
    g = torch.Generator().manual_seed(3)
    x = torch.full((4, V), -5.0)
    for r in range(4):
        perm = torch.randperm(V, generator=g)
        x[r, perm[:98]] = torch.linspace(3.0, 2.0, 98)
        x[r, perm[98:98 + n_ties]] = 1.0                 # ranks 98..107 tie; top_k = 100 keeps two of them
    srt = np.sort(sample_distribution(x[0].double().numpy(), 1.0, 100, None, None))[::-1]
    cs = np.cumsum(srt)
    u = torch.linspace(0.02, 0.98, 4)
    for last in (97, 98, 99):                           # the nucleus's last rank: before, inside, at the top-k cut
        tp = float((cs[last - 1] + cs[last]) / 2)
        check_draws(x.to(kernel_device), u.to(kernel_device), top_k=torch.full((4,), 100, device=kernel_device),
                    top_p=tp, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_rows_and_special_rows(kernel_device, backend):
    """Rows of a transposed view (no copy on the kernels' path), a NaN row, a row of -inf, a +inf row, a row
    with one finite logit, under temperature and filters."""
    d = kernel_device
    base = _logits(300, 7, device=d)
    x = base.t()                                                          # [7, 300], stride (1, 7)
    x[1, 5] = float("nan")
    x[2] = float("-inf")
    x[3, 9] = float("inf")
    x[4] = float("-inf")
    x[4, 17] = 0.5
    u = torch.rand(7, device=d)
    for kw in (dict(top_p=0.9), dict(top_k=3, temperature=0.7), dict(temperature=0.0), dict(min_p=0.2)):
        check_draws(x, u, backend=backend, **kw)


def test_uniform_argument_checks():
    x = torch.randn(3, 10)
    with pytest.raises(ValueError, match="uniform"):
        sample(x, uniform=torch.tensor([0.5, 1.0, 0.2]))
    with pytest.raises(ValueError, match="uniform"):
        sample(x, uniform=torch.rand(4))
    with pytest.raises(TypeError, match="uniform"):
        sample(x, uniform=torch.tensor([1, 0, 0]).bool())
    with pytest.raises(ValueError, match="min_p"):
        sample(x, min_p=1.5)
    with pytest.raises(ValueError, match="min_p"):
        sample(x, min_p=torch.tensor([0.1, -0.1, 0.2]))
    ids, _ = sample(x, uniform=torch.tensor(0.0))                          # one uniform for every row
    assert ids.shape == (3,)


def test_row_kernel_chunks_per_target():
    """The row kernel's programs per row: as many as stay resident with the batch's other rows (one per SM in
    all), at least 2048 elements each; one under the interpreter."""
    from onlinesoftmax.target import H200, INTERPRETER, L4
    from onlinesoftmax.topk.plan import row_chunks

    assert row_chunks(1, 128256, H200) == (63, 2048, 256)
    assert row_chunks(8, 128256, H200) == (16, 8192, 256)
    assert row_chunks(64, 262144, H200) == (2, 131072, 256)
    assert row_chunks(256, 128256, H200) == (1, 129024, 256)     # chunks are whole 1024-element steps
    assert row_chunks(1, 300, H200) == (1, 1024, 256)
    assert row_chunks(1, 128256, INTERPRETER) == (1, 129024, 1)
    assert row_chunks(1, 128256, L4) == (42, 3072, 64)             # <= 58 SMs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_row_kernel_many_chunks_matches_reference(dtype):
    """Flat rows of a real vocabulary: the nucleus holds ~10^5 tokens, so the row kernel runs with its chunks
    waiting for each other (C > 1); bf16 logits put the boundaries inside runs of ties."""
    from onlinesoftmax.target import target_of
    from onlinesoftmax.topk.plan import row_chunks

    B, V = 16, 128256
    assert row_chunks(B, V, target_of(torch.device("cuda")))[0] > 1
    x = torch.randn(B, V, device="cuda").to(dtype)
    u = torch.rand(B, device="cuda")
    k = torch.tensor([0, 5000, 100, 70000] * 4, device="cuda")
    tol = dict(gap=2e-6, max_near=0.5)      # p ~ 1e-5 per token: boundaries every ~1e-5 of the CDF
    check_draws(x, u, top_p=0.9, backend="triton", **tol)
    check_draws(x, u, temperature=0.7, top_p=0.5, min_p=0.02, backend="triton", **tol)
    check_draws(x, u, top_k=k, top_p=0.95, backend="triton", **tol)
    check_draws(x.t().contiguous().t(), u, top_k=k.flip(0), backend="triton", **tol)
    check_draws(x, u, backend="triton", **tol)


def test_explain_sample_names_the_launches():
    """explain_sample: the candidates K (top_k for an int, 64 otherwise, 1 for greedy), their top-k plan, and
    whether the row kernel launches (not for an int top_k or greedy) with its chunks; per target; the torch path."""
    from onlinesoftmax.target import A100, H200
    from onlinesoftmax.topk import explain_sample
    from onlinesoftmax.topk.plan import SampleKnobs

    x = torch.empty(8, 128256, device="meta")
    p = explain_sample(x, top_k=50, target=H200)
    assert (p.path, p.k, p.row_chunks, p.topk.path) == ("kernels", 50, 0, "filter")
    p = explain_sample(x, target=H200)
    assert (p.k, p.row_chunks, p.chunk, p.table) == (64, 16, 8192, 256)
    assert explain_sample(x, top_k=torch.ones(8, dtype=torch.long), target=A100).row_chunks == 13
    p = explain_sample(x, temperature=0.0, top_k=50, target=H200)
    assert (p.k, p.row_chunks, p.fuse) == (1, 0, True)
    assert not explain_sample(x, top_k=50, target=H200, knobs=SampleKnobs(fuse=False)).fuse
    assert not explain_sample(x, target=H200, knobs=SampleKnobs(fuse=True)).fuse      # the row kernel: no fusing
    assert explain_sample(x, top_k=5000, target=H200).path == "torch"          # past the fused kernels: sort
    assert explain_sample(torch.randn(3, 12), backend="torch").path == "torch"
    assert explain_sample(torch.randn(3, 12), target=H200).row_chunks == 0      # K = V: the candidates hold the row


def test_philox_reference_known_answer():
    """reference.philox_uniform against Random123's known answer (key 0, counter 0: 6627e8d5 ...)."""
    assert philox_uniform(0, 0, 0) == (0x6627e8d5 >> 8) / 2**24


@pytest.mark.parametrize("kw", [dict(top_k=5), dict(top_p=0.9), dict(top_k=5, min_p=0.1)], ids=str)
@pytest.mark.parametrize("fuse", [False, True])
def test_kernel_draw_is_philox_of_the_generator_words(kernel_device, kw, fuse):
    """``draw="kernel"``: u of row r is Philox at (seed, offset / 4, r), the same in step 1, the fused merge and the
    row kernel (top_p alone, V = 300: step 2); the ids and logprobs equal those of ``uniform=`` that u."""
    from onlinesoftmax.topk.plan import SampleKnobs
    from onlinesoftmax.topk.sampling import philox_words
    from onlinesoftmax.topk.sampling_launch import sample_2d

    if fuse and "top_k" not in kw:
        pytest.skip("the fused merge needs an int top_k")
    B, V, seed, offset = 5, 300, 0xF234567890ABCDEF, 4 * (2**32 + 3)      # both words of each past 2^31
    x = _logits(B, V, device=kernel_device)
    knobs = SampleKnobs(draw="kernel", fuse=fuse, mass="fixed")
    k, p, q = kw.get("top_k"), kw.get("top_p"), kw.get("min_p")
    ids, logp = sample_2d(x, 1.0, k, p, q, philox_words(seed, offset), knobs)
    u = torch.tensor([philox_uniform(seed, offset, r) for r in range(B)], device=kernel_device)
    ref = sample_2d(x, 1.0, k, p, q, u, knobs)
    assert torch.equal(ids, ref[0]) and torch.equal(logp, ref[1])
    check_draws(x, u, backend="triton", knobs=knobs, **kw)


class _CudaGenerator:
    """Stands in for a CUDA ``torch.Generator`` (none on a CPU host): ``torch.Generator(device="cuda")`` has the
    device ``cuda``, no index."""

    def __init__(self, seed: int, offset: int, device: str = "cuda"):
        self.seed, self.offset, self.device = seed, offset, torch.device(device)

    def initial_seed(self) -> int:
        return self.seed

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, offset: int) -> None:
        self.offset = offset


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_kernel_draw_takes_any_cuda_generator(device):
    """The kernel draw's words come from a CUDA generator of any index, as torch's kernels take it (they check the
    device type only): the H200 bug compared whole devices, sent ``torch.Generator(device="cuda")`` (device
    ``cuda`` != the logits' ``cuda:0``) to a one-element ``torch.rand`` that the kernels read as every row's u (rows
    past 0 past its end: ids skewed low, χ² z 5e5). A CPU generator gets None (the caller's ``torch.rand`` raises)."""
    from onlinesoftmax.topk.sampling import _philox_state, philox_words

    g = _CudaGenerator(1234, 28, device)
    assert _philox_state(g, torch.device("cuda", 0)) == philox_words(1234, 28) and g.offset == 32
    assert philox_words(1234, 28) == (1234, 0, 7, 0)
    assert _philox_state(torch.Generator().manual_seed(3), torch.device("cuda", 0)) is None


def test_fixed_mass_sums_do_not_depend_on_the_layout():
    """Why ``fuse`` with fp32 masses differs from the unfused step 1 (a one-ulp logprob, or an id at a boundary):
    the same kept p summed in the orders of two layouts (one warp over 64 slots, 2 per thread; 8 warps over 128
    slots, the upper half 0) give different fp32 sums for peaked rows; their int64 fixed-point sums (``mass``
    "fixed") are equal in any order."""
    rng = np.random.default_rng(0)

    def tree(v, per_thread):           # in-thread sums in order, then a butterfly across the 32 lanes, then warps
        v = v.reshape(-1, 32, per_thread) if v.size >= 32 * per_thread else v.reshape(1, -1, per_thread)
        s = v[..., 0].copy()
        for i in range(1, per_thread):
            s = s + v[..., i]
        while s.shape[-1] > 1:
            h = s.shape[-1] // 2
            s = s[..., :h] + s[..., h:]
        out = s[0, 0]
        for w in range(1, s.shape[0]):
            out = out + s[w, 0]
        return out

    differ = 0
    for _ in range(50):
        x = rng.standard_normal(128256).astype(np.float32)
        x[rng.integers(0, x.size, 20)] += rng.uniform(8, 12, 20).astype(np.float32)
        top = np.sort(x)[::-1][:50].astype(np.float64)
        p = (np.exp(top - top[0]) / np.exp(x.astype(np.float64) - top[0]).sum()).astype(np.float32)
        a = tree(np.concatenate([p, np.zeros(14, np.float32)]), 2)
        b = tree(np.concatenate([p, np.zeros(78, np.float32)]).reshape(8, 16).T.reshape(-1), 4)
        differ += a != b
        fa = (p.astype(np.float64) * 2.0**61).astype(np.int64)
        assert fa.sum() == fa[::-1].sum() == fa.reshape(5, 10).sum(0).sum()
    assert differ > 0


@pytest.mark.parametrize("kw", [dict(top_k=40), dict(top_k=40, top_p=0.95, min_p=0.05),
                                dict(temperature=0.7, top_k=8, top_p=0.6)], ids=str)
def test_fixed_mass_fused_and_unfused_bit_equal(kernel_device, kw):
    """``mass="fixed"``: the fused merge and step 1's own launch give the same bits, and the reference's draws."""
    from onlinesoftmax.topk.plan import SampleKnobs

    x = _logits(6, 300, device=kernel_device)
    x[:, :3] += 8.0                                                 # peaked rows too
    u = torch.rand(6, device=kernel_device)
    fixed = SampleKnobs(mass="fixed")
    check_draws(x, u, backend="triton", knobs=fixed, **kw)
    a = sample(x, uniform=u, backend="triton", knobs=SampleKnobs(mass="fixed", fuse=True), **kw)
    b = sample(x, uniform=u, backend="triton", knobs=fixed, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_sample_knobs_are_checked():
    from onlinesoftmax.target import H200
    from onlinesoftmax.topk.plan import SampleKnobs, sample_plan

    with pytest.raises(ValueError, match="mass"):
        sample_plan(8, 1000, 4, H200, top_k=5, knobs=SampleKnobs(mass="fp64"))
    with pytest.raises(ValueError, match="draw"):
        sample_plan(8, 1000, 4, H200, top_k=5, knobs=SampleKnobs(draw="host"))
    p = sample_plan(8, 1000, 4, H200, top_k=5, knobs=SampleKnobs(draw="kernel", mass="fixed"))
    assert (p.draw, p.mass) == ("kernel", "fixed")
    p = sample_plan(8, 1000, 4, H200, top_k=5, knobs=SampleKnobs(draw="torch", mass="fp32"))
    assert (p.draw, p.mass) == ("torch", "fp32")
    default = sample_plan(8, 1000, 4, H200, top_k=5)      # the H200's measured defaults (topk/plan.py)
    assert (default.draw, default.mass, default.fuse, default.one_buffer) == ("kernel", "fixed", True, False)
    assert not sample_plan(8, 1000, 4, H200).fuse         # the row kernel runs: step 1 stays its own launch


@pytest.mark.parametrize("B", [1, 3, 4])
def test_one_buffer_outputs(kernel_device, B):
    """``one_buffer``: ids and logprobs are views of one allocation (logp 16-byte aligned), the same values."""
    from onlinesoftmax.topk.plan import SampleKnobs

    x = _logits(B, 40, device=kernel_device)
    u = torch.rand(B, device=kernel_device)
    a = sample(x, top_k=5, uniform=u, backend="triton", knobs=SampleKnobs(one_buffer=True))
    b = sample(x, top_k=5, uniform=u, backend="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[1].dtype == torch.float32
    assert a[0].untyped_storage().data_ptr() == a[1].untyped_storage().data_ptr() and a[1].data_ptr() % 16 == 0


@pytest.mark.parametrize("kw", [dict(top_k=40, top_p=0.95, min_p=0.05), dict(top_p=0.9)], ids=str)
def test_draw_at_the_ends_of_u(kernel_device, kw):
    """u = 0 draws the first kept token in index order, u = 1 − 2^-24 the last (the running mass reaches u · W_kept
    only there), on rows with and without ties: the fused merge (an int top_k) and the row kernel (top_p alone,
    V = 300)."""
    x = _logits(4, 300, device=kernel_device)
    x[1::2] = torch.round(x[1::2])                                  # many ties
    u = torch.tensor([0.0, 0.0, 1.0 - 2.0 ** -24, 1.0 - 2.0 ** -24], device=kernel_device)
    ids, logp = sample(x, uniform=u, backend="triton", **kw)
    for r in range(4):
        probs = sample_distribution(x[r].double().cpu().numpy(), 1.0, kw.get("top_k"), kw.get("top_p"),
                                    kw.get("min_p"))
        kept = np.nonzero(probs > 0)[0]
        assert kept.size > 1, r
        want = kept[0] if r < 2 else kept[-1]
        assert int(ids[r]) == want, (r, int(ids[r]), want)
        assert abs(float(logp[r]) - np.log(probs[want])) <= 2e-5 + 2e-5 * abs(np.log(probs[want])), r


GRAPH_MIXES = [(dict(top_k=5), True), (dict(top_k=5, min_p=0.1), False), (dict(top_p=0.9), False)]


@pytest.mark.parametrize("kw,fuse", GRAPH_MIXES, ids=str)
def test_graph_draw_counts_replays(kernel_device, kw, fuse):
    """``philox`` 2 (a captured call, ``graph_draw="kernel"``): call n of row r draws Philox at counter
    (offset / 4 + n, r, 0) and leaves tag + n + 1 in the row's slot; slots that do not hold tag + n (never written)
    start at n = 0. The fused merge, step 1 alone (its rows decided) and the row kernel (top_p alone, V = 300:
    every row flagged, advanced by the row kernel) each advance a row once per call."""
    from onlinesoftmax.topk.plan import SampleKnobs
    from onlinesoftmax.topk.sampling import _int32, philox_words
    from onlinesoftmax.topk.sampling_launch import sample_2d

    B, V, seed, offset, tag = 5, 300, 0xF234567890ABCDEF, 4 * (2**32 - 2), (0x2345 << 40) | 0x9ABCDEF1
    x = _logits(B, V, device=kernel_device)
    knobs = SampleKnobs(mass="fixed", fuse=fuse)
    k, p, q = kw.get("top_k"), kw.get("top_p"), kw.get("min_p")
    slots = torch.tensor([0, -1, tag - 1, tag + 2**32, 12345], dtype=torch.int64, device=kernel_device)
    words = (slots, *philox_words(seed, offset), _int32(tag & 0xFFFFFFFF), _int32(tag >> 32))
    for n in range(3):
        ids, logp = sample_2d(x, 1.0, k, p, q, words, knobs)
        assert slots.tolist() == [tag + n + 1] * B, n
        u = torch.tensor([philox_uniform(seed, offset + 4 * n, r) for r in range(B)], device=kernel_device)
        ref = sample_2d(x, 1.0, k, p, q, u, knobs)
        assert torch.equal(ids, ref[0]) and torch.equal(logp, ref[1]), n


def test_graph_draw_chi2_over_replays(kernel_device):
    """Successive ``philox`` 2 calls (replays) of the same rows draw ids that follow ``sample_distribution`` (χ²:
    top-k 8 then top-p 0.8 keep 5 tokens of LOGITS, p >= 0.10, so 64 draws expect >= 6.7 of each), and fresh ones:
    some row's id changes from call to call (a count not advanced repeats every row's id), and some call's rows
    differ (rows sharing a counter draw one id per call)."""
    from test_sampling import LOGITS, assert_distribution

    from onlinesoftmax.topk.plan import SampleKnobs
    from onlinesoftmax.topk.sampling import _int32, philox_words
    from onlinesoftmax.topk.sampling_launch import sample_2d

    B, calls, tag = 8, 8, 77 << 33
    x = LOGITS.to(kernel_device).expand(B, -1).contiguous()
    slots = torch.zeros(B, dtype=torch.int64, device=kernel_device)
    words = (slots, *philox_words(99, 4 * 7), _int32(tag & 0xFFFFFFFF), _int32(tag >> 32))
    ids = torch.stack([sample_2d(x, 0.9, 8, 0.8, None, words, SampleKnobs())[0].cpu() for _ in range(calls)])
    assert (slots == tag + calls).all()
    assert (ids != ids[:1]).any(dim=0).any() and (ids != ids[:, :1]).any(dim=1).any(), ids
    assert_distribution(ids.reshape(-1), sample_distribution(LOGITS.double().numpy(), 0.9, 8, 0.8, None))


def test_new_sample_knobs_are_checked():
    from onlinesoftmax.target import H200
    from onlinesoftmax.topk.plan import SampleKnobs, sample_plan

    with pytest.raises(ValueError, match="graph_draw"):
        sample_plan(8, 1000, 4, H200, top_k=5, knobs=SampleKnobs(graph_draw="host"))
    assert sample_plan(8, 1000, 4, H200, top_k=5).graph_draw == "kernel"
    assert sample_plan(8, 1000, 4, H200).graph_draw == "kernel"
    assert sample_plan(8, 1000, 4, H200, knobs=SampleKnobs(graph_draw="torch")).graph_draw == "torch"


WARM_MIXES = [(dict(temperature=0.7, top_k=5, top_p=0.9), "kernel"), (dict(top_p=0.9, min_p=0.05), "kernel"),
              (dict(top_k=5), "torch")]


@pytest.mark.parametrize("kw,graph_draw", WARM_MIXES, ids=str)
def test_warm_capture_draw_runs_the_captured_launches(kernel_device, kw, graph_draw):
    """``sampling._warm_capture_draw`` launches, eagerly, the kernels ``sample`` launches under a capture: the bound
    problem of ``philox`` 2 (``graph_draw`` "kernel", the default: the fused merge, or step 1 and the row kernel)
    or of loaded uniforms (``philox`` 0, "torch"), not the eager call's (``philox`` 1); nothing for an all-greedy
    call, nor on the torch path."""
    from onlinesoftmax.topk import sampling_launch
    from onlinesoftmax.topk.plan import SampleKnobs
    from onlinesoftmax.topk.sampling import _warm_capture_draw

    x = _logits(3, 300, device=kernel_device)
    knobs = SampleKnobs() if graph_draw == "kernel" else SampleKnobs(graph_draw="torch")
    sampling_launch._calls.clear()
    assert _warm_capture_draw(x, backend="triton", knobs=knobs, **kw)
    assert [key[-1] for key in sampling_launch._calls] == [2 if graph_draw == "kernel" else 0]
    sampling_launch._calls.clear()
    assert not _warm_capture_draw(x, backend="triton", knobs=knobs, **dict(kw, temperature=0.0))
    assert not _warm_capture_draw(x, backend="torch", knobs=knobs, **kw)
    assert not sampling_launch._calls


BINS_MIXES = [dict(top_p=0.9), dict(top_p=0.2), dict(top_p=0.999), dict(top_p=0.3, min_p=0.001),
              dict(temperature=3.0, top_p=0.7), dict(temperature=0.5, top_p=0.95)]


def topp_call(x, knobs):
    """The launch module's call object of a top-p call (no top-k) on ``x`` with ``knobs``."""
    from onlinesoftmax.topk import sampling_launch as SL

    return SL.sample_call(x, False, None, 1, knobs, SL.current_stream(SL.current_device()) if x.is_cuda else None, 0)


def workspace_views(x, knobs):
    """The workspace views a top-p call (no top-k) on ``x`` with ``knobs`` uses (each may be larger than this call
    needs: the first call that needed it sized it)."""
    return topp_call(x, knobs).workspace(x.device)


def _bins_list(x, knobs):
    """The row kernel's lists of boundary-bin indices (row="bins"), ``[B, ROW_BINS_CAP]`` (the launch module's,
    which a test may patch)."""
    from onlinesoftmax.topk import sampling_launch as SL

    B, cap = x.shape[0], SL.ROW_BINS_CAP
    return workspace_views(x, knobs)[12][:B * cap].view(B, cap)      # (the grid's views follow it)


BINS_CASES = [(300, kw) for kw in BINS_MIXES] + [(3000, BINS_MIXES[0]), (3000, BINS_MIXES[3])]


@pytest.mark.parametrize("V, kw", BINS_CASES, ids=[f"{V}-{kw}" for V, kw in BINS_CASES])
def test_row_bins_draw_matches_reference(kernel_device, kw, V):
    """SampleKnobs(row="bins"): top-p's boundary by the fine bins of x and the sorted list of the boundary's bin
    draws the reference's ids; every row whose kept set runs past the 64 candidates (the row kernel's rows) had its
    list written (the bins path ran, not the radix), and at V = 3000 there are such rows."""
    from onlinesoftmax.topk.plan import FREE_K, SampleKnobs

    B = 5
    x = _logits(B, V, scale=1.0, device=kernel_device)
    x[1] = torch.linspace(-3, 3, V)                      # sorted: the boundary bin is one run of the order
    u = torch.rand(B, device=kernel_device)
    knobs = SampleKnobs(row="bins", draw="torch", grid=False)
    lst = _bins_list(x, knobs)
    lst.fill_(-7)
    check_draws(x, u, backend="triton", knobs=knobs, **kw)
    xs = x.double().cpu().numpy()
    long = torch.tensor([int((sample_distribution(xs[r], kw.get("temperature", 1.0), None, kw.get("top_p"),
                                                  kw.get("min_p")) > 0).sum()) > FREE_K for r in range(B)])
    written = (lst != -7).any(1).cpu()
    assert bool(written[long].all()), (written, long)
    assert V < 3000 or bool(long.any())


@pytest.mark.parametrize("kw", BINS_MIXES[:4], ids=[str(kw) for kw in BINS_MIXES[:4]])
def test_row_radix_draw_matches_reference(kernel_device, kw):
    """SampleKnobs(row="radix") (the radix select without the bins: the default before "bins") on the same rows."""
    from onlinesoftmax.topk.plan import SampleKnobs

    x = _logits(5, 3000, scale=1.0, device=kernel_device)
    x[1] = torch.linspace(-3, 3, 3000)
    check_draws(x, torch.rand(5, device=kernel_device), backend="triton", knobs=SampleKnobs(row="radix", draw="torch"),
                **kw)


def test_row_bins_per_row_top_k_ties_and_overflow(kernel_device, monkeypatch):
    """Rows with a per-row top-k take the radix select beside rows without (top_k 0) that take the bins; bf16
    logits put runs of ties in the boundary bin; a bin holding more than the list's capacity (a row of equal logits,
    or a capacity of 16) falls back to the radix select and draws the same ids."""
    from onlinesoftmax.topk import sampling_launch as SL
    from onlinesoftmax.topk.plan import SampleKnobs

    B, V = 4, 2001                                       # (top_p · V not an integer: no knife edge on row 2)
    x = _logits(B, V, dtype=torch.bfloat16, scale=1.0, device=kernel_device)
    x[2] = 0.5                                           # every logit equal: one bin of V elements
    u = torch.rand(B, device=kernel_device)
    k = torch.tensor([0, 700, 0, 0], device=kernel_device)
    knobs = SampleKnobs(row="bins", draw="torch", grid=False)
    lst = _bins_list(x, knobs)
    lst.fill_(-7)
    check_draws(x, u, top_k=k, top_p=0.8, backend="triton", knobs=knobs, max_near=0.5)
    written = (lst != -7).any(1).cpu()
    assert written.tolist() == [True, False, True, True]     # row 1's top-k: the radix; row 2: a list of 2001
    check_draws(x, u, top_p=0.6, min_p=0.05, backend="triton", knobs=knobs, max_near=0.5)
    monkeypatch.setattr(SL, "ROW_BINS_CAP", 16)          # row 2's bin overflows a list of 16: the radix there
    SL._calls.clear()
    try:
        lst = _bins_list(x, knobs)
        lst.fill_(-7)
        check_draws(x, u, top_p=0.6, backend="triton", knobs=knobs, max_near=0.5)
        assert bool((lst[2] == -7).all())
    finally:
        SL._calls.clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="patches the constexpr SHORT_LIST, which the GPU's compiled "
                    "kernels keep (the bound calls and Triton's cache); the interpreter reads it on every call")
def test_row_bins_third_level(kernel_device, monkeypatch):
    """A boundary group of 16 fine bins holding more than SHORT_LIST elements takes a third level (its fine bin):
    with SHORT_LIST patched to 16 the lists come out shorter than the groups' and the draws are the reference's."""
    import triton.language as tl

    from onlinesoftmax.topk import sampling_kernels as SK
    from onlinesoftmax.topk.plan import SampleKnobs

    B, V = 3, 3000
    x = _logits(B, V, scale=1.0, device=kernel_device)
    u = torch.rand(B, device=kernel_device)
    knobs = SampleKnobs(row="bins", draw="torch", grid=False)
    written = []
    for short in (None, 16):
        if short is not None:
            monkeypatch.setattr(SK, "SHORT_LIST", tl.constexpr(short))
        lst = _bins_list(x, knobs)
        lst.fill_(-7)
        check_draws(x, u, top_p=0.9, backend="triton", knobs=knobs, max_near=0.5)
        written.append((lst != -7).sum(1).cpu())
    assert bool((written[0] > 16).all()) and bool((written[1] < written[0]).all()), written
    assert bool((written[1] >= 1).all())


def test_row_bins_knob_checked():
    from onlinesoftmax.target import H200
    from onlinesoftmax.topk import explain_sample
    from onlinesoftmax.topk.plan import SampleKnobs

    x = torch.empty(8, 128256, device="meta")
    assert explain_sample(x, target=H200).row == "bins"
    assert explain_sample(x[:1], target=H200, knobs=SampleKnobs(row="radix")).row == "radix"
    with pytest.raises(ValueError, match="row must be one of"):
        explain_sample(x, target=H200, knobs=SampleKnobs(row="sort"))


def _mid_uniforms(x, seed=0, **kw):
    """Per row, a u in the middle of a kept token's interval of the fp64 CDF (the largest p of 64 kept tokens
    picked at random): its distance to a boundary is p / 2, past fp32's rounding of sums over ~10^5 tokens, so the
    draw is checked exactly on every row (flat rows of a real vocabulary put random u's within that rounding of a
    boundary on up to half the rows)."""
    B = x.shape[0]
    xs, rng, u = x.double().cpu().numpy(), np.random.default_rng(seed), []
    ts, ks, ps, qs = (_rows(kw.get("temperature", 1.0), B), _rows(kw.get("top_k"), B, int), _rows(kw.get("top_p"), B),
                      _rows(kw.get("min_p"), B))
    for r in range(B):
        probs = sample_distribution(xs[r], ts[r], ks[r], ps[r], qs[r])
        kept = np.nonzero(probs > 0)[0]
        pick = rng.choice(kept, min(64, kept.size), replace=False)
        j = int(pick[np.argmax(probs[pick])])
        u.append(np.cumsum(probs)[j] - probs[j] / 2)
    return torch.tensor(u, dtype=torch.float32, device=x.device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_row_bins_many_chunks_matches_reference(dtype):
    """SampleKnobs(row="bins") on flat rows of a real vocabulary (C > 1 chunks at the row barrier): the reference's
    ids on every row (u in the middle of a kept token's interval), the boundary-bin list written for the rows
    without top-k."""
    from onlinesoftmax.target import target_of
    from onlinesoftmax.topk.plan import SampleKnobs, row_chunks

    B, V = 16, 128256
    assert row_chunks(B, V, target_of(torch.device("cuda")))[0] > 1
    x = torch.randn(B, V, device="cuda").to(dtype)
    knobs = SampleKnobs(row="bins", grid=False)
    lst = _bins_list(x, knobs)
    lst.fill_(-7)
    k = torch.tensor([0, 5000, 100, 70000] * 4, device="cuda")
    mixes = [dict(top_p=0.9), dict(temperature=0.7, top_p=0.5, min_p=0.02), dict(top_k=k, top_p=0.95),
             dict(temperature=1.3, top_p=0.99)]
    for i, kw in enumerate(mixes):
        xi = x.t().contiguous().t() if i == 3 else x
        check_draws(xi, _mid_uniforms(x, **kw), backend="triton", gap=2e-6, max_near=0, knobs=knobs, **kw)
        if i == 0:
            assert bool((lst != -7).any(1).all())
