/* SPDX-License-Identifier: MIT */
/*
 * The operators' view of prefix blocks against a real kvtierd: BLOCKS (and `kvtierctl blocks`,
 * its --json and the kvtier_prefix_* metrics) says the budget [prefix] cache_bytes resolves to,
 * as a share of --pool-size or as a size from the config file; counts what clients publish,
 * look up, deduplicate and still reference; and shows a peer that is not privileged only its
 * own uid's namespaces and the shared scope's when it is in it (children drop to uid 65534:
 * run as root, as check_ctl_access does).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_test.h"
#include "kvtier.h"

#define NOBODY	    65534
#define GROUP_SHARE 4545 /* in [prefix] share_gids */

enum { L = 2, H = 1, DIM = 16, BT = 4 };
#define TOK_FLOATS (L * 2 * H * DIM) /* one token's rows: 256 bytes, one pool slot */

static struct kvtd_proc D;

/* A daemon with @extra arguments and, when @conf is not NULL, a config file holding it that
 * another uid's process can use (directory 0711, socket 0666). */
static void
start(const char *conf, const char *pool_size)
{
	const char *extra[] = {"--pool-size", pool_size, NULL};

	if (conf)
		daemon_start_conf(&D, conf, DAEMON_SHARED, extra);
	else
		daemon_start(&D, extra);
}

static void
stop(void)
{
	ck_assert_int_eq(daemon_stop(&D), 0);
}

/* Runs kvtierctl with @args; returns its exit status, output in @out. */
static int
ctl(const char *args, char *out, size_t len)
{
	char cmd[512];
	size_t n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "%s --socket %s %s 2>&1", getenv("KVTIERCTL"), D.sock, args);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (n + 1 < len && fgets(out + n, (int)(len - n), p))
		n += strlen(out + n);
	out[n] = '\0';
	return WEXITSTATUS(pclose(p));
}

static struct json_object *
blocks(void)
{
	struct json_object *o = admin_request(D.sock, KVT_CTL_BLOCKS);

	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_get_i64(o, "schema"), KVT_CTL_SCHEMA);
	return o;
}

static size_t
n_namespaces(struct json_object *o)
{
	struct json_object *a;

	ck_assert(json_object_object_get_ex(o, "namespaces", &a));
	return json_object_array_length(a);
}

/* A fresh store: the budget, every counter 0, no namespace. */
static void
check_empty(struct json_object *o, int64_t budget)
{
	static const char *const zero[] = {"bytes",	 "blocks",	  "referenced", "lookups",
					   "hit_blocks", "miss_blocks",	  "published",	"deduped",
					   "evicted",	 "refused_budget"};

	ck_assert_int_eq(json_get_i64(o, "budget_bytes"), budget);
	for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
		ck_assert_msg(json_get_i64(o, zero[i]) == 0, "%s: %lld", zero[i],
			      (long long)json_get_i64(o, zero[i]));
	ck_assert_uint_eq(n_namespaces(o), 0);
}

/* The default 25% of --pool-size, through the request, kvtierctl and the metrics. */
START_TEST(t_blocks_fresh_default)
{
	static char out[1 << 20];
	struct json_object *o;

	start(NULL, "100M");
	o = blocks();
	check_empty(o, (100 << 20) / 4);
	json_object_put(o);

	ck_assert_int_eq(ctl("blocks", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "no prefix namespaces\n"), "%s", out);
	ck_assert_msg(strstr(out, "total  0 blocks (0 referenced), 0 B of 25.0 MiB budget"), "%s",
		      out);
	ck_assert_int_eq(ctl("blocks --json", out, sizeof(out)), 0);
	o = json_tokener_parse(out);
	ck_assert_msg(o, "not JSON: %s", out);
	check_empty(o, (100 << 20) / 4);
	ck_assert_int_eq(json_get_i64(o, "schema"), KVT_CTL_SCHEMA);
	json_object_put(o);

	ck_assert_int_eq(ctl("metrics", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "# TYPE kvtier_prefix_blocks gauge\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_budget_bytes 26214400\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_refused_total 0\n"));
	stop();
}
END_TEST

