/* SPDX-License-Identifier: MIT */
/*
 * eval.c - kvtier-llm --eval (see eval.h): token agreement and perplexity per tiering
 * configuration against the full cache, and decode speed of kvtier against the local cache.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "eval.h"
#include "generate.h"
#include "kv_kvtier.h"

const char *const llm_eval_prompts[] = {
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how the water cycle works, step by step, with examples.",
    "Write a detailed guide to starting a vegetable garden for beginners.",
    "Describe the history of the printing press and how it changed Europe.",
    "Explain how a computer CPU executes a program, from instructions to registers and memory.",
    "Write a long essay about the importance of sleep for health and learning.",
    "Tell a long adventure story about two friends crossing a desert to find a lost city.",
    "Explain the causes and effects of the French Revolution in detail.",
    "Write a detailed recipe and cooking guide for making bread at home.",
    "Describe how the solar system formed and what each planet is like.",
    "Explain how vaccines train the immune system, with examples of diseases.",
    "Write a long letter from a sailor to his family describing life at sea.",
};
const uint32_t llm_eval_n_prompts = sizeof(llm_eval_prompts) / sizeof(llm_eval_prompts[0]);

struct eval_cfg {
	uint8_t policy;
	float hbm, evict, t2;
	float budget;	   /* streaming: kept fraction at the end (sets the window) */
	uint32_t t2_flags; /* KVT_T2_F_* */
};

static const char *
t2_keys_name(const struct eval_cfg *cf)
{
	return cf->t2_flags & KVT_T2_F_KEY_CHANNEL ? "channel" : "head";
}

/*
 * The table: tiering at every (hbm, evict), int8, then the eviction baselines. (Policy full is
 * not a row: the tiered rows at evict 0 already show the full cache's tokens, and
 * check_llm_kvtier runs it; each row costs prompts x tokens model steps.)
 */
/* clang-format off */
static const struct eval_cfg cfgs[] = {
    {KVT_POLICY_TIERED, 0.3f, 0.00f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.5f, 0.00f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.7f, 0.00f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.3f, 0.03f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.5f, 0.03f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.7f, 0.03f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.3f, 0.10f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.5f, 0.10f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.7f, 0.10f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.3f, 0.25f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.5f, 0.25f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.7f, 0.25f, 0, 0, 0},
    {KVT_POLICY_TIERED, 0.5f, 0.00f, 0.25f, 0, 0},
    {KVT_POLICY_TIERED, 0.5f, 0.00f, 0.25f, 0, KVT_T2_F_KEY_CHANNEL},
    {KVT_POLICY_H2O, 0.5f, 0, 0, 0, 0},
    {KVT_POLICY_H2O, 0.25f, 0, 0, 0, 0},
    {KVT_POLICY_STREAMING, 0, 0, 0, 0.5f, 0},
};
/* clang-format on */
#define NCFG (sizeof(cfgs) / sizeof(cfgs[0]))

/* One configuration's totals over all prompts; sent from worker processes through a pipe. */
struct cfg_result {
	uint32_t cfg;
	int32_t err;
	uint64_t count, agree;
	double nll;
	uint64_t n_tokens, tiers[4]; /* summed over prompts, at the end of each */
	double seconds;
};

struct prompt_ref {
	struct llm_ids prompt;
	struct llm_ids cont; /* full-cache greedy continuation */
};

struct eval {
	const struct llm_model *m;
	const struct llm_tok *tok;
	const struct llm_eval_opts *o;
	uint8_t *eog; /* n_vocab: masked in argmax */
	struct prompt_ref *refs;
	double full_nll;
	uint64_t full_count;
};

