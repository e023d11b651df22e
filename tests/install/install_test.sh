#!/bin/sh
# install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER: cmake --install into a temporary prefix, then
# build C and C++ consumers with find_package(kvtier), and a C consumer with plain pkg-config
# (no --define-prefix: the installed kvtier.pc is relocatable), and run them. The prefix is then
# moved, and pkg-config must follow it. Also the layout: include/kvtier/kvt_abi.h, no tools in
# bin/ by default, and a unit whose ExecStart names this prefix.
set -eu
build=$1 src=$2 cc=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvt-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
fail() { echo "install_test: $*" >&2; exit 1; }
# kvt_abi.h under include/kvtier/ only (a top-level name this generic collides).
[ -f "$tmp/prefix/include/kvtier/kvt_abi.h" ] || fail "no include/kvtier/kvt_abi.h"
[ ! -e "$tmp/prefix/include/kvt_abi.h" ] || fail "kvt_abi.h installed at the top of include/"
# The benchmarks, the simulator and kvtier-llm are the optional 'tools' component.
[ -x "$tmp/prefix/bin/kvtierd" ] && [ -x "$tmp/prefix/bin/kvtierctl" ] ||
	fail "kvtierd or kvtierctl not in bin/: $(ls "$tmp/prefix/bin")"
for f in "$tmp/prefix/bin"/*; do
	case ${f##*/} in
	kvtierd | kvtierctl) ;;
	*) fail "${f##*/} installed into bin/ by default (tools are --component tools)" ;;
	esac
done
# The unit starts the kvtierd of this prefix with the kvtierd.conf installed beside it, even
# though --prefix differs from the configured CMAKE_INSTALL_PREFIX.
unit=$(find "$tmp/prefix" -name kvtierd.service)
[ -n "$unit" ] || fail "no kvtierd.service installed"
conf=$(find "$tmp/prefix" -name kvtierd.conf -path '*/kvtier/*')
[ -n "$conf" ] || fail "no kvtier/kvtierd.conf installed"
grep -qx "ExecStart=$tmp/prefix/bin/kvtierd --config $conf" "$unit" ||
	fail "the unit's ExecStart is not this prefix's: $(grep ExecStart= "$unit")"
cmake -S "$src/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
	-DCMAKE_BUILD_RPATH="$tmp/prefix/lib" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
"$tmp/consumer/consumer_cxx"
pc_build() { # prefix, output
	pcdir=$(dirname "$(find "$1" -name kvtier.pc | head -n 1)")
	PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs kvtier >"$tmp/flags"
	# shellcheck disable=SC2046
	"$cc" -o "$2" "$src/consumer/consumer.c" $(cat "$tmp/flags") -Wl,-rpath,"$1/lib"
	"$2"
}
pc_build "$tmp/prefix" "$tmp/consumer_pc"
mv "$tmp/prefix" "$tmp/moved"
pc_build "$tmp/moved" "$tmp/consumer_pc_moved"
