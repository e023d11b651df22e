# SPDX-License-Identifier: MIT
"""The Pythonic surface over libkvtier: Client, Buffer, Sequence and their results.

A Client may be shared by threads: its calls (and those of its sequences, namespaces and
buffers) take the client's lock, so they run one at a time. Calls block in libkvtier with the
GIL released; a lost daemon ends them with KvtierError(ECONNRESET), never a hang. A session
belongs to the process that connected it: after fork() the child's calls fail with
KvtierError(ECHILD) (connect() a new Client there) and the parent's session is untouched.
Views (Buffer.array(), Client.arena()) map the memory themselves and stay valid after free()
or close(), though no longer shared with kvtierd.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import functools
import os
import threading
import weakref
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import _lib
from . import abi as _abi

_LIB, LIBRARY_PATH = _lib.load()
"""The loaded libkvtier and the path it came from."""

_UINT_LIMITS = {
    ctypes.c_uint8: 0xFF,
    ctypes.c_uint16: 0xFFFF,
    ctypes.c_uint32: 0xFFFFFFFF,
    ctypes.c_uint64: 0xFFFFFFFFFFFFFFFF,
}

CHANGE_DTYPE = np.dtype([("slot", "<u4"), ("pos", "<i4")])
"""NumPy dtype of struct kvt_slot_change (RetierResult.changes)."""

DTYPES: dict[str, int] = {
    "f16": _abi.DTYPE_F16,
    "float16": _abi.DTYPE_F16,
    "half": _abi.DTYPE_F16,
    "bf16": _abi.DTYPE_BF16,
    "bfloat16": _abi.DTYPE_BF16,
    "f32": _abi.DTYPE_F32,
    "float32": _abi.DTYPE_F32,
    "float": _abi.DTYPE_F32,
}
"""Names accepted for kvt_seq_params.dtype (numpy and torch dtypes of those names work too)."""

POLICIES: dict[str, int] = {
    "tiered": _abi.POLICY_TIERED,
    "h2o": _abi.POLICY_H2O,
    "streaming": _abi.POLICY_STREAMING,
    "full": _abi.POLICY_FULL,
}
"""Names accepted for kvt_seq_params.policy."""

SCORE_MODES: dict[str, int] = {"sum": _abi.SCORE_SUM, "mean": _abi.SCORE_MEAN}
TOPK_MODES: dict[str, int] = {"exact": _abi.TOPK_EXACT, "estimate": _abi.TOPK_ESTIMATE,
                              "fast": _abi.TOPK_FAST, "probe": _abi.TOPK_PROBE}
"""Sequence.topk()'s mode names -> enum kvt_topk_mode."""
"""Names accepted for kvt_seq_params.score_mode."""

PARAM_FIELDS: tuple[str, ...] = tuple(name for name, _ in _abi.SeqParams._fields_)
"""Keyword names open_sequence() takes: the fields of struct kvt_seq_params."""

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mremap.restype = c_void_p
_LIBC.mremap.argtypes = [c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
_LIBC.munmap.restype = ctypes.c_int
_LIBC.munmap.argtypes = [c_void_p, ctypes.c_size_t]
_MREMAP_MAYMOVE = 1
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Mapping:
    """This process's own mapping of the pages of a shared mapping at @addr (mremap() with
    old_size 0), so that views outlive libkvtier's munmap() at kvt_buf_free() or
    kvt_disconnect(); unmapped when the last view (and its owner) lets go."""

    def __init__(self, addr: int, size: int, call: str, keep: Any) -> None:
        base = addr & ~(_PAGE - 1)
        self._len = (addr + size - base + _PAGE - 1) & ~(_PAGE - 1)
        p = _LIBC.mremap(base, 0, self._len, _MREMAP_MAYMOVE)
        if p is None or p == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise KvtierError(err, call, f"cannot map the memory for a view: {os.strerror(err)}")
        self._base = p
        self._keep = keep  # without close() or free(), a view keeps its buffer and client
        self.mem = (ctypes.c_uint8 * size).from_address(p + (addr - base))
        self.mem.owner = self  # a live view keeps this mapping

    def __del__(self, _munmap: Any = _LIBC.munmap) -> None:
        _munmap(self._base, self._len)  # bound early: module globals may be gone at exit


_FORKS = [0]
"""Bumped in every child process (os.register_at_fork): a Client whose count differs was
connected by an ancestor."""
os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))

_FORK_MSG = ("this Client was connected before fork(): a child process cannot use its "
             "parent's session (close() it and connect() a new Client)")


def _locked(fn: Any) -> Any:
    """Run @fn under its client's lock: a Client is shared by threads one call at a time. In a
    child of the connecting process, KvtierError(ECHILD) instead (the lock may be held by a
    thread that exists only in the parent)."""
    @functools.wraps(fn)
    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        client = getattr(self, "_client", self)
        if client._forks != _FORKS[0]:
            raise KvtierError(_errno.ECHILD, fn.__name__, _FORK_MSG)
        with client._lock:
            return fn(self, *a, **kw)
    return wrapper


KEY_DTYPE = np.dtype([("lo", "<u8"), ("hi", "<u8")])
"""NumPy dtype of struct kvt_block_key: arrays of it are what block_keys() returns and what
lookup() and publish() take, passed to libkvtier without a copy."""


def strerror(err: int) -> str:
    """kvtier's message for an errno (either sign), kvtier meanings first (kvt_strerror)."""
    return _LIB.kvt_strerror(-abs(int(err))).decode(errors="replace")


def abi_version() -> tuple[int, int]:
    """(major, minor) of the ABI the loaded libkvtier speaks."""
    v = _LIB.kvt_abi_version()
    return v >> 16, v & 0xFFFF


class KvtierError(OSError):
    """A failed kvtier call: ``errno`` (positive), ``strerror`` (kvt_strerror), ``call`` (the
    libkvtier function) and ``daemon_message`` (kvtierd's own explanation, or a hint; may be
    empty)."""

    def __init__(self, err: int, call: str, daemon_message: str = "") -> None:
        code = abs(int(err))
        super().__init__(code, strerror(code))
        self.call: str = call
        self.daemon_message: str = daemon_message

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno, str(self.errno))
        s = f"{self.call}: {self.strerror} ({name})"
        return f"{s}: {self.daemon_message}" if self.daemon_message else s


def _last_error() -> str:
    return _LIB.kvt_last_error().decode(errors="replace")


def _check(r: int, call: str, message: str = "") -> int:
    if r < 0:
        raise KvtierError(r, call, message)
    return r


def _check_op(r: int, call: str) -> int:
    """As _check() for a blocking op: the message is kvtierd's reason (kvt_last_error())."""
    if r < 0:
        raise KvtierError(r, call, _last_error())
    return r


def _uint(name: str, v: Any, ctype: Any = ctypes.c_uint32) -> int:
    """@v as an unsigned integer of @ctype, refused (EINVAL) where ctypes would truncate."""
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise KvtierError(_errno.EINVAL, name, f"{name}={v!r} is not an integer") from None
    if iv != v and not isinstance(v, (int, np.integer)):
        raise KvtierError(_errno.EINVAL, name, f"{name}={v!r} is not an integer")
    if not 0 <= iv <= _UINT_LIMITS[ctype]:
        raise KvtierError(
            _errno.EINVAL, name, f"{name}={iv} is outside 0..{_UINT_LIMITS[ctype]}"
        )
    return iv


