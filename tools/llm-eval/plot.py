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


def draw(ax, rows, key):
    """One line per tiered hbm fraction, a marker for int8, lines for h2o and streaming."""
    hbms = sorted({r["hbm_frac"] for r in rows if r["policy"] == "tiered" and r["t2_frac"] == 0})
    markers = ["o", "s", "^", "D"]
    for i, h in enumerate(hbms):
        pts = sorted((r["budget"], r[key]) for r in rows
                     if r["policy"] == "tiered" and r["t2_frac"] == 0 and r["hbm_frac"] == h)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                label=f"tiered, hbm {h:.0%}", alpha=0.8)
    for r in rows:
        if r["policy"] == "tiered" and r["t2_frac"] > 0:
            keys = r.get("t2_keys", "head")
            # hollow for per-channel keys: the two int8 rows sit on the same budget
            ax.plot([r["budget"]], [r[key]], marker="*" if keys == "head" else "h",
                    markersize=13 if keys == "head" else 16, linestyle="",
                    fillstyle="full" if keys == "head" else "none",
                    label=f"tiered + int8 T2 on {r['t2_frac']:.0%} (keys per {keys}), "
                          f"hbm {r['hbm_frac']:.0%}")
    for pol, mk in (("h2o", "v"), ("streaming", "x")):
        pts = sorted((r["budget"], r[key]) for r in rows if r["policy"] == pol)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=mk, linestyle="--",
                    label=pol)
    for r in rows:
        if r["policy"] == "full":
            ax.plot([r["budget"]], [r[key]], marker="P", markersize=10, linestyle="",
                    color="black", label="full")


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        d = json.load(f)
    rows = d["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120)
    for ax, key, label in ((axes[0], "agreement", "token agreement with the full cache"),
                           (axes[1], "ppl", "perplexity of the full-cache continuation")):
        draw(ax, rows, key)
        ax.set_xlabel("budget: fraction of tokens kept (not evicted)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    if "ppl_full" in d:
        axes[1].axhline(d["ppl_full"], color="black", linewidth=0.8, linestyle=":",
                        label="full cache (local)")
    lo = min(r["agreement"] for r in rows)
    axes[0].set_ylim(max(0.0, lo - 0.05), 1.01)
    axes[0].legend(fontsize=8, loc="lower right")
    axes[1].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"SmolLM2-135M-Instruct through kvtierd: {d['prompts']} prompts x {d['tokens']} "
                 f"teacher-forced tokens (Δ {d['delta']}, window {d['window']}, prompt "
                 f"protected)", fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
