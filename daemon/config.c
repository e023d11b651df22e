/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "kvt_abi.h"
#include "kvt_dev.h"
#include "kvt_version.h"
#include "log.h"

int
kvtd_parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	}
	if (*end == 'i' || *end == 'B')
		end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
	if (*end || (shift && v > (ULLONG_MAX >> shift)))
		return -EINVAL;
	*ret = (uint64_t)v << shift;
	return 0;
}

static int
parse_uint(const char *s, unsigned min, unsigned max, unsigned *ret)
{
	char *end;
	unsigned long v;

	if (!*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || *end || v < min || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int
parse_bool(const char *s, int *ret)
{
	if (!strcmp(s, "yes") || !strcmp(s, "true") || !strcmp(s, "1") || !strcmp(s, "on"))
		*ret = 1;
	else if (!strcmp(s, "no") || !strcmp(s, "false") || !strcmp(s, "0") || !strcmp(s, "off"))
		*ret = 0;
	else
		return -EINVAL;
	return 0;
}

static int
parse_id_list(const char *s, unsigned *ids, unsigned *ret_n)
{
	char buf[512], *save = NULL, *tok;
	unsigned n = 0;

	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		if (n == KVTD_MAX_IDS || parse_uint(tok, 0, UINT_MAX - 1, &ids[n]) < 0)
			return -EINVAL;
		n++;
	}
	*ret_n = n;
	return 0;
}

/* ---- keys that need more than a type and bounds ------------------------------------------- */

static int
set_socket_mode(struct kvtd_config *cfg, const char *val)
{
	char *end;
	unsigned long m = strtoul(val, &end, 8);

	if (!*val || *end || m > 0777)
		return -EINVAL;
	cfg->socket_mode = m;
	return 0;
}

int
kvtd_config_parse_loopback(const char *s, uint32_t *ret_addr, uint16_t *ret_port)
{
	char host[32];
	const char *colon = strrchr(s, ':');
	struct in_addr a;
	char *end;
	unsigned long port;

	if (!colon || (size_t)(colon - s) >= sizeof(host))
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	if (!strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	if (inet_pton(AF_INET, host, &a) != 1 || (ntohl(a.s_addr) >> 24) != 127)
		return -EINVAL; /* loopback only: the endpoint has no authentication */
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || port > 65535)
		return -EINVAL;
	*ret_addr = a.s_addr;
	*ret_port = (uint16_t)port;
	return 0;
}

static int
set_metrics_listen(struct kvtd_config *cfg, const char *val)
{
	uint32_t a;
	uint16_t port;

	/* empty: off; else a loopback address (the endpoint has no authentication) */
	if (strlen(val) >= sizeof(cfg->metrics_listen) ||
	    (*val && kvtd_config_parse_loopback(val, &a, &port) < 0))
		return -EINVAL;
	snprintf(cfg->metrics_listen, sizeof(cfg->metrics_listen), "%s", val);
	return 0;
}

static int
set_backend(struct kvtd_config *cfg, const char *val)
{
	if (!strcmp(val, "auto"))
		cfg->backend = KVT_DEV_AUTO;
	else if (!strcmp(val, "host"))
		cfg->backend = KVT_DEV_HOST;
	else if (!strcmp(val, "cuda"))
		cfg->backend = KVT_DEV_CUDA;
	else
		return -EINVAL;
	return 0;
}

static int
set_log_level(struct kvtd_config *cfg, const char *val)
{
	int r = kvtd_log_parse_level(val);

	if (r < 0)
		return r;
	cfg->log_level = r;
	return 0;
}

static int
set_chunk_size(struct kvtd_config *cfg, const char *val)
{
	uint64_t sz;

	if (kvtd_parse_size(val, &sz) < 0 || sz < 4096 || (sz & (sz - 1)) || sz > (1ull << 30))
		return -EINVAL;
	cfg->chunk_size = sz;
	return 0;
}

static int
set_hugetlb(struct kvtd_config *cfg, const char *val)
{
	int b;

	if (!strcmp(val, "auto"))
		cfg->hugetlb = KVTD_HUGETLB_AUTO;
	else if (parse_bool(val, &b) == 0)
		cfg->hugetlb = b ? KVTD_HUGETLB_YES : KVTD_HUGETLB_NO;
	else
		return -EINVAL;
	return 0;
}

static int
set_numa_node(struct kvtd_config *cfg, const char *val)
{
	unsigned u;

	if (!strcmp(val, "auto"))
		cfg->numa_node = -2;
	else if (!strcmp(val, "none"))
		cfg->numa_node = -1;
	else if (parse_uint(val, 0, 1023, &u) == 0)
		cfg->numa_node = u;
	else
		return -EINVAL;
	return 0;
}

/* A size, or "N%" of the pool (resolved by kvtd_config_prefix_bytes() once the pool size is
 * final: flags may set it after this key). */
static int
set_prefix_cache(struct kvtd_config *cfg, const char *val)
{
	size_t len = strlen(val);
	unsigned pct;
	char num[8];

	if (len > 1 && len < sizeof(num) && val[len - 1] == '%') {
		memcpy(num, val, len - 1);
		num[len - 1] = '\0';
		if (parse_uint(num, 0, 100, &pct) < 0)
			return -EINVAL;
		cfg->prefix_cache_pct = pct;
		cfg->prefix_cache_bytes = 0;
		return 0;
	}
	if (kvtd_parse_size(val, &cfg->prefix_cache_bytes) < 0)
		return -EINVAL;
	cfg->prefix_cache_pct = -1;
	return 0;
}

uint64_t
kvtd_config_prefix_bytes(const struct kvtd_config *cfg)
{
	/* pool sizes are far below 2^57: the product does not overflow */
	uint64_t b = cfg->prefix_cache_pct >= 0 ? cfg->pool_size * cfg->prefix_cache_pct / 100
						: cfg->prefix_cache_bytes;

	return b < cfg->pool_size ? b : cfg->pool_size;
}

/* "N%" of the pool, 0% to 100% ("0" too: no share). */
static int
set_pool_share(struct kvtd_config *cfg, const char *val)
{
	size_t len = strlen(val);
	char num[8];

	if (!strcmp(val, "0")) {
		cfg->pool_share_per_uid = 0;
		return 0;
	}
	if (len < 2 || len >= sizeof(num) || val[len - 1] != '%')
		return -EINVAL;
	memcpy(num, val, len - 1);
	num[len - 1] = '\0';
	return parse_uint(num, 0, 100, &cfg->pool_share_per_uid);
}

/* [spill] uid_share: a size, or "N%" of the store (resolved once the store knows its size). */
static int
set_spill_share(struct kvtd_config *cfg, const char *val)
{
	size_t len = strlen(val);
	unsigned pct;
	char num[8];

	if (len > 1 && len < sizeof(num) && val[len - 1] == '%') {
		memcpy(num, val, len - 1);
		num[len - 1] = '\0';
		if (parse_uint(num, 0, 100, &pct) < 0)
			return -EINVAL;
		cfg->spill_uid_share_pct = (int)pct;
		cfg->spill_uid_share = 0;
		return 0;
	}
	if (kvtd_parse_size(val, &cfg->spill_uid_share) < 0)
		return -EINVAL;
	cfg->spill_uid_share_pct = -1;
	return 0;
}

static int
set_max_sq_entries(struct kvtd_config *cfg, const char *val)
{
	unsigned u;

	if (parse_uint(val, 2, 1u << 16, &u) < 0 || (u & (u - 1)))
		return -EINVAL;
	cfg->max_sq_entries = u;
	return 0;
}

/* ---- the table: one row per key --------------------------------------------------------- */

enum cfg_type {
	CFG_STR,  /* char[size], non-empty unless min is 0 */
	CFG_UINT, /* unsigned in [min, max] */
	CFG_SIZE, /* uint64_t bytes ("64M", "2G"), in [min, max] (max 0: none) */
	CFG_BOOL, /* int 0/1: yes/no, true/false, on/off, 1/0 */
	CFG_IDS,  /* unsigned[KVTD_MAX_IDS] at off, its count at aux */
	CFG_FN,	  /* set() */
};

/*
 * struct cfg_key - one setting. Its default is text, parsed like any value, so the table is the
 * one place a key is written: parsing of the file and flags, the defaults, --help, reload and
 * the documentation all read it.
 */
struct cfg_key {
	const char *section, *name;
	enum cfg_type type;
	size_t off, width; /* the field: offset and size */
	size_t aux;	   /* CFG_IDS: offset of the count */
	uint64_t min, max;
	int (*set)(struct kvtd_config *cfg, const char *val); /* CFG_FN */
	const char *def;				      /* default, as a value; "": empty */
	int reloadable;					      /* SIGHUP applies it */
	const char *flag;				      /* long option, NULL: file only */
	char short_opt;
	const char *arg;  /* --help's name for the value */
	const char *help; /* one line */
	const char *hint; /* what a value must look like, where the name does not say it */
};

#define F(field) offsetof(struct kvtd_config, field), sizeof(((struct kvtd_config *)0)->field)
#define STR(sec, name, field, min, def, flag, sh, arg, help)                                       \
	{                                                                                          \
		sec, name, CFG_STR, F(field), 0, min, 0, NULL, def, 0, flag, sh, arg, help, NULL   \
	}
#define UINT(sec, name, field, min, max, def, rl, flag, sh, arg, help)                             \
	{                                                                                          \
		sec, name, CFG_UINT, F(field), 0, min, max, NULL, def, rl, flag, sh, arg, help,    \
		    NULL                                                                           \
	}
#define SIZE(sec, name, field, min, max, def, flag, sh, arg, help)                                 \
	{                                                                                          \
		sec, name, CFG_SIZE, F(field), 0, min, max, NULL, def, 0, flag, sh, arg, help,     \
		    NULL                                                                           \
	}
#define BOOL(sec, name, field, def, flag, sh, help)                                                \
	{                                                                                          \
		sec, name, CFG_BOOL, F(field), 0, 0, 1, NULL, def, 0, flag, sh, "yes|no", help,    \
		    ": yes or no (also true/false, on/off, 1/0)"                                   \
	}
#define IDS(sec, name, field, count, help)                                                         \
	{                                                                                          \
		sec, name, CFG_IDS, F(field), offsetof(struct kvtd_config, count), 0, 0, NULL, "", \
		    0, NULL, 0, NULL, help, NULL                                                   \
	}
#define FN(sec, name, field, fn, def, rl, flag, sh, arg, help, hint)                               \
	{                                                                                          \
		sec, name, CFG_FN, F(field), 0, 0, 0, fn, def, rl, flag, sh, arg, help, hint       \
	}

static const struct cfg_key cfg_keys[] = {
    /* [daemon] */
    STR("daemon", "socket", socket_path, 1, KVTD_DEFAULT_SOCKET, "socket", 's', "PATH",
	"control socket"),
    STR("daemon", "socket_group", socket_group, 0, "", "socket-group", 'g', "NAME",
	"group owning the socket (mode 0660); empty: leave it alone"),
    FN("daemon", "socket_mode", socket_mode, set_socket_mode, "0660", 0, NULL, 0, "MODE",
       "socket permissions, octal", ": octal, at most 0777"),
    IDS("daemon", "allowed_uids", allowed_uids, n_allowed_uids,
	"uids that may connect (none here and in allowed_gids: any local user)"),
    IDS("daemon", "allowed_gids", allowed_gids, n_allowed_gids,
	"groups that may connect (primary or supplementary)"),
    IDS("daemon", "admin_gids", admin_gids, n_admin_gids,
	"groups that see every session (root and the daemon's uid always do)"),
    UINT("daemon", "pollers", pollers, 1, 64, "1", 0, "pollers", 'P', "N", "ring poller threads"),
    UINT("daemon", "poller_slice_us", poller_slice_us, 0, 1000000, "200", 0, "poller-slice-us", 'Q',
	 "N", "a session's turn on a shared poller, us (0: no turns)"),
    FN("daemon", "metrics_listen", metrics_listen, set_metrics_listen, "", 0, "metrics-listen", 'M',
       "A:P", "serve HTTP /metrics on loopback A:P (empty: off)",
       ": a loopback address, 127.x.x.x:PORT or localhost:PORT (no authentication)"),
    UINT("daemon", "spin_us", spin_us, 0, 1000000, "50", 1, "spin-us", 'S', "N",
	 "poller busy-spin after last work, us"),
    UINT("daemon", "hello_timeout_ms", hello_timeout_ms, 1, 600000, "5000", 0, "hello-timeout-ms",
	 'T', "N", "close connections silent this long before HELLO, ms"),
    UINT("daemon", "admin_idle_timeout_ms", admin_idle_timeout_ms, 1, 86400000, "60000", 0, NULL, 0,
	 "N", "close admin connections idle this long, ms"),
    FN("daemon", "backend", backend, set_backend, "auto", 0, "backend", 'b', "B",
       "device backend: auto | cuda | host", ": auto, cuda or host"),
    FN("daemon", "log_level", log_level, set_log_level, "info", 1, "log-level", 'l', "L",
       "err | warning | notice | info | debug", ": err, warning, notice, info or debug"),
    /* [pool] */
    SIZE("pool", "size", pool_size, 4ull << 20, 0, "256M", "pool-size", 'p', "SIZE",
	 "pinned pool size, e.g. 64G"),
    FN("pool", "chunk_size", chunk_size, set_chunk_size, "2M", 0, NULL, 0, "SIZE",
       "pool chunk size: a power of two, 4K to 1G", ": a power of two from 4K to 1G"),
    FN("pool", "hugetlb", hugetlb, set_hugetlb, "auto", 0, "hugetlb", 'H', "yes|no|auto",
       "back the pool with hugetlb pages (auto: when enough are reserved)", ": yes, no or auto"),
    BOOL("pool", "lock", lock, "yes", "lock", 'L', "mlock the pool (failure is fatal)"),
    BOOL("pool", "overcommit", overcommit, "no", "pool-overcommit", 0,
	 "start with a pool above MemAvailable"),
    FN("pool", "numa_node", numa_node, set_numa_node, "auto", 0, "numa-node", 'n', "N",
       "auto | none | node number", ": auto, none or a node number"),
    /* [limits] */
    UINT("limits", "sessions_per_uid", sessions_per_uid, 1, 65536, "64", 0, NULL, 0, "N",
	 "sessions one uid may hold"),
    UINT("limits", "max_sessions", max_sessions, 1, 65536, "256", 0, NULL, 0, "N",
	 "sessions in all"),
    UINT("limits", "max_connections", max_connections, 1, 1u << 20, "512", 0, NULL, 0, "N",
	 "control connections at once, sessions included"),
    UINT("limits", "connections_per_uid", connections_per_uid, 0, 1u << 20, "128", 0, NULL, 0, "N",
	 "control connections one uid may hold, but root and kvtierd's own (0: no limit)"),
    UINT("limits", "seqs_per_session", seqs_per_session, 1, 65536, "64", 0, NULL, 0, "N",
	 "open sequences per session"),
    UINT("limits", "buffers_per_session", buffers_per_session, 1, 4096, "16", 0, NULL, 0, "N",
	 "registered buffers per session"),
    FN("limits", "max_sq_entries", max_sq_entries, set_max_sq_entries, "4096", 0, NULL, 0, "N",
       "largest SQ a HELLO may ask for: a power of two, 2 to 65536",
       ": a power of two from 2 to 65536"),
    /* At most 1 GiB: op results are sized in int (the CQE's res). */
    SIZE("limits", "max_arena_size", max_arena_size, 4096, 1ull << 30, "256M", NULL, 0, "SIZE",
	 "largest arena a HELLO may ask for, at most 1G"),
    SIZE("limits", "pool_bytes_per_session", pool_bytes_per_session, 0, 0, "0", NULL, 0, "SIZE",
	 "pool bytes one session may hold (0: no limit beyond the pool)"),
    SIZE("limits", "pool_bytes_per_uid", pool_bytes_per_uid, 0, 0, "0", NULL, 0, "SIZE",
	 "pool bytes one uid may hold (0: no limit beyond the pool)"),
    FN("limits", "pool_share_per_uid", pool_share_per_uid, set_pool_share, "50%", 0, NULL, 0, "N%",
       "share of the pool one uid but root and kvtierd's own may hold (0%: no share)",
       ": a percentage of the pool such as 50%"),
    UINT("limits", "classes_per_uid", classes_per_uid, 0, 64, "16", 0, NULL, 0, "N",
	 "pool classes (slot sizes) one uid's sequences and namespaces may use, of 64 in all, "
	 "but root's and kvtierd's own (0: no limit)"),
    /* [prefix] (docs/prefix.md) */
    FN("prefix", "cache_bytes", prefix_cache_bytes, set_prefix_cache, "25%", 0, NULL, 0, "SIZE",
       "pool bytes shared prefix blocks may hold: a size, or N% of the pool (0: no sharing)",
       ": a size such as 8G, or a percentage of the pool such as 25%"),
    IDS("prefix", "share_uids", prefix_share_uids, n_prefix_share_uids,
	"uids whose namespaces are one shared scope (others share only with their own uid)"),
    IDS("prefix", "share_gids", prefix_share_gids, n_prefix_share_gids,
	"groups (primary or supplementary) whose members share that scope too"),
    UINT("prefix", "namespaces_per_uid", prefix_namespaces_per_uid, 1, 1u << 20, "1024", 0, NULL, 0,
	 "N", "namespaces one uid (or the shared scope) may hold, open or with cached blocks"),
    /* [retrieval] (docs/retrieval.md). Read at each SEQ_OPEN; a sequence keeps what it was
     * opened with, across restarts in place too. Not reloadable: a restart applies it. */
    BOOL("retrieval", "sketch", retrieval_sketch, "yes", NULL, 0,
	 "an int8 sketch beside each TOPK index (head_dim + 8 pool bytes a key and kv head): "
	 "TOPK exact at any zone length; no: past 32 MiB of rows it rescores the best estimates"),
    /* [spill] (docs/spill.md): the store is opened at start; nothing spills into it yet */
    STR("spill", "path", spill_path, 0, "", NULL, 0, "PATH",
	"spill store: a file on a disk file system with O_DIRECT, or a block device (empty: none)"),
    SIZE("spill", "size", spill_size, 0, 0, "0", NULL, 0, "SIZE",
	 "spill store bytes (0: the existing file's or device's size)"),
    UINT("spill", "queue_depth", spill_queue_depth, 1, 4096, "64", 0, NULL, 0, "N",
	 "spill store requests in flight"),
    FN("spill", "uid_share", spill_uid_share, set_spill_share, "50%", 0, NULL, 0, "SIZE",
       "spill store bytes one uid but root and kvtierd's own may hold: a size, or N% of it "
       "(0: no limit)",
       ": a size such as 64G, or a percentage of the store such as 50%"),
};

#undef F
#undef STR
#undef UINT
#undef SIZE
#undef BOOL
#undef IDS
#undef FN

#define N_KEYS (sizeof(cfg_keys) / sizeof(cfg_keys[0]))

static int
key_set(const struct cfg_key *k, struct kvtd_config *cfg, const char *val)
{
	void *p = (char *)cfg + k->off;
	uint64_t sz;

	switch (k->type) {
	case CFG_STR:
		if (strlen(val) < k->min || strlen(val) >= k->width)
			return -EINVAL;
		snprintf(p, k->width, "%s", val);
		return 0;
	case CFG_UINT:
		return parse_uint(val, (unsigned)k->min, (unsigned)k->max, p);
	case CFG_SIZE:
		if (kvtd_parse_size(val, &sz) < 0 || sz < k->min || (k->max && sz > k->max))
			return -EINVAL;
		*(uint64_t *)p = sz;
		return 0;
	case CFG_BOOL:
		return parse_bool(val, p);
	case CFG_IDS:
		return parse_id_list(val, p, (unsigned *)((char *)cfg + k->aux));
	case CFG_FN:
		return k->set(cfg, val);
	}
	return -EINVAL;
}

static const struct cfg_key *
key_find(const char *section, const char *name)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (!strcmp(cfg_keys[i].section, section) && !strcmp(cfg_keys[i].name, name))
			return &cfg_keys[i];
	return NULL;
}

