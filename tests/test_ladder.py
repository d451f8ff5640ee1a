"""The seed's CUDA C++ ladder (onlinesoftmax.ladder).

CPU (CI): every .cu compiles with ``nvcc -arch=sm_90`` and ptxas keeps V3's row cache in registers (skipped
with a reason when nvcc is absent); the loader's errors; the plan; import stays light.
GPU (``-m gpu``): every version against the fp64 reference on odd shapes, misaligned rows, special values.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from onlinesoftmax import ladder, reference
from onlinesoftmax.ladder import _build

HERE = Path(ladder.__file__).resolve().parent
CU_FILES = sorted(p.name for p in HERE.glob("*.cu"))
NVCC = _build.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None,
                                reason="no nvcc (CUDA toolkit) on this machine: the compile checks skip")
ENTRY = re.compile(r"Compiling entry function '(\S+)' for 'sm_90'\s*\n.*?Function properties for \1\s*\n"
                   r"\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\s*\n"
                   r".*?Used (\d+) registers", re.S)

# The seed's V3 cache, as written in the tutorial: an array indexed by a run-time counter.
SEED_V3_CACHE = r"""
#define MAX_ELEMS_PER_THREAD 32
__global__ void seed_v3_cache(const float* x, float* y, int N) {
    float reg_cache[MAX_ELEMS_PER_THREAD];
    int count = 0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) reg_cache[count++] = x[i];
    int idx = 0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) y[i] = reg_cache[idx++] * 2.f;
}
"""


def _nvcc_c(src: Path, out_dir: Path) -> tuple[int, str]:
    cmd = [NVCC, "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-c", str(src), "-o",
           str(out_dir / (src.stem + ".o"))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{file: (returncode, nvcc + ptxas output)}, every .cu compiled once, two at a time."""
    out = tmp_path_factory.mktemp("ladder_obj")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = pool.map(lambda f: (f, _nvcc_c(HERE / f, out)), CU_FILES)
        return dict(results)


def _entries(log: str) -> dict[str, tuple[int, int, int, int]]:
    """kernel -> (stack frame, spill stores, spill loads, registers) from ptxas -v."""
    return {m[0]: tuple(int(v) for v in m[1:]) for m in ENTRY.findall(log)}


# ---------------------------------------------------------------- CPU: sources, ptxas, loader

def test_sources_present():
    assert set(_build.SOURCES) | {"common.cu", "selfcheck.cu"} == set(CU_FILES)


@needs_nvcc
@pytest.mark.parametrize("name", CU_FILES)
def test_cu_compiles_for_sm90(compiled, name):
    rc, log = compiled[name]
    assert rc == 0, log
    assert "warning" not in log.lower(), log


@needs_nvcc
def test_v3_cache_stays_in_registers(compiled):
    """ptxas -v: no stack frame and no spills for every V3 instantiation (the seed's run-time-indexed cache
    lands in local memory, shown below); registers within the launch bounds."""
    entries = {k: v for k, v in _entries(compiled["v3.cu"][1]).items() if "online_softmax_v3" in k}
    assert len(entries) == len(ladder.V3_CONFIGS)
    for kernel, (stack, spill_st, spill_ld, regs) in entries.items():
        block = int(re.search(r"ILi(\d+)ELi(\d+)E", kernel).group(1))
        assert (stack, spill_st, spill_ld) == (0, 0, 0), kernel
        assert regs * block <= 65536, kernel


@needs_nvcc
def test_no_kernel_uses_local_memory(compiled):
    for name in ("v0.cu", "v1.cu", "v2.cu", "v4.cu", "safe.cu"):
        entries = _entries(compiled[name][1])
        assert entries, name
        for kernel, (stack, spill_st, spill_ld, _) in entries.items():
            assert (stack, spill_st, spill_ld) == (0, 0, 0), kernel


@needs_nvcc
def test_seed_run_time_indexed_cache_spills(tmp_path):
    src = tmp_path / "seed_v3.cu"
    src.write_text(SEED_V3_CACHE)
    rc, log = _nvcc_c(src, tmp_path)
    assert rc == 0, log
    (stack, *_), = _entries(log).values()
    assert stack >= 4 * 32, log   # the 32-float array is a 128-byte local-memory frame


def _macro_list(text: str, name: str) -> str:
    return re.search(rf"#define {name}\(X\)(.*?)\n\n", text, re.S).group(1)


