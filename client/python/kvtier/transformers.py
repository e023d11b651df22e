# SPDX-License-Identifier: MIT
"""Hugging Face transformers generating through kvtierd: ``KvtierCache`` and the ``"kvtier"``
attention function.

::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from kvtier.transformers import KvtierCache

    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f)
    cache = KvtierCache(model, socket=None, policy="tiered", hbm_frac=0.5, evict_frac=0.03)
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64, do_sample=False)
    cache.stats()   # tier counts, evicted ratio, bytes moved
    cache.close()

The tiering loop is libkvtier's driver (kvtier.h, "tiering driver"; kvtier-llm runs the same
one; docs/python.md):

- one host buffer shared with kvtierd holds, per layer and K|V, the T0 region (``t0_slots``
  rows: the tokens resident on the "device") followed by the staging region (rows FETCH
  fills with the T1/T2 tokens); rows are ``[kv_head][head_dim]`` of the model's dtype;
- each forward pass gets free T0 slots from the driver (which re-tiers first when due: every
  ``delta`` tokens, and when the prompt ends, RETIER then one FETCH of every T1/T2 row of all
  layers), and at its end the driver queues ONE APPEND (KVT_APPEND_F_T0, all layers) and ONE
  SCORE_ADD: the pass's softmax weights, averaged over layers and heads (summed over its
  queries), per attended position; the queue goes to kvtierd in one submit before each RETIER;
- attention at a layer runs over the driver's view, resident T0 rows plus staged rows in
  position order: after each RETIER + FETCH one gather copies them into this cache's view
  (the tensor attention reads); each pass writes its new rows at the view's end, and those
  reach their T0 slots, for all layers in one copy, when the pass ends, before kvtierd's
  APPEND reads them. With nothing evicted the keys and values are DynamicCache's values in
  DynamicCache's order, so the arithmetic is the same (Proposition 1 of docs/tiering.md).

Constructing a ``KvtierCache`` switches the model to ``attn_implementation="kvtier"``
(``model.set_attn_implementation("kvtier")``); that function is transformers' eager attention
plus the capture of the weights, and with any other cache it is plain eager attention, so
the model stays usable with ``DynamicCache``. Load with ``attn_implementation="kvtier"`` to
have it from the start (import this module first: importing it registers the name).

Prefix sharing (``share_prefix=True``): processes serving the same prompt prefix compute its
rows once; ``generate(model, input_ids, cache, ...)`` below (or ``cache.load_prefix(input_ids)``
then ``model.generate``) opens the sequence from the blocks another process published and runs
the model on the rest of the prompt only (docs/python.md, "Prefix sharing").

Batch size 1, CPU tensors (the GPU path is designed in docs/python.md). transformers 5.x only.
"""
from __future__ import annotations

import errno as _errno
import hashlib
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _abi
from .core import POLICIES, Client, Driver, KvtierError, Namespace, connect, t0_slots_for

SUPPORTED_TRANSFORMERS = (5, 6)
"""transformers majors supported: [5, 6), as pinned by the package's "transformers" extra."""

ATTN_IMPLEMENTATION = "kvtier"
"""The name the attention function is registered under (AttentionInterface)."""


def check_transformers_version(version: str) -> None:
    """Raise ImportError unless @version is a transformers release this module supports."""
    try:
        major = int(version.split(".", 1)[0])
    except ValueError:
        major = -1
    lo, hi = SUPPORTED_TRANSFORMERS
    if not lo <= major < hi:
        raise ImportError(
            f"kvtier.transformers supports transformers >={lo},<{hi} (its Cache and "
            f"AttentionInterface API); found transformers {version}. Install a supported one: "
            f"pip install 'transformers>={lo},<{hi}' (or pip install 'kvtier[transformers]')"
        )


try:
    import torch
    import transformers as _tf
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"kvtier.transformers needs torch and transformers ({_e}); "
        "pip install 'kvtier[transformers]'"
    ) from _e

check_transformers_version(_tf.__version__)

from transformers import AttentionInterface  # noqa: E402
from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: E402

_TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

# The cache whose update() produced the key tensor the attention function is about to see.
_tls = threading.local()


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, kv_heads, n, dim) -> (batch, kv_heads * n_rep, n, dim), as transformers' Llama."""
    if n_rep == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, n, d).reshape(b, h * n_rep, n, d)


def _causal_mask(q: int, kl: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """Additive (q, kl) mask: query i sees keys j <= kl - q + i (the last q keys are the
    queries' own tokens, everything before them is the past). 0 or finfo.min, as eager_mask."""
    i = torch.arange(q, device=device).unsqueeze(1)
    j = torch.arange(kl, device=device).unsqueeze(0)
    allowed = j <= (kl - q) + i
    return torch.where(allowed, torch.tensor(0.0, dtype=dtype, device=device),
                       torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device))


def kvtier_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention (modeling_llama.eager_attention_forward, same operations
    in the same order) that also hands the softmax weights to the KvtierCache which produced
    @key. With no 4D mask given (transformers builds none for this name) it applies the causal
    mask itself when several queries run at once; a single decode query sees every key."""
    n_rep = getattr(module, "num_key_value_groups", query.shape[1] // key.shape[1])
    # repeat_kv copies into a contiguous tensor; without GQA do it here, so a cache's strided
    # view gives the matmuls the same operands as DynamicCache's contiguous tensor.
    key_states = _repeat_kv(key, n_rep) if n_rep > 1 else key.contiguous()
    value_states = _repeat_kv(value, n_rep) if n_rep > 1 else value.contiguous()

    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    elif query.shape[2] > 1:
        attn_weights = attn_weights + _causal_mask(query.shape[2], key.shape[2],
                                                   attn_weights.dtype, query.device)

    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(
        query.dtype)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout,
                                               training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()

    cache = getattr(_tls, "cache", None)
    if cache is not None and _tls.key is key:
        _tls.cache = _tls.key = None
        cache._observe(attn_weights)
    return attn_output, attn_weights


AttentionInterface.register(ATTN_IMPLEMENTATION, kvtier_attention)


@dataclass
class KvtierStats:
    """What ``KvtierCache.stats()`` reports. Tier counts and the evicted ratio are the
    daemon's (SEQ_STAT); the rest is counted by the cache."""

    n_tokens: int = 0
    tier_count: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Tokens in T0 (resident), T1 (pool, full precision), T2 (pool, int8), T3 (evicted)."""
    evicted_ratio: float = 0.0
    bytes_in: int = 0
    """Bytes kvtierd copied from the T0 region into its pool (APPEND)."""
    bytes_out: int = 0
    """Bytes kvtierd copied from its pool into the T0 and staging regions (RETIER, FETCH)."""
    pool_bytes: int = 0
    steps: int = 0
    """Forward passes (prefill and decode steps)."""
    appends: int = 0
    score_adds: int = 0
    retiers: int = 0
    fetches: int = 0
    rows_staged: int = 0
    last_retier_n: int = 0
    """Tokens at the last RETIER (its budgets are fractions of this n)."""
    first_evict_n: int = 0
    """Tokens at the first RETIER that evicted (0: none did)."""
    kvtier_s: float = 0.0
    """Seconds spent in the cache: row copies, gathers, weight sums, queueing, RETIER,
    FETCH and their waits (the binding included)."""
    retier_s: float = 0.0
    fetch_s: float = 0.0
    t0_slots: int = 0
    stage_rows: int = 0
    session: int = 0
    seq: int = 0
    prefix_tokens: int = 0
    """Prompt tokens the sequence started with from its namespace's blocks (share_prefix):
    the model did not compute them."""
    prefix_published: int = 0
    """Blocks of the prompt this cache added to the namespace after prefill."""
    prefix_held: int = 0
    """Leading blocks of the prompt the namespace holds after that PUBLISH."""

    def as_dict(self) -> dict[str, Any]:
        """The stats as a plain dict (JSON-ready)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def model_namespace(model: Any) -> str:
    """The prefix-block namespace name of @model: its name (config._name_or_path, cut to
    fit) and a digest of what makes its K/V rows what they are: the whole config, the
    weights' dtype, and each parameter's name, shape and a sample of its values (first,
    last and 64 strided elements), so another model, a fine-tune of the same config or
    another precision never shares rows with it. Printable ASCII, at most 63 bytes."""
    cfg = model.config
    h = hashlib.sha256()
    h.update(cfg.to_json_string(use_diff=False).encode())
    h.update(str(getattr(model, "dtype", "")).encode())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            step = max(flat.numel() // 64, 1)
            sample = torch.cat([flat[:16], flat[-16:], flat[::step][:64]])
            h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
            h.update(sample.to(torch.float32).cpu().numpy().tobytes())
    base = str(getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "model"))
    base = "".join(c if 0x20 < ord(c) < 0x7F else "_" for c in base.rstrip("/")) or "model"
    return f"{base[-38:]}:{h.hexdigest()[:24]}"


