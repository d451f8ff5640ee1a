"""Launch machinery every op family shares: pre-bound launches, per-stream workspace, the one bounded cache.

A decode-sized op must cost a few µs of host time, not tens. ``kernel[grid](*args, **meta)`` binds and
specialises every argument on every call (Triton's ``JITFunction.run``: argument binding, the specialisation key,
the device and stream look-ups): 12.6-21 µs for an empty kernel on the H200 machine's host, against about 8 µs of
GPU time for a whole 1 x 128K softmax.

A :class:`BoundKernel` is one launch configuration whose run-time integers (sizes, strides, grid), tensor dtypes
and constexprs are fixed (a cached plan, or :func:`launch`'s key). The only thing that can then change Triton's
specialisation between two calls is the 16-byte alignment of the tensors' data pointers, so the compiled kernel
is kept per (alignment, device) and later calls go straight to its C launcher. Under the interpreter, or with
Triton launch hooks installed (profilers), every call takes Triton's own path.
"""

from __future__ import annotations

import collections

import torch
import triton
from triton import knobs

from ..backend import interpret_mode
from .host import cached, pow2  # noqa: F401  (the families import them from here too)

if hasattr(torch._C, "_cuda_getCurrentRawStream"):      # what Triton's own launcher calls
    current_device = torch._C._cuda_getDevice
    current_stream = torch._C._cuda_getCurrentRawStream   # the raw cudaStream_t of a device's current stream
else:                                                    # a torch built without CUDA: no launch comes here
    current_device = torch.cuda.current_device

    def current_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


_scratch: dict = {}
GRAPH_RESERVE = 4          # pre-zeroed buffers kept per device for workspace captured into CUDA graphs ...
GRAPH_RESERVE_BYTES = 8192  # ... of this many bytes each (the softmax barrier's two int32 words for 1024 rows)
_reserve: dict = {}        # device -> pre-zeroed uint8 buffers not yet given to a graph
_held_by_graphs: list = []  # reserve buffers given to captured graphs: kept alive, a graph may replay at any time