void
kvtd_config_defaults(struct kvtd_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->config_path, sizeof(cfg->config_path), "%s", KVTD_DEFAULT_CONFIG);
	/* What a HELLO asking for 0 gets; not settings (the limits above bound them). */
	cfg->default_arena_size = 16ull << 20;
	cfg->default_sq_entries = 256;
	/* Every default parses (kvtd_config_check_defaults(), asserted by check_config). */
	for (size_t i = 0; i < N_KEYS; i++)
		if (cfg_keys[i].def[0])
			key_set(&cfg_keys[i], cfg, cfg_keys[i].def);
}

int
kvtd_config_check_defaults(char *err, size_t errlen)
{
	struct kvtd_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	for (size_t i = 0; i < N_KEYS; i++)
		if (cfg_keys[i].def[0] && key_set(&cfg_keys[i], &cfg, cfg_keys[i].def) < 0) {
			snprintf(err, errlen, "[%s] %s: default '%s' does not parse",
				 cfg_keys[i].section, cfg_keys[i].name, cfg_keys[i].def);
			return -EINVAL;
		}
	return 0;
}

void
kvtd_config_describe(FILE *f)
{
	const char *sec = "";

	/* A valid config file itself: every key at its default, its meaning above it. */
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct cfg_key *k = &cfg_keys[i];

		if (strcmp(sec, k->section))
			fprintf(f, "%s[%s]\n", i ? "\n" : "", sec = k->section);
		fprintf(f, "# %s", k->help);
		if (k->flag)
			fprintf(f, " (--%s)", k->flag);
		fprintf(f, "%s\n%s = %s\n", k->reloadable ? "; SIGHUP applies it" : "", k->name,
			k->def);
	}
}

