"""SM clock and board power while one kernel runs back to back: is a kernel slowed by the card's power cap?

Each case runs for RUN_S seconds (calls back to back, 1 GiB per tensor, in batches of BATCH timed by CUDA events)
while `nvidia-smi` samples clocks, power and throttle reasons every 50 ms. The samples inside each window are
averaged, and each batch is matched to the sample nearest its end: the rate at high and at capped SM clocks.
The card's settings are left as they are (METHOD.md): only read, never set.

    PYTHONPATH=$PWD/src python benchmarks/power_probe.py [OUT_DIR]
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from functools import partial

import torch
from tune_softmax import bwd_variant

from onlinesoftmax.bench.harness import environment
from onlinesoftmax.kernels import softmax as K
from onlinesoftmax.ops.softmax import row_geometry

GIB = 1 << 30
RUN_S = 2.5
BATCH = 20            # calls per timed batch; each batch is matched to the clock sample nearest its end
REST_S = 1.0          # idle between cases, so that each starts from a cool card as far as a second allows
QUERY = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def cases():
    """(name, bytes moved per call, call); each case's tensors are dropped when the next is made."""
    src = torch.empty(GIB // 4, device="cuda").uniform_()
    yield "copy fp32 1 GiB", 2 * GIB, partial(torch.Tensor.copy_, torch.empty_like(src), src)
    src = None
    for dtype, n in ((torch.float32, 32768), (torch.float32, 131072), (torch.float32, 262144),
                     (torch.bfloat16, 16384), (torch.bfloat16, 32768), (torch.bfloat16, 131072),
                     (torch.bfloat16, 262144)):
        x = (torch.randn(GIB // (n * dtype.itemsize), n, device="cuda") * 3).to(dtype)
        y = torch.empty_like(x)
        m, nn, inner, (gx, gy) = row_geometry([x, y], 1)
        yield f"softmax {str(dtype)[6:]} N={n}", 2 * GIB, partial(K.forward, x, y, gx, gy, m, nn, inner, K.SOFTMAX)
        x = y = None
    x = torch.randn(GIB // 2048, 1024, device="cuda").to(torch.bfloat16)
    out = torch.empty(x.shape[0], dtype=x.dtype, device="cuda")
    m, nn, inner, (gx, _) = row_geometry([x, x], 1)
    yield "logsumexp bfloat16 N=1024", GIB, partial(K.forward, x, out, gx, gx, m, nn, inner, K.LOGSUMEXP)
    x = out = None
    for dtype in (torch.float32, torch.bfloat16):
        y = torch.softmax(torch.randn(GIB // (262144 * dtype.itemsize), 262144, device="cuda"), -1).to(dtype)
        yield f"backward {str(dtype)[6:]} N=262144", 3 * GIB, partial(bwd_variant(None), y, torch.randn_like(y))
        y = None


def sustained(fn):
    """Calls back to back for RUN_S seconds in batches of BATCH; returns (start, end, µs per call over the window,
    [(host time at the batch's end, µs per call in the batch)])."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    start.record()
    calls, batches = 0, []
    while time.time() - t0 < RUN_S:
        b0, b1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b0.record()
        for _ in range(BATCH):
            fn()
        b1.record()
        calls += BATCH
        b1.synchronize()                  # keep the host within one batch of the GPU
        batches.append((time.time(), b0.elapsed_time(b1) * 1e3 / BATCH))
    end.record()
    end.synchronize()
    return t0, time.time(), start.elapsed_time(end) * 1e3 / calls, batches


def read_samples(path):
    rows = []
    with open(path) as f:
        for line in f.read().splitlines()[1:]:
            p = [s.strip() for s in line.split(",")]
            try:
                t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((t, float(p[1].split()[0]), float(p[2].split()[0]), float(p[3].split()[0]),
                             float(p[4]), int(p[5], 16)))
            except (ValueError, IndexError):
                continue
    return rows


def main(out_dir="."):
    log = f"{out_dir}/power-samples.csv"
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv", "-lms", "50",
                            "-i", str(torch.cuda.current_device())], stdout=open(log, "w"))
    windows = []
    try:
        for name, nbytes, fn in cases():
            time.sleep(REST_S)
            t0, t1, us, batches = sustained(fn)
            windows.append((name, nbytes, t0, t1, us, batches))
            print(f"{name:28} {us:8.1f} us/call {nbytes / us / 1e3:6.0f} GB/s", flush=True)
    finally:
        time.sleep(0.3)
        smi.terminate()
    samples = read_samples(log)
    out = []
    print(f"\n{'case':28} {'GB/s':>6} {'SM MHz mean':>11} {'min':>5} {'W mean':>7} {'max':>5} {'capped':>7} "
          f"{'temp':>5}")
    for name, nbytes, t0, t1, us, batches in windows:
        inside = [s for s in samples if t0 + 0.3 <= s[0] <= t1]      # skip the first 0.3 s (ramp)
        if not inside:
            print(f"{name:28} no samples")
            continue
        sm = [s[1] for s in inside]
        w = [s[3] for s in inside]
        capped = sum(1 for s in inside if s[5] & 0x4) / len(inside)   # 0x4: SW power cap
        row = dict(case=name, gbps=nbytes / us / 1e3, us=us, sm_mhz_mean=sum(sm) / len(sm), sm_mhz_min=min(sm),
                   watts_mean=sum(w) / len(w), watts_max=max(w), power_capped=capped,
                   temp_max=max(s[4] for s in inside), samples=len(inside))
        # each batch against the SM clock sampled nearest its end: the rate at high and at capped clocks
        by_clock = []
        for tb, ub in batches:
            near = min(samples, key=lambda smp: abs(smp[0] - tb))
            if abs(near[0] - tb) < 0.06:
                by_clock.append((near[1], nbytes / ub / 1e3))
        hi = [g for mhz, g in by_clock if mhz >= 1900]
        lo = [g for mhz, g in by_clock if mhz < 1700]
        row.update(batches_by_clock=by_clock, gbps_at_1900_up=sum(hi) / len(hi) if hi else None,
                   gbps_below_1700=sum(lo) / len(lo) if lo else None, n_hi=len(hi), n_lo=len(lo))
        out.append(row)
        print(f"{name:28} {row['gbps']:6.0f} {row['sm_mhz_mean']:11.0f} {row['sm_mhz_min']:5.0f} "
              f"{row['watts_mean']:7.0f} {row['watts_max']:5.0f} {capped * 100:6.0f}% {row['temp_max']:5.0f}   "
              f"GB/s at >= 1900 MHz {row['gbps_at_1900_up'] or float('nan'):6.0f} ({len(hi)} batches), "
              f"< 1700 MHz {row['gbps_below_1700'] or float('nan'):6.0f} ({len(lo)})")
    with open(f"{out_dir}/power-probe.json", "w") as f:
        json.dump(dict(environment=environment(), cases=out), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
