"""Compile the decode kernels for sm_90 / sm_80 / sm_89 as the plans launch them (no GPU needed): registers, stack
(spills), shared memory. ``python tools/decode_compile.py``.

``python tools/decode_compile.py --paged``: the balanced kernel's key-tile loop on sm_90a for the dense default and
the paged address forms (``PAGED_VARIANTS``) at pages 16 and 256: SASS instructions per tile and warp, per key
(all warps), per loaded K / V element and thread, the 16-byte cp.async (LDGSTS.E.BYPASS.128) and page-number loads
(LDG.E.CONSTANT) per tile and thread, registers and stack."""

from __future__ import annotations

import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from compiler_report import TARGETS, compile_launch  # noqa: E402

from onlinesoftmax.decode.launch import _launches, _merge_launch, _spec  # noqa: E402
from onlinesoftmax.decode.plan import Knobs, Problem, decode_plan, merge_plan  # noqa: E402
from onlinesoftmax.target import H200  # noqa: E402

# the paged address forms: the default (ahead 2, one page number per key, 64-key tiles over 4 warps, 3 programs per
# SM), one page number per page on those tiles (ahead 3) and on the dense cache's tiles (dense_tiles)
PAGED_VARIANTS = {"default": {}, "ahead3": dict(ahead=3), "ahead3 p2": dict(ahead=3, programs_per_sm=2),
                  "dense_tiles": dict(dense_tiles=True)}


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


def sass_loop(sass: str) -> list[str]:
    """The opcodes of the innermost loop holding 16-byte cp.async (the key-tile loop): the shortest span from a
    backward branch's target to the branch."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    loops = []
    for at, text in ins:
        m = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < at:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= at]
            if any("LDGSTS" in t for t in body):
                loops.append(body)
    body = min(loops, key=len) if loops else []
    return [(t.split()[1] if t.startswith("@") else t.split()[0]) for t in body]


def paged_report(B=8, H=32, Hkv=8, S=16384, D=128, log=print) -> list[dict]:
    """The balanced kernel's tile loop (sm_90a) for the dense default and each paged variant at pages 16 / 256."""
    q, i, f = _t(torch.bfloat16), _t(torch.int32), _t(torch.float32)
    rows = []
    for page in (0, 16, 256):
        for name, kw in (PAGED_VARIANTS if page else {"default": {}}).items():
            p = Problem(B, H, Hkv, 1, D, S, page, 2)
            plan = decode_plan(p, H200, Knobs.of(**kw))
            kst = (Hkv * page * D, page * D, D, 1) if page else (Hkv * S * D, S * D, D, 1)
            ost, bts = (H * D, D, D, 1), S // max(page, 1)
            try:
                spec = _spec(p.s_max, ost, kst, kst, bts, ost, -1, -1)
                (kv, kv_args, _), *_ = _launches(plan, p, (bool(page), True, False, False, False, False),
                                                 (0.1, 0.0, -1, -1), ost, ost, spec)
                args = kv_args(q, q, q, i, i, q, f, f, f, p.s_max, kst, kst, bts)
                r = compile_launch(kv.fn, args, kv.meta, 90, keep_sass=True)
            except Exception as e:      # a variant that does not compile is reported, the others go on
                log(f"page {page:3} {name:12} FAILED {str(e).splitlines()[0][:200]}")
                continue
            ops = sass_loop(r.pop("sass_text"))
            c = Counter(op for op in ops)
            per_thread = plan.block_n * D * 2 // (32 * plan.num_warps)     # K and V elements a thread loads a tile
            row = dict(page=page, variant=name, block_n=plan.block_n, warps=plan.num_warps, splits=plan.splits,
                       ahead=plan.ahead, regs=r["regs"], stack=r["stack"], shared=r["shared"], loop=len(ops),
                       per_key=len(ops) * plan.num_warps / plan.block_n, per_element=len(ops) / per_thread,
                       cp_async_16B=c["LDGSTS.E.BYPASS.128"], table_loads=c["LDG.E.CONSTANT"],
                       integer=sum(v for k, v in c.items() if k.split(".")[0] in (
                           "IMAD", "LEA", "IADD3", "SHF", "LOP3", "VIMNMX", "VIADD", "IABS", "SEL", "ISETP")))
            rows.append(row)
            log(f"page {page:3} {name:12} n{plan.block_n:<3} w{plan.num_warps} s{plan.splits:<3} ahead {plan.ahead} "
                f"regs {r['regs']:3} stack {r['stack']:2} smem {r['shared'] // 1024:3}K | loop {len(ops):3} instr/warp "
                f"({row['integer']:3} integer), {row['per_key']:5.1f}/key, {row['per_element']:4.2f}/element, "
                f"cp.async.16B {row['cp_async_16B']:2}, table loads {row['table_loads']:2} per tile and thread")
    return rows


if __name__ == "__main__":
    if "--paged" in sys.argv:
        paged_report()
    else:
        main()