struct ini_ctx {
	struct kvtd_config *cfg;
	char *err;
	size_t errlen;
	int failed;
};

/* inih reports the line of the first error as ini_parse_file()'s return value. */
static int
ini_on_value(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *ctx = user;
	const struct cfg_key *k = key_find(section, name);
	int r = k ? key_set(k, ctx->cfg, value) : -ENOENT;

	if (r < 0 && !ctx->failed) {
		snprintf(ctx->err, ctx->errlen, "%s [%s] %s = '%s'%s",
			 r == -ENOENT ? "unknown key" : "bad value for", section, name, value,
			 k && k->hint ? k->hint : "");
		ctx->failed = 1;
	}
	return r < 0 ? 0 : 1;
}

static int
config_load_file(struct kvtd_config *cfg, char *err, size_t errlen)
{
	struct ini_ctx ctx = {cfg, err, errlen, 0};
	FILE *f = fopen(cfg->config_path, "re");
	struct stat st;
	int r, rerr;

	if (!f) {
		if (errno == ENOENT && !cfg->config_explicit)
			return 0; /* no file: compiled defaults */
		snprintf(err, errlen, "cannot open config %s: %s", cfg->config_path,
			 strerror(errno));
		return -EINVAL;
	}
	/* fopen() takes a directory, and reading it fails like an empty file */
	if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
		fclose(f);
		snprintf(err, errlen, "config %s is a directory: give the path of an INI file (%s)",
			 cfg->config_path, KVTD_DEFAULT_CONFIG);
		return -EINVAL;
	}
	r = ini_parse_file(f, ini_on_value, &ctx);
	rerr = ferror(f) ? errno : 0;
	fclose(f);
	if (rerr) {
		snprintf(err, errlen, "cannot read config %s: %s", cfg->config_path,
			 strerror(rerr));
		return -EINVAL;
	}
	if (ctx.failed) {
		char msg[400];

		snprintf(msg, sizeof(msg), "%s", err);
		snprintf(err, errlen, "%s:%d: %s", cfg->config_path, r, msg);
		return -EINVAL;
	}
	if (r) {
		snprintf(err, errlen, "%s:%d: syntax error", cfg->config_path, r);
		return -EINVAL;
	}
	return 0;
}

