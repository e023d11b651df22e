#!/bin/sh
# make-real-keys.sh [out_file] - dump the post-RoPE keys and queries of a real SmolLM2-135M decode
# for kvtier-bench-retrieval --data real --keys FILE.
#
# Runs kvtier-llm --dump-kv once per prompt (plain prompts, sampled at temperature 0.8 with a
# fixed seed per run, so the text does not loop), appending one sequence per run, until the
# file holds at least $TOKENS tokens (default 8192). Every token of every layer is kept:
# 46,088 bytes per token for SmolLM2-135M (30 layers, 3 kv heads, 9 query heads, head_dim 64,
# f16), about 380 MB for 8K tokens. It takes a few minutes on one core and is not committed.
#
# Idempotent: an existing file with enough tokens is left alone (remove it to remake it).
# Environment: KVTIER_LLM (the kvtier-llm binary, default build/tools/llm/kvtier-llm), TOKENS,
# RUN_TOKENS (tokens generated per run, default 1536), KVT_MODEL (the model, see kvtier-llm),
# SEED (the first run's seed, default 0: give a file being extended seeds it has not had, or
# its sequences repeat).
set -eu

out=${1:-${HOME}/.cache/kvtier/real-keys.kq}
llm=${KVTIER_LLM:-build/tools/llm/kvtier-llm}
tokens=${TOKENS:-8192}
run_tokens=${RUN_TOKENS:-1536}

die() {
	echo "make-real-keys: $*" >&2
	exit 1
}

[ -x "$llm" ] || die "no kvtier-llm at $llm (build it, or set KVTIER_LLM)"

# n_tokens sits at byte 40 of the header (tools/llm/kvdump.h), a little-endian u64
count() {
	if [ -s "$out" ]; then
		od -An -t u8 -j 40 -N 8 "$out" | tr -d ' '
	else
		echo 0
	fi
}

prompts='The history of the Roman Empire begins with
A practical guide to writing a memory allocator in C. First,
Once upon a time, in a village at the edge of a great forest, there lived
The following is a detailed explanation of how photosynthesis works:
Dear diary, today was the strangest day of my life. It started when
In this tutorial we build a small web server in Python, step by step.
The causes of the First World War are still debated by historians. Some argue
Recipe: a simple bread that anyone can bake at home. Ingredients:'

mkdir -p "$(dirname "$out")"
seed=${SEED:-0}
first=$seed
runs_max=$((64 + tokens / 256)) # runs end early at end-of-text: about 800 tokens each
while [ "$(count)" -lt "$tokens" ]; do
	prompt=$(printf '%s\n' "$prompts" | sed -n "$((seed % 8 + 1))p")
	"$llm" --prompt "$prompt" --max-tokens "$run_tokens" --temp 0.8 --seed "$seed" \
		--dump-kv "$out" >/dev/null ||
		die "kvtier-llm failed on prompt $((seed % 8 + 1))"
	seed=$((seed + 1))
	echo "make-real-keys: $out: $(count) tokens after $((seed - first)) run(s)" >&2
	[ $((seed - first)) -lt "$runs_max" ] || die "$runs_max runs and still under $tokens tokens"
done
echo "$out"
