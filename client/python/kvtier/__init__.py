# SPDX-License-Identifier: MIT
"""kvtier: Python client of the kvtier KV-cache memory service (kvtierd).

A thin, zero-copy layer over libkvtier (ctypes; no compiler needed)::

    import numpy as np, kvtier

    with kvtier.connect("/run/kvtier/kvtierd.sock") as client:
        with client.open_sequence(layers=2, kv_heads=2, head_dim=64, dtype="f16",
                                  policy="tiered", delta=16, hbm_frac=0.5) as seq:
            seq.append(np.zeros((4, seq.token_bytes // 2), np.float16))
            print(seq.stat())

The library is found through $KVTIER_LIB, then a build tree ($KVT_BUILD_DIR, build/ of the
checkout), then the system (libkvtier.so.0); importing fails with LibraryError (an ImportError)
when it is missing or speaks another ABI major. Every failed call raises KvtierError, an
OSError carrying errno and kvtierd's message.

Prefix blocks (ABI 1.2) let processes that serve the same prompt prefix compute and hold its
rows once: ``Client.ns_open()`` (the model's identity and geometry), ``Namespace.block_keys()``
and ``lookup()``, ``open_sequence(ns=..., prefix_blocks=...)``, ``Sequence.publish()``.

The raw layer (every wire constant as an IntEnum/IntFlag, the ctypes structs, ``Sqe.prep_*()``)
is ``kvtier.abi``, generated from the C headers (docs/python.md, "The raw layer").
"""
from __future__ import annotations

from . import abi
from .abi import (
    ABI_MAJOR,
    ABI_MINOR,
    AppendFlag,
    Dtype,
    FetchFlag,
    LookupFlag,
    Policy,
    ScoreMode,
    T2Flag,
    TopkFlag,
    TopkMode,
)
from ._lib import LibraryError
from .core import (
    CHANGE_DTYPE,
    DTYPES,
    KEY_DTYPE,
    LIBRARY_PATH,
    PARAM_FIELDS,
    POLICIES,
    SCORE_MODES,
    AppendResult,
    Buffer,
    Client,
    FetchResult,
    KvtierError,
    Namespace,
    PublishResult,
    RetierResult,
    Sequence,
    SeqStat,
    TopkResult,
    TOPK_MODES,
    abi_version,
    block_keys,
    connect,
    make_ns_params,
    make_params,
    strerror,
)

__version__ = "0.1.0"


def version() -> str:
    """The kvtier release of the loaded libkvtier (kvt_version()), "major.minor.patch"."""
    from . import _lib, core

    if not _lib.has(core._LIB, "kvt_version"):
        raise LibraryError(f"{LIBRARY_PATH} predates kvt_version()")
    return core._LIB.kvt_version().decode()


def __getattr__(name: str) -> object:
    """The raw names this package exported before kvtier.abi (OP_*, TOPK_F_*, Sqe, ...):
    still reachable here, but not part of the surface; use kvtier.abi."""
    if name in _RAW:
        return getattr(abi, name)
    raise AttributeError(f"module 'kvtier' has no attribute {name!r}")


_RAW = frozenset({
    "APPEND_F_T0", "FETCH_F_LIST", "FETCH_F_T1", "FETCH_F_T2", "LOOKUP_F_PIN", "OP_APPEND",
    "OP_FETCH", "OP_LOOKUP", "OP_NOP", "OP_NS_CLOSE", "OP_NS_OPEN", "OP_PUBLISH", "OP_RETIER",
    "OP_SCORE_ADD", "OP_SEQ_CLOSE", "OP_SEQ_OPEN", "OP_SEQ_STAT", "OP_TOPK", "T2_F_KEY_CHANNEL",
    "TOPK_F_ESTIMATE", "TOPK_F_FAST", "TOPK_FAST_X", "TOPK_PROBE_X", "TOPK_F_FETCH",
    "TOPK_F_UNION", "BlockKey", "Cqe", "NsParams", "SeqParams", "Sqe", "retier_out_size",
    "topk_out_size",
})

__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "AppendFlag", "Dtype", "FetchFlag", "LookupFlag", "Policy",
    "ScoreMode", "T2Flag", "TopkFlag", "TopkMode", "abi", "LibraryError", "KEY_DTYPE",
    "Namespace", "PublishResult", "block_keys", "make_ns_params", "CHANGE_DTYPE", "DTYPES",
    "LIBRARY_PATH", "PARAM_FIELDS", "POLICIES", "SCORE_MODES", "TOPK_MODES", "AppendResult",
    "Buffer", "Client", "FetchResult", "KvtierError", "RetierResult", "Sequence", "SeqStat",
    "TopkResult", "abi_version", "connect", "make_params", "strerror", "version",
]