void
llm_eval_opts_default(struct llm_eval_opts *o, int quick)
{
	memset(o, 0, sizeof(*o));
	o->threads = 1;
	o->jobs = 1;
	o->prompts = quick ? 3 : 10;
	o->tokens = quick ? 96 : 512;
	o->delta = quick ? 16 : 32;
	o->window = quick ? 32 : 64;
	/* Long enough that T1 holds rows (Δ 64 + window 128 + the prompt stay in T0). */
	o->speed_tokens = quick ? 256 : 512;
	o->speed_reps = 3;
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Greedy with end-of-generation tokens masked: argmax over the rest, lowest id on ties. */
static uint32_t
argmax_masked(const struct eval *E, const float *logits)
{
	uint32_t n = E->m->cfg.n_vocab, best = UINT32_MAX;

	for (uint32_t i = 0; i < n; i++)
		if (!E->eog[i] && (best == UINT32_MAX || logits[i] > logits[best]))
			best = i;
	return best;
}

/* -log softmax(logits)[id], over the full vocabulary, in double. */
static double
nll_of(const struct eval *E, const float *logits, uint32_t id)
{
	uint32_t n = E->m->cfg.n_vocab;
	float mx = logits[0];
	double s = 0.0;

	for (uint32_t i = 1; i < n; i++)
		mx = logits[i] > mx ? logits[i] : mx;
	for (uint32_t i = 0; i < n; i++)
		s += exp((double)logits[i] - mx);
	return log(s) + mx - logits[id];
}

static void
kvtier_opts_for(const struct eval *E, const struct eval_cfg *cf, uint32_t prompt_len,
		uint32_t total, struct kv_kvtier_opts *ko)
{
	kv_kvtier_opts_default(ko);
	ko->socket = E->o->socket;
	ko->name = "kvtier-llm-eval";
	ko->policy = cf->policy;
	ko->hbm_frac = cf->hbm;
	ko->evict_frac = cf->evict;
	ko->t2_frac = cf->t2;
	ko->t2_flags = cf->t2_flags;
	ko->delta = E->o->delta;
	ko->window = E->o->window;
	ko->prompt_len = prompt_len;
	ko->max_tokens = total;
	if (cf->policy == KVT_POLICY_STREAMING) {
		/* sinks + prompt + window = budget * total at the end */
		int64_t w = (int64_t)ceil((double)cf->budget * total) -
			    (int64_t)(ko->sinks > prompt_len ? ko->sinks : prompt_len);

		ko->window = w > 1 ? (uint32_t)w : 1;
	}
}

/* The full-cache reference for prompt @i: greedy continuation and its nll, local backend. */
static int
make_ref(struct eval *E, uint32_t i)
{
	struct prompt_ref *R = &E->refs[i];
	const struct llm_config *c = &E->m->cfg;
	struct kv_backend *kv = NULL;
	struct llm_ctx *ctx = NULL;
	const float *logits = NULL;
	int ret;

	ret = llm_chat_prompt(E->tok, NULL, llm_eval_prompts[i], &R->prompt);
	if (ret < 0)
		return ret;
	ret = kv_local_create(c->n_layer, c->n_head_kv, c->head_dim, 0, &kv);
	if (ret < 0)
		return ret;
	ret = llm_ctx_create(E->m, kv, E->o->threads, &ctx);
	for (size_t j = 0; ret == 0 && j < R->prompt.n; j++)
		ret = llm_step(ctx, R->prompt.v[j], &logits);
	for (uint32_t t = 0; ret == 0 && t < E->o->tokens; t++) {
		uint32_t id = argmax_masked(E, logits);

		E->full_nll += nll_of(E, logits, id);
		E->full_count++;
		ret = llm_ids_push(&R->cont, id);
		if (ret == 0 && t + 1 < E->o->tokens)
			ret = llm_step(ctx, id, &logits);
	}
	llm_ctx_free(ctx);
	kv_destroy(kv);
	return ret;
}

/* One configuration, teacher-forced on every prompt's reference continuation. */
static void
run_cfg(struct eval *E, uint32_t ci, struct cfg_result *res)
{
	const struct llm_config *c = &E->m->cfg;
	double t0 = now_s();

	memset(res, 0, sizeof(*res));
	res->cfg = ci;
	for (uint32_t i = 0; i < E->o->prompts; i++) {
		const struct prompt_ref *R = &E->refs[i];
		uint32_t total = (uint32_t)(R->prompt.n + R->cont.n);
		struct kv_kvtier_opts ko;
		struct kv_backend *kv = NULL;
		struct llm_ctx *ctx = NULL;
		struct kvt_seq_stat st;
		const float *logits = NULL;
		char err[256];
		int ret;

		kvtier_opts_for(E, &cfgs[ci], (uint32_t)R->prompt.n, total, &ko);
		ret = kv_kvtier_create(c->n_layer, c->n_head_kv, c->head_dim, &ko, &kv, err,
				       sizeof(err));
		if (ret < 0) {
			fprintf(stderr,
				"kvtier-llm: eval: %s hbm %.2f evict %.2f t2 %.2f (window %u, "
				"delta %u, prompt %u, max %u): %s\n",
				kv_kvtier_policy_name(cfgs[ci].policy), cfgs[ci].hbm,
				cfgs[ci].evict, cfgs[ci].t2, ko.window, ko.delta, ko.prompt_len,
				ko.max_tokens, err);
			res->err = ret;
			return;
		}
		ret = llm_ctx_create(E->m, kv, E->o->threads, &ctx);
		for (size_t j = 0; ret == 0 && j < R->prompt.n; j++)
			ret = llm_step(ctx, R->prompt.v[j], &logits);
		for (size_t t = 0; ret == 0 && t < R->cont.n; t++) {
			uint32_t want = R->cont.v[t];

			res->agree += argmax_masked(E, logits) == want;
			res->nll += nll_of(E, logits, want);
			res->count++;
			if (t + 1 < R->cont.n)
				ret = llm_step(ctx, want, &logits);
		}
		if (ret == 0)
			ret = kv_kvtier_stat(kv, &st);
		if (ret == 0) {
			res->n_tokens += st.n_tokens;
			for (int k = 0; k < 4; k++)
				res->tiers[k] += st.tier_count[k];
		}
		llm_ctx_free(ctx);
		kv_destroy(kv);
		if (ret < 0) {
			res->err = ret;
			return;
		}
	}
	res->seconds = now_s() - t0;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double
median(double *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct speed {
	double tok_s_local, tok_s_kvtier;
	struct kv_kvtier_counters cnt; /* of the kvtier runs, summed */
	uint64_t kvtier_tokens;
};

/*
 * One free-running greedy generation (end-of-generation masked, so every run decodes exactly
 * speed_tokens steps) from the first prompt; decode tokens/s, prefill not counted.
 */
static int
speed_run(struct eval *E, int kvtier, double *ret_tok_s, struct speed *sp)
{
	const struct llm_config *c = &E->m->cfg;
	const struct llm_ids *prompt = &E->refs[0].prompt;
	struct kv_backend *kv = NULL;
	struct llm_ctx *ctx = NULL;
	const float *logits = NULL;
	char err[256];
	double t0 = 0;
	int ret;

	if (kvtier) {
		struct kv_kvtier_opts ko;

		/* The CLI's defaults: tiered, hbm 0.5, evict 0.03, Δ 64, window 128. */
		kv_kvtier_opts_default(&ko);
		ko.socket = E->o->socket;
		ko.name = "kvtier-llm-speed";
		ko.prompt_len = (uint32_t)prompt->n;
		ko.max_tokens = (uint32_t)prompt->n + E->o->speed_tokens;
		ret = kv_kvtier_create(c->n_layer, c->n_head_kv, c->head_dim, &ko, &kv, err,
				       sizeof(err));
		if (ret < 0)
			fprintf(stderr, "kvtier-llm: eval: %s\n", err);
	} else {
		ret = kv_local_create(c->n_layer, c->n_head_kv, c->head_dim, 0, &kv);
	}
	if (ret < 0)
		return ret;
	ret = llm_ctx_create(E->m, kv, E->o->threads, &ctx);
	for (size_t j = 0; ret == 0 && j < prompt->n; j++)
		ret = llm_step(ctx, prompt->v[j], &logits);
	if (ret == 0)
		t0 = now_s();
	for (uint32_t t = 0; ret == 0 && t < E->o->speed_tokens; t++)
		ret = llm_step(ctx, argmax_masked(E, logits), &logits);
	if (ret == 0) {
		*ret_tok_s = E->o->speed_tokens / (now_s() - t0);
		if (kvtier) {
			struct kv_kvtier_counters k;

			kv_kvtier_counters(kv, &k);
			sp->cnt.retiers += k.retiers;
			sp->cnt.fetches += k.fetches;
			sp->cnt.rows_staged += k.rows_staged;
			sp->cnt.appends += k.appends;
			sp->cnt.score_adds += k.score_adds;
			sp->cnt.retier_s += k.retier_s;
			sp->cnt.fetch_s += k.fetch_s;
			sp->cnt.append_s += k.append_s;
			sp->cnt.score_s += k.score_s;
			sp->cnt.reap_s += k.reap_s;
			sp->cnt.view_s += k.view_s;
			sp->kvtier_tokens += prompt->n + E->o->speed_tokens;
		}
	}
	llm_ctx_free(ctx);
	kv_destroy(kv);
	return ret;
}

static int
run_speed(struct eval *E, struct speed *sp)
{
	uint32_t n = E->o->speed_reps;
	double *loc = calloc(n, sizeof(double)), *kvt = calloc(n, sizeof(double));
	int ret = loc && kvt ? 0 : -ENOMEM;

	/* Alternated, so both see the same background load on a shared machine. */
	for (uint32_t r = 0; ret == 0 && r < n; r++) {
		ret = speed_run(E, 0, &loc[r], sp);
		if (ret == 0)
			ret = speed_run(E, 1, &kvt[r], sp);
		if (ret == 0 && E->o->verbose)
			fprintf(stderr,
				"kvtier-llm: eval: speed run %u: local %.1f, kvtier %.1f tok/s\n",
				r, loc[r], kvt[r]);
	}
	if (ret == 0) {
		sp->tok_s_local = median(loc, n);
		sp->tok_s_kvtier = median(kvt, n);
	}
	free(loc);
	free(kvt);
	return ret;
}

/* Runs the configurations over E->o->jobs processes; fills @res[NCFG]. */
static int
run_cfgs(struct eval *E, struct cfg_result *res)
{
	uint32_t jobs = E->o->jobs, got = 0;
	pid_t pids[64];
	int fds[2], ret = 0;

	if (jobs <= 1) {
		for (uint32_t i = 0; i < NCFG; i++) {
			run_cfg(E, i, &res[i]);
			if (E->o->verbose)
				fprintf(stderr, "kvtier-llm: eval: config %u/%zu done (%.0f s)\n",
					i + 1, NCFG, res[i].seconds);
			if (res[i].err)
				return res[i].err;
		}
		return 0;
	}
	if (jobs > 64)
		jobs = 64;
	if (pipe(fds) < 0)
		return -errno;
	fflush(NULL);
	for (uint32_t j = 0; j < jobs; j++) {
		pids[j] = fork();
		if (pids[j] < 0) {
			ret = -errno;
			jobs = j;
			break;
		}
		if (pids[j] == 0) {
			close(fds[0]);
			for (uint32_t i = j; i < NCFG; i += jobs) {
				struct cfg_result r;

				run_cfg(E, i, &r);
				if (write(fds[1], &r, sizeof(r)) != sizeof(r) || r.err)
					_exit(1);
			}
			_exit(0);
		}
	}
	close(fds[1]);
	while (got < NCFG) {
		struct cfg_result r;

		if (read(fds[0], &r, sizeof(r)) != sizeof(r) || r.cfg >= NCFG)
			break;
		res[r.cfg] = r;
		got++;
		if (E->o->verbose)
			fprintf(stderr, "kvtier-llm: eval: config %u done (%u/%zu, %.0f s)\n",
				r.cfg, got, NCFG, r.seconds);
		if (r.err && !ret)
			ret = r.err;
	}
	close(fds[0]);
	for (uint32_t j = 0; j < jobs; j++)
		waitpid(pids[j], NULL, 0);
	if (!ret && got < NCFG)
		ret = -ECHILD;
	return ret;
}

static double
row_budget(const struct cfg_result *r)
{
	return r->n_tokens ? 1.0 - (double)r->tiers[3] / (double)r->n_tokens : 0.0;
}

static void
print_report(const struct eval *E, const struct cfg_result *res, const struct speed *sp)
{
	const struct llm_eval_opts *o = E->o;
	double ppl_full = exp(E->full_nll / (double)E->full_count);
	double per_tok = sp->kvtier_tokens ? 1e3 / (double)sp->kvtier_tokens : 0;

	if (o->json) {
		printf("{\"prompts\":%u,\"tokens\":%u,\"delta\":%u,\"window\":%u,\"sinks\":4,"
		       "\"ppl_full\":%.6f,\"rows\":[",
		       o->prompts, o->tokens, o->delta, o->window, ppl_full);
		for (uint32_t i = 0; i < NCFG; i++) {
			const struct cfg_result *r = &res[i];

			printf("%s{\"policy\":\"%s\",\"hbm_frac\":%.2f,\"evict_frac\":%.2f,"
			       "\"t2_frac\":%.2f,\"t2_keys\":\"%s\",\"budget\":%.4f,"
			       "\"agreement\":%.6f,\"ppl\":%.6f,"
			       "\"tokens\":%llu,\"tiers\":[%llu,%llu,%llu,%llu]}",
			       i ? "," : "", kv_kvtier_policy_name(cfgs[i].policy), cfgs[i].hbm,
			       cfgs[i].evict, cfgs[i].t2, t2_keys_name(&cfgs[i]), row_budget(r),
			       (double)r->agree / (double)r->count, exp(r->nll / (double)r->count),
			       (unsigned long long)r->count, (unsigned long long)r->tiers[0],
			       (unsigned long long)r->tiers[1], (unsigned long long)r->tiers[2],
			       (unsigned long long)r->tiers[3]);
		}
		printf("],\"tok_s_kvtier\":%.3f,\"tok_s_local\":%.3f,\"speed\":{\"tokens\":%u,"
		       "\"reps\":%u,\"threads\":%u,\"ratio\":%.4f,\"retiers\":%llu,"
		       "\"rows_staged\":%llu,\"ms_per_token\":{\"retier\":%.4f,\"fetch\":%.4f,"
		       "\"append\":%.4f,\"score_add\":%.4f,\"reap\":%.4f,\"view\":%.4f}}}\n",
		       sp->tok_s_kvtier, sp->tok_s_local, o->speed_tokens, o->speed_reps,
		       o->threads, sp->tok_s_local > 0 ? sp->tok_s_kvtier / sp->tok_s_local : 0,
		       (unsigned long long)sp->cnt.retiers, (unsigned long long)sp->cnt.rows_staged,
		       sp->cnt.retier_s * per_tok, sp->cnt.fetch_s * per_tok,
		       sp->cnt.append_s * per_tok, sp->cnt.score_s * per_tok,
		       sp->cnt.reap_s * per_tok, sp->cnt.view_s * per_tok);
		return;
	}
	printf("kvtier-llm --eval: %u prompts x %u teacher-forced tokens, delta %u, window %u, "
	       "4 sinks, prompt protected\n\n",
	       o->prompts, o->tokens, o->delta, o->window);
	printf("%-10s %5s %6s %5s %7s %7s  %9s %8s   %7s %7s %7s %7s\n", "policy", "hbm", "evict",
	       "t2", "t2 keys", "kept", "agreement", "ppl", "T0", "T1", "T2", "T3");
	printf("%-10s %5s %6s %5s %7s %7s  %9.4f %8.4f   (local backend)\n", "local", "-", "-", "-",
	       "-", "1.000", 1.0, ppl_full);
	for (uint32_t i = 0; i < NCFG; i++) {
		const struct cfg_result *r = &res[i];

		printf("%-10s %5.2f %6.2f %5.2f %7s %7.3f  %9.4f %8.4f   %7llu %7llu %7llu %7llu\n",
		       kv_kvtier_policy_name(cfgs[i].policy), cfgs[i].hbm, cfgs[i].evict,
		       cfgs[i].t2, cfgs[i].t2 > 0 ? t2_keys_name(&cfgs[i]) : "-", row_budget(r),
		       (double)r->agree / (double)r->count, exp(r->nll / (double)r->count),
		       (unsigned long long)r->tiers[0], (unsigned long long)r->tiers[1],
		       (unsigned long long)r->tiers[2], (unsigned long long)r->tiers[3]);
	}
	printf(
	    "\nagreement: the configuration's greedy token equals the full-cache token, teacher-\n"
	    "forced on the full-cache continuation; ppl: perplexity of that continuation; kept:\n"
	    "fraction of positions not evicted at the end; T0..T3: tier counts at the end,\n"
	    "summed over prompts.\n\n");
	printf("decode speed (%u tokens, median of %u, %u thread%s): local %.2f tok/s, kvtier "
	       "(tiered, hbm 0.5, evict 0.03, delta 64) %.2f tok/s, ratio %.3f\n",
	       o->speed_tokens, o->speed_reps, o->threads, o->threads == 1 ? "" : "s",
	       sp->tok_s_local, sp->tok_s_kvtier,
	       sp->tok_s_local > 0 ? sp->tok_s_kvtier / sp->tok_s_local : 0);
	printf("kvtier time per token: retier %.3f ms, fetch %.3f ms, append %.3f ms, score_add "
	       "%.3f ms, reap %.3f ms, view %.3f ms (%llu RETIERs, %llu rows staged)\n",
	       sp->cnt.retier_s * per_tok, sp->cnt.fetch_s * per_tok, sp->cnt.append_s * per_tok,
	       sp->cnt.score_s * per_tok, sp->cnt.reap_s * per_tok, sp->cnt.view_s * per_tok,
	       (unsigned long long)sp->cnt.retiers, (unsigned long long)sp->cnt.rows_staged);
}

int
llm_eval_run(const struct llm_model *m, const struct llm_tok *tok, const struct llm_eval_opts *o)
{
	struct eval E = {.m = m, .tok = tok, .o = o};
	struct cfg_result res[NCFG];
	struct speed sp;
	int ret = 0;

	if (!o->prompts || o->prompts > llm_eval_n_prompts || !o->tokens || !o->speed_reps ||
	    !o->jobs || !o->delta)
		return -EINVAL;
	memset(res, 0, sizeof(res));
	memset(&sp, 0, sizeof(sp));
	E.eog = calloc(m->cfg.n_vocab, 1);
	E.refs = calloc(o->prompts, sizeof(*E.refs));
	if (!E.eog || !E.refs) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < m->cfg.n_vocab; i++)
		E.eog[i] = llm_tok_is_eog(tok, i);
	for (uint32_t i = 0; ret == 0 && i < o->prompts; i++) {
		ret = make_ref(&E, i);
		if (ret == 0 && o->verbose)
			fprintf(stderr, "kvtier-llm: eval: reference %u: %zu prompt + %zu tokens\n",
				i, E.refs[i].prompt.n, E.refs[i].cont.n);
	}
	if (ret == 0)
		ret = run_cfgs(&E, res);
	if (ret == 0)
		ret = run_speed(&E, &sp);
	if (ret == 0)
		print_report(&E, res, &sp);
out:
	if (E.refs)
		for (uint32_t i = 0; i < o->prompts; i++) {
			llm_ids_free(&E.refs[i].prompt);
			llm_ids_free(&E.refs[i].cont);
		}
	free(E.refs);
	free(E.eog);
	return ret;
}
