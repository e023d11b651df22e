/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "kvt_dev.h"
#include "kvt_test.h"

static char path[64];

static int
load_file(struct kvtd_config *cfg, const char *text, char *err, size_t errlen,
	  const char *const *flags)
{
	char *argv[16] = {"kvtierd", "--config", path};
	int argc = 3;
	FILE *f;

	snprintf(path, sizeof(path), "/tmp/kvt-conf-%d.ini", (int)getpid());
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	for (int i = 0; flags && flags[i]; i++)
		argv[argc++] = (char *)flags[i];
	argv[argc] = NULL;
	return kvtd_config_load(cfg, argc, argv, err, errlen);
}

START_TEST(t_defaults_without_file)
{
	struct kvtd_config cfg;
	char err[256] = "";
	char *argv[] = {"kvtierd", NULL};

	/* The default path need not exist. */
	ck_assert_int_eq(kvtd_config_load(&cfg, 1, argv, err, sizeof(err)), 0);
	ck_assert_str_eq(cfg.socket_path, KVTD_DEFAULT_SOCKET);
	ck_assert_uint_eq(cfg.pollers, 1);
	ck_assert_uint_eq(cfg.poller_slice_us, 200);
	ck_assert_uint_eq(cfg.socket_mode, 0660);
	ck_assert_int_eq(cfg.hugetlb, KVTD_HUGETLB_AUTO); /* reserved huge pages when they fit */
}
END_TEST

START_TEST(t_file_then_flags)
{
	struct kvtd_config cfg;
	char err[256] = "";
	const char *flags[] = {"--pollers",	    "3", "--pool-size", "1G",
			       "--poller-slice-us", "0", NULL};

	ck_assert_int_eq(load_file(&cfg,
				   "[daemon]\nsocket = /tmp/x.sock\npollers = 2\nspin_us = 7\n"
				   "poller_slice_us = 50\nmetrics_listen = localhost:9464\n"
				   "allowed_uids = 1000, 1001\nbackend = host\n"
				   "[pool]\nsize = 512M\nhugetlb = no\nnuma_node = 0\n"
				   "[limits]\npool_bytes_per_uid = 2G\nmax_sq_entries = 1024\n",
				   err, sizeof(err), flags),
			 0);
	ck_assert_str_eq(cfg.socket_path, "/tmp/x.sock");
	ck_assert_uint_eq(cfg.pollers, 3);	   /* flag wins */
	ck_assert_uint_eq(cfg.poller_slice_us, 0); /* 0 is a value: no turns */
	ck_assert_str_eq(cfg.metrics_listen, "localhost:9464");
	ck_assert_uint_eq(cfg.spin_us, 7);
	ck_assert_uint_eq(cfg.n_allowed_uids, 2);
	ck_assert_uint_eq(cfg.allowed_uids[1], 1001);
	ck_assert_int_eq(cfg.backend, KVT_DEV_HOST);
	ck_assert_uint_eq(cfg.pool_size, 1ull << 30);
	ck_assert_int_eq(cfg.numa_node, 0);
	ck_assert_int_eq(cfg.hugetlb, KVTD_HUGETLB_NO);
	ck_assert_uint_eq(cfg.pool_bytes_per_uid, 2ull << 30);
	ck_assert_uint_eq(cfg.max_sq_entries, 1024);
	unlink(path);
}
END_TEST

/* [prefix] cache_bytes: a share of the pool (exact, whatever the pool size), a size, 0, and the
 * pool as the ceiling; a flag that sets the pool after the key still counts. */
