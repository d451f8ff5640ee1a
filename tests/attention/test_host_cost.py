"""Host cost of an attention call: the persistent forward's cached TMA descriptor encodings (checked against what
Triton's own launcher wrapper passes), its fallbacks, the plan cache and the eager (no custom op) paths."""

import dataclasses
import types

import pytest
import torch

from onlinesoftmax.attention import api
from onlinesoftmax.attention.plan import Knobs, Problem, decode_dispatch, plan_attention
from onlinesoftmax.target import H200, INTERPRETER

driver = pytest.importorskip("triton.backends.nvidia.driver")
launch = pytest.importorskip("onlinesoftmax._triton.launch")


class FakeFill:
    """``fill_tma_descriptor`` on a machine without a GPU: a "map" that is the tuple of what it encodes."""

    def __init__(self):
        self.calls = 0

    def __call__(self, ptr, swizzle, elem_size, elem_type, block, shape, strides, padding):
        self.calls += 1
        return ("map", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides), padding)


@pytest.fixture
def fill(monkeypatch):
    import triton.runtime

    f = FakeFill()
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(utils=types.SimpleNamespace(
        fill_tma_descriptor=f)))
    return f


def _persistent(D=64, causal=False, Sq=256):
    """The default persistent forward's bound launch on the H200 for a [1, 2, Sq, D] bf16 problem."""
    p = Problem(1, 2, 2, Sq, Sq, D, "bfloat16", causal, (-1, 0) if causal else (-1, -1), tma=True)
    plan = plan_attention(p, H200, "triton", Knobs(forward=dict(kernel="sm90", programs=-1))).forward
    bk = api._caches()[0](p, plan, (Sq * D * 2, Sq * D, D, 1) * 4 + (2 * Sq, Sq))
    return p, plan, bk


def _signature(bk, metas_lowered=True):
    """The kernel's launch signature as Triton's JIT gives it (descriptor parameters first)."""
    sig = {}
    for i, prm in enumerate(bk.fn.params):
        if prm.is_constexpr:
            sig[prm.name] = "constexpr"
        elif i < len(bk.boxes):
            block, layout = bk.boxes[i]
            sig[prm.name] = f"tensordesc<bf16{block},{layout!r}>"
        else:
            sig[prm.name] = "i32"
    return sig


def _metas(bk):
    return [dict(swizzle=3, elem_size=2, elem_type=10, block_size=list(block), fp4_padded=False)
            for block, _ in bk.boxes]


class Recorder:
    def __init__(self):
        self.args = []

    def __call__(self, *args):
        self.args.append(args)


def _compiled(launcher):
    run = types.SimpleNamespace(launch=launcher, global_scratch_size=0, profile_scratch_size=0,
                                launch_cooperative_grid=False, launch_pdl=False)
    return types.SimpleNamespace(run=run, function=7, packed_metadata=(4, 1, 1000))


def _args(bk, q, k, v, o):
    lse = torch.empty(q.shape[:3])
    return (q, k, v, o, o, 1, 2, 3, lse, 4, 5) + (0,) * (len([p for p in bk.fn.params if not p.is_constexpr]) - 11)


def test_api_binds_the_persistent_forward_with_its_boxes():
    """The persistent forward's launch is a DescriptorKernel over q, k, v, o: 4-D boxes of a warpgroup's query
    rows (q, o) and block_n keys (k, v), their layouts made once per launch."""
    from onlinesoftmax.attention.kernels.fwd_sm90 import WARPGROUP_ROWS

    for D in (64, 128):
        _, plan, bk = _persistent(D)
        assert isinstance(bk, launch.DescriptorKernel)
        blocks = [b for b, _ in bk.boxes]
        assert blocks == [[1, 1, WARPGROUP_ROWS, D], [1, 1, plan.block_n, D], [1, 1, plan.block_n, D],
                          [1, 1, WARPGROUP_ROWS, D]]
        assert all(lay.swizzle_byte_width == 128 and lay.element_bitwidth == 16 for _, lay in bk.boxes)
        q = torch.randn(1, 2, 256, D, dtype=torch.bfloat16)
        descs = bk.descriptors((q, q, q, q, "rest"))
        assert descs[-1] == "rest" and [d.block_shape for d in descs[:4]] == blocks
        assert descs[0].shape == [1, 2, 256, D] and descs[0].strides == list(q.stride())


