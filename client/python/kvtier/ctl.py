# SPDX-License-Identifier: MIT
"""Admin requests over kvtierd's control socket, and kvtierctl's text formats.

The control socket is AF_UNIX SOCK_SEQPACKET (proto/kvt_ctl.h): an admin client sends a bare
struct kvt_ctl_hdr (STATUS, CLIENTS, SEQS or BLOCKS, no HELLO) and gets one message back,
KVT_CTL_JSON with NUL-terminated JSON, or KVT_CTL_ERROR. The formatters render the documents
from the one description kvtierctl's ctl_fmt.c expands too: the lines and columns of
proto/kvt_ctl.h (KVT_CTL_STATUS_LINES, KVT_CTL_*_COLS), generated into kvtier.abi; what is
here is how each kind of value prints. Every key is optional ("-" when absent). Nothing here
needs libkvtier.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import json
import os
import socket as _socket
from typing import Any, TextIO

from . import abi as _abi

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


def _get_path(o: Any, path: str) -> tuple[Any, Any, bool]:
    """The value at @path ("pool.size") in @o, the object holding it, and whether a segment
    marked optional ("spill?.size") is not an object in @o (the line is left out)."""
    *parents, key = path.split(".")
    absent = False
    for k in parents:
        o = _get(o, k.removesuffix("?"))
        absent = absent or (k.endswith("?") and not isinstance(o, dict))
    return _get(o, key), o, absent


def _status_line(kind: str, v: Any, parent: Any) -> str | None:
    """The value column of a STATUS line of @kind (kvt_ctl.h); None: the line is left out."""
    if kind in ("str", "optstr"):
        if kind == "optstr" and v is None:
            return None
        return _safe(v, 128) if isinstance(v, str) else "-"
    if kind == "num":
        t = _num_text(v)
        return t if t is not None else "-"
    if kind == "bytes":
        return fmt_bytes(v) if _is_num(v) else "-"
    if kind == "secs":
        return fmt_duration(v) if _is_num(v) else "-"
    if kind == "abi":
        ma, mi = _get(v, "major"), _get(v, "minor")
        return "%.0f.%.0f" % (ma, mi) if _is_num(ma) and _is_num(mi) else "-"
    if kind == "used":
        if not _is_num(v):
            return "-"
        size = _get(parent, "size")
        if _is_num(size) and size > 0:
            return "%s (%.1f%%)" % (fmt_bytes(v), 100 * v / size)
        return fmt_bytes(v)
    if kind == "chunks":
        cf = _num_text(_get(v, "chunks_free"))
        cs = _get(v, "chunk_size")
        return "%s free, %s each" % (cf if cf is not None else "-",
                                     fmt_bytes(cs) if _is_num(cs) else "-")
    if kind == "pages":
        if not _is_num(v):
            return None
        return "%.0f KiB%s" % (v, " (no huge pages: row gathers miss the TLB; "
                                  "kvtierd.conf(5) hugetlb)" if v <= 4 else "")
    if kind == "numa":
        if _is_num(v) and v < 0:
            return "any"
        t = _num_text(v)
        return t if t is not None else "-"
    if kind == "yesno":
        return ("yes" if v else "no") if isinstance(v, bool) else "-"
    if kind == "counters":
        parts = []
        if isinstance(v, dict):
            for k, n in v.items():
                t = _num_text(n)
                parts.append("%s %s" % (_safe(k, 48), t if t is not None else "-"))
        return ", ".join(parts)[:511] if parts else "-"
    if kind == "tiers":
        tp = []
        if isinstance(v, list):
            for i, n in enumerate(v[:8]):
                t = _num_text(n)
                tp.append("T%d %s" % (i, t if t is not None else "-"))
        return "  ".join(tp)[:255] if tp else "-"
    if kind == "uids":
        if not isinstance(v, list):
            return "-"
        parts = []
        for u in v:
            t, b = _num_text(_get(u, "uid")), _get(u, "bytes")
            parts.append("uid %s %s" % (t if t is not None else "-",
                                        fmt_bytes(b) if _is_num(b) else "-"))
        share = _get(parent, "uid_share")
        text = ", ".join(parts) if parts else "none"
        if not _is_num(share):
            text += "; share -"
        else:
            text += "; share %s" % fmt_bytes(share) if share > 0 else "; no share"
        return text[:511]
    raise ValueError(f"kvt_ctl.h STATUS line kind {kind!r} unknown to this package")


def fmt_status(st: dict[str, Any]) -> str:
    """The STATUS document as kvtierctl status prints it (KVT_CTL_STATUS_LINES)."""
    lines: list[str] = []
    for label, path, kind in _abi.CTL_STATUS_LINES:
        v, parent, absent = _get_path(st, path)
        text = None if absent else _status_line(kind, v, parent)
        if text is not None:
            lines.append("%-14s %s" % (label, text))
    return "\n".join(lines) + "\n"


def _hit_rate(o: Any) -> float | None:
    """Found blocks over blocks looked up; None before any lookup (no rate to show)."""
    hit, miss = _get(o, "hit_blocks"), _get(o, "miss_blocks")
    if not (_is_num(hit) and _is_num(miss)) or not hit + miss > 0:
        return None
    return hit / (hit + miss)


def _cell(kind: str, idx: int, v: Any, row: Any = None) -> str:
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
    if kind == "tier":
        v = v[idx] if isinstance(v, list) and idx < len(v) else None
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
    if kind == "pct":
        return "%.1f%%" % (v * 100)
    raise ValueError(f"kvt_ctl.h column kind {kind!r} unknown to this package")


def _table(doc: dict[str, Any], key: str, cols: list[tuple[str, str, str, int]],
           none: str) -> str:
    rows = doc.get(key) if isinstance(doc, dict) else None
    if rows is not None and not isinstance(rows, list):
        raise ValueError(f'"{key}" is not an array')
    if not rows:
        return none + "\n"
    cells = [[h for h, _, _, _ in cols]]
    for r in rows:
        cells.append([_cell(kind, idx, _get(r, k), r) for _, k, kind, idx in cols])
    width = [max(len(row[c]) for row in cells) for c in range(len(cols))]
    out = []
    for row in cells:
        parts = []
        for c, (_, _, kind, _) in enumerate(cols):
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
    return _table(doc, "clients", _abi.CTL_COLUMNS["clients"], "no clients connected")


def fmt_seqs(doc: dict[str, Any]) -> str:
    """The SEQS document as kvtierctl seqs prints it."""
    return _table(doc, "seqs", _abi.CTL_COLUMNS["seqs"], "no open sequences")


def fmt_blocks(doc: dict[str, Any]) -> str:
    """The BLOCKS document as kvtierctl blocks prints it: the namespaces, then the totals."""
    out = _table(doc, "namespaces", _abi.CTL_COLUMNS["blocks"], "no prefix namespaces")
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