/* getopt_long's view of the table: --config, --help and --version, then every row with a flag
 * (val = 256 + row index, so rows without a short option need no letter). */
static void
build_options(struct option *o, char *shorts)
{
	size_t n = 0;
	char *sp = shorts;

	o[n++] = (struct option){"config", required_argument, NULL, 'c'};
	o[n++] = (struct option){"help", no_argument, NULL, 'h'};
	o[n++] = (struct option){"version", no_argument, NULL, 'V'};
	o[n++] = (struct option){"config-keys", no_argument, NULL, 'K'};
	sp += sprintf(sp, "c:hV");
	for (size_t i = 0; i < N_KEYS; i++) {
		if (!cfg_keys[i].flag)
			continue;
		o[n++] = (struct option){cfg_keys[i].flag, required_argument, NULL, 256 + (int)i};
		if (cfg_keys[i].short_opt)
			sp += sprintf(sp, "%c:", cfg_keys[i].short_opt);
	}
	o[n] = (struct option){0};
}

static const struct cfg_key *
flag_row(int c)
{
	if (c >= 256 && (size_t)(c - 256) < N_KEYS)
		return &cfg_keys[c - 256];
	for (size_t i = 0; i < N_KEYS; i++)
		if (cfg_keys[i].flag && cfg_keys[i].short_opt == c)
			return &cfg_keys[i];
	return NULL;
}

