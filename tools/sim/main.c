/* SPDX-License-Identifier: MIT */
/*
 * kvtier-sim - client processes decoding a synthetic sequence against one kvtierd, one run per
 * tiering configuration, side by side: what each policy and budget costs in attention accuracy.
 *
 * Each run is what an inference process does with kvtier: it writes every new token into a free
 * slot of its T0 region (a host-backend device buffer), APPENDs it, computes the step's attention
 * and sends the weights averaged over layers and heads as SCORE_ADD; every delta steps it
 * RETIERs, follows the slot changes, FETCHes the offloaded rows into its staging region and
 * computes attention from T0 slots + staged rows, exactly as a model would. It keeps a full copy
 * of the cache as the reference and reports, per run, the attention-output error and the
 * attention mass that fell on evicted tokens.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvt_cli.h"
#include "kvtier.h"
#include "trace.h"

struct sim_opts {
	unsigned clients, steps, layers, kv_heads, head_dim, delta;
	uint64_t seed;
	const char *socket;
	const char *then;
	int json;
};

struct sim_cfg {
	uint8_t policy;
	float hbm, evict, t2;
};

/* The table: the eviction cliff next to the tiering potentiometer. */
static const struct sim_cfg configs[] = {
    {KVT_POLICY_H2O, 0.5f, 0.0f, 0.0f},	      {KVT_POLICY_H2O, 0.25f, 0.0f, 0.0f},
    {KVT_POLICY_STREAMING, 0.5f, 0.0f, 0.0f}, {KVT_POLICY_TIERED, 0.1f, 0.0f, 0.0f},
    {KVT_POLICY_TIERED, 0.3f, 0.0f, 0.0f},    {KVT_POLICY_TIERED, 0.5f, 0.0f, 0.0f},
    {KVT_POLICY_TIERED, 0.7f, 0.0f, 0.0f},    {KVT_POLICY_TIERED, 0.1f, 0.03f, 0.0f},
    {KVT_POLICY_TIERED, 0.3f, 0.03f, 0.0f},   {KVT_POLICY_TIERED, 0.5f, 0.03f, 0.0f},
    {KVT_POLICY_TIERED, 0.7f, 0.03f, 0.0f},   {KVT_POLICY_TIERED, 0.5f, 0.10f, 0.0f},
    {KVT_POLICY_TIERED, 0.3f, 0.0f, 0.25f},
};
#define NCFG (sizeof(configs) / sizeof(configs[0]))

static const char *const policy_names[] = {"tiered", "h2o", "streaming", "full"};

struct sim_result {
	uint32_t cfg;
	int32_t err; /* 0 or -errno */
	double rel_err, mass_lost;
	uint64_t tiers[4];
	uint64_t bytes_out;
	double steps_per_s;
};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One run's state: the client's view of its T0 region and the reference cache. */
struct run {
	const struct sim_opts *o;
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	uint32_t seq, t0_slots, n;
	int32_t *slot_pos;
	uint32_t *free_slots, n_free, next_free;
	uint8_t *live;	  /* position not evicted */
	uint32_t *staged; /* positions of staging rows after the last FETCH */
	uint32_t n_staged;
	const float **krow, **vrow; /* per position, current layer: where its rows are */
	float *cache;		    /* reference [steps][L][2][H][D] */
	uint64_t tok;		    /* floats per token */
	uint8_t *rbuf;
	size_t rbuf_len;
};

static float *
t0_row(struct run *R, uint32_t slot, uint32_t l, uint32_t kv)
{
	uint64_t row = (uint64_t)R->o->kv_heads * R->o->head_dim;

	return (float *)kvt_buf_ptr(R->t0) + (((uint64_t)l * 2 + kv) * R->t0_slots + slot) * row;
}

static float *
stage_row(struct run *R, uint32_t i, uint32_t l, uint32_t kv)
{
	uint64_t row = (uint64_t)R->o->kv_heads * R->o->head_dim;

	return (float *)kvt_buf_ptr(R->stage) + (((uint64_t)l * 2 + kv) * R->o->steps + i) * row;
}

