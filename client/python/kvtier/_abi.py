# SPDX-License-Identifier: MIT
"""ctypes mirrors of the libkvtier structs and constants (client/include/kvtier.h, proto/*.h).

Every struct here is compared field by field with the C headers by tests/test_abi.py, which
compiles a probe against them: a layout that drifts fails the tests, never a user's data.
"""
from __future__ import annotations

import ctypes
from ctypes import (
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
)

ABI_MAJOR = 1
"""The KVT_ABI_MAJOR these mirrors follow; libkvtier must report the same major."""
ABI_MINOR = 4
"""The KVT_ABI_MINOR these mirrors follow (a newer minor only adds)."""
OP_ERR_MSG_LEN = 224
"""Bytes of struct kvt_op_err's message, NUL included."""

# Opcodes (KVT_OP_*).
OP_NOP = 0
OP_SEQ_OPEN = 1
OP_SEQ_CLOSE = 2
OP_APPEND = 3
OP_SCORE_ADD = 4
OP_RETIER = 5
OP_FETCH = 6
OP_TOPK = 7
OP_SEQ_STAT = 8
OP_NS_OPEN = 9
OP_NS_CLOSE = 10
OP_LOOKUP = 11
OP_PUBLISH = 12

DTYPE_F16 = 0
DTYPE_BF16 = 1
DTYPE_F32 = 2

POLICY_TIERED = 0
POLICY_H2O = 1
POLICY_STREAMING = 2
POLICY_FULL = 3

SCORE_SUM = 0
SCORE_MEAN = 1

MAX_LAYERS = 256
MAX_KV_HEADS = 64
MAX_HEAD_DIM = 256

T2_F_KEY_CHANNEL = 1 << 0
T2_KEY_BLOCK = 32
APPEND_F_T0 = 1 << 0
FETCH_F_T1 = 1 << 0
FETCH_F_T2 = 1 << 1
FETCH_F_LIST = 1 << 2
TOPK_F_UNION = 1 << 0
TOPK_F_FETCH = 1 << 1
TOPK_F_ESTIMATE = 1 << 2
TOPK_F_FAST = 1 << 3
TOPK_FAST_X = 16
TOPK_PROBE_X = 4
LOOKUP_F_PIN = 1 << 0

# Prefix blocks (ABI 1.2).
NS_NAME_LEN = 64
BLOCK_TOKENS_DEFAULT = 16
BLOCK_TOKENS_MAX = 1024
MAX_NS = 16

# Control socket (proto/kvt_ctl.h).
CTL_MAX_MSG = 262144
CTL_ERROR = 3
CTL_STATUS = 16
CTL_CLIENTS = 17
CTL_SEQS = 18
CTL_JSON = 19
CTL_BLOCKS = 23

DEFAULT_SOCKET = "/run/kvtier/kvtierd.sock"


class Opts(ctypes.Structure):
    """struct kvt_opts: connection options."""

    _fields_ = [
        ("size", c_uint32),
        ("sq_entries", c_uint32),
        ("cq_entries", c_uint32),
        ("spin_us", c_uint32),
        ("arena_size", c_uint64),
        ("name", c_char_p),
        ("abi_major", c_uint32),
        ("reserved", c_uint32),
    ]


class _SqeCount(ctypes.Union):
    _fields_ = [("count", c_uint32), ("ntok", c_uint32), ("npos", c_uint32), ("k", c_uint32),
                ("nkeys", c_uint32), ("prefix_blocks", c_uint32)]


class _SqeArg0(ctypes.Union):
    _fields_ = [("arg0", c_uint64), ("first_pos", c_uint64), ("layer0", c_uint64),
                ("layer", c_uint64), ("ns", c_uint64)]


class _SqeArg1(ctypes.Union):
    _fields_ = [("arg1", c_uint64), ("nlayers", c_uint64), ("out_off", c_uint64)]


class _SqeArg2(ctypes.Union):
    _fields_ = [("arg2", c_uint32), ("stage_row", c_uint32), ("out_len", c_uint32)]


class _SqeArg3(ctypes.Union):
    _fields_ = [("arg3", c_uint32), ("probe", c_uint32), ("reserved", c_uint32)]