START_TEST(t_prefix_cache)
{
	struct kvtd_config cfg;
	char err[256] = "";
	const char *pool64[] = {"--pool-size", "64M", NULL};
	const char *pool4[] = {"--pool-size", "4M", NULL};

	ck_assert_int_eq(load_file(&cfg, "", err, sizeof(err), pool64), 0);
	ck_assert_uint_eq(kvtd_config_prefix_bytes(&cfg), 16ull << 20); /* the default, 25% */
	ck_assert_int_eq(load_file(&cfg, "[prefix]\ncache_bytes = 33%\n", err, sizeof(err), pool64),
			 0);
	ck_assert_uint_eq(kvtd_config_prefix_bytes(&cfg), (64ull << 20) * 33 / 100);
	ck_assert_int_eq(load_file(&cfg, "[prefix]\ncache_bytes = 8M\n", err, sizeof(err), pool64),
			 0);
	ck_assert_uint_eq(kvtd_config_prefix_bytes(&cfg), 8ull << 20);
	ck_assert_int_eq(load_file(&cfg, "[prefix]\ncache_bytes = 8M\n", err, sizeof(err), pool4),
			 0);
	ck_assert_uint_eq(kvtd_config_prefix_bytes(&cfg), 4ull << 20);
	ck_assert_int_eq(load_file(&cfg, "[prefix]\ncache_bytes = 0\n", err, sizeof(err), pool64),
			 0);
	ck_assert_uint_eq(kvtd_config_prefix_bytes(&cfg), 0);
	ck_assert_int_eq(
	    load_file(&cfg, "[prefix]\ncache_bytes = 101%\n", err, sizeof(err), pool64), -EINVAL);
	ck_assert_int_eq(load_file(&cfg, "[prefix]\ncache_bytes = %\n", err, sizeof(err), pool64),
			 -EINVAL);
	unlink(path);
}
END_TEST

/* [retrieval] sketch: yes by default; yes or no (as every boolean); anything else is refused,
 * the message naming the file, the line, the key and what it takes. */
START_TEST(t_retrieval_sketch)
{
	struct kvtd_config cfg;
	char err[256] = "";

	ck_assert_int_eq(load_file(&cfg, "", err, sizeof(err), NULL), 0);
	ck_assert_int_eq(cfg.retrieval_sketch, 1);
	ck_assert_int_eq(load_file(&cfg, "[retrieval]\nsketch = no\n", err, sizeof(err), NULL), 0);
	ck_assert_int_eq(cfg.retrieval_sketch, 0);
	ck_assert_int_eq(load_file(&cfg, "[retrieval]\nsketch = yes\n", err, sizeof(err), NULL), 0);
	ck_assert_int_eq(cfg.retrieval_sketch, 1);
	ck_assert_int_eq(load_file(&cfg, "[retrieval]\nsketch = off\n", err, sizeof(err), NULL), 0);
	ck_assert_int_eq(cfg.retrieval_sketch, 0);
	ck_assert_int_eq(load_file(&cfg, "[daemon]\nspin_us = 5\n\n[retrieval]\nsketch = maybe\n",
				   err, sizeof(err), NULL),
			 -EINVAL);
	ck_assert_msg(strstr(err, path) && strstr(err, ":5: bad value for [retrieval] sketch = "
						       "'maybe': yes or no"),
		      "%s", err);
	/* a key of [retrieval], not of another section */
	ck_assert_int_eq(load_file(&cfg, "[prefix]\nsketch = no\n", err, sizeof(err), NULL),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "unknown key [prefix] sketch"));
	unlink(path);
}
END_TEST

START_TEST(t_bad_values)
{
	static const char *const bad[] = {
	    "[daemon]\npollers = 0\n",
	    "[daemon]\npollers = abc\n",
	    "[daemon]\npoller_slice_us = 1000001\n",
	    "[daemon]\nmetrics_listen = 0.0.0.0:9464\n", /* loopback only */
	    "[daemon]\nmetrics_listen = 127.0.0.1:65536\n",
	    "[daemon]\nmetrics_listen = 127.0.0.1\n",
	    "[daemon]\nbackend = tpu\n",
	    "[pool]\nsize = 1x\n",
	    "[pool]\nsize = 1M\n",
	    "[pool]\nchunk_size = 3M\n",
	    "[limits]\nmax_sq_entries = 1000\n",
	    "[daemon]\nno_such_key = 1\n",
	    "[nosection]\npollers = 1\n",
	    "[daemon]\nsocket_mode = 999\n",
	    "[pool]\nhugetlb = maybe\n",
	    "[retrieval]\nsketch = 2\n",
	    "[retrieval]\nsketch =\n",
	    "this is not ini\n",
	    "[pool]\nsize = 99999999999999999999G\n",
	};

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvtd_config cfg;
		char err[256] = "";

		ck_assert_msg(load_file(&cfg, bad[i], err, sizeof(err), NULL) == -EINVAL,
			      "accepted: %s", bad[i]);
		/* The message names the file and line for a person to fix. */
		ck_assert_msg(strstr(err, path) != NULL, "message lacks the path: %s", err);
	}
	unlink(path);
}
END_TEST

