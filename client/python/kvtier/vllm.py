# SPDX-License-Identifier: MIT
"""vLLM sharing prompt prefixes through kvtierd: ``KvtierConnector``, a KV connector (vLLM's
``KVConnectorBase_V1``, role ``kv_both``).

::

    vllm serve MODEL --enforce-eager --kv-transfer-config \\
      '{"kv_connector":"KvtierConnector","kv_connector_module_path":"kvtier.vllm",
        "kv_role":"kv_both","kv_load_failure_policy":"recompute"}'

A vLLM block (``block_size`` tokens, 128 on CPU) is one kvtier prefix block (docs/prefix.md);
its key is kvtier's own ``block_keys()`` over the prompt's token ids, chained from the
namespace, not vLLM's block hash (that one is seeded per process unless PYTHONHASHSEED is
fixed, so two vLLM processes would never agree on it). The namespace is one per model identity
(a digest of the model's config and weight files), dtype, geometry and block size.

- Scheduler: ``get_num_new_matched_tokens`` asks kvtierd (LOOKUP, no pin: one round trip, a
  few tens of microseconds) how many leading full blocks of the prompt it holds, always
  leaving the prompt's last token to compute. ``build_connector_meta`` tells the worker, per
  request, its token ids and block ids once, the blocks to load and how many prompt blocks
  are computed at the end of the step.
- Worker: at a request's first step, a pinning LOOKUP and SEQ_OPEN from the held blocks
  (shared rows, no copy), then FETCH stages the blocks to load into a window shared with
  kvtierd (``stage_mib``, 64 MiB by default: allocated and touched once per session, so no
  request pays for its pages, and bounded whatever the prompt's length), and one copy per
  layer puts each window's blocks in vLLM's paged cache. ``save_kv_layer``
  gathers, per layer, the rows of the prompt blocks computed this step that the sequence does
  not hold yet (``wait_for_save`` gathers the layers whose hook did not come: vLLM's CPU runner
  calls none); ``wait_for_save`` APPENDs them and PUBLISHes the prompt's full blocks.
- Failures: kvtierd absent at start raises, or with ``"on_unavailable": "fallback"`` in
  ``kv_connector_extra_config`` logs and serves without it. kvtierd gone mid-serve: every
  call degrades to a miss, blocks that could not be loaded are reported to vLLM
  (``get_block_ids_with_load_errors``; the connector sets ``kv_load_failure_policy`` to
  ``recompute``) so vLLM computes them, and the connector reconnects (at most once a second).

docs/vllm.md has the design, the block mapping, the copies and the failure modes.
"""
from __future__ import annotations

import errno as _errno
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .core import Client, KvtierError, Namespace, Sequence, connect

SUPPORTED_VLLM = ((0, 32), (0, 33))
"""vLLM versions supported: >=0.32,<0.33, as pinned by the package's "vllm" extra (the
connector API changes between minor releases)."""


def check_vllm_version(version: str) -> None:
    """Raise ImportError unless @version is a vLLM release this module supports."""
    m = re.match(r"(\d+)\.(\d+)", version)
    v = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    lo, hi = SUPPORTED_VLLM
    if not lo <= v < hi:
        raise ImportError(
            f"kvtier.vllm supports vLLM >={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]} (its "
            f"KVConnectorBase_V1 API); found vLLM {version}. Install a supported one: "
            f"pip install 'kvtier[vllm]'")


try:
    import torch
    import vllm as _vllm
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError(f"kvtier.vllm needs vLLM ({_e}); pip install 'kvtier[vllm]'") from _e

check_vllm_version(_vllm.__version__)

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

log = logging.getLogger("kvtier.vllm")

OVERRIDDEN = (
    "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer",
    "wait_for_save", "get_finished", "get_block_ids_with_load_errors", "shutdown",
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
    "request_finished",
)
"""The KVConnectorBase_V1 methods KvtierConnector overrides (tests pin them against the
installed base class)."""

_TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_LOST = {_errno.ECONNRESET, _errno.ENOTCONN, _errno.EPIPE, _errno.ECONNREFUSED,
         _errno.ENOENT, _errno.ESHUTDOWN, _errno.EBADF}
LAYOUT = "cpu"
"""The block layout the namespace's rows carry (its name says it): vLLM's CPU paged cache.
A kvtier block of a layer holds the bytes of one vLLM block of that layer verbatim, cut into
2 * block_size chunks of kv_heads * head_size elements; row t's K half is chunk 2t and its V
half chunk 2t + 1 (docs/vllm.md, "Blocks and rows"). A hit is then one contiguous copy per
layer, and the rows are never read as tokens' keys and values (no RETIER, no TOPK)."""
RECONNECT_S = 1.0
"""Least seconds between two attempts to reach a kvtierd that went away."""


def model_identity(model_config: Any) -> str:
    """A digest of what makes a model's K/V rows what they are: its name, revision, dtype and
    quantization, and, for a local directory, config.json and every safetensors file's header
    (tensor names, dtypes, shapes), size and three 64 KiB samples of its bytes, so another
    model, a fine-tune of the same config or another precision never shares a namespace."""
    h = hashlib.sha256()
    for a in ("model", "revision", "dtype", "quantization", "tokenizer_revision"):
        h.update(f"{a}={getattr(model_config, a, None)}\n".encode())
    path = str(getattr(model_config, "model", ""))
    if os.path.isdir(path):
        for f in sorted(os.listdir(path)):
            p = os.path.join(path, f)
            if f == "config.json":
                with open(p, "rb") as fp:
                    h.update(fp.read())
            elif f.endswith(".safetensors"):
                size = os.path.getsize(p)
                h.update(f"{f}:{size}\n".encode())
                with open(p, "rb") as fp:
                    hl = int.from_bytes(fp.read(8), "little")
                    h.update(fp.read(min(hl, 1 << 24)))
                    for off in (size // 3, size // 2, max(size - 65536, 0)):
                        fp.seek(off)
                        h.update(fp.read(65536))
    return h.hexdigest()[:24]


@dataclass
class _Geometry:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_tokens: int
    name: str


def _geometry(vllm_config: Any, kv_cache_config: Any) -> _Geometry:
    """The namespace of this engine; refuses what the connector does not handle, at start."""
    mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) > 1:
        raise ValueError(
            f"KvtierConnector: this model has {len(groups)} KV cache groups (a hybrid model: "
            "sliding-window, mamba or mixed layers); kvtier shares full-attention prefixes "
            "only. Serve it without --kv-transfer-config KvtierConnector.")
    for g in groups:
        spec = type(g.kv_cache_spec).__name__
        if spec != "FullAttentionSpec":
            raise ValueError(f"KvtierConnector: KV cache spec {spec} is not full attention; "
                             "kvtier shares full-attention prefixes only")
    if pc.tensor_parallel_size * pc.pipeline_parallel_size != 1:
        raise ValueError("KvtierConnector: tensor or pipeline parallelism is not supported "
                         "yet (one worker); serve with --tensor-parallel-size 1")
    if mc.use_mla:
        raise ValueError("KvtierConnector: MLA models are not supported")
    cdt = cc.cache_dtype
    if cdt not in ("auto", None) and not str(cdt).startswith(("bfloat16", "float16", "half")):
        raise ValueError(f"KvtierConnector: kv_cache_dtype {cdt} is not supported (the "
                         "model's own bf16, f16 or f32)")
    dtype = mc.dtype
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"KvtierConnector: dtype {dtype} is not one of "
                         f"{', '.join(map(str, _TORCH_DTYPES))}")
    bt = int(cc.block_size)
    if not 1 <= bt <= 1024:
        raise ValueError(f"KvtierConnector: block_size {bt} is past kvtier's 1024 tokens")
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    name = extra.get("namespace")
    if not name:
        base = os.path.basename(str(mc.model).rstrip("/")) or "model"
        base = "".join(c if 0x20 < ord(c) < 0x7F else "_" for c in base)[-24:]
        name = f"vllm:{base}:{model_identity(mc)}:{LAYOUT}:{_TORCH_DTYPES[dtype]}"
    return _Geometry(mc.get_num_layers(pc), mc.get_num_kv_heads(pc), mc.get_head_size(),
                     dtype, bt, name)


