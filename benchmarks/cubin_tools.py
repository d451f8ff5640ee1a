"""What the compiler-report scripts (`softmax_ptxas.py`, `topk_ptxas.py`) share: compile a Triton source for
sm_90a here (no GPU needed) and read the cubin back with Triton's bundled cuobjdump."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SM90 = GPUTarget("cuda", 90, 32)


def compile_sm90(src, options: dict):
    """``src`` (a ``triton.compiler.ASTSource``) compiled for sm_90a with launch ``options`` (num_warps, ...)."""
    return triton.compile(src, target=SM90, options=options)


def cubin_report(compiled, sass: bool = False) -> tuple[tuple[int, int, int], str]:
    """((registers, stack frame bytes, shared bytes), the SASS text when ``sass``, else "") of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        text = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout if sass else ""
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    return tuple(int(g) for g in m.groups()), text