def test_tensordesc_launcher_unwraps_only_the_expected_wrapper():
    _, _, bk = _persistent()
    raw = Recorder()
    sig, metas = _signature(bk), _metas(bk)
    wrapper = driver.wrap_handle_tensordesc(raw, sig, metas)
    got = launch.tensordesc_launcher(wrapper, 4)
    assert got is not None and got[0] is raw and list(got[1]) == metas
    assert launch.tensordesc_launcher(wrapper, 3) is None                       # descriptors elsewhere too
    assert launch.tensordesc_launcher(driver.wrap_handle_tensordesc(raw, sig, None), 4) is None   # not TMA maps
    fp4 = [dict(m, fp4_padded=True) for m in metas]
    assert launch.tensordesc_launcher(driver.wrap_handle_tensordesc(raw, sig, fp4), 4) is None
    assert launch.tensordesc_launcher(raw, 4) is None                           # no wrapper
    assert launch.tensordesc_launcher(lambda *a: None, 4) is None
    assert launch.tensordesc_launcher(_compiled(raw).run, 4) is None             # Triton's launcher object


def test_cached_encodings_are_what_triton_passes(fill, monkeypatch):
    """Launch after launch the C launcher gets exactly the arguments Triton's wrapper would make from fresh
    descriptors, hit or miss: same tensors, new tensors of the same shapes, the same pointer with other strides or
    shape, views at an offset; a tensor map is encoded only on a miss, and the cache stays within TMA_ARG_CACHE."""
    monkeypatch.setattr(launch, "TMA_ARG_CACHE", 16)
    _, _, bk = _persistent()
    raw, ref_raw = Recorder(), Recorder()
    sig, metas = _signature(bk), _metas(bk)
    entry = bk._bind(_compiled(driver.wrap_handle_tensordesc(raw, sig, metas)))
    ref = driver.wrap_handle_tensordesc(ref_raw, sig, metas)
    assert entry[3][0] is raw

    def check(q, k, v, o, encodes):
        args = _args(bk, q, k, v, o)
        before = fill.calls
        bk.run(entry, args, 99)
        new = fill.calls - before
        ref(*entry[1][:3], 99, *entry[1][3:], *bk.descriptors(args), *bk.tail)
        assert raw.args[-1] == ref_raw.args[-1]
        assert new == encodes, (new, encodes)

    def t(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16)

    q, k, v, o = t(1, 2, 256, 64), t(1, 2, 256, 64), t(1, 2, 256, 64), t(1, 2, 256, 64)
    check(q, k, v, o, 4)
    check(q, k, v, o, 0)                               # the same tensors: all hits
    check(k, q, v, o, 2)                               # k's data as q: k's box differs from q's
    buf = torch.empty(2 * 256 * 64, dtype=torch.bfloat16)
    check(buf.view(1, 2, 256, 64), k, v, o, 1)
    check(buf.view(1, 256, 2, 64).transpose(1, 2), k, v, o, 1)     # the same pointer, other strides
    check(buf.view(1, 1, 512, 64), k, v, o, 1)                     # ... other shape and strides
    check(q[:, :, :128], k, v, o, 1)                               # ... other shape, same strides
    check(q[:, :, 8:], k[:, :, 8:], v[:, :, 8:], o[:, :, 8:], 4)   # views at an offset
    check(q, k, v, o, 0)
    maps = entry[4]
    assert len(maps) == 14
    alive = []                                          # (freed tensors' addresses could come back: hits)
    for _ in range(3):
        alive.append([t(1, 2, 256, 64) for _ in range(4)])
        check(*alive[-1], 4)
        assert len(maps) == 16


def test_cache_off_and_unexpected_launchers_take_tritons_wrapper(fill, monkeypatch):
    """TMA_ARG_CACHE = 0, or a launcher that is not the expected wrapper: every launch passes fresh descriptors to
    Triton's launcher (which encodes them itself)."""
    _, _, bk = _persistent()
    raw = Recorder()
    sig, metas = _signature(bk), _metas(bk)
    entry = bk._bind(_compiled(driver.wrap_handle_tensordesc(raw, sig, metas)))
    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    args = _args(bk, q, q, q, q)
    monkeypatch.setattr(launch, "TMA_ARG_CACHE", 0)
    for n in (1, 2):
        bk.run(entry, args, 5)
        assert fill.calls == 4 * n
    cached_args = raw.args[-1]
    monkeypatch.setattr(launch, "TMA_ARG_CACHE", 64)
    bk.run(entry, args, 5)
    assert raw.args[-1] == cached_args and fill.calls == 12
    other = Recorder()
    entry = bk._bind(_compiled(other))                 # a launcher without the wrapper: descriptors go to it
    assert entry[3] is None
    bk.run(entry, args, 5)
    sent = other.args[-1][13:17]
    assert [type(d).__name__ for d in sent] == ["TensorDescriptor"] * 4
    assert [d.block_shape for d in sent] == [b for b, _ in bk.boxes]


