#!/usr/bin/env bash
# tools/perf-ab.sh [-n ROUNDS] [-k REGEX] [-o FILE] REV [BENCH...]
#
# A/B performance check: builds REV and the working tree side by side in Release, runs the
# chosen benchmarks alternately (old, new, old, new ...) ROUNDS times, and prints, for every
# numeric figure the benchmarks report, the old and new medians, their ratio new/old, the
# spread of the per-round ratios (min..max), and the ratio of each side's best round (lowest
# time, highest rate). Alternating pairs share the machine's noise, so the ratios are what to
# read on a busy host; a single figure is not. Where a busy host makes a figure bimodal (a
# descheduled spinner on 2 vCPUs), the best-round ratio is the steadier one.
#
#   REV      any git revision (a commit, tag, branch, HEAD~3)
#   BENCH    ring (default), tier, prefix, llm, transformers:
#              ring          kvtier-bench ring --json: NOP spin/sleep round trips, batch-32
#                            throughput, io_uring and ping-pong peers (KVT_AB_RING_ARGS)
#              tier          kvtier-bench tier --json --no-step (quantize, gather, select)
#              prefix        kvtier-bench prefix --json: time to first token shared vs cold
#              llm           kvtier-llm --eval --quick speed: decode tok/s kvtier vs local
#              transformers  python -m kvtier.bench transformers --json (needs the Python
#                            venv tools/quickstart.sh test builds)
#   -n N     rounds (default 5); each round runs every bench once per side
#   -k RE    print only the figures whose key matches RE (Python regex)
#   -o FILE  also write every sample and summary as JSON to FILE
#
# Builds are cached under $KVT_AB_DIR (default build-ab/ in the checkout): REV's source is
# exported with git archive and built once per commit; the working tree is rebuilt each call.
# The model for prefix and llm comes from tools/fetch-model.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ab=${KVT_AB_DIR:-$root/build-ab}
jobs=${KVT_JOBS:-$(nproc)}
rounds=5 keys="" out=""

die() { printf 'perf-ab: %s\n' "$*" >&2; exit 2; }
log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

while getopts "n:k:o:h" o; do
	case $o in
	n) rounds=$OPTARG ;;
	k) keys=$OPTARG ;;
	o) out=$OPTARG ;;
	h) usage; exit 0 ;;
	*) usage >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
(($#)) || { usage >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "-n wants a positive number of rounds, not '$rounds'"
rev=$1
shift
benches=("$@")
((${#benches[@]})) || benches=(ring)
for b in "${benches[@]}"; do
	case $b in
	ring | tier | prefix | llm | transformers) ;;
	*) die "unknown bench '$b' (ring, tier, prefix, llm, transformers)" ;;
	esac
done
sha=$(git -C "$root" rev-parse --verify -q "$rev^{commit}") ||
	die "'$rev' is not a commit in $root (git rev-parse refused it)"

build() { # src dir
	cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DKVT_WERROR=OFF -DBUILD_TESTING=OFF \
		>"$2.log" 2>&1 || { cat "$2.log" >&2; die "configuring $1 failed"; }
	cmake --build "$2" -j "$jobs" >>"$2.log" 2>&1 || { tail -30 "$2.log" >&2; die "building $1 failed"; }
}
mkdir -p "$ab"
old_src=$ab/src-${sha:0:12} old=$ab/old-${sha:0:12} new=$ab/new
if [ ! -x "$old/daemon/kvtierd" ]; then
	log "building $rev (${sha:0:12}) in $old"
	rm -rf "$old_src" && mkdir -p "$old_src" "$old"
	git -C "$root" archive "$sha" | tar -x -C "$old_src"
	build "$old_src" "$old"
fi
log "building the working tree in $new"
mkdir -p "$new"
build "$root" "$new"

model=""
for b in "${benches[@]}"; do
	if [ "$b" = prefix ] || [ "$b" = llm ]; then
		model=$("$root/tools/fetch-model.sh") || die "tools/fetch-model.sh found no model"
	fi
done
venv=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venv
for b in "${benches[@]}"; do
	[ "$b" != transformers ] || [ -x "$venv/bin/python" ] ||
		die "no venv at $venv: run tools/quickstart.sh test once"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/perf-ab.XXXXXX")
dpid=""
cleanup() {
	[ -z "$dpid" ] || kill "$dpid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# run_bench BENCH BUILD SRC: one JSON object on stdout.
run_bench() {
	local b=$1 bd=$2 src=$3 r=0
	case $b in
	ring)
		# shellcheck disable=SC2086 # the args are words
		"$bd/tools/bench/kvtier-bench" ring --json \
			${KVT_AB_RING_ARGS:---only pingpong,uring_batch32,spin,sleep,batch32 --reps 3}
		;;
	tier) "$bd/tools/bench/kvtier-bench" tier --json --no-step --reps 3 ;;
	prefix) "$bd/tools/bench/kvtier-bench" prefix --json --reps 2 --model "$model" ;;
	llm)
		"$bd/daemon/kvtierd" --config /dev/null --backend host --socket "$tmp/llm.sock" \
			--pool-size 256M --lock no --log-level warning 2>"$tmp/kvtierd.log" &
		dpid=$!
		for _ in $(seq 100); do [ -S "$tmp/llm.sock" ] && break; sleep 0.1; done
		"$bd/tools/llm/kvtier-llm" --model "$model" --socket "$tmp/llm.sock" --eval --quick \
			--eval-prompts 1 --json || r=$?
		kill "$dpid" && wait "$dpid" 2>/dev/null || true
		dpid=""
		return $r
		;;
	transformers)
		KVTIER_LIB="$bd/client/libkvtier.so.0" KVT_BUILD_DIR="$bd" PYTHONPATH="$src/client/python" \
			PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m kvtier.bench transformers --json \
			--reps 3 --tokens 64
		;;
	esac
}