START_TEST(t_bad_flags)
{
	static const char *const bad[][3] = {
	    {"--pollers", "-1", NULL}, {"--backend", "gpu", NULL}, {"--bogus", NULL, NULL},
	    {"--pool-size", "", NULL}, {"stray", NULL, NULL},
	};

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvtd_config cfg;
		char err[256] = "";

		ck_assert_int_eq(load_file(&cfg, "", err, sizeof(err), bad[i]), -EINVAL);
		ck_assert(err[0]);
	}
	unlink(path);
}
END_TEST

START_TEST(t_missing_explicit_file)
{
	struct kvtd_config cfg;
	char err[256] = "";
	char *argv[] = {"kvtierd", "--config", "/nonexistent/kvtierd.conf", NULL};

	ck_assert_int_eq(kvtd_config_load(&cfg, 3, argv, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/kvtierd.conf"));
}
END_TEST

START_TEST(t_sizes)
{
	uint64_t v;

	ck_assert_int_eq(kvtd_parse_size("4096", &v), 0);
	ck_assert_uint_eq(v, 4096);
	ck_assert_int_eq(kvtd_parse_size("2K", &v), 0);
	ck_assert_uint_eq(v, 2048);
	ck_assert_int_eq(kvtd_parse_size("3GiB", &v), 0);
	ck_assert_uint_eq(v, 3ull << 30);
	ck_assert_int_eq(kvtd_parse_size("-1", &v), -EINVAL);
	ck_assert_int_eq(kvtd_parse_size("", &v), -EINVAL);
	ck_assert_int_eq(kvtd_parse_size("17179869184T", &v), -EINVAL); /* overflow */
	ck_assert_int_eq(kvtd_parse_size("1Q", &v), -EINVAL);
}
END_TEST

/* The example config we install parses with every key uncommented. */
START_TEST(t_shipped_example)
{
	char line[512], text[8192] = "";
	FILE *f = fopen(KVT_SOURCE_DIR "/systemd/kvtierd.conf", "r");
	struct kvtd_config cfg;
	char err[256] = "";
	int keys = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		char key[64], val[256];

		if (line[0] == '[') {
			strcat(text, line);
		} else if (sscanf(line, "#%63[a-z_] = %255s", key, val) == 2) {
			snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s = %s\n", key,
				 val);
			keys++;
		}
	}
	fclose(f);
	ck_assert_int_ge(keys, 15);
	ck_assert_msg(load_file(&cfg, text, err, sizeof(err), NULL) == 0, "%s", err);
	unlink(path);
}
END_TEST

/* Every key's default parses, and --config-keys prints a config file that loads back to the
 * defaults, naming every key the shipped example documents and no other. */
