/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench prefix - what prefix sharing (docs/prefix.md) saves, measured side by side in one
 * run, with kvtier-llm (SmolLM2-135M) on a ~2K-token prompt against a private kvtierd:
 *
 *   ttft_cold_ms / ttft_shared_ms   time to first token of a second process on the same prompt,
 *                                   without sharing (it computes the whole prompt) and with
 *                                   --share-prefix (the first process published it): kvtier-llm's
 *                                   own ttft_ms, from the start of its prefill (block keys,
 *                                   LOOKUP and SEQ_OPEN included) to its first token sampled.
 *   pool_bytes_private / _shared    the daemon's pool bytes in use while two such processes hold
 *                                   their sequences (prompt + generated), without and with
 *                                   sharing, each on a fresh daemon.
 *   lookup_us_32k                   kvt_lookup() of a 32K-token prefix: 2048 blocks of 16 tokens
 *                                   published from a synthetic sequence, all 2048 keys looked up
 *                                   (and, _pin, pinned), over --lookup-reps repetitions.
 *
 * The phases: daemon 1: two processes without sharing, held (pool_bytes_private; the second
 * is the first cold TTFT sample). Daemon 2: a process with --share-prefix publishes, a second
 * with it opens from the blocks, both held (pool_bytes_shared; the second is the first shared
 * sample); then cold and shared runs alternate until --reps of each, then the LOOKUP timing.
 * Every shared run must generate the tokens of the cold runs (greedy), else the benchmark fails.
 * Repeated measurements are reported as median, p5 and p99 (nearest rank).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "daemon.h"
#include "generate.h"
#include "kvt_cli.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "model.h"
#include "tokenizer.h"

#ifndef KVT_LLM_BUILD_PATH
#define KVT_LLM_BUILD_PATH "kvtier-llm"
#endif

struct opts {
	const char *model;
	const char *llm;
	uint32_t prompt_tokens; /* at least this many */
	uint32_t gen;
	uint32_t reps;
	uint32_t lookup_reps;
	uint32_t threads;
	int json;
};

/* A run of kvtier-llm: its pid, stdout and, once printed, its JSON. */
struct run {
	pid_t pid;
	int out;
	char *buf;
	size_t len, cap;
	struct json_object *doc;
};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile @p (0..100] of @n values; sorts @v. */
static double
pct(double *v, uint32_t n, double p)
{
	uint32_t r = (uint32_t)ceil(p / 100.0 * n);

	qsort(v, n, sizeof(*v), cmp_double);
	return v[r ? r - 1 : 0];
}

static double
median(double *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static struct json_object *
dist(double *v, uint32_t n)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "n", json_object_new_int64(n));
	json_object_object_add(o, "median", json_object_new_double(median(v, n)));
	json_object_object_add(o, "p5", json_object_new_double(pct(v, n, 5)));
	json_object_object_add(o, "p99", json_object_new_double(pct(v, n, 99)));
	return o;
}

static const char *
llm_path(const struct opts *o)
{
	static char buf[PATH_MAX];
	ssize_t n;

	if (o->llm)
		return o->llm;
	n = readlink("/proc/self/exe", buf, sizeof(buf) - 16);
	if (n > 0) {
		buf[n] = '\0';
		strcpy(strrchr(buf, '/') + 1, "kvtier-llm");
		if (access(buf, X_OK) == 0)
			return buf;
	}
	return KVT_LLM_BUILD_PATH;
}

/* Starts kvtier-llm on @prompt; @hold: it keeps its sequence open after printing its JSON. */
static int
run_start(struct run *r, const struct opts *o, const char *sock, const char *prompt, int share,
	  int hold)
{
	char gen[16], threads[16];
	const char *argv[32];
	int n = 0, p[2];

	snprintf(gen, sizeof(gen), "%u", o->gen);
	snprintf(threads, sizeof(threads), "%u", o->threads);
	argv[n++] = llm_path(o);
	argv[n++] = "--model";
	argv[n++] = o->model;
	argv[n++] = "--prompt";
	argv[n++] = prompt;
	argv[n++] = "--max-tokens";
	argv[n++] = gen;
	argv[n++] = "--threads";
	argv[n++] = threads;
	argv[n++] = "--json";
	argv[n++] = "--kv";
	argv[n++] = "kvtier";
	argv[n++] = "--socket";
	argv[n++] = sock;
	if (share)
		argv[n++] = "--share-prefix";
	if (hold) {
		argv[n++] = "--hold-seconds";
		argv[n++] = "3600";
	}
	argv[n] = NULL;
	memset(r, 0, sizeof(*r));
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	r->pid = fork();
	if (r->pid < 0)
		return -errno;
	if (r->pid == 0) {
		dup2(p[1], 1);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "kvtier-bench prefix: cannot run %s: %s (--llm PATH)\n", argv[0],
			strerror(errno));
		_exit(127);
	}
	close(p[1]);
	r->out = p[0];
	return 0;
}

