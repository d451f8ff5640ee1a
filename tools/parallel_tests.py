"""Run pytest's selected tests in P processes on one GPU machine (correctness suites: the processes share the GPU,
so no test here should time anything). Logs per process under OUT; a summary (failures, last lines) printed last.

    PYTHONPATH=src python tools/parallel_tests.py 6 330 OUT -m gpu tests/attention tests/decode tests/topk

Arguments: processes, seconds per process (timeout), the log folder, then pytest's selection. The node ids are
dealt round-robin so each process gets a mix of slow and fast tests. Memory-hungry suites can run out of GPU
memory when run side by side (the cross-entropy tests at 8192 x 256K classes did once): rerun a failure alone.
"""

from __future__ import annotations

import subprocess
import sys
import time


def main() -> int:
    P, T, out, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
                            capture_output=True, text=True).stdout.splitlines()
    ids = [line for line in listed if "::" in line]
    print(len(ids), "tests", flush=True)
    procs = []
    for i in range(P):
        log = open(f"{out}/tests{i}.log", "w")
        cmd = ["timeout", str(T), sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "-p", "no:cacheprovider",
               *ids[i::P]]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    t0 = time.time()
    rc = 0
    for p, log in procs:
        rc |= p.wait()
        log.close()
    print(f"{time.time() - t0:.0f} s", flush=True)
    for i in range(P):
        lines = open(f"{out}/tests{i}.log").read().splitlines()
        print(f"-- {i}:", *[line for line in lines if "FAILED" in line][:10], *lines[-2:], sep="\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