def test_plan_cache_follows_plan_attention(monkeypatch):
    """The api's plans are plan_attention's, cached per (function, problem, target): a swapped api.plan_attention
    (tools, knob tests) is what runs."""
    p = Problem(2, 4, 4, 1024, 1024, 128, "bfloat16", True, (-1, 0), tma=True)
    monkeypatch.setattr(api, "target_of", lambda device: H200)
    assert api._triton_plan(p, torch.device("cpu")) == plan_attention(p, H200, "triton")
    knob = Knobs(forward=dict(kernel="sm90", programs=0))
    monkeypatch.setattr(api, "plan_attention", lambda p, t, b, kn=Knobs(): plan_attention(p, t, b, knob))
    assert api._triton_plan(p, torch.device("cpu")).forward.programs == 0
    monkeypatch.undo()
    assert api._triton_plan(p, torch.device("cpu")) == plan_attention(p, INTERPRETER, "triton")
    for sq, sk in ((1, 4096), (16, 2048), (17, 4096), (8, 100)):
        q, k = torch.empty(2, 4, sq, 64), torch.empty(2, 2, sk, 64)
        assert api._decode_call(q, k, k) == decode_dispatch(dataclasses.replace(p, Sq=sq, Sk=sk, D=64))


def test_eager_paths_match_the_custom_op(kernel_device):
    """An eager call runs the op's body (no gradient) or an autograd.Function around it: the same (o, lse) and
    gradients as the custom op (and its registered autograd)."""
    dt = torch.bfloat16 if kernel_device.type == "cuda" else torch.float32
    q = torch.randn(1, 2, 24, 32, dtype=dt, device=kernel_device)
    k, v = torch.randn_like(q), torch.randn_like(q)
    args = (True, 32 ** -0.5, -1, -1, 0.0)
    o_op, lse_op = torch.ops.onlinesoftmax.attention_fwd(q, k, v, *args)
    o, lse = api._attention_fwd(q, k, v, *args)
    assert torch.equal(o, o_op) and torch.equal(lse, lse_op)
    grads = []
    for fwd in (torch.ops.onlinesoftmax.attention_fwd, api._attention_fwd):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        o, lse = fwd(*leaves, *args)
        assert o.grad_fn is not None and lse.requires_grad
        (o.float().square().sum() + lse.sum()).backward()
        grads.append([t.grad for t in leaves])
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fwd(*leaves, *args)[0].float().sum().backward()       # lse unused: its gradient materialised as zeros
        grads.append([t.grad for t in leaves])
    for a, b in zip(grads[:2], grads[2:]):
        for ga, gb in zip(a, b):
            torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_persistent_forward_with_cached_descriptors(monkeypatch):
    """On a Hopper GPU the persistent forward launched from cached encodings (hits: the same tensors with new data,
    new tensors at freed addresses; misses: the same pointer with other strides, views at an offset) gives what
    fresh encodings give (TMA_ARG_CACHE = 0), bitwise, and matches fp32 torch."""
    import onlinesoftmax as oss
    from onlinesoftmax.target import target_of

    if not target_of(torch.device("cuda")).sm90:
        pytest.skip("the persistent forward runs on Hopper only")
    B, H, S, D = 2, 4, 384, 128

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    def check(q, k, v, causal):
        p = api._op_problem(q, k, v, causal, -1, -1, 0.0)
        assert api._triton_plan(p, q.device).forward.programs, "not the persistent forward"
        o, lse = oss.attention(q, k, v, causal=causal, return_lse=True)
        with monkeypatch.context() as m:
            m.setattr(launch, "TMA_ARG_CACHE", 0)
            o0, lse0 = oss.attention(q, k, v, causal=causal, return_lse=True)
        assert torch.equal(o, o0) and torch.equal(lse, lse0)
        ro, rl = api._torch_attention(q.float(), k.float(), v.float(), D ** -0.5, -1, 0 if causal else -1, None)
        assert (o.float() - ro).abs().max() <= 2e-2 * ro.abs().max()
        assert (lse - rl).abs().max() <= 5e-3

    q, k, v = rnd(B, H, S, D), rnd(B, H, S, D), rnd(B, H, S, D)
    check(q, k, v, True)
    q.normal_()
    check(q, k, v, True)
    del q
    q = rnd(B, H, S, D)
    check(q, k, v, False)
    buf = rnd(B * H * S * D)
    check(buf.view(B, H, S, D), k, v, True)
    buf.normal_()
    check(buf.view(B, S, H, D).transpose(1, 2), k, v, True)
    big = rnd(B, H + 1, S + 64, D)
    check(big[:, 1:, 64:], big[:, :H, :S], big[:, 1:, 32:S + 32], True)