/* [prefix] cache_bytes from the config file: a size, a share of the pool set by the flag, 0. */
START_TEST(t_blocks_budget_from_config)
{
	static char out[1 << 20];
	struct json_object *o;

	start("[prefix]\ncache_bytes = 8M\n", "64M");
	o = blocks();
	check_empty(o, 8 << 20);
	json_object_put(o);
	stop();

	start("[prefix]\ncache_bytes = 10%\n", "100M"); /* the flag's pool, not the default's */
	o = blocks();
	check_empty(o, (100 << 20) / 10);
	json_object_put(o);
	stop();

	start("[prefix]\ncache_bytes = 0\n", "64M");
	o = blocks();
	check_empty(o, 0);
	json_object_put(o);
	ck_assert_int_eq(ctl("blocks", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "budget 0 (sharing off)"), "%s", out);
	stop();
}
END_TEST

/* BLOCKS carries nothing: a payload is refused alone, the connection goes on. */
START_TEST(t_blocks_malformed)
{
	static uint8_t buf[KVT_CTL_MAX_MSG];
	struct {
		struct kvt_ctl_hdr h;
		uint64_t junk;
	} m = {{KVT_CTL_BLOCKS, sizeof(m), 5}, 0};
	const struct kvt_ctl_error *e = (const void *)buf;
	struct kvt_ctl_hdr h = {KVT_CTL_BLOCKS, sizeof(h), 6};
	int fd;
	ssize_t n;

	start(NULL, "64M");
	fd = ctl_raw_connect(D.sock);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(send(fd, &m, sizeof(m), 0), sizeof(m));
	n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);
	ck_assert_int_eq(n, sizeof(*e));
	ck_assert_int_eq(e->hdr.type, KVT_CTL_ERROR);
	ck_assert_int_eq(e->hdr.id, 5);
	ck_assert_int_eq(e->err, -EINVAL);
	ck_assert_msg(strstr(e->msg, "malformed BLOCKS"), "%s", e->msg);
	ck_assert_int_eq(send(fd, &h, sizeof(h), 0), sizeof(h));
	n = ctl_raw_recv(fd, buf, sizeof(buf), 5000);
	ck_assert_int_gt(n, (ssize_t)sizeof(h));
	ck_assert_int_eq(((struct kvt_ctl_hdr *)buf)->type, KVT_CTL_JSON);
	ck_assert_int_eq(((struct kvt_ctl_hdr *)buf)->id, 6);
	close(fd);
	stop();
}
END_TEST

static struct kvt_ns_params
nsp(const char *name)
{
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = DIM,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = BT};

	snprintf(np.name, sizeof(np.name), "%s", name);
	return np;
}

static const struct kvt_seq_params seqp = {.size = sizeof(seqp),
					   .layers = L,
					   .kv_heads = H,
					   .head_dim = DIM,
					   .dtype = KVT_DTYPE_F32,
					   .delta = 8,
					   .hbm_frac = 0.5f};

/* A sequence of @ntok tokens (ids 1..ntok) in namespace @ns, its @nblk first blocks published.
 * Returns what kvt_publish() returned; *@ret_new: of them, newly published. */
static int
publish_prefix(struct kvt_client *c, const struct kvt_ns_params *np, uint32_t ns, uint32_t ntok,
	       uint32_t nblk, uint32_t *ret_seq, uint32_t *ret_new)
{
	static float rows[64 * TOK_FLOATS];
	struct kvt_block_key keys[16];
	uint32_t tokens[64];
	int r;

	for (uint32_t t = 0; t < ntok; t++) {
		tokens[t] = t + 1;
		for (int i = 0; i < TOK_FLOATS; i++)
			rows[t * TOK_FLOATS + i] = (float)(t * 1000 + i);
	}
	if (kvt_block_keys(np, NULL, tokens, ntok, keys, 16) < (int)nblk)
		return -EINVAL;
	r = kvt_seq_open_prefix(c, &seqp, ns, 0, ret_seq);
	if (r < 0)
		return r;
	if (kvt_append(c, *ret_seq, rows, (uint64_t)ntok * TOK_FLOATS * 4, ntok, NULL) != ntok)
		return -EIO;
	return kvt_publish(c, *ret_seq, keys, nblk, ret_new);
}

