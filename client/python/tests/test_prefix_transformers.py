# SPDX-License-Identifier: MIT
"""KvtierCache(share_prefix=True) with the real SmolLM2-135M-Instruct and a real kvtierd: a
first process computes a ~100-token prompt and publishes its blocks; a second process (this
one) finds them, runs the model on the unmatched suffix only (the tokens fed to the model are
counted by a hook on its embedding) and generates the same greedy tokens as a cold run without
sharing; another namespace never matches; misuse is refused with a message that says what to
do. Nothing here is skipped."""
from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import kvtier
from conftest import PYTHON
from kvtier.transformers import KvtierCache, generate, model_namespace

NEW = 8
BT = 16
SMALL = dict(policy="tiered", hbm_frac=0.5, evict_frac=0.0, delta=8, sinks=4, window=16,
             max_tokens=160)
PROMPT = ("You are a concise assistant for a small bakery. Answer in one sentence, politely, "
          "and never invent prices. The bakery opens at seven, closes at six, bakes rye, "
          "sourdough and spelt loaves every morning, and sells croissants until they run "
          "out. On Sundays it bakes only sourdough, and on holidays it closes at noon. "
          "Question: when can I buy a fresh sourdough loaf?")

CHILD = r"""
import json, sys, warnings
from conftest import load_lm
from kvtier.transformers import KvtierCache, generate, model_namespace
path, socket, text, new, kw = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
    json.loads(sys.argv[5])
model, tok = load_lm(path)
ids = tok(text, return_tensors="pt")["input_ids"]
fed = []
model.model.embed_tokens.register_forward_pre_hook(lambda m, a: fed.append(a[0].shape[1]))
with KvtierCache(model, socket=socket, share_prefix=True, **kw) as cache:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = generate(model, ids, cache, max_new_tokens=new, min_new_tokens=new,
                       do_sample=False)
    st = cache.stats()
print(json.dumps({"ids": out[0, ids.shape[1]:].tolist(), "fed": fed, "n": ids.shape[1],
                  "namespace": cache.namespace, "model_namespace": model_namespace(model),
                  "stats": st.as_dict()}))
"""


def run(model, ids, cache):
    """Greedy ids of NEW tokens through kvtier.transformers.generate(), and the token count
    of each forward pass the model ran."""
    fed: list[int] = []
    h = model.model.embed_tokens.register_forward_pre_hook(
        lambda m, a: fed.append(a[0].shape[1]))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            out = generate(model, ids, cache, max_new_tokens=NEW, min_new_tokens=NEW,
                           do_sample=False)
    finally:
        h.remove()
    return out[0, ids.shape[1]:].tolist(), fed


