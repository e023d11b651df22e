# SPDX-License-Identifier: MIT
"""Finding and loading libkvtier, and the prototypes of every exported call.

Lookup order: $KVTIER_LIB (that file only), then a build tree ($KVT_BUILD_DIR, then build/ of
the checkout this package sits in), then the system's ``libkvtier.so.0``. The library's ABI
major must equal the one the struct mirrors in abi.py (generated from the headers) follow.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    c_char_p,
    c_int,
    c_int64,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any

from . import abi as _abi

SONAME = "libkvtier.so.0"


class LibraryError(ImportError):
    """libkvtier could not be found or loaded, or it speaks another ABI major."""


def _repo_root() -> Path | None:
    """The kvtier checkout this package lives in, if it is used from one."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "client" / "include" / "kvtier.h").is_file() and (
            parent / "proto" / "kvt_abi.h"
        ).is_file():
            return parent
    return None


def candidates() -> list[str]:
    """The paths tried, in order; the last entry is the bare soname (the system's search)."""
    env = os.environ.get("KVTIER_LIB")
    if env:
        return [env]
    out: list[str] = []
    build = os.environ.get("KVT_BUILD_DIR")
    if build:
        out.append(str(Path(build) / "client" / SONAME))
    root = _repo_root()
    if root is not None:
        out.append(str(root / "build" / "client" / SONAME))
    out.append(SONAME)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    """Argument and result types of every exported call (kvtier.h)."""
    P = c_void_p
    sigs: dict[str, tuple[object, list[object]]] = {
        "kvt_connect": (c_int, [c_char_p, POINTER(_abi.Opts), POINTER(P)]),
        "kvt_disconnect": (None, [P]),
        "kvt_last_error": (c_char_p, []),
        "kvt_abi_version": (c_uint32, []),
        "kvt_session_id": (c_uint32, [P]),
        "kvt_arena": (P, [P, POINTER(c_uint64)]),
        "kvt_buf_alloc": (c_int, [P, c_uint64, POINTER(P)]),
        "kvt_buf_free": (c_int, [P, P]),
        "kvt_buf_ptr": (P, [P]),
        "kvt_buf_register_cuda": (c_int, [P, P, c_uint64, POINTER(P)]),
        "kvt_event_get_cuda": (c_int, [P, c_int, POINTER(P)]),
        "kvt_buf_id": (c_uint32, [P]),
        "kvt_buf_size": (c_uint64, [P]),
        "kvt_get_sqe": (POINTER(_abi.Sqe), [P]),
        "kvt_submit": (c_int, [P]),
        "kvt_peek_cqe": (c_int, [P, POINTER(_abi.Cqe)]),
        "kvt_wait_cqe": (c_int, [P, POINTER(_abi.Cqe)]),
        "kvt_inflight": (c_uint, [P]),
        "kvt_nop": (c_int, [P]),
        "kvt_seq_open": (c_int, [P, POINTER(_abi.SeqParams), POINTER(c_uint32)]),
        "kvt_seq_close": (c_int, [P, c_uint32]),
        "kvt_append": (c_int64, [P, c_uint32, P, c_uint64, c_uint32, POINTER(c_uint64)]),
        "kvt_append_t0": (c_int64, [P, c_uint32, P, c_uint32]),
        "kvt_score_add": (c_int, [P, c_uint32, c_uint64, P, c_uint32]),
        "kvt_seq_stat": (c_int, [P, c_uint32, POINTER(_abi.SeqStatC)]),
        "kvt_retier": (c_int, [P, c_uint32, P, c_uint64]),
        "kvt_fetch": (c_int, [P, c_uint32, c_uint, c_uint32, c_uint32, c_uint32, P, c_uint32]),
        "kvt_topk": (c_int, [P, c_uint32, c_uint32, c_uint32, c_uint, P, c_uint32, P, c_uint64]),
        "kvt_strerror": (c_char_p, [c_int]),
    }
    # Added within ABI major 1: declared where the library has them (see has()).
    optional: dict[str, tuple[object, list[object]]] = {
        "kvt_buf_alloc_cuda": (c_int, [P, c_int, c_uint64, POINTER(P)]),
        "kvt_buf_offset": (c_uint64, [P]),
        "kvt_cuda_stream_wait": (c_int, [P, P]),
        "kvt_op_error": (c_int, [P, c_uint64, c_char_p, c_size_t]),
        "kvt_version": (c_char_p, []),
        # ABI 1.2: prefix blocks (keys as addresses of struct kvt_block_key arrays)
        "kvt_ns_open": (c_int, [P, POINTER(_abi.NsParams), POINTER(c_uint32)]),
        "kvt_ns_close": (c_int, [P, c_uint32]),
        "kvt_block_keys": (c_int, [POINTER(_abi.NsParams), P, P, c_size_t, P, c_size_t]),
        "kvt_lookup": (c_int, [P, c_uint32, P, c_uint32, c_uint]),
        "kvt_seq_open_prefix": (c_int, [P, POINTER(_abi.SeqParams), c_uint32, c_uint32,
                                        POINTER(c_uint32)]),
        "kvt_publish": (c_int, [P, c_uint32, P, c_uint32, POINTER(c_uint32)]),
        # the tiering driver (client-side, no new op)
        "kvt_driver_t0_slots": (c_int, [POINTER(_abi.SeqParams)]),
        "kvt_driver_open": (c_int, [P, POINTER(_abi.SeqParams), POINTER(_abi.DriverOpts),
                                    POINTER(P)]),
        "kvt_driver_step_begin": (c_int, [P, c_uint32, POINTER(POINTER(c_uint32))]),
        "kvt_driver_view": (c_uint32, [P, POINTER(POINTER(c_uint32)),
                                       POINTER(POINTER(c_uint32))]),
        "kvt_driver_step_end": (c_int, [P, P, c_uint32]),
        "kvt_driver_flush": (c_int, [P]),
        "kvt_driver_stats": (c_int, [P, POINTER(_abi.DriverStats)]),
        "kvt_driver_seq": (c_uint32, [P]),
        "kvt_driver_close": (c_int, [P]),
        # ABI 1.4: TOPK's probe
        "kvt_topk_probe": (c_int, [P, c_uint32, c_uint32, c_uint32, c_uint, c_uint32, P,
                                   c_uint32, P, c_uint64]),
        # ABI 1.6: FETCH to listed rows of any registered buffer
        "kvt_fetch_rows": (c_int, [P, c_uint32, c_uint32, c_uint32, P, P, P, c_uint32]),
        # ABI 1.5: struct kvt_topk_req
        "kvt_topk_run": (c_int, [P, c_uint32, POINTER(_abi.TopkReq), P, P]),
    }
    # The prep helpers, exported out of line (client/ffi.c, ABI 1.5): their prototypes come
    # from kvtier.h through the generated abi.py.
    for name, args in _abi.PREP_ARGTYPES.items():
        optional[name] = (None, args)
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    for name, (res, args) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args


