#!/bin/sh
# check_ring_ratio.sh KVTIER_BENCH [MIN_RATIO] [TRIES]
#
# The ring's batch-32 NOP throughput through libkvtier and kvtierd against io_uring's batch-32
# NOPs, in one kvtier-bench process: a same-run ratio, so a slow or busy machine moves both
# figures. Healthy, the ring does about twice io_uring's NOPs (BENCHMARKS.md); a 2x loss on the
# data path brings it near 1. The test passes at the first try whose ratio reaches MIN_RATIO
# (default 1.2) and fails only when TRIES (default 5) tries all fall short: a try lost to a
# descheduled spinner cannot fail it alone. Every try's figures go to the test log.
set -eu
bench=$1
min=${2:-1.2}
tries=${3:-5}

i=1
while [ "$i" -le "$tries" ]; do
	out=$("$bench" ring --only uring_batch32,batch32 --reps 5 --iters 20000 --json)
	verdict=$(printf '%s' "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
ring, uring = d["batch32_ops_per_s"], d["uring_batch32_ops_per_s"]
if not ring or not uring:
    print("error: a row failed:", d.get("errors"))
    sys.exit()
r = ring / uring
word = "ok" if r >= float(sys.argv[1]) else "low"
print(f"{r:.2f} {word} (batch32 {ring:.0f} ops/s, io_uring NOP batch32 {uring:.0f} ops/s)")
' "$min")
	echo "try $i: batch32_vs_uring $verdict (need >= $min)"
	case $verdict in
	*" ok "*) exit 0 ;;
	error*) exit 1 ;;
	esac
	i=$((i + 1))
done
echo "FAIL: the ring's batch-32 throughput stayed below $min x io_uring's in $tries tries:" \
	"the data path lost about half its speed (tools/perf-ab.sh REV ring finds where)"
exit 1
