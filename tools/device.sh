#!/usr/bin/env bash
# What a maintainer runs on the GPU machine from the source tree; logs and results under $OUT.
#   bash tools/device.sh [tests|bench|report]...      (default: tests bench)
#   tests : every test with CUDA (the GPU tests and the Triton kernels at real sizes)
#   ptests: the GPU-marked tests in 6 processes (tools/parallel_tests.py; logs tests*.log under $OUT)
#   bench : the committed suites (SUITES, default all but the ladder), results tarred into $OUT/results.tgz;
#           Liger-Kernel is installed from .whl/ when its wheel was carried (see the device README)
#   report: the compiler report for sm_90a (tools/compiler_report.py), no GPU needed
#   sample: sampling's open knobs timed (< 300 s): the row kernel and the grid's variants (SAMPLE_ONLY) at
#           B = 1 / 8 / 64 / 256 (compiled first in parallel processes, fp32 checks, then timed), per-launch
#           profiles (SAMPLE_PROFILE); with SAMPLE_TESTS=EXPR then the grid's GPU tests matching it (pytest -k);
#           logs and JSON under $OUT/sample
#   probes: each family's probe (knob variants beside the default and the peers, each checked first): attention
#           forward (sm90) and backward, decode, cross-entropy, sampling's grid; JSON and logs in $OUT/probes.tgz
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/gpu.txt"
for step in ${*:-tests bench}; do
  case $step in
    tests) timeout ${T_TESTS:-420} python -m pytest -q -p no:warnings -x tests 2>&1 | tee "$OUT/tests.log" | tail -30 ;;
    ptests) python tools/parallel_tests.py 6 ${T_TESTS:-420} "$OUT" -m gpu tests ;;
    bench) if ls .whl/*.whl >/dev/null 2>&1; then
             python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
               && export PYTHONPATH=$PWD/src:/tmp/site
           fi
           timeout ${T_PREWARM:-120} python tools/topk_prewarm.py --jobs 12 --paper > "$OUT/prewarm.log" 2>&1
           mkdir -p "$OUT/results"
           timeout ${T_BENCH:-480} python -m onlinesoftmax bench ${SUITES:-softmax log_softmax logsumexp \
             softmax_backward log_softmax_backward topk topk-paper} --out "$OUT/results" 2>&1 | tee "$OUT/bench.log" \
             | tail -80
           tar -C "$OUT" -czf "$OUT/results.tgz" results && rm -r "$OUT/results" ;;   # at most 8 files come back
    probes) mkdir -p "$OUT/probes"
            timeout ${T_PROBE:-240} python tools/attention_sm90_probe.py --budget 150 --out "$OUT/probes" \
              > "$OUT/probes/attention_sm90.log" 2>&1
            for p in probe_attnbwd_sm90 probe_decode probe_ce probe_samplegrid; do
              timeout ${T_PROBE:-240} python tools/$p.py --out "$OUT/probes" > "$OUT/probes/$p.log" 2>&1
            done
            tail -n 12 "$OUT"/probes/*.log
            tar -C "$OUT" -czf "$OUT/probes.tgz" probes && rm -r "$OUT/probes" ;;
    sample) mkdir -p "$OUT/sample"
            timeout ${T_PROBE:-300} python tools/probe_samplegrid.py --out "$OUT/sample" --fp32-check --warm-jobs 8 \
              --only "${SAMPLE_ONLY:-row,grid,c1k,pdl}" \
              --cases 8x128256,1x128256,64x128256,256x128256 \
              --profile "${SAMPLE_PROFILE:-grid}" > "$OUT/sample/samplegrid.log" 2>&1
            [ -n "${SAMPLE_TESTS:-}" ] && timeout ${T_TESTS:-150} python -m pytest -q -p no:warnings -m gpu \
              tests/topk/test_sample_grid.py -k "$SAMPLE_TESTS" > "$OUT/sample/tests.log" 2>&1
            grep -v " ok$" "$OUT"/sample/*.log | tail -60 ;;
    report) timeout ${T_REPORT:-300} python tools/compiler_report.py --json "$OUT/report.json" > "$OUT/report.txt" 2>&1
            tail -3 "$OUT/report.txt" ;;
  esac
done