static struct json_object *
ns_named(struct json_object *o, const char *name)
{
	struct json_object *a, *e, *v;

	ck_assert(json_object_object_get_ex(o, "namespaces", &a));
	for (size_t i = 0; i < json_object_array_length(a); i++) {
		e = json_object_array_get_idx(a, i);
		if (json_object_object_get_ex(e, "name", &v) &&
		    !strcmp(json_object_get_string(v), name))
			return e;
	}
	return NULL;
}

/* Two clients, one prompt: the counts BLOCKS, kvtierctl and the metrics show at each step. */
START_TEST(t_blocks_counts)
{
	static char out[1 << 20];
	struct kvt_ns_params np = nsp("ctl-blocks-model");
	struct kvt_opts o = {.size = sizeof(o), .name = "ctl-blocks"};
	struct kvt_client *a, *b;
	struct kvt_block_key keys[3];
	uint32_t tokens[12], ns_a, ns_b, seq_a, seq_b, fresh;
	struct json_object *j, *n;

	start(NULL, "64M");
	ck_assert_int_eq(kvt_connect(D.sock, &o, &a), 0);
	ck_assert_int_eq(kvt_connect(D.sock, &o, &b), 0);
	ck_assert_int_eq(kvt_ns_open(a, &np, &ns_a), 0);
	ck_assert_int_eq(kvt_ns_open(b, &np, &ns_b), 0);

	/* a: 10 tokens, its 2 full blocks published */
	ck_assert_int_eq(publish_prefix(a, &np, ns_a, 10, 2, &seq_a, &fresh), 2);
	ck_assert_uint_eq(fresh, 2);
	/* b: looks up 3 blocks of a 12-token prompt: 2 found, 1 missed */
	for (uint32_t t = 0; t < 12; t++)
		tokens[t] = t + 1;
	ck_assert_int_eq(kvt_block_keys(&np, NULL, tokens, 12, keys, 3), 3);
	ck_assert_int_eq(kvt_lookup(b, ns_b, keys, 3, 0), 2);
	/* b computes the same 8 tokens itself and publishes them: the store keeps a's copy */
	ck_assert_int_eq(publish_prefix(b, &np, ns_b, 8, 2, &seq_b, &fresh), 2);
	ck_assert_uint_eq(fresh, 0);

	j = blocks();
	ck_assert_int_eq(json_get_i64(j, "blocks"), 2);
	ck_assert_int_eq(json_get_i64(j, "referenced"), 2);
	ck_assert_int_eq(json_get_i64(j, "bytes"), 2 * BT * TOK_FLOATS * 4);
	ck_assert_int_eq(json_get_i64(j, "lookups"), 1);
	ck_assert_int_eq(json_get_i64(j, "hit_blocks"), 2);
	ck_assert_int_eq(json_get_i64(j, "miss_blocks"), 1);
	ck_assert_int_eq(json_get_i64(j, "published"), 2);
	ck_assert_int_eq(json_get_i64(j, "deduped"), 2);
	ck_assert_int_eq(json_get_i64(j, "evicted"), 0);
	ck_assert_int_eq(json_get_i64(j, "refused_budget"), 0);
	ck_assert_uint_eq(n_namespaces(j), 1);
	n = ns_named(j, "ctl-blocks-model");
	ck_assert_ptr_nonnull(n);
	ck_assert_str_eq(json_object_get_string(json_object_object_get(n, "scope")), "uid");
	ck_assert_int_eq(json_get_i64(n, "uid"), (int64_t)geteuid());
	ck_assert_int_eq(json_get_i64(n, "layers"), L);
	ck_assert_int_eq(json_get_i64(n, "kv_heads"), H);
	ck_assert_int_eq(json_get_i64(n, "head_dim"), DIM);
	ck_assert_str_eq(json_object_get_string(json_object_object_get(n, "dtype")), "f32");
	ck_assert_int_eq(json_get_i64(n, "block_tokens"), BT);
	ck_assert_int_eq(json_get_i64(n, "blocks"), 2);
	ck_assert_int_eq(json_get_i64(n, "referenced"), 2);
	ck_assert_int_eq(json_get_i64(n, "bytes"), 2 * BT * TOK_FLOATS * 4);
	ck_assert_int_eq(json_get_i64(n, "handles"), 4); /* 2 NS_OPENs, 2 sequences */
	ck_assert_int_eq(json_get_i64(n, "hit_blocks"), 2);
	ck_assert_int_eq(json_get_i64(n, "miss_blocks"), 1);
	ck_assert_int_eq(json_get_i64(n, "published"), 2);
	ck_assert_int_eq(json_get_i64(n, "deduped"), 2);
	json_object_put(j);

	ck_assert_int_eq(ctl("blocks", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "ctl-blocks-model"), "%s", out);
	ck_assert_msg(strstr(out, "  66.7%  "), "hit rate 2 of 3: %s", out);
	ck_assert_msg(strstr(out, "total  2 blocks (2 referenced), 2.0 KiB of 16.0 MiB budget, "
				  "hit rate 66.7%\n       published 2, deduped 2, evicted 0, "
				  "refused 0\n"),
		      "%s", out);
	ck_assert_int_eq(ctl("metrics", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_blocks 2\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_referenced_blocks 2\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_bytes 2048\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_lookups_total 1\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_hits_total 2\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_misses_total 1\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_published_total 2\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvtier_prefix_deduped_total 2\n"));
	ck_assert_ptr_null(strstr(out, "ctl-blocks-model")); /* never a label */

	/* every user gone: the blocks stay cached, referenced by nobody */
	kvt_disconnect(a);
	kvt_disconnect(b);
	for (int i = 0; i < 500; i++) {
		j = blocks();
		if (json_get_i64(j, "referenced") == 0)
			break;
		json_object_put(j);
		j = NULL;
		usleep(10000);
	}
	ck_assert_msg(j, "blocks still referenced after both clients disconnected");
	ck_assert_int_eq(json_get_i64(j, "blocks"), 2);
	n = ns_named(j, "ctl-blocks-model");
	ck_assert_ptr_nonnull(n);
	ck_assert_int_eq(json_get_i64(n, "handles"), 0);
	ck_assert_int_eq(json_get_i64(n, "referenced"), 0);
	json_object_put(j);
	stop();
}
END_TEST

/* What a child reports: the namespace names BLOCKS showed it, and how far it got. */
struct view {
	int step; /* 0: all done, else the step that failed */
	int err;
	int namespaces;
	int64_t blocks; /* the store's total */
	char names[256];
};

/* As uid 65534 with supplementary group @group (0: none): publish one block in namespace @name
 * (NULL: none), then ask BLOCKS. */
static struct view
as_nobody(gid_t group, const char *name)
{
	struct view v;
	int p[2], st;
	pid_t pid;

	memset(&v, 0, sizeof(v));
	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvt_opts o = {.size = sizeof(o), .name = "nobody"};
		struct kvt_ns_params np = nsp(name ? name : "-");
		struct kvt_client *c = NULL;
		struct json_object *j, *a, *e;
		uint32_t ns, seq, fresh;

		close(p[0]);
		if (setgroups(group ? 1 : 0, &group) < 0 || setgid(NOBODY) < 0 ||
		    setuid(NOBODY) < 0)
			_exit(3);
		if (name) {
			v.step = 1;
			v.err = kvt_connect(D.sock, &o, &c);
			if (v.err == 0) {
				v.step = 2;
				v.err = kvt_ns_open(c, &np, &ns);
			}
			if (v.err == 0) {
				v.step = 3;
				v.err = publish_prefix(c, &np, ns, BT, 1, &seq, &fresh);
				v.err = v.err == 1 ? 0 : v.err < 0 ? v.err : -EPROTO;
			}
		}
		if (v.err == 0) {
			v.step = 4;
			j = admin_request(D.sock, KVT_CTL_BLOCKS);
			if (j && json_object_object_get_ex(j, "namespaces", &a)) {
				v.step = 0;
				v.blocks = json_get_i64(j, "blocks");
				v.namespaces = (int)json_object_array_length(a);
				for (int i = 0; i < v.namespaces; i++) {
					e = json_object_array_get_idx(a, i);
					size_t off = strlen(v.names);

					snprintf(v.names + off, sizeof(v.names) - off, "%s%s:%s",
						 i ? "," : "",
						 json_object_get_string(
						     json_object_object_get(e, "name")),
						 json_object_get_string(
						     json_object_object_get(e, "scope")));
				}
			}
			json_object_put(j);
		}
		if (c)
			kvt_disconnect(c);
		_exit(write(p[1], &v, sizeof(v)) == sizeof(v) ? 0 : 4);
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], &v, sizeof(v)), (ssize_t)sizeof(v));
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	ck_assert_msg(v.step == 0, "child failed at step %d: %s", v.step, kvt_strerror(v.err));
	return v;
}