def test_python_tables_match_the_sources():
    v3 = _macro_list((HERE / "v3.cu").read_text(), "LADDER_V3_CONFIGS")
    assert tuple((int(b), int(v)) for b, v in re.findall(r"X\((\d+), (\d+)\)", v3)) == ladder.V3_CONFIGS
    v1 = re.search(r"#define LADDER_V1_BLOCKS\(X\)(.*)", (HERE / "v1.cu").read_text()).group(1)
    assert tuple(int(b) for b in re.findall(r"X\((\d+)\)", v1)) == ladder.V1_BLOCKS
    assert set(ladder.V3_PLAN) <= set(ladder.V3_CONFIGS)


def test_v3_plan():
    assert ladder.v3_config(1) == (128, 1)
    assert ladder.v3_config(4096) == (256, 4)
    assert ladder.v3_config(4097) == (512, 4)
    assert ladder.v3_config(12672) == (1024, 4)
    assert ladder.v3_config(ladder.V3_MAX_N) == (1024, 8)
    assert ladder.v3_config(ladder.V3_MAX_N + 1) is None
    assert ladder.plan("v3", 4096) == "v3<256,4>"
    assert ladder.plan("v3", 40000) == "v2"            # past the register capacity: V2 runs
    assert ladder.plan("v1", 10, block=96) == "v1<96>"
    with pytest.raises(ValueError, match="version"):
        ladder.plan("v9", 10)


def test_argument_errors_name_the_argument():
    with pytest.raises(TypeError, match="x"):
        ladder.v2(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="x must have dtype"):
        ladder.v1(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="block"):
        ladder.v1(torch.zeros(2, 3), block=100)
    with pytest.raises(ValueError, match="config"):
        ladder.v3(torch.zeros(2, 3), config=(256, 3))
    with pytest.raises(ValueError, match="config"):
        ladder.v3(torch.zeros(2, 5000), config=(256, 4))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="x must be a CUDA tensor"):
            ladder.v2(torch.zeros(2, 3))
    else:
        with pytest.raises(ladder.LadderUnavailable, match="GPU"):
            ladder.v2(torch.zeros(2, 3))


