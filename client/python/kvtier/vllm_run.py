# SPDX-License-Identifier: MIT
"""One vLLM engine (CPU, eager) generating greedily for the vLLM connector's tests and
benchmark: ``python -m kvtier.vllm_run SPEC_JSON`` (or ``@FILE``) prints one JSON line per
prompt.

SPEC keys: model, prompts (token id lists), max_tokens, connector (none | kvtier | example),
socket, extra (kv_connector_extra_config), dtype, prefix_caching, max_model_len,
max_num_batched_tokens; pause_file (before prompt i > 0, write PAUSE.i.wait and wait for
PAUSE.i.go: the test acts on kvtierd there); ready_file (written before the first prompt);
batch (every prompt in one generate() call, as concurrent requests; wall_s is the batch's)."""
import json
import os
import sys
import time


def main() -> None:
    arg = sys.argv[1]
    if arg.startswith("@"):  # a file: long prompts overflow the argument list
        with open(arg[1:]) as fp:
            arg = fp.read()
    spec = json.loads(arg)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    conn = spec.get("connector", "none")
    if conn == "kvtier":
        extra = dict(spec.get("extra") or {})
        if spec.get("socket"):
            extra["socket"] = spec["socket"]
        kw["kv_transfer_config"] = {
            "kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra}
    elif conn == "example":
        kw["kv_transfer_config"] = {
            "kv_connector": "ExampleConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": spec["storage"]}}
    llm = LLM(model=spec["model"], enforce_eager=True, dtype=spec.get("dtype", "bfloat16"),
              max_model_len=spec.get("max_model_len", 1024),
              max_num_batched_tokens=spec.get("max_num_batched_tokens", 8192),
              enable_prefix_caching=spec.get("prefix_caching", True), seed=0, **kw)
    sp = SamplingParams(temperature=0.0, max_tokens=spec.get("max_tokens", 8),
                        ignore_eos=True)
    if spec.get("ready_file"):
        open(spec["ready_file"], "w").close()
    if spec.get("batch"):  # every prompt in one generate() call, as concurrent requests
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], sp,
                            use_tqdm=False)
        dt = time.perf_counter() - t0
        for p, out in zip(spec["prompts"], outs):
            print(json.dumps({"tokens": list(out.outputs[0].token_ids),
                              "num_cached_tokens": out.num_cached_tokens, "wall_s": dt,
                              "n_prompt": len(p)}), flush=True)
        return
    for i, p in enumerate(spec["prompts"]):
        pause = spec.get("pause_file")
        if pause and i > 0:
            # A handshake per prompt: "<pause>.<i>.wait" says it waits; "<pause>.<i>.go" lets
            # it go (a file that vanished and came back between two polls is never missed).
            open(f"{pause}.{i}.wait", "w").close()
            while not os.path.exists(f"{pause}.{i}.go"):
                time.sleep(0.05)
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0]
        dt = time.perf_counter() - t0
        m = out.metrics
        ttft = None
        if m is not None and getattr(m, "first_token_latency", None):
            ttft = m.first_token_latency
        stats = None
        if os.environ.get("KVTIER_VLLM_STATS") and os.path.exists(os.environ["KVTIER_VLLM_STATS"]):
            with open(os.environ["KVTIER_VLLM_STATS"]) as fp:
                stats = json.load(fp)
        print(json.dumps({"tokens": list(out.outputs[0].token_ids), "stats": stats,
                          "num_cached_tokens": out.num_cached_tokens, "wall_s": dt,
                          "ttft_s": ttft, "n_prompt": len(p)}), flush=True)


if __name__ == "__main__":
    main()
