#!/bin/sh
# verify-unit.sh UNIT-FILE... - systemd-analyze verify must accept the units and print nothing.
# verify-unit.sh --max-exposure N UNIT-FILE... - systemd-analyze security --offline=true must rate
# each unit's overall exposure N or lower (0.0 locked down ... 10.0 unprotected).
# Exit 77 (skipped) when systemd-analyze is not installed, or is older than --offline (v250).
command -v systemd-analyze >/dev/null 2>&1 || {
	echo "systemd-analyze not found: skipped"
	exit 77
}

if [ "$1" = "--max-exposure" ]; then
	max=$2
	shift 2
	systemd-analyze --help 2>&1 | grep -q -- '--offline' || {
		echo "systemd-analyze has no --offline (systemd < 250): skipped"
		exit 77
	}
	fail=0
	for unit in "$@"; do
		out=$(systemd-analyze security --offline=true --no-pager "$unit" 2>&1)
		level=$(printf '%s\n' "$out" |
			sed -n 's/.*Overall exposure level for .*: \([0-9][0-9.]*\).*/\1/p' | tail -n 1)
		if [ -z "$level" ]; then
			printf '%s\n' "$out"
			echo "$unit: no overall exposure level in systemd-analyze security's output"
			fail=1
		elif awk -v l="$level" -v m="$max" 'BEGIN { exit !(l + 0 > m + 0) }'; then
			# the settings that cost exposure, to say what to tighten
			printf '%s\n' "$out" | grep '✗'
			echo "$unit: exposure $level, above the allowed $max"
			fail=1
		else
			echo "$unit: exposure $level (at most $max)"
		fi
	done
	exit $fail
fi

out=$(systemd-analyze verify --man=no "$@" 2>&1)
rc=$?
[ -n "$out" ] && printf '%s\n' "$out"
if [ $rc -ne 0 ]; then
	echo "systemd-analyze verify failed with exit $rc"
	exit 1
fi
if [ -n "$out" ]; then
	echo "systemd-analyze verify printed warnings"
	exit 1
fi
echo "verified: $*"
