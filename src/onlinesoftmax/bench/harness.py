"""Benchmark harness: suites, the copy ceiling measured in the same run, timing, rotation past L2.

A suite is a function ``suite(ctx) -> Iterable[Case]`` registered with :func:`register_suite`. Each
:class:`Case` names its implementations (ours and the peers), the bytes and FLOPs it must move / do at
least, and a maker of fresh random inputs. The harness

1. measures the device-to-device copy ceiling once per run (bytes read + bytes written),
2. builds enough input sets to rotate past the L2 cache (GPU) and checks every implementation's output
   against the peer's on fresh inputs before timing it,
3. times each implementation (``triton.testing.do_bench`` median on GPU, a median wall-clock timer on CPU),
4. returns one :class:`Row` per (case, implementation) with GB/s or TFLOP/s, % of the ceiling and the
   speed-up over the case's peer.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

SUITES: dict[str, Callable[[BenchContext], Iterable[Case]]] = {}
X_LABELS: dict[str, str] = {}       # suite -> what its cases' x is (the plot's x-axis label)

# Rotate through input sets totalling at least this many times the L2 size, so no timed call hits L2.
L2_ROTATION_FACTOR = 3
CPU_CACHE_BYTES = 64 << 20          # stands in for L2 on a CPU
GPU_CEILING_BYTES = 2 << 30         # copy ceiling: 2 GiB source (4 GiB moved per call)
CPU_CEILING_BYTES = 256 << 20
MAX_INPUT_SETS = 16
CPU_WARMUP = 3                      # CPU timing: calls before the clock starts, then samples until the budget
CPU_MIN_SAMPLES = 15
HOST_CALLS = 200                    # host timing: eager calls per sample (a loop the host, not the device, bounds)


class Skip(Exception):
    """Raised by a suite that cannot run on this device; the runner prints the reason instead of a table."""


def register_suite(name: str, x_label: str = "N"):
    """Decorator: make ``fn(ctx) -> Iterable[Case]`` runnable as ``onlinesoftmax bench NAME``; ``x_label`` names
    the cases' ``x`` in the plot."""
    def deco(fn):
        if name in SUITES:
            raise ValueError(f"benchmark suite {name!r} registered twice")
        SUITES[name] = fn
        X_LABELS[name] = x_label
        return fn
    return deco


@dataclass
class BenchContext:
    device: torch.device
    quick: bool = False
    dtypes: tuple[torch.dtype, ...] | None = None   # None: each suite's default

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def want(self, dtype: torch.dtype) -> bool:
        return self.dtypes is None or dtype in self.dtypes


@dataclass
class Case:
    """One shape of one suite: ``impls`` maps a name to ``fn(*inputs)``; ``peer`` names the baseline."""

    label: str
    shape: tuple
    dtype: torch.dtype
    make_inputs: Callable[[], tuple]
    impls: dict[str, Callable]
    peer: str
    bytes: int = 0              # fewest bytes the op must move (each input read once, output written once)
    flops: int = 0
    x: float | None = None      # x-axis value for the suite's plot (e.g. N)
    group: str = ""             # plot panel (e.g. "fp32, M*N = 64M")
    check: Callable | None = None   # check(out, peer_out): raise on mismatch; default torch.testing
    timing: str = "device"      # "device": the op's time on the device; "host": host time per eager call;
                                # "given": impls map each name to a time in ms measured elsewhere
    impl_info: dict[str, dict] = field(default_factory=dict)   # impl -> extra columns, copied to Row.info
    unchecked: tuple[str, ...] = ()  # impls timed as a yardstick, not the op (e.g. a copy of x): output not checked
    # inputs [0..k) are read-only; outputs the op allocates itself are what the timing includes.


@dataclass
class Row:
    suite: str
    case: str
    impl: str
    shape: str
    dtype: str
    ms: float | None
    gbps: float | None
    tflops: float | None
    pct_ceiling: float | None
    speedup_vs_peer: float | None
    peer: str
    ok: bool
    note: str = ""
    x: float | None = None
    group: str = ""
    meta: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)   # the case's impl_info[impl]: extra report columns

    def as_dict(self) -> dict:
        return asdict(self)


