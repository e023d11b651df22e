# SPDX-License-Identifier: MIT
"""Admin requests over kvtierd's control socket, and kvtierctl's text formats.

The control socket is AF_UNIX SOCK_SEQPACKET (proto/kvt_ctl.h): an admin client sends a bare
struct kvt_ctl_hdr (STATUS, CLIENTS, SEQS or BLOCKS, no HELLO) and gets one message back,
KVT_CTL_JSON with NUL-terminated JSON, or KVT_CTL_ERROR. The formatters reproduce
tools/kvtierctl/ctl_fmt.c line for line; every key is optional ("-" when absent). Nothing here
needs libkvtier.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import json
import os
import socket as _socket
from typing import Any, TextIO

from . import _abi

__all__ = ["CtlError", "FORMATTERS", "default_socket", "fmt_blocks", "fmt_bytes", "fmt_clients",
           "fmt_duration", "fmt_seqs", "fmt_status", "main", "request"]

_REQUESTS = {"status": _abi.CTL_STATUS, "clients": _abi.CTL_CLIENTS, "seqs": _abi.CTL_SEQS,
             "blocks": _abi.CTL_BLOCKS}


class CtlError(OSError):
    """An admin request failed: ``errno`` and, when kvtierd refused it, ``daemon_message``."""

    def __init__(self, err: int, message: str, daemon_message: str = "") -> None:
        super().__init__(abs(err), message)
        self.daemon_message: str = daemon_message


def default_socket() -> str:
    """$KVTIER_SOCKET, else /run/kvtier/kvtierd.sock (as kvtierctl and libkvtier)."""
    return os.environ.get("KVTIER_SOCKET") or _abi.DEFAULT_SOCKET


def request(path: str, kinds: list[str], timeout: float = 5.0) -> dict[str, Any]:
    """Ask kvtierd at @path for the documents named in @kinds ("status", "clients", "seqs",
    "blocks")
    over one connection; returns {kind: parsed JSON object}. Raises CtlError."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    out: dict[str, Any] = {}
    try:
        try:
            s.connect(path)
        except FileNotFoundError:
            raise CtlError(_errno.ENOENT, f"kvtierd is not running (no socket at {path}): "
                           f"start it with 'systemctl start kvtierd' or "
                           f"'kvtierd --socket {path}'") from None
        except ConnectionRefusedError:
            raise CtlError(_errno.ECONNREFUSED, f"kvtierd is not running (nothing listens on "
                           f"{path}): start it with 'systemctl start kvtierd' or "
                           f"'kvtierd --socket {path}'") from None
        except PermissionError:
            raise CtlError(_errno.EACCES, f"permission denied on {path}: join the socket's "
                           "group (socket_group in kvtierd.conf) or run as root") from None
        except OSError as e:
            raise CtlError(e.errno or _errno.EIO, f"cannot connect to {path}: "
                           f"{e.strerror or e}") from None
        for i, kind in enumerate(kinds, 1):
            out[kind] = _one(s, path, kind, i)
    finally:
        s.close()
    return out


def _one(s: _socket.socket, path: str, kind: str, req_id: int) -> Any:
    what = kind.upper()
    hdr = _abi.CtlHdr(_REQUESTS[kind], ctypes.sizeof(_abi.CtlHdr), req_id)
    try:
        s.send(bytes(hdr))
        msg, _, flags, _ = s.recvmsg(_abi.CTL_MAX_MSG, 0, _socket.MSG_TRUNC)
    except TimeoutError:
        raise CtlError(_errno.ETIMEDOUT, f"{what} request to {path} failed: timed out") from None
    except OSError as e:
        raise CtlError(e.errno or _errno.EIO, f"{what} request to {path} failed: "
                       f"{e.strerror or e}") from None
    if not msg:
        raise CtlError(_errno.ECONNRESET, f"{what} request to {path} failed: connection "
                       "closed by kvtierd")
    hsz = ctypes.sizeof(_abi.CtlHdr)
    bad = CtlError(_errno.EPROTO, f"malformed reply to {what} from {path}")
    if flags & _socket.MSG_TRUNC or len(msg) < hsz:
        raise bad
    h = _abi.CtlHdr.from_buffer_copy(msg[:hsz])
    if h.len != len(msg) or h.id != req_id:
        raise bad
    if h.type == _abi.CTL_ERROR:
        if len(msg) < ctypes.sizeof(_abi.CtlError):
            raise bad
        e = _abi.CtlError.from_buffer_copy(msg[: ctypes.sizeof(_abi.CtlError)])
        if e.err >= 0:
            raise bad
        text = e.msg.decode(errors="replace")
        raise CtlError(e.err, f"kvtierd refused {what}: {text} ({os.strerror(-e.err)})", text)
    if h.type != _abi.CTL_JSON or len(msg) == hsz or msg[-1] != 0:
        raise bad
    try:
        doc = json.loads(msg[hsz:-1].decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise CtlError(_errno.EPROTO, f"kvtierd answered {what} with invalid JSON: {e}") \
            from None
    if not isinstance(doc, dict):
        raise CtlError(_errno.EPROTO, f"kvtierd answered {what} with invalid JSON: not an "
                       "object")
    return doc


# ---- formatting (tools/kvtierctl/ctl_fmt.c) ----

def _safe(s: str, limit: int) -> str:
    return "".join("?" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in s[: limit - 1])


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float))  # bool is an int: as json-c's boolean-as-number


