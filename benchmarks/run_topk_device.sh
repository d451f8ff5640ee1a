#!/usr/bin/env bash
# One device call for softmax_topk: GPU tests, kernel variants, then the two bench suites. Logs under $OUT.
#   run from the repository root on the GPU machine:  bash benchmarks/run_topk_device.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/topk-out}
mkdir -p "$OUT/topk" "$OUT/paper"
LOG="$OUT/run.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$LOG"
echo "== gpu tests" | tee -a "$LOG"
timeout ${T_TESTS:-75} python -m pytest -q -m gpu tests/test_topk.py tests/test_sampling.py > "$OUT/tests.log" 2>&1
tail -25 "$OUT/tests.log" | tee -a "$LOG"
echo "== variants" | tee -a "$LOG"
[ "${SKIP_VARIANTS:-0}" = 1 ] || timeout ${T_VARIANTS:-105} python benchmarks/topk_variants.py --out "$OUT" 2>&1 | tee -a "$LOG"
echo "== bench topk" | tee -a "$LOG"
timeout ${T_BENCH:-150} python -m onlinesoftmax bench topk --out "$OUT/topk" 2>&1 | tail -70 | tee -a "$LOG"
echo "== bench topk-paper" | tee -a "$LOG"
[ "${SKIP_PAPER:-0}" = 1 ] || timeout ${T_PAPER:-35} python -m onlinesoftmax bench topk-paper --out "$OUT/paper" 2>&1 | tail -30 | tee -a "$LOG"
rm -f "$OUT/paper/topk-paper.png"
echo "== done" | tee -a "$LOG"
