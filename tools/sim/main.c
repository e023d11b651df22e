/* SPDX-License-Identifier: MIT */
/*
 * kvtier-sim - client processes decoding synthetic sequences against one kvtierd.
 *
 * Each client process replays the synthetic trace of trace.h: every step it APPENDs the new
 * token's rows, computes attention for the step's query over its sequence, and sends the
 * attention weights averaged over layers and heads as SCORE_ADD, the way an inference process
 * would. It keeps its own full copy of the cache as the reference the daemon's view is checked
 * against.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "trace.h"

struct sim_opts {
	unsigned clients, steps, layers, kv_heads, head_dim;
	uint64_t seed;
	const char *socket;
	const char *then;
};

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-sim [options]\n"
		"Client processes decoding synthetic sequences against one kvtierd.\n\n"
		"The trace is synthetic, not a model: keys are grouped in runs of one \"topic\"\n"
		"(a random direction per layer and head, plus noise); each step's query points at\n"
		"the current topic or, with probability 0.7, at a topic chosen uniformly from all\n"
		"those seen so far, so attention returns to old tokens unpredictably. Rows are f32.\n\n"
		"  --clients N      client processes (default 2)\n"
		"  --steps N        decode steps per client (default 2048)\n"
		"  --layers N --kv-heads N --head-dim N   geometry (default 4, 2, 64)\n"
		"  --seed N         trace seed (client i uses seed + i)\n"
		"  --socket PATH    kvtierd socket (default $KVTIER_SOCKET or %s)\n"
		"  --then CMD       run CMD (sh -c) after the clients finish, while they still\n"
		"                   hold their sessions (e.g. \"kvtierctl seqs\")\n",
		KVT_DEFAULT_SOCKET);
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Attention of query @q (per layer, head) over @n tokens of @cache; adds the weights averaged
 * over layers and heads into @w (n entries, zeroed by the caller). */
static void
attention_weights(const struct sim_opts *o, const float *cache, uint64_t n, const float *q,
		  float *w, float *logits)
{
	uint32_t H = o->kv_heads, D = o->head_dim;
	uint64_t tok = (uint64_t)o->layers * 2 * H * D;
	float scale = 1.0f / sqrtf((float)D), norm = 1.0f / (o->layers * H);

	for (uint32_t l = 0; l < o->layers; l++)
		for (uint32_t h = 0; h < H; h++) {
			const float *qq = q + ((uint64_t)l * H + h) * D;
			float mx = -INFINITY, sum = 0;

			for (uint64_t i = 0; i < n; i++) {
				const float *k = cache + i * tok + ((uint64_t)2 * l * H + h) * D;
				float s = 0;

				for (uint32_t j = 0; j < D; j++)
					s += qq[j] * k[j];
				logits[i] = s * scale;
				if (logits[i] > mx)
					mx = logits[i];
			}
			for (uint64_t i = 0; i < n; i++) {
				logits[i] = expf(logits[i] - mx);
				sum += logits[i];
			}
			for (uint64_t i = 0; i < n; i++)
				w[i] += logits[i] / sum * norm;
		}
}

