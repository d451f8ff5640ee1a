"""Compile the ladder's CUDA C++ on first use with ``nvcc`` into one shared library, load it with ctypes.

Why nvcc + ctypes rather than ``torch.utils.cpp_extension.load_inline``: the kernels take raw pointers and
need nothing from libtorch, so the library is plain CUDA C++ built by one ``nvcc`` command (about 6 s),
the very command CI runs to check that the sources compile and that ptxas keeps V3's cache in registers;
``load_inline`` would compile libtorch's headers and a pybind11 module (about a minute, and ninja, and a
build tied to the torch ABI) for the same kernels. The price is a thin ctypes layer (``_api.py``) that passes
``data_ptr()``, the current stream and the device index; the CUDA runtime is linked statically and works in
torch's primary context on torch's stream.

The library is cached under ``$ONLINESOFTMAX_CACHE_DIR`` (default ``~/.cache/onlinesoftmax``) in a folder
keyed by the sources, the flags and the nvcc version, written atomically, with ptxas's report beside it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
# common.cu is #included by each of these; selfcheck.cu is the stand-alone checker (has a main()).
SOURCES = ("v0.cu", "v1.cu", "v2.cu", "v3.cu", "v4.cu", "safe.cu")
DEFAULT_ARCH = "sm_90"
FALLBACK_NVCC = ("/usr/local/cuda/bin/nvcc",)
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xptxas", "-v", "-lineinfo")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class LadderUnavailable(RuntimeError):
    """No CUDA toolkit (nvcc) or no GPU: the ladder cannot run here."""


class LadderBuildError(RuntimeError):
    """nvcc failed; the message holds its output."""


def find_nvcc() -> str | None:
    """``$ONLINESOFTMAX_NVCC``, ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on PATH, ``/usr/local/cuda/bin/nvcc``."""
    candidates = [os.environ.get("ONLINESOFTMAX_NVCC")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates += [shutil.which("nvcc"), *FALLBACK_NVCC]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def require_nvcc() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise LadderUnavailable(
            "onlinesoftmax.ladder compiles its CUDA C++ kernels with nvcc on first use, and no nvcc was "
            "found (looked at $ONLINESOFTMAX_NVCC, $CUDA_HOME/bin/nvcc, PATH, /usr/local/cuda/bin/nvcc): "
            "install the CUDA toolkit or set CUDA_HOME. The rest of onlinesoftmax (Triton and torch "
            "backends) does not need it.")
    return nvcc


def default_arch() -> str:
    """``$ONLINESOFTMAX_LADDER_ARCH``, else sm_90 (the H100/H200 this ladder is measured on)."""
    return os.environ.get("ONLINESOFTMAX_LADDER_ARCH", DEFAULT_ARCH)


def nvcc_command(nvcc: str, out: str, arch: str, sources=SOURCES) -> list[str]:
    return [nvcc, f"-arch={arch}", *NVCC_FLAGS, "-shared", "-Xcompiler", "-fPIC", "-o", out,
            *[str(HERE / s) for s in sources]]


def cache_root() -> Path:
    root = os.environ.get("ONLINESOFTMAX_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "onlinesoftmax"


def _key(nvcc: str, arch: str) -> str:
    h = hashlib.sha256()
    for name in sorted(p.name for p in HERE.glob("*.cu")):
        h.update(name.encode())
        h.update((HERE / name).read_bytes())
    h.update(" ".join((arch, *NVCC_FLAGS)).encode())
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        h.update(version.encode())
    except (OSError, subprocess.SubprocessError):
        pass
    return h.hexdigest()[:16]


def build(*, arch: str | None = None, force: bool = False) -> Path:
    """Compile the ladder into the cache (if not there yet) and return the library's path.

    Raises :class:`LadderUnavailable` without nvcc and :class:`LadderBuildError` when nvcc fails.
    ``build.log`` beside the library holds the command and ptxas's per-kernel report.
    """
    nvcc = require_nvcc()
    arch = arch or default_arch()
    folder = cache_root() / f"ladder-{arch}-{_key(nvcc, arch)}"
    lib = folder / "libladder.so"
    if lib.exists() and not force:
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libladder-", suffix=".so", dir=folder)
    os.close(fd)
    cmd = nvcc_command(nvcc, tmp, arch)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        raise LadderBuildError(f"could not run {cmd[0]}: {e}") from e
    log = " ".join(cmd) + "\n" + r.stdout + r.stderr
    if r.returncode != 0:
        os.unlink(tmp)
        raise LadderBuildError(f"nvcc failed (exit {r.returncode}) building the ladder:\n{log[-4000:]}")
    (folder / "build.log").write_text(log)
    os.replace(tmp, lib)   # atomic: concurrent first uses see either no library or a whole one
    return lib


_c_int, _c_ll, _c_vp, _p_int = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)
_SIGNATURES = {
    "ladder_v0": [_c_vp, _c_vp, _c_ll, _c_int, _c_vp, _c_int],
    "ladder_v1": [_c_vp, _c_vp, _c_ll, _c_int, _c_int, _c_vp, _c_int],
    "ladder_v2": [_c_vp, _c_vp, _c_ll, _c_int, _c_vp, _c_int],
    "ladder_v3": [_c_vp, _c_vp, _c_ll, _c_int, _c_int, _c_int, _c_vp, _c_int],
    "ladder_v4": [_c_vp, _c_vp, _c_ll, _c_int, _c_vp, _c_int],
    "ladder_safe_v1": [_c_vp, _c_vp, _c_ll, _c_int, _c_vp, _c_int],
    "ladder_safe_v2": [_c_vp, _c_vp, _c_ll, _c_int, _c_vp, _c_int],
    "ladder_v0_info": [_p_int, _p_int, _p_int, _p_int],
    "ladder_v1_info": [_c_int, _p_int, _p_int, _p_int],
    "ladder_v2_info": [_p_int, _p_int, _p_int, _p_int],
    "ladder_v3_info": [_c_int, _c_int, _p_int, _p_int, _p_int],
    "ladder_v4_info": [_c_int, _c_ll, _p_int, _p_int, _p_int, _p_int, _p_int],
    "ladder_safe_info": [_c_int, _p_int, _p_int, _p_int, _p_int],
}


def library() -> ctypes.CDLL:
    """The loaded library (built on first call)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                lib = ctypes.CDLL(str(build()))
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = argtypes, ctypes.c_int
                lib.ladder_error_string.argtypes = [ctypes.c_int]
                lib.ladder_error_string.restype = ctypes.c_char_p
                _lib = lib
    return _lib