class Sqe(ctypes.Structure):
    """struct kvt_sqe: one submission entry (64 bytes), filled in place in the ring.

    The per-opcode fields have the header's names for each opcode (``ntok``, ``npos``, ``k``,
    ``nkeys``, ``prefix_blocks``; ``first_pos``, ``layer0``, ``layer``, ``ns``; ``nlayers``,
    ``out_off``; ``stage_row``, ``out_len``; ``probe``) besides the generic ``count``,
    ``arg0``, ``arg1``, ``arg2``, ``arg3``. The ``prep_*`` methods are kvtier.h's kvt_prep_*(): each fills every
    field but user_data and stamp."""

    _anonymous_ = ("_count", "_arg0", "_arg1", "_arg2", "_arg3")
    _fields_ = [
        ("opcode", c_uint8),
        ("flags", c_uint8),
        ("op_flags", c_uint16),
        ("seq", c_uint32),
        ("user_data", c_uint64),
        ("arena_off", c_uint64),
        ("arena_len", c_uint32),
        ("_count", _SqeCount),
        ("_arg0", _SqeArg0),
        ("_arg1", _SqeArg1),
        ("_arg2", _SqeArg2),
        ("buf_id", c_uint32),
        ("stamp", c_uint32),
        ("_arg3", _SqeArg3),
    ]

    def prep_rw(self, opcode: int, seq: int, op_flags: int, arena_off: int, arena_len: int,
                count: int, arg0: int, arg1: int, arg2: int) -> None:
        """kvt_prep_rw(): every field but user_data and stamp."""
        self.opcode, self.flags, self.op_flags, self.seq = opcode, 0, op_flags, seq
        self.arena_off, self.arena_len = arena_off, arena_len & 0xFFFFFFFF
        self.count, self.arg0, self.arg1, self.arg2 = count, arg0, arg1, arg2
        self.buf_id = self.arg3 = 0

    def prep_nop(self) -> None:
        """kvt_prep_nop(): a round trip with no work."""
        self.prep_rw(OP_NOP, 0, 0, 0, 0, 0, 0, 0, 0)

    def prep_seq_open(self, params_off: int) -> None:
        """kvt_prep_seq_open(): a struct kvt_seq_params at arena offset @params_off (with a
        CUDA buffer's Buffer.offset added to its base offsets). CQE res: the sequence id."""
        self.prep_rw(OP_SEQ_OPEN, 0, 0, params_off, ctypes.sizeof(SeqParams), 0, 0, 0, 0)

    def prep_seq_open_prefix(self, params_off: int, ns: int, prefix_blocks: int) -> None:
        """kvt_prep_seq_open_prefix(): SEQ_OPEN in namespace @ns (0: none) starting with
        @prefix_blocks blocks pinned there by the last pinning LOOKUP."""
        self.prep_rw(OP_SEQ_OPEN, 0, 0, params_off, ctypes.sizeof(SeqParams), prefix_blocks,
                     ns, 0, 0)

    def prep_ns_open(self, params_off: int) -> None:
        """kvt_prep_ns_open(): a struct kvt_ns_params at arena offset @params_off. CQE res: the
        namespace id; aux[0]: block_tokens in effect."""
        self.prep_rw(OP_NS_OPEN, 0, 0, params_off, ctypes.sizeof(NsParams), 0, 0, 0, 0)

    def prep_ns_close(self, ns: int) -> None:
        """kvt_prep_ns_close(): drop the session's handle of @ns and its pins."""
        self.prep_rw(OP_NS_CLOSE, 0, 0, 0, 0, 0, ns, 0, 0)

    def prep_lookup(self, ns: int, flags: int, keys_off: int, nkeys: int) -> None:
        """kvt_prep_lookup(): how many of the @nkeys block keys at @keys_off (8-byte aligned)
        lead in @ns; LOOKUP_F_PIN pins them for SEQ_OPEN."""
        self.prep_rw(OP_LOOKUP, 0, flags, keys_off, nkeys * ctypes.sizeof(BlockKey), nkeys,
                     ns, 0, 0)

    def prep_publish(self, seq: int, keys_off: int, nkeys: int) -> None:
        """kvt_prep_publish(): offer the first @nkeys blocks of @seq, keyed by the keys at
        @keys_off, to its namespace. CQE res: blocks held; aux[0] new, aux[1] found."""
        self.prep_rw(OP_PUBLISH, seq, 0, keys_off, nkeys * ctypes.sizeof(BlockKey), nkeys,
                     0, 0, 0)

    def prep_seq_close(self, seq: int) -> None:
        """kvt_prep_seq_close()."""
        self.prep_rw(OP_SEQ_CLOSE, seq, 0, 0, 0, 0, 0, 0, 0)

    def prep_append(self, seq: int, rows_off: int, rows_len: int, ntok: int) -> None:
        """kvt_prep_append(): @ntok tokens' rows, @rows_len bytes at arena offset @rows_off.
        CQE res: the new n; aux[0]: the first position."""
        self.prep_rw(OP_APPEND, seq, 0, rows_off, rows_len, ntok, 0, 0, 0)

    def prep_append_t0(self, seq: int, slots_off: int, ntok: int) -> None:
        """kvt_prep_append_t0(): @ntok tokens already in the T0 slots whose u32 ids are at
        arena offset @slots_off."""
        self.prep_rw(OP_APPEND, seq, APPEND_F_T0, slots_off, ntok * 4, ntok, 0, 0, 0)

    def prep_score_add(self, seq: int, first_pos: int, values_off: int, n: int) -> None:
        """kvt_prep_score_add(): score[first_pos + i] += the @n f32 at @values_off."""
        self.prep_rw(OP_SCORE_ADD, seq, 0, values_off, n * 4, n, first_pos, 0, 0)

    def prep_seq_stat(self, seq: int, out_off: int) -> None:
        """kvt_prep_seq_stat(): struct kvt_seq_stat written at arena offset @out_off."""
        self.prep_rw(OP_SEQ_STAT, seq, 0, out_off, ctypes.sizeof(SeqStatC), 0, 0, 0, 0)

    def prep_retier(self, seq: int, out_off: int, out_len: int) -> None:
        """kvt_prep_retier(): the answer at @out_off, @out_len bytes (retier_out_size())."""
        self.prep_rw(OP_RETIER, seq, 0, out_off, out_len, 0, 0, 0, 0)

    def prep_fetch(self, seq: int, flags: int, layer0: int, nlayers: int, stage_row: int,
                   pos_off: int, npos: int) -> None:
        """kvt_prep_fetch(): stage layers [@layer0, @layer0 + @nlayers) from staging row
        @stage_row; @npos u32 positions at @pos_off (the list with FETCH_F_LIST, else room
        for the positions staged)."""
        self.prep_rw(OP_FETCH, seq, flags, pos_off, npos * 4,
                     npos if flags & FETCH_F_LIST else 0, layer0, nlayers, stage_row)

    def prep_topk(self, seq: int, layer: int, k: int, flags: int, query_off: int, q_len: int,
                  out_off: int, out_len: int) -> None:
        """kvt_prep_topk(): top-@k of @layer for the @q_len f32 query at @query_off; the
        answer at @out_off (8-byte aligned), @out_len bytes (topk_out_size())."""
        self.prep_rw(OP_TOPK, seq, flags, query_off, q_len * 4, k, layer, out_off, out_len)


