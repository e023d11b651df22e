/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "kvt_abi.h"
#include "kvt_dev.h"
#include "log.h"
#include "metrics.h"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "0.0.0"
#endif

void
kvtd_config_defaults(struct kvtd_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->config_path, sizeof(cfg->config_path), "%s", KVTD_DEFAULT_CONFIG);
	snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", KVTD_DEFAULT_SOCKET);
	cfg->socket_mode = 0660;
	cfg->pollers = 1;
	cfg->poller_slice_us = 200;
	cfg->spin_us = 50;
	cfg->hello_timeout_ms = 5000;
	cfg->admin_idle_timeout_ms = 60000;
	cfg->backend = KVT_DEV_AUTO;
	cfg->log_level = KVTD_LOG_INFO;
	cfg->pool_size = 256ull << 20;
	cfg->chunk_size = 2ull << 20;
	cfg->numa_node = -2;
	cfg->lock = 1;
	cfg->sessions_per_uid = 64;
	cfg->max_sessions = 256;
	cfg->max_connections = 512;
	cfg->seqs_per_session = 64;
	cfg->buffers_per_session = 16;
	cfg->max_sq_entries = 4096;
	cfg->max_arena_size = 256ull << 20;
	cfg->default_arena_size = 16ull << 20;
	cfg->default_sq_entries = 256;
}

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

