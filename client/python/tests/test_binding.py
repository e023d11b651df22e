# SPDX-License-Identifier: MIT
"""Every libkvtier call through the kvtier package, against a real kvtierd, and the errors each
documents."""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import textwrap

import numpy as np
import pytest

import kvtier
from conftest import PYTHON

L, H, D = 2, 2, 64  # layers, kv heads, head dim of the small test sequences (f16)
ROW = H * D * 2  # bytes of one (token, layer, K|V) row
S = 64  # T0 / staging slots


def geometry(**kw):
    p = dict(layers=L, kv_heads=H, head_dim=D, dtype="f16", delta=8, sinks=4, window=8)
    p.update(kw)
    return p


def tokens(n, seed=0):
    """@n tokens of rows, shape (n, layers, K|V, heads, dim), f16."""
    return np.random.default_rng(seed).standard_normal((n, L, 2, H, D)).astype(np.float16)


def region(buf):
    """The (layers, K|V, slots, heads, dim) f16 view of a region laid out as region_params()."""
    return buf.array(np.float16, shape=(L, 2, S, H, D))


def region_params(prefix, buf):
    return {f"{prefix}_buf_id": buf, f"{prefix}_slot_stride": ROW,
            f"{prefix}_kv_stride": S * ROW, f"{prefix}_layer_stride": 2 * S * ROW,
            f"{prefix}_base_off": 0, ("t0_slots" if prefix == "t0" else "stage_slots"): S}


def raises(code, fn, *a, **kw):
    with pytest.raises(kvtier.KvtierError) as ei:
        fn(*a, **kw)
    assert ei.value.errno == code, f"{ei.value} is not {errno.errorcode[code]}"
    return ei.value


# ---- connect, session ----

def test_connect_names_the_session(kvtierd):
    with kvtier.connect(kvtierd.socket, name="pytest-binding") as c:
        assert c.session_id > 0
        c.nop()
        rows = kvtierd.doc("clients")["clients"]
        assert [(r["session"], r["name"], r["pid"]) for r in rows] == [
            (c.session_id, "pytest-binding", os.getpid())]
    assert kvtierd.wait_sessions(0) == 0


def test_connect_uses_kvtier_socket_env(kvtierd, monkeypatch):
    monkeypatch.setenv("KVTIER_SOCKET", kvtierd.socket)
    with kvtier.connect() as c:
        c.nop()


def test_connect_without_daemon_says_so(tmp_path):
    e = raises(errno.ENOENT, kvtier.connect, str(tmp_path / "none.sock"))
    assert "not running" in str(e) and str(tmp_path / "none.sock") in str(e)
    assert isinstance(e, OSError) and e.strerror == kvtier.strerror(errno.ENOENT)


def test_connect_abi_mismatch_carries_daemon_message(kvtierd):
    e = raises(errno.EPROTO, kvtier.connect, kvtierd.socket, abi_major=kvtier.ABI_MAJOR + 1)
    assert "ABI mismatch" in e.daemon_message


def test_connect_refuses_bad_options(kvtierd):
    raises(errno.EINVAL, kvtier.connect, kvtierd.socket, sq_entries=-1)
    raises(errno.EINVAL, kvtier.connect, kvtierd.socket, arena_size=1 << 64)


def test_closed_client_refuses_calls(kvtierd):
    c = kvtier.connect(kvtierd.socket)
    s = c.open_sequence(**geometry())
    c.close()
    c.close()  # idempotent
    raises(errno.ENOTCONN, c.nop)
    raises(errno.ENOTCONN, c.alloc_buffer, 4096)
    raises(errno.ENOENT, s.stat)  # the session's sequences went with it
    s.close()


def test_strerror_names_kvtier_meanings():
    assert kvtier.strerror(errno.EDQUOT) == kvtier.strerror(-errno.EDQUOT)
    assert "quota" in kvtier.strerror(errno.EDQUOT)
    assert kvtier.strerror(errno.ECONNRESET) == "connection to kvtierd lost"
    assert kvtier.abi_version()[0] == kvtier.ABI_MAJOR


# ---- buffers ----

