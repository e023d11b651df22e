#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/gpu/run.sh - the GPU checks of kvtier in one go, for a machine with an NVIDIA GPU
# (sized to finish within 8 minutes on an H200 with 16 cores):
#   1. exit 77 (skipped) when nvidia-smi is missing or lists no device;
#   2. configure and build with CUDA for the GPU's own architecture (build-gpu/, or $KVT_GPU_BUILD),
#      and check that libkvtier.so has no CUDA library in NEEDED (it loads the driver at run time);
#   3. run the ctest label "gpu": real CUDA IPC between the client and kvtierd, the CUDA backend
#      bit for bit against the host backend (promotions, int8 rows, FETCH), the session event,
#      and the retrieval kernels' prototype (tests/gpu/kernels/) against the CPU engine;
#   4. print the benchmark: H2D bandwidth pinned vs pageable (4 KiB..256 MiB) and 8192 scattered
#      256-byte rows by per-row cudaMemcpyAsync, cudaMemcpyBatchAsync and the UVA row kernel;
#   5. kvtier-bench gpu-decode: first --check at a small shape (the attention kernel and cuBLAS
#      against a CPU reference, kvtier's T0 + staged attention against the all-in-HBM one), then
#      the 8B shape at 8K / 32K / 128K x hbm 0.3 / 0.5 / 0.7 (capped at $KVT_GPU_DECODE_CAP s,
#      default 300); its JSON also goes to $OUT/gpu-decode.json when $OUT is set.
# Exit status: 0 all passed, 77 no GPU, anything else a failure (the failing step says which).
set -uo pipefail

if ! command -v nvidia-smi >/dev/null 2>&1; then
	echo "run.sh: nvidia-smi not found: no GPU here, skipping"
	exit 77
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	echo "run.sh: nvidia-smi lists no GPU, skipping"
	exit 77
fi

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${KVT_GPU_BUILD:-$root/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
[[ $cap =~ ^[0-9]+$ ]] || cap=90
nvidia-smi -L

step() {
	echo
	echo "== $*"
}

step "configure (sm_$cap) in $build"
mkdir -p "$build" || exit 1
cmake -S "$root" -B "$build" -DKVT_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_CUDA_ARCHITECTURES="$cap" >"$build/run-configure.log" 2>&1 ||
	{ cat "$build/run-configure.log"; echo "run.sh: configure failed"; exit 1; }

step "build (-j$jobs)"
timeout 240 cmake --build "$build" -j"$jobs" >"$build/run-build.log" 2>&1 ||
	{ tail -n 60 "$build/run-build.log"; echo "run.sh: build failed"; exit 1; }

step "libkvtier links no CUDA runtime (it dlopens libcuda.so.1)"
sh "$root/tests/cuda-shim/check_no_cudart.sh" "$build/client/libkvtier.so" ||
	{ echo "run.sh: libkvtier.so has a CUDA library in NEEDED"; exit 1; }

step "GPU tests"
timeout 240 ctest --test-dir "$build" -L gpu --output-on-failure --no-tests=error
tests=$?

step "GPU benchmark"
timeout 120 "$build/tests/gpu/kvt_gpu_bench"
bench=$?

step "gpu-decode --check (small shape)"
timeout 120 "$build/tools/bench/kvtier-bench-gpu-decode" --layers 4 --ctx 4K,12K --hbm 0.3,0.7 \
	--steps 3 --warmup 1 --check
dcheck=$?

step "gpu-decode (8B shape, 8K/32K/128K x hbm 0.3/0.5/0.7, cap ${KVT_GPU_DECODE_CAP:-300} s)"
dout=${OUT:+$OUT/gpu-decode.json}
timeout "${KVT_GPU_DECODE_CAP:-300}" "$build/tools/bench/kvtier-bench-gpu-decode" --steps 10 \
	--warmup 2 | tee "${dout:-/dev/null}"
decode=$?

if ((dcheck != 0)); then
	echo "run.sh: gpu-decode --check failed ($dcheck)"
	exit 1
fi
if ((decode != 0)); then
	echo "run.sh: gpu-decode failed ($decode; 124: the time cap)"
	exit 1
fi
if ((tests != 0)); then
	echo "run.sh: GPU tests failed ($tests)"
	exit 1
fi
if ((bench != 0)); then
	echo "run.sh: benchmark failed ($bench)"
	exit 1
fi
echo "run.sh: all GPU checks passed"
