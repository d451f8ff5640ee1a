"""``sample``: temperature / top-k / top-p / min-p sampling from logits, with no host synchronisation.

Filters, in this order, each keeping a prefix of the row sorted by (logit descending, index ascending):

* ``temperature``: a float or a per-row tensor; 0 means greedy (argmax, lowest index among ties).
* ``top_k``: the first k (an int, or a per-row integer tensor: 0 or less, or >= V, keeps the row).
* ``top_p``: the shortest prefix whose mass reaches ``top_p`` of the mass top-k kept (the first token always
  stays).
* ``min_p``: the tokens with ``p >= min_p · p_max`` (``p_max`` the row's largest probability).

Then one draw from the kept tokens, renormalised. No step's shape depends on the values, so a call never waits
for the device and can be captured in a CUDA graph (per-row tensors may change between replays).

The draw: a uniform ``u`` per row (or the ``uniform`` given), and the first kept token in index order whose
running probability exceeds ``u`` times the kept mass (inverse CDF; the same rule on both backends, so the same
``u`` gives the same ids up to rounding at a boundary). Same generator state, same ids. An eager call on CUDA
draws u in the kernels (Philox-4x32-10 keyed by the generator's seed at its offset, which advances by 4 per call,
as torch's own kernels take it): no ``torch.rand`` launch, but not the ids ``torch.rand`` would give for that
state (another stream of the same generator). A call captured into a CUDA graph draws u in the kernels too (the
key and a base counter from the generator at capture, a per-row replay count on the device: fresh uniforms on every
replay with no ``torch.rand`` node, the same sequence for the same generator state at capture; :func:`_graph_philox`;
``onlinesoftmax.warmup`` compiles these kernels), or with ``knobs=SampleKnobs(graph_draw="torch")``
``u = torch.rand(B, generator=generator)`` captured (a launch of torch's, which moves the generator's offset on
every replay). Elsewhere and with ``knobs=SampleKnobs(draw="torch")``: ``torch.rand``.

On CUDA (``topk/sampling_kernels.py``): ``softmax_topk`` with the temperature folded into its one read of the
logits gives K sorted candidates (K = ``top_k`` for an int, else 64); one small kernel applies the filters and
draws from them; a row whose filters run past the candidates (top-p or min-p over more than K tokens, a per-row
top-k above K) is finished by an exact kernel over its logits (bisection on the values, no sort). Elsewhere:
torch ops (an exact ``torch.topk`` for an int ``top_k`` on the CPU, a sort otherwise).

Arguments are checked where that needs no host synchronisation: Python values always (``temperature`` finite and
``>= 0``, ``top_p`` in ``(0, 1]``, ``min_p`` in ``[0, 1]``, ``top_k`` an int ``>= 1``, ``generator`` a
``torch.Generator`` of the logits' device type where no ``uniform`` is given), a tensor's dtype and size
always, and a tensor's values when it is on the CPU (``ValueError``). The values of a tensor on another device are
not read by the host (the call stays sync-free and graph-safe): a row whose ``temperature``, ``top_p`` or ``min_p``
is out of range there gets the result of a row with no distribution, below. With ``graph_draw="torch"``, a CUDA
graph that captures a call with a ``generator`` other than the default one needs it registered with the graph
(``torch.cuda.CUDAGraph.register_generator_state``; the kernels' draw reads the generator at capture only).

A row with no distribution (after temperature: a NaN logit, a ``+inf`` logit or no logit above ``-inf``, where
``torch.softmax`` is NaN) gets id ``-1`` and log-probability NaN, greedy or not.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

import torch

from .._checks import check_float_tensor, check_instance
from ..backend import resolve_backend, transforms_active, triton_available, values_unreadable
from .api import softmax_topk
from .plan import NO_SAMPLE_KNOBS, SampleKnobs, sample_draw_of, sample_graph_draw_of

__all__ = ["explain_sample", "sample"]

_sample_2d = None       # sampling_launch.sample_2d, imported by the first call on the kernels (it imports Triton)


def _number(v, name: str, ok, rule: str, op: str = "sample"):
    """A Python real (bool excluded) that satisfies ``ok``, or TypeError / ValueError naming ``op``."""
    if type(v) is not float and (isinstance(v, bool) or not isinstance(v, Real)):
        raise TypeError(f"{op}: {name} must be a float or a tensor, got {type(v).__name__}")
    f = float(v)
    if not ok(f):
        raise ValueError(f"{op}: {name} must be {rule}, got {v!r}")
    return f


def _top_k_number(top_k, V: int, op: str = "sample") -> int:
    """A Python ``top_k`` (an int >= 1, bool excluded) as the int the call uses: at most V."""
    if isinstance(top_k, bool) or not isinstance(top_k, Integral):
        raise TypeError(f"{op}: top_k must be an int or an integer tensor, got {type(top_k).__name__}")
    top_k = int(top_k)
    if top_k < 1:
        raise ValueError(f"{op}: top_k must be >= 1 (or a per-row tensor, 0 for no top-k), got {top_k}")
    return min(top_k, V)


def _t_rule(v: float) -> bool:
    return v - v == 0 and v >= 0        # finite (v − v is NaN for ±inf and NaN): traces where math.isfinite does not
                                        # (a float torch.compile made dynamic after it changed between calls)


def _p_rule(v: float) -> bool:
    return 0 < v <= 1


def _q_rule(v: float) -> bool:
    return 0 <= v <= 1


def _per_row(v: torch.Tensor, B: int, device, dtype, name: str, ok=None, rule: str = "") -> torch.Tensor:
    """A tensor of B (or 1) values as a ``[B, 1]`` tensor on ``device`` (no sync). ``ok`` (a predicate on the
    values) is checked where ``v`` is on the CPU: reading it there costs no synchronisation."""
    if v.dtype == torch.bool or v.is_complex() or (not dtype.is_floating_point and v.is_floating_point()):
        want = "an int or an integer" if not dtype.is_floating_point else "a float or a real"
        raise TypeError(f"sample: {name} must be {want} tensor, got a {str(v.dtype)[6:]} tensor")
    if v.numel() not in (1, B):
        raise ValueError(f"sample: {name} must hold 1 or {B} values (one per row), got shape {tuple(v.shape)}")
    if v.device.type == "meta" and device.type != "meta":
        raise ValueError(f"sample: {name} is a tensor on the meta device (it holds no values), logits on {device}")
    if (ok is not None and v.device.type == "cpu" and v.numel() and not values_unreadable(v)
            and not bool(ok(v.to(torch.float64)).all())):
        bad = v.reshape(-1)[~ok(v.reshape(-1).to(torch.float64))][:4].tolist()
        raise ValueError(f"sample: {name} must be {rule} on every row, got {bad}")
    return v.to(device=device, dtype=dtype).reshape(-1, 1).expand(B, 1)


def _t_ok(t):
    return torch.isfinite(t) & (t >= 0)


def _p_ok(p):
    return (p > 0) & (p <= 1)


def _q_ok(q):
    return (q >= 0) & (q <= 1)


def _arguments(logits, temperature, top_k, top_p, min_p, backend) -> tuple:
    """``sample``'s arguments checked and normalised (see the module's docstring for what is checked where):
    ``(backend, lead, x, B, device, t, kk, pp, qq)``, ``x`` the logits as ``[B, V]``, ``lead`` their leading shape,
    each parameter a Python value (``top_k`` at most V), None, or a ``[B, 1]`` tensor on x's device."""
    check_float_tensor(logits, "sample: logits")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError("sample: logits must have a non-empty last dimension")
    which = resolve_backend(backend, logits, "sample")
    lead, V = logits.shape[:-1], logits.shape[-1]
    x = logits if logits.dim() == 2 else logits.reshape(-1, V)
    B, dev = x.shape[0], x.device
    if not isinstance(temperature, torch.Tensor):
        temperature = _number(temperature, "temperature", _t_rule, "finite and >= 0")
    if top_p is not None and not isinstance(top_p, torch.Tensor):
        top_p = _number(top_p, "top_p", _p_rule, "in (0, 1]")
    if min_p is not None and not isinstance(min_p, torch.Tensor):
        min_p = _number(min_p, "min_p", _q_rule, "in [0, 1]")
    if top_k is not None and not isinstance(top_k, torch.Tensor):
        top_k = _top_k_number(top_k, V)
    t = _per_row(temperature, B, dev, torch.float32, "temperature", _t_ok, "finite and >= 0") \
        if isinstance(temperature, torch.Tensor) else temperature
    kk = _per_row(top_k, B, dev, torch.int64, "top_k") if isinstance(top_k, torch.Tensor) else top_k
    pp = _per_row(top_p, B, dev, torch.float32, "top_p", _p_ok, "in (0, 1]") \
        if isinstance(top_p, torch.Tensor) else top_p
    qq = _per_row(min_p, B, dev, torch.float32, "min_p", _q_ok, "in [0, 1]") \
        if isinstance(min_p, torch.Tensor) else min_p
    return which, lead, x, B, dev, t, kk, pp, qq


