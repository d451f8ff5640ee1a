"""Plot the paper's §4 experiment from ``onlinesoftmax bench topk-paper`` JSON: speed-up of the fused
softmax + top-k (K = 5) over unfused safe softmax → top-k, against V, for batch 4000 and 10.

    python benchmarks/topk_paper_plot.py benchmarks/results/topk/topk-paper.json benchmarks/results/topk/topk-paper.png
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(src: str, dst: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(src))
    ms = defaultdict(dict)
    for r in data["rows"]:
        if r["ms"]:
            ms[(r["group"], r["x"])][r["impl"]] = r["ms"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for group in sorted({g for g, _ in ms}, key=lambda g: -int(g.split()[-1])):
        pts = sorted((v, d["safe softmax→topk (unfused)"] / d["softmax_topk (fused)"])
                     for (g, v), d in ms.items() if g == group and len(d) == 2)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=group)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(5.0, color="gray", ls="--", lw=0.8, label="paper's best (V100): 5×")
    ax.set_xscale("log")
    ax.set_xlabel("V")
    ax.set_ylabel("speed-up over safe softmax → topk")
    ax.set_title(f"fused softmax + top-k, K = 5 ({data['env']['device'].split(' (')[0]})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
