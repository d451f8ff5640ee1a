#!/usr/bin/env bash
# Softmax family on the GPU machine: GPU tests, the variant sweep, then the committed benchmark suites.
#   bash benchmarks/run_softmax_device.sh [tests|quicktests|tune|tune-bf16x2|tune-gib|profile|bench|graphtest]...
#   (default: tests tune bench); logs under $OUT
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
steps=${*:-tests tune bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for step in $steps; do
  case $step in
    tests) timeout 300 python -m pytest -q -p no:warnings tests/test_softmax.py tests/test_state.py 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    quicktests) timeout 200 python -m pytest -q -p no:warnings tests/test_softmax.py -m gpu -k "not 3000000" 2>&1 | tee "$OUT/tests.log" | tail -8
                timeout 100 python -m pytest -q -p no:warnings tests/test_softmax.py -k "compile or special or empty or path or gradients or bf16x2" 2>&1 | tee -a "$OUT/tests.log" | tail -8 ;;
    tune-gib) for set in ${GIB_SETS:-1 2 lse bwd bwd16}; do      # 1 GiB sweeps (about 15-45 s each, warm)
                timeout 200 python benchmarks/tune_softmax.py "$OUT" gib $set 2>&1 | tee "$OUT/tune-gib-$set.log" | tail -2
              done ;;
    profile) timeout 180 python benchmarks/profile_launch.py 2>&1 | tee "$OUT/profile.log" | head -45 ;;
    tune) timeout 330 python benchmarks/tune_softmax.py "$OUT" 2>&1 | tee "$OUT/tune.log" ;;
    tune-bf16x2) timeout 300 python benchmarks/tune_softmax.py "$OUT" bf16x2 2>&1 | tee "$OUT/tune-bf16x2.log" | tail -3 ;;
    bench) if ls .whl/liger_kernel-*.whl >/dev/null 2>&1; then
             python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/liger_kernel-*.whl \
               && export PYTHONPATH=src:/tmp/site
           fi
           timeout 420 python -m onlinesoftmax bench ${SUITES:-softmax log_softmax logsumexp softmax_backward log_softmax_backward} \
             --out "$OUT/softmax" 2>&1 | tee "$OUT/bench.log" | tail -60
           tar -C "$OUT" -czf "$OUT/results.tgz" softmax && rm -r "$OUT/softmax" ;;   # at most 8 files come back
    graphtest) timeout 120 python -m pytest -q -p no:warnings tests/test_softmax.py -k "coop_repeated or path" 2>&1 | tail -4 ;;
  esac
done
