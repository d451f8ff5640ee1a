"""Run pytest's selected tests in P processes on one GPU machine (correctness suites: the processes share the GPU,
so no test here should time anything). Logs per process under OUT; a summary (failures, last lines) printed last.

    PYTHONPATH=src python tools/parallel_tests.py 6 330 OUT -m gpu tests/attention tests/decode tests/topk

Arguments: processes, seconds per process (timeout), the log folder, then pytest's selection. The node ids are
dealt round-robin so each process gets a mix of slow and fast tests. Memory-hungry tests run out of GPU memory side
by side (the decode goal shapes at 32K-128K keys: 7 failures beside six processes at 6163761; the cross-entropy tests
at 8192 x 256K classes once): node ids containing one of ``ALONE`` (or of the comma-separated env var ALONE) run after
the others, in one process (log ``alone.log``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ALONE = ("test_decode_gpu.py::test_goal_shapes", "test_decode_gpu.py::test_page_numbers_per_page",
         "tests/losses/")


def main() -> int:
    P, T, out, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
                            capture_output=True, text=True).stdout.splitlines()
    ids = [line for line in listed if "::" in line]
    alone_pats = [a for a in os.environ.get("ALONE", ",".join(ALONE)).split(",") if a]
    alone = [i for i in ids if any(a in i for a in alone_pats)]
    ids = [i for i in ids if i not in alone]
    print(len(ids), "tests in", P, "processes,", len(alone), "after them in one", flush=True)
    if not ids and not alone:
        print("no tests selected", flush=True)
        return 5
    P = max(1, min(P, len(ids)))            # a process with no node ids would run pytest's whole testpaths
    procs = []
    for i in range(P if ids else 0):
        log = open(f"{out}/tests{i}.log", "w")
        cmd = ["timeout", str(T), sys.executable, "-m", "pytest", "-v", "--tb=short", "-p", "no:warnings", "-p",
               "no:cacheprovider", *ids[i::P]]     # -v: a line per test, so a process killed by timeout still
        #                                           names its failures
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    t0 = time.time()
    rc = 0
    for p, log in procs:
        rc |= p.wait()
        log.close()
    print(f"{time.time() - t0:.0f} s", flush=True)
    logs = [f"tests{i}" for i in range(P if ids else 0)]
    if alone:
        with open(f"{out}/alone.log", "w") as log:
            cmd = ["timeout", str(T), sys.executable, "-m", "pytest", "-v", "--tb=short", "-p", "no:warnings", "-p",
                   "no:cacheprovider", *alone]
            rc |= subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"{time.time() - t0:.0f} s with the ones alone", flush=True)
        logs.append("alone")
    for name in logs:
        lines = open(f"{out}/{name}.log").read().splitlines()
        bad = [line for line in lines if " FAILED" in line or " ERROR" in line]
        print(f"-- {name}:", *bad[:10], *lines[-1:], sep="\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