def _u32_array(name: str, values: Any) -> np.ndarray:
    """@values as a contiguous uint32 array, refusing negatives and values past 2**32 - 1."""
    a = np.asarray(values)
    if a.dtype != np.uint32:
        if a.size and (a.dtype.kind not in "iu" or a.min() < 0 or a.max() > 0xFFFFFFFF):
            raise KvtierError(
                _errno.EINVAL, name, f"{name} must be integers in 0..2**32-1"
            )
        a = a.astype(np.uint32)
    return np.ascontiguousarray(a.reshape(-1))


def _host_bytes(data: Any) -> tuple[int, int, Any]:
    """(address, length, object to keep alive) of a contiguous host copy of @data: a NumPy
    array, a CPU torch tensor, bytes or anything with the buffer protocol; zero-copy when it
    already is contiguous."""
    if hasattr(data, "data_ptr") and hasattr(data, "element_size"):  # torch.Tensor
        if data.device.type != "cpu":
            raise KvtierError(
                _errno.EINVAL, "rows", f"tensor on {data.device}: pass a CPU tensor"
            )
        t = data if data.is_contiguous() else data.contiguous()
        return t.data_ptr(), t.numel() * t.element_size(), t
    a = data if isinstance(data, np.ndarray) else np.frombuffer(memoryview(data), np.uint8)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.ctypes.data, a.nbytes, a


def _dtype_code(v: Any) -> int:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    name = str(v).rsplit(".", 1)[-1].lower()  # "torch.float16", np.dtype('float16'), "f16"
    if isinstance(v, type) and issubclass(v, np.generic):
        name = np.dtype(v).name
    if name not in DTYPES:
        raise KvtierError(
            _errno.EINVAL, "dtype", f"unknown dtype {v!r}; one of {', '.join(DTYPES)}"
        )
    return DTYPES[name]


def _named(field: str, table: dict[str, int], v: Any) -> int:
    if isinstance(v, str):
        if v.lower() not in table:
            raise KvtierError(
                _errno.EINVAL, field, f"unknown {field} {v!r}; one of {', '.join(table)}"
            )
        return table[v.lower()]
    return int(v)


def make_params(**params: Any) -> _abi.SeqParams:
    """A struct kvt_seq_params from keyword fields (every field not given is zero, ``size``
    defaults to the struct's size). Names: PARAM_FIELDS; ``dtype``, ``policy`` and
    ``score_mode`` also by name (DTYPES, POLICIES, SCORE_MODES); ``t0_buf_id`` and
    ``stage_buf_id`` also as a Buffer; ``t2_flags`` also as "key_channel". Raises TypeError
    for an unknown name, KvtierError(EINVAL) for a value the field cannot hold."""
    p = _abi.SeqParams()
    p.size = ctypes.sizeof(p)
    types = dict(_abi.SeqParams._fields_)
    for name, v in params.items():
        if name not in types:
            raise TypeError(
                f"open_sequence() got an unknown parameter {name!r}; "
                f"struct kvt_seq_params has {', '.join(PARAM_FIELDS)}"
            )
        if name == "dtype":
            v = _dtype_code(v)
        elif name == "policy":
            v = _named("policy", POLICIES, v)
        elif name == "score_mode":
            v = _named("score_mode", SCORE_MODES, v)
        elif name == "t2_flags" and v == "key_channel":
            v = _abi.T2_F_KEY_CHANNEL
        elif name in ("t0_buf_id", "stage_buf_id") and isinstance(v, Buffer):
            v = v.id
        elif name == "protect_prompt":
            v = int(bool(v)) if isinstance(v, bool) else v
        t = types[name]
        if t is ctypes.c_float:
            setattr(p, name, float(v))
        elif name == "reserved":
            vals = list(v)
            if len(vals) != 2:
                raise KvtierError(_errno.EINVAL, name, "reserved holds 2 integers")
            for i, x in enumerate(vals):
                p.reserved[i] = _uint(name, x, ctypes.c_uint64)
        else:
            setattr(p, name, _uint(name, v, t))
    return p


def make_ns_params(name: str, layers: int, kv_heads: int, head_dim: int, dtype: Any,
                   block_tokens: int = 0) -> _abi.NsParams:
    """A struct kvt_ns_params: @name is the model's identity (printable ASCII, 1..63 bytes),
    the geometry and @dtype those of the sequences that will share rows through it,
    @block_tokens tokens per block (0: the default, 16). KvtierError(EINVAL) for a value the
    struct cannot hold or kvtierd would refuse by name."""
    if not isinstance(name, str):
        raise KvtierError(_errno.EINVAL, "kvt_ns_params", f"name={name!r} is not a str")
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        raw = b"\x80"
    if not raw or len(raw) >= _abi.NS_NAME_LEN or not all(0x20 <= c < 0x7F for c in raw):
        raise KvtierError(
            _errno.EINVAL, "kvt_ns_params",
            f"namespace name {name!r}: printable ASCII of 1..{_abi.NS_NAME_LEN - 1} bytes "
            "(a model's identity, e.g. its name and a digest)")
    np_ = _abi.NsParams()
    np_.size = ctypes.sizeof(np_)
    np_.layers = _uint("layers", layers, ctypes.c_uint16)
    np_.kv_heads = _uint("kv_heads", kv_heads, ctypes.c_uint16)
    np_.head_dim = _uint("head_dim", head_dim, ctypes.c_uint16)
    np_.dtype = _uint("dtype", _dtype_code(dtype), ctypes.c_uint8)
    np_.block_tokens = _uint("block_tokens", block_tokens)
    np_.name = raw
    return np_


def _keys(name: str, keys: Any) -> np.ndarray:
    """@keys as a contiguous KEY_DTYPE array: one of KEY_DTYPE, uint64 pairs (n, 2), or bytes
    of n * 16 (struct kvt_block_key, little-endian)."""
    if isinstance(keys, (np.ndarray, np.void)) and keys.dtype == KEY_DTYPE:  # array, one key
        return np.ascontiguousarray(np.asarray(keys, KEY_DTYPE).reshape(-1))
    if isinstance(keys, (bytes, bytearray, memoryview)):
        if len(keys) % 16:
            raise KvtierError(_errno.EINVAL, name,
                              f"{len(keys)} bytes of keys: not a multiple of 16")
        return np.frombuffer(bytes(keys), KEY_DTYPE)
    a = np.asarray(keys)
    if a.dtype.kind in "iu" and a.ndim == 2 and a.shape[1] == 2 and (a.size == 0 or
                                                                      a.min() >= 0):
        out = np.empty(a.shape[0], KEY_DTYPE)
        out["lo"], out["hi"] = a[:, 0], a[:, 1]
        return out
    raise KvtierError(_errno.EINVAL, name,
                      "keys must be an array of kvtier.KEY_DTYPE (block_keys()'s result), "
                      "(n, 2) unsigned pairs (lo, hi) or n * 16 bytes")


