#!/usr/bin/env python3
"""main-job-report.py FULL.json KVTIER.json... - compare kvtier-llm runs with the full cache.

tools/quickstart.sh's main job runs one prompt with the whole KV cache in the process
(kvtier-llm --kv local --json) and the same prompt through kvtierd under several tier budgets
(--kv kvtier --json). This prints, for each kvtier run, where its rows lived and how many of its
generated tokens equal the full cache's, so a reader can tell offloading (lossless) from int8
and eviction (lossy) at a glance.
"""
import json
import sys
import textwrap

LEGEND = (
    "  T0  rows resident on the device (HBM; here the client's T0 buffer)\n"
    "  T1  rows offloaded to kvtierd's pinned host pool, full precision\n"
    "  T2  rows offloaded as int8 (one scale per token and head)\n"
    "  T3  rows evicted: gone for good"
)


def load(path):
    with open(path) as f:
        return json.load(f)


def agreement(ref, run):
    """Tokens equal position by position, the longer length, and the first difference."""
    a, b = ref["tokens"], run["tokens"]
    same = sum(1 for x, y in zip(a, b) if x == y)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return same, max(len(a), len(b)), first


def wrap(text):
    return textwrap.indent(textwrap.fill(" ".join(text.split()), 96), "    ")


def describe(run):
    t = run["tiers"]
    total = sum(t)
    pct = [100.0 * x / total if total else 0.0 for x in t]
    return (
        f"hbm {run['hbm_frac']:.0%}, int8 {run['t2_frac']:.0%}, evict {run['evict_frac']:.0%}: "
        f"{total} positions = T0 {t[0]} ({pct[0]:.0f}%)  T1 {t[1]} ({pct[1]:.0f}%)  "
        f"T2 {t[2]} ({pct[2]:.0f}%)  T3 {t[3]} ({pct[3]:.0f}%)"
    )


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: main-job-report.py FULL.json KVTIER.json...")
    ref = load(argv[1])
    print(f"\nFull KV cache in the process ({ref['generated_tokens']} tokens, "
          f"{ref['decode_tokens_per_s']:.1f} tok/s):")
    print(wrap(ref["text"]))
    for path in argv[2:]:
        run = load(path)
        same, n, first = agreement(ref, run)
        print(f"\nkvtier, {describe(run)}  ({run['decode_tokens_per_s']:.1f} tok/s)")
        if first is None:
            offloaded = sum(run["tiers"][1:3])
            print(f"    identical to the full cache, token for token ({same} of {n}), "
                  f"with {offloaded} rows offloaded out of T0")
        else:
            print(f"    the first {first} of {n} generated tokens equal the full cache's, "
                  f"then the text takes another path:")
            print(wrap(run["text"]))
    print("\nTiers:\n" + LEGEND)


if __name__ == "__main__":
    main(sys.argv)
