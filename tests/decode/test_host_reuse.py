"""A decoding loop's host path: a cache that grows by one key a step reuses its plan (per class of 16 lengths) and
its bound launches (per shape class), the lengths of a full cache are shared by a step's layers, results stay those
of the fp64 reference along the loop, and every bound launch replays the variant Triton's own path would pick
(tools/hostcost_decode_cpu.py --check, which runs the kernels as JITFunctions against a stub sm_90 driver)."""

import os
import subprocess
import sys

import pytest
import torch
from decode_inputs import assert_matches

import onlinesoftmax as oss
from onlinesoftmax.decode import explain
from onlinesoftmax.decode.plan import Knobs, Problem, decode_plan
from onlinesoftmax.reference import decode as ref
from onlinesoftmax.target import A100, H200, INTERPRETER

launch = pytest.importorskip("onlinesoftmax.decode.launch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("target", [H200, A100, INTERPRETER], ids=["H200", "A100", "interp"])
@pytest.mark.parametrize("shape", [(8, 32, 8, 1, 128, 0, 2), (1, 8, 1, 4, 64, 16, 2), (300, 8, 8, 1, 256, 0, 4),
                                   (64, 32, 8, 1, 128, 256, 2), (2, 4, 2, 1, 16, 1, 4)])
def test_plan_reads_s_max_in_whole_tiles(target, shape):
    """cached_plan keys on s_max rounded up to 16: every length of a class must plan the same."""
    B, H, Hkv, Sq, D, page, esize = shape
    for s in list(range(0, 300)) + list(range(2040, 2100)) + [32767, 32768, 32769, 131072 + 5]:
        p = Problem(B, H, Hkv, Sq, D, s, page, esize)
        assert decode_plan(p, target) == decode_plan(Problem(B, H, Hkv, Sq, D, -(-s // 16) * 16, page, esize),
                                                     target), s


def _cache(B, Hkv, D, s_top, dtype, device):
    """A DynamicCache-like growing cache: contiguous [B, Hkv, S, D] views of one storage, made per S."""
    store = torch.randn(B * Hkv * s_top * D, device=device).to(dtype)

    def at(S):
        return store[:B * Hkv * S * D].view(B, Hkv, S, D)
    return at


@pytest.mark.parametrize("knobs", [Knobs(), Knobs.of(balanced=True)], ids=["default", "balanced"])
def test_growing_length_loop_matches_reference(knobs, kernel_device):
    """S = 31, 32, 33 (across a class of 16 and a tile edge), two layers per step, lse asked for and not: each step
    against the fp64 reference, nothing left over from the step before."""
    dev, B, H, Hkv, D = kernel_device, 2, 4, 2, 16
    q = torch.randn(B, 1, H, D, device=dev).transpose(1, 2)
    layers = [(_cache(B, Hkv, D, 40, torch.float32, dev), _cache(B, Hkv, D, 40, torch.float32, dev))
              for _ in range(2)]
    for S in (31, 32, 33):
        for layer, (kc, vc) in enumerate(layers):
            k, v = kc(S), vc(S)
            lens = launch.uniform_lengths(B, S, dev)
            plan = explain(q, k, v, lens, backend="triton", knobs=knobs)
            o, lse = launch.attention_split_kv(q, k, v, lens, None, True, D ** -0.5, -1, -1, 0.0, plan)
            ro, rl = ref.attention_with_kvcache(q, k, v, lens)
            assert_matches(o, lse, ro, rl, torch.float32)
            if layer == 0:
                o2, none = launch.attention_split_kv(q, k, v, lens, None, True, D ** -0.5, -1, -1, 0.0, plan,
                                                     need_lse=False)
                assert none is None and torch.equal(o, o2)


def test_attention_decode_dispatch_along_a_loop(kernel_device):
    """oss.attention over S >= 2048 keys (the decode dispatch, its cache_seqlens from uniform_lengths) at two
    lengths of one step each, lse returned and not."""
    dev, B, H, Hkv, D = kernel_device, 1, 2, 1, 16
    q = torch.randn(B, 1, H, D, device=dev).transpose(1, 2)
    kc, vc = _cache(B, Hkv, D, 2050, torch.float32, dev), _cache(B, Hkv, D, 2050, torch.float32, dev)
    for S in (2048, 2050):
        k, v = kc(S), vc(S)
        o, lse = oss.attention(q, k, v, causal=True, return_lse=True)
        assert torch.equal(oss.attention(q, k, v, causal=True), o)
        ro, rl = ref.attention_with_kvcache(q, k, v, torch.full((B,), S, dtype=torch.int32, device=dev))
        assert_matches(o, lse, ro, rl, torch.float32)


def _misses():
    return (launch._plan.cache_info().misses, launch._bound_split.cache_info().misses,
            launch._bound_balanced.cache_info().misses)


def _bound(q, k, v, lens, plan):
    p = Problem(q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.shape[3], k.shape[2], 0, q.element_size())
    flags = (False, True, False, False, False, q.dtype == torch.float32)
    spec = launch._spec(p.s_max, q.stride(), k.stride(), v.stride(), 1, q.stride(), -1, -1)
    return launch._launches(plan, p, flags, (D_SCALE, 0.0, -1, -1), q.stride(), q.stride(), spec)[0][0]


D_SCALE = 0.25


@pytest.mark.parametrize("balanced", [False, True])
def test_bound_launches_reused_across_lengths(balanced):
    """Growing S: one plan per class of 16 lengths, one bound launch per specialisation of S (divisible by 16 or
    not) while the plan holds; a new B, H, D or fp32-ness binds anew."""
    cpu = torch.device("cpu")
    B, H, Hkv, D = 3, 4, 2, 16
    q = torch.randn(B, 1, H, D).transpose(1, 2)
    at = _cache(B, Hkv, D, 100, torch.float32, cpu)
    knobs = Knobs.of(balanced=balanced, splits=3)
    for cache in (launch._plan, launch._bound_split, launch._bound_balanced):
        cache.cache_clear()
    start = _misses()
    seen = {}
    for S in range(33, 64):            # two classes of 16 (48, 64), S % 16 == 0 once (48)
        k = at(S)
        p = Problem(B, H, Hkv, 1, D, S, 0, 4)
        launch.cached_plan(p, cpu)
        plan = decode_plan(p, INTERPRETER, knobs)
        seen.setdefault(S % 16 == 0, set()).add(id(_bound(q, k, k, None, plan)))
    plans, split, bal = (a - b for a, b in zip(_misses(), start))
    assert plans == 2
    assert (bal if balanced else split) == 2 and (split if balanced else bal) == 0
    assert all(len(ids) == 1 for ids in seen.values()) and len(seen) == 2
    k = at(40)
    plan = decode_plan(Problem(B, H, Hkv, 1, D, 40, 0, 4), INTERPRETER, knobs)
    base = _bound(q, k, k, None, plan)
    assert _bound(q, k, k, None, plan) is base
    for q2, k2 in ((torch.randn(B + 1, H, 1, D), _cache(B + 1, Hkv, D, 40, torch.float32, cpu)(40)),
                   (torch.randn(B, 2 * H, 1, D), k),
                   (torch.randn(B, H, 1, 2 * D), _cache(B, Hkv, 2 * D, 40, torch.float32, cpu)(40)),
                   (q.to(torch.bfloat16), k.to(torch.bfloat16))):
        p2 = Problem(q2.shape[0], q2.shape[1], Hkv, 1, q2.shape[3], 40, 0, q2.element_size())
        assert _bound(q2, k2, k2, None, decode_plan(p2, INTERPRETER, knobs)) is not base


def test_uniform_lengths_shared_per_step_and_bounded():
    cpu = torch.device("cpu")
    a = launch.uniform_lengths(8, 2049, cpu)
    assert a.dtype == torch.int32 and a.tolist() == [2049] * 8
    assert launch.uniform_lengths(8, 2049, cpu) is a                 # the step's other layers
    b = launch.uniform_lengths(8, 2050, cpu)
    assert b is not a and b.tolist() == [2050] * 8 and a.tolist() == [2049] * 8
    assert launch.uniform_lengths(4, 2050, cpu).tolist() == [2050] * 4
    for S in range(3000, 3000 + 2 * launch.LENGTHS_KEPT):
        launch.uniform_lengths(8, S, cpu)
    assert len(launch._lengths) == launch.LENGTHS_KEPT
    assert launch.uniform_lengths(8, 2049, cpu) is not a and a.tolist() == [2049] * 8


def test_bound_kernels_replay_tritons_own_variant():
    """Growing S over several shape classes and dtypes as JITFunctions: each bound launch's compiled variant is the
    one ``JITFunction.run`` would pick for its arguments (a kernel compiled for S % 16 == 0 replayed for another S
    would be wrong on the GPU)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "hostcost_decode_cpu.py"), "--check"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "mismatches: 0" in r.stdout