def _view_bytes(layout: tuple) -> list[int]:
    """Bytes each ``(numel, dtype)`` view of ``layout`` takes in a buffer, rounded up to 16."""
    return [-(-n * dt.itemsize // 16) * 16 for n, dt in layout]


def _buffer(layout: tuple, device: torch.device, zeroed: bool) -> torch.Tensor:
    """A uint8 buffer for ``layout``'s views: ``torch.zeros`` or ``torch.empty``."""
    return (torch.zeros if zeroed else torch.empty)(sum(_view_bytes(layout)), dtype=torch.uint8, device=device)


def _carve(buf: torch.Tensor, layout: tuple) -> tuple:
    """One view per ``(numel, dtype)`` of ``layout`` from the uint8 ``buf``, each starting 16-byte aligned."""
    nbytes = _view_bytes(layout)
    starts = [sum(nbytes[:i]) for i in range(len(layout))]
    return tuple(buf[o:o + n * dt.itemsize].view(dt) for o, (n, dt) in zip(starts, layout))


def stream_scratch(tag, device: torch.device, layout: tuple, zeroed: int | None = None) -> tuple:
    """Workspace: one view per ``(numel, dtype)`` of ``layout``, cached per (``tag``, device, current stream). The
    first ``zeroed`` views (all by default) start zero-initialised: kernels must leave them as they found them,
    nothing is cleared between launches; the others hold whatever the last launch wrote.

    Every view starts 16-byte aligned (a :class:`BoundKernel` takes workspace pointers as aligned) and holds at
    least its ``numel``. The views keep their sizes and offsets until a request outgrows one; then all are carved
    again, no smaller, from a new zeroed buffer. A request under the same tag with another number of views or
    other dtypes gets a new buffer of its own layout.

    While a CUDA graph is being captured the caller gets buffers of its own (the graph may replay on any stream),
    and nothing is zeroed inside the graph: a zeroing captured there would run before every replay (a 520 KB
    memset node per softmax call in a graph: 0.8-1.7 µs more per decode-sized replay on the H200). The views
    past ``zeroed`` come from ``torch.empty``; the zeroed ones from a reserve of buffers zeroed outside the capture
    (GRAPH_RESERVE per device, topped up by eager calls: the first on a device, and the first after captures took
    some, waits once for the stream, so that a replay on another stream finds them zeroed), which are then kept
    alive for good. Only a capture that finds the reserve empty (no eager call since GRAPH_RESERVE earlier
    captures) or too small zeroes its words inside the graph.
    """
    zeroed = len(layout) if zeroed is None else zeroed
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if capturing:
        return _captured_scratch(device, layout, zeroed)
    if zeroed and device.type == "cuda":
        _top_up_reserve(device)
    key = (tag, device, current_stream(current_device()) if device.type == "cuda" else None)
    views = _scratch.get(key)
    if views is not None and len(views) == len(layout):
        if all(v.numel() >= n and v.dtype == dt for v, (n, dt) in zip(views, layout)):
            return views
        if all(v.dtype == dt for v, (_, dt) in zip(views, layout)):      # outgrown: carved again, no smaller
            layout = tuple((max(n, v.numel()), dt) for v, (n, dt) in zip(views, layout))
    views = _scratch[key] = _carve(_buffer(layout, device, zeroed=True), layout)
    return views


def _top_up_reserve(device: torch.device) -> None:
    free = _reserve.setdefault(device, [])
    if len(free) < GRAPH_RESERVE:
        free.extend(torch.zeros(GRAPH_RESERVE_BYTES, dtype=torch.uint8, device=device)
                    for _ in range(GRAPH_RESERVE - len(free)))
        if device.type == "cuda":       # zero before any capture (which may replay on another stream) uses them
            torch.cuda.current_stream(device).synchronize()


def _captured_scratch(device: torch.device, layout: tuple, zeroed: int) -> tuple:
    """stream_scratch's views for a launch being captured into a CUDA graph (see there)."""
    head, tail = layout[:zeroed], layout[zeroed:]
    views = ()                          # nothing to zero (top-k): no allocation, no memset
    if head:
        buf = _take_reserved(device, sum(_view_bytes(head)))
        views = _carve(buf if buf is not None else _buffer(head, device, zeroed=True), head)   # else: a memset node
    return views + _carve(_buffer(tail, device, zeroed=False), tail)


def _take_reserved(device: torch.device, nbytes: int) -> torch.Tensor | None:
    """A pre-zeroed reserve buffer of at least ``nbytes``, from then on held for good; None where the reserve is
    empty or its buffers too small. Popped at once: each buffer goes to one capture, whichever thread asks."""
    if nbytes > GRAPH_RESERVE_BYTES:
        return None
    try:
        buf = _reserve.get(device, []).pop()
    except IndexError:
        return None
    _held_by_graphs.append(buf)
    return buf


def raw_launches(device: torch.device) -> bool:
    """Whether calls on ``device`` may go straight to the compiled kernels' C launchers (CUDA, no interpreter)."""
    return device.type == "cuda" and not interpret_mode()


class Slot:
    """A per-call argument's place in a lane bound once (compared by identity): the families' bound calls lay a
    launch's arguments out once and put each call's values in by position."""

    __slots__ = ()


def hooks_installed() -> bool:
    hook = knobs.runtime.launch_enter_hook          # a HookChain in Triton 3.6 (a callable or None before)
    return bool(getattr(hook, "calls", hook))


def compile_key(index: int, check: tuple) -> tuple:
    """Which compiled variant a launch with the tensors ``check`` takes on device ``index``: Triton specialises each
    pointer on 16-byte alignment, so the key holds True where all are aligned (the case :meth:`BoundKernel.entry`
    callers look up), else the alignment of each (a kernel compiled with q misaligned assumes k aligned), and their
    dtypes."""
    if not any(t.data_ptr() & 15 for t in check):
        return (index, True, *(t.dtype for t in check))
    return (index, tuple(not t.data_ptr() & 15 for t in check), *(t.dtype for t in check))


class BoundKernel:
    """``fn[grid](*args, **meta)`` with Triton's per-call binding done once, for args whose non-tensor values are
    the same on every call (the caller's plan fixes them). The compiled kernel is kept per device, pointer
    alignments and dtypes of the ``check`` tensors (:func:`compile_key`): a caller whose plan does not fix x's dtype
    (top-k's launches are cached by shape) still gets a kernel compiled for it.

    ``meta`` names every constexpr parameter plus launch options (``num_warps``).
    """

    __slots__ = ("fn", "grid", "meta", "tail", "interpret", "_compiled")

    def __init__(self, fn: triton.JITFunction, grid: tuple, meta: dict):
        self.fn, self.grid, self.meta, self.tail = fn, grid, meta, ()
        self.interpret = interpret_mode()
        self._compiled: dict = {}

    def __call__(self, args: tuple, check: tuple, device: torch.device):
        """Launch on the current stream; ``check``: the tensors of ``args`` that may be misaligned (the caller's;
        workspace from :func:`stream_scratch` is always aligned). Returns the compiled kernel."""
        if device.type != "cuda" or self.interpret or hooks_installed():
            return self.fn[self.grid](*args, **self.meta)
        index = current_device()              # Triton launches on the current device, as here
        key = compile_key(index, check)
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.fn[self.grid](*args, **self.meta)
            self._compiled[key] = self._bind(compiled)
            return compiled
        launcher, head, compiled = entry
        launcher(*head[:3], current_stream(index), *head[3:], *args, *self.tail)
        return compiled

    def entry(self, key: tuple) -> tuple | None:
        """``(launch, head, tail)`` of the kernel compiled for ``key`` = (device index, all ``check`` pointers
        16-byte aligned, their dtypes), None before its first launch: ``launch(*head[:3], stream, *head[3:],
        *args, *tail)`` runs it, and a pointer of ``args`` may be an int (``data_ptr()``: the C launcher then
        skips its ``data_ptr`` call and its driver query of the pointer's attributes). For callers that keep
        their own per-problem state and check alignment themselves (``topk/sampling_launch.py``)."""
        e = self._compiled.get(key)
        return None if e is None else (e[0], e[1], self.tail)

    def lane(self, index: int) -> tuple | None:
        """``(launch, head[:3], head[3:], tail)`` of the kernel compiled for device ``index`` and no ``check``
        tensors, None before its first launch there: ``launch(*head3, stream, *head9, *args, *tail)`` runs it with
        the pointers of ``args`` as ints (see :meth:`entry`). For bound launches whose problem fixes every
        tensor's dtype and alignment (softmax's)."""
        e = self._compiled.get((index, True))
        return None if e is None else (e[0], e[1][:3], e[1][3:], self.tail)

    def _bind(self, compiled):
        # the C launcher takes every parameter in order, constexprs included (it skips them)
        self.tail = tuple(self.meta[p.name] for p in self.fn.params if p.is_constexpr)
        g = (tuple(self.grid) + (1, 1))[:3]
        run = compiled.run
        if (getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
                or not hasattr(run, "launch")):
            # scratch to allocate per launch (or another launcher): Triton's launcher object does it
            return run, (*g, compiled.function, compiled.packed_metadata, None, None, None), compiled
        head = (*g, compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                compiled.packed_metadata, None, None, None)
        return run.launch, head, compiled


# ---- host TMA descriptors -----------------------------------------------------------------------------------
TMA_ARG_CACHE = 1024    # encoded descriptors kept per compiled kernel (a model step's layers × 4 descriptors; about
                        # 0.4 KB each); 0: Triton's launcher encodes every call


def tensordesc_launcher(launch, n: int):
    """``(C launcher, descriptor metadata)`` behind Triton 3.6's ``wrap_handle_tensordesc`` wrapper, when the
    kernel's first ``n`` parameters, and no other, are host descriptors lowered to TMA maps; None for any other
    launcher (another Triton, descriptors lowered to pointers, fp4 padding): the caller then keeps the wrapper."""
    code = getattr(launch, "__code__", None)
    if code is None or getattr(launch, "__qualname__", "") != "wrap_handle_tensordesc.<locals>.inner":
        return None
    from triton.backends.nvidia import driver

    if getattr(driver, "_BASE_ARGS_FORMAT_LEN", None) != 13 or not callable(getattr(driver, "make_tensordesc_arg",
                                                                                    None)):
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
    raw, indices, metas = cells.get("launcher"), cells.get("tensordesc_indices"), cells.get("tensordesc_meta")
    if not callable(raw) or indices != set(range(n)) or not isinstance(metas, list) or len(metas) != n:
        return None
    if any(not isinstance(m, dict) or m.get("fp4_padded", True) for m in metas):
        return None
    return raw, tuple(metas)


def _descriptor(t: torch.Tensor, block: list, layout):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


class DescriptorKernel(BoundKernel):
    """A :class:`BoundKernel` whose first ``len(boxes)`` parameters are Gluon host descriptors (``TensorDescriptor``)
    over tensors the caller passes as they are: ``boxes[i] = (block_shape, layout)`` of descriptor i, fixed by the
    caller's plan. The descriptor tensors must be among ``check`` (their dtype and alignment pick the compiled
    kernel).

    Triton's launcher encodes each descriptor into a TMA map (``cuTensorMapEncodeTiled``) on every launch, through a
    Python wrapper. Here the wrapper's output for descriptor i, ``[map, *shape, *strides]``, is kept in an LRU of
    TMA_ARG_CACHE entries per compiled kernel, keyed by (i, data pointer, shape, strides, dtype): with the kernel's
    box, swizzle, element type and padding (fixed per i by the compiled kernel) that is everything the map
    encodes, so a hit is the map a fresh encoding would give. The C launcher then gets the arguments expanded.
    Where the launcher is not the wrapper this expects (:func:`tensordesc_launcher`), or TMA_ARG_CACHE is 0, each
    call passes fresh descriptors to Triton's launcher."""

    __slots__ = ("boxes",)

    def __init__(self, fn: triton.JITFunction, grid: tuple, meta: dict, boxes: tuple):
        super().__init__(fn, grid, meta)
        self.boxes = boxes

    def descriptors(self, args: tuple) -> tuple:
        """``args`` with its first tensors wrapped in the descriptors Triton's own launch path takes."""
        n = len(self.boxes)
        return (*(_descriptor(t, *box) for t, box in zip(args[:n], self.boxes)), *args[n:])

    def __call__(self, args: tuple, check: tuple, device: torch.device):
        if device.type != "cuda" or self.interpret or hooks_installed():
            return self.fn[self.grid](*self.descriptors(args), **self.meta)
        index = current_device()
        key = compile_key(index, check)
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.fn[self.grid](*self.descriptors(args), **self.meta)
            self._compiled[key] = self._bind(compiled)
            return compiled
        self.run(entry, args, current_stream(index))
        return entry[2]

    def run(self, entry: tuple, args: tuple, stream: int) -> None:
        """Launch ``entry`` (:meth:`_bind`'s) on ``stream``: the C launcher with the descriptors' cached encodings,
        or Triton's launcher with fresh descriptors."""
        launcher, head, _, unwrapped, maps = entry
        if unwrapped is None or TMA_ARG_CACHE <= 0:
            launcher(*head[:3], stream, *head[3:], *self.descriptors(args), *self.tail)
            return
        raw, metas = unwrapped
        n = len(metas)
        flat = []
        for i in range(n):
            t = args[i]
            key = (i, t.data_ptr(), t.shape, t.stride(), t.dtype)
            enc = maps.get(key)
            try:                # (KeyError: another thread's launch evicted the key or emptied the cache)
                if enc is None:
                    enc = maps[key] = self.encode(i, t, metas[i])
                    while len(maps) > TMA_ARG_CACHE:
                        maps.popitem(last=False)
                else:
                    maps.move_to_end(key)
            except KeyError:
                pass
            flat += enc
        raw(*head[:3], stream, *head[3:], *flat, *args[n:], *self.tail)

    def encode(self, i: int, t: torch.Tensor, meta: dict) -> list:
        """Triton's own expansion of descriptor i over ``t``: ``[TMA map, *shape, *strides]``."""
        from triton.backends.nvidia.driver import make_tensordesc_arg

        return make_tensordesc_arg(_descriptor(t, *self.boxes[i]), meta)

    def _bind(self, compiled):
        launcher, head, compiled = super()._bind(compiled)
        return launcher, head, compiled, tensordesc_launcher(launcher, len(self.boxes)), collections.OrderedDict()