class _Link:
    """One kvtierd session and the namespace handle, reconnected after a loss."""

    def __init__(self, geo: _Geometry, socket: str | None, who: str) -> None:
        self.geo, self.socket, self.who = geo, socket, who
        self.client: Client | None = None
        self.ns: Namespace | None = None
        self.epoch = 0  # counts sessions: a sequence of an older session is gone
        self._retry_at = 0.0

    def get(self) -> Namespace | None:
        """The namespace handle, connecting if needed; None while kvtierd is unreachable."""
        if self.ns is not None:
            return self.ns
        now = time.monotonic()
        if now < self._retry_at:
            return None
        self._retry_at = now + RECONNECT_S
        try:
            self.connect()
        except KvtierError as e:
            log.debug("kvtier %s: kvtierd unreachable: %s", self.who, e)
            return None
        log.warning("kvtier %s: connected to kvtierd (session %d, namespace %s)", self.who,
                    self.client.session_id, self.geo.name)
        return self.ns

    def connect(self) -> None:
        g = self.geo
        c = connect(self.socket, name=f"vllm-{self.who}-{os.getpid()}")
        try:
            self.ns = c.ns_open(g.name, g.layers, g.kv_heads, g.head_dim,
                                _TORCH_DTYPES[g.dtype], g.block_tokens)
        except BaseException:
            c.close()
            raise
        self.client = c
        self.epoch += 1

    def lost(self, e: BaseException) -> None:
        """After a failed call: a lost daemon drops the session (misses until it is back)."""
        if isinstance(e, KvtierError) and e.errno not in _LOST:
            log.warning("kvtier %s: %s", self.who, e)
            return
        log.warning("kvtier %s: kvtierd lost (%s); serving without it, reconnecting", self.who, e)
        c, self.client, self.ns = self.client, None, None
        self._retry_at = time.monotonic() + RECONNECT_S
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - a dead session has nothing left to free
                pass

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.client = self.ns = None