def has(lib: ctypes.CDLL, name: str) -> bool:
    """Whether @lib exports @name (calls added after the first release of an ABI major)."""
    return getattr(lib, name, None) is not None


def check_abi(lib: ctypes.CDLL, path: str) -> None:
    """Raise LibraryError unless @lib speaks the ABI major the mirrors follow."""
    try:
        fn = lib.kvt_abi_version
    except AttributeError:
        raise LibraryError(
            f"{path} has no kvt_abi_version(): it predates this kvtier package; "
            "rebuild libkvtier from the same checkout, or set KVTIER_LIB to a matching one"
        ) from None
    fn.restype = c_uint32
    fn.argtypes = []
    v = fn()
    major, minor = v >> 16, v & 0xFFFF
    if major != _abi.ABI_MAJOR:
        raise LibraryError(
            f"ABI mismatch: {path} speaks kvtier ABI {major}.{minor}, this kvtier package "
            f"speaks ABI {_abi.ABI_MAJOR}.x; install the kvtier Python package that matches "
            "the installed libkvtier, or set KVTIER_LIB to a libkvtier of ABI "
            f"{_abi.ABI_MAJOR}"
        )


_LOADED: tuple[ctypes.CDLL, str] | None = None


def prep_function(name: str) -> Any:
    """libkvtier's exported copy of the kvtier.h prep helper @name, declared; LibraryError
    where the library predates them (ABI 1.5)."""
    lib, path = load()
    fn = getattr(lib, name, None)
    if fn is None:
        raise LibraryError(f"{path} does not export {name}(): it predates the exported prep "
                           "helpers (ABI 1.5); rebuild libkvtier from this checkout")
    return fn


def load() -> tuple[ctypes.CDLL, str]:
    """Load libkvtier once (see the module docstring); returns the library and the path
    used."""
    global _LOADED
    if _LOADED is None:
        _LOADED = _load()
    return _LOADED


def _load() -> tuple[ctypes.CDLL, str]:
    tried: list[str] = []
    for cand in candidates():
        bare = os.sep not in cand
        if not bare and not os.path.exists(cand):
            tried.append(f"{cand} (absent)")
            continue
        try:
            lib = ctypes.CDLL(cand, use_errno=False)
        except OSError as e:
            if bare or os.environ.get("KVTIER_LIB"):
                tried.append(f"{cand} ({e})")
                continue
            raise LibraryError(f"cannot load {cand}: {e}") from e
        check_abi(lib, cand)
        _declare(lib)
        return lib, cand
    raise LibraryError(
        "libkvtier not found; tried: " + "; ".join(tried) + ". Build it (cmake --build build), "
        "install it, or set KVTIER_LIB to the path of libkvtier.so.0"
    )