def environment() -> dict:
    """What every row records: device, versions, commit, time, the exact command."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = f"{props.name} ({props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MB)"
    else:
        device = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} threads)"
    return {
        "device": device,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["onlinesoftmax"] + sys.argv[1:]) if sys.argv else "",
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "cpu_threads": torch.get_num_threads(),
    }


def git_commit() -> str:
    """``ONLINESOFTMAX_COMMIT`` when set (the device's copy of the tree may carry a stale ``.git``), else git."""
    if os.environ.get("ONLINESOFTMAX_COMMIT"):
        return os.environ["ONLINESOFTMAX_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "") if sha else "unknown"


def cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return CPU_CACHE_BYTES


def time_ms(fn: Callable[[], object], device: torch.device, quick: bool = False) -> float:
    """Median time of ``fn()`` in milliseconds: ``triton.testing.do_bench`` on the GPU; on the CPU a median
    wall-clock time after CPU_WARMUP calls, over at least CPU_MIN_SAMPLES calls and a time budget."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100,
                              return_mode="median"))
    for _ in range(CPU_WARMUP):
        fn()
    budget_s = 0.1 if quick else 0.5
    times = []
    t_end = time.perf_counter() + budget_s
    while len(times) < CPU_MIN_SAMPLES or (time.perf_counter() < t_end and len(times) < 400):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def host_ms(fn: Callable[[], object], device: torch.device, quick: bool = False) -> float:
    """Host time per call of a loop of eager calls (what a Python loop of tiny ops pays), in milliseconds: the
    median over several samples of HOST_CALLS calls each, the device synchronised before and after a sample."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(20):
        fn()
    samples = []
    for _ in range(3 if quick else 7):
        sync()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / HOST_CALLS)
    return statistics.median(samples) * 1e3


def copy_ceiling_gbps(device: torch.device, quick: bool = False) -> float:
    """Device-to-device copy bandwidth, bytes read + bytes written over the median time."""
    nbytes = GPU_CEILING_BYTES if device.type == "cuda" else CPU_CEILING_BYTES
    if quick:
        nbytes //= 2
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, quick)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


def _default_check(out, ref):
    if isinstance(out, (tuple, list)):
        for o, r in zip(out, ref):
            _default_check(o, r)
        return
    if isinstance(out, torch.Tensor):
        if out.is_floating_point():
            tol = {torch.float32: 1e-4, torch.float64: 1e-10}.get(out.dtype, 2e-2)
            torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol, equal_nan=True)
        else:
            torch.testing.assert_close(out, ref)


def _timed(case: Case, ctx: BenchContext) -> tuple[dict, list]:
    """Check every implementation against the peer, then time it: {name: (ms, ok, note)}, names in order."""
    first = case.make_inputs()
    per_set = max(_tensor_bytes(first), 1)
    target = L2_ROTATION_FACTOR * cache_bytes(ctx.device)
    n_sets = min(MAX_INPUT_SETS, max(1, math.ceil(target / per_set)))
    sets = [first] + [case.make_inputs() for _ in range(n_sets - 1)]
    check = case.check or _default_check

    peer_fn = case.impls[case.peer]
    peer_out = peer_fn(*sets[0])
    names = [case.peer] + [n for n in case.impls if n != case.peer]
    results = {}
    for name in names:
        fn = case.impls[name]
        ok, note = True, ""
        try:
            out = fn(*sets[0])
            if name in case.unchecked:
                note = "yardstick, not the op: output not checked"
            else:
                check(out, peer_out)
        except AssertionError as e:
            ok, note = False, f"mismatch vs {case.peer}: {str(e).splitlines()[0][:160]}"
        except Exception as e:  # an implementation that cannot run this case is reported, not fatal
            results[name] = (None, False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        state = {"i": 0}

        def call(fn=fn, state=state):
            args = sets[state["i"] % n_sets]
            state["i"] += 1
            return fn(*args)

        ms = (host_ms if case.timing == "host" else time_ms)(call, ctx.device, ctx.quick)
        results[name] = (ms, ok, note)
    return results, names


def run_case(suite: str, case: Case, ctx: BenchContext, ceiling: float, env: dict) -> list[Row]:
    if case.timing == "given":      # measured elsewhere (several processes, checks done there): impls hold the ms
        names = [case.peer] + [n for n in case.impls if n != case.peer]
        results = {n: (case.impls[n], True, "measured in the ranks' processes") for n in names}
    else:
        results, names = _timed(case, ctx)
    rows = []
    peer_ms = results.get(case.peer, (None,))[0]
    for name in names:
        ms, ok, note = results[name]
        gbps = case.bytes / (ms * 1e-3) / 1e9 if ms and case.bytes else None
        tflops = case.flops / (ms * 1e-3) / 1e12 if ms and case.flops else None
        rows.append(Row(
            suite=suite, case=case.label, impl=name, shape="x".join(map(str, case.shape)),
            dtype=str(case.dtype).replace("torch.", ""), ms=ms, gbps=gbps, tflops=tflops,
            pct_ceiling=100 * gbps / ceiling if gbps and ctx.is_cuda else None,   # a CPU op reads from cache
            speedup_vs_peer=peer_ms / ms if ms and peer_ms else None, peer=case.peer, ok=ok,
            note=note, x=case.x, group=case.group, meta=env,
            info=dict(case.impl_info.get(name, {}), **({"timing": "host"} if case.timing == "host" else {}))))
    return rows
