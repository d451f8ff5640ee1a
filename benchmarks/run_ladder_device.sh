#!/usr/bin/env bash
# One call on the GPU machine for the CUDA C++ ladder (issue 4): build, torch-free self-check, the bench,
# the GPU tests, compute-sanitizer memcheck + racecheck. Run from the repository root:
#     OUT=/some/folder bash benchmarks/run_ladder_device.sh
# Writes (at most 8 files): $OUT/{build,selfcheck,bench,pytest,sanitizer}.log and $OUT/ladder/ladder.{json,md,png}
# (also left in benchmarks/results/ladder/). Each step has its own time limit and the script goes on after a
# failing step; the summary at the end says which steps passed.
set -u
OUT=${OUT:-$PWD/ladder-out}
mkdir -p "$OUT/ladder"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 ONLINESOFTMAX_CACHE_DIR=${ONLINESOFTMAX_CACHE_DIR:-/tmp/osm-cache}
PY=${PY:-python3}
LADDER=src/onlinesoftmax/ladder
declare -A STATUS

step() {  # step NAME LIMIT_S LOG CMD...
    local name=$1 limit=$2 log=$3; shift 3
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    STATUS[$name]="rc=$rc $((SECONDS - t0))s"
    echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$log"
    return $rc
}

# If a peer's work in progress breaks `import onlinesoftmax`, run against the foundation's __init__ instead.
if ! $PY -c "import onlinesoftmax, onlinesoftmax.bench.suites" 2>"$OUT/build.log"; then
    echo "import onlinesoftmax failed (see build.log); using a fallback package __init__" | tee -a "$OUT/build.log"
    rm -rf /tmp/osm-src && cp -r src /tmp/osm-src
    printf '"""fallback."""\nfrom .state import SoftmaxState\n__version__ = "0.1.0"\n' >/tmp/osm-src/onlinesoftmax/__init__.py
    printf 'from .ladder import suite  # noqa: F401\n' \
        >/tmp/osm-src/onlinesoftmax/bench/suites/__init__.py
    export PYTHONPATH=/tmp/osm-src
fi

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; nvcc --version | tail -2
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >>"$OUT/build.log" 2>&1

# 1. the loader's build (one nvcc command, ptxas -v report) and the stand-alone checker
step build 120 "$OUT/build.log" $PY -c "
import time; t = time.time()
from onlinesoftmax import ladder
p = ladder.build(); print('built', p, f'{time.time() - t:.1f}s')
print(open(p.parent / 'build.log').read())
import torch
for v in ladder.VERSIONS:
    for n in ((4096, 32768) if v == 'v3' else (4096,)):
        print(v, n, ladder.kernel_info(v, n=n, m=4096))
"
step selfcheck_build 120 "$OUT/build.log" nvcc -arch=sm_90 -O3 -std=c++17 -lineinfo -o /tmp/ladder_selfcheck \
    $LADDER/selfcheck.cu $LADDER/v0.cu $LADDER/v1.cu $LADDER/v2.cu $LADDER/v3.cu $LADDER/v4.cu $LADDER/safe.cu
step selfcheck 30 "$OUT/selfcheck.log" /tmp/ladder_selfcheck

# 2. the benchmark (results also land in benchmarks/results/ladder for the commit)
step bench 110 "$OUT/bench.log" $PY -m onlinesoftmax bench ladder --out benchmarks/results/ladder
cp benchmarks/results/ladder/ladder.* "$OUT/ladder/" 2>/dev/null

# 3. the GPU tests
step pytest 100 "$OUT/pytest.log" $PY -m pytest -q -m gpu tests/test_ladder.py -p no:cacheprovider

# 4. compute-sanitizer on every version (the self-check launches each on small odd shapes)
step memcheck 45 "$OUT/sanitizer.log" compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/ladder_selfcheck
step racecheck 45 "$OUT/sanitizer.log" compute-sanitizer --tool racecheck --racecheck-report all \
    --error-exitcode 9 /tmp/ladder_selfcheck

echo "==== summary"
for s in build selfcheck_build selfcheck bench pytest memcheck racecheck; do echo "$s: ${STATUS[$s]:-not run}"; done
grep -E "^(FAIL|selfcheck:)" "$OUT/selfcheck.log" | tail -5
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid" "$OUT/sanitizer.log" | sort | uniq -c | head
tail -3 "$OUT/pytest.log"
grep -E "copy ceiling" "$OUT/bench.log" | head -2
$PY - <<'PYEOF' 2>&1 | tail -60
import json
d = json.load(open("benchmarks/results/ladder/ladder.json"))
print(f"ceiling {d['copy_ceiling_gbps']:.0f} GB/s")
for r in d["rows"]:
    i = r.get("info", {})
    if r["x"] is None:
        print(f"{r['case'][:22]:22s} {r['impl'][:30]:30s} {r['gbps'] or 0:7.0f} GB/s {r['pct_ceiling'] or 0:5.1f}% "
              f"x{r['speedup_vs_peer'] or 0:6.2f} {i.get('kernel', '')} regs={i.get('regs', '-')} "
              f"occ={i.get('occupancy', '-')} {'' if r['ok'] else 'NOT OK ' + r['note'][:60]}")
on = [r for r in d["rows"] if r["x"] is not None and not r["impl"].startswith("safe")]
for r in on:
    print(f"{r['group'][:12]:12s} N={int(r['x']):6d} {r['impl']:3s} {r['gbps'] or 0:6.0f} GB/s  online/safe "
          f"x{r['speedup_vs_peer'] or 0:.2f} {'' if r['ok'] else 'NOT OK'}")
PYEOF
