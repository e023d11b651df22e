#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check kvtier-bench-retrieval --sweep --json rows against the frontier target.

usage: frontier_check.py SWEEP.json [MORE.json ...]

Target: at every recall level >= 0.8 that a peer reaches, kvtier is faster. For each (data set,
N) and each peer point (method, knob) with mean recall@100 >= 0.8, the fastest kvtier point
(any kvtier-* method and knob, the exact scan included) whose mean recall is at least the
peer's is found, and the ratio kvtier time / peer time printed (< 1: kvtier faster). A peer
point no kvtier point matches in recall is marked "unmatched". Rows from several files are
merged (later files win for the same data, N, method and knob). Mean and p5 recall are shown.
"""
import json
import sys


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    rows = {}
    for path in argv[1:]:
        with open(path) as f:
            for r in json.load(f)["rows"]:
                if r["k"] == 100:
                    rows[(r["data"], r["n"], r["method"], r["param"])] = r
    panels = sorted({(d, n) for d, n, _, _ in rows})
    worst = {}
    for data, n in panels:
        sel = [r for (d, m, _, _), r in rows.items() if d == data and m == n]
        kv = [r for r in sel if r["method"].startswith("kvtier")]
        peers = [r for r in sel if not r["method"].startswith("kvtier") and r["recall"] >= 0.8]
        for p in sorted(peers, key=lambda r: (r["method"], r["recall"])):
            ok = [r for r in kv if r["recall"] >= p["recall"] - 1e-9]  # means of equal hits
            if not ok:
                print(f"{data:12} {n:8} {p['method']:18} {p['recall']:.3f}/{p['recall_p5']:.2f} "
                      f"{p['us_per_query']:9.0f} us  unmatched  [{p['param']}]")
                continue
            best = min(ok, key=lambda r: r["us_per_query"])
            ratio = best["us_per_query"] / p["us_per_query"]
            key = (data, n, p["method"])
            worst[key] = max(worst.get(key, 0.0), ratio)
            print(f"{data:12} {n:8} {p['method']:18} {p['recall']:.3f}/{p['recall_p5']:.2f} "
                  f"{p['us_per_query']:9.0f} us  kvtier {best['recall']:.3f}/"
                  f"{best['recall_p5']:.2f} {best['us_per_query']:9.0f} us  {ratio:5.2f}x  "
                  f"[{p['param']}] vs {best['method']} [{best['param']}]")
    print("\nworst kvtier/peer time ratio per (data, N, peer) over peer points >= 0.8:")
    for (data, n, m), r in sorted(worst.items()):
        print(f"  {data:12} {n:8} {m:18} {r:5.2f}x {'met' if r < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main(sys.argv)
