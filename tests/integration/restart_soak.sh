#!/bin/sh
# SPDX-License-Identifier: MIT
#
# restart_soak.sh - check_restart's t_restart_soak at length: RESTARTS restarts in place
# (default 500) under 4 clients (APPEND, SCORE_ADD, RETIER, FETCH with rows compared bit for
# bit, TOPK; NS_OPEN, pinning LOOKUP, SEQ_OPEN from shared blocks, PUBLISH) with metrics_listen
# set; every BAD-th time (default 50) a bad configuration, a truncated binary and a foreign
# executable tried (and refused), then a binary that passes the pre-flight and exits at start
# (the old binary takes over); no session lost, and the daemon's descriptors, mappings and pool
# bytes back at the baseline. Not run by CI; RELIABILITY.md records a run.
#
#   tests/integration/restart_soak.sh BUILD_DIR [RESTARTS] [BAD]
set -eu

build=${1:?usage: restart_soak.sh BUILD_DIR [RESTARTS] [BAD]}
restarts=${2:-500}
bad=${3:-50}
bin=$build/tests/integration/itest_check_restart

[ -x "$bin" ] || { echo "restart_soak.sh: $bin not built (cmake --build $build)" >&2; exit 2; }
start=$(date +%s)
KVTIERD=$build/daemon/kvtierd KVT_RESTART_SOAK=$restarts KVT_RESTART_SOAK_BAD=$bad KVT_TEST_ONLY=t_restart_soak \
	CK_RUN_CASE=restart CK_TIMEOUT_MULTIPLIER=$((restarts / 20 + 1)) "$bin"
echo "restart_soak.sh: $restarts restarts in $(($(date +%s) - start)) s"