def sample(logits: torch.Tensor, *, temperature=1.0, top_k=None, top_p=None, min_p=None,
           generator: torch.Generator | None = None, uniform: torch.Tensor | None = None,
           backend: str | None = None, knobs=None):
    """Draw one token id per row of ``logits`` (``[..., V]``). Returns ``(ids, logprobs)``: int64 ids of shape
    ``logits.shape[:-1]`` and float32 log-probabilities of those ids under the distribution sampled from
    (after temperature, top-k, top-p, min-p and renormalisation; 0 for greedy rows). A row with no distribution
    (a NaN or ``+inf`` logit, or every logit ``-inf``), or with a parameter out of range on a device tensor,
    gets id -1 and log-probability NaN (see the module's docstring for what is checked where). fp64 logits are
    sampled in fp32 on both backends (differences below fp32's resolution tie; magnitudes past its range
    overflow to ``inf``: id -1).

    ``uniform``: the rows' draws, floats in ``[0, 1)`` of shape ``logits.shape[:-1]`` (or one for all, a float
    too), in place of ``torch.rand`` with ``generator``: the id is the first kept token, in index order, whose
    running mass reaches past ``uniform · (mass kept)`` (both backends; values are not checked on a device).
    ``backend``: ``None`` (the kernels on CUDA, torch ops elsewhere), ``"torch"`` or ``"triton"``. ``knobs``: a
    ``topk.plan.SampleKnobs`` overriding the kernels' plan (tools, tests). The outputs carry no gradient.
    Under ``torch.compile`` a call is one custom op (``onlinesoftmax::sample``), its draws ``torch.rand`` in the
    graph; ``generator`` and ``knobs`` are not supported there.
    """
    if (type(logits) is torch.Tensor and uniform is None and backend is None and knobs is None
            and type(temperature) is float and 0.0 < temperature < math.inf
            and (top_k is None or (type(top_k) is int and top_k >= 1))
            and (top_p is None or (type(top_p) is float and 0.0 < top_p <= 1.0))
            and (min_p is None or (type(min_p) is float and 0.0 <= min_p <= 1.0))
            and (generator is None or type(generator) is torch.Generator)
            and logits.is_cuda and logits.dim() == 2 and logits.dtype in _FAST_DTYPES and _FAST_DRAW
            and triton_available()):
        # the generate loop's call: [B, V] logits on CUDA, Python parameters in range, the kernels' draw. The same
        # checks as below, done on exact types in one expression (any other argument takes the full path)
        B, V = logits.shape
        if B and V and not torch.compiler.is_compiling() and not torch._C._cuda_isCurrentStreamCapturing():
            u = _philox_state(generator, logits.device)
            if u is not None:
                return _draw(logits, (B,), B, logits.device, "triton", temperature,
                             None if top_k is None else min(top_k, V), top_p, min_p, u, NO_SAMPLE_KNOBS, generator,
                             False)
    if uniform is not None and not isinstance(uniform, torch.Tensor):
        if isinstance(uniform, bool) or not isinstance(uniform, (int, float)):
            raise TypeError(f"sample: uniform must be a float tensor, a float or None, got {type(uniform).__name__}")
        # one draw for every row, checked in [0, 1) as a CPU tensor: in fp64, the value given (a float32 tensor
        # would round 1 − 1e-9 to 1 and refuse it)
        uniform = torch.tensor(float(uniform), dtype=torch.float64)
    if torch.compiler.is_compiling() or transforms_active():
        return _sample_traced(logits, temperature, top_k, top_p, min_p, generator, uniform, backend, knobs)
    which, lead, x, B, dev, t, kk, pp, qq = _arguments(logits, temperature, top_k, top_p, min_p, backend)
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"sample: generator must be a torch.Generator or None, got {type(generator).__name__}")
        if uniform is None and generator.device.type != dev.type:
            raise ValueError(f"sample: generator is a {generator.device.type} generator and logits are on {dev}: "
                             f"draws for {dev.type} logits need a {dev.type} generator")
    if knobs is not None and not isinstance(knobs, SampleKnobs):
        raise TypeError(f"sample: knobs must be a SampleKnobs or None, got {type(knobs).__name__}")
    knobs = knobs or NO_SAMPLE_KNOBS
    if uniform is None:         # (greedy rows draw nothing: no uniforms for an all-greedy call)
        if not isinstance(t, torch.Tensor) and t == 0:
            u = None
        else:
            u = None
            if which == "triton" and B > 0 and dev.type == "cuda":
                if not torch._C._cuda_isCurrentStreamCapturing():
                    if sample_draw_of(knobs) == "kernel":
                        u = _philox_state(generator, dev)
                elif sample_graph_draw_of(knobs) == "kernel":
                    u = _graph_philox(generator, dev, B)
            if u is None:
                u = torch.rand(B, device=dev, generator=generator)
    else:
        u = _per_row(uniform, B, dev, torch.float32, "uniform", _u_ok, "in [0, 1)").reshape(-1).contiguous()
    return _draw(x, lead, B, dev, which, t, kk, pp, qq, u, knobs, generator)


