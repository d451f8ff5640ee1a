#!/usr/bin/env bash
# One device call for softmax_topk: GPU tests, kernel variants, then the two bench suites. Logs under $OUT.
#   run from the repository root on the GPU machine:  bash benchmarks/run_topk_device.sh
#   SKIP_TESTS / SKIP_VARIANTS / SKIP_PREWARM / SKIP_BENCH / SKIP_PAPER=1 leave a step out; QUICK_VARIANTS=1 times
#   3 shapes. The prewarm step compiles the suites' kernels in parallel first (cold, about 86 s of one core);
#   PREWARM_DURING_TESTS=1 runs it in the background while the GPU tests run. PROBE=1 adds benchmarks/topk_probe.py.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/topk-out}
mkdir -p "$OUT/topk" "$OUT/paper"
LOG="$OUT/run.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$LOG"
prewarm() {
  timeout ${T_PREWARM:-120} python benchmarks/topk_prewarm.py --jobs ${PREWARM_JOBS:-12} \
    $([ "${SKIP_PAPER:-0}" != 1 ] && echo --paper) > "$OUT/prewarm.log" 2>&1
}
WANT_PREWARM=0
if [ "${SKIP_PREWARM:-0}" != 1 ] && { [ "${SKIP_BENCH:-0}" != 1 ] || [ "${SKIP_PAPER:-0}" != 1 ]; }; then WANT_PREWARM=1; fi
if [ $WANT_PREWARM = 1 ] && [ "${PREWARM_DURING_TESTS:-0}" = 1 ]; then
  echo "== prewarm (background)" | tee -a "$LOG"; prewarm & PREWARM_PID=$!; WANT_PREWARM=0
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== gpu tests" | tee -a "$LOG"
  timeout ${T_TESTS:-90} python -m pytest -q -m gpu tests/test_topk.py tests/test_sampling.py > "$OUT/tests.log" 2>&1
  tail -25 "$OUT/tests.log" | tee -a "$LOG"
fi
if [ "${SKIP_VARIANTS:-0}" != 1 ]; then
  echo "== variants" | tee -a "$LOG"
  timeout ${T_VARIANTS:-120} python benchmarks/topk_variants.py --out "$OUT" ${QUICK_VARIANTS:+--quick} 2>&1 | tee -a "$LOG"
fi
if [ "${PROBE:-0}" = 1 ]; then
  echo "== probe" | tee -a "$LOG"
  timeout ${T_PROBE:-200} python benchmarks/topk_probe.py --out "$OUT" > "$OUT/probe.log" 2>&1
  grep -A100 "== summary" "$OUT/probe.log" | tee -a "$LOG"
fi
if [ $WANT_PREWARM = 1 ]; then echo "== prewarm" | tee -a "$LOG"; prewarm; fi
if [ -n "${PREWARM_PID:-}" ]; then wait $PREWARM_PID; fi
[ -f "$OUT/prewarm.log" ] && tail -3 "$OUT/prewarm.log" | tee -a "$LOG"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== bench topk" | tee -a "$LOG"
  timeout ${T_BENCH:-240} python -m onlinesoftmax bench topk --out "$OUT/topk" 2>&1 | tail -70 | tee -a "$LOG"
fi
if [ "${SKIP_PAPER:-0}" != 1 ]; then
  echo "== bench topk-paper" | tee -a "$LOG"
  timeout ${T_PAPER:-60} python -m onlinesoftmax bench topk-paper --out "$OUT/paper" 2>&1 | tail -30 | tee -a "$LOG"
fi
echo "== done" | tee -a "$LOG"