class _KvtierLayer(CacheLayerMixin):
    """Per-layer face of a KvtierCache for transformers' bookkeeping; the rows live in the
    cache's shared buffer, so keys/values stay None."""

    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, cache: KvtierCache) -> None:
        super().__init__()
        self._cache = cache

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("KvtierCache layers are updated through KvtierCache.update()")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache._vn + query_length, 0

    def get_seq_length(self) -> int:
        return self._cache._n

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass

    def offload(self) -> None:
        pass

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("KvtierCache holds one sequence: no beam search")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("KvtierCache cannot crop: kvtierd's positions only grow")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if repeats != 1:
            raise NotImplementedError("KvtierCache holds one sequence (batch size 1)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if len(indices) != 1:
            raise NotImplementedError("KvtierCache holds one sequence (batch size 1)")


class KvtierCache(Cache):
    """A transformers ``Cache`` whose KV rows are tiered by kvtierd (see the module docs).

    @model: the causal LM (its config gives the geometry, its dtype the row dtype; batch 1,
    CPU). @socket: kvtierd's control socket (None: $KVTIER_SOCKET, else the default).
    @policy: "tiered", "h2o", "streaming" or "full"; @hbm_frac, @evict_frac, @t2_frac: the
    tier budgets as fractions of the tokens (docs/tiering.md). @delta: re-tier period;
    @sinks, @window: always-resident first and last tokens; @protect_prompt: the prompt (the
    first forward pass) stays resident. @max_tokens: positions the sequence may hold (prompt
    plus generated; sizes the T0 and staging regions); @t2_keys "head" or "channel" (int8 key
    scales). @set_attn_implementation: switch the model to the "kvtier" attention function.
    @share_prefix: share the prompt's leading blocks with other processes through kvtierd's
    prefix blocks (call load_prefix(input_ids) before generate(), or use this module's
    generate()); @namespace: its name (default model_namespace(model)); @block_tokens:
    tokens per block (docs/python.md, "Prefix sharing").

    One cache is one sequence: use a new cache per generate() call (or call ``close()``).
    Errors from kvtierd raise ``kvtier.KvtierError``; after one the cache refuses further
    steps with the same error.
    """

    def __init__(
        self,
        model: Any,
        socket: str | None = None,
        policy: str = "tiered",
        hbm_frac: float = 0.5,
        evict_frac: float = 0.03,
        t2_frac: float = 0.0,
        *,
        delta: int = 64,
        sinks: int = 4,
        window: int = 128,
        protect_prompt: bool = True,
        max_tokens: int = 2048,
        t2_keys: str = "head",
        spin_us: int = 20,
        name: str = "kvtier.transformers",
        set_attn_implementation: bool = True,
        share_prefix: bool = False,
        namespace: str | None = None,
        block_tokens: int = _abi.BLOCK_TOKENS_DEFAULT,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        for nm, v in (("hbm_frac", hbm_frac), ("evict_frac", evict_frac), ("t2_frac", t2_frac)):
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{nm}={v} is outside [0, 1]")
        if policy == "tiered" and hbm_frac + evict_frac + t2_frac > 1.0 + 1e-6:
            raise ValueError("hbm_frac + evict_frac + t2_frac exceeds 1")
        if t2_keys not in ("head", "channel"):
            raise ValueError(f"t2_keys must be 'head' or 'channel', not {t2_keys!r}")
        if delta < 1 or max_tokens < 1 or sinks < 0 or window < 0:
            raise ValueError("delta and max_tokens must be >= 1, sinks and window >= 0")
        cfg = model.config.get_text_config(decoder=True)
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError("KvtierCache supports models whose layers all use full attention; "
                             f"this one has {sorted(set(layer_types))}")
        self.num_layers: int = int(cfg.num_hidden_layers)
        self.kv_heads: int = int(getattr(cfg, "num_key_value_heads", None)
                                 or cfg.num_attention_heads)
        self.q_heads: int = int(cfg.num_attention_heads)
        self.head_dim: int = int(getattr(cfg, "head_dim", None)
                                 or cfg.hidden_size // cfg.num_attention_heads)
        dtype = getattr(model, "dtype", torch.float32)
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"model dtype {dtype} not supported; kvtier stores f32, f16, bf16")
        self.dtype: torch.dtype = dtype
        limit = getattr(cfg, "max_position_embeddings", None)
        if limit:
            max_tokens = min(max_tokens, int(limit))
        self.policy = policy
        self.hbm_frac, self.evict_frac, self.t2_frac = float(hbm_frac), float(evict_frac), \
            float(t2_frac)
        self.delta, self.sinks, self.window = int(delta), int(sinks), int(window)
        self.protect_prompt = bool(protect_prompt)
        self.max_tokens = int(max_tokens)
        self.t2_keys = t2_keys
        self.share_prefix = bool(share_prefix)
        self.namespace: str | None = None
        """The prefix-block namespace (share_prefix): model_namespace(model) unless given."""
        if self.share_prefix:
            self.namespace = namespace if namespace is not None else model_namespace(model)
        super().__init__(layers=[_KvtierLayer(self) for _ in range(self.num_layers)])

        if set_attn_implementation and \
                getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
            model.set_attn_implementation(ATTN_IMPLEMENTATION)

        self._client: Client | None = connect(socket, spin_us=spin_us, name=name)
        self._drv: Driver | None = None
        self._seq: Any = None
        self._buf: Any = None
        self._err: BaseException | None = None
        self._st = KvtierStats(session=self._client.session_id)
        self._ns: Namespace | None = None
        self._prompt_keys: np.ndarray | None = None
        if self.share_prefix:
            try:
                self._ns = self._client.ns_open(self.namespace, self.num_layers,
                                                self.kv_heads, self.head_dim,
                                                _TORCH_DTYPES[self.dtype], block_tokens)
            except BaseException:
                self._client.close()
                raise
        self._n = 0  # positions appended (and scored) so far
        self._vn = 0  # entries of the view (resident + staged positions), by position
        self._prompt_len = 0
        self._closed = False
        # per-forward state
        self._q = 0
        self._step_slots: torch.Tensor | None = None
        self._step_layer = -1
        self._obs_layer = -1
        self._weights: list[torch.Tensor] = []

    # ---- sequence setup -----------------------------------------------------------------

    def load_prefix(self, input_ids: Any) -> int:
        """Before generating (share_prefix=True): look up the prompt's leading blocks in the
        model's namespace, open the sequence from the ones kvtierd holds (shared rows, no
        copy) and stage their K/V into this cache, so that the model computes only the rest
        of the prompt; the prompt's full blocks are published after prefill. Returns the
        tokens matched (a multiple of block_tokens, always leaving one prompt token to
        compute). Then call ``model.generate(input_ids, ..., past_key_values=cache)`` with
        the whole prompt: transformers feeds only the tokens the cache does not hold yet
        (or use kvtier.transformers.generate(), which does both)."""
        if self._err is not None:
            raise self._err
        if not self.share_prefix or self._ns is None:
            raise RuntimeError("KvtierCache.load_prefix() needs share_prefix=True")
        if self._closed or self._seq is not None:
            raise RuntimeError("KvtierCache.load_prefix() comes before the first forward "
                               "pass of a new cache (one cache per sequence)")
        t0 = time.perf_counter()
        try:
            ids = input_ids.detach().cpu().numpy() if hasattr(input_ids, "detach") \
                else np.asarray(input_ids)
            if ids.ndim == 2:
                if ids.shape[0] != 1:
                    raise ValueError(f"KvtierCache holds one sequence: batch size "
                                     f"{ids.shape[0]}, expected 1 (one cache per row)")
                ids = ids[0]
            if ids.ndim != 1 or ids.size == 0:
                raise ValueError(f"input_ids of shape {ids.shape}: one non-empty prompt")
            n_prompt = int(ids.size)
            ns = self._ns
            keys = ns.block_keys(ids)
            usable = min(keys.size, (n_prompt - 1) // ns.block_tokens)
            m = ns.lookup(keys[:usable], pin=True) if usable else 0
            self._prompt_keys = keys
            self._open(n_prompt, torch.device("cpu"), prefix_blocks=m)
            if self._n != m * ns.block_tokens:
                raise KvtierError(_errno.EPROTO, "kvt_driver_open",
                                  f"{m} shared blocks opened as {self._n} positions")
            self._st.prefix_tokens = self._n
            return self._n
        except BaseException as e:
            raise self._fail(e)
        finally:
            self._st.kvtier_s += time.perf_counter() - t0

    def _publish_prompt(self) -> None:
        """After prefill: offer the prompt's full blocks to the namespace (the matched ones
        are found there already). A prefix cache full of blocks in use refuses (ENOSPC):
        generation goes on unshared."""
        keys, self._prompt_keys = self._prompt_keys, None
        if keys is None or keys.size == 0:
            return
        assert self._drv is not None
        self._drv.flush()  # the prompt's APPEND first
        try:
            r = self._seq.publish(keys)
        except KvtierError as e:
            if e.errno != _errno.ENOSPC:
                raise
            return
        self._st.prefix_held, self._st.prefix_published = r.held, r.new

    def _open(self, q: int, device: Any, prefix_blocks: int = 0) -> None:
        """SEQ_OPEN at the first forward pass (or load_prefix()): @q tokens of prompt, the
        first @prefix_blocks blocks of them shared from the namespace."""
        if device.type != "cpu":
            raise NotImplementedError(
                f"KvtierCache runs on CPU tensors; the model is on {device} (the CUDA path "
                "is designed in docs/python.md, not implemented yet)")
        if q > self.max_tokens:
            raise ValueError(f"the prompt has {q} tokens, more than max_tokens="
                             f"{self.max_tokens}; pass a larger max_tokens")
        c = self._client
        assert c is not None
        self._prompt_len = q
        knobs = dict(policy=self.policy, protect_prompt=self.protect_prompt, delta=self.delta,
                     sinks=self.sinks, window=self.window, prompt_len=q,
                     hbm_frac=self.hbm_frac, max_tokens=self.max_tokens)
        ts = t0_slots_for(**knobs)
        ss = self.max_tokens
        esz = torch.empty((), dtype=self.dtype).element_size()
        row = self.kv_heads * self.head_dim * esz
        rows = ts + ss
        L = self.num_layers
        self._buf = c.alloc_buffer(L * 2 * rows * row)
        # One buffer, [layer][K,V][T0 slots, then staging rows][kv_head][head_dim], is both
        # regions of the sequence: the resident and staged rows are gathered by one
        # index_select.
        self._kv = self._buf.torch(self.dtype, (L, 2, rows, self.kv_heads, self.head_dim))
        self._kv_hr = self._kv.permute(0, 1, 3, 2, 4)  # [L][2][kv_head][row][dim] view
        # The view's rows gathered in position order, [L][K,V][kv_head][entry][dim]: rebuilt
        # by one gather at each RETIER (the only time the view changes other than growing);
        # each pass writes its new rows at the end, as a static cache would. Attention reads
        # slices of it; the new rows reach their T0 slots before kvtierd reads them.
        self._view = torch.empty((L, 2, self.kv_heads, self.max_tokens, self.head_dim),
                                 dtype=self.dtype)
        # Per-layer [1, kv_heads, max_tokens, head_dim] K and V views: cheaper to slice.
        self._vk = [self._view[i, 0:1] for i in range(L)]
        self._vv = [self._view[i, 1:2] for i in range(L)]
        self.t0_slots, self.stage_rows = ts, ss
        self._drv = c.open_driver(
            ns=self._ns, prefix_blocks=prefix_blocks,
            layers=L, kv_heads=self.kv_heads, head_dim=self.head_dim,
            dtype=_TORCH_DTYPES[self.dtype], score_mode="sum", q_heads=self.q_heads,
            evict_frac=self.evict_frac, t2_frac=self.t2_frac,
            t2_flags=_abi.T2_F_KEY_CHANNEL if self.t2_keys == "channel" else 0,
            t0_buf_id=self._buf.id, t0_slots=ts, t0_base_off=0, t0_slot_stride=row,
            t0_kv_stride=rows * row, t0_layer_stride=2 * rows * row,
            stage_buf_id=self._buf.id, stage_slots=ss, stage_base_off=ts * row,
            stage_slot_stride=row, stage_kv_stride=rows * row, stage_layer_stride=2 * rows * row,
            **knobs,
        )
        self._seq = self._drv.seq
        self._st.seq = self._seq.id
        self._st.t0_slots, self._st.stage_rows = ts, ss
        # The driver's view, entries by position: a T0 slot or ts + staging row each, which
        # index the buffer's [T0 slots, then staging rows] as is.
        self._view_idx = torch.empty(self.max_tokens, dtype=torch.int64)
        self._vn = 0
        self._n = self._drv.stats().n  # the shared prefix's positions, staged at open
        if self._n:
            self._gather(0)

    def _gather(self, q: int) -> None:
        """Rebuild the view from the driver's but for the @q tokens of the pass begun (after
        a RETIER + FETCH, or a prefix staged at open): one gather of every resident and
        staged row, all layers."""
        assert self._drv is not None
        _, loc = self._drv.view()
        vn = loc.size - q
        self._view_idx[:vn] = torch.from_numpy(loc[:vn].astype(np.int64))
        self._view[:, :, :, :vn] = self._kv_hr.index_select(3, self._view_idx[:vn])
        self._vn = vn

    # ---- the daemon ---------------------------------------------------------------------

    def _fail(self, e: BaseException) -> BaseException:
        if self._err is None:
            self._err = e
        return e

    # ---- one forward pass ---------------------------------------------------------------

    def _begin(self, q: int, device: Any) -> None:
        """Layer 0 of a forward pass of @q tokens: open or re-tier as needed, take q slots."""
        if self._seq is None:
            if self.share_prefix:
                raise RuntimeError(
                    "KvtierCache(share_prefix=True): call cache.load_prefix(input_ids) before "
                    "generate() (or use kvtier.transformers.generate(model, input_ids, "
                    "cache, ...))")
            self._open(q, device)
        elif self._step_layer != -1:
            raise self._fail(RuntimeError(
                "KvtierCache: the attention of the last forward pass never reached the cache; "
                "the model must run attn_implementation='kvtier' "
                "(model.set_attn_implementation('kvtier'))"))
        n = self._n
        if n < self._prompt_len < n + q:
            # After load_prefix() the passes up to the prompt's end must be the prompt's
            # remaining tokens: a pass that runs past it recomputes what the cache holds.
            raise self._fail(ValueError(
                f"KvtierCache: a forward pass of {q} tokens at position {n} runs past the "
                f"prompt's {self._prompt_len} tokens, {n} of which the cache holds already "
                "(load_prefix()); feed input_ids[:, cache.get_seq_length():], or pass "
                "generate() the whole prompt with a mask of the whole prompt"))
        if n + q > self.max_tokens:
            raise KvtierError(_errno.ENOSPC, "KvtierCache",
                              f"{n} + {q} tokens exceed max_tokens={self.max_tokens}; "
                              "create the cache with a larger max_tokens")
        # The driver re-tiers (and FETCHes) when the slots it handed out are used up, and
        # when the prompt ends; the view is then gathered anew.
        assert self._drv is not None
        rebuilt, slots = self._drv.step_begin(q)
        if rebuilt:
            self._gather(q)
        self._step_slots = torch.from_numpy(slots)
        self._q = q
        self._weights = []
        self._obs_layer = -1

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the pass's new rows of @layer_idx in their T0 slots and return this layer's
        keys and values: resident and staged rows in position order, then the new ones."""
        if self._err is not None:
            raise self._err
        if self._closed:
            raise RuntimeError("KvtierCache was closed; create a new one per sequence")
        t0 = time.perf_counter()
        try:
            if key_states.shape[0] != 1:
                raise ValueError(f"KvtierCache holds one sequence: batch size "
                                 f"{key_states.shape[0]}, expected 1 (one cache per row)")
            q = key_states.shape[2]
            if layer_idx == 0:
                self._begin(q, key_states.device)
            elif layer_idx != self._step_layer + 1 or q != self._q:
                raise RuntimeError(f"KvtierCache: layer {layer_idx} updated out of order")
            elif self._obs_layer != layer_idx - 1:
                raise RuntimeError(
                    f"KvtierCache: layer {layer_idx - 1}'s attention did not report its "
                    "weights; the model must run attn_implementation='kvtier' "
                    "(model.set_attn_implementation('kvtier'))")
            self._step_layer = layer_idx
            vk, vv = self._vk[layer_idx], self._vv[layer_idx]
            vn = self._vn
            vk[:, :, vn:vn + q] = key_states
            vv[:, :, vn:vn + q] = value_states
            # [1, kv_heads, n, head_dim] slices (head stride max_tokens * head_dim): the same
            # values DynamicCache's cat gives; the attention function makes them contiguous
            # when repeat_kv does not.
            keys, values = vk[:, :, : vn + q], vv[:, :, : vn + q]
            _tls.cache, _tls.key = self, keys
        except BaseException as e:
            raise self._fail(e)
        finally:
            self._st.kvtier_s += time.perf_counter() - t0
        return keys, values

    def _observe(self, attn_weights: torch.Tensor) -> None:
        """The attention function's weights for the layer just updated; at the last layer,
        end the pass: queue its APPEND and SCORE_ADD."""
        t0 = time.perf_counter()
        try:
            self._weights.append(attn_weights)
            self._obs_layer = self._step_layer
            if self._step_layer == self.num_layers - 1:
                self._end_step()
        except BaseException as e:
            raise self._fail(e)
        finally:
            self._st.kvtier_s += time.perf_counter() - t0

    def _end_step(self) -> None:
        q, vn = self._q, self._vn
        assert self._drv is not None and self._step_slots is not None
        # The pass's rows, all layers, into their T0 slots before kvtierd's APPEND reads them.
        self._kv_hr.index_copy_(3, self._step_slots, self._view[:, :, :, vn:vn + q])
        # Mean over layers and heads (summed over the pass's queries) per attended position.
        w = torch.stack(self._weights).sum(dim=(0, 1, 2, 3), dtype=torch.float32)
        w = (w * (1.0 / (self.num_layers * self.q_heads))).numpy()
        self._weights = []
        self._drv.step_end(w)
        self._n += q
        self._vn = vn + q
        self._step_layer = -1
        if self._prompt_keys is not None and self._n == self._prompt_len:
            self._publish_prompt()

    # ---- transformers' Cache surface ----------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions so far, evicted ones included (the next token's position)."""
        return self._n

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self._vn + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def is_initialized(self) -> bool:  # type: ignore[override]
        return self._seq is not None

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        return 1

    def reset(self) -> None:
        raise NotImplementedError("KvtierCache holds one sequence: create a new cache")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("KvtierCache cannot crop: kvtierd's positions only grow")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("KvtierCache holds one sequence: no beam search")

    # ---- results and lifetime -----------------------------------------------------------

    def stats(self) -> KvtierStats:
        """Tier counts, evicted ratio and bytes moved (kvtierd's SEQ_STAT, after submitting
        what is queued), with the cache's own counters."""
        st = self._st
        if self._drv is not None and self._drv._d is not None:
            d = self._drv.stats()
            st.steps = st.appends = d.steps
            st.score_adds, st.retiers, st.fetches = d.score_adds, d.retiers, d.fetches
            st.rows_staged, st.last_retier_n = d.rows_staged, d.last_retier_n
            st.first_evict_n = d.first_evict_n
            st.retier_s, st.fetch_s = d.retier_ns * 1e-9, d.fetch_ns * 1e-9
        if self._seq is not None and self._seq.id is not None and self._err is None:
            t0 = time.perf_counter()
            assert self._drv is not None
            self._drv.flush()
            s = self._seq.stat()
            st.kvtier_s += time.perf_counter() - t0
            st.n_tokens = s.n_tokens
            st.tier_count = tuple(int(x) for x in s.tier_count)  # type: ignore[assignment]
            st.evicted_ratio = s.tier_count[3] / s.n_tokens if s.n_tokens else 0.0
            st.bytes_in, st.bytes_out, st.pool_bytes = s.bytes_in, s.bytes_out, s.pool_bytes
        return KvtierStats(**st.__dict__)

    @property
    def seq_id(self) -> int | None:
        """kvtierd's id of the sequence (None before the first forward pass)."""
        return self._seq.id if self._seq is not None else None

    @property
    def session_id(self) -> int:
        """kvtierd's id of the session, as kvtierctl shows it."""
        return self._st.session

    def close(self) -> None:
        """Submit what is queued, close the sequence and the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        c, self._client = self._client, None
        if c is None:
            return
        try:
            d, self._drv = self._drv, None
            if d is not None:
                if self._err is None:
                    d.close()  # submits what is queued, SEQ_CLOSE
                else:
                    try:
                        d.close()  # frees it; raises the failure the cache has already
                    except KvtierError:
                        pass
        finally:
            # Views of the buffer: gone with the session.
            self._kv = self._kv_hr = self._view = self._vk = self._vv = None
            self._arena = self._arena_f32 = self._arena_u32 = None
            c.close()

    def __enter__(self) -> KvtierCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"KvtierCache(policy={self.policy!r}, hbm_frac={self.hbm_frac}, "
                f"evict_frac={self.evict_frac}, t2_frac={self.t2_frac}, n={self._n})")


def generate(model: Any, input_ids: Any, cache: KvtierCache, **kwargs: Any) -> Any:
    """``model.generate(input_ids, past_key_values=cache, **kwargs)``, first loading the
    prompt's shared prefix when the cache was made with share_prefix=True
    (cache.load_prefix()): transformers then runs the model on the unmatched suffix only, as
    it does for any cache that already holds the first tokens of input_ids. An
    ``attention_mask`` given must cover the whole prompt (the default does)."""
    if cache.share_prefix:
        cache.load_prefix(input_ids)
    if kwargs.get("attention_mask") is None:
        # generate() compares the mask's length with input_ids' to slice off what the cache
        # holds; a mask of the whole prompt is what lets it.
        kwargs["attention_mask"] = torch.ones_like(input_ids)
    # transformers 5.x renames generate()'s past_key_values to cache (deprecated later).
    params = inspect.signature(model.prepare_inputs_for_generation).parameters
    key = "cache" if "cache" in params else "past_key_values"
    return model.generate(input_ids=input_ids, **{key: cache}, **kwargs)


__all__ = ["ATTN_IMPLEMENTATION", "KvtierCache", "KvtierStats", "SUPPORTED_TRANSFORMERS",
           "check_transformers_version", "generate", "kvtier_attention", "model_namespace"]
