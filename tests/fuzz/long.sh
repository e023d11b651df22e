#!/bin/sh
# SPDX-License-Identifier: MIT
#
# long.sh - the fuzz tests at scale, not run by CI (RELIABILITY.md records a run):
#  1. fuzz_sqe (the SQE drain of the daemon core, seeded generator) in chunks of 2000 inputs of
#     up to 256 SQEs each, a new seed per chunk, until SQES fuzzed SQEs have been drained
#     (default 10,000,000);
#  2. check_ctl_fuzz (a real kvtierd's control socket from raw connections: random, malformed
#     and valid HELLOs and every other message type, fds of every kind) for ROUNDS connections
#     (default 200,000) in chunks of 20,000, a new seed and a new daemon per chunk.
# Any crash, sanitizer report, unanswered SQE, lost pool byte or broken reply stops the run and
# prints the seed that reproduces it.
#
#   tests/fuzz/long.sh BUILD_DIR [SQES] [ROUNDS]
#
# BUILD_DIR may be a sanitizer build (-DKVT_SANITIZE=address,undefined): slower, finds more.
set -eu

build=${1:?usage: long.sh BUILD_DIR [SQES] [ROUNDS]}
want_sqes=${2:-10000000}
want_rounds=${3:-200000}
fuzz=$build/tests/fuzz/fuzz_sqe
ctl=$build/tests/integration/itest_check_ctl_fuzz
for b in "$fuzz" "$ctl" "$build/daemon/kvtierd"; do
	[ -x "$b" ] || { echo "long.sh: $b not built (cmake --build $build)" >&2; exit 2; }
done
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
log=$(mktemp /tmp/kvt-long-XXXXXX)
trap 'rm -f "$log"' EXIT

start=$(date +%s)
sqes=0
inputs=0
seed=1
while [ "$sqes" -lt "$want_sqes" ]; do
	if ! KVT_FUZZ_SQES=256 "$fuzz" 2000 "$seed" >"$log" 2>&1; then
		cat "$log"
		echo "long.sh: fuzz_sqe failed: reproduce with KVT_FUZZ_SQES=256 $fuzz 2000 $seed" >&2
		exit 1
	fi
	n=$(sed -n 's/^fuzz_sqe: \([0-9]*\) inputs, \([0-9]*\) fuzzed SQEs.*/\2/p' "$log")
	[ -n "$n" ] || { cat "$log"; echo "long.sh: no count from fuzz_sqe" >&2; exit 1; }
	sqes=$((sqes + n))
	inputs=$((inputs + 2000))
	seed=$((seed + 1))
	[ $((seed % 50)) -ne 0 ] || echo "long.sh: fuzz_sqe $inputs inputs, $sqes SQEs"
done
mid=$(date +%s)
echo "long.sh: fuzz_sqe: $inputs inputs (sessions), $sqes fuzzed SQEs, seeds 1-$((seed - 1)), no failure, $((mid - start)) s"

rounds=0
msgs=0
chunk=0
while [ "$rounds" -lt "$want_rounds" ]; do
	chunk=$((chunk + 1))
	r=$((want_rounds - rounds))
	[ "$r" -le 20000 ] || r=20000
	if ! KVTIERD=$build/daemon/kvtierd KVT_CTL_FUZZ_ROUNDS=$r KVT_CTL_FUZZ_SEED=$chunk \
		CK_TIMEOUT_MULTIPLIER=$((r / 400 + 1)) "$ctl" >"$log" 2>&1; then
		cat "$log"
		echo "long.sh: check_ctl_fuzz failed: reproduce with KVT_CTL_FUZZ_ROUNDS=$r KVT_CTL_FUZZ_SEED=$chunk" >&2
		exit 1
	fi
	n=$(sed -n 's/^check_ctl_fuzz: [0-9]* connections, \([0-9]*\) messages.*/\1/p' "$log")
	[ -n "$n" ] || { cat "$log"; echo "long.sh: no count from check_ctl_fuzz" >&2; exit 1; }
	msgs=$((msgs + n))
	rounds=$((rounds + r))
	grep '^check_ctl_fuzz:' "$log"
done
echo "long.sh: check_ctl_fuzz: $rounds connections, $msgs messages, seeds 1-$chunk, no failure, $(($(date +%s) - mid)) s"
echo "long.sh: $((sqes + msgs)) fuzz executions (SQEs + control messages) in $(($(date +%s) - start)) s"