def retier_out_size(t0_slots: int) -> int:
    """KVT_RETIER_OUT_SIZE(): bytes that always hold a RETIER answer."""
    return 72 + t0_slots * 2 * 8


def topk_out_size(kv_heads: int, stride: int) -> int:
    """KVT_TOPK_OUT_SIZE(): bytes of a TOPK answer."""
    return kv_heads * 4 + kv_heads * stride * 8


class Cqe(ctypes.Structure):
    """struct kvt_cqe: one completion (32 bytes); ``res`` is >= 0 or a negative errno."""

    _fields_ = [
        ("user_data", c_uint64),
        ("res", c_int32),
        ("stamp", c_uint32),
        ("aux", c_uint64 * 2),
    ]


class SeqParams(ctypes.Structure):
    """struct kvt_seq_params: the SEQ_OPEN payload (160 bytes)."""

    _fields_ = [
        ("size", c_uint32),
        ("layers", c_uint16),
        ("kv_heads", c_uint16),
        ("head_dim", c_uint16),
        ("dtype", c_uint8),
        ("policy", c_uint8),
        ("score_mode", c_uint8),
        ("protect_prompt", c_uint8),
        ("q_heads", c_uint16),
        ("delta", c_uint32),
        ("sinks", c_uint32),
        ("window", c_uint32),
        ("prompt_len", c_uint32),
        ("hbm_frac", c_float),
        ("evict_frac", c_float),
        ("t2_frac", c_float),
        ("max_tokens", c_uint32),
        ("t0_buf_id", c_uint32),
        ("t0_slots", c_uint32),
        ("t0_base_off", c_uint64),
        ("t0_slot_stride", c_uint64),
        ("t0_layer_stride", c_uint64),
        ("t0_kv_stride", c_uint64),
        ("stage_buf_id", c_uint32),
        ("stage_slots", c_uint32),
        ("stage_base_off", c_uint64),
        ("stage_slot_stride", c_uint64),
        ("stage_layer_stride", c_uint64),
        ("stage_kv_stride", c_uint64),
        ("ret_update", c_uint32),
        ("ret_flags", c_uint32),
        ("t2_flags", c_uint32),
        ("reserved0", c_uint32),
        ("reserved", c_uint64 * 2),
    ]


