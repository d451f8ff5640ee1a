"""The balanced decode kernel compiled for sm_90a as its launcher binds it, with no GPU: the programs per SM its
plan's grid counts on (``Plan.per_sm``) fit on one SM at once (registers under ``Plan.maxnreg``, shared memory),
and the key-tile loop touches no local memory (spills, where the cap makes them, stay outside it).

Without the cap the causal mask of Sq > 1 rows took the paged kernel to 200 registers: 2 programs of 4 warps per SM
where the grid counted 3, the grid in 1.5 waves (Sq = 4 at 0.65-0.69x the GB/s of Sq = 1 on the H200).

Compiled in a child process: under TRITON_INTERPRET=1 (CI) Triton's own helpers are interpreter objects.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import decode_compile as dc                       # pops TRITON_INTERPRET before triton loads
from collections import Counter
import torch
from compiler_report import compile_launch
from onlinesoftmax.decode.launch import _launches, _spec
from onlinesoftmax.decode.plan import Problem, decode_plan
from onlinesoftmax.target import H200

i32, f32 = dc._t(torch.int32), dc._t(torch.float32)
out = []
for c in json.loads(sys.argv[2]):
    B, H, Hkv, Sq, D, S, page = c["shape"]
    dt = getattr(torch, c["dtype"])
    q = dc._t(dt)
    p = Problem(B, H, Hkv, Sq, D, S, page, dt.itemsize)
    plan = decode_plan(p, H200)
    kst = (Hkv * page * D, page * D, D, 1) if page else (Hkv * S * D, S * D, D, 1)
    ost, bts = (H * Sq * D, Sq * D, D, 1), S // max(page, 1)
    wl, sc = c["window"], c["softcap"]
    spec = _spec(p.s_max, ost, kst, kst, bts, ost, 100 if wl else -1, -1)
    flags = (bool(page), True, wl, False, sc, dt == torch.float32)
    (kv, kv_args, _), *_ = _launches(plan, p, flags, (0.1, 30.0 if sc else 0.0, 100 if wl else -1, -1), ost, ost,
                                     spec)
    r = compile_launch(kv.fn, kv_args(q, q, q, i32, i32, q, f32, f32, f32, p.s_max, kst, kst, bts), kv.meta, 90,
                       keep_sass=True)
    loop = Counter(op.split(".")[0] for op in dc.sass_loop(r.pop("sass_text")))
    out.append(dict(regs=r["regs"], shared=r["shared"], warps=plan.num_warps, per_sm=plan.per_sm,
                    maxnreg=plan.maxnreg, balanced=plan.balanced, local=loop["LDL"] + loop["STL"]))
print(json.dumps(out))
"""

# (B, H, Hkv, Sq, D, S_max, page), bf16 unless said: paged 16 at Sq 1 / 4 (3 programs of 4 warps per SM, capped at
# 168 registers), G·Sq = 32 and 64 rows (2 per SM), a window and softcap, D = 256; the dense plan (1 per SM)
CASES = [
    dict(shape=(8, 32, 8, 1, 128, 32768, 16), dtype="bfloat16", window=False, softcap=False),
    dict(shape=(8, 32, 8, 4, 128, 32768, 16), dtype="bfloat16", window=False, softcap=False),
    dict(shape=(8, 32, 8, 8, 128, 32768, 16), dtype="float16", window=False, softcap=False),
    dict(shape=(8, 32, 8, 16, 128, 32768, 16), dtype="bfloat16", window=False, softcap=False),
    dict(shape=(8, 32, 8, 4, 128, 32768, 16), dtype="bfloat16", window=True, softcap=True),
    dict(shape=(8, 32, 8, 4, 256, 16384, 16), dtype="bfloat16", window=False, softcap=False),
    dict(shape=(8, 32, 8, 4, 128, 32768, 0), dtype="bfloat16", window=False, softcap=False),
]


def test_balanced_decode_programs_fit_their_sm():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", PROBE, ROOT, json.dumps(CASES)], env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert [g["per_sm"] for g in got] == [3, 3, 2, 2, 3, 3, 1]
    for case, g in zip(CASES, got):
        assert g["balanced"] and g["local"] == 0, (case, g)
        assert g["regs"] <= (g["maxnreg"] or 255), (case, g)
        assert g["per_sm"] * g["regs"] * 32 * g["warps"] <= 65536, (case, g)        # registers per SM (sm_90)
        assert g["per_sm"] * (g["shared"] + 1024) <= 233472, (case, g)             # 228 KB, 1 KB per block kept
