"""The GPU a plan is made for: :class:`Target`, built from a device and passed to every plan function.

Plans are pure functions of (problem, target). Tables tuned on the H200 (shared-memory kernels sized for 228 KB per
SM, the Gluon ``cp.async`` kernels) apply where ``target.arch == 90`` only; every other target gets the portable
Triton kernels, which are correct and compile on any CUDA GPU Triton supports (and in the CPU interpreter).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["A100", "H200", "INTERPRETER", "L4", "Target", "target_of"]


@dataclass(frozen=True)
class Target:
    """What a plan needs to know about the GPU.

    ``arch``: compute capability as ``10 * major + minor`` (90 for H100 / H200), 0 for the CPU interpreter;
    ``sm_count``: streaming multiprocessors; ``smem_per_sm``: shared memory per SM in bytes; ``l2_bytes``: L2 size;
    ``interpret``: Triton's CPU interpreter (``TRITON_INTERPRET=1``), which runs programs one after another, so no
    kernel whose programs wait on each other may be chosen.
    """

    arch: int
    sm_count: int
    smem_per_sm: int
    l2_bytes: int
    interpret: bool = False

    @property
    def sm90(self) -> bool:
        """The architecture the tuned tables were measured on (H200); Gluon shared-memory kernels run here only."""
        return self.arch == 90 and not self.interpret

    @property
    def bf16_pack(self) -> bool:
        """``cvt.rn.bf16x2.f32`` exists (sm_80+): the kernels that hold bf16 as int32 words can run."""
        return self.arch >= 80 and not self.interpret

    def programs_resident(self) -> int:
        """Programs that are surely resident at once, whatever their registers and shared memory: one per SM.
        A kernel whose programs wait on each other (the row barrier) launches no more than this per group."""
        return self.sm_count


# Targets built by hand: tests assert the plans each gets; tools plan for the H200 on a machine without one.
H200 = Target(arch=90, sm_count=132, smem_per_sm=233472, l2_bytes=60 * 2**20)
A100 = Target(arch=80, sm_count=108, smem_per_sm=167936, l2_bytes=40 * 2**20)
L4 = Target(arch=89, sm_count=58, smem_per_sm=102400, l2_bytes=48 * 2**20)
INTERPRETER = Target(arch=0, sm_count=4, smem_per_sm=0, l2_bytes=0, interpret=True)


@functools.lru_cache(maxsize=64)
def _cuda_target(index: int) -> Target:
    p = torch.cuda.get_device_properties(index)
    return Target(arch=10 * p.major + p.minor, sm_count=p.multi_processor_count,
                  smem_per_sm=getattr(p, "shared_memory_per_multiprocessor", 0),
                  l2_bytes=getattr(p, "L2_cache_size", 0))


def target_of(device: torch.device) -> Target:
    """The target of ``device``: its properties for a CUDA device, :data:`INTERPRETER` for any other (the Triton
    path runs there only under ``TRITON_INTERPRET=1``: see :mod:`onlinesoftmax.backend`)."""
    if device.type == "cuda":
        return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER
