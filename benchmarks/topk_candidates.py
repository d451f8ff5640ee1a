"""Stage 1's candidate counts, simulated in NumPy (no GPU): per chunk, the threshold ``t`` = the k-th largest of
the R column maxima rounded down to 16 bits, as ``_topk_chunk_kernel`` computes it, and ``n_c = #{x >= t}``;
chunks with ``n_c > CAP`` take the exact path. Also the row's ``#{x >= lo}``, ``lo = max_c t_c`` (what the merge
starts from). i.i.d. N(0, 1) float32 rows, one row per line.

``python benchmarks/topk_candidates.py``
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


def main():
    rng = np.random.default_rng(0)
    for V in (128256, 262144):
        for k, block, R, cap in ((1024, 16384, 1024, 2048), (1024, 16384, 2048, 2048), (1024, 32768, 2048, 2048),
                                 (256, 16384, 512, 512), (256, 8192, 512, 512), (50, 2048, 128, 128)):
            print(simulate(rng, V, k, block, R, cap), flush=True)


if __name__ == "__main__":
    main()
