#!/bin/sh
# kvtier-bench gpu-decode's logic on the CUDA shim at tiny shapes: --check must pass (device
# attention and GEMV equal a CPU reference; kvtier's T0 + staged attention equals the all-in-HBM
# one over the same rows, every layer, through the pipelined FETCHes), and every row of the JSON
# carries the keys with positive numbers. $1: the shim-linked benchmark.
set -eu
out=$("$1" --layers 3 --q-heads 4 --kv-heads 2 --head-dim 8 --hidden 32 --ffn 48 \
	--ctx 40,600 --hbm 0.3,0.7 --steps 2 --warmup 1 --check)
printf '%s\n' "$out"
printf '%s\n' "$out" | python3 -c '
import json, math, struct, sys
d = json.load(sys.stdin)
rows = d["rows"]
assert [(r["ctx"], r["hbm_frac"]) for r in rows] == [(40, 0.3), (40, 0.7), (600, 0.3), (600, 0.7)], rows
for r in rows:
    for k in ("ctx", "hbm_frac", "tok_s_hbm", "tok_s_kvtier", "tok_s_bound", "h2d_gbps"):
        assert r[k] > 0, (k, r)
    # the bound is never below what the all-in-HBM step allows
    assert r["tok_s_bound"] <= r["tok_s_hbm"] * 1.0001, r
    # staged bytes: (ctx - ceil(hbm ctx)) rows x layers x K,V x kv_heads x head_dim x 2 bytes
    f32 = struct.unpack("f", struct.pack("f", r["hbm_frac"]))[0]  # as the daemon sees it
    want = (r["ctx"] - math.ceil(f32 * r["ctx"])) * 3 * 2 * 2 * 8 * 2
    assert r["staged_bytes_per_step"] == want, (want, r)
print("gpu-decode JSON ok:", len(rows), "rows")
'
