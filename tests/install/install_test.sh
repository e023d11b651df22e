#!/bin/sh
# install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER: cmake --install into a temporary prefix, then
# build C and C++ consumers with find_package(kvtier), and a C consumer with plain pkg-config
# (no --define-prefix: the installed kvtier.pc is relocatable), and run them. The prefix is then
# moved, and pkg-config must follow it.
set -eu
build=$1 src=$2 cc=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvt-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
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
