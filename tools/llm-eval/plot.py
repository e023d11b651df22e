#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plot kvtier-llm --eval --json: token agreement against the cache budget, per policy.

usage: plot.py EVAL.json OUT.png

x: budget = fraction of positions kept (not evicted) at the end of each sequence, as the daemon
reported it (tiered: 1 - evict_frac; h2o: about hbm_frac; streaming: sinks + prompt + window).
y: agreement with the full-cache greedy token (teacher-forced). Tiered is one line per hbm
fraction (they overlap when Proposition 1 holds: the HBM/DDR split costs nothing), the int8 row
is a marker, h2o and streaming are lines of their own. Needs matplotlib (pip install matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        d = json.load(f)
    rows = d["rows"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)

    hbms = sorted({r["hbm_frac"] for r in rows if r["policy"] == "tiered" and r["t2_frac"] == 0})
    markers = ["o", "s", "^", "D"]
    for i, h in enumerate(hbms):
        pts = sorted((r["budget"], r["agreement"]) for r in rows
                     if r["policy"] == "tiered" and r["t2_frac"] == 0 and r["hbm_frac"] == h)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                label=f"tiered, hbm {h:.0%}", alpha=0.8)
    for r in rows:
        if r["policy"] == "tiered" and r["t2_frac"] > 0:
            ax.plot([r["budget"]], [r["agreement"]], marker="*", markersize=13, linestyle="",
                    label=f"tiered + int8 T2 on {r['t2_frac']:.0%}, hbm {r['hbm_frac']:.0%}")
    for pol, mk in (("h2o", "v"), ("streaming", "x")):
        pts = sorted((r["budget"], r["agreement"]) for r in rows if r["policy"] == pol)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=mk, linestyle="--",
                    label=pol)
    for r in rows:
        if r["policy"] == "full":
            ax.plot([r["budget"]], [r["agreement"]], marker="P", markersize=10, linestyle="",
                    color="black", label="full")

    ax.set_xlabel("budget: fraction of tokens kept (not evicted)")
    ax.set_ylabel("token agreement with the full cache")
    ax.set_title(f"SmolLM2-135M, {d['prompts']} prompts x {d['tokens']} teacher-forced tokens "
                 f"(Δ {d['delta']}, window {d['window']})", fontsize=10)
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