static int
do_retier(struct run *R)
{
	const struct kvt_retier_result *res = (const void *)R->rbuf;
	const struct kvt_slot_change *ch;
	const uint32_t *fs;
	int r = kvt_retier(R->c, R->seq, R->rbuf, R->rbuf_len);

	if (r < 0)
		return r;
	ch = (const void *)(R->rbuf + sizeof(*res));
	fs = (const void *)(ch + res->n_changes);
	for (uint32_t i = 0; i < res->n_changes; i++)
		R->slot_pos[ch[i].slot] = ch[i].pos;
	memcpy(R->free_slots, fs, res->n_free * sizeof(uint32_t));
	R->n_free = res->n_free;
	R->next_free = 0;
	/* Where every live position's rows are now: T0 slot or staging row. */
	r = kvt_fetch(R->c, R->seq, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, 0, R->o->layers, 0, R->staged,
		      R->o->steps);
	if (r < 0)
		return r;
	R->n_staged = (uint32_t)r;
	memset(R->live, 0, R->n);
	for (uint32_t i = 0; i < R->n_staged; i++)
		R->live[R->staged[i]] = 1;
	for (uint32_t s = 0; s < R->t0_slots; s++)
		if (R->slot_pos[s] >= 0)
			R->live[R->slot_pos[s]] = 1;
	return 0;
}

/*
 * Attention of the step's query at layer l, head h, over @n positions: the reference output
 * over the full cache, the output over what the run can see (T0 slots + staged rows, by
 * position), the mass of the full softmax that falls on evicted positions. Adds each live
 * position's weight (from what the run sees) into @w.
 */
static void
attend(struct run *R, const float *q, uint32_t l, uint32_t h, float *w, double *ret_err,
       double *ret_mass, int measure, float *logit, float *lfull)
{
	uint32_t H = R->o->kv_heads, D = R->o->head_dim, n = R->n;
	float scale = 1.0f / sqrtf((float)D), mx = -INFINITY, mf = -INFINITY, sum = 0, sf = 0;
	float out[KVT_MAX_HEAD_DIM] = {0}, ref[KVT_MAX_HEAD_DIM] = {0};
	double e = 0, nr = 0, lost = 0;

	for (uint32_t i = 0; i < n; i++) {
		const float *kf = R->cache + i * R->tok + ((uint64_t)2 * l * H + h) * D;
		const float *ka = R->krow[i] ? R->krow[i] + (uint64_t)h * D : NULL;
		float s = 0, sa = 0;

		for (uint32_t j = 0; j < D; j++)
			s += q[j] * kf[j];
		lfull[i] = s * scale;
		mf = fmaxf(mf, lfull[i]);
		if (ka) {
			for (uint32_t j = 0; j < D; j++)
				sa += q[j] * ka[j];
			logit[i] = sa * scale;
			mx = fmaxf(mx, logit[i]);
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		sf += lfull[i] = expf(lfull[i] - mf);
		if (R->krow[i])
			sum += logit[i] = expf(logit[i] - mx);
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!R->live[i])
			lost += lfull[i] / sf;
		if (R->krow[i])
			w[i] += logit[i] / sum;
		if (!measure)
			continue;
		{
			const float *vf =
			    R->cache + i * R->tok + ((uint64_t)(2 * l + 1) * H + h) * D;

			for (uint32_t j = 0; j < D; j++)
				ref[j] += lfull[i] / sf * vf[j];
			if (R->krow[i]) {
				const float *va = R->vrow[i] + (uint64_t)h * D;

				for (uint32_t j = 0; j < D; j++)
					out[j] += logit[i] / sum * va[j];
			}
		}
	}
	if (measure) {
		for (uint32_t j = 0; j < D; j++) {
			e += (out[j] - ref[j]) * (out[j] - ref[j]);
			nr += ref[j] * ref[j];
		}
		*ret_err += sqrt(e / (nr > 0 ? nr : 1));
	}
	*ret_mass += lost;
}