def _num_text(v: Any) -> str | None:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "NaN"
        if v in (float("inf"), float("-inf")):
            return "+Inf" if v > 0 else "-Inf"
        return "%.15g" % v
    return None


def fmt_bytes(n: float) -> str:
    """A byte count with binary units, as kvtierctl prints it ("512 B", "1.5 GiB")."""
    units = ["KiB", "MiB", "GiB", "TiB", "PiB"]
    if n < 1024:
        return "%.0f B" % n
    n /= 1024
    u = 0
    while n >= 1024 and u + 1 < len(units):
        n /= 1024
        u += 1
    return "%.1f %s" % (n, units[u])


def fmt_duration(s: float) -> str:
    """A duration as kvtierctl prints it ("12.5s", "3m07s", "2h05m", "4d03h")."""
    if not s >= 0:
        return "-"
    if s < 60:
        return "%.1fs" % s
    t = int(s)
    if t < 3600:
        return "%dm%02ds" % (t // 60, t % 60)
    if t < 86400:
        return "%dh%02dm" % (t // 3600, t % 3600 // 60)
    return "%dd%02dh" % (t // 86400, t % 86400 // 3600)


def _get(o: Any, key: str) -> Any:
    return o.get(key) if isinstance(o, dict) else None


def fmt_status(st: dict[str, Any]) -> str:
    """The STATUS document as kvtierctl status prints it."""
    lines: list[str] = []

    def line(k: str, v: str) -> None:
        lines.append("%-14s %s" % (k, v))

    def num(k: str, v: Any) -> None:
        t = _num_text(v)
        line(k, t if t is not None else "-")

    def string(k: str, v: Any) -> None:
        line(k, _safe(v, 128) if isinstance(v, str) else "-")

    def nbytes(k: str, v: Any) -> None:
        line(k, fmt_bytes(v) if _is_num(v) else "-")

    abi, pool = _get(st, "abi"), _get(st, "pool")
    string("version", _get(st, "version"))
    ma, mi = _get(abi, "major"), _get(abi, "minor")
    line("abi", "%.0f.%.0f" % (ma, mi) if _is_num(ma) and _is_num(mi) else "-")
    string("backend", _get(st, "backend"))
    if _get(st, "metrics_url") is not None:
        string("metrics", _get(st, "metrics_url"))
    num("pid", _get(st, "pid"))
    up = _get(st, "uptime_s")
    line("uptime", fmt_duration(up) if _is_num(up) else "-")
    num("pollers", _get(st, "pollers"))
    nbytes("pool size", _get(pool, "size"))
    used, size = _get(pool, "used"), _get(pool, "size")
    if _is_num(used):
        if _is_num(size) and size > 0:
            line("pool used", "%s (%.1f%%)" % (fmt_bytes(used), 100 * used / size))
        else:
            line("pool used", fmt_bytes(used))
    else:
        line("pool used", "-")
    nbytes("pool free", _get(pool, "free"))
    cf = _num_text(_get(pool, "chunks_free"))
    cs = _get(pool, "chunk_size")
    line("pool chunks", "%s free, %s each" % (cf if cf is not None else "-",
                                              fmt_bytes(cs) if _is_num(cs) else "-"))
    num("pool classes", _get(pool, "classes"))
    string("pool backing", _get(pool, "backing"))
    pk = _get(pool, "page_kib")
    if _is_num(pk):
        line("pool pages", "%.0f KiB%s" % (pk, " (no huge pages: row gathers miss the TLB; "
                                                "kvtierd.conf(5) hugetlb)" if pk <= 4 else ""))
    numa = _get(pool, "numa_node")
    if _is_num(numa) and numa < 0:
        line("pool numa", "any")
    else:
        num("pool numa", numa)
    lk = _get(pool, "locked")
    line("pool locked", ("yes" if lk else "no") if isinstance(lk, bool) else "-")
    num("sessions", _get(st, "sessions"))
    num("seqs", _get(st, "seqs"))
    num("ops", _get(st, "ops"))
    num("errors", _get(st, "errors"))
    ref = _get(st, "refused")
    parts = []
    if isinstance(ref, dict):
        for k, v in ref.items():
            t = _num_text(v)
            parts.append("%s %s" % (_safe(k, 48), t if t is not None else "-"))
    line("refused", ", ".join(parts)[:511] if parts else "-")
    tiers = _get(st, "tiers")
    tp = []
    if isinstance(tiers, list):
        for i, v in enumerate(tiers[:8]):
            t = _num_text(v)
            tp.append("T%d %s" % (i, t if t is not None else "-"))
    line("tiers", "  ".join(tp)[:255] if tp else "-")
    return "\n".join(lines) + "\n"


_CLIENT_COLS = [
    ("SESSION", "session", "int"), ("PID", "pid", "int"), ("UID", "uid", "int"),
    ("GID", "gid", "int"), ("SEQS", "seqs", "int"), ("POOL", "pool_bytes", "bytes"),
    ("OPS", "ops", "int"), ("ERRORS", "errors", "int"), ("SQ", "sq_entries", "int"),
    ("ARENA", "arena_size", "bytes"), ("UPTIME", "uptime_s", "secs"), ("NAME", "name", "str"),
]
_SEQ_COLS = [
    ("SESSION", "session", "int"), ("SEQ", "seq", "int"), ("TOKENS", "tokens", "int"),
    ("LAYERS", "layers", "int"), ("HEADS", "kv_heads", "int"), ("DIM", "head_dim", "int"),
    ("DTYPE", "dtype", "str"), ("POLICY", "policy", "str"), ("T2KEYS", "t2_keys", "str"),
    ("T0", "tiers", 0), ("T1", "tiers", 1), ("T2", "tiers", 2), ("T3", "tiers", 3),
    ("EVICTED", "evicted_ratio", "pct"), ("POOL", "pool_bytes", "bytes"),
]


_BLOCK_COLS = [
    ("ID", "id", "int"), ("NAME", "name", "str"), ("SCOPE", "scope", "scope"),
    ("BLOCKS", "blocks", "int"), ("REF", "referenced", "int"), ("MiB", "bytes", "mib"),
    ("HITRATE", "hit_blocks", "hits"), ("PUBLISHED", "published", "int"),
    ("EVICTED", "evicted", "int"),
]


def _hit_rate(o: Any) -> float | None:
    """Found blocks over blocks looked up; None before any lookup (no rate to show)."""
    hit, miss = _get(o, "hit_blocks"), _get(o, "miss_blocks")
    if not (_is_num(hit) and _is_num(miss)) or not hit + miss > 0:
        return None
    return hit / (hit + miss)


def _cell(kind: Any, v: Any, row: Any = None) -> str:
    if kind == "scope":
        uid = _num_text(_get(row, "uid"))
        if v == "uid" and uid is not None:
            return _safe(f"uid {uid}", 48)
        return _safe(v, 48) if isinstance(v, str) else "-"
    if kind == "mib":
        return "%.1f" % (v / (1 << 20)) if _is_num(v) else "-"
    if kind == "hits":
        r = _hit_rate(row)
        return "%.1f%%" % (r * 100) if r is not None else "-"
    if isinstance(kind, int):
        v = v[kind] if isinstance(v, list) and kind < len(v) else None
        kind = "int"
    if kind == "str":
        return _safe(v, 48) if isinstance(v, str) else "-"
    if kind == "int":
        if isinstance(v, float):
            return "%.0f" % v
        t = _num_text(v)
        return t[:47] if t is not None else "-"
    if not _is_num(v):
        return "-"
    if kind == "bytes":
        return fmt_bytes(v)
    if kind == "secs":
        return fmt_duration(v)
    return "%.1f%%" % (v * 100)  # pct


def _table(doc: dict[str, Any], key: str, cols: list[tuple[str, str, Any]], none: str) -> str:
    rows = doc.get(key) if isinstance(doc, dict) else None
    if rows is not None and not isinstance(rows, list):
        raise ValueError(f'"{key}" is not an array')
    if not rows:
        return none + "\n"
    cells = [[h for h, _, _ in cols]]
    for r in rows:
        cells.append([_cell(kind, _get(r, k), r) for _, k, kind in cols])
    width = [max(len(row[c]) for row in cells) for c in range(len(cols))]
    out = []
    for row in cells:
        parts = []
        for c, (_, _, kind) in enumerate(cols):
            last = c + 1 == len(cols)
            text = kind in ("str", "scope")
            if text and last:
                parts.append(row[c])
            elif text:
                parts.append(row[c].ljust(width[c]))
            else:
                parts.append(row[c].rjust(width[c]))
        out.append("  ".join(parts))
    return "\n".join(out) + "\n"


def fmt_clients(doc: dict[str, Any]) -> str:
    """The CLIENTS document as kvtierctl clients prints it."""
    return _table(doc, "clients", _CLIENT_COLS, "no clients connected")


def fmt_seqs(doc: dict[str, Any]) -> str:
    """The SEQS document as kvtierctl seqs prints it."""
    return _table(doc, "seqs", _SEQ_COLS, "no open sequences")


def fmt_blocks(doc: dict[str, Any]) -> str:
    """The BLOCKS document as kvtierctl blocks prints it: the namespaces, then the totals."""
    out = _table(doc, "namespaces", _BLOCK_COLS, "no prefix namespaces")
    blocks = _num_text(_get(doc, "blocks")) or "-"
    ref = _num_text(_get(doc, "referenced")) or "-"
    used = _get(doc, "bytes")
    used = fmt_bytes(used) if _is_num(used) else "-"
    b = _get(doc, "budget_bytes")
    if not _is_num(b):
        budget = " of - budget"
    elif b > 0:
        budget = f" of {fmt_bytes(b)} budget"
    else:
        budget = ", budget 0 (sharing off)"
    r = _hit_rate(doc)
    rate = "%.1f%%" % (r * 100) if r is not None else "-"
    out += f"total  {blocks} blocks ({ref} referenced), {used}{budget}, hit rate {rate}"
    for i, k in enumerate(("published", "deduped", "evicted", "refused_budget")):
        num = _num_text(_get(doc, k)) or "-"
        out += (", " if i else "\n       ") + ("refused" if i == 3 else k) + " " + num
    return out + "\n"


FORMATTERS = {"status": fmt_status, "clients": fmt_clients, "seqs": fmt_seqs,
              "blocks": fmt_blocks}
"""Command name -> formatter of its document."""


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """``python -m kvtier COMMAND``: status, clients, seqs or blocks, as kvtierctl prints them
    (or the daemon's JSON with --json). Exit status 0, 1 (kvtierd unreachable or the request
    failed), 2 (bad usage)."""
    import argparse
    import sys

    out = out or sys.stdout
    ap = argparse.ArgumentParser(
        prog="python -m kvtier",
        description="Inspect a running kvtierd over its control socket (as kvtierctl).")
    ap.add_argument("command", choices=sorted(FORMATTERS),
                    help="status: version, backend, pool, counters, tiers; clients: sessions; "
                         "seqs: open sequences; blocks: prefix block namespaces")
    ap.add_argument("-s", "--socket", default=None,
                    help=f"control socket (default: $KVTIER_SOCKET, else {_abi.DEFAULT_SOCKET})")
    ap.add_argument("-j", "--json", action="store_true",
                    help="print the daemon's JSON document, pretty-printed")
    ap.add_argument("-t", "--timeout", type=float, default=5.0,
                    help="wait at most SEC seconds for each reply (default 5)")
    a = ap.parse_args(argv)
    if not a.timeout > 0:
        ap.error(f"bad --timeout '{a.timeout}': seconds, > 0")
    path = a.socket or default_socket()
    try:
        doc = request(path, [a.command], a.timeout)[a.command]
    except CtlError as e:
        print(f"kvtier: {e.strerror}", file=sys.stderr)
        return 1
    if a.json:
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    try:
        out.write(FORMATTERS[a.command](doc))
    except ValueError as e:
        print(f"kvtier: kvtierd's JSON does not have the expected shape: {e}", file=sys.stderr)
        return 1
    return 0
