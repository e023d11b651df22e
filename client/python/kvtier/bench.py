# SPDX-License-Identifier: MIT
"""``python -m kvtier.bench transformers [--json]``: decode speed of a transformers model
through KvtierCache against DynamicCache and DynamicCache(offloading=True), side by side.
``python -m kvtier.bench vllm [--json]`` (in a vLLM venv): time to first token of vLLM
processes with KvtierConnector against cold prefill, ExampleConnector and vLLM's in-process
prefix cache (bench_vllm()).

Each repetition generates the same greedy tokens with each cache in turn (the order rotates
between repetitions so none always runs first on a warm or cold machine). A stopping
criterion stamps every generated token; decode tokens/s of a run is (tokens - 1) over the
time from the first token to the last, so prefill is left out. Reported: the median of the
runs' tokens/s with the 5th and 95th percentiles, the per-step time percentiles over all
steps, and, for KvtierCache, the microseconds per decode step spent in kvtier (cache logic:
row copies, gathers, weight sums, queueing, RETIER and FETCH with their waits, the binding
included; KvtierStats.kvtier_s) against the rest of the step (the model).

kvtierd: --socket, else a private one started from the build tree of the loaded libkvtier
(next to it: daemon/kvtierd), stopped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = (
    "Tiered memory keeps the hottest part of a language model's key-value cache in fast "
    "memory and the rest in slower, larger memory. Explain, step by step, how a scheduler "
    "could decide which tokens to keep close to the accelerator, and what it costs when "
    "the guess is wrong."
)


def _default_model() -> str:
    env = os.environ.get("KVT_MODEL")
    if env:
        return env
    d = os.environ.get("KVT_MODEL_DIR") or os.path.expanduser("~/.cache/kvtier/models")
    return os.path.join(d, MODEL_FILE)


class _Daemon:
    """A private kvtierd from the build tree next to the loaded libkvtier."""

    def __init__(self, lib_path: str, pool_size: str) -> None:
        lib = Path(lib_path).resolve()
        exe = None
        for cand in (os.environ.get("KVTIERD"), lib.parent.parent / "daemon" / "kvtierd",
                     shutil.which("kvtierd")):
            if cand and os.access(str(cand), os.X_OK):
                exe = str(cand)
                break
        if exe is None:
            raise SystemExit("kvtier.bench: no kvtierd to start (build the tree, set KVTIERD, "
                             "or pass --socket of a running daemon)")
        self.dir = tempfile.mkdtemp(prefix="kvtbench.")
        self.socket = os.path.join(self.dir, "kvtierd.sock")
        self.log = open(os.path.join(self.dir, "kvtierd.log"), "wb")
        self.proc = subprocess.Popen(
            [exe, "--config", "/dev/null", "--socket", self.socket, "--backend", "host",
             "--pool-size", pool_size], stdout=self.log, stderr=subprocess.STDOUT)
        from . import ctl

        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"kvtier.bench: kvtierd exited with {self.proc.returncode} "
                                 f"(log: {self.log.name})")
            try:
                ctl.request(self.socket, ["status"], timeout=5)
                return
            except ctl.CtlError:
                if time.monotonic() > deadline:
                    self.close()
                    raise SystemExit("kvtier.bench: kvtierd did not answer")
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


def bench_transformers(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, StoppingCriteria

    from . import LIBRARY_PATH
    from .transformers import KvtierCache

    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model
    if not os.path.isfile(path):
        raise SystemExit(f"kvtier.bench: model {path} not found; run tools/fetch-model.sh "
                         "(or pass --model)")
    d, f = os.path.split(os.path.abspath(path))
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, attn_implementation="kvtier")
    model.eval()
    load_s = time.perf_counter() - t0
    inputs = tok(args.prompt, return_tensors="pt")
    plen = int(inputs["input_ids"].shape[1])
    n_new = args.tokens

    daemon = None
    socket = args.socket
    if socket is None:
        daemon = _Daemon(LIBRARY_PATH, args.pool_size)
        socket = daemon.socket

    class TimedDynamicCache(DynamicCache):
        """DynamicCache, timing its update() (the cat of the new rows): the work KvtierCache's
        update() replaces."""

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.update_s = 0.0

        def update(self, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            r = super().update(*a, **kw)
            self.update_s += time.perf_counter() - t
            return r

    class Stamp(StoppingCriteria):
        """Timestamps each generated token (wall and this thread's CPU time), with the
        cache's running seconds in kvtier (or in DynamicCache.update)."""

        def __init__(self, cache: Any) -> None:
            self.t: list[float] = []
            self.cpu: list[float] = []
            self.kv: list[float] = []
            self.cache = cache

        def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
            self.t.append(time.perf_counter())
            self.cpu.append(time.thread_time())
            if isinstance(self.cache, KvtierCache):
                self.kv.append(self.cache._st.kvtier_s)
            elif isinstance(self.cache, TimedDynamicCache):
                self.kv.append(self.cache.update_s)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def make(kind: str) -> Any:
        if kind == "dynamic":
            return TimedDynamicCache()
        if kind == "offloaded":
            return DynamicCache(offloading=True)
        return KvtierCache(model, socket=socket, policy="tiered", hbm_frac=args.hbm,
                           evict_frac=0.0, t2_frac=0.0, delta=args.delta, window=args.window,
                           sinks=4, max_tokens=plen + n_new + args.delta)

    kinds = ["kvtier", "dynamic", "offloaded"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    errors: dict[str, str] = {}
    ids_of: dict[str, list[int]] = {}
    for rep in range(args.reps + 1):  # repetition 0 warms up and is not reported
        order = kinds[rep % 3:] + kinds[: rep % 3]
        for kind in order:
            if kind in errors:
                continue
            try:
                cache = make(kind)
            except Exception as e:  # e.g. offloading needs an accelerator
                errors[kind] = f"{type(e).__name__}: {e}"
                continue
            stamp = Stamp(cache)
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=n_new,
                                         min_new_tokens=n_new, do_sample=False,
                                         stopping_criteria=[stamp])
            except Exception as e:
                errors[kind] = f"{type(e).__name__}: {e}"
                if isinstance(cache, KvtierCache):
                    cache.close()
                continue
            ids = out[0, plen:].tolist()
            ids_of.setdefault(kind, ids)
            t = stamp.t
            steps = np.diff(np.asarray(t)) * 1e6
            cpu = np.diff(np.asarray(stamp.cpu)) * 1e6
            r: dict[str, Any] = {
                "tok_s": (len(t) - 1) / (t[-1] - t[0]),
                "step_us": steps.tolist(),
                "cpu_us": cpu.tolist(),
            }
            if stamp.kv:
                r["cache_us"] = (np.diff(np.asarray(stamp.kv)) * 1e6).tolist()
            if isinstance(cache, KvtierCache):
                st = cache.stats()
                r["tiers"] = list(st.tier_count)
                r["retiers"], r["rows_staged"] = st.retiers, st.rows_staged
                cache.close()
            if rep > 0:
                runs[kind].append(r)
    if daemon is not None:
        daemon.close()

    res: dict[str, Any] = {
        "bench": "transformers",
        "model": f,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_s": round(load_s, 1),
        "prompt_tokens": plen,
        "new_tokens": n_new,
        "reps": args.reps,
        "kvtier_config": {"policy": "tiered", "hbm_frac": args.hbm, "evict_frac": 0.0,
                          "t2_frac": 0.0, "delta": args.delta, "window": args.window,
                          "sinks": 4},
        "same_ids": {k: ids_of[k] == ids_of.get("dynamic") for k in ids_of},
    }
    for kind in kinds:
        rs = runs[kind]
        key = f"tok_s_{kind}"
        if not rs:
            res[key] = None
            res[f"{kind}_error"] = errors.get(kind, "no runs")
            continue
        tps = [r["tok_s"] for r in rs]
        allsteps = [x for r in rs for x in r["step_us"]]
        res[key] = round(_pct(tps, 50), 2)
        res[f"{key}_p5"] = round(_pct(tps, 5), 2)
        res[f"{key}_p95"] = round(_pct(tps, 95), 2)
        res[f"step_us_{kind}"] = {"p5": round(_pct(allsteps, 5)), "p50": round(_pct(allsteps, 50)),
                                  "p95": round(_pct(allsteps, 95))}
        # This thread's CPU time per step: what the step costs without the other processes
        # of a shared machine (torch runs on this thread when --threads 1).
        allcpu = [x for r in rs for x in r["cpu_us"]]
        res[f"cpu_us_{kind}"] = {"p5": round(_pct(allcpu, 5)), "p50": round(_pct(allcpu, 50)),
                                 "p95": round(_pct(allcpu, 95))}
        res[f"cpu_tok_s_{kind}"] = round(1e6 / _pct(allcpu, 50), 2)
    dr = runs["dynamic"]
    if dr:
        du = [x for r in dr for x in r["cache_us"]]
        res["dynamic_update_us_per_step"] = round(_pct(du, 50), 1)
    kr = runs["kvtier"]
    if kr:
        kv = [x for r in kr for x in r["cache_us"]]
        step = [x for r in kr for x in r["step_us"]]
        kv_med = _pct(kv, 50)
        step_med = _pct(step, 50)
        res["kvtier_us_per_step"] = round(kv_med, 1)
        res["kvtier_us_per_step_p5"] = round(_pct(kv, 5), 1)
        res["kvtier_us_per_step_p95"] = round(_pct(kv, 95), 1)
        res["kvtier_us_per_step_mean"] = round(float(np.mean(kv)), 1)
        res["model_us_per_step"] = round(step_med - kv_med, 1)
        res["kvtier_share_of_step"] = round(float(np.mean(kv)) / float(np.mean(step)), 4)
        res["kvtier_tiers_at_end"] = kr[-1]["tiers"]
        res["kvtier_retiers"] = kr[-1]["retiers"]
        res["kvtier_rows_staged"] = kr[-1]["rows_staged"]
    if res.get("tok_s_kvtier") and res.get("tok_s_dynamic"):
        res["kvtier_vs_dynamic"] = round(res["tok_s_kvtier"] / res["tok_s_dynamic"], 3)
        res["kvtier_vs_dynamic_cpu"] = round(res["cpu_tok_s_kvtier"] / res["cpu_tok_s_dynamic"],
                                             3)
    return res


def _vllm_proc(spec: dict[str, Any], env: dict[str, str]) -> list[dict[str, Any]]:
    """One vLLM process (kvtier.vllm_run): its JSON line per prompt."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fp:
        json.dump(spec, fp)
    try:
        r = subprocess.run([sys.executable, "-m", "kvtier.vllm_run", "@" + fp.name],
                           capture_output=True, text=True, env=env, timeout=3600)
    finally:
        os.unlink(fp.name)
    if r.returncode != 0:
        raise SystemExit(f"kvtier.bench vllm: vLLM exited {r.returncode}:\n{r.stderr[-4000:]}")
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def bench_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """TTFT (the wall time of a 1-token generate) of prompts of --sizes tokens in separate
    vLLM processes: cold (no connector), a hit served by kvtier to a second process, vLLM's
    ExampleConnector (disk) to a second process, and vLLM's in-process prefix cache; the miss
    path's cost: the connector's own time in a miss over the miss's TTFT (its counters, in
    the one process), and the miss against the connector configured with kvtierd unreachable
    (vLLM runs another prefill once any connector is configured, so an engine without one is
    no baseline for it); kvtier's hit less its load (the TTFT no faster load could go below);
    a multi-round conversation with and without kvtier."""
    import random

    from . import core

    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"),
               VLLM_LOGGING_LEVEL="ERROR", TOKENIZERS_PARALLELISM="false",
               KVTIER_LIB=core.LIBRARY_PATH)
    daemon = None
    sock = args.socket
    if sock is None:
        daemon = _Daemon(core.LIBRARY_PATH, args.pool_size)
        sock = daemon.socket
    tmp = tempfile.mkdtemp(prefix="kvtbench-vllm.")
    stats_path = os.path.join(tmp, "stats.json")
    rng = random.Random(7)
    sizes = [int(x) for x in args.sizes.split(",")]
    base = {"model": args.model, "max_tokens": 1, "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_model_len, "prefix_caching": False}
    kv = dict(base, connector="kvtier", socket=sock)
    ex = dict(base, connector="example", storage=os.path.join(tmp, "example"))
    os.makedirs(ex["storage"])
    res: dict[str, Any] = {"sizes": sizes, "reps": args.reps, "model": args.model,
                           "host": platform.node(), "cpus": os.cpu_count()}
    try:
        for n in sizes:
            # One warm-up prompt per process; then reps distinct prompts of n tokens.
            warm = [rng.randrange(100, 40000) for _ in range(256)]
            ps = [[rng.randrange(100, 40000) for _ in range(n)] for _ in range(args.reps)]
            cold = _vllm_proc(dict(base, prompts=[warm] + ps), env)[1:]
            inproc = _vllm_proc(dict(base, prefix_caching=True,
                                     prompts=[warm] + [p for p in ps for _ in (0, 1)]), env)[1:]
            # The miss path's baseline: the same connector configured, kvtierd unreachable
            # (on_unavailable: fallback), so vLLM runs the same prefill as with a miss.
            nokv = _vllm_proc(dict(kv, socket=os.path.join(tmp, "absent.sock"),
                                   extra={"on_unavailable": "fallback"},
                                   prompts=[warm] + ps), env)[1:]
            miss_stats = os.path.join(tmp, f"miss-stats-{n}.json")
            miss_all = _vllm_proc(dict(kv, prompts=[warm] + ps),
                                  dict(env, KVTIER_VLLM_STATS=miss_stats))
            miss = miss_all[1:]
            # The connector's own time in each miss (the worker's pinning LOOKUP and SEQ_OPEN,
            # the gather, APPEND and PUBLISH), from its counters before and after the prompt:
            # measured inside the one process, so the machine's noise between processes does
            # not enter it.
            def conn_s(row: dict[str, Any]) -> float:
                st_ = row.get("stats") or {}
                return st_.get("load_s", 0.0) + st_.get("save_s", 0.0)
            miss_conn = [conn_s(b) - conn_s(a) for a, b in zip(miss_all, miss_all[1:])]
            hit = _vllm_proc(dict(kv, prompts=[warm] + ps),
                             dict(env, KVTIER_VLLM_STATS=stats_path))[1:]
            _vllm_proc(dict(ex, prompts=[warm] + ps), env)
            exh = _vllm_proc(dict(ex, prompts=[warm] + ps), env)[1:]
            med = lambda rows: float(np.median([r["wall_s"] for r in rows])) * 1e3  # noqa: E731
            worst = lambda rows: round(max(r["wall_s"] for r in rows) * 1e3, 1)  # noqa: E731
            st = hit[-1].get("stats") or {}
            same = all(a["tokens"] == b["tokens"] for a, b in zip(cold, hit))
            # kvtier's hit less its own load: what no faster load path could go below.
            load_ms = st.get("load_s", 0.0) * 1e3 / args.reps
            floor = med(hit) - load_ms
            res[str(n)] = {
                "ttft_cold_ms": round(med(cold), 1),
                "ttft_kvtier_ms": round(med(hit), 1),
                "ttft_example_ms": round(med(exh), 1),
                "ttft_inproc_ms": round(med(inproc[1::2]), 1),
                "ttft_kvtier_miss_ms": round(med(miss), 1),
                "ttft_connector_no_kvtierd_ms": round(med(nokv), 1),
                "worst_ms": {"cold": worst(cold), "kvtier": worst(hit), "example": worst(exh),
                             "inproc": worst(inproc[1::2]), "kvtier_miss": worst(miss),
                             "connector_no_kvtierd": worst(nokv)},
                "miss_connector_ms": round(float(np.median(miss_conn)) * 1e3, 1),
                "miss_overhead_pct": round(float(np.median(
                    [c / r["wall_s"] for c, r in zip(miss_conn, miss)])) * 100, 2),
                "miss_vs_connector_no_kvtierd_pct": round((med(miss) / med(nokv) - 1) * 100, 1),
                "miss_vs_no_connector_pct": round((med(miss) / med(cold) - 1) * 100, 1),
                "load_ms_per_prompt": round(load_ms, 1),
                "ttft_kvtier_less_load_ms": round(floor, 1),
                "example_over_kvtier_ceiling": round(med(exh) / floor, 2),
                "cached_tokens_kvtier": hit[0]["num_cached_tokens"],
                "cached_tokens_example": exh[0]["num_cached_tokens"],
                "load_ms_per_block": round(st.get("load_s", 0.0) * 1e3 /
                                           max(st.get("loaded_blocks", 0), 1), 3),
                "same_tokens_as_cold": same,
                "cold_over_kvtier": round(med(cold) / med(hit), 2),
                "example_over_kvtier": round(med(exh) / med(hit), 2),
            }
        # Multi-round QA (LMCache's shape): --mr-users users share a system prompt of
        # --mr-first tokens; each round, every user asks a question of --mr-turn tokens about
        # the conversation so far and gets --mr-tokens tokens of answer. Each round is served
        # by a new vLLM process (a conversation moving between serving replicas), all users'
        # requests at once; prefix caching on in both runs (the users share the system prompt
        # in-process). Throughput: answer tokens over the generate() wall time.
        def rounds(spec: dict[str, Any]) -> tuple[float, list[int]]:
            r2 = random.Random(11)
            system = [r2.randrange(100, 40000) for _ in range(args.mr_first)]
            convs = [list(system) for _ in range(args.mr_users)]
            toks, t, cached = 0, 0.0, []
            for _ in range(args.mr_rounds):
                for c in convs:
                    c.extend(r2.randrange(100, 40000) for _ in range(args.mr_turn))
                outs = _vllm_proc(dict(spec, prompts=convs, max_tokens=args.mr_tokens,
                                       prefix_caching=True, batch=True), env)
                toks += sum(len(o["tokens"]) for o in outs)
                t += outs[0]["wall_s"]
                cached.append(sum(o["num_cached_tokens"] for o in outs))
                for c, o in zip(convs, outs):
                    c.extend(o["tokens"])
            return toks / t, cached
        if args.multiround:
            res["multiround_tok_s_kvtier"], res["multiround_cached_kvtier"] = rounds(kv)
            res["multiround_tok_s_cold"], res["multiround_cached_cold"] = rounds(base)
            res["multiround_tok_s_kvtier"] = round(res["multiround_tok_s_kvtier"], 2)
            res["multiround_tok_s_cold"] = round(res["multiround_tok_s_cold"], 2)
            res["multiround_shape"] = {"users": args.mr_users, "rounds": args.mr_rounds,
                                       "system_tokens": args.mr_first,
                                       "question_tokens": args.mr_turn,
                                       "answer_tokens": args.mr_tokens}
    finally:
        if daemon is not None:
            daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)
    top = res[str(max(sizes))]
    for k in ("ttft_cold_ms", "ttft_kvtier_ms", "ttft_example_ms", "ttft_inproc_ms",
              "load_ms_per_block", "miss_overhead_pct"):
        res[k] = top[k]
    return res


def _print_table(res: dict[str, Any]) -> None:
    print(f"{res['model']}: {res['prompt_tokens']} prompt tokens, {res['new_tokens']} new, "
          f"{res['reps']} runs each, {res['threads']} torch thread(s), "
          f"transformers {res['transformers']}")
    print(f"{'cache':<12}{'tok/s p50':>11}{'p5':>9}{'p95':>9}{'step us p50':>13}"
          f"{'cpu us p50':>12}")
    for kind in ("kvtier", "dynamic", "offloaded"):
        v = res.get(f"tok_s_{kind}")
        if v is None:
            print(f"{kind:<12}  not run: {res.get(f'{kind}_error')}")
            continue
        print(f"{kind:<12}{v:>11.2f}{res[f'tok_s_{kind}_p5']:>9.2f}"
              f"{res[f'tok_s_{kind}_p95']:>9.2f}{res[f'step_us_{kind}']['p50']:>13}"
              f"{res[f'cpu_us_{kind}']['p50']:>12}")
    if "kvtier_us_per_step" in res:
        step = res["kvtier_us_per_step"] + res["model_us_per_step"]
        print(f"kvtier: {res['kvtier_us_per_step']} us of a {step:.0f} us "
              f"step (median; mean share {res['kvtier_share_of_step']:.1%}); "
              f"kvtier/dynamic tok/s {res.get('kvtier_vs_dynamic')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier.bench",
                                 description="kvtier benchmarks run from Python")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("transformers", help="KvtierCache vs DynamicCache vs offloading")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.add_argument("--model", default=_default_model(), help="the GGUF file")
    t.add_argument("--socket", default=None,
                   help="kvtierd socket (default: start a private kvtierd)")
    t.add_argument("--pool-size", default="256M", help="pool of the private kvtierd")
    t.add_argument("--tokens", type=int, default=128, help="new tokens per run (128)")
    t.add_argument("--reps", type=int, default=5, help="runs per cache (5)")
    t.add_argument("--hbm", type=float, default=0.5, help="KvtierCache hbm_frac (0.5)")
    t.add_argument("--delta", type=int, default=16, help="KvtierCache delta (16)")
    t.add_argument("--window", type=int, default=32, help="KvtierCache window (32)")
    t.add_argument("--threads", type=int, default=1, help="torch threads (1; 0: torch's)")
    t.add_argument("--prompt", default=PROMPT)
    v = sub.add_parser("vllm", help="vLLM TTFT: cold, kvtier hit, ExampleConnector, in-process")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("--model", default=os.environ.get("KVT_VLLM_MODEL", ""),
                   help="model directory (tools/vllm-env.sh prints SmolLM2's)")
    v.add_argument("--socket", default=None,
                   help="kvtierd socket (default: start a private kvtierd)")
    v.add_argument("--pool-size", default="4G",
                   help="pool of the private kvtierd (4G: its prefix store, 25%% of it, holds "
                        "every prompt of the run; 8K tokens of SmolLM2 are 180 MiB)")
    v.add_argument("--sizes", default="2048,8000", help="prompt tokens (2048,8000)")
    v.add_argument("--reps", type=int, default=3, help="prompts per size (3)")
    v.add_argument("--max-model-len", type=int, default=8192)
    v.add_argument("--no-multiround", dest="multiround", action="store_false",
                   help="skip the multi-round workload (TTFT only)")
    v.add_argument("--mr-users", type=int, default=4, help="multi-round: users (4)")
    v.add_argument("--mr-rounds", type=int, default=4, help="multi-round: rounds (4)")
    v.add_argument("--mr-first", type=int, default=1024,
                   help="multi-round: shared system prompt tokens (1024)")
    v.add_argument("--mr-turn", type=int, default=256, help="multi-round: tokens per question")
    v.add_argument("--mr-tokens", type=int, default=32, help="multi-round: tokens per answer")
    a = ap.parse_args(argv)
    if a.cmd == "vllm":
        if not a.model:
            ap.error("--model (or $KVT_VLLM_MODEL): a model directory")
        res = bench_vllm(a)
        print(json.dumps(res, indent=2) if a.json else json.dumps(res))
        return 0
    if a.tokens < 2 or a.reps < 1:
        ap.error("--tokens must be >= 2 and --reps >= 1")
    res = bench_transformers(a)
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        _print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