static int
run_config(const struct sim_opts *o, const struct sim_cfg *cf, struct kvt_client *c,
	   struct sim_result *res, int keep_open)
{
	uint32_t L = o->layers, H = o->kv_heads, D = o->head_dim;
	uint64_t row = (uint64_t)H * D;
	struct kvt_seq_params p = {.size = sizeof(p)};
	struct sim_trace tr;
	struct kvt_seq_stat st;
	struct run R = {.o = o, .c = c};
	float *q, *w, *logit, *lfull;
	double t0, err = 0, mass = 0;
	unsigned measured = 0, massed = 0;
	int r;

	R.tok = (uint64_t)L * 2 * row;
	/* T0 big enough for the budget at the end of the run, plus delta free slots. */
	R.t0_slots = (uint32_t)ceilf(cf->hbm * o->steps) + 2 * o->delta + 8;
	if (R.t0_slots < 128 + 2 * o->delta + 8)
		R.t0_slots = 128 + 2 * o->delta + 8;
	r = kvt_buf_alloc(c, L * 2ull * R.t0_slots * row * 4, &R.t0);
	if (r == 0)
		r = kvt_buf_alloc(c, L * 2ull * o->steps * row * 4, &R.stage);
	if (r < 0)
		return r;
	p.layers = (uint16_t)L;
	p.kv_heads = (uint16_t)H;
	p.head_dim = (uint16_t)D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = cf->policy;
	p.delta = o->delta;
	p.sinks = 4;
	p.window = 64;
	p.hbm_frac = cf->hbm;
	p.evict_frac = cf->evict;
	p.t2_frac = cf->t2;
	p.t0_buf_id = kvt_buf_id(R.t0);
	p.t0_slots = R.t0_slots;
	p.t0_slot_stride = row * 4;
	p.t0_kv_stride = R.t0_slots * row * 4;
	p.t0_layer_stride = 2 * p.t0_kv_stride;
	p.stage_buf_id = kvt_buf_id(R.stage);
	p.stage_slots = o->steps;
	p.stage_slot_stride = row * 4;
	p.stage_kv_stride = o->steps * row * 4;
	p.stage_layer_stride = 2 * p.stage_kv_stride;
	r = kvt_seq_open(c, &p, &R.seq);
	if (r < 0)
		return r;
	R.rbuf_len = KVT_RETIER_OUT_SIZE(R.t0_slots);
	R.rbuf = malloc(R.rbuf_len);
	R.slot_pos = malloc(sizeof(int32_t) * R.t0_slots);
	R.free_slots = malloc(sizeof(uint32_t) * R.t0_slots);
	R.live = calloc(o->steps, 1);
	R.staged = malloc(sizeof(uint32_t) * o->steps);
	R.krow = calloc(o->steps, sizeof(*R.krow));
	R.vrow = calloc(o->steps, sizeof(*R.vrow));
	R.cache = malloc(sizeof(float) * R.tok * o->steps);
	q = malloc(sizeof(float) * L * row);
	w = malloc(sizeof(float) * o->steps);
	logit = malloc(sizeof(float) * o->steps);
	lfull = malloc(sizeof(float) * o->steps);
	if (!R.rbuf || !R.slot_pos || !R.free_slots || !R.live || !R.staged || !R.krow || !R.vrow ||
	    !R.cache || !q || !w || !logit || !lfull || sim_trace_init(&tr, L, H, D, o->seed) < 0)
		return -ENOMEM;
	for (uint32_t s = 0; s < R.t0_slots; s++)
		R.slot_pos[s] = -1;
	r = do_retier(&R); /* n = 0: the first free slots */
	t0 = now_s();
	for (uint32_t t = 0; t < o->steps && r >= 0; t++) {
		float *rows = R.cache + (uint64_t)t * R.tok;
		uint32_t slot;
		int measure;

		if (R.next_free == R.n_free) {
			r = do_retier(&R);
			if (r < 0)
				break;
		}
		slot = R.free_slots[R.next_free++];
		sim_trace_token(&tr, rows);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				memcpy(t0_row(&R, slot, l, kv), rows + (2 * l + kv) * row, row * 4);
		r = (int)kvt_append_t0(c, R.seq, &slot, 1);
		if (r < 0)
			break;
		R.slot_pos[slot] = (int32_t)R.n;
		R.live[R.n] = 1;
		R.n++;
		sim_trace_query(&tr, q);
		memset(w, 0, sizeof(float) * R.n);
		/* Measure the output error right after each re-tier and fetch (the staged rows
		 * are exactly what a model would use then); mass lost at every step. */
		measure = R.next_free == 1;
		for (uint32_t l = 0; l < L; l++) {
			for (uint32_t i = 0; i < R.n; i++)
				R.krow[i] = R.vrow[i] = NULL;
			for (uint32_t i = 0; i < R.n_staged; i++) {
				R.krow[R.staged[i]] = stage_row(&R, i, l, 0);
				R.vrow[R.staged[i]] = stage_row(&R, i, l, 1);
			}
			for (uint32_t s = 0; s < R.t0_slots; s++)
				if (R.slot_pos[s] >= 0) {
					R.krow[R.slot_pos[s]] = t0_row(&R, s, l, 0);
					R.vrow[R.slot_pos[s]] = t0_row(&R, s, l, 1);
				}
			for (uint32_t h = 0; h < H; h++)
				attend(&R, q + ((uint64_t)l * H + h) * D, l, h, w, &err, &mass,
				       measure, logit, lfull);
		}
		measured += measure ? L * H : 0;
		massed += L * H;
		for (uint32_t i = 0; i < R.n; i++)
			w[i] /= (float)(L * H);
		r = kvt_score_add(c, R.seq, 0, w, R.n);
	}
	if (r >= 0)
		r = kvt_seq_stat(c, R.seq, &st);
	if (r >= 0) {
		res->rel_err = measured ? err / measured : 0;
		res->mass_lost = massed ? mass / massed : 0;
		memcpy(res->tiers, st.tier_count, sizeof(res->tiers));
		res->bytes_out = st.bytes_out;
		res->steps_per_s = o->steps / (now_s() - t0);
	}
	if (!keep_open) {
		kvt_seq_close(c, R.seq);
		kvt_buf_free(c, R.t0);
		kvt_buf_free(c, R.stage);
	}
	sim_trace_fini(&tr);
	free(R.rbuf);
	free(R.slot_pos);
	free(R.free_slots);
	free(R.live);
	free(R.staged);
	free(R.krow);
	free(R.vrow);
	free(R.cache);
	free(q);
	free(w);
	free(logit);
	free(lfull);
	return r < 0 ? r : 0;
}

