"""The distributed ops' arguments as torch takes them, in a gloo group of 2 CPU processes
(``_apifuzz_worker.check_arguments``): a NumPy integer ``k`` or ``ignore_index`` and a NumPy float
``label_smoothing`` or ``scale`` raised TypeError; ``keepdim`` and ``return_lse`` took any truthy value."""

import os
import socket
import sys
import time

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))

import _apifuzz_worker  # noqa: E402

TIME_LIMIT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_arguments_as_torch_takes_them_gloo():
    P = 2
    ctx = mp.start_processes(_apifuzz_worker.main, args=(P, _free_port()), nprocs=P, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIME_LIMIT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{P} ranks did not finish in {TIME_LIMIT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