/* Reads the run's stdout until its JSON object is whole. */
static int
run_json(struct run *r)
{
	while (!r->doc) {
		ssize_t n;

		if (r->cap - r->len < 4096) {
			char *b = realloc(r->buf, r->cap + 65536);

			if (!b)
				return -ENOMEM;
			r->buf = b;
			r->cap += 65536;
		}
		n = read(r->out, r->buf + r->len, r->cap - r->len - 1);
		if (n <= 0) {
			fprintf(stderr,
				"kvtier-bench prefix: kvtier-llm %d ended without its JSON\n",
				(int)r->pid);
			return -EPROTO;
		}
		r->len += (size_t)n;
		r->buf[r->len] = '\0';
		if (r->buf[r->len - 1] == '\n')
			r->doc = json_tokener_parse(r->buf);
	}
	return 0;
}

/* Ends the run (SIGTERM when held) and frees it; -ECHILD if it failed. */
static int
run_end(struct run *r, int held)
{
	int st, ret = 0;

	if (held)
		kill(r->pid, SIGTERM);
	if (waitpid(r->pid, &st, 0) != r->pid || !(held ? WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM
							: WIFEXITED(st) && WEXITSTATUS(st) == 0))
		ret = -ECHILD;
	close(r->out);
	free(r->buf);
	json_object_put(r->doc);
	return ret;
}

static int64_t
jint(struct json_object *o, const char *k)
{
	struct json_object *v;

	return json_object_object_get_ex(o, k, &v) ? json_object_get_int64(v) : -1;
}

static double
jdouble(struct json_object *o, const char *k)
{
	struct json_object *v;

	return json_object_object_get_ex(o, k, &v) ? json_object_get_double(v) : NAN;
}

static const char *
jtokens(struct json_object *o)
{
	struct json_object *v;

	return json_object_object_get_ex(o, "tokens", &v)
		   ? json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN)
		   : "";
}

/* The daemon's STATUS "pool.used" and "sessions" (admin socket, proto/kvt_ctl.h). */
static int
daemon_status(const char *sock, int64_t *ret_used, int64_t *ret_sessions)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hdr h = {.type = KVT_CTL_STATUS, .len = sizeof(h), .id = 1};
	static char buf[KVT_CTL_MAX_MSG];
	struct json_object *o, *pool;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), ret = -EPROTO;
	ssize_t n;

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || send(fd, &h, sizeof(h), 0) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	n = recv(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	if (n <= (ssize_t)sizeof(h) || ((struct kvt_ctl_hdr *)buf)->type != KVT_CTL_JSON)
		return -EPROTO;
	buf[n] = '\0';
	o = json_tokener_parse(buf + sizeof(h));
	if (o && json_object_object_get_ex(o, "pool", &pool)) {
		*ret_used = jint(pool, "used");
		*ret_sessions = jint(o, "sessions");
		ret = *ret_used >= 0 && *ret_sessions >= 0 ? 0 : -EPROTO;
	}
	json_object_put(o);
	return ret;
}

