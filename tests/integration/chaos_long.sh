#!/bin/sh
# SPDX-License-Identifier: MIT
#
# chaos_long.sh - the chaos test at scale: N clients (default 10000) SIGKILLed at seeded random
# moments mid-work beside a decoding survivor; the daemon must stay up, the survivor's results
# stay right, and afterwards the daemon holds no session or pool byte and the descriptors and
# mappings it held before (check_chaos.c asserts all of it and prints the numbers).
# Not run by CI; RELIABILITY.md records a run.
#
#   tests/integration/chaos_long.sh BUILD_DIR [VICTIMS]
#
# Run it niced on a shared machine: nice -n 10 tests/integration/chaos_long.sh build
set -eu

build=${1:?usage: chaos_long.sh BUILD_DIR [VICTIMS]}
victims=${2:-10000}
bin=$build/tests/integration/itest_check_chaos

[ -x "$bin" ] || { echo "chaos_long.sh: $bin not built (cmake --build $build)" >&2; exit 2; }
start=$(date +%s)
# The test's own 300 s limit is for CI's 40 victims; scale it with the count.
KVTIERD=$build/daemon/kvtierd KVT_CHAOS_VICTIMS=$victims \
	CK_TIMEOUT_MULTIPLIER=$((victims / 40 + 1)) "$bin"
echo "chaos_long.sh: $victims victims in $(($(date +%s) - start)) s"