class SlotChange(ctypes.Structure):
    """struct kvt_slot_change: a T0 slot and the position now in it (-1: free)."""

    _fields_ = [("slot", c_uint32), ("pos", c_int32)]


class RetierResultC(ctypes.Structure):
    """struct kvt_retier_result: the head of a RETIER answer."""

    _fields_ = [
        ("size", c_uint32),
        ("n_changes", c_uint32),
        ("n_free", c_uint32),
        ("evicted_ratio", c_float),
        ("n_tokens", c_uint64),
        ("tier_count", c_uint64 * 4),
        ("reserved", c_uint64 * 2),
    ]


class DriverOpts(ctypes.Structure):
    """struct kvt_driver_opts (kvtier.h): the options of kvt_driver_open()."""

    _fields_ = [
        ("size", c_uint32),
        ("flags", c_uint32),
        ("ns", c_uint32),
        ("prefix_blocks", c_uint32),
        ("reserved", c_uint64 * 2),
    ]


class DriverStats(ctypes.Structure):
    """struct kvt_driver_stats (kvtier.h): what a tiering driver has done."""

    _fields_ = [
        ("size", c_uint32),
        ("seq", c_uint32),
        ("n", c_uint32),
        ("view", c_uint32),
        ("t0_slots", c_uint32),
        ("stage_slots", c_uint32),
        ("prefix_tokens", c_uint32),
        ("last_retier_n", c_uint32),
        ("first_evict_n", c_uint32),
        ("reserved", c_uint32),
        ("tier_count", c_uint64 * 4),
        ("steps", c_uint64),
        ("score_adds", c_uint64),
        ("retiers", c_uint64),
        ("fetches", c_uint64),
        ("rows_staged", c_uint64),
        ("submits", c_uint64),
        ("retier_ns", c_uint64),
        ("fetch_ns", c_uint64),
        ("reap_ns", c_uint64),
    ]


class SeqStatC(ctypes.Structure):
    """struct kvt_seq_stat: SEQ_STAT output."""

    _fields_ = [
        ("size", c_uint32),
        ("seq", c_uint32),
        ("n_tokens", c_uint64),
        ("tier_count", c_uint64 * 4),
        ("pool_bytes", c_uint64),
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
        ("score_total", c_double),
        ("reserved", c_uint64 * 4),
    ]


class NsParams(ctypes.Structure):
    """struct kvt_ns_params: the NS_OPEN payload (96 bytes): a namespace of prefix blocks,
    named by the model's identity, with the geometry and dtype of its sequences."""

    _fields_ = [
        ("size", c_uint32),
        ("layers", c_uint16),
        ("kv_heads", c_uint16),
        ("head_dim", c_uint16),
        ("dtype", c_uint8),
        ("reserved0", c_uint8),
        ("block_tokens", c_uint32),
        ("flags", c_uint32),
        ("reserved", c_uint32 * 3),
        ("name", c_char * NS_NAME_LEN),
    ]


class BlockKey(ctypes.Structure):
    """struct kvt_block_key: a 128-bit block key (XXH3-128, chained by kvt_block_keys())."""

    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]


class CtlHdr(ctypes.Structure):
    """struct kvt_ctl_hdr: the header of every control-socket message."""

    _fields_ = [("type", c_uint32), ("len", c_uint32), ("id", c_uint64)]


class CtlError(ctypes.Structure):
    """struct kvt_ctl_error: the daemon's refusal of a control request."""

    _fields_ = [
        ("hdr", CtlHdr),
        ("err", c_int32),
        ("reserved0", c_uint32),
        ("msg", c_char * 240),
    ]


class OpErr(ctypes.Structure):
    """struct kvt_op_err (ABI 1.1): why the session's most recent refused op was refused, in
    the shared region at kvt_region_hdr.err_off; libkvtier reads it (kvt_op_error())."""

    _fields_ = [
        ("gen", c_uint32),
        ("res", c_int32),
        ("user_data", c_uint64),
        ("opcode", c_uint8),
        ("reserved0", c_uint8 * 3),
        ("seq", c_uint32),
        ("reserved", c_uint64 * 1),
        ("msg", c_char * OP_ERR_MSG_LEN),
    ]


