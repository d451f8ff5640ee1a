"""Test set-up.

* Without CUDA, Triton kernels run on CPU tensors in the interpreter: ``TRITON_INTERPRET=1`` is set here,
  before any kernel module is imported (kernel modules are imported lazily), so ``backend="triton"``
  tests exercise the kernels' logic in CI at small sizes.
* ``@pytest.mark.gpu`` tests skip with a reason when no CUDA device is present. On the GPU machine run
  them with ``PYTHONPATH=src python -m pytest -m gpu`` (see README).
* ``@pytest.mark.interpreter`` tests run ``backend="triton"`` on CPU tensors: on a CUDA machine (no interpreter)
  they skip with a reason. The other CPU tests run their kernels on ``kernel_device``, the GPU where there is one.
"""

import os
import zlib

import pytest
import torch
from hypothesis import settings

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        if os.environ.get("TRITON_INTERPRET") == "1":
            return
        mark, why = "interpreter", ("runs backend='triton' on CPU tensors; needs Triton's interpreter (CI runs it; "
                                    "here set TRITON_INTERPRET=1 and hide the GPU)")
    else:
        mark, why = "gpu", "needs a CUDA device; none here (run `pytest -m gpu` on the GPU machine)"
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if mark in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed(request):
    """Fresh inputs per test, the same on every run (CI must not flake on a lucky draw)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def kernel_device() -> torch.device:
    """Where Triton kernels run in this session: the GPU, or the CPU through the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")
