/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for engine/tier: parameter validation, budgets of every policy against a
 * sort-based reference, eviction and quantization finality, the differential slot property,
 * FETCH lists, and Proposition 1 (attention over T0 slots + staged T1 rows equals attention over
 * the full cache, bit for bit).
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_abi.h"
#include "quant.h"
#include "select.h"
#include "tier.h"

#include "test_req.h"

static uint64_t rng_state = 0x71e5;

static uint64_t
rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double
unif(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

static float
gauss(void)
{
	double s = 0;

	for (int i = 0; i < 4; i++)
		s += unif();
	return (float)((s - 2.0) * 1.7320508);
}

static struct kvt_seq_params
defaults(uint32_t t0_slots)
{
	return (struct kvt_seq_params){
	    .size = sizeof(struct kvt_seq_params),
	    .layers = 2,
	    .kv_heads = 2,
	    .head_dim = 16,
	    .dtype = KVT_DTYPE_F32,
	    .policy = KVT_POLICY_TIERED,
	    .score_mode = KVT_SCORE_SUM,
	    .protect_prompt = 1,
	    .delta = 64,
	    .sinks = 4,
	    .window = 128,
	    .prompt_len = 0,
	    .hbm_frac = 0.5f,
	    .evict_frac = 0.03f,
	    .t2_frac = 0.0f,
	    .t0_buf_id = t0_slots ? 1 : 0,
	    .t0_slots = t0_slots,
	};
}

/* A sequence with its own memory and workspace. */
struct tseq {
	struct kvt_tier_cfg cfg;
	struct kvt_tier_seq s;
	void *mem, *ws;
	size_t ws_size;
};

static void
tseq_open(struct tseq *t, const struct kvt_seq_params *p, uint32_t cap)
{
	const char *why = NULL;
	size_t sz;

	REQ_EQ(kvt_tier_cfg_init(p, &t->cfg, &why), 0);
	sz = kvt_tier_seq_bytes(cap, t->cfg.t0_slots);
	t->mem = aligned_alloc(64, (sz + 63) & ~(size_t)63);
	REQ_EQ(kvt_tier_seq_init(&t->s, t->mem, sz, cap, t->cfg.t0_slots), 0);
	t->ws_size = kvt_tier_ws_bytes(cap, t->cfg.t0_slots, t->cfg.delta);
	t->ws = aligned_alloc(64, (t->ws_size + 63) & ~(size_t)63);
}

static void
tseq_close(struct tseq *t)
{
	free(t->mem);
	free(t->ws);
}

/* Appends @count tokens into the first free slots (or the pool when there is no T0 region). */
static void
append_free(struct tseq *t, uint32_t count)
{
	uint32_t slots[256], k = 0;

	REQ_LE(count, 256);
	if (!t->cfg.t0_slots) {
		REQ_GE(kvt_tier_append(&t->s, count, NULL), 0);
		return;
	}
	for (uint32_t s = 0; s < t->s.t0_slots && k < count; s++)
		if (t->s.slot_pos[s] < 0)
			slots[k++] = s;
	REQ_EQ(k, count);
	k = t->s.n;
	REQ_EQ(kvt_tier_append(&t->s, count, slots), (int)k);
}

/* Internal consistency of a sequence: maps, counts, lists. */
static void
check_invariants(const struct tseq *t)
{
	const struct kvt_tier_seq *s = &t->s;
	uint32_t cnt[4] = {0}, n_int8 = 0, i;
	const uint32_t *l1, *l2;
	int n1, n2, k1 = 0, k2 = 0;

	for (uint32_t slot = 0; slot < s->t0_slots; slot++)
		if (s->slot_pos[slot] >= 0) {
			REQ_LT((uint32_t)s->slot_pos[slot], s->n);
			REQ_EQ(s->pos_slot[s->slot_pos[slot]], (int32_t)slot);
		}
	n1 = kvt_tier_positions(s, KVT_T1, &l1);
	n2 = kvt_tier_positions(s, KVT_T2, &l2);
	for (i = 0; i < s->n; i++) {
		unsigned tr = s->tier[i] & KVT_TIER_MASK;

		cnt[tr]++;
		if (tr == KVT_T0) {
			REQ_GE(s->pos_slot[i], 0);
			REQ_EQ(s->slot_pos[s->pos_slot[i]], (int32_t)i);
		} else {
			REQ_EQ(s->pos_slot[i], -1);
		}
		if (tr == KVT_T3)
			REQ_EQ(s->tier[i], KVT_T3);
		if (tr == KVT_T2)
			REQ(s->tier[i] & KVT_TIER_F_INT8);
		if (tr == KVT_T1)
			REQ(!(s->tier[i] & KVT_TIER_F_INT8));
		n_int8 += (s->tier[i] & KVT_TIER_F_INT8) != 0;
		if (tr == KVT_T1) {
			REQ_LT(k1, n1);
			REQ_EQ(l1[k1++], i);
		}
		if (tr == KVT_T2) {
			REQ_LT(k2, n2);
			REQ_EQ(l2[k2++], i);
		}
	}
	REQ_EQ(k1, n1);
	REQ_EQ(k2, n2);
	for (i = 0; i < 4; i++)
		REQ_EQ(cnt[i], s->count[i]);
	REQ_EQ(n_int8, s->n_int8);
}

/* ---- reference tiering: full sort, straight from the spec ------------------------------ */

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Expected tier byte of every position after a retier of @t (the current state). */
static void
ref_tiers(const struct tseq *t, uint8_t *out)
{
	const struct kvt_tier_cfg *c = &t->cfg;
	const struct kvt_tier_seq *s = &t->s;
	uint32_t n = s->n, head = c->sinks, pre, wst,
		 cap0 = c->t0_slots ? c->t0_slots - c->delta : 0;
	uint64_t *k = malloc((n + 1) * 8), *mid = malloc((n + 1) * 8);
	uint32_t nc = 0, np = 0, nmid = 0, e_new, t0c, t0_tot, q_tgt = 0, q_live = 0, i;

	if (c->protect_prompt && c->prompt_len > head)
		head = c->prompt_len;
	pre = head < n ? head : n;
	wst = n > c->window ? n - c->window : 0;
	wst = wst < pre ? pre : wst;
	for (i = 0; i < n; i++) {
		int prot = i < pre || i >= wst;

		out[i] = s->tier[i];
		if ((s->tier[i] & 3) == KVT_T3)
			continue;
		if (prot) {
			np++;
			out[i] = cap0 ? (KVT_T0 | (s->tier[i] & KVT_TIER_F_INT8))
				 : (s->tier[i] & KVT_TIER_F_INT8) ? (KVT_T2 | KVT_TIER_F_INT8)
								  : KVT_T1;
			continue;
		}
		float sc = s->score[i];

		if (c->score_mode == KVT_SCORE_MEAN)
			sc /= (float)(n - i);
		k[nc++] = (uint64_t)kvt_score_key(sc) << 32 | i;
	}
	qsort(k, nc, 8, cmp_u64);
	t0_tot = (uint32_t)ceil((double)c->hbm_frac * n);
	t0_tot = t0_tot < np ? np : t0_tot;
	t0_tot = t0_tot > cap0 ? cap0 : t0_tot;
	switch (c->policy) {
	case KVT_POLICY_TIERED: {
		uint32_t et = (uint32_t)floor((double)c->evict_frac * n);

		e_new = et > s->count[KVT_T3] ? et - s->count[KVT_T3] : 0;
		e_new = e_new > nc ? nc : e_new;
		t0c = t0_tot > np ? t0_tot - np : 0;
		t0c = t0c > nc - e_new ? nc - e_new : t0c;
		q_tgt = (uint32_t)floor((double)c->t2_frac * n);
		break;
	}
	case KVT_POLICY_H2O:
		t0c = t0_tot > np ? t0_tot - np : 0;
		t0c = t0c > nc ? nc : t0c;
		e_new = nc - t0c;
		break;
	case KVT_POLICY_STREAMING:
		t0c = 0;
		e_new = nc;
		break;
	default:
		t0c = cap0 > np ? cap0 - np : 0;
		t0c = t0c > nc ? nc : t0c;
		e_new = 0;
		break;
	}
	for (i = 0; i < nc; i++) {
		uint32_t pos = (uint32_t)k[i];
		uint8_t q = s->tier[pos] & KVT_TIER_F_INT8;

		if (i < e_new)
			out[pos] = KVT_T3;
		else if (i >= nc - t0c)
			out[pos] = KVT_T0 | q;
		else if (q)
			out[pos] = KVT_T2 | q;
		else {
			out[pos] = KVT_T1;
			mid[nmid++] = k[i];
		}
	}
	for (i = 0; i < n; i++)
		q_live += (out[i] & KVT_TIER_F_INT8) != 0;
	for (i = 0; i < nmid && q_live + i < q_tgt; i++)
		out[(uint32_t)mid[i]] = KVT_T2 | KVT_TIER_F_INT8;
	free(k);
	free(mid);
}

/* Retier with full checking: reference tiers, differential slot property, plan lists. */
static struct kvt_tier_plan
retier_checked(struct tseq *t)
{
	struct kvt_tier_seq *s = &t->s;
	uint32_t n = s->n, i;
	uint8_t *want = malloc(n + 1), *before = malloc(n + 1);
	int32_t *slot_before = malloc((n + 1) * 4);
	struct kvt_tier_plan p;
	uint32_t n3_before = s->count[KVT_T3];

	ref_tiers(t, want);
	memcpy(before, s->tier, n);
	memcpy(slot_before, s->pos_slot, n * 4);
	REQ_EQ(kvt_tier_retier(&t->cfg, s, t->ws, t->ws_size, &p), 0);
	check_invariants(t);
	for (i = 0; i < n; i++)
		REQ_MSG(s->tier[i] == want[i], "pos %u: tier %u, reference %u (was %u)", i,
			s->tier[i], want[i], before[i]);
	/* differential: staying T0 keeps its slot; only newly promoted positions are copied */
	{
		uint32_t np = 0, nd = 0;

		for (i = 0; i < n; i++) {
			int was = (before[i] & 3) == KVT_T0, is = (s->tier[i] & 3) == KVT_T0;

			if (was && is)
				REQ_EQ(s->pos_slot[i], slot_before[i]);
			if (!was && is) {
				REQ_LT(np, p.n_promote);
				np++;
			}
			if (was && !is) {
				REQ_LT(nd, p.n_demote);
				REQ_EQ(p.demote_pos[nd], i);
				REQ_EQ((int32_t)p.demote_slot[nd], slot_before[i]);
				nd++;
			}
			if ((before[i] & 3) == KVT_T3)
				REQ_EQ(s->tier[i], KVT_T3); /* eviction is final */
			if (before[i] & KVT_TIER_F_INT8)
				REQ(s->tier[i] & KVT_TIER_F_INT8 ||
				    s->tier[i] == KVT_T3); /* so is quantization */
		}
		REQ_EQ(np, p.n_promote);
		REQ_EQ(nd, p.n_demote);
		for (i = 0; i < p.n_promote; i++) {
			uint32_t pos = p.promote_pos[i];

			REQ_EQ(s->pos_slot[pos], (int32_t)p.promote_slot[i]);
			REQ_EQ((before[pos] & KVT_TIER_F_INT8) != 0, i >= p.n_promote_t1);
			if (i && i != p.n_promote_t1)
				REQ_LT(p.promote_pos[i - 1], pos);
		}
	}
	REQ_GE(s->count[KVT_T3], n3_before);
	if (t->cfg.t0_slots) {
		REQ_EQ(p.n_free, t->cfg.delta);
		REQ_LE(s->count[KVT_T0], t->cfg.t0_slots - t->cfg.delta);
		for (i = 0; i < p.n_free; i++) {
			REQ_EQ(s->slot_pos[p.free_slot[i]], -1);
			if (i)
				REQ_LT(p.free_slot[i - 1], p.free_slot[i]);
		}
	} else {
		REQ_EQ(p.n_free, 0);
	}
	REQ(fabsf(p.evicted_ratio - (float)s->count[KVT_T3] / (float)n) < 1e-6f);
	free(want);
	free(before);
	free(slot_before);
	return p;
}

/* Adds attention-like scores: a few heavy hitters, recency, noise. */
static void
add_scores(struct tseq *t)
{
	uint32_t n = t->s.n;
	float *v = malloc(n * sizeof(*v));

	for (uint32_t i = 0; i < n; i++) {
		double w = unif() * 0.01 + (n - i < 32 ? 0.05 : 0.0);

		if (rnd() % 97 == 0)
			w += unif();
		v[i] = (float)(w / n);
	}
	/* some exact ties */
	for (uint32_t i = 0; i + 1 < n; i += 13)
		v[i + 1] = v[i];
	REQ_EQ(kvt_tier_score_add(&t->s, 0, n, v), 0);
	free(v);
}

START_TEST(test_validate)
{
	struct kvt_seq_params p;
	const char *why;

#define BAD(stmt)                                                                                  \
	do {                                                                                       \
		p = defaults(1024);                                                                \
		stmt;                                                                              \
		why = NULL;                                                                        \
		REQ_EQ(kvt_tier_validate(&p, &why), -EINVAL);                                      \
		ck_assert_ptr_nonnull(why);                                                        \
	} while (0)
	p = defaults(1024);
	REQ_EQ(kvt_tier_validate(&p, NULL), 0);
	p = defaults(0);
	REQ_EQ(kvt_tier_validate(&p, NULL), 0); /* pool-only */
	BAD(p.policy = KVT_POLICY__COUNT);
	BAD(p.score_mode = 2);
	BAD(p.protect_prompt = 2);
	BAD(p.delta = 0);
	BAD(p.hbm_frac = -0.1f);
	BAD(p.hbm_frac = 1.5f);
	BAD(p.hbm_frac = NAN);
	BAD(p.evict_frac = NAN);
	BAD(p.evict_frac = 2.0f);
	BAD(p.t2_frac = -1.0f);
	BAD(p.t2_frac = NAN);
	BAD(p.hbm_frac = 0.7f; p.evict_frac = 0.2f; p.t2_frac = 0.2f);
	BAD(p.window = 2048);
	BAD(p.delta = 2048);
	BAD(p.t0_slots = 0);
	BAD(p.prompt_len = 900);
	BAD(p.sinks = 900);
	REQ_EQ(kvt_tier_validate(NULL, &why), -EINVAL);
	/* sums that are 1 up to f32 rounding are fine; other policies ignore the sum */
	p = defaults(1024);
	p.hbm_frac = 0.7f;
	p.evict_frac = 0.3f;
	REQ_EQ(kvt_tier_validate(&p, NULL), 0);
	p.policy = KVT_POLICY_H2O;
	p.evict_frac = 1.0f;
	REQ_EQ(kvt_tier_validate(&p, NULL), 0);
	/* protect_prompt off: a long prompt is fine */
	p = defaults(1024);
	p.protect_prompt = 0;
	p.prompt_len = 5000;
	REQ_EQ(kvt_tier_validate(&p, NULL), 0);
#undef BAD
}
END_TEST

/* Every policy, sum and mean modes, against the reference; budgets checked explicitly too. */
START_TEST(test_policies)
{
	const int policies[] = {KVT_POLICY_TIERED, KVT_POLICY_H2O, KVT_POLICY_STREAMING,
				KVT_POLICY_FULL};

	for (size_t pi = 0; pi < 4; pi++)
		for (int mode = 0; mode < 2; mode++)
			for (int pool_only = 0; pool_only < 2; pool_only++) {
				struct kvt_seq_params p = defaults(pool_only ? 0 : 1536);
				struct tseq t;
				uint32_t n;

				p.policy = (uint8_t)policies[pi];
				p.score_mode = (uint8_t)mode;
				p.prompt_len = 100;
				p.t2_frac = 0.2f;
				p.hbm_frac = policies[pi] == KVT_POLICY_TIERED ? 0.4f : 0.5f;
				tseq_open(&t, &p, 4096);
				REQ_EQ(kvt_tier_append(&t.s, 100, NULL), 0);
				for (int e = 0; e < 40; e++) {
					add_scores(&t);
					retier_checked(&t);
					append_free(&t, 64);
				}
				n = t.s.n;
				add_scores(&t);
				retier_checked(&t);
				switch (policies[pi]) {
				case KVT_POLICY_TIERED:
					REQ_EQ(t.s.count[KVT_T3], (uint32_t)floor(0.03 * n));
					REQ_EQ(t.s.n_int8, (uint32_t)floor((double)0.2f * n));
					if (!pool_only)
						REQ_EQ(t.s.count[KVT_T0],
						       (uint32_t)ceil((double)0.4f * n));
					break;
				case KVT_POLICY_H2O:
					/* pool-only: the protected set stays in the pool */
					REQ_EQ(t.s.count[KVT_T1] + t.s.count[KVT_T2],
					       pool_only ? 100 + 128 : 0);
					if (!pool_only)
						REQ_EQ(t.s.count[KVT_T0],
						       (uint32_t)ceil(0.5 * n) < 1536 - 64
							   ? (uint32_t)ceil(0.5 * n)
							   : 1536 - 64);
					break;
				case KVT_POLICY_STREAMING:
					REQ_EQ(t.s.count[KVT_T0] + t.s.count[KVT_T1], 100 + 128);
					break;
				default:
					REQ_EQ(t.s.count[KVT_T3], 0);
					if (!pool_only)
						REQ_EQ(t.s.count[KVT_T0], 1536 - 64);
					break;
				}
				tseq_close(&t);
			}
}
END_TEST

/* Random parameter sets and score histories: reference match, finality, invariants. */
START_TEST(test_random_histories)
{
	for (int iter = 0; iter < 60; iter++) {
		struct kvt_seq_params p = defaults(0);
		struct tseq t;
		uint32_t t0 = 64 + (uint32_t)(rnd() % 700);

		p.t0_buf_id = rnd() % 5 ? 1 : 0;
		p.t0_slots = t0;
		p.delta = 1 + (uint32_t)(rnd() % 24);
		p.window = (uint32_t)(rnd() % 24);
		p.sinks = (uint32_t)(rnd() % 6);
		p.prompt_len = (uint32_t)(rnd() % 20);
		p.protect_prompt = rnd() & 1;
		p.policy = (uint8_t)(rnd() % KVT_POLICY__COUNT);
		p.score_mode = (uint8_t)(rnd() & 1);
		p.evict_frac = (float)(unif() * 0.3);
		p.t2_frac = (float)(unif() * 0.3);
		p.hbm_frac = (float)(unif() * (1.0 - p.evict_frac - p.t2_frac));
		tseq_open(&t, &p, 3000);
		append_free(&t, 1 + (uint32_t)(rnd() % (p.t0_buf_id ? p.delta : 64)));
		for (int e = 0; e < 30; e++) {
			add_scores(&t);
			if (rnd() % 4 == 0) /* a burst of equal scores */
				for (uint32_t i = 0; i < t.s.n; i += 3)
					t.s.score[i] = 1.0f;
			retier_checked(&t);
			append_free(&t, 1 + (uint32_t)(rnd() % p.delta));
		}
		tseq_close(&t);
	}
}
END_TEST

START_TEST(test_eviction_final)
{
	struct kvt_seq_params p = defaults(1024);
	struct tseq t;
	uint8_t *evicted = calloc(4096, 1);

	p.evict_frac = 0.2f;
	p.hbm_frac = 0.3f;
	tseq_open(&t, &p, 4096);
	append_free(&t, 64);
	for (int e = 0; e < 40; e++) {
		uint32_t n = t.s.n, prev = t.s.count[KVT_T3];
		float *v = malloc(n * 4);

		/* scores flip every epoch: the old losers become the winners */
		for (uint32_t i = 0; i < n; i++)
			v[i] = (e & 1) ? (float)(n - i) : (float)i * 2.0f;
		REQ_EQ(kvt_tier_score_add(&t.s, 0, n, v), 0);
		free(v);
		retier_checked(&t);
		REQ_GE(t.s.count[KVT_T3], prev);
		for (uint32_t i = 0; i < n; i++) {
			if (evicted[i])
				REQ_EQ(t.s.tier[i], KVT_T3);
			evicted[i] = t.s.tier[i] == KVT_T3;
		}
		append_free(&t, 64);
	}
	free(evicted);
	tseq_close(&t);
}
END_TEST

START_TEST(test_api_errors)
{
	struct kvt_seq_params p = defaults(256);
	struct tseq t;
	struct kvt_tier_plan plan;
	uint32_t slots[3] = {0, 1, 1}, bad = 256;
	float v = NAN;
	const uint32_t *l;
	uint32_t out[8];

	p.delta = 8;
	p.window = 16;
	tseq_open(&t, &p, 64);
	REQ_EQ(kvt_tier_append(&t.s, 3, slots), -EBUSY); /* slot named twice */
	REQ_EQ(t.s.slot_pos[0], -1);			 /* rolled back */
	REQ_EQ(kvt_tier_append(&t.s, 1, &bad), -EINVAL);
	REQ_EQ(kvt_tier_append(&t.s, 0, NULL), -EINVAL);
	REQ_EQ(kvt_tier_append(&t.s, 65, NULL), -ENOSPC);
	REQ_EQ(kvt_tier_append(&t.s, 2, slots), 0);
	REQ_EQ(kvt_tier_append(&t.s, 1, &slots[1]), -EBUSY);
	REQ_EQ(kvt_tier_append(&t.s, 5, NULL), 2);
	REQ_EQ(t.s.n, 7);
	REQ_EQ(kvt_tier_score_add(&t.s, 6, 2, (const float[]){1, 2}), -EINVAL);
	REQ_EQ(kvt_tier_score_add(&t.s, 0, 1, &v), -EINVAL);
	v = INFINITY;
	REQ_EQ(kvt_tier_score_add(&t.s, 0, 1, &v), -EINVAL);
	REQ_EQ(kvt_tier_plan(&t.cfg, &t.s, t.ws, 16, &plan), -EINVAL);
	/* a plan is stale once the sequence changes */
	REQ_EQ(kvt_tier_plan(&t.cfg, &t.s, t.ws, t.ws_size, &plan), 0);
	REQ_EQ(kvt_tier_append(&t.s, 1, NULL), 7);
	REQ_EQ(kvt_tier_commit(&t.s, &plan), -ESTALE);
	check_invariants(&t);
	REQ_EQ(kvt_tier_positions(&t.s, KVT_T0, &l), -EINVAL);
	REQ_EQ(kvt_tier_fetch_list(&t.s, 1u << KVT_T0, 8, out), -EINVAL);
	REQ_EQ(kvt_tier_fetch_list(&t.s, 1u << KVT_T1, 2, out), -ENOBUFS);
	REQ_EQ(kvt_tier_fetch_list(&t.s, 1u << KVT_T1, 8, out), 6);
	REQ_EQ(kvt_tier_seq_init(&t.s, t.mem, 8, 64, 256), -EINVAL);
	tseq_close(&t);
}
END_TEST

/* Growing a sequence keeps its state; FETCH lists merge T1 and T2 in position order. */
START_TEST(test_move_and_lists)
{
	struct kvt_seq_params p = defaults(512);
	struct tseq t;
	struct kvt_tier_seq big;
	size_t sz = kvt_tier_seq_bytes(8192, 512);
	void *mem = aligned_alloc(64, (sz + 63) & ~(size_t)63);
	uint32_t *m = malloc(8192 * 4);
	int nm;

	p.t2_frac = 0.3f;
	p.hbm_frac = 0.3f;
	p.delta = 32;
	p.window = 32;
	tseq_open(&t, &p, 2048);
	REQ_EQ(kvt_tier_append(&t.s, 300, NULL), 0);
	for (int e = 0; e < 20; e++) {
		add_scores(&t);
		retier_checked(&t);
		append_free(&t, 32);
	}
	REQ_EQ(kvt_tier_seq_move(&big, mem, sz, 8192, &t.s), 0);
	ck_assert_mem_eq(big.tier, t.s.tier, t.s.n);
	ck_assert_mem_eq(big.pos_slot, t.s.pos_slot, 4 * t.s.n);
	ck_assert_mem_eq(big.slot_pos, t.s.slot_pos, 4 * 512);
	free(t.mem);
	t.s = big;
	t.mem = mem;
	free(t.ws);
	t.ws_size = kvt_tier_ws_bytes(8192, 512, 32);
	t.ws = aligned_alloc(64, (t.ws_size + 63) & ~(size_t)63);
	check_invariants(&t);
	REQ_EQ(kvt_tier_append(&t.s, 3000, NULL), (int)(300 + 20 * 32));
	check_invariants(&t);
	add_scores(&t);
	retier_checked(&t);
	nm = kvt_tier_fetch_list(&t.s, (1u << KVT_T1) | (1u << KVT_T2), 8192, m);
	REQ_EQ(nm, (int)(t.s.count[KVT_T1] + t.s.count[KVT_T2]));
	for (int i = 0, k = 0; i < (int)t.s.n; i++) {
		unsigned tr = t.s.tier[i] & 3;

		if (tr == KVT_T1 || tr == KVT_T2)
			REQ_EQ(m[k++], (uint32_t)i);
	}
	free(m);
	tseq_close(&t);
}
END_TEST

/*
 * A restart hands over score[], tier[] and pos_slot[] only: the restored sequence must equal the
 * original in every array and list, go on to the same plans, and a state the API could never
 * reach must be refused.
 */
START_TEST(test_restore)
{
	struct kvt_seq_params p = defaults(512);
	struct tseq t, u;
	struct kvt_tier_plan a, b;
	size_t sz;
	void *mem;
	uint32_t n;
	uint8_t *tier;
	int32_t *ps;
	float *sc;

	p.t2_frac = 0.3f;
	p.hbm_frac = 0.3f;
	p.evict_frac = 0.1f;
	p.delta = 32;
	p.window = 32;
	tseq_open(&t, &p, 4096);
	REQ_EQ(kvt_tier_append(&t.s, 300, NULL), 0);
	for (int e = 0; e < 20; e++) {
		add_scores(&t);
		retier_checked(&t);
		append_free(&t, 32);
	}
	n = t.s.n;
	ck_assert_uint_gt(t.s.count[KVT_T0] * t.s.count[KVT_T1] * t.s.count[KVT_T2], 0);
	ck_assert_uint_gt(t.s.count[KVT_T3], 0);
	tseq_open(&u, &p, 4096);
	REQ_EQ(kvt_tier_seq_restore(&u.s, u.mem, kvt_tier_seq_bytes(4096, 512), 4096, 512, n,
				    t.s.gen, t.s.score, t.s.tier, t.s.pos_slot),
	       0);
	REQ_EQ(u.s.n, n);
	REQ_EQ(u.s.gen, t.s.gen);
	REQ_EQ(u.s.n_int8, t.s.n_int8);
	ck_assert_mem_eq(u.s.count, t.s.count, sizeof(t.s.count));
	ck_assert_mem_eq(u.s.slot_pos, t.s.slot_pos, 4 * 512);
	for (int k = KVT_T1; k <= KVT_T2; k++) {
		const uint32_t *la, *lb;
		int na = kvt_tier_positions(&t.s, k, &la), nb = kvt_tier_positions(&u.s, k, &lb);

		REQ_EQ(na, nb);
		ck_assert_mem_eq(la, lb, 4 * (size_t)na);
	}
	check_invariants(&u);
	/* Both go on alike. */
	add_scores(&t);
	memcpy(u.s.score, t.s.score, 4 * (size_t)n);
	REQ_EQ(kvt_tier_plan(&t.cfg, &t.s, t.ws, t.ws_size, &a), 0);
	REQ_EQ(kvt_tier_plan(&u.cfg, &u.s, u.ws, u.ws_size, &b), 0);
	REQ_EQ(a.n_promote, b.n_promote);
	REQ_EQ(a.n_demote, b.n_demote);
	REQ_EQ(a.n_quant, b.n_quant);
	REQ_EQ(a.n_evict, b.n_evict);
	ck_assert_mem_eq(a.promote_pos, b.promote_pos, 4 * (size_t)a.n_promote);
	ck_assert_mem_eq(a.promote_slot, b.promote_slot, 4 * (size_t)a.n_promote);
	ck_assert_mem_eq(a.quant_pos, b.quant_pos, 4 * (size_t)a.n_quant);

	/* Refused, and nothing changes: each copy broken in one place. */
	sz = kvt_tier_seq_bytes(4096, 512);
	mem = aligned_alloc(64, (sz + 63) & ~(size_t)63);
	tier = malloc(n);
	ps = malloc(4 * (size_t)n);
	sc = malloc(4 * (size_t)n);
	for (int c = 0; c < 8; c++) {
		struct kvt_tier_seq v = {.n = 12345};
		uint32_t t0 = 0, t1 = 0;

		memcpy(tier, t.s.tier, n);
		memcpy(ps, t.s.pos_slot, 4 * (size_t)n);
		memcpy(sc, t.s.score, 4 * (size_t)n);
		while ((t.s.tier[t0] & KVT_TIER_MASK) != KVT_T0)
			t0++;
		while (t.s.tier[t1] != KVT_T1)
			t1++;
		switch (c) {
		case 0:
			tier[t1] = KVT_T2;
			break; /* T2 without int8 */
		case 1:
			tier[t1] = KVT_T1 | KVT_TIER_F_INT8;
			break; /* T1 with int8 */
		case 2:
			tier[t1] = 7;
			break; /* no such tier */
		case 3:
			ps[t1] = 0;
			break; /* slot outside T0 */
		case 4:
			ps[t0] = 512;
			break; /* slot out of range */
		case 5:
			tier[t1] = KVT_T0;
			ps[t1] = ps[t0];
			break; /* slot used twice */
		case 6:
			sc[3] = NAN;
			break;
		case 7:
			sc[3] = -1.0f;
			break;
		}
		REQ_EQ(kvt_tier_seq_restore(&v, mem, sz, 4096, 512, n, 1, sc, tier, ps), -EINVAL);
		REQ_EQ(v.n, 12345u);
	}
	REQ_EQ(kvt_tier_seq_restore(&u.s, mem, sz, 100, 512, 101, 1, sc, tier, ps), -EINVAL);
	free(tier);
	free(ps);
	free(sc);
	free(mem);
	tseq_close(&u);
	tseq_close(&t);
}
END_TEST

/* ---- Proposition 1 ---------------------------------------------------------------------- */

#define P1_L   2
#define P1_H   2
#define P1_D   16
#define P1_ROW (P1_H * P1_D)	   /* floats per row */
#define P1_TOK (P1_L * 2 * P1_ROW) /* floats per token */

/* One (layer, head) attention: softmax(q K^T / sqrt(D)) V over @m rows, in the given order. */
static void
attend(const float *q, const float *const *krow, const float *const *vrow, uint32_t m, int h,
       float *logit, float *out)
{
	const float scale = 1.0f / sqrtf((float)P1_D);
	float mx = -INFINITY, den = 0.0f;

	for (uint32_t i = 0; i < m; i++) {
		float dot = 0.0f;

		for (int d = 0; d < P1_D; d++)
			dot += q[d] * krow[i][h * P1_D + d];
		logit[i] = dot * scale;
		mx = logit[i] > mx ? logit[i] : mx;
	}
	for (uint32_t i = 0; i < m; i++) {
		logit[i] = expf(logit[i] - mx);
		den += logit[i];
	}
	for (int d = 0; d < P1_D; d++)
		out[d] = 0.0f;
	for (uint32_t i = 0; i < m; i++) {
		float w = logit[i] / den;

		logit[i] = w;
		for (int d = 0; d < P1_D; d++)
			out[d] += w * vrow[i][h * P1_D + d];
	}
}

struct p1 {
	struct tseq t;
	uint32_t cap;
	float *orig;	/* [cap][TOK] the full reference cache */
	float *pool;	/* [cap][TOK] T1 copies (NaN once quantized or evicted) */
	int8_t *codes;	/* [cap][L*2][ROW] T2 codes */
	float *qscale;	/* [cap][L*2][H] T2 scales */
	float *t0;	/* [t0_slots][TOK] the client's T0 region */
	float *stage;	/* [cap][ROW] staging rows of one (layer, K|V) */
	uint32_t *list; /* FETCH list */
	double e2, r2;	/* squared error and reference norm, summed over every output */
};

static void
poison(float *p, size_t nf)
{
	for (size_t i = 0; i < nf; i++)
		p[i] = NAN;
}

/* What the daemon does on RETIER: quantize, demote, copy promotions, evict, commit. */
static void
p1_retier(struct p1 *x)
{
	struct kvt_tier_plan pl;
	struct tseq *t = &x->t;
	uint32_t i;

	REQ_EQ(kvt_tier_plan(&t->cfg, &t->s, t->ws, t->ws_size, &pl), 0);
	for (i = 0; i < pl.n_quant; i++) {
		uint32_t pos = pl.quant_pos[i];

		REQ_EQ(kvt_quant_rows(KVT_DTYPE_F32, P1_H, P1_D, x->pool + (size_t)pos * P1_TOK,
				      P1_ROW * 4, P1_L * 2, x->codes + (size_t)pos * P1_TOK,
				      x->qscale + (size_t)pos * P1_L * 2 * P1_H),
		       0);
		poison(x->pool + (size_t)pos * P1_TOK, P1_TOK); /* the T1 slot is freed */
	}
	for (i = 0; i < pl.n_demote; i++) /* no copy; the slot content is dead from now on */
		poison(x->t0 + (size_t)pl.demote_slot[i] * P1_TOK, P1_TOK);
	/* T1 promotions: one gather of whole tokens into the slots' staging, then into slots */
	if (pl.n_promote_t1) {
		float *buf = malloc((size_t)pl.n_promote_t1 * P1_TOK * 4);

		REQ_EQ(kvt_gather_rows(buf, x->pool, P1_TOK * 4, pl.promote_pos, pl.n_promote_t1,
				       P1_TOK * 4),
		       0);
		for (i = 0; i < pl.n_promote_t1; i++)
			memcpy(x->t0 + (size_t)pl.promote_slot[i] * P1_TOK,
			       buf + (size_t)i * P1_TOK, P1_TOK * 4);
		free(buf);
	}
	for (i = pl.n_promote_t1; i < pl.n_promote; i++) {
		uint32_t pos = pl.promote_pos[i];

		REQ_EQ(kvt_dequant_rows(KVT_DTYPE_F32, P1_H, P1_D, x->codes + (size_t)pos * P1_TOK,
					x->qscale + (size_t)pos * P1_L * 2 * P1_H, P1_L * 2,
					x->t0 + (size_t)pl.promote_slot[i] * P1_TOK, P1_ROW * 4),
		       0);
	}
	for (i = 0; i < pl.n_evict; i++)
		poison(x->pool + (size_t)pl.evict_pos[i] * P1_TOK, P1_TOK);
	REQ_EQ(kvt_tier_commit(&t->s, &pl), 0);
	check_invariants(t);
}

/* Client append of one token: rows into a free T0 slot, and the pool copy (APPEND F_T0). */
static void
p1_append(struct p1 *x, int to_t0)
{
	uint32_t pos = x->t.s.n, slot = 0;

	for (int j = 0; j < P1_TOK; j++)
		x->orig[(size_t)pos * P1_TOK + j] = gauss();
	memcpy(x->pool + (size_t)pos * P1_TOK, x->orig + (size_t)pos * P1_TOK, P1_TOK * 4);
	if (!to_t0) {
		REQ_EQ(kvt_tier_append(&x->t.s, 1, NULL), (int)pos);
		return;
	}
	while (x->t.s.slot_pos[slot] >= 0)
		slot++;
	memcpy(x->t0 + (size_t)slot * P1_TOK, x->orig + (size_t)pos * P1_TOK, P1_TOK * 4);
	REQ_EQ(kvt_tier_append(&x->t.s, 1, &slot), (int)pos);
}

/*
 * One decode step's attention, client side (T0 slots + staged T1/T2 rows, ordered by position)
 * and reference side (the full cache restricted to live positions). Adds the client's
 * attention weights to the scores. Returns the max relative L2 error over (layer, head).
 */
static double
p1_step(struct p1 *x, int exact)
{
	struct kvt_tier_seq *s = &x->t.s;
	uint32_t n = s->n, m = 0, nl;
	const float **ck = malloc(n * sizeof(*ck)), **cv = malloc(n * sizeof(*cv));
	const float **rk = malloc(n * sizeof(*rk)), **rv = malloc(n * sizeof(*rv));
	float *logit = malloc(n * 4), *wsum = calloc(n, 4), *stage_k, *stage_v;
	uint32_t *cpos = malloc(n * 4), *slot_of = malloc(n * 4);
	float q[P1_D], oc[P1_D], orf[P1_D];
	double worst = 0.0;
	const int32_t none = -1;

	stage_k = x->stage;
	stage_v = x->stage + (size_t)n * P1_ROW;
	nl = (uint32_t)kvt_tier_fetch_list(s, (1u << KVT_T1) | (1u << KVT_T2), x->cap, x->list);
	for (int l = 0; l < P1_L; l++) {
		/* FETCH layer l: T1 rows gathered, T2 rows dequantized, in list order */
		for (int kv = 0; kv < 2; kv++) {
			float *st = kv ? stage_v : stage_k;

			for (uint32_t i = 0; i < nl; i++) {
				uint32_t pos = x->list[i];
				size_t row = (size_t)pos * P1_L * 2 + (size_t)l * 2 + (size_t)kv;

				if (s->tier[pos] & KVT_TIER_F_INT8)
					REQ_EQ(kvt_dequant_rows(
						   KVT_DTYPE_F32, P1_H, P1_D,
						   x->codes + row * P1_ROW, x->qscale + row * P1_H,
						   1, st + (size_t)i * P1_ROW, P1_ROW * 4),
					       0);
				else
					REQ_EQ(
					    kvt_gather_rows(st + (size_t)i * P1_ROW,
							    x->pool + ((size_t)l * 2 + kv) * P1_ROW,
							    P1_TOK * 4, &pos, 1, P1_ROW * 4),
					    0);
			}
		}
		/* client order: merge slot contents and staged rows by position */
		m = 0;
		for (uint32_t pos = 0; pos < n; pos++)
			slot_of[pos] = (uint32_t)none;
		for (uint32_t slot = 0; slot < s->t0_slots; slot++)
			if (s->slot_pos[slot] >= 0)
				slot_of[s->slot_pos[slot]] = slot;
		for (uint32_t pos = 0, i = 0; pos < n; pos++) {
			if (slot_of[pos] != (uint32_t)none) {
				const float *tok = x->t0 + (size_t)slot_of[pos] * P1_TOK;

				ck[m] = tok + (size_t)l * 2 * P1_ROW;
				cv[m] = tok + ((size_t)l * 2 + 1) * P1_ROW;
				cpos[m++] = pos;
			} else if (i < nl && x->list[i] == pos) {
				ck[m] = stage_k + (size_t)i * P1_ROW;
				cv[m] = stage_v + (size_t)i * P1_ROW;
				cpos[m++] = pos;
				i++;
			}
		}
		/* reference: every live position of the full cache, in position order */
		REQ_EQ(m, n - s->count[KVT_T3]);
		for (uint32_t i = 0; i < m; i++) {
			rk[i] = x->orig + (size_t)cpos[i] * P1_TOK + (size_t)l * 2 * P1_ROW;
			rv[i] = x->orig + (size_t)cpos[i] * P1_TOK + ((size_t)l * 2 + 1) * P1_ROW;
		}
		for (int h = 0; h < P1_H; h++) {
			double e2 = 0, r2 = 0;

			for (int d = 0; d < P1_D; d++)
				q[d] = gauss() * 2.0f;
			attend(q, rk, rv, m, h, logit, orf);
			attend(q, ck, cv, m, h, logit, oc);
			for (uint32_t i = 0; i < m; i++)
				wsum[cpos[i]] += logit[i] / (P1_L * P1_H);
			if (exact)
				REQ_MSG(!memcmp(oc, orf, sizeof(oc)),
					"attention differs at n=%u layer %d head %d", n, l, h);
			for (int d = 0; d < P1_D; d++) {
				e2 += (double)(oc[d] - orf[d]) * (oc[d] - orf[d]);
				r2 += (double)orf[d] * orf[d];
			}
			worst = fmax(worst, sqrt(e2 / (r2 > 0 ? r2 : 1)));
			x->e2 += e2;
			x->r2 += r2;
		}
	}
	REQ_EQ(kvt_tier_score_add(s, 0, n, wsum), 0);
	free(ck);
	free(cv);
	free(rk);
	free(rv);
	free(logit);
	free(wsum);
	free(cpos);
	free(slot_of);
	return worst;
}

/* Returns the relative L2 error over all outputs; *ret_worst gets the worst single output's. */
static double
p1_run(float hbm, float evict, float t2, int exact, double *ret_worst)
{
	struct kvt_seq_params p = defaults(512);
	struct p1 x = {.cap = 64 + 640};
	double worst = 0.0;

	p.delta = 16;
	p.window = 32;
	p.prompt_len = 64;
	p.hbm_frac = hbm;
	p.evict_frac = evict;
	p.t2_frac = t2;
	if ((double)hbm + evict + t2 > 1.0)
		p.hbm_frac = 1.0f - evict - t2;
	tseq_open(&x.t, &p, x.cap);
	x.orig = malloc((size_t)x.cap * P1_TOK * 4);
	x.pool = malloc((size_t)x.cap * P1_TOK * 4);
	x.codes = malloc((size_t)x.cap * P1_TOK);
	x.qscale = malloc((size_t)x.cap * P1_L * 2 * P1_H * 4);
	x.t0 = malloc((size_t)512 * P1_TOK * 4);
	x.stage = malloc((size_t)x.cap * P1_ROW * 2 * 4);
	x.list = malloc((size_t)x.cap * 4);
	poison(x.t0, (size_t)512 * P1_TOK);
	for (int i = 0; i < 64; i++) /* prefill: rows go to the pool */
		p1_append(&x, 0);
	p1_retier(&x);
	for (int step = 0; step < 640; step++) {
		p1_append(&x, 1);
		worst = fmax(worst, p1_step(&x, exact));
		if ((step + 1) % 16 == 0)
			p1_retier(&x);
	}
	REQ_GT(x.t.s.count[KVT_T1] + x.t.s.count[KVT_T2], 0);
	free(x.orig);
	free(x.pool);
	free(x.codes);
	free(x.qscale);
	free(x.t0);
	free(x.stage);
	free(x.list);
	tseq_close(&x.t);
	if (ret_worst)
		*ret_worst = worst;
	return sqrt(x.e2 / x.r2);
}

START_TEST(test_prop1_exact)
{
	const float hbm[] = {0.1f, 0.3f, 0.5f, 0.7f, 1.0f};

	/* evict_frac = 0, t2_frac = 0: equal to attention over the full cache, bit for bit */
	for (size_t i = 0; i < sizeof(hbm) / sizeof(hbm[0]); i++)
		p1_run(hbm[i], 0.0f, 0.0f, 1, NULL);
	/* with eviction: equal to attention over the live positions (the error is T3's alone) */
	p1_run(0.3f, 0.05f, 0.0f, 1, NULL);
}
END_TEST

START_TEST(test_prop1_t2_error)
{
	const float t2[] = {0.2f, 0.5f};

	for (size_t i = 0; i < 2; i++) {
		double worst, e = p1_run(0.3f, 0.0f, t2[i], 0, &worst);

		printf("check_tier: T2 on (hbm 0.3, t2_frac %.1f, per-head int8): relative L2 "
		       "attention error %.3e overall, %.3e worst single output\n",
		       t2[i], e, worst);
		/* int8 codes carry ~0.4%% of a head's max per element; outputs average many rows */
		REQ_MSG(e < 1e-2, "relative error %g", e);
		REQ_MSG(worst < 1e-1, "worst relative error %g", worst);
		REQ(e > 0.0);
	}
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("tier");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_validate);
	tcase_add_test(tc, test_policies);
	tcase_add_test(tc, test_random_histories);
	tcase_add_test(tc, test_eviction_final);
	tcase_add_test(tc, test_api_errors);
	tcase_add_test(tc, test_move_and_lists);
	tcase_add_test(tc, test_restore);
	tcase_add_test(tc, test_prop1_exact);
	tcase_add_test(tc, test_prop1_t2_error);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
