# SPDX-License-Identifier: MIT
"""python -m kvtier status|clients|seqs|blocks prints what kvtierctl prints."""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np

import kvtier
from kvtier import ctl
from conftest import PYTHON


def pyctl(args, python_env, check=True):
    r = subprocess.run([PYTHON, "-m", "kvtier", *args], capture_output=True, text=True,
                       env=python_env, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def drop_line(text, key):
    return [ln for ln in text.splitlines() if not ln.startswith(key + " ")]


def drop_column(text, head):
    """Rows split on runs of 2+ spaces, without column @head (its width varies with time)."""
    rows = [re.split(r"\s{2,}", ln.strip()) for ln in text.splitlines()]
    i = rows[0].index(head)
    return [r[:i] + r[i + 1:] for r in rows]


def compare_all(kvtierd, python_env):
    sock = ["--socket", kvtierd.socket]
    ours = pyctl(["status", *sock], python_env).stdout
    theirs = kvtierd.ctl(["status"]).stdout
    assert "uptime" in ours and drop_line(ours, "uptime") == drop_line(theirs, "uptime")
    seqs = pyctl(["seqs", *sock], python_env).stdout
    assert seqs == kvtierd.ctl(["seqs"]).stdout
    ours = pyctl(["clients", *sock], python_env).stdout
    theirs = kvtierd.ctl(["clients"]).stdout
    if ours.startswith("SESSION"):
        assert drop_column(ours, "UPTIME") == drop_column(theirs, "UPTIME")
    else:
        assert ours == theirs
    return seqs, ours


def test_status_clients_seqs_match_kvtierctl(kvtierd, python_env):
    with kvtier.connect(kvtierd.socket, name="status-test") as c:
        with c.open_sequence(layers=2, kv_heads=2, head_dim=64, delta=8, policy="streaming",
                             sinks=2, window=8) as s:
            s.append(np.zeros((40, s.token_bytes), np.uint8))
            s.retier()  # tokens evicted: every tier column has something to show
            seqs, clients = compare_all(kvtierd, python_env)
            assert "streaming" in seqs and "status-test" in clients
    assert kvtierd.wait_sessions(0) == 0
    assert compare_all(kvtierd, python_env) == ("no open sequences\n", "no clients connected\n")


def test_blocks_match_kvtierctl(kvtierd, python_env):
    """The prefix block store (namespaces, references, hit rate, totals) as kvtierctl blocks
    prints it, and its JSON: empty, then with published blocks, a hit and a miss."""
    sock = ["--socket", kvtierd.socket]
    assert pyctl(["blocks", *sock], python_env).stdout == kvtierd.ctl(["blocks"]).stdout
    tok = np.arange(40, dtype=np.uint32)
    with kvtier.connect(kvtierd.socket) as c:
        ns = c.ns_open("status-model", 2, 2, 64, "f16", block_tokens=8)
        keys = ns.block_keys(tok)
        assert ns.lookup(keys) == 0
        with c.open_sequence(ns=ns, layers=2, kv_heads=2, head_dim=64, delta=8) as s:
            s.append(np.zeros((40, s.token_bytes), np.uint8))
            assert s.publish(keys[:3]).held == 3
            assert ns.lookup(keys) == 3
            ours = pyctl(["blocks", *sock], python_env).stdout
            assert ours == kvtierd.ctl(["blocks"]).stdout
            assert "status-model" in ours and "uid " in ours and "hit rate" in ours
            doc = json.loads(pyctl(["blocks", "--json", *sock], python_env).stdout)
            assert doc == json.loads(kvtierd.ctl(["blocks", "--json"]).stdout)
            assert doc["blocks"] == 3 and doc["namespaces"][0]["name"] == "status-model"
    assert kvtierd.wait_sessions(0) == 0
    assert pyctl(["blocks", *sock], python_env).stdout == kvtierd.ctl(["blocks"]).stdout


def test_status_json_is_the_daemons_document(kvtierd, python_env, monkeypatch):
    python_env["KVTIER_SOCKET"] = kvtierd.socket  # the default socket, as kvtierctl
    ours = json.loads(pyctl(["status", "--json"], python_env).stdout)
    theirs = json.loads(kvtierd.ctl(["status", "--json"]).stdout)
    ours.pop("uptime_s"), theirs.pop("uptime_s")
    assert ours == theirs and ours["pid"] == kvtierd.pid


def test_status_without_daemon_and_bad_usage(tmp_path, python_env):
    r = pyctl(["status", "-s", str(tmp_path / "none.sock")], python_env, check=False)
    assert r.returncode == 1 and "kvtierd is not running" in r.stderr and not r.stdout
    r = pyctl(["frobnicate"], python_env, check=False)
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = pyctl(["status", "--timeout", "0"], python_env, check=False)
    assert r.returncode == 2


def test_formatters_match_kvtierctl_units():
    assert [ctl.fmt_bytes(b) for b in (0, 1023, 1024, 1536, 256 << 20, 3 << 40, 1 << 60)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "256.0 MiB", "3.0 TiB", "1024.0 PiB"]
    assert [ctl.fmt_duration(s) for s in (-1, 12.5, 187, 7500, 356400)] == [
        "-", "12.5s", "3m07s", "2h05m", "4d03h"]
    # keys absent or of the wrong type print "-", control characters are replaced
    text = ctl.fmt_status({"version": "x\x1by", "pool": {"used": 5}, "tiers": [1, "a"]})
    assert "version        x?y\n" in text and "pool used      5 B\n" in text
    assert "pid            -\n" in text and "tiers          T0 1  T1 -\n" in text
    # BLOCKS: scope "uid N" or as given, MiB, a hit rate only after lookups, the totals line
    text = ctl.fmt_blocks({"budget_bytes": 0, "blocks": 2, "namespaces": [
        {"id": 1, "name": "m", "scope": "uid", "uid": 7, "bytes": 3 << 20, "hit_blocks": 1,
         "miss_blocks": 3},
        {"id": 2, "name": "n\x1b", "scope": "shared", "hit_blocks": 0, "miss_blocks": 0}]})
    rows = text.splitlines()
    assert rows[0].split() == ["ID", "NAME", "SCOPE", "BLOCKS", "REF", "MiB", "HITRATE",
                               "PUBLISHED", "EVICTED"]
    assert rows[1].split() == ["1", "m", "uid", "7", "-", "-", "3.0", "25.0%", "-", "-"]
    assert rows[2].split() == ["2", "n?", "shared", "-", "-", "-", "-", "-", "-"]
    assert rows[3] == "total  2 blocks (- referenced), -, budget 0 (sharing off), hit rate -"
    assert rows[4] == "       published -, deduped -, evicted -, refused -"
    assert ctl.fmt_blocks({}).startswith("no prefix namespaces\ntotal  - blocks")


def test_status_spill_lines_match_kvtierctl():
    """The spill store's lines (tests/ctl/check_ctl_fmt.c's test_status_spill, the same
    documents): after the tiers, only when the daemon sends "spill"."""
    doc = {"tiers": [1, 2, 3, 4], "spill": {
        "path": "/var/lib/kvtier/spill\x1b", "kind": "file", "size": 68719476736,
        "used": 17179869184, "free": 51539607552, "largest_free": 34359738368,
        "extents": 1500, "queue_depth": 64, "in_flight": 0, "uid_share": 34359738368,
        "uids": [{"uid": 1000, "bytes": 16106127360}, {"uid": 0, "bytes": 1073741824},
                 {"bytes": 5}],
        "io": {"reads": 40, "writes": 50, "read_bytes": 163840, "write_bytes": 204800,
               "read_errors": 2, "write_errors": 4},
        "errors": {"eio": 3, "enospc": 1, "short": 2, "other": 0},
        "refused": {"nospc": 6, "quota": 7}, "dropped": {"extents": 8, "bytes": 32768}}}
    assert ("tiers          T0 1  T1 2  T2 3  T3 4\n"
            "spill path     /var/lib/kvtier/spill?\n"
            "spill kind     file\n"
            "spill size     64.0 GiB\n"
            "spill used     16.0 GiB (25.0%)\n"
            "spill free     48.0 GiB\n"
            "spill extents  1500\n"
            "spill uids     uid 1000 15.0 GiB, uid 0 1.0 GiB, uid - 5 B; share 32.0 GiB\n"
            "spill io       reads 40, writes 50, read_bytes 163840, write_bytes 204800, "
            "read_errors 2, write_errors 4\n"
            "spill errors   eio 3, enospc 1, short 2, other 0\n"
            "spill refused  nospc 6, quota 7\n"
            "spill dropped  extents 8, bytes 32768\n") in ctl.fmt_status(doc)
    text = ctl.fmt_status({"spill": {"uid_share": 0, "uids": [], "size": "x", "errors": 3}})
    assert "spill uids     none; no share\n" in text and "spill size     -\n" in text
    assert "spill path     -\n" in text and "spill errors   -\n" in text
    assert "spill uids     -\n" in ctl.fmt_status({"spill": {"uids": {}}})
    text = ctl.fmt_status({"spill": {"uids": [{"uid": 1, "bytes": 4096}]}})
    assert "spill uids     uid 1 4.0 KiB; share -\n" in text
    assert "spill" not in ctl.fmt_status({"spill": 3}) and "spill" not in ctl.fmt_status({})
