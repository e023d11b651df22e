# SPDX-License-Identifier: MIT
"""Prefix blocks through the kvtier package, against a real kvtierd: namespaces, keys computed
by libkvtier (checked against a C program calling kvt_block_keys() itself), LOOKUP before and
after PUBLISH, a sequence opened from the pinned blocks reading the publisher's rows with no
pool bytes of its own, namespaces that never mix, and refusals that carry kvtierd's reason."""
from __future__ import annotations

import errno
import subprocess

import numpy as np
import pytest

import kvtier
from conftest import build_dir
from test_abi import compile_c

L, H, D = 2, 2, 64  # layers, kv heads, head dim (f16)
BT = 8  # tokens per block
ROW = H * D * 2  # bytes of one (token, layer, K|V) row
TOK = L * 2 * ROW  # bytes of one token's rows
S = 64  # staging slots


def raises(code, fn, *a, **kw):
    with pytest.raises(kvtier.KvtierError) as ei:
        fn(*a, **kw)
    assert ei.value.errno == code, f"{ei.value} is not {errno.errorcode[code]}"
    return ei.value


def prompt(n, salt=0):
    return np.arange(100 + salt, 100 + salt + n, dtype=np.uint32)


def rows(first, n):
    """The rows of tokens [first, first + n): (n, layers, K|V, heads, dim) f16, the same in
    every process (the "model")."""
    out = np.empty((n, L, 2, H, D), np.float16)
    for i in range(n):
        out[i] = np.random.default_rng(first + i).standard_normal((L, 2, H, D))
    return out


def open_seq(c, stage, ns=None, prefix_blocks=0):
    return c.open_sequence(
        ns=ns, prefix_blocks=prefix_blocks, layers=L, kv_heads=H, head_dim=D, dtype="f16",
        policy="tiered", delta=4, hbm_frac=0.0, stage_buf_id=stage, stage_slots=S,
        stage_slot_stride=ROW, stage_kv_stride=S * ROW, stage_layer_stride=2 * S * ROW)


def staged(stage, seq):
    """FETCH every T1 row; (positions, rows as (n, layers, K|V, heads, dim))."""
    f = seq.fetch(kvtier.FetchFlag.T1)
    a = stage.array(np.float16, shape=(L, 2, S, H, D))[:, :, : f.rows]
    return f.positions, np.ascontiguousarray(a.transpose(2, 0, 1, 3, 4))