def cold(lm, ids):
    """DynamicCache's greedy ids under transformers' eager attention: no kvtier at all."""
    from transformers import DynamicCache

    model, _ = lm
    model.set_attn_implementation("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             past_key_values=DynamicCache(), max_new_tokens=NEW,
                             min_new_tokens=NEW, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_second_process_computes_only_the_suffix(lm, gguf_path, kvtierd, python_env):
    model, tok = lm
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    assert 80 <= n <= 120, n
    ref = cold(lm, ids)

    # Process 1: nothing to share yet; computes the whole prompt and publishes its blocks.
    env = dict(python_env)
    env["PYTHONPATH"] = f"{Path(__file__).parent}:{env['PYTHONPATH']}"
    r = subprocess.run([PYTHON, "-c", CHILD, gguf_path, kvtierd.socket, PROMPT, str(NEW),
                        json.dumps(SMALL)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    assert first["n"] == n
    assert first["ids"] == ref
    assert first["fed"] == [n] + [1] * (NEW - 1)
    st1 = first["stats"]
    assert st1["prefix_tokens"] == 0
    assert st1["prefix_published"] == st1["prefix_held"] == n // BT
    # the namespace is the model's identity, the same in every process that loads it
    assert first["namespace"] == first["model_namespace"] == model_namespace(model)

    # Process 2 (this one): the prompt's leading blocks are there; only the suffix runs.
    with KvtierCache(model, socket=kvtierd.socket, share_prefix=True, **SMALL) as cache:
        ids2, fed = run(model, ids, cache)
        st = cache.stats()
    matched = (n - 1) // BT * BT
    assert st.prefix_tokens == matched > 0
    assert fed == [n - matched] + [1] * (NEW - 1), fed
    assert ids2 == ref
    # every full block of the prompt is shared: the pool holds only this sequence's tail
    assert st.prefix_held == n // BT and st.prefix_published == 0
    token_bytes = cache.num_layers * 2 * cache.kv_heads * cache.head_dim * 4
    assert st.pool_bytes == (st.n_tokens - st.prefix_held * BT) * token_bytes
    print(f"\nshared prefix: {matched} of {n} prompt tokens matched, the model ran "
          f"{fed[0]}; {NEW} tokens equal the cold run's")

    # Another namespace (another model's identity) never matches the same prompt.
    with KvtierCache(model, socket=kvtierd.socket, share_prefix=True, namespace="other-model",
                     **SMALL) as cache:
        ids3, fed = run(model, ids, cache)
        assert cache.stats().prefix_tokens == 0
    assert fed[0] == n and ids3 == ref


def test_model_namespace_is_the_models_identity(lm):
    """Deterministic, printable, at most 63 bytes; another weight value or another config
    gives another name (the weights' dtype is in the digest, and in the namespace's own
    dtype)."""
    model, _ = lm
    name = model_namespace(model)
    assert name == model_namespace(model)
    assert 0 < len(name) <= 63 and name.isascii() and name.isprintable()
    w = model.model.norm.weight
    with torch.no_grad():
        old = w[0].item()
        w[0] += 1.0
        try:
            assert model_namespace(model) != name
        finally:
            w[0] = old
    assert model_namespace(model) == name
    model.config.num_key_value_heads += 1
    try:
        assert model_namespace(model) != name
    finally:
        model.config.num_key_value_heads -= 1
    assert model_namespace(model) == name


def test_share_prefix_misuse_is_refused(lm, kvtierd_module):
    model, tok = lm
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True, **SMALL) as cache:
        with pytest.raises(RuntimeError, match=r"call cache.load_prefix\(input_ids\)"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model.generate(input_ids=ids, past_key_values=cache, max_new_tokens=2)
    with KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True, **SMALL) as cache:
        with pytest.raises(ValueError, match="batch size 2"):
            cache.load_prefix(torch.cat([ids, ids]))
    with KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True, **SMALL) as cache:
        cache.load_prefix(ids)
        with pytest.raises(RuntimeError, match="before the first forward pass"):
            cache.load_prefix(ids)
    with KvtierCache(model, socket=kvtierd_module.socket, **SMALL) as cache:
        with pytest.raises(RuntimeError, match="share_prefix=True"):
            cache.load_prefix(ids)
    # With the prompt's blocks published, a forward pass that recomputes the whole prompt
    # on top of the matched prefix is refused, not run at the wrong positions.
    with KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True, **SMALL) as cache:
        run(model, ids, cache)
        assert cache.stats().prefix_published > 0
    with KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True, **SMALL) as cache:
        assert cache.load_prefix(ids) > 0
        with pytest.raises(ValueError, match="runs past the prompt"):
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model(input_ids=ids, past_key_values=cache)
    with pytest.raises(kvtier.KvtierError, match="printable ASCII"):
        KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True,
                    namespace="tab\tname", **SMALL)
    long_prompt = tok(PROMPT * 3, return_tensors="pt")["input_ids"]
    with KvtierCache(model, socket=kvtierd_module.socket, share_prefix=True, **SMALL) as cache:
        with pytest.raises(ValueError, match="max_tokens"):
            cache.load_prefix(long_prompt)
