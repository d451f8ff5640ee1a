"""The seed tutorial's CUDA C++ online-softmax ladder, V0–V4, and the three-pass safe softmax it beats.

=========  ===================================================  ===========================  =========
function   idea                                                 global memory per element    source
=========  ===================================================  ===========================  =========
v0         one thread per row                                   2 reads, 1 write             v0.cu
v1         block per row, two-level warp-shuffle (m, d) merge   2 reads, 1 write             v1.cu
v2         V1 + float4 loads and stores                         2 reads, 1 write             v2.cu
v3         row cached in registers                              1 read, 1 write              v3.cu
v4         V2 + grid-stride over rows                           2 reads, 1 write             v4.cu
safe_v1    three-pass safe softmax (max, sum, normalise), V1    3 reads, 1 write             safe.cu
safe_v2    the same with float4                                 3 reads, 1 write             safe.cu
=========  ===================================================  ===========================  =========

Each is a function ``f(x, *, out=None)``: softmax over the last dimension of a CUDA float32 tensor. The
sources compile with nvcc on first use (see ``_build.py`` for why nvcc + ctypes); without nvcc or a GPU the
call raises :class:`LadderUnavailable`. ``docs/ladder.md`` lists the seed's defects fixed here and the
measurements. Importing this package compiles nothing and initialises no CUDA.
"""

from ._api import (
    FUNCTIONS,
    V1_BLOCKS,
    V3_CONFIGS,
    V3_MAX_N,
    V3_PLAN,
    VERSIONS,
    kernel_info,
    plan,
    safe_v1,
    safe_v2,
    v0,
    v1,
    v2,
    v3,
    v3_config,
    v4,
)
from ._build import SOURCES, LadderBuildError, LadderUnavailable, build, find_nvcc

__all__ = [
    "FUNCTIONS",
    "SOURCES",
    "V1_BLOCKS",
    "V3_CONFIGS",
    "V3_MAX_N",
    "V3_PLAN",
    "VERSIONS",
    "LadderBuildError",
    "LadderUnavailable",
    "build",
    "find_nvcc",
    "kernel_info",
    "plan",
    "safe_v1",
    "safe_v2",
    "v0",
    "v1",
    "v2",
    "v3",
    "v3_config",
    "v4",
]