def test_buffer_is_zero_copy_both_ways(kvtierd):
    """Rows written through NumPy reach the daemon (APPEND from T0), rows the daemon stages are
    read back through NumPy (FETCH), and the torch view is the same memory."""
    data = tokens(20)
    with kvtier.connect(kvtierd.socket) as c:
        t0buf, stbuf = c.alloc_buffer(2 * L * S * ROW), c.alloc_buffer(2 * L * S * ROW)
        t0, st = region(t0buf), region(stbuf)
        assert t0.base is not None
        st.view(np.uint8).reshape(-1)[0] = 0x5A  # the view's own mapping of the same pages
        assert ctypes.string_at(stbuf.address, 1) == b"\x5a"
        s = c.open_sequence(**geometry(policy="full", delta=4, window=4),
                            **region_params("t0", t0buf), **region_params("stage", stbuf))
        slots = np.arange(20)[::-1] + 10  # tokens land in slots 29..10
        for i, slot in enumerate(slots):
            t0[:, :, slot] = data[i]
        assert s.append_t0(slots) == (20, 0)
        order = [7, 0, 19, 3]
        r = s.fetch(positions=order, stage_row=5)
        assert r.rows == 4 and list(r.positions) == order
        for row, pos in enumerate(order):
            np.testing.assert_array_equal(st[:, :, 5 + row], data[pos])
        # rows APPENDed through the arena come back the same way
        more = tokens(3, seed=1)
        assert s.append(more) == (23, 20)
        r = s.fetch(positions=[21, 22, 20])
        for row, pos in enumerate([21, 22, 20]):
            np.testing.assert_array_equal(st[:, :, row], more[pos - 20])
        import torch  # the test environment has it: a missing torch fails, never skips
        tv = stbuf.torch(torch.float16, shape=(L, 2, S, H, D))
        # the tensor is the view's own mapping of the buffer's pages (it outlives free()), so
        # zero copy is shown by writes, not by addresses: each side sees the other's at once
        tv[1, 1, 63] = 7.0
        assert (st[1, 1, 63] == 7.0).all()
        off = ((1 * 2 + 1) * S + 63) * H * D * 2  # [1][1][63][0][0], f16
        assert ctypes.string_at(stbuf.address + off, 2) == np.float16(7.0).tobytes()
        ctypes.memmove(stbuf.address + off, np.float16(-3.0).tobytes(), 2)
        assert tv[1, 1, 63, 0, 0].item() == -3.0
        s.close()
        stbuf.free()
        t0buf.free()


def test_fetch_rows_into_another_buffer(kvtierd):
    """fetch_rows() (ABI 1.6) stages each position at the row listed for it, into a second
    registered buffer laid out as the staging region (a paged cache's layer), leaving the
    staging region alone; one layer at a time; bad lists are refused with a reason."""
    data = tokens(12)
    with kvtier.connect(kvtierd.socket) as c:
        stbuf, cache = c.alloc_buffer(2 * L * S * ROW), c.alloc_buffer(2 * L * S * ROW)
        st, cv = region(stbuf), region(cache)
        st[...] = 1.0
        s = c.open_sequence(**geometry(policy="full", delta=4, window=4),
                            **region_params("stage", stbuf))
        assert s.append(data) == (12, 0)
        pos, rows = [0, 1, 2, 3, 8, 9], [60, 61, 62, 63, 4, 5]
        assert s.fetch_rows(pos, rows, buf=cache) == 6
        for p_, r in zip(pos, rows):
            np.testing.assert_array_equal(cv[:, :, r], data[p_])
        assert (st == 1.0).all()
        cv[...] = 0
        assert s.fetch_rows([11], [7], layer0=1, nlayers=1, buf=cache) == 1
        np.testing.assert_array_equal(cv[1, :, 7], data[11][1])
        assert not cv[0].any()
        e = raises(errno.EINVAL, s.fetch_rows, [0], [S], buf=cache)
        assert f"staging row {S} (entry 0)" in str(e)
        raises(errno.EINVAL, s.fetch_rows, [0, 1], [0], buf=cache)
        s.close()


