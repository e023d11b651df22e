#!/bin/sh
# check_man.sh SRC KVTIERD KVTIERCTL: the man pages in docs/man cannot drift from the programs.
# Every long option of "kvtierd --help" and "kvtierctl --help", every kvtierctl command, every
# config key (systemd/kvtierd.conf and daemon/config.c) and every kvt_ function of kvtier.h is
# the term of a .TP entry in its page, and every page renders without a groff warning.
set -eu
src=$1 kvtierd=$2 kvtierctl=$3
man=$src/docs/man
status=0
fail() {
	echo "check_man: $*" >&2
	status=1
}

# The terms of a page's .TP entries (the line after each .TP), with \- turned into -.
terms() {
	awk 'tp { print; tp = 0 } /^\.TP/ { tp = 1 }' "$1" | sed 's/\\-/-/g'
}
has_term() { # page, word (an ERE), what, [the word as printed]
	terms "$man/$1" | grep -Eq -- "(^|[^a-z0-9_-])$2([^a-z0-9_-]|\$)" ||
		fail "$1 has no entry for $3 '${4:-$2}'"
}
long_opts() {
	grep -oE -- '--[a-z][a-z0-9-]*' | sort -u
}

n=0
for o in $("$kvtierd" --help | long_opts); do
	has_term kvtierd.8 "$o" "kvtierd option"
	n=$((n + 1))
done
[ "$n" -ge 15 ] || fail "only $n options in kvtierd --help: is the parse right?"
# and the options a restart in place uses, which --help leaves out (daemon/restart.c)
n=0
for o in $(grep -oE -- '"--[a-z][a-z0-9-]*"' "$src/daemon/restart.c" | tr -d '"' | sort -u); do
	has_term kvtierd.8 "$o" "kvtierd restart option"
	n=$((n + 1))
done
[ "$n" -ge 2 ] || fail "only $n restart options found in daemon/restart.c"

n=0
for o in $("$kvtierctl" --help | long_opts); do
	has_term kvtierctl.8 "$o" "kvtierctl option"
	n=$((n + 1))
done
cmds=$("$kvtierctl" --help | awk '/^Commands:/ { on = 1; next } on && /^$/ { exit } on { print $1 }')
for c in $cmds; do
	has_term kvtierctl.8 "$c" "kvtierctl command"
	n=$((n + 1))
done
[ "$n" -ge 10 ] || fail "only $n options and commands in kvtierctl --help"

# Keys: "[#]key = value" lines of the example file, and KEY("section", "key") in config.c.
keys=$( (sed -n 's/^#\{0,1\}\([a-z_][a-z0-9_]*\) *=.*/\1/p' "$src/systemd/kvtierd.conf"
	grep -oE 'KEY\("[a-z]+", *"[a-z0-9_]+"\)' "$src/daemon/config.c" |
		sed -E 's/.*"([a-z0-9_]+)"\)/\1/') | sort -u)
n=0
for k in $keys; do
	has_term kvtierd.conf.5 "$k" "config key"
	n=$((n + 1))
done
[ "$n" -ge 25 ] || fail "only $n config keys found"
for s in $(sed -n 's/^\[\([a-z]*\)\]$/\1/p' "$src/systemd/kvtierd.conf"); do
	grep -q "^\.SH \[$s\]" "$man/kvtierd.conf.5" || fail "kvtierd.conf.5 has no [$s] section"
done

n=0
for f in $(grep -oE '\bkvt_[a-z0-9_]+\(' "$src/client/include/kvtier.h" | tr -d '(' | sort -u); do
	has_term libkvtier.3 "$f\\(\\)" "function" "$f()"
	n=$((n + 1))
done
[ "$n" -ge 30 ] || fail "only $n functions found in kvtier.h"

# Rendering: groff's warnings (-ww), and man's own (--warnings) where man-db is installed.
for p in "$man"/*.[0-9]; do
	w=$(LC_ALL=C.UTF-8 groff -ww -man -Tutf8 -z "$p" 2>&1)
	[ -z "$w" ] || fail "$(basename "$p"): groff warns: $w"
	if command -v man >/dev/null; then
		w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$p" 2>&1 >/dev/null)
		[ -z "$w" ] || fail "$(basename "$p"): man warns: $w"
	fi
done
exit $status
