"""Probe of the sm90 (Gluon) attention backward on a persistent grid (``programs``, issue 25) on the H200, beside the
default (one program per key block) and SDPA's cuDNN and flash backwards:

* ``pers``: ``programs = -1``, one program per SM walking the (key block, batch·kv head) units in the default
  grid's order with the default's knobs (dq_rows at causal D = 64, lpt_heads at causal GQA D = 128 and causal
  D = 256): the next block's K / V load is issued as soon as the consumers' last matmuls of a block are done and
  the Q / dO ring runs on across blocks, so the dK / dV epilogue, barrier set-up and descriptor making of a new
  program leave the critical path;
* ``pers pairs``: the same with units of key blocks (n_kb − 1 − i, i) of one head (a causal band's work per unit
  is constant: a balanced round-robin; lpt_heads off);
* ``pers head``: programs = -1 with lpt_heads = 0 (head-major order) where the default uses lpt_heads;
* ``pers p7``: 7 programs, so that the check shapes (at most a few hundred units) walk many units per program
  (its timings only show that it ran).

    PYTHONPATH=src python tools/probe_bwdpers.py --out DIR          # on the GPU machine, < 150 s
    PYTHONPATH=src python tools/probe_bwdpers.py --compile-only     # here, no GPU: sm_90a registers / stack / smem

The harness is tools/probe_attnbwd4.py's (imported, its variant / shape tables replaced): compile and run every
(variant, head dim) once in worker processes; check each against an fp32 torch backward with poisoned outputs
(causal and not, GQA, windows, Sq != Sk, odd lengths; no packed sequences: the persistent grid rejects them); time
whole backward calls (do_bench medians, L2 cleared) against the default (rel. err < 1e-2) and cuDNN / flash, and the
default's and pers's launches one by one. Writes DIR/probe_bwdpers.json, prints the table last.
"""

from __future__ import annotations

import sys

import probe_attnbwd4 as base

base.OUT_NAME = "probe_bwdpers.json"
# name -> (BackwardPlan knobs, head dims); every name but "default" runs the sm90 kernel
base.VARIANTS = {
    "default": ({}, (64, 128, 256)),
    "pers": ({"programs": -1}, (64, 128, 256)),
    "pers pairs": ({"programs": -1, "pairs": True}, (64, 128, 256)),
    "pers head": ({"programs": -1, "lpt_heads": 0}, (128, 256)),
    "pers p7": ({"programs": 7}, (64, 128, 256)),      # 7 programs: every check shape walks many units each
}
base.BREAKDOWN = ("default", "pers")
# (B, H, Hkv, S, D, causal)
base.SHAPES = [(16, 32, 32, 1024, 128, True), (16, 32, 32, 1024, 128, False),
               (8, 16, 16, 2048, 64, True), (8, 16, 16, 2048, 64, False),
               (4, 32, 32, 4096, 128, True), (4, 32, 8, 4096, 128, True),
               (2, 16, 16, 4096, 256, True)]
base.VARLEN_CASES = []        # packed sequences stay on the per-program grid (the plan raises for programs)
if "--time-only" in sys.argv:     # checks passed in an earlier run: time every shape (default, pers, pers pairs)
    sys.argv.remove("--time-only")
    base.CHECKS = []
    for name in ("pers head", "pers p7"):
        base.VARIANTS.pop(name)
    base.BUDGET_S, base.WATCHDOG_S = 190, 210

if __name__ == "__main__":
    sys.exit(base.main())