_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FAST_DRAW = sample_draw_of(NO_SAMPLE_KNOBS) == "kernel"    # the default eager draw: Philox in the kernels


def _split(v, none):
    """A checked parameter as the custom op takes it: ``(tensor, 0)`` or ``(None, value)`` (``none`` for None)."""
    return (v, 0) if isinstance(v, torch.Tensor) else (None, none if v is None else v)


def _sample_traced(logits, temperature, top_k, top_p, min_p, generator, uniform, backend, knobs):
    """``sample`` under torch.compile and torch.func transforms: the same checks (a CPU tensor's values are not
    read: data-dependent), the draws ``u = torch.rand(B)`` in the graph (or ``uniform``; under ``vmap`` a draw
    follows its ``randomness``), then one custom op, ``onlinesoftmax::sample`` (its vmap rule below)."""
    which, lead, x, B, dev, t, kk, pp, qq = _arguments(logits, temperature, top_k, top_p, min_p, backend)
    if generator is not None:
        raise TypeError("sample: generator is not supported under torch.compile or torch.func transforms: draw "
                        "uniform=torch.rand(B, generator=g) outside, or leave the default generator")
    if knobs is not None:
        raise TypeError("sample: knobs are not supported under torch.compile or torch.func transforms")
    if uniform is not None:
        u = _per_row(uniform, B, dev, torch.float32, "uniform", _u_ok, "in [0, 1)").reshape(-1).contiguous()
    else:
        u = None if not isinstance(t, torch.Tensor) and t == 0 else torch.rand(B, device=dev)
    # x detached: the outputs carry no gradient (the op has no autograd; AOT autograd failed on logits requiring grad)
    ids, logp = torch.ops.onlinesoftmax.sample(x.detach(), *_split(t, 1.0), *_split(kk, 0), *_split(pp, -1.0),
                                               *_split(qq, -1.0), u, which)
    return (ids, logp) if len(lead) == 1 else (ids.reshape(lead), logp.reshape(lead))


