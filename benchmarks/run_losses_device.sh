#!/usr/bin/env bash
# One device call for the losses family: GPU tests at real sizes, then `onlinesoftmax bench losses`. Logs under $OUT.
#   from the repository root on the GPU machine (peers' wheels in $WHEELS):  bash benchmarks/run_losses_device.sh
set -u
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/losses-out}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT/res"
LOG="$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS/liger_kernel-*.whl $WHEELS/cut_cross_entropy-*.whl 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$LOG"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== gpu tests" | tee -a "$LOG"
  timeout ${T_TESTS:-100} python3 -m pytest -q -m gpu tests/losses -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
  tail -15 "$OUT/gpu-tests.log" | tee -a "$LOG"
fi
if [ "${PROBE:-0}" = 1 ]; then echo "== probe" | tee -a "$LOG"; timeout ${T_PROBE:-60} python3 benchmarks/losses_probe.py 2>&1 | tee "$OUT/probe.log"; fi
echo "== bench losses" | tee -a "$LOG"
timeout ${T_BENCH:-300} python3 -m onlinesoftmax bench losses --out "$OUT/res" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -60