@dataclass
class _ReqMeta:
    req_id: str
    token_ids: list[int] | None  # the prompt's full-block tokens, sent once
    block_ids: list[int] | None  # all of the request's blocks so far (None: unchanged)
    new_block_ids: list[int] = field(default_factory=list)
    load_from: int = 0  # blocks [load_from, load_to) to load from kvtier
    load_to: int = 0
    computed_blocks: int = 0  # full prompt blocks computed at the end of this step
    reset: bool = False  # resumed after preemption: start over


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the worker for one step."""

    requests: list[_ReqMeta] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)


@dataclass
class _WorkerReq:
    tokens: list[int]
    block_ids: list[int]
    keys: np.ndarray
    seq: Sequence | None = None
    epoch: int = 0
    seq_blocks: int = 0  # blocks the kvtier sequence holds (shared or appended)
    dead: bool = False  # its sequence was lost: nothing more is saved for it


@dataclass
class _SchedReq:
    prompt_blocks: int
    load_from: int = 0
    load_to: int = 0
    sent: bool = False


class KvtierConnector(KVConnectorBase_V1):
    """vLLM KV connector sharing full prompt blocks through kvtierd (module docstring)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        if ktc.kv_load_failure_policy != "recompute":
            # A block kvtierd lost between the lookup and the load is computed again, never
            # a failed request.
            log.info("kvtier: kv_load_failure_policy %s -> recompute", ktc.kv_load_failure_policy)
            ktc.kv_load_failure_policy = "recompute"
        extra = ktc.kv_connector_extra_config or {}
        self.geo = _geometry(vllm_config, kv_cache_config)
        self.bt = self.geo.block_tokens
        on_unavailable = extra.get("on_unavailable", "error")
        if on_unavailable not in ("error", "fallback"):
            raise ValueError(f"KvtierConnector: on_unavailable={on_unavailable!r}: 'error' "
                             "or 'fallback'")
        who = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self.link = _Link(self.geo, extra.get("socket"), who)
        try:
            self.link.connect()
        except KvtierError as e:
            if on_unavailable == "error":
                raise RuntimeError(
                    f"KvtierConnector: cannot reach kvtierd: {e}. Start kvtierd, set "
                    "kv_connector_extra_config socket (or $KVTIER_SOCKET), or set "
                    "on_unavailable: fallback to serve without kvtier until it is up") from e
            log.warning("kvtier %s: kvtierd unreachable (%s): serving without it, "
                        "retrying every %.0f s", who, e, RECONNECT_S)
            self.link._retry_at = time.monotonic() + RECONNECT_S
        # scheduler
        self._sreqs: dict[str, _SchedReq] = {}
        self._pending: dict[str, Any] = {}
        # worker
        self._kv: list[torch.Tensor] = []
        self._layer_of: dict[str, int] = {}
        self._wreqs: dict[str, _WorkerReq] = {}
        self._stage: Any = None
        self._stage_epoch = -1
        # The staging window: as many whole blocks (every layer) as fit in stage_mib.
        blk_bytes = (self.geo.layers * 2 * self.bt * self.geo.kv_heads * self.geo.head_dim *
                     torch.empty((), dtype=self.geo.dtype).element_size())
        stage_mib = extra.get("stage_mib", 64)
        if not isinstance(stage_mib, (int, float)) or stage_mib <= 0:
            raise ValueError(f"KvtierConnector: stage_mib={stage_mib!r}: a positive number of "
                             "MiB for the staging window")
        self.stage_blocks = max(1, int(stage_mib * 2**20) // blk_bytes)
        self._stage_rows = self.stage_blocks * self.bt
        self._save: list[tuple[_WorkerReq, int, int, torch.Tensor]] = []
        self._gathered: set[int] = set()
        self._save_steps = 0
        self._load_errors: set[int] = set()
        self.stats = {"lookups": 0, "hit_blocks": 0, "loaded_blocks": 0, "saved_blocks": 0,
                      "published_new": 0, "load_errors": 0, "fetches": 0, "load_s": 0.0,
                      "save_s": 0.0}

    # ---- scheduler side -----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond @num_computed_tokens whose blocks kvtierd holds (one LOOKUP)."""
        rid = request.request_id
        prompt = list(request.prompt_token_ids or [])
        usable = (len(prompt) - 1) // self.bt
        self._sreqs[rid] = _SchedReq(prompt_blocks=len(prompt) // self.bt)
        if usable <= 0 or getattr(request, "mm_features", None) or \
                getattr(request, "lora_request", None) or getattr(request, "cache_salt", None):
            return 0, False
        ns = self.link.get()
        if ns is None:
            return 0, False
        try:
            m = ns.lookup(ns.block_keys(prompt[: usable * self.bt]), pin=False)
        except KvtierError as e:
            self.link.lost(e)
            return 0, False
        self.stats["lookups"] += 1
        hit = m * self.bt
        return max(hit - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        s = self._sreqs.get(request.request_id)
        if s is None or num_external_tokens <= 0:
            return
        done = request.num_computed_tokens
        s.load_from = done // self.bt
        s.load_to = (done + num_external_tokens) // self.bt
        self.stats["hit_blocks"] += s.load_to - s.load_from

    def build_connector_meta(self, scheduler_output: Any) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata(finished=list(scheduler_output.finished_req_ids))
        nsched = scheduler_output.num_scheduled_tokens
        for r in scheduler_output.scheduled_new_reqs:
            s = self._sreqs.get(r.req_id)
            if s is None or s.prompt_blocks == 0 or r.mm_features or r.lora_request:
                continue
            prompt = list(r.prompt_token_ids or [])
            end = min(r.num_computed_tokens + nsched.get(r.req_id, 0), len(prompt))
            meta.requests.append(_ReqMeta(
                r.req_id, prompt[: s.prompt_blocks * self.bt], list(r.block_ids[0]),
                load_from=s.load_from, load_to=s.load_to, computed_blocks=end // self.bt))
            s.sent = True
        c = scheduler_output.scheduled_cached_reqs
        resumed = getattr(c, "resumed_req_ids", set()) or set()
        for i, rid in enumerate(c.req_ids):
            s = self._sreqs.get(rid)
            if s is None or not s.sent:
                continue
            done = c.num_computed_tokens[i]
            if done >= s.prompt_blocks * self.bt and rid not in resumed:
                continue  # past its prompt's full blocks: nothing more to save
            end = done + nsched.get(rid, 0)
            nb = c.new_block_ids[i]
            new = list(nb[0]) if nb is not None else []
            if rid in resumed:
                meta.requests.append(_ReqMeta(rid, None, new, computed_blocks=min(
                    end // self.bt, s.prompt_blocks), reset=True))
            else:
                meta.requests.append(_ReqMeta(rid, None, None, new_block_ids=new,
                                              computed_blocks=min(end // self.bt,
                                                                  s.prompt_blocks)))
        for rid in scheduler_output.finished_req_ids:
            self._sreqs.pop(rid, None)
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        """The prompt's blocks were published during prefill: nothing to hold the blocks for."""
        self._sreqs.pop(request.request_id, None)
        return False, None

    # ---- worker side --------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's per-layer paged caches, in layer order. The CPU layout is [num_blocks,
        kv_heads, block_size, 2 * head_size], which its attention reads as [num_blocks,
        kv_heads, K|V, block_size, head_size]; any other is refused here."""
        g = self.geo

        def layer_no(name: str) -> int:
            m = re.search(r"\.(\d+)\.", name)
            return int(m.group(1)) if m else 0

        names = sorted(kv_caches, key=layer_no)
        if len(names) != g.layers:
            raise ValueError(f"KvtierConnector: {len(names)} KV cache layers, the model has "
                             f"{g.layers}")
        for n in names:
            t = kv_caches[n]
            if t.device.type != "cpu" or t.dim() != 4 or tuple(t.shape[1:]) != (
                    g.kv_heads, g.block_tokens, 2 * g.head_dim) or t.dtype != g.dtype:
                raise ValueError(
                    f"KvtierConnector: KV cache {n} is {tuple(t.shape)} {t.dtype} on "
                    f"{t.device}; this version handles vLLM's CPU layout [num_blocks, "
                    f"{g.kv_heads}, {g.block_tokens}, {2 * g.head_dim}] of {g.dtype} only: run "
                    "vLLM's CPU build, or serve without KvtierConnector (its CUDA layouts are "
                    "refused until the CUDA branch is tested: docs/vllm.md, \"On CUDA\")")
        # each layer as [num_blocks, one block's elements]: a block is what kvtier stores
        self._kv = [kv_caches[n].view(kv_caches[n].shape[0], -1) for n in names]
        self._layer_of = {n: i for i, n in enumerate(names)}
        if self.link.get() is not None:
            self._staging()  # the window's pages are touched here, not in a request's TTFT

    def _staging(self) -> Any:
        """The window shared with kvtierd that FETCH stages into, [layer][row][K,V][kv_head]
        [head_dim] (so a layer's rows of a block are the vLLM block's bytes, and each row's
        K and V cross as one copy), ``stage_blocks`` blocks, one per session: written once
        when allocated, so that its pages exist before a request needs them."""
        link = self.link
        if self._stage is not None and self._stage_epoch == link.epoch:
            return self._stage
        g = self.geo
        esz = torch.empty((), dtype=g.dtype).element_size()
        size = g.layers * 2 * self._stage_rows * g.kv_heads * g.head_dim * esz
        self._stage = link.client.alloc_buffer(size)
        self._stage.torch(torch.uint8, (size,)).zero_()
        self._stage_epoch = link.epoch
        return self._stage

    def _open(self, w: _WorkerReq, want_blocks: int) -> int:
        """Pinning LOOKUP of the first @want_blocks keys and SEQ_OPEN from the held ones."""
        ns = self.link.get()
        if ns is None:
            return 0
        g = self.geo
        m = ns.lookup(w.keys[:want_blocks], pin=True) if want_blocks else 0
        stage = self._staging()
        esz = torch.empty((), dtype=g.dtype).element_size()
        row = g.kv_heads * g.head_dim * esz
        R = self._stage_rows
        w.seq = self.link.client.open_sequence(
            ns=ns, prefix_blocks=m, layers=g.layers, kv_heads=g.kv_heads, head_dim=g.head_dim,
            dtype=_TORCH_DTYPES[g.dtype], policy="full", delta=4,
            max_tokens=len(w.tokens) + 1,
            stage_buf_id=stage.id, stage_slots=R, stage_slot_stride=2 * row,
            stage_kv_stride=row, stage_layer_stride=2 * R * row)
        w.epoch, w.seq_blocks = self.link.epoch, m
        return m

    def _load(self, w: _WorkerReq, lo: int, hi: int) -> int:
        """Copy the sequence's blocks [@lo, @hi) into vLLM's cache, a staging window at a
        time: one FETCH, then one contiguous copy per layer. Returns the blocks loaded."""
        g = self.geo
        R = self._stage_rows
        st = self._stage.torch(g.dtype, (g.layers, R * 2 * g.kv_heads * g.head_dim))
        blk = self._kv[0].shape[1]
        for s in range(lo, hi, self.stage_blocks):
            e = min(s + self.stage_blocks, hi)
            n = (e - s) * g.block_tokens
            f = w.seq.fetch(positions=np.arange(s * g.block_tokens, e * g.block_tokens,
                                                dtype=np.uint32))
            if f.rows != n:
                raise KvtierError(_errno.EPROTO, "kvt_fetch", f"{f.rows} rows staged of {n}")
            self.stats["fetches"] += 1
            idx = torch.tensor(w.block_ids[s:e], dtype=torch.long)
            for li, kv in enumerate(self._kv):
                kv.index_copy_(0, idx, st[li, : (e - s) * blk].view(e - s, blk))
        return hi - lo

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        self._save = []
        for rid in meta.finished:
            self._drop(rid)
        t0 = time.perf_counter()
        for r in meta.requests:
            if r.reset:
                self._drop(r.req_id)
            w = self._wreqs.get(r.req_id)
            if w is None:
                if r.token_ids is None:
                    if not r.reset:
                        continue
                    continue  # resumed: its tokens were dropped with it; no more saving
                ns = self.link.get()  # reconnects after a loss, at most once a second
                keys = ns.block_keys(r.token_ids) if ns is not None else \
                    np.empty(0, dtype=[("lo", "<u8"), ("hi", "<u8")])
                w = _WorkerReq(list(r.token_ids), list(r.block_ids or []), keys)
                self._wreqs[r.req_id] = w
                if ns is None:
                    w.dead = True
            elif r.block_ids is not None:
                w.block_ids = list(r.block_ids)
            w.block_ids.extend(r.new_block_ids)
            if w.dead:
                self._load_errors.update(w.block_ids[r.load_from:r.load_to])
                continue
            failed_from = r.load_to
            try:
                if w.seq is None:
                    want = max(r.load_to, r.computed_blocks)
                    m = self._open(w, min(want, len(w.keys)))
                    if w.seq is None:
                        w.dead = True
                    failed_from = max(min(m, r.load_to), r.load_from)
                    if failed_from > r.load_from:
                        self.stats["loaded_blocks"] += self._load(w, r.load_from, failed_from)
            except KvtierError as e:
                self.link.lost(e)
                w.dead, w.seq = True, None
                failed_from = r.load_from
            if failed_from < r.load_to:
                bad = w.block_ids[failed_from:r.load_to]
                self._load_errors.update(bad)
                self.stats["load_errors"] += len(bad)
                w.dead = True  # this step attends to blocks that were not loaded: no saving
                continue
            if not w.dead and r.computed_blocks > w.seq_blocks:
                self._save.append((w, w.seq_blocks, r.computed_blocks, None))
        self.stats["load_s"] += time.perf_counter() - t0
        g = self.geo
        self._gathered = set()
        self._save = [(w, lo, hi, torch.empty((hi - lo) * g.block_tokens, g.layers, 2,
                                              g.kv_heads, g.head_dim, dtype=g.dtype))
                      for w, lo, hi, _ in self._save]

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are done before start_load_kv returns: nothing to wait for."""
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """Gather this layer's blocks to save into the APPEND layout [row][layer][K,V][head]
        [dim]: row t of a layer is the block's chunks 2t and 2t + 1 (LAYOUT; one copy). vLLM 0.32's CPU runner does not call this
        hook (its attention is not wrapped by maybe_transfer_kv_layer): wait_for_save()
        gathers every layer the hook did not."""
        if not self._save:
            return
        li = self._layer_of.get(layer_name)
        if li is not None and li not in self._gathered:
            self._gather(li)

    def _gather(self, li: int) -> None:
        self._gathered.add(li)
        kv = self._kv[li]
        g = self.geo
        for w, lo, hi, rows in self._save:
            idx = torch.tensor(w.block_ids[lo:hi], dtype=torch.long)
            src = kv.index_select(0, idx)  # [blocks, one block's elements]
            rows.view(hi - lo, self.bt, g.layers, 2 * g.kv_heads * g.head_dim)[:, :, li] = \
                src.view(hi - lo, self.bt, 2 * g.kv_heads * g.head_dim)

    def wait_for_save(self) -> None:
        """APPEND the gathered blocks to each request's sequence and PUBLISH its blocks."""
        t0 = time.perf_counter()
        for li in range(len(self._kv)):
            if self._save and li not in self._gathered:
                self._gather(li)  # a layer whose save_kv_layer did not come
                self.stats["layers_gathered_late"] = \
                    self.stats.get("layers_gathered_late", 0) + 1
        for w, lo, hi, rows in self._save:
            if w.dead or w.seq is None or w.epoch != self.link.epoch:
                continue
            try:
                per = self.bt
                for b in range(hi - lo):
                    w.seq.append(rows[b * per:(b + 1) * per], per)
                w.seq_blocks = hi
                r = w.seq.publish(w.keys[:hi])
                self.stats["saved_blocks"] += hi - lo
                self.stats["published_new"] += r.new
            except KvtierError as e:
                if e.errno != _errno.ENOSPC:
                    self.link.lost(e)
                w.dead, w.seq = True, None
        self._save_steps = len(self._save)
        self._save = []
        self.stats["save_s"] += time.perf_counter() - t0
        path = os.environ.get("KVTIER_VLLM_STATS")
        if path and (self._save_steps or self.stats["loaded_blocks"]):
            # The worker's counters for the benchmark (it runs in vLLM's worker process).
            with open(path + ".part", "w") as fp:
                json.dump(self.stats, fp)
            os.replace(path + ".part", path)

    def _drop(self, rid: str) -> None:
        w = self._wreqs.pop(rid, None)
        if w is not None and w.seq is not None and w.epoch == self.link.epoch:
            try:
                w.seq.close()
            except KvtierError as e:
                self.link.lost(e)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                set[str] | None]:
        """Loads and saves complete within the step: finished requests only free state."""
        for rid in finished_req_ids:
            self._drop(rid)
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self) -> None:
        for rid in list(self._wreqs):
            self._drop(rid)
        try:
            self.link.close()
        except KvtierError:
            pass