STRUCTS: dict[str, type[ctypes.Structure]] = {
    "kvt_opts": Opts,
    "kvt_sqe": Sqe,
    "kvt_cqe": Cqe,
    "kvt_seq_params": SeqParams,
    "kvt_slot_change": SlotChange,
    "kvt_retier_result": RetierResultC,
    "kvt_seq_stat": SeqStatC,
    "kvt_ctl_hdr": CtlHdr,
    "kvt_ctl_error": CtlError,
    "kvt_op_err": OpErr,
    "kvt_ns_params": NsParams,
    "kvt_block_key": BlockKey,
    "kvt_driver_opts": DriverOpts,
    "kvt_driver_stats": DriverStats,
}
"""C struct name -> its mirror, for the layout probe."""

CONSTANTS: dict[str, int] = {
    "KVT_ABI_MAJOR": ABI_MAJOR,
    "KVT_ABI_MINOR": ABI_MINOR,
    "KVT_OP_ERR_MSG_LEN": OP_ERR_MSG_LEN,
    "KVT_OP_NOP": OP_NOP,
    "KVT_OP_SEQ_OPEN": OP_SEQ_OPEN,
    "KVT_OP_SEQ_CLOSE": OP_SEQ_CLOSE,
    "KVT_OP_APPEND": OP_APPEND,
    "KVT_OP_SCORE_ADD": OP_SCORE_ADD,
    "KVT_OP_RETIER": OP_RETIER,
    "KVT_OP_FETCH": OP_FETCH,
    "KVT_OP_TOPK": OP_TOPK,
    "KVT_OP_SEQ_STAT": OP_SEQ_STAT,
    "KVT_OP_NS_OPEN": OP_NS_OPEN,
    "KVT_OP_NS_CLOSE": OP_NS_CLOSE,
    "KVT_OP_LOOKUP": OP_LOOKUP,
    "KVT_OP_PUBLISH": OP_PUBLISH,
    "KVT_OP__COUNT": OP_PUBLISH + 1,
    "KVT_DTYPE_F16": DTYPE_F16,
    "KVT_DTYPE_BF16": DTYPE_BF16,
    "KVT_DTYPE_F32": DTYPE_F32,
    "KVT_DTYPE__COUNT": DTYPE_F32 + 1,
    "KVT_POLICY_TIERED": POLICY_TIERED,
    "KVT_POLICY_H2O": POLICY_H2O,
    "KVT_POLICY_STREAMING": POLICY_STREAMING,
    "KVT_POLICY_FULL": POLICY_FULL,
    "KVT_POLICY__COUNT": POLICY_FULL + 1,
    "KVT_SCORE_SUM": SCORE_SUM,
    "KVT_SCORE_MEAN": SCORE_MEAN,
    "KVT_SCORE__COUNT": SCORE_MEAN + 1,
    "KVT_MAX_LAYERS": MAX_LAYERS,
    "KVT_MAX_KV_HEADS": MAX_KV_HEADS,
    "KVT_MAX_HEAD_DIM": MAX_HEAD_DIM,
    "KVT_T2_F_KEY_CHANNEL": T2_F_KEY_CHANNEL,
    "KVT_T2_KEY_BLOCK": T2_KEY_BLOCK,
    "KVT_APPEND_F_T0": APPEND_F_T0,
    "KVT_FETCH_F_T1": FETCH_F_T1,
    "KVT_FETCH_F_T2": FETCH_F_T2,
    "KVT_FETCH_F_LIST": FETCH_F_LIST,
    "KVT_TOPK_F_UNION": TOPK_F_UNION,
    "KVT_TOPK_F_FETCH": TOPK_F_FETCH,
    "KVT_TOPK_F_ESTIMATE": TOPK_F_ESTIMATE,
    "KVT_TOPK_F_FAST": TOPK_F_FAST,
    "KVT_TOPK_FAST_X": TOPK_FAST_X,
    "KVT_TOPK_PROBE_X": TOPK_PROBE_X,
    "KVT_LOOKUP_F_PIN": LOOKUP_F_PIN,
    "KVT_NS_NAME_LEN": NS_NAME_LEN,
    "KVT_BLOCK_TOKENS_DEFAULT": BLOCK_TOKENS_DEFAULT,
    "KVT_BLOCK_TOKENS_MAX": BLOCK_TOKENS_MAX,
    "KVT_MAX_NS": MAX_NS,
    "KVT_CTL_MAX_MSG": CTL_MAX_MSG,
    "KVT_CTL_ERROR": CTL_ERROR,
    "KVT_CTL_STATUS": CTL_STATUS,
    "KVT_CTL_CLIENTS": CTL_CLIENTS,
    "KVT_CTL_SEQS": CTL_SEQS,
    "KVT_CTL_JSON": CTL_JSON,
    "KVT_CTL_BLOCKS": CTL_BLOCKS,
}
"""C macro/enum name -> the value mirrored here, for the layout probe."""
