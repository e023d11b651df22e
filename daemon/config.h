/* SPDX-License-Identifier: MIT */
/*
 * config.h - kvtierd settings: compiled defaults, then the INI file (libinih), then flags. One
 * table in config.c (a row per key: section, name, type, bounds, default, reloadable, flag, help)
 * drives all of them, --help and --config-keys.
 * A bad value anywhere is reported with its file, line or flag and stops the daemon (exit 2)
 * before anything starts.
 */
#ifndef KVTD_CONFIG_H
#define KVTD_CONFIG_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "kvt_abi.h"

#define KVTD_DEFAULT_CONFIG "/etc/kvtier/kvtierd.conf"
#define KVTD_DEFAULT_SOCKET KVT_DEFAULT_SOCKET
#define KVTD_MAX_IDS	    32

enum { KVTD_HUGETLB_NO, KVTD_HUGETLB_YES, KVTD_HUGETLB_AUTO };

struct kvtd_config {
	char config_path[256];
	int config_explicit; /* --config given: a missing file is an error */
	/* [daemon] */
	char socket_path[108];
	char socket_group[64]; /* empty: leave the group alone */
	uint32_t socket_mode;
	uid_t allowed_uids[KVTD_MAX_IDS];
	unsigned n_allowed_uids;	  /* 0 with n_allowed_gids 0: any local user */
	gid_t allowed_gids[KVTD_MAX_IDS]; /* primary or supplementary group of the peer */
	unsigned n_allowed_gids;
	gid_t admin_gids[KVTD_MAX_IDS]; /* see every session (root and our uid always do) */
	unsigned n_admin_gids;
	unsigned pollers;
	unsigned poller_slice_us; /* a session's turn on a shared poller; 0: drain it all */
	char metrics_listen[64];  /* "127.0.0.1:9464": HTTP /metrics; empty: off */
	unsigned spin_us;
	unsigned hello_timeout_ms;
	unsigned admin_idle_timeout_ms; /* an admin connection silent this long is closed */
	int backend;			/* enum kvt_dev_kind */
	int log_level;
	/* [pool] */
	uint64_t pool_size;
	uint64_t chunk_size;
	int hugetlb;	/* KVTD_HUGETLB_*: no, yes (required), auto (when reserved) */
	int numa_node;	/* -1: no binding; -2: auto (node of the GPU, else local) */
	int lock;	/* mlock the pool; failure is fatal */
	int overcommit; /* start even when the pool is larger than MemAvailable */
	/* [limits] */
	unsigned sessions_per_uid;
	unsigned max_sessions;
	unsigned max_connections;     /* control connections at once, sessions included */
	unsigned connections_per_uid; /* of one uid but root and ours; 0: no limit */
	unsigned seqs_per_session;
	unsigned buffers_per_session;
	unsigned max_sq_entries;
	uint64_t max_arena_size;
	uint64_t default_arena_size;
	unsigned default_sq_entries;
	uint64_t pool_bytes_per_session; /* 0: no limit beyond the pool */
	uint64_t pool_bytes_per_uid;
	unsigned pool_share_per_uid; /* % of pool_size a uid but root and ours may hold; 0: none */
	unsigned classes_per_uid;    /* pool classes (slot sizes) of a uid but root and ours */
	/* [prefix] */
	uint64_t prefix_cache_bytes; /* a size, when prefix_cache_pct is -1 */
	int prefix_cache_pct;	     /* "N%" of pool_size; see kvtd_config_prefix_bytes() */
	uid_t prefix_share_uids[KVTD_MAX_IDS];
	unsigned n_prefix_share_uids;
	gid_t prefix_share_gids[KVTD_MAX_IDS];
	unsigned n_prefix_share_gids;
	unsigned prefix_namespaces_per_uid; /* per scope: a uid, or the shared scope */
	/* [retrieval] */
	int retrieval_sketch; /* sequences opened from now on keep an int8 sketch per index */
	/* [spill] (docs/spill.md): empty path, no store */
	char spill_path[256];
	uint64_t spill_size; /* 0: the existing file's or device's size */
	unsigned spill_queue_depth;
	uint64_t spill_uid_share; /* a size, when spill_uid_share_pct is -1 */
	int spill_uid_share_pct;  /* "N%" of the store's size */
};

void kvtd_config_defaults(struct kvtd_config *cfg);

/*
 * kvtd_config_load() - apply defaults, the config file and the flags, in that order.
 * Returns 0 to run, 1 when --help or --version was printed (exit 0), -EINVAL with @err filled
 * for a person (exit 2).
 */
int kvtd_config_load(struct kvtd_config *cfg, int argc, char **argv, char *err, size_t errlen);

/* Re-reads the file for SIGHUP: only log_level and spin_us change at run time. */
int kvtd_config_reload(struct kvtd_config *cfg, char *err, size_t errlen);

/* Every key of the INI file as "key = default  # meaning", by section (kvtierd --config-keys). */
void kvtd_config_describe(FILE *f);

/* 0 when every key's default parses as a value of that key, else -EINVAL with @err filled. */
int kvtd_config_check_defaults(char *err, size_t errlen);

/* [prefix] cache_bytes in bytes, percentages resolved against pool_size. */
uint64_t kvtd_config_prefix_bytes(const struct kvtd_config *cfg);

/* "64M", "2G", "4096" -> bytes. Returns 0 or -EINVAL (also on overflow). */
int kvtd_parse_size(const char *s, uint64_t *ret);
/*
 * kvtd_config_parse_loopback() - "127.x.x.x:PORT" or "localhost:PORT" (PORT 0: any free port)
 * into a network-order IPv4 address and a host-order port ([daemon] metrics_listen). Returns 0 or
 * -EINVAL (not that form, not a loopback address, port out of range).
 */
int kvtd_config_parse_loopback(const char *s, uint32_t *ret_addr, uint16_t *ret_port);

#endif