/* One setting, from the file (section, key) or from a flag (section NULL, key = flag name). */
static int
config_set(struct kvtd_config *cfg, const char *section, const char *key, const char *val)
{
	const char *sec = section ? section : "";
	unsigned u;
	uint64_t sz;
	int r;

#define KEY(s, k) ((!section || !strcmp(sec, s)) && !strcmp(key, k))
	if (KEY("daemon", "socket")) {
		if (!*val || strlen(val) >= sizeof(cfg->socket_path))
			return -EINVAL;
		snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", val);
	} else if (KEY("daemon", "socket_group")) {
		if (strlen(val) >= sizeof(cfg->socket_group))
			return -EINVAL;
		snprintf(cfg->socket_group, sizeof(cfg->socket_group), "%s", val);
	} else if (KEY("daemon", "socket_mode")) {
		char *end;
		unsigned long m = strtoul(val, &end, 8);

		if (!*val || *end || m > 0777)
			return -EINVAL;
		cfg->socket_mode = m;
	} else if (KEY("daemon", "allowed_uids")) {
		return parse_id_list(val, (unsigned *)cfg->allowed_uids, &cfg->n_allowed_uids);
	} else if (KEY("daemon", "allowed_gids")) {
		return parse_id_list(val, (unsigned *)cfg->allowed_gids, &cfg->n_allowed_gids);
	} else if (KEY("daemon", "admin_gids")) {
		return parse_id_list(val, (unsigned *)cfg->admin_gids, &cfg->n_admin_gids);
	} else if (KEY("daemon", "pollers")) {
		return parse_uint(val, 1, 64, &cfg->pollers);
	} else if (KEY("daemon", "metrics_listen")) {
		uint32_t a;
		uint16_t port;

		/* empty: off; else a loopback address (the endpoint has no authentication) */
		if (strlen(val) >= sizeof(cfg->metrics_listen) ||
		    (*val && kvtd_metrics_parse(val, &a, &port) < 0))
			return -EINVAL;
		snprintf(cfg->metrics_listen, sizeof(cfg->metrics_listen), "%s", val);
	} else if (KEY("daemon", "poller_slice_us")) {
		return parse_uint(val, 0, 1000000, &cfg->poller_slice_us);
	} else if (KEY("daemon", "spin_us")) {
		return parse_uint(val, 0, 1000000, &cfg->spin_us);
	} else if (KEY("daemon", "hello_timeout_ms")) {
		return parse_uint(val, 1, 600000, &cfg->hello_timeout_ms);
	} else if (KEY("daemon", "admin_idle_timeout_ms")) {
		return parse_uint(val, 1, 86400000, &cfg->admin_idle_timeout_ms);
	} else if (KEY("daemon", "backend")) {
		if (!strcmp(val, "auto"))
			cfg->backend = KVT_DEV_AUTO;
		else if (!strcmp(val, "host"))
			cfg->backend = KVT_DEV_HOST;
		else if (!strcmp(val, "cuda"))
			cfg->backend = KVT_DEV_CUDA;
		else
			return -EINVAL;
	} else if (KEY("daemon", "log_level")) {
		r = kvtd_log_parse_level(val);
		if (r < 0)
			return r;
		cfg->log_level = r;
	} else if (KEY("pool", "size")) {
		if (kvtd_parse_size(val, &sz) < 0 || sz < (4ull << 20))
			return -EINVAL;
		cfg->pool_size = sz;
	} else if (KEY("pool", "chunk_size")) {
		if (kvtd_parse_size(val, &sz) < 0 || sz < 4096 || (sz & (sz - 1)) ||
		    sz > (1ull << 30))
			return -EINVAL;
		cfg->chunk_size = sz;
	} else if (KEY("pool", "hugetlb")) {
		return parse_bool(val, &cfg->hugetlb);
	} else if (KEY("pool", "lock")) {
		return parse_bool(val, &cfg->lock);
	} else if (KEY("pool", "overcommit")) {
		return parse_bool(val, &cfg->overcommit);
	} else if (KEY("pool", "numa_node")) {
		if (!strcmp(val, "auto"))
			cfg->numa_node = -2;
		else if (!strcmp(val, "none"))
			cfg->numa_node = -1;
		else if (parse_uint(val, 0, 1023, &u) == 0)
			cfg->numa_node = u;
		else
			return -EINVAL;
	} else if (KEY("limits", "sessions_per_uid")) {
		return parse_uint(val, 1, 65536, &cfg->sessions_per_uid);
	} else if (KEY("limits", "max_sessions")) {
		return parse_uint(val, 1, 65536, &cfg->max_sessions);
	} else if (KEY("limits", "max_connections")) {
		return parse_uint(val, 1, 1u << 20, &cfg->max_connections);
	} else if (KEY("limits", "seqs_per_session")) {
		return parse_uint(val, 1, 65536, &cfg->seqs_per_session);
	} else if (KEY("limits", "buffers_per_session")) {
		return parse_uint(val, 1, 4096, &cfg->buffers_per_session);
	} else if (KEY("limits", "max_sq_entries")) {
		if (parse_uint(val, 2, 1u << 16, &u) < 0 || (u & (u - 1)))
			return -EINVAL;
		cfg->max_sq_entries = u;
	} else if (KEY("limits", "max_arena_size")) {
		/* At most 1 GiB: op results are sized in int (the CQE's res). */
		if (kvtd_parse_size(val, &sz) < 0 || sz < 4096 || sz > (1ull << 30))
			return -EINVAL;
		cfg->max_arena_size = sz;
	} else if (KEY("limits", "pool_bytes_per_session")) {
		return kvtd_parse_size(val, &cfg->pool_bytes_per_session);
	} else if (KEY("limits", "pool_bytes_per_uid")) {
		return kvtd_parse_size(val, &cfg->pool_bytes_per_uid);
	} else {
		return -ENOENT;
	}
#undef KEY
	return 0;
}

struct ini_ctx {
	struct kvtd_config *cfg;
	char *err;
	size_t errlen;
	int failed;
};

/* What a value must look like, where the key's name does not say it. */
static const char *
value_hint(const char *key)
{
	if (!strcmp(key, "metrics_listen"))
		return ": a loopback address, 127.x.x.x:PORT or localhost:PORT (no authentication)";
	return "";
}