static void
usage(void)
{
	printf("usage: kvtierd [options]\n"
	       "KV-cache memory service: pinned host pool, int8 tier and retrieval index for LLM\n"
	       "inference processes linked with libkvtier.\n\n"
	       "  -c, --config PATH          INI file (default %s)\n",
	       KVTD_DEFAULT_CONFIG);
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct cfg_key *k = &cfg_keys[i];
		char opt[48];

		if (!k->flag)
			continue;
		snprintf(opt, sizeof(opt), "--%s %s", k->flag, k->arg);
		if (k->short_opt)
			printf("  -%c, %-22s %s", k->short_opt, opt, k->help);
		else
			printf("      %-22s %s", opt, k->help);
		printf(k->def[0] ? " (default %s)\n" : "\n", k->def);
	}
	printf("      --config-keys          every key of the INI file, its default and meaning\n"
	       "  -h, --help, -V, --version\n");
}

int
kvtd_config_load(struct kvtd_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	struct option opts[N_KEYS + 5];
	char shorts[2 * N_KEYS + 8];
	int c, r;

	build_options(opts, shorts);
	kvtd_config_defaults(cfg);
	/* First pass: only --config, --help and --version, so the file applies before flags. */
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
		if (c == 'c') {
			if (strlen(optarg) >= sizeof(cfg->config_path)) {
				snprintf(err, errlen, "--config: path too long");
				return -EINVAL;
			}
			snprintf(cfg->config_path, sizeof(cfg->config_path), "%s", optarg);
			cfg->config_explicit = 1;
		} else if (c == 'h') {
			usage();
			return 1;
		} else if (c == 'V') {
			printf("kvtierd %s (ABI %d.%d)\n", KVT_VERSION, KVT_ABI_MAJOR,
			       KVT_ABI_MINOR);
			return 1;
		} else if (c == 'K') {
			kvtd_config_describe(stdout);
			return 1;
		} else if (c == '?') {
			snprintf(err, errlen, "unknown or incomplete option '%s' (see --help)",
				 argv[optind - 1]);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		snprintf(err, errlen, "unexpected argument '%s' (see --help)", argv[optind]);
		return -EINVAL;
	}
	r = config_load_file(cfg, err, errlen);
	if (r < 0)
		return r;
	optind = 1;
	while ((c = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
		const struct cfg_key *k = flag_row(c);

		if (!k)
			continue;
		if (key_set(k, cfg, optarg) < 0) {
			snprintf(err, errlen, "bad value '%s' for --%s%s", optarg, k->flag,
				 k->hint ? k->hint : "");
			return -EINVAL;
		}
	}
	if (cfg->socket_group[0] && !getgrnam(cfg->socket_group)) {
		snprintf(err, errlen, "socket_group '%s' does not exist", cfg->socket_group);
		return -EINVAL;
	}
	kvtd_log_set_level(cfg->log_level);
	return 0;
}

int
kvtd_config_reload(struct kvtd_config *cfg, char *err, size_t errlen)
{
	struct kvtd_config tmp = *cfg;
	int r;

	r = config_load_file(&tmp, err, errlen);
	if (r < 0)
		return r;
	for (size_t i = 0; i < N_KEYS; i++)
		if (cfg_keys[i].reloadable)
			memcpy((char *)cfg + cfg_keys[i].off, (char *)&tmp + cfg_keys[i].off,
			       cfg_keys[i].width);
	kvtd_log_set_level(cfg->log_level);
	return 0;
}