static int
client_main(const struct sim_opts *o, unsigned idx, int res_fd, int done_fd, int go_fd)
{
	struct kvt_opts co = {.size = sizeof(co), .spin_us = 20, .arena_size = 4 << 20};
	struct kvt_client *c;
	char name[32], ch;
	int r;

	snprintf(name, sizeof(name), "sim-%u", idx);
	co.name = name;
	r = kvt_connect(o->socket, &co, &c);
	if (r < 0) {
		fprintf(stderr, "kvtier-sim[%u]: cannot connect: %s%s%s\n", idx, kvt_strerror(r),
			*kvt_last_error() ? ": " : "", kvt_last_error());
		return 1;
	}
	for (uint32_t i = idx; i < NCFG; i += o->clients) {
		struct sim_result res = {.cfg = i};

		/* The last run of each client stays open for --then to look at. */
		res.err = run_config(o, &configs[i], c, &res, i + o->clients >= NCFG);
		if (write(res_fd, &res, sizeof(res)) != sizeof(res))
			return 1;
	}
	if (write(done_fd, "d", 1) != 1 || read(go_fd, &ch, 1) < 0)
		return 1;
	kvt_disconnect(c);
	return 0;
}

static int
opt_seed(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	uint64_t v;
	int r = kvt_cli_int_arg(cli, d, arg, &v);

	if (r == 0)
		((struct sim_opts *)o)->seed = v;
	return r;
}