def test_block_keys_are_libkvtiers(tmp_path):
    """block_keys() returns what kvt_block_keys() computes in C, byte for byte, for a start
    and a continuation (parent), and is deterministic; the keys differ per namespace field."""
    tok = prompt(3 * BT + 5, salt=7)
    nsp = kvtier.make_ns_params("model-a", L, H, D, "f16", BT)
    keys = kvtier.block_keys(nsp, tok)
    assert keys.dtype == kvtier.KEY_DTYPE and keys.size == 3
    assert (keys == kvtier.block_keys(nsp, tok.tolist())).all()
    cont = kvtier.block_keys(nsp, tok[BT:], parent=keys[0])
    assert (cont == keys[1:]).all()  # a key names its whole prefix: chaining resumes

    src = f"""
#include <stdio.h>
#include <string.h>
#include "kvtier.h"
int main(void) {{
	struct kvt_ns_params np = {{.size = sizeof(np), .layers = {L}, .kv_heads = {H},
				   .head_dim = {D}, .dtype = KVT_DTYPE_F16, .block_tokens = {BT}}};
	uint32_t tok[{tok.size}] = {{{", ".join(map(str, tok.tolist()))}}};
	struct kvt_block_key k[8];
	int n;

	strcpy(np.name, "model-a");
	n = kvt_block_keys(&np, NULL, tok, {tok.size}, k, 8);
	for (int i = 0; i < n; i++)
		printf("%016llx%016llx\\n", (unsigned long long)k[i].hi,
		       (unsigned long long)k[i].lo);
	return 0;
}}
"""
    exe = compile_c(tmp_path, "keys_probe", src, link_kvtier=True)
    want = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    got = [f"{int(k['hi']):016x}{int(k['lo']):016x}" for k in keys]
    assert got == want

    for field, v in (("name", "model-b"), ("layers", L + 1), ("head_dim", D // 2),
                     ("dtype", "f32"), ("block_tokens", BT * 2)):
        kw = dict(name="model-a", layers=L, kv_heads=H, head_dim=D, dtype="f16",
                  block_tokens=BT)
        kw[field] = v
        other = kvtier.block_keys(kvtier.make_ns_params(**kw), tok)
        assert not np.isin(other, keys).any(), field


def test_block_keys_refuses_bad_input():
    nsp = kvtier.make_ns_params("m", L, H, D, "f16", BT)
    assert kvtier.block_keys(nsp, prompt(BT - 1)).size == 0  # no full block
    raises(errno.EINVAL, kvtier.block_keys, nsp, [1, -2, 3])
    raises(errno.EINVAL, kvtier.block_keys, nsp, np.zeros((2, 16), np.int64))
    e = raises(errno.EINVAL, kvtier.make_ns_params, "x" * 64, L, H, D, "f16")
    assert "1..63 bytes" in str(e)
    raises(errno.EINVAL, kvtier.make_ns_params, "tab\there", L, H, D, "f16")
    raises(errno.EINVAL, kvtier.make_ns_params, "", L, H, D, "f16")
    bad = kvtier.make_ns_params("m", 0, H, D, "f16")  # layers 0: NS_OPEN would refuse it
    e = raises(errno.EINVAL, kvtier.block_keys, bad, prompt(BT))
    assert "kvt_ns_params" in e.daemon_message


def test_lookup_publish_open_from_prefix(kvtierd):
    """A publishes its first blocks; B finds them (0 before), opens a sequence from them,
    reads A's rows bit for bit and is charged no pool bytes for them; A's own charge drops
    to its unshared tail and the pool holds the blocks once."""
    n_tok = 4 * BT + 3
    tok = prompt(n_tok)
    with kvtier.connect(kvtierd.socket) as a, kvtier.connect(kvtierd.socket) as b:
        sa_buf, sb_buf = a.alloc_buffer(L * 2 * S * ROW), b.alloc_buffer(L * 2 * S * ROW)
        na = a.ns_open("model-a", L, H, D, "f16", block_tokens=BT)
        nb = b.ns_open("model-a", L, H, D, "f16", block_tokens=BT)
        assert na.block_tokens == BT and na.name == "model-a"
        keys = na.block_keys(tok)
        assert keys.size == 4
        assert nb.lookup(keys) == 0

        sa = open_seq(a, sa_buf, ns=na)
        assert sa.ns is na and sa.prefix_tokens == 0
        sa.append(rows(0, n_tok))
        assert sa.stat().pool_bytes == n_tok * TOK
        used = kvtierd.doc("status")["pool"]["used"]
        assert sa.publish(keys) == (4, 4)
        assert sa.stat().pool_bytes == (n_tok - 4 * BT) * TOK  # the blocks are the store's
        assert sa.publish(keys) == (4, 0)  # found, nothing new
        assert kvtierd.doc("status")["pool"]["used"] == used

        assert nb.lookup(keys, pin=False) == 4
        assert nb.lookup(keys[:3]) == 3  # pins the first three
        sb = open_seq(b, sb_buf, ns=nb, prefix_blocks=3)
        assert sb.prefix_tokens == 3 * BT and sb.stat().n_tokens == 3 * BT
        assert sb.stat().pool_bytes == 0
        assert kvtierd.doc("status")["pool"]["used"] == used  # no copy
        pos, got = staged(sb_buf, sb)
        assert pos.tolist() == list(range(3 * BT))
        assert np.array_equal(got, rows(0, 3 * BT))
        # B goes on with rows of its own, and its next block is A's: publishing it shares it
        sb.append(rows(3 * BT, BT))
        assert sb.stat().pool_bytes == BT * TOK
        assert sb.publish(keys) == (4, 0)
        assert sb.stat().pool_bytes == 0

        # a prompt that differs inside block 2 matches two blocks
        tok2 = tok.copy()
        tok2[2 * BT + 1] = 7
        assert nb.lookup(nb.block_keys(tok2)) == 2
    assert kvtierd.wait_sessions(0) == 0
    # every sequence gone: the blocks stay cached
    assert kvtierd.doc("status")["pool"]["used"] == 4 * BT * TOK


def test_namespaces_never_mix(kvtierd):
    """The keys of one namespace find nothing in another name or geometry, even sent there
    as they are; the same name and geometry from another client finds them."""
    tok = prompt(2 * BT)
    with kvtier.connect(kvtierd.socket) as a, kvtier.connect(kvtierd.socket) as b:
        buf = a.alloc_buffer(L * 2 * S * ROW)
        na = a.ns_open("model-a", L, H, D, "f16", block_tokens=BT)
        keys = na.block_keys(tok)
        s = open_seq(a, buf, ns=na)
        s.append(rows(0, 2 * BT))
        assert s.publish(keys).held == 2
        for other in (dict(name="model-b", layers=L, kv_heads=H, head_dim=D, dtype="f16"),
                      dict(name="model-a", layers=L, kv_heads=H, head_dim=D // 2, dtype="f16"),
                      dict(name="model-a", layers=L, kv_heads=H, head_dim=D, dtype="f32"),
                      dict(name="model-a", layers=L, kv_heads=H, head_dim=D, dtype="f16",
                           block_tokens=2 * BT)):
            with b.ns_open(block_tokens=other.pop("block_tokens", BT), **other) as nb:
                assert nb.lookup(keys) == 0, other
                assert nb.lookup(nb.block_keys(tok)) == 0, other
        assert b.ns_open("model-a", L, H, D, "f16", block_tokens=BT).lookup(keys) == 2


def test_refusals_carry_the_reason(kvtierd):
    """Opening past the pins, publishing without a namespace or past the sequence's tokens,
    a namespace of another geometry, a closed namespace: each raises KvtierError with
    kvtierd's (or the binding's) reason, and the session goes on."""
    tok = prompt(3 * BT)
    with kvtier.connect(kvtierd.socket) as c:
        buf = c.alloc_buffer(L * 2 * S * ROW)
        ns = c.ns_open("model-r", L, H, D, "f16", block_tokens=BT)
        keys = ns.block_keys(tok)
        s = open_seq(c, buf, ns=ns)
        s.append(rows(0, 2 * BT))
        e = raises(errno.EINVAL, s.publish, keys)  # 3 blocks, 2 blocks of tokens
        assert "pass the sequence's" in e.daemon_message, e
        assert s.publish(keys, n=2) == (2, 2)
        assert ns.lookup(keys) == 2
        e = raises(errno.EINVAL, open_seq, c, buf, ns=ns, prefix_blocks=3)
        assert "prefix_blocks 3" in e.daemon_message and "pinning LOOKUP" in e.daemon_message, e
        e = raises(errno.EINVAL, open_seq, c, buf, prefix_blocks=1)
        assert "ns=" in e.daemon_message
        plain = open_seq(c, buf)
        e = raises(errno.EINVAL, plain.publish, keys[:1])
        assert "without a namespace" in e.daemon_message
        with c.ns_open("model-r", L, H, 2 * D, "f16", block_tokens=BT) as wide:
            e = raises(errno.EINVAL, open_seq, c, buf, ns=wide)
            assert "namespace" in e.daemon_message and "dims" in e.daemon_message, e
        raises(errno.ENOENT, wide.lookup, keys)  # closed
        raises(errno.EINVAL, ns.lookup, b"\0" * 15)
        raises(errno.EINVAL, ns.lookup, [[1, 2, 3]])
        # and the session still serves
        assert ns.lookup(keys) == 2
        s2 = open_seq(c, buf, ns=ns, prefix_blocks=2)
        assert s2.stat().n_tokens == 2 * BT
