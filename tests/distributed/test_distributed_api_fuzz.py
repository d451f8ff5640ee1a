"""The distributed ops' arguments as torch takes them, in a gloo group of 2 CPU processes
(``_worker.check_arguments``): a NumPy integer ``k`` or ``ignore_index`` and a NumPy float ``label_smoothing`` or
``scale`` raised TypeError; ``keepdim`` and ``return_lse`` took any truthy value."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from _worker import run_ranks  # noqa: E402


def test_arguments_as_torch_takes_them_gloo():
    run_ranks(2, ("check_arguments",))