def test_buffer_free_while_in_use_is_ebusy(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        b = c.alloc_buffer(2 * L * S * ROW)
        s = c.open_sequence(**geometry(), **region_params("t0", b))
        e = raises(errno.EBUSY, b.free)
        assert e.daemon_message  # kvtierd says why
        b.array()[:8] = 1  # still mapped: nothing changed
        s.close()
        b.free()
        raises(errno.EBADF, b.array)
        b.free()  # idempotent


def test_buffer_limits(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        raises(errno.EINVAL, c.alloc_buffer, 0)
        bufs = [c.alloc_buffer(4096) for _ in range(16)]  # buffers_per_session default
        assert len({b.id for b in bufs}) == 16
        e = raises(errno.EMFILE, c.alloc_buffer, 4096)
        assert e.daemon_message
        bufs[0].free()
        c.alloc_buffer(4096).free()


def test_cuda_calls_refused_without_a_device(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        # EOPNOTSUPP from libkvtier without a CUDA driver or from the host-backend daemon,
        # ENODEV without a device; EINVAL: host memory is not device memory.
        for call in (lambda: c.event_get_cuda(0), lambda: c.alloc_cuda_buffer(4096),
                     lambda: c.register_cuda(c.alloc_buffer(4096).address, 4096)):
            with pytest.raises(kvtier.KvtierError) as ei:
                call()
            assert ei.value.errno in (errno.EOPNOTSUPP, errno.ENODEV, errno.EINVAL)
            assert ei.value.daemon_message  # libkvtier or kvtierd says why
        try:  # with a driver, a no-op on the host backend
            c.cuda_stream_wait(None)
        except kvtier.KvtierError as e:
            assert e.errno in (errno.EOPNOTSUPP, errno.ENODEV) and e.daemon_message
        b = c.alloc_buffer(4096)
        assert b.offset == 0 and not b.cuda
        with pytest.raises(AttributeError):
            b.__cuda_array_interface__
        c.nop()


# ---- sequences ----

def test_params_by_name_and_checked(kvtierd):
    p = kvtier.make_params(layers=3, dtype="bf16", policy="h2o", score_mode="mean",
                           t2_flags="key_channel", protect_prompt=True, hbm_frac=0.25)
    assert (p.size, p.layers, p.dtype, p.policy, p.score_mode, p.t2_flags, p.protect_prompt) \
        == (160, 3, kvtier.DTYPES["bf16"], kvtier.POLICIES["h2o"], 1, 1, 1)
    assert p.hbm_frac == 0.25
    np16 = kvtier.make_params(dtype=np.float16)
    assert np16.dtype == 0 and kvtier.make_params(dtype=np.float32).dtype == 2
    with pytest.raises(TypeError, match="layrs"):
        kvtier.make_params(layrs=2)
    raises(errno.EINVAL, kvtier.make_params, layers=70000)  # would wrap in a u16
    raises(errno.EINVAL, kvtier.make_params, delta=-1)
    raises(errno.EINVAL, kvtier.make_params, policy="lru")
    raises(errno.EINVAL, kvtier.make_params, dtype="int4")
    assert set(kvtier.PARAM_FIELDS) == {n for n, _ in kvtier.SeqParams._fields_}


@pytest.mark.parametrize("bad", [
    dict(layers=0), dict(kv_heads=65), dict(head_dim=257), dict(delta=0),
    dict(hbm_frac=0.8, evict_frac=0.3), dict(policy=7), dict(reserved0=1),
    dict(size=100), dict(q_heads=3), dict(t0_slots=8),
])
def test_open_refuses_bad_params(kvtierd, bad):
    with kvtier.connect(kvtierd.socket) as c:
        e = raises(errno.EINVAL, c.open_sequence, **geometry(**bad))
        # kvtierd's reason names the op and the field
        assert e.daemon_message.startswith("SEQ_OPEN: "), e
        assert next(iter(bad)).rstrip("0") in e.daemon_message, e
        c.open_sequence(**geometry()).close()  # the session is fine


def test_open_errors_for_regions(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        raises(errno.ENOENT, c.open_sequence, **geometry(t0_buf_id=99, t0_slots=S))
        small = c.alloc_buffer(4096)
        raises(errno.ERANGE, c.open_sequence, **geometry(), **region_params("t0", small))
        seqs = [c.open_sequence(**geometry()) for _ in range(64)]  # seqs_per_session default
        raises(errno.EMFILE, c.open_sequence, **geometry())
        for s in seqs:
            s.close()


def test_append_score_stat(kvtierd):
    with kvtier.connect(kvtierd.socket) as c, c.open_sequence(**geometry()) as s:
        assert s.token_bytes == L * 2 * H * D * 2 == 1024
        assert s.append(tokens(5)) == (5, 0)
        assert s.append(tokens(3).tobytes()) == (8, 5)  # bytes-like rows
        assert s.append(tokens(2)[:, :, :, :, ::-1]) == (10, 8)  # strided: a contiguous copy
        s.score_add(2, [0.5, 1.5, 2.0])
        st = s.stat()
        assert st.seq == s.id and st.n_tokens == 10 and sum(st.tier_count) == 10
        assert st.bytes_in == 10 * 1024 and st.pool_bytes >= 10 * 1024
        assert st.score_total == 4.0 and st.bytes_out == 0
        raises(errno.EINVAL, s.append, tokens(1)[:, :, :, :, :10])  # not whole tokens
        raises(errno.EINVAL, s.append, tokens(2), ntok=3)  # the daemon's check
        raises(errno.EINVAL, s.score_add, 9, [1.0, 1.0])  # past n
        raises(errno.EINVAL, s.score_add, 0, [-1.0])
        raises(errno.EINVAL, s.score_add, 0, [float("nan")])
        assert s.stat().score_total == 4.0  # refused adds change nothing


def test_append_torch_rows(kvtierd):
    import torch
    with kvtier.connect(kvtierd.socket) as c, c.open_sequence(**geometry(dtype="bf16")) as s:
        rows = torch.randn(4, L, 2, H, D, dtype=torch.bfloat16)
        assert s.append(rows) == (4, 0)
        assert s.append(rows.transpose(3, 4)) == (8, 4)  # non-contiguous: copied


def test_payload_larger_than_arena_is_e2big(kvtierd):
    with kvtier.connect(kvtierd.socket, arena_size=64 << 10) as c:
        with c.open_sequence(**geometry()) as s:
            raises(errno.E2BIG, s.append, tokens(65))  # 65 KiB of rows, 64 KiB arena
            assert s.append(tokens(64)) == (64, 0)


def test_pool_exhaustion(kvtierd_factory):
    d = kvtierd_factory(pool_size="16M")
    with kvtier.connect(d.socket) as c:
        with c.open_sequence(layers=8, kv_heads=8, head_dim=128, dtype="f16", delta=8) as s:
            rows = np.zeros((128, s.token_bytes), np.uint8)  # 4 MiB a call
            with pytest.raises(kvtier.KvtierError) as ei:
                for _ in range(8):
                    s.append(rows)
            assert ei.value.errno in (errno.ENOMEM, errno.EDQUOT)
            n = s.stat().n_tokens
            assert n % 128 == 0 and 0 < n < 8 * 128  # a refused APPEND adds nothing


def test_closed_sequence_and_daemon_enoent(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        s = c.open_sequence(**geometry())
        s2 = c.open_sequence(**geometry())
        # Closed behind the Sequence's back (async SEQ_CLOSE): the daemon answers ENOENT.
        e = c.get_sqe()
        e.opcode, e.seq, e.user_data = kvtier.abi.Op.SEQ_CLOSE, s2.id, 7
        c.submit()
        assert c.wait_cqe().res == 0
        raises(errno.ENOENT, s2.stat)
        raises(errno.ENOENT, s2.append, tokens(1))
        s.close()
        raises(errno.ENOENT, s.stat)  # refused here: the id may be reused
        s.close()


# ---- retier, fetch ----

def test_retier_moves_rows_into_t0_and_fetch_stages_t1(kvtierd):
    data = tokens(48, seed=3)
    with kvtier.connect(kvtierd.socket) as c:
        t0buf, stbuf = c.alloc_buffer(2 * L * S * ROW), c.alloc_buffer(2 * L * S * ROW)
        t0, st = region(t0buf), region(stbuf)
        s = c.open_sequence(**geometry(policy="tiered", hbm_frac=0.5, delta=8),
                            **region_params("t0", t0buf), **region_params("stage", stbuf))
        s.append(data)
        s.score_add(0, np.linspace(1, 2, 48))
        before = s.stat()
        raises(errno.ENOSPC, s.retier, out_len=72)  # no room for the changes
        assert s.stat() == before  # nothing changed
        r = s.retier()
        assert r.n_tokens == 48 and sum(r.tier_count) == 48 and r.tier_count[0] > 0
        assert r.n_changes == len(r.changes) > 0 and r.n_free == len(r.free_slots)
        assert r.nbytes == 72 + 8 * r.n_changes + 4 * r.n_free
        assert r.tier_count == s.stat().tier_count
        live = r.changes[r.changes["pos"] >= 0]
        assert len(live) == r.tier_count[0]
        for slot, pos in live:
            np.testing.assert_array_equal(t0[:, :, slot], data[pos])
        assert not set(r.free_slots) & set(live["slot"].tolist())
        # every T1 position, ascending, staged in that order
        f = s.fetch(kvtier.FetchFlag.T1)
        assert f.rows == r.tier_count[1] == len(f.positions)
        assert list(f.positions) == sorted(set(range(48)) - set(live["pos"].tolist()))
        for row, pos in enumerate(f.positions):
            np.testing.assert_array_equal(st[:, :, row], data[pos])
        assert s.stat().bytes_out > 0
        # one layer only, from a later staging row
        f1 = s.fetch(kvtier.FetchFlag.T1, layer0=1, nlayers=1, stage_row=S - f.rows)
        assert f1.rows == f.rows
        raises(errno.ENOSPC, s.fetch, kvtier.FetchFlag.T1, stage_row=S - 1, capacity=S)
        raises(errno.ENOSPC, s.fetch, kvtier.FetchFlag.T1, capacity=1)
        raises(errno.EINVAL, s.fetch, kvtier.FetchFlag.T1, layer0=L)
        raises(errno.EINVAL, s.fetch, positions=[48])
        raises(errno.EINVAL, s.fetch, 0)  # no tier named
        s.close()


def test_append_t0_errors(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        t0buf = c.alloc_buffer(2 * L * S * ROW)
        with c.open_sequence(**geometry(), **region_params("t0", t0buf)) as s:
            assert s.append_t0([0, 1]) == (2, 0)
            raises(errno.EBUSY, s.append_t0, [1])  # slot holds a position
            raises(errno.EINVAL, s.append_t0, [S])  # no such slot
            raises(errno.EINVAL, s.append_t0, [2, 2])
            raises(errno.EINVAL, s.append_t0, [-1])
            raises(errno.E2BIG, s.append_t0, range(2, 2 + 257))
        with c.open_sequence(**geometry()) as s:
            raises(errno.EINVAL, s.append_t0, [0])  # no T0 region
            raises(errno.EINVAL, s.fetch, positions=[0])  # no staging region


def test_evicted_position_fetch_is_enoent(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        stbuf = c.alloc_buffer(2 * L * S * ROW)
        with c.open_sequence(**geometry(policy="streaming", sinks=2, window=8, delta=4),
                             **region_params("stage", stbuf)) as s:
            s.append(tokens(40))
            r = s.retier()
            assert r.tier_count[3] > 0 and r.evicted_ratio > 0
            gone = 20  # neither a sink nor in the window
            raises(errno.ENOENT, s.fetch, positions=[gone])
            assert s.fetch(positions=[0, 39]).rows == 2


# ---- topk ----

def test_topk_probe_scans_the_best_groups(kvtierd):
    # A run of 200 keys along u (a passage on one topic) and one key far along u on its own
    # (position 3000): the exact top-8 and TOPK_F_FAST hold the lone key; a probe of one group
    # (16 keys at head_dim 64) scans only the run's best group, so its answer is that group's
    # exact top 8.
    n, U, k = 4096, 16, 8
    rng = np.random.default_rng(11)
    u = rng.standard_normal(D)
    u /= np.linalg.norm(u)
    keys = rng.standard_normal((n, L, 2, H, D))
    keys[1000:1200, :, 0] += 4.0 * u
    keys[3000, :, 0] += 8.0 * u
    keys = keys.astype(np.float16)
    q = np.tile(10.0 * u, (H, 1)).astype(np.float32)
    with kvtier.connect(kvtierd.socket) as c:
        with c.open_sequence(**geometry(policy="full", sinks=4, window=32,
                                        ret_update=U)) as s:
            s.append(keys)
            e = s.topk(1, k, q)
            f = s.topk(1, k, q, kvtier.TopkFlag.FAST)
            p = s.topk(1, k, q, kvtier.TopkFlag.FAST, probe=16)
            whole = s.topk(1, k, q, kvtier.TopkFlag.FAST, probe=1 << 20)  # past the zone
            for h in range(H):
                assert e.positions[h][0] == f.positions[h][0] == whole.positions[h][0] == 3000
                pos, score = p.head(h)
                assert len(pos) == k and 3000 not in pos
                g = (pos[0] - 4) // 16  # zone index 0 is position sinks = 4
                assert ((pos - 4) // 16 == g).all() and 1000 <= pos.min() and pos.max() < 1200
                group = np.arange(4 + 16 * g, 4 + 16 * (g + 1))
                exact = keys[group, 1, 0, h].astype(np.float32) @ q[h]
                want = group[np.argsort(-exact, kind="stable")[:k]]
                np.testing.assert_array_equal(pos, want)
                np.testing.assert_allclose(score, np.sort(exact)[::-1][:k], rtol=1e-4,
                                           atol=1e-3)
            raises(errno.EINVAL, s.topk, 1, k, q, 0, 64)  # probe without TOPK_F_FAST
            raises(errno.EINVAL, s.topk, 1, k, q, kvtier.TopkFlag.FAST, -1)
            # the same requests by mode (ABI 1.5's struct kvt_topk_req): the same answers
            for r, kw in ((e, dict(mode="exact")), (f, dict(mode="fast")),
                          (p, dict(mode="probe", probe=16)), (p, dict(mode=3, probe=16))):
                m = s.topk(1, k, q, **kw)
                np.testing.assert_array_equal(m.positions, r.positions)
                np.testing.assert_array_equal(m.scores, r.scores)
            # kvtierd's own refusals, with its reason
            err = raises(errno.EINVAL, s.topk, 1, k, q, mode="exact", probe=64)
            assert "probe 64 with mode EXACT" in err.daemon_message
            err = raises(errno.EINVAL, s.topk, 1, k, q, mode="probe")
            assert "KVT_TOPK_PROBE needs" in err.daemon_message
            err = raises(errno.EINVAL, s.topk, 1, k, q, mode=7)
            assert "mode 7 unknown" in err.daemon_message
            raises(errno.EINVAL, s.topk, 1, k, q, kvtier.TopkFlag.FAST, mode="fast")
            with pytest.raises(ValueError):
                s.topk(1, k, q, mode="sloppy")


def test_topk_scores_are_exact_dot_products(kvtierd):
    n, U = 300, 16
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((n, L, 2, H, D)).astype(np.float16)
    with kvtier.connect(kvtierd.socket) as c:
        with c.open_sequence(**geometry(policy="full", sinks=4, window=32, ret_update=U,
                                        q_heads=2 * H)) as s:
            s.append(keys)
            q = rng.standard_normal((2 * H, D)).astype(np.float32)
            r = s.topk(1, 8, q)
            assert r.stride == 8 and r.positions.shape == (H, 8) == r.scores.shape
            for h in range(H):
                pos, score = r.head(h)
                assert len(pos) == r.counts[h] == 8
                assert (np.diff(score) <= 0).all()  # descending
                qm = q[2 * h:2 * h + 2].mean(axis=0)  # the group's mean query
                exact = keys[pos, 1, 0, h].astype(np.float32) @ qm
                np.testing.assert_allclose(score, exact, rtol=1e-4, atol=1e-4)
                assert ((4 <= pos) & (pos < n - 32)).all()  # retrieval zone only
            u = s.topk(0, 4, q, kvtier.TopkFlag.UNION)
            assert u.stride == 8
            # TOPK_F_FAST scores the 16k keys of the best 1-bit estimates; with 16k past the
            # zone (256 keys here) that is every key: the exact answer, the same as the default
            for layer, k in ((0, 16), (1, 20)):
                e, f = s.topk(layer, k, q), s.topk(layer, k, q, kvtier.TopkFlag.FAST)
                np.testing.assert_array_equal(f.positions, e.positions)
                np.testing.assert_array_equal(f.scores, e.scores)
            raises(errno.EINVAL, s.topk, 0, 4, q, kvtier.TopkFlag.FAST | kvtier.TopkFlag.ESTIMATE)
            raises(errno.ERANGE, s.topk, 0, n, q)  # k beyond the zone: attend densely
            raises(errno.EINVAL, s.topk, 0, 0, q)
            raises(errno.EINVAL, s.topk, 0, 4, q[:1])  # query length
            raises(errno.EINVAL, s.topk, L, 4, q)
            bad = q.copy()
            bad[0, 0] = np.inf
            raises(errno.EINVAL, s.topk, 0, 4, bad)
        with c.open_sequence(**geometry()) as s:
            s.append(tokens(4))
            raises(errno.EINVAL, s.topk, 0, 1, np.zeros(H * D, np.float32))  # no retrieval


# ---- asynchronous interface ----

def test_async_ring(kvtierd):
    with kvtier.connect(kvtierd.socket, sq_entries=8) as c:
        assert c.peek_cqe() is None and c.inflight == 0
        raises(errno.EAGAIN, c.wait_cqe)
        for ud in (11, 12, 13):
            e = c.get_sqe()
            assert e.opcode == 0 and e.user_data == 0  # handed out zeroed
            e.opcode, e.user_data = kvtier.abi.Op.NOP, ud
        bad = c.get_sqe()
        bad.opcode, bad.user_data, bad.flags = kvtier.abi.Op.NOP, 14, 0x80  # unknown SQE flag
        assert c.submit() == 4 and c.inflight == 4
        got = {}
        while len(got) < 4:
            cqe = c.wait_cqe()
            got[cqe.user_data] = cqe.res
        assert got == {11: 0, 12: 0, 13: 0, 14: -errno.EINVAL}
        assert c.inflight == 0 and c.submit() == 0
        # an async SEQ_STAT with its output in the arena
        s = c.open_sequence(**geometry())
        s.append(tokens(3))
        e = c.get_sqe()
        e.opcode, e.seq, e.arena_off, e.arena_len = kvtier.abi.Op.SEQ_STAT, s.id, 4096, 112
        c.submit()
        assert c.wait_cqe().res == 112
        st = kvtier.abi.SeqStatC.from_buffer_copy(c.arena()[4096:4096 + 112].tobytes())
        assert (st.seq, st.n_tokens) == (s.id, 3)
        # a pipeline built with the prep helpers: APPEND 2 tokens, SCORE_ADD, SEQ_STAT
        arena = c.arena()
        arena[8192:8192 + 2 * s.token_bytes] = tokens(2).view(np.uint8).reshape(-1)
        arena[16384:16384 + 8] = np.array([1.5, 2.5], np.float32).view(np.uint8)
        ops = [("prep_append", (s.id, 8192, 2 * s.token_bytes, 2)),
               ("prep_score_add", (s.id, 3, 16384, 2)), ("prep_seq_stat", (s.id, 0))]
        for ud, (prep, args) in enumerate(ops, 100):
            e = c.get_sqe()
            getattr(e, prep)(*args)
            e.user_data = ud
        c.submit()
        res = sorted((cqe.user_data, cqe.res, cqe.aux[0]) for cqe in
                     (c.wait_cqe() for _ in ops))
        assert res == [(100, 5, 3), (101, 0, 0), (102, 112, 0)]
        st = kvtier.abi.SeqStatC.from_buffer_copy(arena[:112].tobytes())
        assert (st.n_tokens, st.score_total) == (5, 4.0)
        # SQ full: get_sqe() says so with None
        sqes = [c.get_sqe() for _ in range(8)]
        assert all(x is not None for x in sqes) and c.get_sqe() is None
        for x in sqes:
            x.opcode = kvtier.abi.Op.NOP
        c.submit()
        for _ in sqes:
            c.wait_cqe()
        # a blocking call with payload refuses while async ops are in flight
        c.get_sqe().opcode = kvtier.abi.Op.NOP
        c.submit()
        raises(errno.EBUSY, s.append, tokens(1))
        c.wait_cqe()
        s.append(tokens(1))


# ---- a lost daemon ----

CHILD = textwrap.dedent("""
    import errno, sys, kvtier
    c = kvtier.connect(sys.argv[1])
    s = c.open_sequence(layers=2, kv_heads=2, head_dim=64, delta=8)
    b = c.alloc_buffer(1 << 16)
    s2 = c.open_sequence(layers=2, kv_heads=2, head_dim=64, delta=8, t0_buf_id=b,
                         t0_slots=16, t0_slot_stride=256, t0_kv_stride=4096,
                         t0_layer_stride=8192, window=2, sinks=0)
    try:
        b.free()
    except kvtier.KvtierError as e:
        assert e.errno == errno.EBUSY and e.daemon_message, e
    print("ready", flush=True)
    sys.stdin.readline()
    print("calling", flush=True)
    for call in (s.stat, c.nop, lambda: c.alloc_buffer(4096)):
        try:
            call()
            print("no error")
        except kvtier.KvtierError as e:
            print(errno.errorcode[e.errno], repr(e.daemon_message), flush=True)
""")


def test_daemon_killed_mid_call_raises_econnreset(kvtierd, python_env):
    """The daemon is stopped, a call waits on it, the daemon is SIGKILLed: the call raises
    ECONNRESET (the subprocess deadline catches a hang; it measures nothing), and so do the
    calls after it, without a stale message from an earlier refusal."""
    p = subprocess.Popen([PYTHON, "-c", CHILD, kvtierd.socket], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=python_env)
    try:
        assert p.stdout.readline() == "ready\n", p.stderr.read()
        kvtierd.kill(signal.SIGSTOP)  # the next call cannot complete
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "calling\n"
        kvtierd.kill(signal.SIGKILL)
        p.wait(timeout=120)  # its few lines fit the pipe; read them through the same buffer
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert out.splitlines() == ["ECONNRESET ''"] * 3


def test_views_keep_their_buffer_and_session_alive(kvtierd, python_env):
    """A view outlives every name for its buffer and client: the memory stays mapped (the
    child would crash on an unmapped page) and the session stays open until the view goes."""
    child = textwrap.dedent("""
        import gc, sys, kvtier
        def make():
            c = kvtier.connect(sys.argv[1])
            return c.alloc_buffer(1 << 20).array(), c.arena()
        view, arena = make()
        gc.collect()
        view[:] = 7
        arena[:16] = 1
        print(int(view.sum()), int(arena[:16].sum()), flush=True)
        sys.stdin.readline()
        del view, arena
        gc.collect()
        print("dropped", flush=True)
        sys.stdin.readline()
    """)
    p = subprocess.Popen([PYTHON, "-c", child, kvtierd.socket], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=python_env)
    try:
        assert p.stdout.readline() == f"{7 << 20} 16\n", p.stderr.read()
        assert kvtierd.doc("status")["sessions"] == 1
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline() == "dropped\n"
        assert kvtierd.wait_sessions(0) == 0  # the client went with its last view
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=120) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_session_limit_is_eusers(kvtierd):
    """sessions_per_uid (64 by default): the next connect is refused with kvtierd's reason,
    and a freed place is taken again."""
    clients = []
    try:
        with pytest.raises(kvtier.KvtierError) as ei:
            for _ in range(65):
                clients.append(kvtier.connect(kvtierd.socket, arena_size=64 << 10,
                                              sq_entries=8))
        assert ei.value.errno == errno.EUSERS and len(clients) == 64
        assert ei.value.daemon_message
        clients.pop().close()
        kvtierd.wait_sessions(63)
        clients.append(kvtier.connect(kvtierd.socket, arena_size=64 << 10, sq_entries=8))
    finally:
        for c in clients:
            c.close()


# ---- size arguments, views after close, threads, fork ----

def test_retier_refuses_an_out_len_out_of_range(kvtierd):
    """out_len=-1 once wrapped through c_uint64 to 2**64-1: libkvtier asked for the whole arena
    and copied the reply into the 72-byte buffer the binding had made for it."""
    data = tokens(48, seed=3)
    with kvtier.connect(kvtierd.socket) as c:
        t0buf = c.alloc_buffer(2 * L * S * ROW)
        s = c.open_sequence(**geometry(policy="tiered", hbm_frac=0.5, delta=8),
                            **region_params("t0", t0buf))
        s.append(data)
        s.score_add(0, np.linspace(1, 2, 48))
        before = s.stat()
        for bad in (-1, -72, 1 << 64, 2.5, "72"):
            e = raises(errno.EINVAL, s.retier, out_len=bad)
            assert "out_len" in e.daemon_message
        assert s.stat() == before  # nothing reached kvtierd
        r = s.retier(out_len=1 << 40)  # past the arena: bounded by it, not refused
        assert r.n_changes > 0 and 72 < r.nbytes <= (1 << 40)


def test_views_stay_readable_after_close_and_free(kvtierd, python_env):
    """A Buffer.array() or Client.arena() view read after free() or close() once touched
    unmapped memory (SIGSEGV); now the view maps the pages itself."""
    child = textwrap.dedent("""
        import sys, kvtier
        c = kvtier.connect(sys.argv[1])
        a, b = c.alloc_buffer(1 << 20), c.alloc_buffer(1 << 16)
        va, vb, arena = a.array(), b.array(), c.arena()
        va[:] = 3
        vb[:] = 4
        arena[:16] = 5
        b.free()
        assert int(vb.sum()) == 4 << 16
        vb[:] = 6
        c.close()
        assert int(va.sum()) == 3 << 20 and int(arena[:16].sum()) == 80
        va[:] = 1
        print(int(va.sum()), int(vb.sum()), flush=True)
        try:
            a.array()
        except kvtier.KvtierError as e:
            print("EBADF" if e.errno == 9 else e, flush=True)
    """)
    p = subprocess.run([PYTHON, "-c", child, kvtierd.socket], capture_output=True, text=True,
                       env=python_env, timeout=120)
    assert p.returncode == 0, f"child died: {p.returncode} {p.stderr}"
    assert p.stdout == f"{1 << 20} {6 << 16}\nEBADF\n"


def test_threads_share_one_client(kvtierd, python_env):
    """Four threads on one Client once hung (each blocking call reaped the others'
    completions and the ring indices raced); calls now take the client's lock in turn. Run in
    a child so that a hang fails the test instead of stalling the suite."""
    child = textwrap.dedent("""
        import sys, threading, numpy as np, kvtier
        L, H, D, N = 2, 2, 64, 200
        c = kvtier.connect(sys.argv[1])
        row = np.ones((1, L, 2, H, D), np.float16)
        errors = []
        def work(i):
            try:
                s = c.open_sequence(layers=L, kv_heads=H, head_dim=D, dtype="f16", delta=8,
                                    policy="full")
                for t in range(N):
                    assert s.append(row) == (t + 1, t)
                    c.nop()
                    assert s.stat().n_tokens == t + 1
                s.close()
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        c.close()
        print(errors or "ok", flush=True)
    """)
    p = subprocess.run([PYTHON, "-c", child, kvtierd.socket], capture_output=True, text=True,
                       env=python_env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "ok\n"


def test_client_refuses_use_after_fork(kvtierd):
    """A child's calls on its parent's Client fail with ECHILD and say why; the parent's
    sequence gets none of the child's tokens."""
    with kvtier.connect(kvtierd.socket) as c:
        s = c.open_sequence(**geometry(policy="full"))
        row = tokens(1)
        assert s.append(row) == (1, 0)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    s.append(row)
                except kvtier.KvtierError as e:
                    if e.errno == errno.ECHILD and "fork()" in str(e):
                        code = 0
                try:
                    c.nop()
                    code = 2
                except kvtier.KvtierError as e:
                    code = code or (0 if e.errno == errno.ECHILD else 3)
                c.close()  # the child's copy only
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert s.append(row) == (2, 1)
        assert s.stat().n_tokens == 2
