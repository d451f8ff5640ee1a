"""Stage 1's candidate counts, simulated in NumPy (no GPU): per chunk, the threshold ``t`` = the k-th largest of
the R column maxima rounded down to 16 bits, as ``_topk_chunk_kernel`` computes it, and ``n_c = #{x >= t}``;
chunks with ``n_c > CAP`` take the exact path. Also the row's ``#{x >= lo}``, ``lo = max_c t_c`` (what the merge
starts from). i.i.d. N(0, 1) float32 rows, one row per line.

``--row-bound``: the merge's start with ``row_bound`` (k <= S chunks): ``lo = max(max_c t_c, T)``, T the k-th
largest chunk maximum; the merge needs no narrowing pass when ``#{x >= lo} <= CAP`` (percentiles over rows).

``python benchmarks/topk_candidates.py [--row-bound]``
"""

from __future__ import annotations

import numpy as np


def keys(x: np.ndarray) -> np.ndarray:
    """The kernels' order-preserving int key of float32 (as int64 here)."""
    b = x.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(b < 0, b ^ 0x7FFFFFFF, b)


def simulate(rng, V: int, k: int, block: int, R: int, cap: int) -> str:
    x = rng.standard_normal(V).astype(np.float32)
    S = -(-V // block)
    ns, ts, cands = [], [], []
    for c in range(S):
        chunk = np.full(block, -np.inf, np.float32)
        part = x[c * block:(c + 1) * block]
        chunk[:len(part)] = part
        gk = np.sort(keys(chunk.reshape(block // R, R).max(0)))[::-1]     # column maxima, descending
        t = ((gk[k - 1] if len(gk) >= k else -2 ** 31) >> 16) << 16
        kc = keys(chunk)
        cands.append(kc[kc >= t])
        ns.append(len(cands[-1]))
        ts.append(t)
    lo = max(ts)
    row = int((np.concatenate(cands) >= lo).sum())
    return (f"V {V:6d} k {k:4d} block {block:5d} R {R:4d} CAP {cap:4d} S {S:3d} | n_c min {min(ns):4d} mean "
            f"{int(np.mean(ns)):4d} max {max(ns):4d} | chunks over CAP (exact path) {sum(n > cap for n in ns):3d} "
            f"of {S:3d} | row #{{x >= max t_c}} {row}")


def row_bound_stats(rng, V: int, k: int, block: int, R: int, cap: int, rows: int = 200) -> str:
    S = -(-V // block)
    n_lo, n_rb = [], []
    for _ in range(rows):
        x = np.full(S * block, -np.inf, np.float32)
        x[:V] = rng.standard_normal(V).astype(np.float32)
        kc = keys(x).reshape(S, block)
        gk = np.sort(kc.reshape(S, block // R, R).max(1), axis=1)[:, ::-1]        # [S, R] column maxima, desc
        lo = int(((gk[:, k - 1] >> 16) << 16).max())                               # max_c t_c (16-bit t_c)
        T = int(np.sort(kc.max(1))[::-1][k - 1]) if k <= S else -2 ** 31          # k-th largest chunk maximum
        n_lo.append(int((kc >= lo).sum()))
        n_rb.append(int((kc >= max(lo, T)).sum()))
    q = lambda a: "/".join(str(int(v)) for v in np.percentile(a, [0, 50, 90, 100]))   # noqa: E731
    return (f"V {V:6d} k {k:4d} block {block:5d} S {S:3d} CAP {cap:4d} | #{{x >= max t_c}} min/median/p90/max "
            f"{q(n_lo)} | with the row bound {q(n_rb)}, over CAP in {np.mean(np.array(n_rb) > cap):.1%} of {rows} rows")


def main():
    import sys

    rng = np.random.default_rng(0)
    if "--row-bound" in sys.argv:
        for V in (128256, 151936, 262144):
            for k, cap in ((1, 32), (8, 32), (50, 128)):
                print(row_bound_stats(rng, V, k, 2048, 128, cap), flush=True)
        return
    for V in (128256, 262144):
        for k, block, R, cap in ((1024, 16384, 1024, 2048), (1024, 16384, 2048, 2048), (1024, 32768, 2048, 2048),
                                 (256, 16384, 512, 512), (256, 8192, 512, 512), (50, 2048, 128, 128)):
            print(simulate(rng, V, k, block, R, cap), flush=True)


if __name__ == "__main__":
    main()