/*
 * root's namespace, one that uid 65534 publishes in its own scope, and one it publishes as a
 * member of share_gids (the shared scope). Each block outlives its child (cached), so every
 * view below sees the three.
 */
START_TEST(t_blocks_visible_by_scope)
{
	struct kvt_opts o = {.size = sizeof(o), .name = "root-blocks"};
	struct kvt_ns_params np = nsp("root-model");
	struct json_object *j, *n;
	struct kvt_client *c;
	uint32_t ns, seq, fresh;
	struct view v;

	ck_assert_msg(geteuid() == 0, "check_ctl_blocks needs root: it connects as uid %d", NOBODY);
	start("[prefix]\nshare_gids = 4545\n", "64M");
	ck_assert_int_eq(kvt_connect(D.sock, &o, &c), 0);
	ck_assert_int_eq(kvt_ns_open(c, &np, &ns), 0);
	ck_assert_int_eq(publish_prefix(c, &np, ns, BT, 1, &seq, &fresh), 1);

	v = as_nobody(0, "nobody-model");
	ck_assert_str_eq(v.names, "nobody-model:uid");
	ck_assert_int_eq(v.blocks, 2);		  /* the totals are the whole store's */
	v = as_nobody(GROUP_SHARE, "team-model"); /* its uid's scope too */
	ck_assert_int_eq(v.namespaces, 2);
	ck_assert_msg(strstr(v.names, "nobody-model:uid") && strstr(v.names, "team-model:shared"),
		      "%s", v.names);

	/* outside the group: its own uid's only; inside: the shared scope's too; never root's */
	v = as_nobody(0, NULL);
	ck_assert_str_eq(v.names, "nobody-model:uid");
	ck_assert_int_eq(v.blocks, 3);
	v = as_nobody(GROUP_SHARE, NULL);
	ck_assert_int_eq(v.namespaces, 2);
	ck_assert_msg(strstr(v.names, "nobody-model:uid") && strstr(v.names, "team-model:shared"),
		      "%s", v.names);

	/* root sees all three, with the uid of each uid scope */
	j = blocks();
	ck_assert_uint_eq(n_namespaces(j), 3);
	n = ns_named(j, "nobody-model");
	ck_assert_ptr_nonnull(n);
	ck_assert_int_eq(json_get_i64(n, "uid"), NOBODY);
	ck_assert_int_eq(json_get_i64(ns_named(j, "root-model"), "uid"), 0);
	n = ns_named(j, "team-model");
	ck_assert_ptr_nonnull(n);
	ck_assert_str_eq(json_object_get_string(json_object_object_get(n, "scope")), "shared");
	ck_assert(!json_object_object_get_ex(n, "uid", NULL));
	json_object_put(j);
	kvt_disconnect(c);
	stop();
}
END_TEST

KVT_CHECK_MAIN("ctl_blocks", 120, NULL, NULL, t_blocks_fresh_default, t_blocks_budget_from_config,
	       t_blocks_malformed, t_blocks_counts, t_blocks_visible_by_scope)