static int
client_main(const struct sim_opts *o, unsigned idx, int done_fd, int go_fd)
{
	struct kvt_opts co = {.size = sizeof(co), .spin_us = 20};
	struct kvt_seq_params p = {.size = sizeof(p)};
	uint64_t tok = (uint64_t)o->layers * 2 * o->kv_heads * o->head_dim;
	struct sim_trace tr;
	struct kvt_seq_stat st;
	struct kvt_client *c;
	float *cache, *q, *w, *logits;
	char name[32], ch = 0;
	uint32_t seq;
	double t0;
	int r;

	snprintf(name, sizeof(name), "sim-%u", idx);
	co.name = name;
	r = kvt_connect(o->socket, &co, &c);
	if (r < 0) {
		fprintf(stderr, "kvtier-sim[%u]: cannot connect: %s%s%s\n", idx, kvt_strerror(r),
			*kvt_last_error() ? ": " : "", kvt_last_error());
		return 1;
	}
	p.layers = (uint16_t)o->layers;
	p.kv_heads = (uint16_t)o->kv_heads;
	p.head_dim = (uint16_t)o->head_dim;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = 64;
	p.sinks = 4;
	p.window = 128;
	p.hbm_frac = 0.5f;
	p.evict_frac = 0.03f;
	r = kvt_seq_open(c, &p, &seq);
	if (r < 0) {
		fprintf(stderr, "kvtier-sim[%u]: SEQ_OPEN: %s\n", idx, kvt_strerror(r));
		return 1;
	}
	cache = malloc(sizeof(float) * tok * o->steps);
	q = malloc(sizeof(float) * o->layers * o->kv_heads * o->head_dim);
	w = malloc(sizeof(float) * o->steps);
	logits = malloc(sizeof(float) * o->steps);
	if (!cache || !q || !w || !logits || sim_trace_init(&tr, o->layers, o->kv_heads,
							     o->head_dim, o->seed + idx) < 0) {
		fprintf(stderr, "kvtier-sim[%u]: out of memory\n", idx);
		return 1;
	}
	t0 = now_s();
	for (unsigned t = 0; t < o->steps; t++) {
		float *rows = cache + (uint64_t)t * tok;
		int64_t n;

		sim_trace_token(&tr, rows);
		n = kvt_append(c, seq, rows, tok * sizeof(float), 1, NULL);
		if (n != (int64_t)t + 1) {
			fprintf(stderr, "kvtier-sim[%u]: APPEND: %s\n", idx,
				kvt_strerror(n < 0 ? (int)n : -EPROTO));
			return 1;
		}
		sim_trace_query(&tr, q);
		memset(w, 0, sizeof(float) * (t + 1));
		attention_weights(o, cache, t + 1, q, w, logits);
		r = kvt_score_add(c, seq, 0, w, t + 1);
		if (r < 0) {
			fprintf(stderr, "kvtier-sim[%u]: SCORE_ADD: %s\n", idx, kvt_strerror(r));
			return 1;
		}
	}
	r = kvt_seq_stat(c, seq, &st);
	if (r < 0) {
		fprintf(stderr, "kvtier-sim[%u]: SEQ_STAT: %s\n", idx, kvt_strerror(r));
		return 1;
	}
	printf("sim-%u: session %u seq %u: %llu tokens, %.1f MiB in the pool, %.0f steps/s, "
	       "score total %.1f (one per step: %s)\n",
	       idx, kvt_session_id(c), seq, (unsigned long long)st.n_tokens,
	       st.pool_bytes / 1048576.0, o->steps / (now_s() - t0), st.score_total,
	       fabs(st.score_total - o->steps) < 1e-2 * o->steps ? "ok" : "MISMATCH");
	fflush(stdout);
	/* Tell the parent we are done, and hold the session until it says go. */
	if (write(done_fd, "d", 1) != 1 || read(go_fd, &ch, 1) < 0)
		return 1;
	sim_trace_fini(&tr);
	free(cache);
	free(q);
	free(w);
	free(logits);
	kvt_disconnect(c);
	return fabs(st.score_total - o->steps) < 1e-2 * o->steps ? 0 : 1;
}

static int
parse_u(const char *s, unsigned min, unsigned max, unsigned *ret)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (!*s || *end || *s == '-' || v < min || v > max)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"clients", required_argument, NULL, 'c'}, {"steps", required_argument, NULL, 's'},
		{"layers", required_argument, NULL, 'L'},  {"kv-heads", required_argument, NULL, 'H'},
		{"head-dim", required_argument, NULL, 'D'}, {"seed", required_argument, NULL, 'S'},
		{"socket", required_argument, NULL, 'k'},  {"then", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},	   {0},
	};
	struct sim_opts o = {.clients = 2, .steps = 2048, .layers = 4, .kv_heads = 2,
			     .head_dim = 64, .seed = 1};
	int done[2], go[2], c, failed = 0;
	unsigned seed;
	pid_t *pids;

	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		int r = 0;

		switch (c) {
		case 'c': r = parse_u(optarg, 1, 64, &o.clients); break;
		case 's': r = parse_u(optarg, 1, 1u << 20, &o.steps); break;
		case 'L': r = parse_u(optarg, 1, KVT_MAX_LAYERS, &o.layers); break;
		case 'H': r = parse_u(optarg, 1, KVT_MAX_KV_HEADS, &o.kv_heads); break;
		case 'D': r = parse_u(optarg, 1, KVT_MAX_HEAD_DIM, &o.head_dim); break;
		case 'S': r = parse_u(optarg, 0, ~0u, &seed); o.seed = seed; break;
		case 'k': o.socket = optarg; break;
		case 't': o.then = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (r < 0) {
			fprintf(stderr, "kvtier-sim: bad value '%s' for --%s\n", optarg,
				lo[optind > 0 ? 0 : 0].name);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-sim: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (pipe(done) < 0 || pipe(go) < 0)
		return 1;
	pids = calloc(o.clients, sizeof(*pids));
	for (unsigned i = 0; i < o.clients; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			close(done[0]);
			close(go[1]);
			_exit(client_main(&o, i, done[1], go[0]));
		}
	}
	close(done[1]);
	close(go[0]);
	for (unsigned i = 0; i < o.clients; i++) {
		char ch;

		if (read(done[0], &ch, 1) != 1)
			break; /* a client died: its exit status tells */
	}
	if (o.then) {
		fflush(stdout);
		if (system(o.then) != 0)
			fprintf(stderr, "kvtier-sim: '%s' failed\n", o.then);
	}
	close(go[1]); /* EOF releases every client */
	for (unsigned i = 0; i < o.clients; i++) {
		int st;

		waitpid(pids[i], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			failed = 1;
	}
	free(pids);
	return failed;
}