START_TEST(t_config_keys)
{
	struct kvtd_config def, cfg;
	char err[256] = "", *text = NULL, line[512], key[64], documented[4096] = "";
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	char *argv[] = {"kvtierd", NULL};

	ck_assert_msg(kvtd_config_check_defaults(err, sizeof(err)) == 0, "%s", err);
	kvtd_config_describe(f);
	fclose(f);
	ck_assert_msg(load_file(&cfg, text, err, sizeof(err), NULL) == 0, "%s", err);
	unlink(path);
	ck_assert_int_eq(kvtd_config_load(&def, 1, argv, err, sizeof(err)), 0);
	/* everything but where the file came from */
	memcpy(cfg.config_path, def.config_path, sizeof(def.config_path));
	cfg.config_explicit = def.config_explicit;
	ck_assert(!memcmp(&cfg, &def, sizeof(cfg)));

	/* The shipped example documents each key as "#key = value", and only keys. */
	f = fopen(KVT_SOURCE_DIR "/systemd/kvtierd.conf", "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		char pat[80];

		if (sscanf(line, "#%63[a-z_] =", key) != 1)
			continue;
		snprintf(pat, sizeof(pat), "\n%s = ", key);
		ck_assert_msg(strstr(text, pat), "kvtierd.conf documents '%s', not a key", key);
		snprintf(pat, sizeof(pat), "#%s =", key);
		strcat(documented, pat);
	}
	fclose(f);
	for (char *p = text; (p = strchr(p, '\n')); p++) {
		char pat[80];

		if (sscanf(p + 1, "%63[a-z_] =", key) != 1)
			continue;
		snprintf(pat, sizeof(pat), "#%s =", key);
		ck_assert_msg(strstr(documented, pat), "key '%s' missing from kvtierd.conf", key);
	}
	free(text);
}
END_TEST

/* [spill]: off by default; path, size, queue_depth and a uid share as a size or a percentage. */
START_TEST(t_spill)
{
	struct kvtd_config cfg;
	char err[256] = "";

	ck_assert_int_eq(load_file(&cfg, "", err, sizeof(err), NULL), 0);
	ck_assert_str_eq(cfg.spill_path, "");
	ck_assert_uint_eq(cfg.spill_size, 0);
	ck_assert_uint_eq(cfg.spill_queue_depth, 64);
	ck_assert_int_eq(cfg.spill_uid_share_pct, 50);
	ck_assert_int_eq(load_file(&cfg,
				   "[spill]\npath = /var/lib/kvtier/spill\nsize = 64G\n"
				   "queue_depth = 32\nuid_share = 8G\n",
				   err, sizeof(err), NULL),
			 0);
	ck_assert_str_eq(cfg.spill_path, "/var/lib/kvtier/spill");
	ck_assert_uint_eq(cfg.spill_size, 64ull << 30);
	ck_assert_uint_eq(cfg.spill_queue_depth, 32);
	ck_assert_uint_eq(cfg.spill_uid_share, 8ull << 30);
	ck_assert_int_eq(cfg.spill_uid_share_pct, -1);
	ck_assert_int_eq(load_file(&cfg, "[spill]\nuid_share = 25%\n", err, sizeof(err), NULL), 0);
	ck_assert_int_eq(cfg.spill_uid_share_pct, 25);
	ck_assert_uint_eq(cfg.spill_uid_share, 0);
	ck_assert_int_eq(load_file(&cfg, "[spill]\nuid_share = 101%\n", err, sizeof(err), NULL),
			 -EINVAL);
	ck_assert_msg(strstr(err, "bad value for [spill] uid_share = '101%': a size"), "%s", err);
	ck_assert_int_eq(load_file(&cfg, "[spill]\nqueue_depth = 0\n", err, sizeof(err), NULL),
			 -EINVAL);
	ck_assert_int_eq(load_file(&cfg, "[spill]\nqueue_depth = 4097\n", err, sizeof(err), NULL),
			 -EINVAL);
	ck_assert_int_eq(load_file(&cfg, "[spill]\nsize = -1\n", err, sizeof(err), NULL), -EINVAL);
	unlink(path);
}
END_TEST

KVT_CHECK_MAIN("config", 0, NULL, NULL, t_defaults_without_file, t_file_then_flags, t_bad_values,
	       t_prefix_cache, t_bad_flags, t_missing_explicit_file, t_sizes, t_shipped_example,
	       t_config_keys, t_retrieval_sketch, t_spill)