def _sample_op_impl(x: torch.Tensor, t: torch.Tensor | None, t_value: float, k: torch.Tensor | None, k_value: int,
                    p: torch.Tensor | None, p_value: float, q: torch.Tensor | None, q_value: float,
                    u: torch.Tensor | None, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B], logp [B])`` of ``x`` ``[B, V]``: each parameter a ``[B, 1]`` tensor or a value (top_k 0, top_p
    and min_p -1: none), ``u`` the draws (None: every row greedy)."""
    B = x.shape[0]
    ids, logp = _draw(x, (B,), B, x.device, backend, t if t is not None else t_value,
                      k if k is not None else k_value or None, p if p is not None else None if p_value < 0 else p_value,
                      q if q is not None else None if q_value < 0 else q_value, u, NO_SAMPLE_KNOBS, None)
    return ids.contiguous(), logp.contiguous()


_sample_op = torch.library.custom_op("onlinesoftmax::sample", _sample_op_impl, mutates_args=())


@_sample_op.register_fake
def _(x, t, t_value, k, k_value, p, p_value, q, q_value, u, backend):
    B = x.shape[0]
    return x.new_empty((B,), dtype=torch.int64), x.new_empty((B,), dtype=torch.float32)


@_sample_op.register_vmap
def _(info, in_dims, x, t, t_value, k, k_value, p, p_value, q, q_value, u, backend):
    """Rows are independent: the vmapped dim folds into the rows (``[N, B, V]`` -> ``[N·B, V]``, each per-row
    tensor alike; an unbatched one expanded to the N copies), one call of the op, ids and logp unfolded."""
    N = info.batch_size

    def rows(a, d):
        if a is None:
            return None
        a = a.movedim(d, 0) if d is not None else a.expand(N, *a.shape)
        return a.reshape(N * a.shape[1], *a.shape[2:])

    x_d, t_d, _, k_d, _, p_d, _, q_d, _, u_d, _ = in_dims
    ids, logp = torch.ops.onlinesoftmax.sample(rows(x, x_d), rows(t, t_d), t_value, rows(k, k_d), k_value,
                                               rows(p, p_d), p_value, rows(q, q_d), q_value, rows(u, u_d), backend)
    return (ids.reshape(N, -1), logp.reshape(N, -1)), (0, 0)


def _draw(x, lead, B: int, dev, which: str, t, kk, pp, qq, u, knobs, generator, capturing=None):
    """``sample``'s result from its checked arguments (see :func:`_arguments`) and the draw ``u``; ``capturing``:
    whether the current CUDA stream is being captured, where the caller knows it (None: asked)."""
    if which == "triton" and B > 0:
        global _sample_2d
        if _sample_2d is None:
            from .sampling_launch import sample_2d as _sample_2d
        out = _sample_2d(x, t, kk, pp, qq, u, knobs, capturing)
        if out is not None:
            return out if len(lead) == 1 else (out[0].reshape(lead), out[1].reshape(lead))
        if type(u) is tuple:    # the sort path (top_k past the fused kernels) draws with torch
            u = torch.rand(B, device=dev, generator=generator)     # (a capture's slots unused: left to it)
    with torch.no_grad():       # no gradient on any path (the kernels' outputs carry none either)
        return _sample_torch(x.float(), t, kk, pp, qq, None if u is None else u.reshape(-1, 1), lead)


def explain_sample(logits: torch.Tensor, *, temperature=1.0, top_k=None, backend: str | None = None, target=None,
                   knobs=None):
    """The plan ``sample(logits, temperature=..., top_k=...)`` runs (top-p and min-p do not change it), without
    running it: a ``SamplePlan`` (``path`` "kernels" or "torch"; the candidates K and their top-k plan; the row
    kernel's chunks, 0 where it is not launched). ``target`` plans for another GPU than the logits' (e.g.
    ``onlinesoftmax.target.H200`` for a CPU or meta tensor); ``knobs`` as :func:`sample` takes them."""
    from ..target import Target, target_of
    from .plan import NO_SAMPLE_KNOBS, TORCH_SAMPLE_PLAN, sample_plan

    check_float_tensor(logits, "explain_sample: logits")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError("explain_sample: logits must have a non-empty last dimension")
    # sample's checks of what the plan reads (a per-row tensor's values are sample's to check)
    if not isinstance(temperature, torch.Tensor):
        temperature = _number(temperature, "temperature", _t_rule, "finite and >= 0", "explain_sample")
    if top_k is not None and not isinstance(top_k, torch.Tensor):
        top_k = _top_k_number(top_k, logits.shape[-1], "explain_sample")
    check_instance(knobs, SampleKnobs, "explain_sample: knobs")
    check_instance(target, Target, "explain_sample: target")
    if target is None and resolve_backend(backend, logits, "explain_sample") == "torch":
        return TORCH_SAMPLE_PLAN
    V = logits.shape[-1]
    B = logits.numel() // V
    if B == 0:
        return TORCH_SAMPLE_PLAN
    greedy = not isinstance(temperature, torch.Tensor) and temperature == 0
    k = None if greedy or isinstance(top_k, torch.Tensor) else top_k
    esize = 4 if logits.dtype == torch.float64 else logits.dtype.itemsize
    return sample_plan(B, V, esize, target or target_of(logits.device), greedy=greedy, top_k=k,
                       knobs=knobs or NO_SAMPLE_KNOBS)


def _philox_state(generator, dev: torch.device) -> tuple | None:
    """The kernels' Philox key and counter words from ``generator`` (None: the device's default CUDA generator),
    whose offset then advances by 4 (one counter per row: row r draws from subsequence r at that offset); None for
    a generator that is not a CUDA one (the caller's checked path then raises ``sample``'s error).

    Only the device *type* is compared, as torch's own kernels do: ``torch.Generator(device="cuda")`` has the device
    ``cuda`` (no index), which is not equal to the logits' ``cuda:0``, and torch draws with it on any CUDA device.
    (Comparing whole devices once sent such a generator to a one-element ``torch.rand``, whose tensor the kernels
    then read as every row's u: rows past 0 read past its end, ids skewed on the H200.)"""
    gen = generator if generator is not None else torch.cuda.default_generators[dev.index]
    if gen.device.type != dev.type:
        return None
    offset = gen.get_offset()
    gen.set_offset(offset + 4)
    return philox_words(gen.initial_seed(), offset)


GRAPH_RESERVE = 4 << 32     # generator offsets a capture takes: 2^32 replays' counters (sampling_kernels.GRAPH_REPLAYS)
_graph_slots: list = []     # every capture's slots, held for the graphs that read them (B int64 each)
_side_streams: dict = {}    # per device: a stream not being captured, to read the generator during a capture


def _graph_philox(generator, dev: torch.device, B: int) -> tuple | None:
    """The kernels' draw in a call being captured into a CUDA graph (``graph_draw`` "kernel", the default):
    ``(slots, s0, s1, c0, c1, g0, g1)``, or None (the caller's ``torch.rand`` then, as for a CPU generator).

    The key is the generator's seed at capture and the base counter its offset / 4 then; the generator's offset
    then moves on by ``GRAPH_RESERVE`` (so eager calls and other captures draw from other counters). ``slots``:
    an int64 per row (from the graph's memory pool, held here for as long as the process runs: B·8 bytes per
    capture), holding g + n after n replays, g a random 62-bit tag of this capture, (g0, g1) its words; memory the
    capture never wrote reads as n = 0 (a wrong start has odds 2^32 / 2^64 for random contents). Replay n of row r
    draws at counter (c + n, r, 0): fresh uniforms on every replay, the same sequence for the same generator state
    at capture, but not the ``torch.rand`` stream, nor an eager call's, and replays do not move the generator (it
    needs no ``register_generator_state``).

    torch exposes no device pointer to its own graph-safe Philox state (``PhiloxCudaState``'s seed and offset
    tensors live in the C++ generator's per-capture state; ``graphsafe_get_state`` returns a ``Generator``), and
    a generator's seed and offset cannot be read on a capturing stream: they are read with a side stream current.
    The kernels of this draw (``PHILOX`` 2) are not those of an eager call: ``onlinesoftmax.warmup`` compiles them
    (:func:`_warm_capture_draw`); a problem it did not warm compiles them inside its first capture."""
    gen = generator if generator is not None else torch.cuda.default_generators[dev.index]
    if gen.device.type != dev.type:
        return None
    side = _side_streams.get(dev.index)
    if side is None or side == torch.cuda.current_stream(dev):
        side = _side_streams[dev.index] = torch.cuda.Stream(dev)
        if side == torch.cuda.current_stream(dev):      # the pool's round robin handed out the capturing stream
            side = _side_streams[dev.index] = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        seed, offset = gen.initial_seed(), gen.get_offset()
        gen.set_offset(offset + GRAPH_RESERVE)
    slots = torch.empty(B, device=dev, dtype=torch.int64)      # on the capturing stream: the graph's pool
    _graph_slots.append(slots)
    tag = int.from_bytes(os.urandom(8), "little") >> 2
    return (slots, *philox_words(seed, offset), _int32(tag & 0xFFFFFFFF), _int32(tag >> 32))


def _warm_capture_draw(logits: torch.Tensor, *, temperature=1.0, top_k=None, top_p=None, min_p=None,
                       backend: str | None = None, knobs=None) -> bool:
    """Compile, without capturing a graph, the kernels that ``sample(logits, ...)`` launches while being captured
    into a CUDA graph (:func:`onlinesoftmax.warmup` calls it beside each of its ``sample`` calls): one eager launch
    of them with the capture's form of u, ``(slots, s0, s1, c0, c1, g0, g1)`` with zeroed slots (``graph_draw``
    "kernel": ``PHILOX`` 2, not the eager call's 1) or a float32 u (``graph_draw`` "torch"). Returns whether it
    launched: not for an all-greedy call (nothing drawn: a capture launches the eager call's kernels), nor off the
    kernels (the torch path compiles nothing). Its ids are not a draw of any generator's."""
    which, _, x, B, dev, t, kk, pp, qq = _arguments(logits, temperature, top_k, top_p, min_p, backend)
    if which != "triton" or B == 0 or (not isinstance(t, torch.Tensor) and t == 0):
        return False
    knobs = knobs or NO_SAMPLE_KNOBS
    if sample_graph_draw_of(knobs) == "kernel":
        u = (torch.zeros(B, device=dev, dtype=torch.int64), 1, 2, 3, 4, 5, 6)
    else:
        u = torch.zeros(B, device=dev)
    global _sample_2d
    if _sample_2d is None:
        from .sampling_launch import sample_2d as _sample_2d
    return _sample_2d(x, t, kk, pp, qq, u, knobs) is not None


def _int32(w: int) -> int:
    """A 32-bit word as a signed int (Triton types a Python int in [-2^31, 2^31) as int32: one compiled kernel)."""
    return w - ((w >> 31) << 32)


def philox_words(seed: int, offset: int) -> tuple:
    """``(s0, s1, c0, c1)``: the Philox key (a 64-bit ``seed``) and the counter ``offset / 4`` (``offset`` a
    generator's Philox offset, a multiple of 4), low and high 32-bit words, as the kernels take them."""
    c = offset >> 2
    s0, s1, c0, c1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, c & 0xFFFFFFFF, (c >> 32) & 0xFFFFFFFF
    return s0 - ((s0 >> 31) << 32), s1 - ((s1 >> 31) << 32), c0 - ((c0 >> 31) << 32), c1 - ((c1 >> 31) << 32)


def _u_ok(u):
    return (u >= 0) & (u < 1)


def _inverse_cdf(w: torch.Tensor, cand: torch.Tensor | None, u: torch.Tensor) -> torch.Tensor:
    """Positions in ``w`` ``[B, n]`` (weights >= 0, some > 0 per row) of the draws ``u`` ``[B, 1]``: the first
    entry, in the order of the token ids ``cand`` (None: w's own order), whose running weight exceeds ``u · Σ w``,
    never one of weight 0."""
    order = None
    if cand is not None:
        cand, order = torch.sort(cand, dim=-1)
        w = w.gather(-1, order)
    cs = torch.cumsum(w, dim=-1)
    pos = (cs <= u * w.sum(-1, keepdim=True)).sum(-1, keepdim=True)
    n = w.shape[-1]
    last = torch.where(w > 0, torch.arange(n, device=w.device), 0).amax(-1, keepdim=True)
    pos = torch.minimum(pos, last)
    return pos if order is None else order.gather(-1, pos)


def _sample_torch(x, t, kk, pp, qq, u, lead):
    """The portable path (any device; the CPU's): torch ops. ``t``, ``kk``, ``pp``, ``qq``: Python values, None,
    or ``[B, 1]`` tensors on x's device; ``u`` the draws ``[B, 1]``."""
    B, V = x.shape
    dev = x.device
    bad = None                                              # rows whose device-tensor parameters are out of range
    per_row_t = isinstance(t, torch.Tensor)
    if per_row_t:
        bad = ~_t_ok(t)
        greedy = t == 0
        z = x / torch.where(greedy, torch.ones_like(t), t)
    elif t == 0:                                            # every row greedy: the argmax, nothing drawn
        ids = torch.argmax(x, dim=-1, keepdim=True)
        undefined = ~torch.isfinite(x.gather(-1, ids))
        return _result(ids, torch.zeros_like(ids, dtype=torch.float32), undefined, None, lead)
    else:
        z = x if t == 1 else x / t
    for v, ok in ((pp, _p_ok), (qq, _q_ok)):
        if isinstance(v, torch.Tensor):
            bad = ~ok(v) if bad is None else bad | ~ok(v)
    if qq is not None and not isinstance(qq, torch.Tensor) and qq == 0:
        qq = None
    if kk is None and pp is None:
        # the whole row: no sort, no top-k. log p = (z - m) - log d, exact at any magnitude of z
        m, top = torch.max(z, dim=-1, keepdim=True)          # NaN if the row holds one
        p = torch.softmax(z, dim=-1)
        w = p if qq is None else torch.where(p >= qq * p.gather(-1, top), p, torch.zeros_like(p))
        pick = _inverse_cdf(torch.nan_to_num(w), None, u)
        logp = (z.gather(-1, pick) - m) + torch.log(p.gather(-1, top))     # p(argmax) = 1 / d
        if qq is not None:
            logp = logp - torch.log(w.sum(-1, keepdim=True))
        ids = pick
        undefined = ~torch.isfinite(m)
    else:
        if isinstance(kk, int):
            probs, cand, lse = softmax_topk(z, kk, backend="torch")     # sorted descending, ties to the lower index
            undefined = ~torch.isfinite(lse).unsqueeze(-1)
            keep = None
        else:
            zs, cand = torch.sort(z, dim=-1, descending=True, stable=True)
            probs = torch.softmax(zs, dim=-1)
            undefined = ~torch.isfinite(zs[:, :1])          # NaN sorts first: the row's maximum, or NaN
            keep = None
            if kk is not None:
                kr = torch.where((kk < 1) | (kk > V), torch.full_like(kk, V), kk)   # 0 (or less): no top-k
                keep = torch.arange(V, device=dev).unsqueeze(0) < kr
        w = probs if keep is None else torch.where(keep, probs, torch.zeros_like(probs))
        if pp is not None:
            before = torch.cumsum(w, dim=-1) - w                         # mass strictly before each position
            cut = before < pp * w.sum(-1, keepdim=True)
            cut[:, :1] = True
            w = torch.where(cut, w, torch.zeros_like(w))
            keep = cut if keep is None else keep & cut
        if qq is not None:
            cut = probs >= qq * probs[:, :1]
            w = torch.where(cut, w, torch.zeros_like(w))
            keep = cut if keep is None else keep & cut
        if keep is not None and dev.type == "cpu" and w.shape[-1] > 256:
            # the kept positions are a prefix of each row: on the CPU (reading its length is free) the race runs
            # over the longest one, not over V (Exp(1) draws for every entry: most of the sort path's time after
            # the sort)
            n = max(int(keep.sum(-1).max()) if keep.numel() else 1, 1)
            w, cand = w[:, :n], cand[:, :n]
        total = w.sum(-1, keepdim=True)
        pos = _inverse_cdf(torch.nan_to_num(w), cand, u)
        ids = cand.gather(-1, pos)
        logp = torch.log(w.gather(-1, pos) / total)
    # greedy rows: argmax of the logits (lowest index among ties), probability 1
    if per_row_t:
        first = torch.argmax(x, dim=-1, keepdim=True)
        ids = torch.where(greedy, first, ids)
        logp = torch.where(greedy, torch.zeros_like(logp), logp)
    return _result(ids, logp, undefined, bad, lead)


def _result(ids, logp, undefined, bad, lead):
    """``(ids, logp)`` shaped ``lead``: -1 and NaN on rows with no distribution or a parameter out of range."""
    if bad is not None:
        undefined = undefined | bad
    ids = torch.where(undefined, torch.full_like(ids, -1), ids)
    logp = torch.where(undefined, torch.full_like(logp, float("nan")), logp.float())
    return ids.reshape(lead), logp.reshape(lead)