def test_no_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    for var in ("ONLINESOFTMAX_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_build, "FALLBACK_NVCC", ())
    assert _build.find_nvcc() is None
    with pytest.raises(ladder.LadderUnavailable, match="nvcc"):
        ladder.build()


def test_import_is_light():
    code = ("import sys, torch, onlinesoftmax.ladder\n"
            "assert 'torch.utils.cpp_extension' not in sys.modules\n"
            "assert 'triton' not in sys.modules or 'onlinesoftmax.ladder' not in str(sys.modules['triton'])\n"
            "assert not torch.cuda.is_initialized()\n"
            "assert onlinesoftmax.ladder._build._lib is None\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@needs_nvcc
def test_loader_builds_and_loads(monkeypatch, tmp_path):
    """The loader's own build (one nvcc command, all sources, one .so) and a ctypes call into it; no GPU
    needed to load the library."""
    monkeypatch.setenv("ONLINESOFTMAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_build, "_lib", None)
    lib = _build.library()
    assert lib.ladder_error_string(0) == b"no error"
    (folder,) = tmp_path.iterdir()
    log = (folder / "build.log").read_text()
    assert "-arch=sm_90" in log and len(_entries(log)) >= 7 + 16 + 3
    assert _build.build() == folder / "libladder.so"   # cached: no second compile


def test_bench_suite_registered_and_skipped_on_cpu():
    import onlinesoftmax.bench.suites  # noqa: F401  (registers the suites)
    from onlinesoftmax.bench.harness import SUITES, BenchContext, Skip

    assert "ladder" in SUITES
    with pytest.raises(Skip, match="CUDA GPU"):          # the runner prints the reason, not an empty table
        list(SUITES["ladder"](BenchContext(device=torch.device("cpu"))))


# ---------------------------------------------------------------- GPU: correctness

VERSIONS = list(ladder.FUNCTIONS)
SHAPES = [(1, 1), (1, 3), (4, 4), (5, 4097), (3, 12672), (1, 4096), (17, 1000), (64, 256), (2, 32768),
          (2, 40000), (3, 65536), (300, 33)]


def _check(y: torch.Tensor, x: torch.Tensor, version: str):
    ref = torch.from_numpy(reference.softmax(x.double().cpu().numpy())).float()
    rtol = 5e-4 if version == "v0" else 2e-5   # V0 sums a whole row serially (1e-4 seen at N = 65536)
    torch.testing.assert_close(y.cpu(), ref, rtol=rtol, atol=1e-7, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("version", VERSIONS)
def test_matches_reference(version, shape):
    torch.manual_seed(sum(shape))
    x = torch.randn(*shape, device="cuda") * 3
    y = ladder.FUNCTIONS[version](x)
    assert y.shape == x.shape and y.dtype == torch.float32 and y.device == x.device
    _check(y, x, version)
    finite = torch.isfinite(y).all(-1)
    torch.testing.assert_close(y.sum(-1)[finite], torch.ones_like(y.sum(-1)[finite]), rtol=0, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_misaligned_rows_and_views(version):
    """Rows that start off 16-byte boundaries: an input view at +4, +8, +12 bytes, and N % 4 != 0."""
    fn = ladder.FUNCTIONS[version]
    for offset in (1, 2, 3):
        for n in (5, 1023, 4097):
            base = torch.randn(7 * n + 4, device="cuda")
            x = base[offset:offset + 7 * n].view(7, n)
            assert x.data_ptr() % 16 == 4 * offset
            y = fn(x)
            assert y.data_ptr() % 16 == x.data_ptr() % 16
            _check(y, x, version)
    xt = torch.randn(300, 9, device="cuda").t()       # non-contiguous: copied first
    _check(fn(xt), xt, version)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5, 4096, 40000])
@pytest.mark.parametrize("version", VERSIONS)
def test_special_values(version, n):
    """torch's semantics: rows with NaN or +inf, or only -inf, are NaN; -inf prefixes are harmless (the
    seed's -inf - (-inf) NaN); huge values; equal values; shift invariance."""
    inf = float("inf")
    x = torch.randn(8, n, device="cuda")
    x[0] = -inf
    x[1, : n // 2 + 1] = -inf
    x[2, n // 2] = float("nan")
    x[3, -1] = inf
    x[4] = torch.where(torch.arange(n, device="cuda") % 3 == 0, 1e30, -1e30)
    x[5] = 7.0
    x[6] = x[7] + 100.0
    y = ladder.FUNCTIONS[version](x)
    _check(y, x, version)
    assert torch.isnan(y[[0, 2, 3]]).all()
    torch.testing.assert_close(y[6], y[7], rtol=2e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_out_is_fully_written(version):
    x = torch.randn(33, 4099, device="cuda")
    out = torch.full_like(x, 3e38)
    assert ladder.FUNCTIONS[version](x, out=out) is out
    _check(out, x, version)
    with pytest.raises(ValueError, match="out"):
        ladder.FUNCTIONS[version](x, out=torch.empty(33, 4098, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("block", ladder.V1_BLOCKS)
def test_v1_any_warp_count(block):
    """3 and 6 warps (block 96, 192): the seed's non-power-of-two second-level shuffle lost lanes."""
    x = torch.randn(9, 3001, device="cuda")
    _check(ladder.v1(x, block=block), x, "v1")


@pytest.mark.gpu
@pytest.mark.parametrize("config", ladder.V3_CONFIGS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_v3_every_config(config):
    b, v = config
    for n in (1, 4 * b * v - 3, 4 * b * v):
        x = torch.randn(3, n, device="cuda")
        _check(ladder.v3(x, config=config), x, "v3")
    info = ladder.kernel_info("v3", n=4 * b * v, config=config)
    assert info["local_bytes"] == 0 and info["kernel"] == f"v3<{b},{v}>"


@pytest.mark.gpu
def test_empty_and_batched():
    for version, fn in ladder.FUNCTIONS.items():
        assert fn(torch.empty(0, 5, device="cuda")).shape == (0, 5)
        assert fn(torch.empty(3, 0, device="cuda")).shape == (3, 0)
        x = torch.randn(2, 3, 5, device="cuda")
        _check(fn(x), x, version)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_row_offsets_past_int32(version):
    """M·N > 2^31: the seed's int `row * N` wraps; check the last rows (17 GB of GPU memory)."""
    n = 16384
    m = (1 << 31) // n + 3
    free, _ = torch.cuda.mem_get_info()
    if free < 2.2 * 4 * m * n:
        pytest.skip(f"needs {2.2 * 4 * m * n / 2**30:.0f} GiB free on the GPU")
    x = torch.empty(m, n, device="cuda")
    x[-4:] = torch.randn(4, n, device="cuda")
    y = ladder.FUNCTIONS[version](x)
    _check(y[-4:], x[-4:], version)
    del x, y
    torch.cuda.empty_cache()
