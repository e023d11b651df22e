#!/bin/sh
# install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER: cmake --install into a temporary prefix, then
# build a consumer with find_package(kvtier) and another with pkg-config, and run both.
set -eu
build=$1 src=$2 cc=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvt-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
	-DCMAKE_BUILD_RPATH="$tmp/prefix/lib" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
# pkg-config: the .pc file's prefix is the configured one, so point it at the staging prefix.
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --define-variable=prefix="$tmp/prefix" \
	--cflags --libs kvtier >"$tmp/flags"
# shellcheck disable=SC2046
"$cc" -o "$tmp/consumer_pc" "$src/consumer/consumer.c" $(cat "$tmp/flags") \
	-Wl,-rpath,"$tmp/prefix/lib"
"$tmp/consumer_pc"