def _tokens(tokens: Any) -> np.ndarray:
    """Token ids as a contiguous uint32 vector; a (1, n) batch of one row is accepted."""
    if hasattr(tokens, "detach"):  # torch.Tensor
        tokens = tokens.detach().cpu().numpy()
    a = np.asarray(tokens)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise KvtierError(_errno.EINVAL, "kvt_block_keys",
                          f"tokens of shape {a.shape}: one sequence's ids, (n,) or (1, n)")
    return _u32_array("tokens", a)


def block_keys(ns: Any, tokens: Any, parent: Any = None) -> np.ndarray:
    """The keys of the full blocks of @tokens (token ids) in namespace @ns (a Namespace or a
    make_ns_params() struct), computed by libkvtier (kvt_block_keys: key i = XXH3-128 of key
    i - 1 and block i's tokens, chained from the namespace's identity, so a key names its
    whole prefix). @parent: the key of the block before @tokens[0] (None: they start the
    sequence). Pure computation, no daemon. A KEY_DTYPE array of len(tokens) // block_tokens."""
    np_ = ns.params if isinstance(ns, Namespace) else ns
    if not isinstance(np_, _abi.NsParams):
        raise KvtierError(_errno.EINVAL, "kvt_block_keys",
                          "ns must be a Namespace or a make_ns_params() struct")
    if not _lib.has(_LIB, "kvt_block_keys"):
        raise KvtierError(_errno.EOPNOTSUPP, "kvt_block_keys",
                          f"{LIBRARY_PATH} predates prefix blocks (ABI 1.2)")
    tok = _tokens(tokens)
    bt = np_.block_tokens or _abi.BLOCK_TOKENS_DEFAULT
    out = np.empty(max(tok.size // bt, 1), KEY_DTYPE)
    par = None
    if parent is not None:
        if isinstance(parent, tuple) and len(parent) == 2:  # (lo, hi)
            parent = [parent]
        par = _keys("parent", parent)
        if par.size != 1:
            raise KvtierError(_errno.EINVAL, "kvt_block_keys", "parent is one key")
    r = _LIB.kvt_block_keys(byref(np_), par.ctypes.data if par is not None else None,
                            tok.ctypes.data, tok.size, out.ctypes.data, tok.size // bt)
    _check(r, "kvt_block_keys", _last_error())
    return out[:r]


class PublishResult(NamedTuple):
    """What a PUBLISH did: the leading blocks the namespace now holds for the sequence, and
    how many of them this call added (the others it found already published)."""

    held: int
    new: int


class AppendResult(NamedTuple):
    """What an APPEND did: the sequence's token count after it, and the first new position."""

    n_tokens: int
    first: int


class FetchResult(NamedTuple):
    """What a FETCH staged: rows per (layer, K|V), and their positions in staging-row order."""

    rows: int
    positions: np.ndarray


@dataclass
class RetierResult:
    """A parsed RETIER answer (struct kvt_retier_result and what follows it).

    ``changes`` is a NumPy structured array of CHANGE_DTYPE (fields ``slot``, ``pos``; pos -1
    means the slot is now free), demotions first; ``free_slots`` the T0 slots the next tokens
    go into; ``tier_count`` tokens in T0..T3 (T3: evicted)."""

    n_changes: int
    n_free: int
    evicted_ratio: float
    n_tokens: int
    tier_count: tuple[int, int, int, int]
    changes: np.ndarray
    free_slots: np.ndarray
    nbytes: int


@dataclass
class SeqStat:
    """struct kvt_seq_stat: a sequence's tokens per tier and its byte counters."""

    seq: int
    n_tokens: int
    tier_count: tuple[int, int, int, int]
    pool_bytes: int
    bytes_in: int
    bytes_out: int
    score_total: float


@dataclass
class TopkResult:
    """A TOPK answer: per kv head h, ``counts[h]`` valid entries of ``positions[h]`` and
    ``scores[h]`` (arrays of shape (kv_heads, stride)), in descending score."""

    stride: int
    counts: np.ndarray
    positions: np.ndarray
    scores: np.ndarray

    def head(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        """The valid (positions, scores) of kv head @h."""
        n = int(self.counts[h])
        return self.positions[h, :n], self.scores[h, :n]


class Buffer:
    """A host-backend device buffer shared with kvtierd (a sealed memfd), usable as a T0 or
    staging region. ``array()`` and ``torch()`` are zero-copy views of it, through a mapping of
    their own: they stay valid after ``free()`` or the client's ``close()`` (the memory is then
    no longer shared with kvtierd) and are unmapped with the last of them."""

    def __init__(self, client: Client, handle: int) -> None:
        self._client = client
        self._h: int | None = handle
        self.id: int = _LIB.kvt_buf_id(handle)
        """The buffer id that names it in SQEs and sequence parameters."""
        self.size: int = _LIB.kvt_buf_size(handle)
        """Bytes."""
        self.address: int = _LIB.kvt_buf_ptr(handle) or 0
        """Its address in this process (the device pointer of a CUDA buffer)."""
        self.cuda: bool = False
        """True for device memory (Client.alloc_cuda_buffer(), Client.register_cuda())."""
        self.device: int | None = None
        """The CUDA device ordinal of a buffer from Client.alloc_cuda_buffer()."""
        self._mem: Any = None

    @property
    def offset(self) -> int:
        """Where a CUDA buffer starts in the allocation the daemon maps (kvt_buf_offset); 0
        for host buffers and buffers at an allocation's start."""
        h = self._live()
        if not _lib.has(_LIB, "kvt_buf_offset"):
            return 0
        return _LIB.kvt_buf_offset(h)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The buffer as bytes of device memory (CUDA Array Interface v3), for
        torch.as_tensor(buf, device="cuda"), CuPy or Numba; host buffers have none."""
        self._live()
        if not self.cuda:
            raise AttributeError("a host buffer has no __cuda_array_interface__: use array()")
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.address, False),
                "version": 3, "strides": None}

    def _live(self) -> int:
        if self._h is None or self._client._h is None:
            raise KvtierError(_errno.EBADF, "kvt_buf_ptr", f"buffer {self.id} was freed")
        return self._h

    def array(self, dtype: Any = np.uint8, shape: Any = None, offset: int = 0) -> np.ndarray:
        """A zero-copy, writable NumPy view of the buffer from byte @offset: all of what is
        left as @dtype, or @shape of it."""
        with self._client._lock:
            self._live()
            if self.cuda:
                raise KvtierError(_errno.EINVAL, "array", "a CUDA buffer has no host view")
            if self._mem is None:
                self._mem = _Mapping(self.address, self.size, "array", self).mem
        dt = np.dtype(dtype)
        count = -1 if shape is None else int(np.prod(shape))
        a = np.frombuffer(self._mem, dtype=dt, count=count, offset=offset)
        return a if shape is None else a.reshape(shape)

    def torch(self, dtype: Any = None, shape: Any = None, offset: int = 0) -> Any:
        """A zero-copy torch tensor over the buffer (needs torch; a CUDA tensor for device
        memory): uint8 bytes from @offset, reinterpreted as @dtype (e.g. torch.bfloat16) and
        reshaped to @shape when given."""
        import torch  # optional dependency: the extras "torch"

        if self.cuda:
            dev = "cuda" if self.device is None else f"cuda:{self.device}"
            t = torch.as_tensor(self, device=dev)[offset:]
        else:
            t = torch.from_numpy(self.array(np.uint8, offset=offset))
        if dtype is not None:
            esz = torch.empty((), dtype=dtype).element_size()
            t = t[: t.numel() // esz * esz].view(dtype)
        if shape is not None:
            t = t[: int(np.prod(shape))].view(*shape) if len(shape) else t
        return t

    @_locked
    def free(self) -> None:
        """Unregister and unmap. KvtierError(EBUSY) while an open sequence uses it (nothing
        changes then); after any other outcome the buffer is gone."""
        if self._h is None or self._client._h is None:
            self._h = None
            return
        r = _LIB.kvt_buf_free(self._client._h, self._h)
        if r == -_errno.EBUSY:
            raise KvtierError(r, "kvt_buf_free", _last_error())
        self._h = None
        self._mem = None
        self._client._bufs.discard(self)
        _check(r, "kvt_buf_free", _last_error())

    def __repr__(self) -> str:
        state = "" if self._h is not None else ", freed"
        return f"<kvtier.Buffer id={self.id} size={self.size}{state}>"


class Namespace:
    """A namespace of prefix blocks joined by a Client (Client.ns_open()): sequences opened
    in it may PUBLISH their first blocks and start from blocks a LOOKUP pinned. A context
    manager: leaving it closes the session's handle (its pins go; the blocks stay cached)."""

    def __init__(self, client: Client, ns_id: int, params: _abi.NsParams) -> None:
        self._client = client
        self.id: int | None = ns_id
        """The namespace's id in this session (None once closed)."""
        self.params: _abi.NsParams = params
        """The struct kvt_ns_params it was opened with."""
        self.name: str = params.name.decode()
        self.block_tokens: int = params.block_tokens or _abi.BLOCK_TOKENS_DEFAULT
        """Tokens per block in effect."""

    def _ids(self, call: str) -> tuple[int, int]:
        if self.id is None:
            raise KvtierError(_errno.ENOENT, call, "the namespace was closed")
        return self._client._live(call), self.id

    def block_keys(self, tokens: Any, parent: Any = None) -> np.ndarray:
        """The keys of @tokens' full blocks in this namespace (module-level block_keys())."""
        return block_keys(self, tokens, parent)

    @_locked
    def lookup(self, keys: Any, pin: bool = True) -> int:
        """LOOKUP: how many leading blocks of @keys (one prefix, in order) the namespace holds.
        With @pin (LOOKUP_F_PIN) they stay pinned, replacing earlier pins, until the next
        pinning lookup or close(), for open_sequence(ns=self, prefix_blocks=...). No keys:
        0 without asking kvtierd."""
        c, ns = self._ids("kvt_lookup")
        k = _keys("kvt_lookup", keys)
        if k.size == 0:
            return 0
        return _check_op(_LIB.kvt_lookup(c, ns, k.ctypes.data, _uint("nkeys", k.size),
                                         _abi.LOOKUP_F_PIN if pin else 0), "kvt_lookup")

    @_locked
    def close(self) -> None:
        """NS_CLOSE; a no-op when already closed or when the client is."""
        if self.id is None:
            return
        ns, self.id = self.id, None
        if self._client._h is not None:
            _check_op(_LIB.kvt_ns_close(self._client._h, ns), "kvt_ns_close")

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<kvtier.Namespace id={self.id} name={self.name!r} "
                f"block_tokens={self.block_tokens}>")


class Sequence:
    """An open sequence of a Client (one per generated stream). Geometry attributes mirror the
    parameters it was opened with; ``params`` holds them all. A context manager: leaving it
    closes the sequence."""

    def __init__(self, client: Client, seq_id: int, params: _abi.SeqParams) -> None:
        self._client = client
        self.id: int | None = seq_id
        """The sequence id (None once closed)."""
        self.params: _abi.SeqParams = params
        """The struct kvt_seq_params it was opened with."""
        self.layers: int = params.layers
        self.kv_heads: int = params.kv_heads
        self.head_dim: int = params.head_dim
        self.q_heads: int = params.q_heads or params.kv_heads
        self.dtype: int = params.dtype
        self.token_bytes: int = (
            params.layers * 2 * params.kv_heads * params.head_dim
            * (4 if params.dtype == _abi.DTYPE_F32 else 2)
        )
        """Bytes of one token's rows: layers * 2 * kv_heads * head_dim * dtype size."""
        self.ns: Namespace | None = None
        """The namespace it may PUBLISH to (open_sequence(ns=...)), or None."""
        self.prefix_tokens: int = 0
        """Positions it started with, shared from its namespace's blocks."""
        self._retier_buf: Any = None

    def _ids(self, call: str) -> tuple[int, int]:
        if self.id is None:
            raise KvtierError(_errno.ENOENT, call, "the sequence was closed")
        return self._client._live(call), self.id

    @_locked
    def append(self, rows: Any, ntok: int | None = None) -> AppendResult:
        """APPEND tokens whose rows (layout [token][layer][K,V][head][dim] of the dtype) are in
        @rows: a NumPy array, CPU torch tensor or bytes-like. @ntok defaults to the rows'
        length over token_bytes."""
        c, s = self._ids("kvt_append")
        ptr, nbytes, keep = _host_bytes(rows)
        if ntok is None:
            if nbytes == 0 or nbytes % self.token_bytes:
                raise KvtierError(
                    _errno.EINVAL, "kvt_append",
                    f"rows are {nbytes} bytes, not a positive multiple of the "
                    f"{self.token_bytes} bytes of one token",
                )
            ntok = nbytes // self.token_bytes
        first = c_uint64()
        r = _LIB.kvt_append(c, s, ptr, nbytes, _uint("ntok", ntok), byref(first))
        del keep
        _check_op(r, "kvt_append")
        return AppendResult(r, first.value)

    @_locked
    def append_t0(self, slots: Any) -> AppendResult:
        """APPEND tokens whose rows the client already wrote into these T0 slots (in order)."""
        c, s = self._ids("kvt_append_t0")
        a = _u32_array("slots", slots)
        r = _check_op(_LIB.kvt_append_t0(c, s, a.ctypes.data, _uint("len(slots)", a.size)),
                      "kvt_append_t0")
        return AppendResult(r, r - a.size)

    @_locked
    def score_add(self, first: int, values: Any) -> None:
        """score[first + i] += values[i] (cumulative attention; finite, >= 0)."""
        c, s = self._ids("kvt_score_add")
        v = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        _check_op(
            _LIB.kvt_score_add(c, s, _uint("first", first, ctypes.c_uint64), v.ctypes.data,
                               _uint("len(values)", v.size)),
            "kvt_score_add",
        )

    @_locked
    def retier(self, out_len: int | None = None) -> RetierResult:
        """RETIER (docs/tiering.md). @out_len bounds the answer (default KVT_RETIER_OUT_SIZE,
        72 + 16 * t0_slots, always enough); KvtierError(ENOSPC) when it is too small, nothing
        changed then."""
        c, s = self._ids("kvt_retier")
        n = _abi.retier_out_size(self.params.t0_slots) if out_len is None else \
            _uint("out_len", out_len, c_uint64)
        n = min(n, self._client._arena_size)  # libkvtier asks for no more than the arena
        buf = self._retier_buf
        if buf is None or len(buf) < n:
            buf = self._retier_buf = np.empty(max(n, 72), dtype=np.uint8)
        r = _check_op(_LIB.kvt_retier(c, s, buf.ctypes.data, n), "kvt_retier")
        head = _abi.RetierResultC.from_buffer_copy(buf[:72].tobytes())
        off = max(head.size, 72)
        changes = np.frombuffer(buf, CHANGE_DTYPE, head.n_changes, off).copy()
        off += 8 * head.n_changes
        free = np.frombuffer(buf, np.uint32, head.n_free, off).copy()
        return RetierResult(
            head.n_changes, head.n_free, head.evicted_ratio, head.n_tokens,
            tuple(head.tier_count), changes, free, r,
        )

    @_locked
    def fetch(
        self,
        flags: int = 0,
        *,
        positions: Any = None,
        layer0: int = 0,
        nlayers: int | None = None,
        stage_row: int = 0,
        capacity: int | None = None,
    ) -> FetchResult:
        """FETCH rows of layers [@layer0, @layer0 + @nlayers) (default: all from @layer0) into
        the staging region from row @stage_row. Either @flags FETCH_F_T1 and/or FETCH_F_T2
        (every position of those tiers, ascending; room for @capacity positions, default the
        staging rows left), or @positions (a list, staged in that order)."""
        c, s = self._ids("kvt_fetch")
        if nlayers is None:
            nlayers = max(self.layers - int(layer0), 0)
        if positions is not None:
            pos = _u32_array("positions", positions)
            flags |= _abi.FETCH_F_LIST
            count = pos.size
        else:
            if capacity is None:
                capacity = max(self.params.stage_slots - int(stage_row), 0)
            count = _uint("capacity", capacity)
            pos = np.zeros(max(count, 1), dtype=np.uint32)
        r = _LIB.kvt_fetch(c, s, _uint("flags", flags), _uint("layer0", layer0),
                           _uint("nlayers", nlayers), _uint("stage_row", stage_row),
                           pos.ctypes.data, count)
        _check_op(r, "kvt_fetch")
        return FetchResult(r, pos[:r].copy() if positions is None else pos)

    @_locked
    def fetch_rows(self, positions: Any, rows: Any, *, layer0: int = 0,
                   nlayers: int | None = None, buf: Buffer | None = None) -> int:
        """FETCH @positions, position i to staging row @rows[i], of layers [@layer0, @layer0 +
        @nlayers) (default: all from @layer0), into @buf (default: the staging region) laid
        out as the staging region: a paged cache's blocks, one call per layer where each
        layer is a registration of its own (ABI 1.6, kvt_fetch_rows). Returns the positions
        staged."""
        c, s = self._ids("kvt_fetch_rows")
        if not _lib.has(_LIB, "kvt_fetch_rows"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_fetch_rows",
                              "this libkvtier predates FETCH to listed rows (ABI 1.6)")
        pos = _u32_array("positions", positions)
        dst = _u32_array("rows", rows)
        if pos.size != dst.size:
            raise KvtierError(_errno.EINVAL, "kvt_fetch_rows",
                              f"{pos.size} positions but {dst.size} rows: give one row each")
        if nlayers is None:
            nlayers = max(self.layers - int(layer0), 0)
        h = buf._live() if buf is not None else None
        r = _LIB.kvt_fetch_rows(c, s, _uint("layer0", layer0), _uint("nlayers", nlayers), h,
                                pos.ctypes.data, dst.ctypes.data, pos.size)
        _check_op(r, "kvt_fetch_rows")
        return r

    @_locked
    def topk(self, layer: int, k: int, query: Any, flags: int = 0, probe: int = 0, *,
             mode: int | str | None = None) -> TopkResult:
        """TOPK: the @k positions per kv head (per query head with TOPK_F_UNION) most likely
        to matter to @query (q_heads * head_dim floats, post-RoPE) at @layer, as one
        struct kvt_topk_req (ABI 1.5). Needs a sequence opened with ret_update > 0.
        @mode: "exact" (the default: the exact top-k), "estimate" (ParisKV's estimates),
        "fast" (the exact top-k of the keys a 2-bit sketch ranks best) or "probe" (only the
        groups of consecutive positions whose means best match the query, until they hold
        @probe live keys: sublinear, its recall depends on the keys that matter coming in
        runs), or a TOPK_* mode number. @flags: TOPK_F_UNION, TOPK_F_FETCH; without @mode,
        TOPK_F_ESTIMATE or TOPK_F_FAST pick those modes and a @probe with TOPK_F_FAST mode
        "probe", as before ABI 1.5. What each mode scores: kvt_abi.h; its recall:
        docs/retrieval.md. KvtierError(ERANGE): k exceeds the retrieval zone, attend densely;
        EINVAL: a probe outside mode "probe", or none with it."""
        c, s = self._ids("kvt_topk")
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        k = _uint("k", k)
        probe = _uint("probe", probe)
        flags = _uint("flags", flags)
        _uint("len(query)", q.size)
        H = self.kv_heads
        stride = k * self.q_heads // H if flags & _abi.TOPK_F_UNION else k
        out = np.empty(_abi.topk_out_size(H, stride), dtype=np.uint8)
        if mode is None:
            if flags & _abi.TOPK_F_ESTIMATE and flags & _abi.TOPK_F_FAST:
                raise KvtierError(_errno.EINVAL, "kvt_topk", "TOPK_F_ESTIMATE and TOPK_F_FAST "
                                  "exclude each other: pick one, or pass mode=")
            if probe and not flags & _abi.TOPK_F_FAST:
                raise KvtierError(_errno.EINVAL, "kvt_topk", f"probe {probe} without "
                                  "TOPK_F_FAST (or pass mode='probe')")
            m = (_abi.TOPK_PROBE if probe else _abi.TOPK_FAST if flags & _abi.TOPK_F_FAST
                 else _abi.TOPK_ESTIMATE if flags & _abi.TOPK_F_ESTIMATE else _abi.TOPK_EXACT)
        elif isinstance(mode, str):
            if mode not in TOPK_MODES:
                raise ValueError(f"mode {mode!r}: one of {', '.join(TOPK_MODES)}")
            m = TOPK_MODES[mode]
        else:
            m = _uint("mode", mode)
        if mode is not None and flags & (_abi.TOPK_F_ESTIMATE | _abi.TOPK_F_FAST):
            raise KvtierError(_errno.EINVAL, "kvt_topk", "TOPK_F_ESTIMATE / TOPK_F_FAST with "
                              "mode=: the mode alone picks the scoring")
        req = _abi.TopkReq(size=ctypes.sizeof(_abi.TopkReq), mode=m,
                           flags=flags & ~(_abi.TOPK_F_ESTIMATE | _abi.TOPK_F_FAST),
                           layer=_uint("layer", layer), k=k, probe=probe,
                           query_len=_uint("query bytes", q.nbytes),
                           out_len=_uint("output bytes", out.nbytes))
        if not _lib.has(_LIB, "kvt_topk_run"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_topk_run",
                              f"{LIBRARY_PATH} predates struct kvt_topk_req (ABI 1.5)")
        r = _LIB.kvt_topk_run(c, s, ctypes.byref(req), q.ctypes.data, out.ctypes.data)
        stride = _check_op(r, "kvt_topk")
        counts = np.frombuffer(out, np.uint32, H, 0).copy()
        pos = np.frombuffer(out, np.uint32, H * stride, H * 4).reshape(H, stride).copy()
        sc = np.frombuffer(out, np.float32, H * stride, H * 4 + H * stride * 4)
        return TopkResult(stride, counts, pos, sc.reshape(H, stride).copy())

    @_locked
    def publish(self, keys: Any, n: int | None = None) -> PublishResult:
        """PUBLISH: offer the first @n (default: all) full blocks of this sequence, keyed by
        @keys (block_keys() of its tokens), to its namespace; rows already in the pool are
        referenced, not copied, and a block the namespace already holds replaces this
        sequence's own copy. It stops at a block with a position evicted or int8.
        KvtierError(EINVAL): no namespace, or keys past the sequence's tokens; ENOSPC: the
        prefix cache is full of blocks in use."""
        c, s = self._ids("kvt_publish")
        if not _lib.has(_LIB, "kvt_publish"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_publish",
                              f"{LIBRARY_PATH} predates prefix blocks (ABI 1.2)")
        k = _keys("kvt_publish", keys)
        if n is not None:
            k = k[: _uint("n", n)]
        new = c_uint32()
        r = _check_op(_LIB.kvt_publish(c, s, k.ctypes.data, _uint("nkeys", k.size),
                                       byref(new)), "kvt_publish")
        return PublishResult(r, new.value)

    @_locked
    def stat(self) -> SeqStat:
        """SEQ_STAT: tokens per tier, pool bytes, bytes in and out, the score total."""
        c, s = self._ids("kvt_seq_stat")
        st = _abi.SeqStatC()
        _check_op(_LIB.kvt_seq_stat(c, s, byref(st)), "kvt_seq_stat")
        return SeqStat(st.seq, st.n_tokens, tuple(st.tier_count), st.pool_bytes,
                       st.bytes_in, st.bytes_out, st.score_total)

    @_locked
    def close(self) -> None:
        """SEQ_CLOSE; a no-op when already closed or when the client is."""
        if self.id is None:
            return
        sid, self.id = self.id, None
        if self._client._h is not None:
            _check_op(_LIB.kvt_seq_close(self._client._h, sid), "kvt_seq_close")

    def __enter__(self) -> Sequence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<kvtier.Sequence id={self.id} layers={self.layers} kv_heads={self.kv_heads}"
                f" head_dim={self.head_dim}>")


class Driver:
    """libkvtier's tiering driver for one sequence (kvtier.h, "tiering driver"; see
    Client.open_driver()): per forward pass, step_begin() (RETIER and FETCH when due, T0 slots
    for the new tokens), view() (what attention reads), step_end() (the queued APPEND and
    SCORE_ADD). ``seq`` is the Sequence, for stat() and publish() after flush(); close()
    closes both. Arrays it returns view the driver's memory: valid until the next
    step_begin()."""

    def __init__(self, client: Client, handle: int, params: _abi.SeqParams,
                 ns: Namespace | None) -> None:
        self._client = client
        self._d: int | None = handle
        self.seq = Sequence(client, _LIB.kvt_driver_seq(handle), params)
        """The sequence (closed by the driver: do not close it yourself)."""
        self.seq.ns = ns
        self._slots = ctypes.POINTER(c_uint32)()
        self._pos = ctypes.POINTER(c_uint32)()
        self._loc = ctypes.POINTER(c_uint32)()

    def _live(self, call: str) -> int:
        self._client._live(call)
        if self._d is None:
            raise KvtierError(_errno.ENOENT, call, "the driver was closed")
        return self._d

    @_locked
    def step_begin(self, q: int) -> tuple[bool, np.ndarray]:
        """Start a pass of @q tokens: (whether the view was rebuilt, the @q T0 slots of the
        new tokens' rows, a copy as int64: what torch indexes with)."""
        d = self._live("kvt_driver_step_begin")
        r = _check_op(_LIB.kvt_driver_step_begin(d, _uint("q", q), byref(self._slots)),
                      "kvt_driver_step_begin")
        return r == 1, np.array(self._slots[:q], dtype=np.int64)

    @_locked
    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions, locations) of the view's entries: a location is a T0 slot, or
        t0_slots + a staging row."""
        d = self._live("kvt_driver_view")
        m = _LIB.kvt_driver_view(d, byref(self._pos), byref(self._loc))
        if not m:
            return np.empty(0, np.uint32), np.empty(0, np.uint32)
        return (np.ctypeslib.as_array(self._pos, shape=(m,)),
                np.ctypeslib.as_array(self._loc, shape=(m,)))

    @_locked
    def step_end(self, weights: np.ndarray | None) -> None:
        """End the pass: queue its APPEND and SCORE_ADD (@weights: float32, one per view
        entry; None: no SCORE_ADD)."""
        d = self._live("kvt_driver_step_end")
        if weights is None:
            _check_op(_LIB.kvt_driver_step_end(d, None, 0), "kvt_driver_step_end")
            return
        w = np.ascontiguousarray(weights, dtype=np.float32)
        _check_op(_LIB.kvt_driver_step_end(d, w.ctypes.data, w.size), "kvt_driver_step_end")

    @_locked
    def flush(self) -> None:
        """Submit what is queued and check every completion."""
        _check_op(_LIB.kvt_driver_flush(self._live("kvt_driver_flush")), "kvt_driver_flush")

    @_locked
    def stats(self) -> _abi.DriverStats:
        st = _abi.DriverStats(size=ctypes.sizeof(_abi.DriverStats))
        _check(_LIB.kvt_driver_stats(self._live("kvt_driver_stats"), byref(st)),
               "kvt_driver_stats")
        return st

    @_locked
    def close(self) -> None:
        """Submit what is queued, SEQ_CLOSE, free the driver. Idempotent; raises the
        driver's failure if it had one (everything is freed all the same)."""
        d, self._d = self._d, None
        if d is None:
            return
        self.seq.id = None  # the driver closes it
        _check_op(_LIB.kvt_driver_close(d), "kvt_driver_close")

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def t0_slots_for(**params: Any) -> int:
    """The T0 slots a sequence of these struct kvt_seq_params fields needs
    (kvt_driver_t0_slots()): the HBM budget at max_tokens, at least the protected set, plus
    delta, and at least prompt_len."""
    p = make_params(**params)
    return _check(_LIB.kvt_driver_t0_slots(byref(p)), "kvt_driver_t0_slots",
                  "delta and max_tokens >= 1, max_tokens <= 2^24, prompt_len <= max_tokens")


class Client:
    """A session with kvtierd (see connect()). A context manager: leaving it disconnects,
    which frees every sequence and buffer of the session."""

    def __init__(self, handle: int, socket: str | None) -> None:
        self._lock = threading.RLock()
        self._forks = _FORKS[0]
        self._h: int | None = handle
        self.socket: str | None = socket
        """The control socket given to connect() (None: $KVTIER_SOCKET or the default)."""
        self.session_id: int = _LIB.kvt_session_id(handle)
        """The session id, as kvtierctl shows it."""
        self._bufs: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._seqs: weakref.WeakSet[Sequence] = weakref.WeakSet()
        self._drivers: weakref.WeakSet[Driver] = weakref.WeakSet()
        self._nss: weakref.WeakSet[Namespace] = weakref.WeakSet()
        size = c_uint64()
        self._arena_addr: int = _LIB.kvt_arena(handle, byref(size)) or 0
        self._arena_size: int = size.value
        self._arena_mem: Any = None

    def _live(self, call: str) -> int:
        if self._h is None:
            raise KvtierError(_errno.ENOTCONN, call, "the client was closed")
        return self._h

    # ---- buffers ----

    @_locked
    def alloc_buffer(self, size: int) -> Buffer:
        """A host buffer of @size bytes shared with kvtierd (kvt_buf_alloc)."""
        h = c_void_p()
        r = _LIB.kvt_buf_alloc(self._live("kvt_buf_alloc"), _uint("size", size, c_uint64),
                               byref(h))
        _check(r, "kvt_buf_alloc", _last_error())
        b = Buffer(self, h.value)
        self._bufs.add(b)
        return b

    @_locked
    def register_cuda(self, dev_ptr: int, size: int) -> Buffer:
        """Share device memory (the start of a cudaMalloc() allocation) with kvtierd
        (kvt_buf_register_cuda); the memory stays the caller's."""
        h = c_void_p()
        r = _LIB.kvt_buf_register_cuda(self._live("kvt_buf_register_cuda"), dev_ptr,
                                       _uint("size", size, c_uint64), byref(h))
        _check(r, "kvt_buf_register_cuda", _last_error())
        b = Buffer(self, h.value)
        b.cuda = True
        self._bufs.add(b)
        return b

    @_locked
    def alloc_cuda_buffer(self, size: int, device: int = 0) -> Buffer:
        """A device buffer of @size bytes on CUDA device @device that libkvtier allocates and
        registers (kvt_buf_alloc_cuda); ``torch()`` and ``__cuda_array_interface__`` expose it,
        ``free()`` releases it."""
        c = self._live("kvt_buf_alloc_cuda")
        if not _lib.has(_LIB, "kvt_buf_alloc_cuda"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_buf_alloc_cuda",
                              f"{LIBRARY_PATH} predates kvt_buf_alloc_cuda()")
        h = c_void_p()
        r = _LIB.kvt_buf_alloc_cuda(c, int(device), _uint("size", size, c_uint64), byref(h))
        _check(r, "kvt_buf_alloc_cuda", _last_error())
        b = Buffer(self, h.value)
        b.cuda, b.device = True, int(device)
        self._bufs.add(b)
        return b

    @_locked
    def cuda_stream_wait(self, stream: Any = None) -> None:
        """Order a CUDA stream (a torch.cuda.Stream, a cudaStream_t as int, or None for the
        current context's default stream) after the copies of every op whose completion was
        reaped (kvt_cuda_stream_wait); no CPU wait, and nothing to do on the host backend."""
        c = self._live("kvt_cuda_stream_wait")
        if not _lib.has(_LIB, "kvt_cuda_stream_wait"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_cuda_stream_wait",
                              f"{LIBRARY_PATH} predates kvt_cuda_stream_wait()")
        handle = getattr(stream, "cuda_stream", stream)
        _check(_LIB.kvt_cuda_stream_wait(c, handle or None), "kvt_cuda_stream_wait",
               _last_error())

    @_locked
    def event_get_cuda(self, device: int = 0) -> int:
        """The session's interprocess cudaEvent_t on @device, as an integer handle
        (kvt_event_get_cuda); destroy it with cudaEventDestroy()."""
        ev = c_void_p()
        r = _LIB.kvt_event_get_cuda(self._live("kvt_event_get_cuda"), int(device), byref(ev))
        _check(r, "kvt_event_get_cuda", _last_error())
        return ev.value or 0

    # ---- sequences ----

    @_locked
    def ns_open(self, name: str, layers: int, kv_heads: int, head_dim: int, dtype: Any,
                block_tokens: int = _abi.BLOCK_TOKENS_DEFAULT) -> Namespace:
        """NS_OPEN: join (or create) the namespace of prefix blocks @name (the model's
        identity) with this geometry and dtype (see make_ns_params()). Blocks are shared only
        by clients that open the same name, geometry, dtype and block size, and by default
        run as the same uid."""
        c = self._live("kvt_ns_open")
        if not _lib.has(_LIB, "kvt_ns_open"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_ns_open",
                              f"{LIBRARY_PATH} predates prefix blocks (ABI 1.2)")
        np_ = make_ns_params(name, layers, kv_heads, head_dim, dtype, block_tokens)
        ns = c_uint32()
        _check_op(_LIB.kvt_ns_open(c, byref(np_), byref(ns)), "kvt_ns_open")
        n = Namespace(self, ns.value, np_)
        self._nss.add(n)
        return n

    @_locked
    def open_sequence(self, *, ns: Namespace | None = None, prefix_blocks: int = 0,
                      **params: Any) -> Sequence:
        """SEQ_OPEN with the fields of struct kvt_seq_params as keywords (see make_params();
        fields not given are zero, so give at least layers, kv_heads, head_dim and delta).
        @ns: a Namespace the sequence may publish to (same geometry and dtype); with
        @prefix_blocks > 0 it starts with that many blocks pinned by @ns's last pinning
        lookup(), prefix_blocks * block_tokens positions shared, not copied."""
        p = make_params(**params)
        sid = c_uint32()
        c = self._live("kvt_seq_open")
        nb = _uint("prefix_blocks", prefix_blocks)
        if ns is None and nb:
            raise KvtierError(_errno.EINVAL, "kvt_seq_open_prefix",
                              f"prefix_blocks={nb} needs the namespace they were looked up in "
                              "(ns=)")
        if ns is not None:
            if not isinstance(ns, Namespace) or ns._client is not self:
                raise KvtierError(_errno.EINVAL, "kvt_seq_open_prefix",
                                  "ns must be a Namespace this client opened")
            _, ns_id = ns._ids("kvt_seq_open_prefix")
            r = _LIB.kvt_seq_open_prefix(c, byref(p), ns_id, nb, byref(sid))
            _check_op(r, "kvt_seq_open_prefix")
            seq = Sequence(self, sid.value, p)
            seq.ns, seq.prefix_tokens = ns, nb * ns.block_tokens
            self._seqs.add(seq)
            return seq
        r = _LIB.kvt_seq_open(c, byref(p), byref(sid))
        if r == -_errno.EINVAL and not _last_error():  # a kvtierd that gives no reason
            raise KvtierError(
                r, "kvt_seq_open",
                "kvtierd refused the parameters: layers 1..256, kv_heads 1..64, head_dim "
                "1..256, delta >= 1, fractions in [0, 1] (tiered: their sum <= 1), reserved "
                "fields zero, a T0 region needs t0_slots >= sinks + window + delta; "
                "kvtierd's log names the field",
            )
        _check_op(r, "kvt_seq_open")
        seq = Sequence(self, sid.value, p)
        self._seqs.add(seq)
        return seq

    @_locked
    def open_driver(self, *, ns: Namespace | None = None, prefix_blocks: int = 0,
                    **params: Any) -> Driver:
        """Open a sequence (open_sequence()'s arguments; it needs a T0 and a staging region)
        with libkvtier's tiering driver running its decode-step loop (Driver)."""
        p = make_params(**params)
        c = self._live("kvt_driver_open")
        if not _lib.has(_LIB, "kvt_driver_open"):
            raise KvtierError(_errno.EOPNOTSUPP, "kvt_driver_open",
                              f"{LIBRARY_PATH} predates the tiering driver")
        o = _abi.DriverOpts(size=ctypes.sizeof(_abi.DriverOpts))
        if ns is not None:
            if not isinstance(ns, Namespace) or ns._client is not self:
                raise KvtierError(_errno.EINVAL, "kvt_driver_open",
                                  "ns must be a Namespace this client opened")
            _, o.ns = ns._ids("kvt_driver_open")
        o.prefix_blocks = _uint("prefix_blocks", prefix_blocks)
        h = c_void_p()
        _check_op(_LIB.kvt_driver_open(c, byref(p), byref(o), byref(h)), "kvt_driver_open")
        drv = Driver(self, h.value, p, ns)
        self._seqs.add(drv.seq)
        self._drivers.add(drv)
        return drv

    @_locked
    def nop(self) -> None:
        """A round trip with no work."""
        _check_op(_LIB.kvt_nop(self._live("kvt_nop")), "kvt_nop")

    # ---- asynchronous interface ----

    @_locked
    def arena(self) -> np.ndarray:
        """A zero-copy NumPy view of the arena, the payload space SQEs name by (arena_off,
        arena_len). The blocking calls use its start."""
        self._live("kvt_arena")
        if self._arena_mem is None:
            self._arena_mem = _Mapping(self._arena_addr, self._arena_size, "kvt_arena",
                                        self).mem
        return np.frombuffer(self._arena_mem, dtype=np.uint8)

    @_locked
    def get_sqe(self) -> _abi.Sqe | None:
        """The next free submission entry, zeroed and writable in place (fill it, then
        submit()), or None when the SQ is full or the CQ could not hold another completion."""
        p = _LIB.kvt_get_sqe(self._live("kvt_get_sqe"))
        return p.contents if p else None

    @_locked
    def submit(self) -> int:
        """Publish every SQE taken since the last submit; returns how many."""
        return _check(_LIB.kvt_submit(self._live("kvt_submit")), "kvt_submit")

    @_locked
    def wait_cqe(self) -> _abi.Cqe:
        """One completion, waiting for it. KvtierError(EAGAIN) when nothing is in flight,
        ECONNRESET when the daemon is gone."""
        cqe = _abi.Cqe()
        _check(_LIB.kvt_wait_cqe(self._live("kvt_wait_cqe"), byref(cqe)), "kvt_wait_cqe",
               _last_error())
        return cqe

    @_locked
    def peek_cqe(self) -> _abi.Cqe | None:
        """One completion if one is ready, else None."""
        cqe = _abi.Cqe()
        r = _LIB.kvt_peek_cqe(self._live("kvt_peek_cqe"), byref(cqe))
        if r == -_errno.EAGAIN:
            return None
        _check(r, "kvt_peek_cqe")
        return cqe

    @_locked
    def op_error(self, user_data: int) -> str | None:
        """Why kvtierd refused the op submitted with @user_data (its CQE's res < 0):
        "OPNAME: what was wrong". None when the session's most recent refusal is another op's
        (kvtierd keeps one reason a session: ask right after reaping) or kvtierd keeps none
        (older than ABI 1.1)."""
        c = self._live("kvt_op_error")
        if not _lib.has(_LIB, "kvt_op_error"):
            return None
        buf = ctypes.create_string_buffer(_abi.OP_ERR_MSG_LEN)
        r = _LIB.kvt_op_error(c, _uint("user_data", user_data, ctypes.c_uint64), buf,
                              len(buf))
        if r in (-_errno.ENOENT, -_errno.EOPNOTSUPP):
            return None
        _check(r, "kvt_op_error")
        return buf.value.decode(errors="replace")

    @property
    def inflight(self) -> int:
        """Operations submitted and not yet reaped."""
        if self._forks != _FORKS[0]:
            raise KvtierError(_errno.ECHILD, "inflight", _FORK_MSG)
        with self._lock:
            return _LIB.kvt_inflight(self._live("kvt_inflight"))

    # ---- lifetime ----

    def close(self) -> None:
        """End the session (kvt_disconnect): the daemon frees its sequences and buffers; views
        of its buffers and arena stay readable but are no longer shared. Idempotent. In a child
        of the connecting process it frees only the child's copy of the client."""
        if self._forks != _FORKS[0]:
            self._close()
            return
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._h is None:
            return
        for d in list(self._drivers):
            dh, d._d = d._d, None
            if dh is not None:
                d.seq.id = None
                _LIB.kvt_driver_close(dh)  # before the client goes: it submits on it
        h, self._h = self._h, None
        for s in list(self._seqs):
            s.id = None
        for n in list(self._nss):
            n.id = None
        for b in list(self._bufs):
            b._h = None
            b._mem = None
        self._arena_mem = None
        _LIB.kvt_disconnect(h)

    disconnect = close

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self.close()

    def __repr__(self) -> str:
        state = f"session={self.session_id}" if self._h is not None else "closed"
        return f"<kvtier.Client {state}>"


def connect(
    socket: str | os.PathLike[str] | None = None,
    *,
    sq_entries: int = 0,
    cq_entries: int = 0,
    spin_us: int = 0,
    arena_size: int = 0,
    name: str | None = None,
    abi_major: int = 0,
) -> Client:
    """Open a session with kvtierd (kvt_connect). @socket: the control socket; None means
    $KVTIER_SOCKET, else /run/kvtier/kvtierd.sock. The options are struct kvt_opts' (0: the
    daemon's default; @abi_major is only for testing mismatch handling)."""
    o = _abi.Opts()
    o.size = ctypes.sizeof(o)
    o.sq_entries = _uint("sq_entries", sq_entries)
    o.cq_entries = _uint("cq_entries", cq_entries)
    o.spin_us = _uint("spin_us", spin_us)
    o.arena_size = _uint("arena_size", arena_size, c_uint64)
    o.abi_major = _uint("abi_major", abi_major)
    name_b = name.encode() if name is not None else None
    o.name = name_b
    path = os.fsencode(socket) if socket is not None else None
    h = c_void_p()
    r = _LIB.kvt_connect(path, byref(o), byref(h))
    if r < 0:
        msg = _last_error()
        where = os.fsdecode(path) if path else os.environ.get("KVTIER_SOCKET") or \
            _abi.DEFAULT_SOCKET
        if not msg and r in (-_errno.ENOENT, -_errno.ECONNREFUSED):
            msg = (f"kvtierd is not running at {where}: start it (systemctl start kvtierd, "
                   f"or kvtierd --socket {where})")
        raise KvtierError(r, "kvt_connect", msg)
    return Client(h.value, os.fsdecode(path) if path else None)