for ((i = 1; i <= rounds; i++)); do
	for b in "${benches[@]}"; do
		# Alternate which side goes first, so neither always gets the warmer machine.
		if ((i % 2)); then sides=(old new); else sides=(new old); fi
		for side in "${sides[@]}"; do
			if [ "$side" = old ]; then bd=$old src=$old_src; else bd=$new src=$root; fi
			log "round $i/$rounds: $b ($side)"
			# One retry: an old revision may carry a since-fixed flaky failure.
			run_bench "$b" "$bd" "$src" >"$tmp/$b.$side.$i.json" 2>"$tmp/$b.$side.$i.err" ||
				run_bench "$b" "$bd" "$src" >"$tmp/$b.$side.$i.json" 2>"$tmp/$b.$side.$i.err" || {
				tail -5 "$tmp/$b.$side.$i.err" >&2
				die "$b ($side, round $i) failed twice"
			}
		done
	done
done

python3 - "$tmp" "$rounds" "${sha:0:12}" "$keys" "$out" "${benches[@]}" <<'EOF'
import json, re, statistics, sys

tmp, rounds, rev, keys, out, benches = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], \
    sys.argv[5], sys.argv[6:]


def leaves(obj, prefix=""):
    """Every numeric leaf of a JSON object, as dotted keys (lists by index)."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield prefix, float(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{prefix}[{i}]")


res = {"rev": rev, "rounds": rounds, "figures": {}}
print(f"perf-ab: {rev} (old) against the working tree (new), {rounds} alternating rounds")
print(f"{'figure':<40} {'old':>11} {'new':>11} {'new/old':>8} {'spread':>13} {'best':>6}")
for b in benches:
    samples = {}
    for i in range(1, rounds + 1):
        for side in ("old", "new"):
            with open(f"{tmp}/{b}.{side}.{i}.json") as f:
                for k, v in leaves(json.load(f)):
                    samples.setdefault(f"{b}.{k}", {"old": [], "new": []})[side].append(v)
    for k, s in samples.items():
        if keys and not re.search(keys, k):
            continue
        if len(s["old"]) != rounds or len(s["new"]) != rounds:
            continue  # a figure one side does not report
        mo, mn = statistics.median(s["old"]), statistics.median(s["new"])
        ratios = [n / o for o, n in zip(s["old"], s["new"]) if o]
        ratio = mn / mo if mo else None
        spread = f"{min(ratios):.2f}..{max(ratios):.2f}" if ratios else "-"
        res["figures"][k] = {"old": s["old"], "new": s["new"], "ratio": ratio,
                             "ratio_min": min(ratios) if ratios else None,
                             "ratio_max": max(ratios) if ratios else None}
        # Interference only slows a run down: each side's best run is its figure on a quiet
        # machine (lowest for times, highest for everything else).
        pick = min if re.search(r"_(ns|us|ms|s)$", k) else max
        bo, bn = pick(s["old"]), pick(s["new"])
        best = bn / bo if bo else None
        res["figures"][k]["best_ratio"] = best
        rs = f"{ratio:.3f}" if ratio is not None else "-"
        bs = f"{best:.3f}" if best is not None else "-"
        print(f"{k:<40} {mo:>11.6g} {mn:>11.6g} {rs:>8} {spread:>13} {bs:>6}")
if out:
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
EOF
