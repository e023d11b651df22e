#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plot kvtier-bench-retrieval --sweep --json: time per query against recall@100.

usage: plot_frontier.py SWEEP.json [MORE.json ...] OUT.png

One panel per (data set, N); one curve per method, its points the method's knob settings
(kvtier: candidate and collision ratios, with and without the exact refine; IVFPQ: nprobe,
alone and with exact rescoring of 16k PQ candidates; HNSW, FAISS's and hnswlib's: efSearch); flat, the exact fp16
scan, kvtier's default (what kvtierd's TOPK runs) and kvtier's whole-zone exact scan are single
points; kvtier-fast is a curve over its candidate count C, kvtier-probe a scatter over its probe
and C (24 points, not one curve). A method missing from STYLE is not
drawn, so a new one needs an entry. The y axis is log-scaled (single-thread median microseconds per query).
Rows from several files are merged, so a 1M run without FAISS can sit beside smaller ones.
Needs matplotlib (pip install matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "kvtier-estimate": ("o", "-"),
    "kvtier-refine": ("s", "-"),
    "kvtier-default": ("P", ""),
    "kvtier-exact": ("p", ""),
    "kvtier-sketch": ("h", ""),
    "kvtier-sketch-f32": ("H", ""),
    "kvtier-fast": ("<", "-"),
    "kvtier-probe": (">", ""),
    "exact": ("*", ""),
    "faiss-flat": ("X", ""),
    "faiss-ivfpq": ("v", "--"),
    "faiss-ivfpq-refine": ("^", "--"),
    "faiss-hnsw": ("D", ":"),
    "hnswlib": ("d", "-."),
    "hnswlib-l2": ("1", "-."),
}


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    rows = []
    for path in argv[1:-1]:
        with open(path) as f:
            rows += [r for r in json.load(f)["rows"] if r["k"] == 100]
    panels = sorted({(r["data"], r["n"]) for r in rows}, key=lambda p: (p[0] != "outlier", p))
    cols = min(3, len(panels))
    nrow = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(5.2 * cols, 4.2 * nrow), squeeze=False)
    for ax, (data, n) in zip(axes.flat, panels):
        sel = [r for r in rows if r["data"] == data and r["n"] == n]
        for method in [m for m in STYLE if any(r["method"] == m for r in sel)]:
            pts = sorted((r["recall"], r["us_per_query"]) for r in sel if r["method"] == method)
            mk, ls = STYLE[method]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=mk, linestyle=ls or "None",
                    label=method, alpha=0.85)
        ax.set_yscale("log")
        ax.set_xlim(0.0, 1.02)
        ax.axvline(0.8, color="grey", linewidth=0.6, linestyle=":")
        ax.set_title(f"{data}, N = {n // 1024}K" if n < 1 << 20 else f"{data}, N = {n >> 20}M")
        ax.set_xlabel("recall@100 (mean over queries)")
        ax.set_ylabel("µs per query (1 thread, median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(argv[-1], dpi=110)


if __name__ == "__main__":
    main(sys.argv)
