"""Compile the decode kernels for sm_90 / sm_80 / sm_89 as the plans launch them (no GPU needed): registers, stack
(spills), shared memory. ``python tools/decode_compile.py``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from compiler_report import TARGETS, compile_launch  # noqa: E402

from onlinesoftmax.decode.launch import _launches, _merge_launch, _spec  # noqa: E402
from onlinesoftmax.decode.plan import Knobs, Problem, decode_plan, merge_plan  # noqa: E402


def _t(dtype):
    return torch.empty(1, dtype=dtype, device="meta")


def cases():
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for B, H, Hkv, Sq, D, S, page in ((8, 32, 32, 1, 128, 32768, 0), (1, 32, 8, 1, 128, 131072, 0),
                                           (64, 32, 8, 4, 128, 4096, 16), (8, 32, 8, 1, 128, 32768, 256),
                                           (4, 8, 1, 16, 256, 8192, 1), (2, 4, 4, 1, 64, 1000, 0)):
            if dt == torch.float32 and (page or D == 256):
                continue
            yield dt, Problem(B, H, Hkv, Sq, D, S, page, dt.itemsize)


def main():
    spills = []
    for arch in (90, 80, 89):
        target = TARGETS[arch]
        for dt, p in cases():
            if arch != 90 and dt == torch.float32:
                continue
            for splits in (None, 3):
                plan = decode_plan(p, target, Knobs.of(splits=splits) if splits else Knobs())
                flags = (bool(p.page), True, True, False, True, dt == torch.float32)
                ost = (p.H * p.Sq * p.D, p.Sq * p.D, p.D, 1)
                rows = p.page or p.s_max
                kst = (p.Hkv * rows * p.D, rows * p.D, p.D, 1)      # contiguous caches, q and o
                bts = -(-p.s_max // p.page) if p.page else 1
                spec = _spec(p.s_max, ost, kst, kst, bts, ost, 100, -1)
                (kv, kv_args, _), *merge = _launches(plan, p, flags, (0.1, 30.0, 100, -1), ost, ost, spec)
                q, f, i = _t(dt), _t(torch.float32), _t(torch.int32)
                args = kv_args(q, q, q, i, i, q, f, f, f, p.s_max, kst, kst, bts)
                r = compile_launch(kv.fn, args, kv.meta, arch)
                line = f"sm_{arch} {str(dt)[6:]:8} {p} splits={plan.splits} bm={plan.block_m} bn={plan.block_n}"
                print(line, kv.fn.__name__, r)
                if r["stack"]:
                    spills.append(line)
                for mk, margs, _ in merge:
                    args = margs(q, q, q, i, i, q, f, f, f, p.s_max, kst, kst, bts)
                    print(line, mk.fn.__name__, compile_launch(mk.fn, args, mk.meta, arch))
        for dt in (torch.bfloat16, torch.float32):
            mp = merge_plan(1 << 22, 128, target)
            bound, tail = _merge_launch(mp, 1 << 22, 128, (256, 1, 1, 128, 1, 1))
            o, f = _t(dt), _t(torch.float32)
            print(f"sm_{arch} merge_two {dt}", compile_launch(bound.fn, (o, f, o, f, o, f, *tail), bound.meta, arch))


    if spills:
        sys.exit("spills:\n" + "\n".join(spills))


if __name__ == "__main__":
    main()