/* Sessions end asynchronously after their process: wait for none (up to 10 s). */
static int
wait_idle(const char *sock)
{
	int64_t used, sessions;

	for (int i = 0; i < 1000; i++) {
		int r = daemon_status(sock, &used, &sessions);

		if (r < 0)
			return r;
		if (!sessions)
			return 0;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

/*
 * A prompt of at least @ntok tokens: paragraphs of a technical text, numbered so that no two
 * are the same, until the model's tokenizer counts enough. Sets *@ret_n to the count.
 */
static char *
build_prompt(const char *model, uint32_t ntok, uint32_t *ret_n)
{
	static const char *const para =
	    "Section %u. A KV cache keeps the keys and values of every token a transformer has "
	    "seen, so that each new token attends to them without recomputing them. Its size grows "
	    "with the context: layers times heads times head dimension times two, per token. When "
	    "many requests share a system prompt, the rows of that prompt are the same in each, "
	    "and a cache that stores them once saves both the memory and the time to compute "
	    "them. ";
	struct llm_model *m = NULL;
	struct llm_tok *t = NULL;
	struct llm_ids ids = {0};
	char err[256], *s = NULL, line[1024];
	size_t len = 0;

	if (llm_model_load(model, &m, err, sizeof(err)) < 0 ||
	    llm_tok_load(m->gguf, &t, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvtier-bench prefix: %s: %s\n", model, err);
		llm_model_free(m);
		return NULL;
	}
	for (uint32_t i = 1; !s || ids.n < ntok; i++) {
		int n = snprintf(line, sizeof(line), para, i);
		char *b = realloc(s, len + (size_t)n + 1);

		if (!b)
			goto err;
		s = b;
		memcpy(s + len, line, (size_t)n + 1);
		len += (size_t)n;
		ids.n = 0;
		if (llm_plain_prompt(t, m->gguf, s, &ids) < 0)
			goto err;
	}
	*ret_n = (uint32_t)ids.n;
	llm_ids_free(&ids);
	llm_tok_free(t);
	llm_model_free(m);
	return s;
err:
	free(s);
	llm_ids_free(&ids);
	llm_tok_free(t);
	llm_model_free(m);
	return NULL;
}

/*
 * Two processes on @prompt holding their sequences (@share: with --share-prefix): the pool bytes
 * in use with both held; the second's JSON goes to *@ret_second (the caller puts it).
 */
static int
pool_pair(const struct opts *o, const char *sock, const char *prompt, int share, int64_t *ret_used,
	  struct json_object **ret_second)
{
	struct run a, b;
	int64_t sessions;
	int r;

	r = run_start(&a, o, sock, prompt, share, 1);
	if (r < 0)
		return r;
	r = run_json(&a);
	if (r == 0)
		r = run_start(&b, o, sock, prompt, share, 1);
	if (r < 0) {
		run_end(&a, 1);
		return r;
	}
	r = run_json(&b);
	if (r == 0)
		r = daemon_status(sock, ret_used, &sessions);
	if (r == 0) {
		*ret_second = json_object_get(b.doc);
		if (share && jint(b.doc, "matched_tokens") <= 0) {
			fprintf(stderr,
				"kvtier-bench prefix: the second process matched nothing\n");
			r = -EPROTO;
		}
	}
	if (run_end(&a, 1) < 0 || run_end(&b, 1) < 0)
		r = r < 0 ? r : -ECHILD;
	return r < 0 ? r : wait_idle(sock);
}

/* One run to its end; its JSON in *@ret_doc. */
static int
run_once(const struct opts *o, const char *sock, const char *prompt, int share,
	 struct json_object **ret_doc)
{
	struct run r;
	int ret = run_start(&r, o, sock, prompt, share, 0);

	if (ret < 0)
		return ret;
	ret = run_json(&r);
	if (ret == 0)
		*ret_doc = json_object_get(r.doc);
	if (run_end(&r, 0) < 0 && ret == 0) {
		json_object_put(*ret_doc);
		ret = -ECHILD;
	}
	return ret < 0 ? ret : wait_idle(sock);
}

/*
 * LOOKUP of a 32K-token prefix: a synthetic sequence (one layer, one kv head, head_dim 8, f32:
 * the key count, not the row size, is what LOOKUP costs) publishes 2048 blocks of 16 tokens;
 * then kvt_lookup() of all 2048 keys, plain and pinning, @reps times each, in microseconds.
 */
static int
lookup_bench(const char *sock, uint32_t reps, double *us, double *us_pin)
{
	enum { L = 1, H = 1, D = 8, BT = 16, NBLK = 2048, NTOK = NBLK * BT, CHUNK = 256 };
	struct kvt_opts co = {.size = sizeof(co), .spin_us = 50, .name = "bench-prefix"};
	struct kvt_ns_params np = {.size = sizeof(np),
				   .layers = L,
				   .kv_heads = H,
				   .head_dim = D,
				   .dtype = KVT_DTYPE_F32,
				   .block_tokens = BT};
	struct kvt_seq_params p = {.size = sizeof(p)};
	struct kvt_client *c = NULL;
	struct kvt_buf *stage = NULL;
	struct kvt_block_key *keys = malloc(NBLK * sizeof(*keys));
	uint32_t *tok = malloc(NTOK * sizeof(*tok)), ns, seq, n_new;
	float *rows = malloc((size_t)CHUNK * L * 2 * H * D * sizeof(float));
	int r = -ENOMEM;

	if (!keys || !tok || !rows)
		goto out;
	snprintf(np.name, sizeof(np.name), "kvtier-bench-prefix-synthetic");
	r = kvt_connect(sock, &co, &c);
	if (r < 0)
		goto out;
	r = kvt_buf_alloc(c, (size_t)L * 2 * 64 * H * D * 4, &stage);
	if (r < 0)
		goto out;
	r = kvt_ns_open(c, &np, &ns);
	if (r < 0)
		goto out;
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 64;
	p.stage_buf_id = kvt_buf_id(stage);
	p.stage_slots = 64;
	p.stage_slot_stride = H * D * 4;
	p.stage_kv_stride = 64ull * H * D * 4;
	p.stage_layer_stride = 2ull * 64 * H * D * 4;
	r = kvt_seq_open_prefix(c, &p, ns, 0, &seq);
	if (r < 0)
		goto out;
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 1000 + (i * 2654435761u) % 40000;
	for (uint32_t i = 0; i < (uint32_t)CHUNK * L * 2 * H * D; i++)
		rows[i] = (float)i;
	for (uint32_t t = 0; t < NTOK; t += CHUNK) {
		int64_t n =
		    kvt_append(c, seq, rows, (uint64_t)CHUNK * L * 2 * H * D * 4, CHUNK, NULL);

		if (n < 0) {
			r = (int)n;
			goto out;
		}
	}
	r = kvt_block_keys(&np, NULL, tok, NTOK, keys, NBLK);
	if (r == NBLK)
		r = kvt_publish(c, seq, keys, NBLK, &n_new);
	if (r != NBLK) {
		fprintf(stderr, "kvtier-bench prefix: published %d of %d blocks\n", r, NBLK);
		r = r < 0 ? r : -EPROTO;
		goto out;
	}
	for (uint32_t i = 0; i < 2 * reps; i++) {
		unsigned fl = i % 2 ? KVT_LOOKUP_F_PIN : 0;
		double t0 = now_s();

		r = kvt_lookup(c, ns, keys, NBLK, fl);
		if (r != NBLK) {
			fprintf(stderr, "kvtier-bench prefix: LOOKUP found %d of %d blocks\n", r,
				NBLK);
			r = r < 0 ? r : -EPROTO;
			goto out;
		}
		(fl ? us_pin : us)[i / 2] = (now_s() - t0) * 1e6;
	}
	r = 0;
out:
	if (r < 0 && c)
		fprintf(stderr, "kvtier-bench prefix: lookup: %s: %s\n", kvt_strerror(r),
			kvt_last_error());
	kvt_disconnect(c);
	free(keys);
	free(tok);
	free(rows);
	return r;
}

#define OFF(m) offsetof(struct opts, m)

static const struct kvt_cli_opt prefix_opts[] = {
    {"json", 0, NULL, "one JSON object instead of the report", .apply = kvt_cli_flag,
     .off = OFF(json)},
    {"reps", 0, "N", "cold and shared runs each (3)", .apply = kvt_cli_u32, .off = OFF(reps),
     .min = 1, .max = 100000},
    {"prompt-tokens", 0, "N", "the prompt's length at least (2048)", .apply = kvt_cli_u32,
     .off = OFF(prompt_tokens), .min = 1, .max = 100000},
    {"gen", 0, "N", "tokens each run generates (8)", .apply = kvt_cli_u32, .off = OFF(gen),
     .min = 1, .max = 100000},
    {"lookup-reps", 0, "N", "LOOKUPs timed, plain and pinning each (200)", .apply = kvt_cli_u32,
     .off = OFF(lookup_reps), .min = 1, .max = 100000},
    {"threads", 0, "N", "kvtier-llm's threads (1)", .apply = kvt_cli_u32, .off = OFF(threads),
     .min = 1, .max = 64},
    {"model", 0, "PATH", "GGUF (default: kvtier-llm's, tools/fetch-model.sh)", .apply = kvt_cli_str,
     .off = OFF(model)},
    {"llm", 0, "PATH", "kvtier-llm (default: beside this program, else the build's)",
     .apply = kvt_cli_str, .off = OFF(llm)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

static const struct kvt_cli prefix_cli = {
    .prog = "kvtier-bench prefix",
    .intro = "usage: kvtier-bench prefix [options]\n"
	     "Time to first token of a second kvtier-llm process on a shared prompt with\n"
	     "--share-prefix against without, the pool bytes of two such processes with\n"
	     "and without, and LOOKUP latency for a 32K-token prefix (docs/prefix.md).\n\n",
    .opts = prefix_opts,
};

static int
parse(int argc, char **argv, struct opts *o)
{
	static char model[PATH_MAX];

	o->prompt_tokens = 2048;
	o->gen = 8;
	o->reps = 3;
	o->lookup_reps = 200;
	o->threads = 1;
	if (kvt_cli_parse(&prefix_cli, argc, argv, o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-bench prefix --help'.\n");
		return -EINVAL;
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-bench prefix: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (!o->model) {
		if (llm_default_model_path(model, sizeof(model)) < 0) {
			fprintf(stderr,
				"kvtier-bench prefix: no --model and no default model path\n");
			return -EINVAL;
		}
		o->model = model;
	}
	if (access(o->model, R_OK) < 0) {
		fprintf(stderr,
			"kvtier-bench prefix: model %s not found: run tools/fetch-model.sh or pass "
			"--model\n",
			o->model);
		return -ENOENT;
	}
	return 0;
}

int
main(int argc, char **argv)
{
	static const char *const dargs[] = {"--pool-size", "1G", NULL};
	struct opts o = {0};
	struct bench_daemon d;
	struct json_object *cold = NULL, *shared = NULL, *out;
	double *tc = NULL, *ts = NULL, *lu = NULL, *lp = NULL;
	int64_t used_private = 0, used_shared = 0, matched = 0, prefill_shared = 0;
	uint32_t ntok = 0, nc = 0, ns = 0;
	char *prompt = NULL, *ref = NULL;
	int r, status = 1;

	if (parse(argc, argv, &o) < 0)
		return 2;
	prompt = build_prompt(o.model, o.prompt_tokens, &ntok);
	tc = calloc(o.reps, sizeof(*tc));
	ts = calloc(o.reps, sizeof(*ts));
	lu = calloc(o.lookup_reps, sizeof(*lu));
	lp = calloc(o.lookup_reps, sizeof(*lp));
	if (!prompt || !tc || !ts || !lu || !lp)
		goto out;
	if (!o.json)
		fprintf(stderr, "kvtier-bench prefix: a %u-token prompt, %u tokens generated\n",
			ntok, o.gen);

	/* daemon 1: two private sequences */
	r = bench_daemon_start(&d, dargs);
	if (r < 0) {
		fprintf(stderr, "kvtier-bench prefix: kvtierd: %s\n", strerror(-r));
		goto out;
	}
	r = pool_pair(&o, d.sock, prompt, 0, &used_private, &cold);
	bench_daemon_stop(&d);
	if (r < 0)
		goto err;
	tc[nc++] = jdouble(cold, "ttft_ms");
	ref = strdup(jtokens(cold));

	/* daemon 2: a publisher and a sharer, then cold and shared runs alternating */
	r = bench_daemon_start(&d, dargs);
	if (r < 0) {
		fprintf(stderr, "kvtier-bench prefix: kvtierd: %s\n", strerror(-r));
		goto out;
	}
	r = pool_pair(&o, d.sock, prompt, 1, &used_shared, &shared);
	while (r == 0 && (nc < o.reps || ns < o.reps)) {
		if (shared) {
			if (strcmp(jtokens(shared), ref)) {
				fprintf(stderr,
					"kvtier-bench prefix: shared tokens %s differ from "
					"cold %s\n",
					jtokens(shared), ref);
				r = -EPROTO;
				break;
			}
			matched = jint(shared, "matched_tokens");
			prefill_shared = jint(shared, "prefill_tokens");
			ts[ns++] = jdouble(shared, "ttft_ms");
			json_object_put(shared);
			shared = NULL;
		}
		if (nc < o.reps) {
			json_object_put(cold);
			cold = NULL;
			r = run_once(&o, d.sock, prompt, 0, &cold);
			if (r < 0)
				break;
			if (strcmp(jtokens(cold), ref)) {
				fprintf(stderr, "kvtier-bench prefix: cold runs differ\n");
				r = -EPROTO;
				break;
			}
			tc[nc++] = jdouble(cold, "ttft_ms");
		}
		if (ns < o.reps)
			r = run_once(&o, d.sock, prompt, 1, &shared);
	}
	if (r == 0)
		r = lookup_bench(d.sock, o.lookup_reps, lu, lp);
	bench_daemon_stop(&d);
	if (r < 0)
		goto err;

	out = json_object_new_object();
	json_object_object_add(out, "benchmark", json_object_new_string("prefix"));
	json_object_object_add(out, "model", json_object_new_string(o.model));
	json_object_object_add(out, "prompt_tokens", json_object_new_int64(ntok));
	json_object_object_add(out, "generated_tokens", json_object_new_int64(o.gen));
	json_object_object_add(out, "block_tokens",
			       json_object_new_int64(KVT_BLOCK_TOKENS_DEFAULT));
	json_object_object_add(out, "threads", json_object_new_int64(o.threads));
	json_object_object_add(out, "reps", json_object_new_int64(o.reps));
	json_object_object_add(out, "matched_tokens", json_object_new_int64(matched));
	json_object_object_add(out, "prefill_tokens_shared", json_object_new_int64(prefill_shared));
	json_object_object_add(out, "ttft_cold_ms", json_object_new_double(median(tc, nc)));
	json_object_object_add(out, "ttft_shared_ms", json_object_new_double(median(ts, ns)));
	json_object_object_add(out, "ttft_speedup",
			       json_object_new_double(median(tc, nc) / median(ts, ns)));
	json_object_object_add(out, "ttft_cold_ms_dist", dist(tc, nc));
	json_object_object_add(out, "ttft_shared_ms_dist", dist(ts, ns));
	json_object_object_add(out, "pool_bytes_private", json_object_new_int64(used_private));
	json_object_object_add(out, "pool_bytes_shared", json_object_new_int64(used_shared));
	json_object_object_add(out, "pool_ratio",
			       json_object_new_double((double)used_shared / (double)used_private));
	json_object_object_add(out, "lookup_blocks", json_object_new_int64(2048));
	json_object_object_add(out, "lookup_us_32k",
			       json_object_new_double(median(lu, o.lookup_reps)));
	json_object_object_add(out, "lookup_us_32k_dist", dist(lu, o.lookup_reps));
	json_object_object_add(out, "lookup_pin_us_32k_dist", dist(lp, o.lookup_reps));
	if (o.json) {
		puts(json_object_to_json_string_ext(out, JSON_C_TO_STRING_PRETTY |
							     JSON_C_TO_STRING_NOSLASHESCAPE));
	} else {
		printf(
		    "prompt %u tokens, %lld shared (%lld computed by the sharer), %u generated\n",
		    ntok, (long long)matched, (long long)prefill_shared, o.gen);
		printf("ttft cold   %9.1f ms (p5 %.1f, p99 %.1f, %u runs)\n", median(tc, nc),
		       pct(tc, nc, 5), pct(tc, nc, 99), nc);
		printf("ttft shared %9.1f ms (p5 %.1f, p99 %.1f, %u runs): %.1fx faster\n",
		       median(ts, ns), pct(ts, ns, 5), pct(ts, ns, 99), ns,
		       median(tc, nc) / median(ts, ns));
		printf("pool bytes, two sequences: private %lld, shared %lld (%.3fx)\n",
		       (long long)used_private, (long long)used_shared,
		       (double)used_shared / (double)used_private);
		printf("LOOKUP 2048 blocks (32K tokens): %.1f us (p5 %.1f, p99 %.1f); pinning %.1f "
		       "us (p99 %.1f)\n",
		       median(lu, o.lookup_reps), pct(lu, o.lookup_reps, 5),
		       pct(lu, o.lookup_reps, 99), median(lp, o.lookup_reps),
		       pct(lp, o.lookup_reps, 99));
	}
	json_object_put(out);
	status = 0;
	goto out;
err:
	fprintf(stderr, "kvtier-bench prefix: %s\n", strerror(-r));
out:
	json_object_put(cold);
	json_object_put(shared);
	free(prompt);
	free(ref);
	free(tc);
	free(ts);
	free(lu);
	free(lp);
	return status;
}