#define OFF(m) offsetof(struct sim_opts, m)

static const struct kvt_cli_opt sim_opts_table[] = {
    {"clients", 0, "N", "client processes sharing the daemon (default 2)", .apply = kvt_cli_u32,
     .off = OFF(clients), .min = 1, .max = 64},
    {"steps", 0, "N", "decode steps per run (default 2048)", .apply = kvt_cli_u32,
     .off = OFF(steps), .min = 256, .max = 1u << 16},
    {"layers", 0, "N", "geometry: layers (default 4)", .apply = kvt_cli_u32, .off = OFF(layers),
     .min = 1, .max = KVT_MAX_LAYERS},
    {"kv-heads", 0, "N", "KV heads (default 2)", .apply = kvt_cli_u32, .off = OFF(kv_heads),
     .min = 1, .max = KVT_MAX_KV_HEADS},
    {"head-dim", 0, "N", "head dimension (default 64)", .apply = kvt_cli_u32, .off = OFF(head_dim),
     .min = 1, .max = KVT_MAX_HEAD_DIM},
    {"delta", 0, "N", "re-tier period (default 64)", .apply = kvt_cli_u32, .off = OFF(delta),
     .min = 1, .max = 1024},
    {"seed", 0, "N", "trace seed (every run replays the same trace; default 1)", .apply = opt_seed,
     .max = 4294967295.0},
    {"socket", 0, "PATH", "kvtierd socket (default $KVTIER_SOCKET or " KVT_DEFAULT_SOCKET ")",
     .apply = kvt_cli_str, .off = OFF(socket)},
    {"then", 0, "CMD", "run CMD (sh -c) once every client holds its last sequence open",
     .apply = kvt_cli_str, .off = OFF(then)},
    {"json", 0, NULL,
     "{\"rows\":[{policy,hbm_frac,evict_frac,t2_frac,rel_err,\nmass_lost}...]} instead of the "
     "table",
     .apply = kvt_cli_flag, .off = OFF(json)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {NULL},
};

static const struct kvt_cli sim_cli = {
    .prog = "kvtier-sim",
    .intro = "usage: kvtier-sim [options]\n"
	     "Runs one synthetic decode per tiering configuration against kvtierd, spread over\n"
	     "client processes, and prints per policy and budget the attention-output relative\n"
	     "error and the attention mass lost to evicted tokens.\n\n"
	     "The trace is synthetic, not a model: keys come in runs of one \"topic\" (a random\n"
	     "direction per layer and head, plus noise); each step's query points at the current\n"
	     "topic or, with probability 0.7, at a topic chosen uniformly from all those seen so\n"
	     "far, so attention returns to old tokens unpredictably. Rows are f32.\n\n",
    .opts = sim_opts_table,
};

static void
print_results(const struct sim_opts *o, struct sim_result *res)
{
	if (o->json) {
		printf("{\"steps\":%u,\"rows\":[", o->steps);
		for (unsigned i = 0; i < NCFG; i++)
			printf("%s{\"policy\":\"%s\",\"hbm_frac\":%.2f,\"evict_frac\":%.2f,"
			       "\"t2_frac\":%.2f,\"rel_err\":%.6g,\"mass_lost\":%.6g,"
			       "\"tiers\":[%llu,%llu,%llu,%llu],\"bytes_out\":%llu%s%s%s}",
			       i ? "," : "", policy_names[configs[i].policy], configs[i].hbm,
			       configs[i].evict, configs[i].t2, res[i].rel_err, res[i].mass_lost,
			       (unsigned long long)res[i].tiers[0],
			       (unsigned long long)res[i].tiers[1],
			       (unsigned long long)res[i].tiers[2],
			       (unsigned long long)res[i].tiers[3],
			       (unsigned long long)res[i].bytes_out,
			       res[i].err ? ",\"error\":\"" : "",
			       res[i].err ? kvt_strerror(res[i].err) : "", res[i].err ? "\"" : "");
		printf("]}\n");
		return;
	}
	printf("%-10s %5s %6s %5s  %10s %10s   %6s %6s %6s %6s  %9s\n", "policy", "hbm", "evict",
	       "t2", "rel_err", "mass_lost", "T0", "T1", "T2", "T3", "copied");
	for (unsigned i = 0; i < NCFG; i++) {
		if (res[i].err) {
			printf("%-10s %5.2f %6.2f %5.2f  failed: %s\n",
			       policy_names[configs[i].policy], configs[i].hbm, configs[i].evict,
			       configs[i].t2, kvt_strerror(res[i].err));
			continue;
		}
		printf(
		    "%-10s %5.2f %6.2f %5.2f  %10.3g %10.3g   %6llu %6llu %6llu %6llu  %7.1f MiB\n",
		    policy_names[configs[i].policy], configs[i].hbm, configs[i].evict,
		    configs[i].t2, res[i].rel_err, res[i].mass_lost,
		    (unsigned long long)res[i].tiers[0], (unsigned long long)res[i].tiers[1],
		    (unsigned long long)res[i].tiers[2], (unsigned long long)res[i].tiers[3],
		    res[i].bytes_out / 1048576.0);
	}
	printf("\nrel_err: |attention output from T0 slots + fetched rows - full-cache output| /\n"
	       "|full-cache output|, right after each re-tier; mass_lost: softmax mass on evicted\n"
	       "tokens, every step. With evict 0 and t2 0 the error is 0 whatever hbm is\n"
	       "(Proposition 1); it follows evict_frac, not hbm_frac.\n");
}

int
main(int argc, char **argv)
{
	struct sim_opts o = {.clients = 2,
			     .steps = 2048,
			     .layers = 4,
			     .kv_heads = 2,
			     .head_dim = 64,
			     .delta = 64,
			     .seed = 1};
	struct sim_result res[NCFG];
	int rp[2], done[2], go[2], failed = 0;
	unsigned got = 0;
	pid_t *pids;

	if (kvt_cli_parse(&sim_cli, argc, argv, &o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtier-sim --help'.\n");
		return 2;
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-sim: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (o.clients > NCFG)
		o.clients = NCFG;
	if (pipe(rp) < 0 || pipe(done) < 0 || pipe(go) < 0)
		return 1;
	memset(res, 0, sizeof(res));
	for (unsigned i = 0; i < NCFG; i++)
		res[i].err = -ECHILD;
	pids = calloc(o.clients, sizeof(*pids));
	for (unsigned i = 0; i < o.clients; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			close(rp[0]);
			close(done[0]);
			close(go[1]);
			_exit(client_main(&o, i, rp[1], done[1], go[0]));
		}
	}
	close(rp[1]);
	close(done[1]);
	close(go[0]);
	for (;;) {
		struct sim_result r;

		if (got == NCFG || read(rp[0], &r, sizeof(r)) != sizeof(r))
			break;
		if (r.cfg < NCFG) {
			res[r.cfg] = r;
			got++;
		}
	}
	for (unsigned i = 0; i < o.clients; i++) {
		char ch;

		if (read(done[0], &ch, 1) != 1)
			break;
	}
	print_results(&o, res);
	if (o.then) {
		fflush(stdout);
		if (system(o.then) != 0)
			fprintf(stderr, "kvtier-sim: '%s' failed\n", o.then);
	}
	close(go[1]);
	for (unsigned i = 0; i < o.clients; i++) {
		int st;

		waitpid(pids[i], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			failed = 1;
	}
	for (unsigned i = 0; i < NCFG; i++)
		failed |= res[i].err != 0;
	free(pids);
	return failed;
}
