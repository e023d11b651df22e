#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tools/check-range.sh [--tests REGEX | --full] [--first-parent] [-j N] [--logs DIR] A..B
#
# Builds and tests every commit of a range, oldest first, so that a branch is checked commit by
# commit and not only at its tip. Each commit is checked out in a scratch worktree
# (`git worktree add --detach` in a temporary directory, removed at the end), configured with
# -DKVT_WERROR=ON and built in one build directory of its own that is reused from commit to
# commit (incremental: only what a commit changed is rebuilt). The user's own tree and build
# directories are never touched.
#
# Tests run per commit:
#   default          ctest -L '^(unit|format)$': the unit tests and the format checks
#                    (format_check: clang-format --dry-run -Werror; pyabi_current)
#   --tests REGEX    ctest -R REGEX: the tests whose names match
#   --full           ctest -LE 'gpu|llm': everything but the GPU and model tests
#
#   A..B             any range git rev-list accepts (main..HEAD, HEAD~3..HEAD)
#   --first-parent   only the commits on B's first-parent line (a merge is checked as one
#                    commit, not the commits it brings in)
#   -j N             build and test parallelism (default 2)
#   --logs DIR       keep each commit's configure/build/test log as DIR/<hash>.log
#
# Prints one line per commit: short hash, subject, build ok/FAIL, tests ok/FAIL/- (not run
# because the build failed), and the tail of the log of each failure. Exit status: 0 when every
# commit built and passed, 1 when any failed, 2 on bad usage.
set -uo pipefail

# The whole script is one compound command, read before any of it runs: a checkout that
# rewrites this file while it runs cannot change what runs.
{

usage() {
	awk 'NR >= 4 && !/^#/ { exit } NR >= 4 { sub(/^# ?/, ""); print }' "$0"
	exit "$1"
}

tests=(-L '^(unit|format)$')
first_parent=()
jobs=2
logdir=
range=
while [ $# -gt 0 ]; do
	case "$1" in
	--tests)
		[ $# -ge 2 ] || { echo "check-range: --tests needs a REGEX" >&2; exit 2; }
		tests=(-R "$2"); shift 2 ;;
	--full) tests=(-LE 'gpu|llm'); shift ;;
	--first-parent) first_parent=(--first-parent); shift ;;
	-j)
		[ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] ||
			{ echo "check-range: -j needs a positive number" >&2; exit 2; }
		jobs=$2; shift 2 ;;
	--logs)
		[ $# -ge 2 ] || { echo "check-range: --logs needs a directory" >&2; exit 2; }
		logdir=$2; shift 2 ;;
	-h|--help) usage 0 ;;
	-*) echo "check-range: unknown option '$1' (try --help)" >&2; exit 2 ;;
	*)
		[ -z "$range" ] || { echo "check-range: one range only, got '$range' and '$1'" >&2; exit 2; }
		range=$1; shift ;;
	esac
done
if [ -z "$range" ] || [[ "$range" != *..* ]]; then
	echo "check-range: give a range A..B (e.g. main..HEAD or HEAD~3..HEAD)" >&2
	exit 2
fi

top=$(git rev-parse --show-toplevel 2>/dev/null) ||
	{ echo "check-range: not inside a git repository" >&2; exit 2; }
list=$(git -C "$top" rev-list --reverse "${first_parent[@]}" "$range" --) ||
	{ echo "check-range: git rev-list cannot read the range '$range'" >&2; exit 2; }
commits=()
[ -z "$list" ] || mapfile -t commits <<<"$list"
if [ ${#commits[@]} -eq 0 ]; then
	echo "check-range: the range '$range' holds no commit" >&2
	exit 2
fi
if [ -n "$logdir" ]; then
	mkdir -p "$logdir" || exit 2
	logdir=$(cd "$logdir" && pwd)
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvt-check-range.XXXXXX") || exit 2
src=$scratch/src
build=$scratch/build
cleanup() {
	git -C "$top" worktree remove --force "$src" >/dev/null 2>&1
	rm -rf "$scratch"
	git -C "$top" worktree prune >/dev/null 2>&1
}
# Each step runs in a session of its own, waited for in the background, so that a signal to
# this script is handled at once: the step's whole process group (cmake, make, the compilers,
# ctest and its tests) is stopped, then the scratch worktree removed.
child=
run() {
	setsid "$@" >>"$log" 2>&1 &
	child=$!
	wait "$child"
	local r=$?
	child=
	return $r
}
on_signal() {
	[ -z "$child" ] || kill -TERM -- "-$child" 2>/dev/null
	wait
	exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

if ! git -C "$top" worktree add --quiet --detach "$src" "${commits[0]}" >"$scratch/add.log" 2>&1; then
	echo "check-range: git worktree add failed:" >&2
	cat "$scratch/add.log" >&2
	exit 2
fi

echo "check-range: ${#commits[@]} commit(s) of $range; tests: ctest ${tests[*]}; scratch $scratch"
failed=0
for c in "${commits[@]}"; do
	short=$(git -C "$top" rev-parse --short "$c")
	subject=$(git -C "$top" log -1 --format=%s "$c" | cut -c1-60)
	log=$scratch/$short.log
	b=FAIL
	t=-
	: >"$log"
	if run git -C "$src" checkout --quiet --detach "$c" &&
		run cmake -S "$src" -B "$build" -DKVT_WERROR=ON &&
		run cmake --build "$build" -j"$jobs"; then
		b=ok
		t=FAIL
		if run ctest --test-dir "$build" "${tests[@]}" -j"$jobs" --no-tests=error \
			--output-on-failure; then
			t=ok
		fi
	fi
	printf '%s  %-60s  build %-4s  tests %s\n' "$short" "$subject" "$b" "$t"
	if [ "$b" != ok ] || [ "$t" != ok ]; then
		failed=1
		tail -n 25 "$log" | sed 's/^/    | /'
	fi
	[ -z "$logdir" ] || cp "$log" "$logdir/$short.log"
done

if [ $failed -ne 0 ]; then
	echo "check-range: FAILED: at least one commit of $range does not build or pass its tests"
	exit 1
fi
echo "check-range: every commit of $range built and passed"
exit 0
}
