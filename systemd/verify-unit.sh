#!/bin/sh
# verify-unit.sh UNIT-FILE... - systemd-analyze verify must accept the units and print nothing.
# Exit 77 (skipped) when systemd-analyze is not installed.
command -v systemd-analyze >/dev/null 2>&1 || {
	echo "systemd-analyze not found: skipped"
	exit 77
}
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
