# SPDX-License-Identifier: MIT
"""A refused op says why: KvtierError carries kvtierd's reason ("OPNAME: what was wrong"),
blocking calls through kvt_last_error(), asynchronous ones through Client.op_error(); the
daemon's debug log has the same reason with the session."""
from __future__ import annotations

import errno

import numpy as np
import pytest

import kvtier

L, H, D = 2, 1, 64


def geometry(**kw):
    p = dict(layers=L, kv_heads=H, head_dim=D, dtype="f32", delta=8, policy="full")
    p.update(kw)
    return p


def refused(code, fn, *a, **kw):
    with pytest.raises(kvtier.KvtierError) as ei:
        fn(*a, **kw)
    e = ei.value
    assert e.errno == code, f"{e} is not {errno.errorcode[code]}"
    assert e.daemon_message in str(e)
    return e


@pytest.fixture
def debug_kvtierd(kvtierd_factory):
    return kvtierd_factory(["--log-level", "debug"])


def test_blocking_ops_carry_the_reason(debug_kvtierd):
    with kvtier.connect(debug_kvtierd.socket) as c:
        s = c.open_sequence(**geometry())
        e = refused(errno.EINVAL, s.fetch, kvtier.FetchFlag.T1)
        assert e.daemon_message == ("FETCH: sequence 1 has no staging region (open the "
                                    "sequence with stage_buf_id)")
        row = np.zeros((1, L, 2, H, D), np.float32)
        e = refused(errno.EINVAL, s.append, row, ntok=2)
        assert e.daemon_message.startswith("APPEND: arena_len"), e
        s.append(row)
        e = refused(errno.EINVAL, s.score_add, 0, [-1.0])
        assert e.daemon_message.startswith("SCORE_ADD: value 0 is -1"), e
        e = refused(errno.EINVAL, s.topk, 0, 1, np.zeros(H * D, np.float32))
        assert e.daemon_message.startswith("TOPK: sequence 1 has no retrieval"), e
        e = refused(errno.EINVAL, c.open_sequence, **geometry(head_dim=0))
        assert e.daemon_message == "SEQ_OPEN: head_dim out of range"
        c.nop()
        log = debug_kvtierd.log.read_text(errors="replace")
        for why in ("FETCH refused", "no staging region", "TOPK refused", "no retrieval",
                    "SEQ_OPEN refused", "head_dim out of range"):
            assert f"session {c.session_id} (" in log and why in log, why
        lines = [ln for ln in log.splitlines() if f"session {c.session_id} (" in ln
                 and " refused " in ln]
        assert len(lines) == 5, lines


def test_async_op_error(kvtierd):
    with kvtier.connect(kvtierd.socket) as c:
        e = c.get_sqe()
        e.prep_nop()
        e.opcode = 200
        e.user_data = 42
        c.submit()
        cqe = c.wait_cqe()
        assert (cqe.user_data, cqe.res) == (42, -errno.EINVAL)
        msg = c.op_error(42)
        assert msg.startswith("OPCODE 200: unknown opcode 200"), msg
        assert c.op_error(43) is None
        c.nop()
        assert c.op_error(42) == msg  # a success leaves the record
