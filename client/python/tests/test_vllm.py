# SPDX-License-Identifier: MIT
"""kvtier.vllm.KvtierConnector on a real vLLM (the CPU build, eager) with a real model
(SmolLM2-135M as bf16 safetensors, tools/vllm-env.sh): every vLLM runs in its own process
(``python -m kvtier.vllm_run``), as separate serving processes would. Run in the vLLM venv
(tools/quickstart.sh test does); KVT_VLLM_MODEL names the model directory."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvtier
from conftest import PYTHON, REPO, Kvtierd, tool

MODEL = os.environ.get("KVT_VLLM_MODEL", "")
BT = 128  # vLLM's CPU block size: one kvtier block


def prompt(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(100, 40000) for _ in range(n)]


P1 = prompt(1, 600)  # 4 full blocks and a tail
P2 = P1[: 2 * BT + 10] + prompt(2, 300)  # shares 2 blocks with P1, then differs


def run_vllm(env: dict[str, str], prompts: list[list[int]], connector: str = "kvtier",
             socket: str | None = None, timeout: int = 600, wait: bool = True,
             **spec: object):
    """One vLLM process generating 8 greedy tokens per prompt; its JSON lines, or the Popen."""
    if not MODEL or not os.path.isdir(MODEL):
        pytest.fail(f"KVT_VLLM_MODEL={MODEL!r} is not a model directory: run "
                    "tools/vllm-env.sh (tools/quickstart.sh test does)")
    s = {"model": MODEL, "prompts": prompts, "connector": connector, "socket": socket,
         "max_tokens": 8, **spec}
    env = dict(env, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING",
               TOKENIZERS_PARALLELISM="false")
    p = subprocess.Popen([PYTHON, "-m", "kvtier.vllm_run", json.dumps(s)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    if not wait:
        return p
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"vLLM exited {p.returncode}:\n{err[-6000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> list[dict]:
    """The reference: P1 and P2 computed whole (no prefix cache) by an engine configured as the
    others, the connector included, with no kvtierd to reach (on_unavailable: fallback). On
    vLLM 0.32's CPU build, any KV connector configured (vLLM's own ExampleConnector too) makes
    P2's greedy tokens differ from the 5th on from an engine without one (docs/vllm.md, "Token
    identity"), so the reference has it configured."""
    env = dict(os.environ, KVTIER_LIB=kvtier.LIBRARY_PATH, PYTHONPATH=os.pathsep.join(
        [str(REPO / "client" / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    sock = str(tmp_path_factory.mktemp("cold") / "no-kvtierd.sock")
    r = run_vllm(env, [P1, P2], socket=sock, prefix_caching=False,
                 extra={"on_unavailable": "fallback"})
    assert r[0]["num_cached_tokens"] == r[1]["num_cached_tokens"] == 0
    return r


def test_second_process_loads_prefix(kvtierd: Kvtierd, python_env, cold, tmp_path) -> None:
    """A second vLLM process loads P1's 4 full blocks from kvtier and generates the cold
    run's tokens; P2, matching P1's first 2 blocks, loads those 2 and also matches. The
    second process's staging window holds one block (stage_mib 3: SmolLM2's block is 2.9 MB
    over its 30 layers), so P1's load takes 4 FETCHes through it and P2's 2."""
    a = run_vllm(python_env, [P1], socket=kvtierd.socket)
    assert a[0]["tokens"] == cold[0]["tokens"]
    blocks = kvtierd.doc("blocks")
    assert sum(n["blocks"] for n in blocks["namespaces"]) == 4, blocks
    stats = str(tmp_path / "stats.json")
    b = run_vllm(dict(python_env, KVTIER_VLLM_STATS=stats), [P1, P2], socket=kvtierd.socket,
                 prefix_caching=False, extra={"stage_mib": 3})
    assert b[0]["num_cached_tokens"] >= 4 * BT, b[0]
    assert b[0]["tokens"] == cold[0]["tokens"]
    assert b[0]["stats"]["loaded_blocks"] == 4 and b[0]["stats"]["fetches"] == 4, b[0]
    assert b[1]["stats"]["loaded_blocks"] == 6 and b[1]["stats"]["fetches"] == 6, b[1]
    assert b[1]["num_cached_tokens"] >= 2 * BT, b[1]
    assert b[1]["tokens"] == cold[1]["tokens"]


def test_other_dtype_never_hits(kvtierd: Kvtierd, python_env, cold) -> None:
    """Blocks published by a bf16 engine are never loaded by an f16 one (another namespace),
    nor by one naming another model identity; kvtierctl blocks shows each namespace."""
    run_vllm(python_env, [P1], socket=kvtierd.socket)
    f16 = run_vllm(python_env, [P1], socket=kvtierd.socket, dtype="float16")
    assert f16[0]["num_cached_tokens"] == 0, f16
    other = run_vllm(python_env, [P1], socket=kvtierd.socket,
                     extra={"namespace": "another-model"})
    assert other[0]["num_cached_tokens"] == 0, other
    assert other[0]["tokens"] == cold[0]["tokens"]
    names = [n["name"] for n in kvtierd.doc("blocks")["namespaces"]]
    assert len(names) == 3 and any(n.endswith(":f16") for n in names) and \
        "another-model" in names, names


def test_kvtierd_absent_at_start(python_env, tmp_path) -> None:
    """No kvtierd: a clear error by default; with on_unavailable=fallback, vLLM serves."""
    sock = str(tmp_path / "none.sock")
    p = run_vllm(python_env, [P1[:200]], socket=sock, wait=False)
    out, err = p.communicate(timeout=600)
    assert p.returncode != 0
    assert "KvtierConnector: cannot reach kvtierd" in err, err[-4000:]
    r = run_vllm(python_env, [P1[:200]], socket=sock, extra={"on_unavailable": "fallback"})
    assert r[0]["num_cached_tokens"] == 0 and len(r[0]["tokens"]) == 8


class Paused:
    """A vLLM process that stops before each prompt after the first until the test lets it go
    (vllm_run's pause_file handshake: PAUSE.i.wait, then PAUSE.i.go)."""

    def __init__(self, env, prompts, sock, tmp: Path, **spec) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.base = tmp / "pause"
        self.p = run_vllm(env, prompts, socket=sock, wait=False, pause_file=str(self.base),
                          **spec)

    def wait(self, i: int, timeout: float = 600) -> None:
        """Until the process waits before prompt @i (prompts before it are done)."""
        path = Path(f"{self.base}.{i}.wait")
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.p.poll() is not None:
                raise AssertionError(f"vLLM exited {self.p.returncode}:\n"
                                     f"{self.p.stderr.read()[-6000:]}")
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.1)

    def go(self, i: int) -> None:
        Path(f"{self.base}.{i}.go").touch()

    def results(self) -> list[dict]:
        out, err = self.p.communicate(timeout=600)
        assert self.p.returncode == 0, err[-6000:]
        return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_restart_in_place_keeps_the_hit(kvtierd: Kvtierd, python_env, cold,
                                        tmp_path) -> None:
    """kvtierctl restart between two requests of one vLLM: the second still loads P1's
    blocks (published by the first) and gives the cold run's tokens."""
    v = Paused(python_env, [P1, P1], kvtierd.socket, tmp_path, prefix_caching=False)
    v.wait(1)
    kvtierd.ctl(["restart"], check=True)
    v.go(1)
    r = v.results()
    assert r[1]["num_cached_tokens"] >= 4 * BT, r
    assert r[0]["tokens"] == r[1]["tokens"] == cold[0]["tokens"]


def test_kvtierd_killed_and_back(kvtierd_factory, python_env, cold, tmp_path) -> None:
    """kill -9 of kvtierd in the middle of a request: that request gives the cold run's
    tokens, and so does the next one, a miss; no crash. A new kvtierd on the same socket is
    reconnected to and used again."""
    d = kvtierd_factory()
    v = Paused(python_env, [P1, P1, P1, P1], d.socket, tmp_path, prefix_caching=False)
    v.wait(1)
    # Prompt 2 starts against a stopped kvtierd: the connector's first call waits for an
    # answer that never comes, and kvtierd is killed meanwhile.
    d.kill(signal.SIGSTOP)
    v.go(1)
    time.sleep(3)
    d.kill(signal.SIGKILL)
    v.wait(2)
    # A new kvtierd on the same socket (the killed one left its socket file behind).
    os.unlink(d.socket)
    d2 = subprocess.Popen([str(tool("daemon/kvtierd")), "--config", "/dev/null", "--socket",
                           d.socket, "--backend", "host", "--pool-size", "256M", "--lock", "no"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(d.socket):
            assert time.monotonic() < deadline and d2.poll() is None, "kvtierd did not start"
            time.sleep(0.05)
        time.sleep(1.2)  # past the connector's reconnect interval
        v.go(2)  # prompt 3: a new kvtierd, empty: a miss that publishes
        v.wait(3)
        v.go(3)  # prompt 4: a hit again
        r = v.results()
    finally:
        d2.send_signal(signal.SIGTERM)
        assert d2.wait(timeout=60) == 0
    assert len(r) == 4
    assert r[0]["num_cached_tokens"] == r[1]["num_cached_tokens"] == r[2][
        "num_cached_tokens"] == 0, r
    for x in r:
        assert x["tokens"] == cold[0]["tokens"]
    assert r[3]["num_cached_tokens"] >= 4 * BT, r  # prompt 3 published to the new kvtierd


TRANSFORMERS_CHILD = r"""
import json, sys, warnings
from conftest import load_lm
from kvtier.transformers import KvtierCache, generate
path, socket = sys.argv[1], sys.argv[2]
model, tok = load_lm(path)
ids = tok("A shared kvtierd serves vLLM and transformers processes at once. " * 8,
          return_tensors="pt")["input_ids"]
with KvtierCache(model, socket=socket, share_prefix=True, policy="tiered", hbm_frac=0.5,
                 evict_frac=0.0, delta=8, sinks=4, window=16, max_tokens=256) as cache:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        generate(model, ids, cache, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    print(json.dumps({"namespace": cache.namespace, "stats": cache.stats().as_dict()}))
"""


def test_two_vllm_and_a_transformers_process_share_one_kvtierd(
        kvtierd: Kvtierd, python_env, cold, gguf_path, tmp_path) -> None:
    """Two vLLM processes and one KvtierCache process use one kvtierd at the same time: each
    vLLM serves P1 with the cold run's tokens, the KvtierCache process publishes its own
    prompt's blocks meanwhile, and kvtierctl blocks lists both namespaces."""
    a = Paused(python_env, [P1[:200], P1], kvtierd.socket, tmp_path / "a",
               prefix_caching=False)
    b = Paused(python_env, [P1[:200], P1], kvtierd.socket, tmp_path / "b",
               prefix_caching=False)
    a.wait(1)
    b.wait(1)
    # both engines are up, each with its scheduler's and its worker's session
    assert kvtierd.doc("status")["sessions"] >= 4
    env = dict(python_env)
    env["PYTHONPATH"] = f"{Path(__file__).parent}{os.pathsep}{env['PYTHONPATH']}"
    t = subprocess.Popen([PYTHON, "-c", TRANSFORMERS_CHILD, gguf_path, kvtierd.socket],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    a.go(1)
    b.go(1)
    out, err = t.communicate(timeout=900)
    assert t.returncode == 0, err[-6000:]
    tr = json.loads(out.strip().splitlines()[-1])
    assert tr["stats"]["prefix_published"] > 0, tr
    ra, rb = a.results(), b.results()
    assert ra[1]["tokens"] == rb[1]["tokens"] == cold[0]["tokens"]
    text = kvtierd.ctl(["blocks"]).stdout
    ns = {n["name"]: n["blocks"] for n in kvtierd.doc("blocks")["namespaces"]}
    vl = [n for n in ns if n.startswith("vllm:")]
    assert len(vl) == 1 and ns[vl[0]] == len(P1) // BT, ns  # one copy of P1's 4 blocks
    assert ns[tr["namespace"]] == tr["stats"]["prefix_held"], ns
    for name in (vl[0], tr["namespace"]):
        assert name in text, text


def test_readme_vllm_example(kvtierd: Kvtierd, python_env, tmp_path) -> None:
    """README.md's vLLM example runs as written, twice: the second process loads the
    prompt's full blocks from kvtier and prints the same text."""
    import re

    text = (REPO / "README.md").read_text().split("\n## vLLM\n", 1)
    assert len(text) == 2, 'README.md has no "## vLLM" section'
    m = re.search(r"```python\n(.*?)```", text[1].split("\n## ", 1)[0], re.S)
    assert m, 'the "vLLM" section of README.md has no ```python example'
    src = tmp_path / "example.py"
    src.write_text(m.group(1))
    env = dict(python_env, KVTIER_SOCKET=kvtierd.socket, KVT_VLLM_MODEL=MODEL,
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    outs = []
    for _ in range(2):
        r = subprocess.run([PYTHON, str(src)], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-6000:]
        outs.append(re.search(r"^cached tokens: (\d+) text: (.*)$", r.stdout, re.M))
    assert outs[0] and outs[1], "the example printed no result"
    assert int(outs[1].group(1)) >= 128 and outs[1].group(2) == outs[0].group(2)


def test_readme_vllm_serve(kvtierd: Kvtierd, python_env, tmp_path) -> None:
    """README.md's `vllm serve` command line, with its options as written (a port and a short
    max_model_len added), serves a completion through KvtierConnector: the prompt's full
    blocks are published to kvtierd, in a namespace named after the model. The server is
    started as `python -m vllm.entrypoints.openai.api_server --model MODEL`, the same server
    and options: vllm-cpu 0.32.0's `vllm` command fails at start (README.md says so)."""
    import re
    import socket as so
    import urllib.request

    sec = (REPO / "README.md").read_text().split("\n## vLLM\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"\n    (vllm serve MODEL .*?)\n\n", sec, re.S)
    assert m, 'the "vLLM" section of README.md has no indented `vllm serve MODEL` command'
    with so.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = m.group(1).replace(
        "vllm serve MODEL", f"{PYTHON} -m vllm.entrypoints.openai.api_server --model {MODEL}",
        1) + \
        f" --host 127.0.0.1 --port {port} --max-model-len 1024"
    env = dict(python_env, KVTIER_SOCKET=kvtierd.socket, VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_LOGGING_LEVEL="WARNING",
               PATH=os.pathsep.join([os.path.dirname(PYTHON), os.environ.get("PATH", "")]))
    log = open(tmp_path / "serve.log", "w")
    p = subprocess.Popen(["bash", "-c", "exec " + cmd], env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert p.poll() is None, (tmp_path / "serve.log").read_text()[-6000:]
            assert time.monotonic() < deadline, "vllm serve never answered /health"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                time.sleep(1)
        body = json.dumps({"model": MODEL, "prompt": P1, "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.load(r)
        assert out["usage"]["prompt_tokens"] == len(P1), out
        blocks = kvtierd.doc("blocks")["namespaces"]
        assert [n["blocks"] for n in blocks] == [len(P1) // BT], blocks
        # vllm:<the model directory's name, its last 24 characters>:<identity>:<dtype>
        name = blocks[0]["name"]
        assert name.startswith(f"vllm:{os.path.basename(MODEL)[-24:]}:") and \
            name.endswith(":bf16"), blocks
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
