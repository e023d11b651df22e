/* SPDX-License-Identifier: MIT */
/*
 * kvt_ctl_docs.h - canned CLIENTS and SEQS documents, as kvtierd answers them, shared by the
 * tests of their two renderers (kvtierctl's text, tests/ctl/check_ctl_fmt.c; the Prometheus
 * text, tests/unit/check_metrics_format.c). A name holds quotes, a backslash, a newline and an
 * escape byte.
 */
#ifndef KVT_CTL_DOCS_H
#define KVT_CTL_DOCS_H

static const char clients_json[] =
    "{\"clients\":[{\"session\":1,\"pid\":123,\"uid\":0,\"gid\":0,\"name\":\"sim-0\",\"seqs\":1,"
    "\"pool_bytes\":123456789,\"ops\":500,\"errors\":0,\"sq_entries\":256,"
    "\"arena_size\":1048576,\"uptime_s\":1.5},"
    "{\"session\":2,\"pid\":99,\"uid\":1000,\"gid\":1000,\"name\":\"a\\\"b\\\\c\\nd\\u001b\","
    "\"seqs\":0,\"pool_bytes\":0,\"ops\":5,\"errors\":1,\"sq_entries\":1024,"
    "\"arena_size\":16777216,\"uptime_s\":4000}]}";

static const char seqs_json[] =
    "{\"seqs\":[{\"session\":1,\"seq\":7,\"tokens\":1000,\"layers\":32,\"kv_heads\":8,"
    "\"head_dim\":128,"
    "\"dtype\":\"f16\",\"policy\":\"tiered\",\"t2_keys\":\"channel\",\"tiers\":[500,400,70,30],"
    "\"evicted_ratio\":0.03,"
    "\"pool_bytes\":123456789}]}";

#endif