/* inih reports the line of the first error as ini_parse_file()'s return value. */
static int
ini_on_value(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *ctx = user;
	int r = config_set(ctx->cfg, section, name, value);

	if (r < 0 && !ctx->failed) {
		snprintf(ctx->err, ctx->errlen, "%s [%s] %s = '%s'%s",
			 r == -ENOENT ? "unknown key" : "bad value for", section, name, value,
			 r == -ENOENT ? "" : value_hint(name));
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

static const struct option long_opts[] = {
    {"config", required_argument, NULL, 'c'},
    {"socket", required_argument, NULL, 's'},
    {"socket-group", required_argument, NULL, 'g'},
    {"pool-size", required_argument, NULL, 'p'},
    {"pollers", required_argument, NULL, 'P'},
    {"poller-slice-us", required_argument, NULL, 'Q'},
    {"metrics-listen", required_argument, NULL, 'M'},
    {"spin-us", required_argument, NULL, 'S'},
    {"hello-timeout-ms", required_argument, NULL, 'T'},
    {"backend", required_argument, NULL, 'b'},
    {"log-level", required_argument, NULL, 'l'},
    {"numa-node", required_argument, NULL, 'n'},
    {"hugetlb", required_argument, NULL, 'H'},
    {"lock", required_argument, NULL, 'L'},
    {"pool-overcommit", required_argument, NULL, 'O'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {0},
};

/* Flag name -> the key config_set() knows it by. */
static const char *
flag_key(int c)
{
	switch (c) {
	case 's':
		return "socket";
	case 'g':
		return "socket_group";
	case 'p':
		return "size";
	case 'P':
		return "pollers";
	case 'Q':
		return "poller_slice_us";
	case 'M':
		return "metrics_listen";
	case 'S':
		return "spin_us";
	case 'T':
		return "hello_timeout_ms";
	case 'b':
		return "backend";
	case 'l':
		return "log_level";
	case 'n':
		return "numa_node";
	case 'H':
		return "hugetlb";
	case 'L':
		return "lock";
	case 'O':
		return "overcommit";
	}
	return NULL;
}

static void
usage(void)
{
	printf("usage: kvtierd [options]\n"
	       "KV-cache memory service: pinned host pool, int8 tier and retrieval index for LLM\n"
	       "inference processes linked with libkvtier.\n\n"
	       "  -c, --config PATH          INI file (default %s)\n"
	       "  -s, --socket PATH          control socket (default %s)\n"
	       "  -g, --socket-group NAME    group owning the socket (mode 0660)\n"
	       "  -p, --pool-size SIZE       pinned pool size, e.g. 64G (default 256M)\n"
	       "  -P, --pollers N            ring poller threads (default 1)\n"
	       "  -Q, --poller-slice-us N    a session's turn on a shared poller (default 200)\n"
	       "  -M, --metrics-listen A:P   serve HTTP /metrics on loopback A:P (default off)\n"
	       "  -S, --spin-us N            poller busy-spin after last work, us (default 50)\n"
	       "  -T, --hello-timeout-ms N   close connections silent this long (default 5000)\n"
	       "  -b, --backend B            auto | cuda | host (default auto)\n"
	       "  -l, --log-level L          err | warning | notice | info | debug\n"
	       "  -n, --numa-node N          auto | none | node number\n"
	       "  -H, --hugetlb yes|no       back the pool with hugetlb pages\n"
	       "  -L, --lock yes|no          mlock the pool (default yes)\n"
	       "      --pool-overcommit yes|no  start with a pool above MemAvailable (default no)\n"
	       "  -h, --help, -V, --version\n",
	       KVTD_DEFAULT_CONFIG, KVTD_DEFAULT_SOCKET);
}

int
kvtd_config_load(struct kvtd_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	int c, r;

	kvtd_config_defaults(cfg);
	/* First pass: only --config, --help and --version, so the file applies before flags. */
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "c:s:g:p:P:Q:M:S:T:b:l:n:H:L:hV", long_opts, NULL)) !=
	       -1) {
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
			printf("kvtierd %s (ABI %d.%d)\n", KVTIER_VERSION, KVT_ABI_MAJOR,
			       KVT_ABI_MINOR);
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
	while ((c = getopt_long(argc, argv, "c:s:g:p:P:Q:M:S:T:b:l:n:H:L:hV", long_opts, NULL)) !=
	       -1) {
		const char *key = flag_key(c);

		if (!key)
			continue;
		if (config_set(cfg, NULL, key, optarg) < 0) {
			for (const struct option *o = long_opts; o->name; o++)
				if (o->val == c)
					snprintf(err, errlen, "bad value '%s' for --%s%s", optarg,
						 o->name, value_hint(key));
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
	cfg->log_level = tmp.log_level;
	cfg->spin_us = tmp.spin_us;
	kvtd_log_set_level(cfg->log_level);
	return 0;
}
