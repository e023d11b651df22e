/* SPDX-License-Identifier: MIT */
/*
 * Tiering through a real kvtierd: a client decodes into its T0 region, follows RETIER's slot
 * changes and FETCHes the offloaded rows. Proposition 1 end to end: attention over T0 slots +
 * staged rows equals attention over a full reference cache, bit for bit, when nothing is evicted
 * or quantized, whatever hbm_frac is.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 2, H = 2, D = 32, SLOTS = 256, DELTA = 16, STEPS = 600 };
#define ROW (H * D)	  /* floats per (token, layer, K|V) */
#define TOK (L * 2 * ROW) /* floats per token */

static struct kvtd_proc Dm;

struct client {
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	uint32_t seq;
	int32_t slot_pos[SLOTS];
	uint32_t free_slots[SLOTS], n_free, next_free;
	float *ref; /* [STEPS][TOK] */
	uint64_t rng;
	uint32_t n;
	int int8;      /* t2_frac > 0 */
	float outlier; /* > 0: channel 5 of every key head is this many times larger */
};

static float
frand(uint64_t *s)
{
	return (float)((kvt_test_lcg(s) >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static float *
t0_row(struct client *k, uint32_t slot, uint32_t l, uint32_t kv)
{
	return (float *)kvt_buf_ptr(k->t0) + ((size_t)(l * 2 + kv) * SLOTS + slot) * ROW;
}

static float *
stage_row(struct client *k, uint32_t row, uint32_t l, uint32_t kv)
{
	return (float *)kvt_buf_ptr(k->stage) + ((size_t)(l * 2 + kv) * STEPS + row) * ROW;
}

static void
apply_retier(struct client *k)
{
	static uint8_t out[SLOTS * 16 + 256];
	const struct kvt_retier_result *res = (const void *)out;
	const struct kvt_slot_change *ch;
	const uint32_t *fs;
	int r = kvt_retier(k->c, k->seq, out, sizeof(out));

	ck_assert_msg(r > 0, "RETIER: %s", kvt_strerror(r));
	ck_assert_uint_eq(res->size, sizeof(*res));
	ck_assert_uint_eq(res->n_tokens, k->n);
	ch = (const void *)(out + sizeof(*res));
	fs = (const void *)(ch + res->n_changes);
	ck_assert_int_eq(r, (int)(sizeof(*res) + res->n_changes * 8 + res->n_free * 4));
	for (uint32_t i = 0; i < res->n_changes; i++) {
		ck_assert_uint_lt(ch[i].slot, SLOTS);
		k->slot_pos[ch[i].slot] = ch[i].pos;
	}
	for (uint32_t i = 0; i < res->n_free; i++) {
		ck_assert_int_eq(k->slot_pos[fs[i]], -1);
		k->free_slots[i] = fs[i];
	}
	k->n_free = res->n_free;
	k->next_free = 0;
	/* Every slot that holds a position holds that position's rows: exactly, or within int8
	 * error when the sequence quantizes (a T2 position promoted back comes dequantized). */
	for (uint32_t s = 0; s < SLOTS; s++)
		if (k->slot_pos[s] >= 0)
			for (uint32_t l = 0; l < L; l++)
				for (uint32_t kv = 0; kv < 2; kv++) {
					const float *got = t0_row(k, s, l, kv);
					const float *want = k->ref + (size_t)k->slot_pos[s] * TOK +
							    (l * 2 + kv) * ROW;

					if (!k->int8) {
						ck_assert(!memcmp(got, want, ROW * sizeof(float)));
						continue;
					}
					/* half a step of the largest scale there can be */
					for (int j = 0; j < ROW; j++)
						ck_assert(fabsf(got[j] - want[j]) <=
							  fmaxf(1.0f, k->outlier) / 127);
				}
}

static void
client_open_t2(struct client *k, float hbm, float evict, float t2, uint32_t t2_flags, float outlier,
	       uint64_t seed)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};
	struct kvt_seq_params p = {.size = sizeof(p)};

	memset(k, 0, sizeof(*k));
	k->rng = seed;
	k->int8 = t2 > 0;
	k->outlier = outlier;
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &k->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(k->c, (size_t)L * 2 * SLOTS * ROW * 4, &k->t0), 0);
	ck_assert_int_eq(kvt_buf_alloc(k->c, (size_t)L * 2 * STEPS * ROW * 4, &k->stage), 0);
	p.layers = L;
	p.kv_heads = H;
	p.head_dim = D;
	p.dtype = KVT_DTYPE_F32;
	p.policy = KVT_POLICY_TIERED;
	p.delta = DELTA;
	p.sinks = 4;
	p.window = 32;
	p.hbm_frac = hbm;
	p.evict_frac = evict;
	p.t2_frac = t2;
	p.t2_flags = t2_flags;
	p.t0_buf_id = kvt_buf_id(k->t0);
	p.t0_slots = SLOTS;
	p.t0_slot_stride = ROW * 4;
	p.t0_kv_stride = (uint64_t)SLOTS * ROW * 4;
	p.t0_layer_stride = 2ull * SLOTS * ROW * 4;
	p.stage_buf_id = kvt_buf_id(k->stage);
	p.stage_slots = STEPS;
	p.stage_slot_stride = ROW * 4;
	p.stage_kv_stride = (uint64_t)STEPS * ROW * 4;
	p.stage_layer_stride = 2ull * STEPS * ROW * 4;
	ck_assert_int_eq(kvt_seq_open(k->c, &p, &k->seq), 0);
	for (int i = 0; i < SLOTS; i++)
		k->slot_pos[i] = -1;
	k->ref = malloc(sizeof(float) * TOK * STEPS);
	apply_retier(k); /* n = 0: hands out the first free slots */
}

static void
client_open(struct client *k, float hbm, float evict, float t2, uint64_t seed)
{
	client_open_t2(k, hbm, evict, t2, 0, 0.0f, seed);
}

static void
client_close(struct client *k)
{
	ck_assert_int_eq(kvt_seq_close(k->c, k->seq), 0);
	kvt_disconnect(k->c);
	free(k->ref);
}

/* One decode step: write the token into the next free slot, append it, add scores. */
static void
step(struct client *k)
{
	float *ref = k->ref + (size_t)k->n * TOK, w[STEPS];
	uint32_t slot;

	ck_assert_uint_lt(k->next_free, k->n_free);
	slot = k->free_slots[k->next_free++];
	for (int i = 0; i < TOK; i++)
		ref[i] = frand(&k->rng);
	if (k->outlier > 0)
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t h = 0; h < H; h++)
				ref[l * 2 * ROW + h * D + 5] *= k->outlier;
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			memcpy(t0_row(k, slot, l, kv), ref + (l * 2 + kv) * ROW, ROW * 4);
	ck_assert_int_eq(kvt_append_t0(k->c, k->seq, &slot, 1), k->n + 1);
	k->slot_pos[slot] = (int32_t)k->n;
	k->n++;
	/* Skewed, unpredictable weights: some old positions matter a lot. */
	for (uint32_t i = 0; i < k->n; i++) {
		float x = frand(&k->rng);

		w[i] = x > 0.9f ? 1.0f : x * x * 0.01f;
	}
	ck_assert_int_eq(kvt_score_add(k->c, k->seq, 0, w, k->n), 0);
	if (k->next_free == k->n_free)
		apply_retier(k);
}

/* Attention of @q over (position, K row, V row) triples sorted by position, layer 0 head 0. */
static void
attend(uint32_t m, const uint32_t *pos, const float *const *K, const float *const *V,
       const float *q, float *out)
{
	float logit[STEPS], mx = -INFINITY, sum = 0;

	for (uint32_t i = 0; i < m; i++) {
		float s = 0;

		if (i)
			ck_assert_uint_gt(pos[i], pos[i - 1]);
		for (int j = 0; j < D; j++)
			s += q[j] * K[i][j];
		logit[i] = s / sqrtf((float)D);
		mx = fmaxf(mx, logit[i]);
	}
	for (uint32_t i = 0; i < m; i++)
		sum += logit[i] = expf(logit[i] - mx);
	for (int j = 0; j < D; j++) {
		float acc = 0;

		for (uint32_t i = 0; i < m; i++)
			acc += logit[i] / sum * V[i][j];
		out[j] = acc;
	}
}

/* The positions of the last gather_view()'s FETCH, in the order the daemon gave them. */
static uint32_t staged[STEPS];
static uint32_t n_staged;

/* Gathers T0 slots + staged T1/T2 rows (layer 0), sorted by position; returns the count. */
static uint32_t
gather_view(struct client *k, unsigned flags, uint32_t *pos, const float **K, const float **V)
{
	int r = kvt_fetch(k->c, k->seq, flags, 0, L, 0, staged, STEPS);
	uint32_t m = 0, a = 0;
	const float *byp_k[STEPS] = {0}, *byp_v[STEPS] = {0};

	ck_assert_msg(r >= 0, "FETCH: %s", kvt_strerror(r));
	n_staged = (uint32_t)r;
	for (int i = 0; i < r; i++) {
		/* KVT_FETCH_F_T1/T2 promise ascending positions: the rows are placed by position
		 * below, so only this catches a daemon that stages them out of order */
		if (i)
			ck_assert_msg(staged[i] > staged[i - 1],
				      "FETCH positions out of order: %u then %u at %d",
				      staged[i - 1], staged[i], i);
		ck_assert_uint_lt(staged[i], k->n);
		byp_k[staged[i]] = stage_row(k, i, 0, 0);
		byp_v[staged[i]] = stage_row(k, i, 0, 1);
	}
	for (uint32_t s = 0; s < SLOTS; s++)
		if (k->slot_pos[s] >= 0) {
			ck_assert_ptr_null(byp_k[k->slot_pos[s]]); /* never both */
			byp_k[k->slot_pos[s]] = t0_row(k, s, 0, 0);
			byp_v[k->slot_pos[s]] = t0_row(k, s, 0, 1);
			a++;
		}
	for (uint32_t p = 0; p < k->n; p++)
		if (byp_k[p]) {
			pos[m] = p;
			K[m] = byp_k[p];
			V[m] = byp_v[p];
			m++;
		}
	ck_assert_uint_eq(m, a + (uint32_t)r);
	return m;
}

/* With nothing evicted, the last FETCH's list (as the daemon wrote it, not re-sorted) is every
 * position not in a T0 slot, ascending. */
static void
staged_is_rest_of_t0(const struct client *k)
{
	uint8_t in_t0[STEPS] = {0};
	uint32_t e = 0;

	for (uint32_t s = 0; s < SLOTS; s++)
		if (k->slot_pos[s] >= 0)
			in_t0[k->slot_pos[s]] = 1;
	for (uint32_t p = 0; p < k->n; p++)
		if (!in_t0[p]) {
			ck_assert_uint_lt(e, n_staged);
			ck_assert_msg(staged[e] == p, "FETCH list entry %u is %u, expected %u", e,
				      staged[e], p);
			e++;
		}
	ck_assert_uint_eq(e, n_staged);
}

START_TEST(t_prop1_bit_exact)
{
	static const float fracs[] = {0.1f, 0.3f, 0.5f, 0.7f, 1.0f};
	float hbm = fracs[_i];
	struct client k;
	struct kvt_seq_stat st;

	client_open(&k, hbm, 0.0f, 0.0f, 1000 + _i);
	for (int t = 0; t < STEPS - 100; t++) {
		step(&k);
		if (t % 97 == 96) {
			static uint32_t pos[STEPS], fpos[STEPS];
			static const float *K[STEPS], *V[STEPS], *FK[STEPS], *FV[STEPS];
			float q[D], a[D], b[D];
			uint32_t m = gather_view(&k, KVT_FETCH_F_T1, pos, K, V);

			ck_assert_uint_eq(m, k.n); /* nothing evicted: every position is there */
			staged_is_rest_of_t0(&k);
			for (uint32_t i = 0; i < k.n; i++) {
				fpos[i] = i;
				FK[i] = k.ref + (size_t)i * TOK;
				FV[i] = k.ref + (size_t)i * TOK + ROW;
				ck_assert(!memcmp(K[i], FK[i], ROW * 4));
				ck_assert(!memcmp(V[i], FV[i], ROW * 4));
			}
			for (int j = 0; j < D; j++)
				q[j] = frand(&k.rng);
			attend(m, pos, K, V, q, a);
			attend(k.n, fpos, FK, FV, q, b);
			ck_assert(!memcmp(a, b, sizeof(a)));
		}
	}
	ck_assert_int_eq(kvt_seq_stat(k.c, k.seq, &st), 0);
	/* T0 follows hbm_frac (capped at t0_slots - delta), the rest is T1, none evicted. */
	ck_assert_uint_eq(st.tier_count[3], 0);
	ck_assert_uint_eq(st.tier_count[2], 0);
	ck_assert_uint_le(st.tier_count[0], SLOTS);
	ck_assert_uint_eq(st.tier_count[0] + st.tier_count[1], st.n_tokens);
	client_close(&k);
}
END_TEST

START_TEST(t_evict_and_int8)
{
	struct client k;
	struct kvt_seq_stat st;
	static uint32_t pos[STEPS];
	static const float *K[STEPS], *V[STEPS];
	double err = 0, norm = 0;
	uint32_t m;

	client_open(&k, 0.3f, 0.1f, 0.2f, 77);
	for (int t = 0; t < STEPS - 100; t++)
		step(&k);
	apply_retier(&k);
	ck_assert_int_eq(kvt_seq_stat(k.c, k.seq, &st), 0);
	ck_assert_uint_eq(st.tier_count[3], (uint64_t)floorf(0.1f * k.n));
	ck_assert_uint_gt(st.tier_count[2], 0);
	m = gather_view(&k, KVT_FETCH_F_T1 | KVT_FETCH_F_T2, pos, K, V);
	ck_assert_uint_eq(m, k.n - st.tier_count[3]);
	/* T2 rows come back dequantized: close, not exact. */
	for (uint32_t i = 0; i < m; i++)
		for (int j = 0; j < ROW; j++) {
			float want = k.ref[(size_t)pos[i] * TOK + j];

			err += (K[i][j] - want) * (K[i][j] - want);
			norm += want * want;
		}
	fprintf(stderr, "t2 relative L2 error over kept keys: %.3g\n", sqrt(err / norm));
	ck_assert(sqrt(err / norm) < 1e-2);
	ck_assert(sqrt(err / norm) > 0); /* the int8 rows are really int8 */
	client_close(&k);
}
END_TEST

/* Relative L2 error of the keys FETCH stages from T2 (dequantized), both layers. */
static double
t2_key_error(struct client *k, uint32_t *ret_rows)
{
	static uint32_t staged[STEPS];
	int r = kvt_fetch(k->c, k->seq, KVT_FETCH_F_T2, 0, L, 0, staged, STEPS);
	double err = 0, norm = 0;

	ck_assert_msg(r > 0, "FETCH T2: %s", kvt_strerror(r));
	for (int i = 0; i < r; i++)
		for (uint32_t l = 0; l < L; l++) {
			const float *got = stage_row(k, i, l, 0);
			const float *want = k->ref + (size_t)staged[i] * TOK + l * 2 * ROW;

			for (int j = 0; j < ROW; j++) {
				err += (double)(got[j] - want[j]) * (got[j] - want[j]);
				norm += (double)want[j] * want[j];
			}
		}
	*ret_rows = (uint32_t)r;
	return sqrt(err / norm);
}

/*
 * KVT_T2_F_KEY_CHANNEL on keys with an outlier channel: per-head scales spread the outlier's
 * range over every channel of the head, per-channel scales do not. Same data, same budgets, two
 * sequences side by side; key-scale blocks are charged to the pool and given back.
 */
START_TEST(t_t2_key_channel)
{
	struct client kh, kc;
	struct kvt_seq_params bad = {
	    .size = sizeof(bad), .layers = 1, .kv_heads = 1, .head_dim = 8, .delta = 1};
	struct kvt_seq_stat sh, sc;
	int64_t used0 = pool_used(Dm.sock);
	uint32_t nh, nc, id;
	double eh, ec;

	client_open_t2(&kh, 0.3f, 0.1f, 0.3f, 0, 30.0f, 99);
	client_open_t2(&kc, 0.3f, 0.1f, 0.3f, KVT_T2_F_KEY_CHANNEL, 30.0f, 99);
	for (int t = 0; t < STEPS - 100; t++) {
		step(&kh);
		step(&kc);
	}
	apply_retier(&kh);
	apply_retier(&kc);
	ck_assert_int_eq(kvt_seq_stat(kh.c, kh.seq, &sh), 0);
	ck_assert_int_eq(kvt_seq_stat(kc.c, kc.seq, &sc), 0);
	ck_assert(!memcmp(sh.tier_count, sc.tier_count, sizeof(sh.tier_count)));
	ck_assert_uint_gt(sc.tier_count[2], KVT_T2_KEY_BLOCK);
	/* the channel sequence's T2 slots are smaller, plus its blocks of key scales */
	ck_assert_uint_ne(sc.pool_bytes, sh.pool_bytes);
	eh = t2_key_error(&kh, &nh);
	ec = t2_key_error(&kc, &nc);
	ck_assert_uint_eq(nh, nc);
	fprintf(stderr,
		"t2 key relative L2 error, outlier channel x30: per head %.3g, "
		"per channel %.3g (%u rows)\n",
		eh, ec, nh);
	ck_assert(ec > 0);
	ck_assert(ec < 0.5 * eh);
	client_close(&kh);
	client_close(&kc);
	ck_assert_int_eq(pool_used(Dm.sock), used0); /* blocks freed with their last slot */
	/* unknown T2 flags and the reserved word next to them are refused */
	bad.t2_flags = 2;
	ck_assert_int_eq(kvt_connect(Dm.sock, NULL, &kh.c), 0);
	ck_assert_int_eq(kvt_seq_open(kh.c, &bad, &id), -EINVAL);
	bad.t2_flags = KVT_T2_F_KEY_CHANNEL;
	bad.reserved0 = 1;
	ck_assert_int_eq(kvt_seq_open(kh.c, &bad, &id), -EINVAL);
	bad.reserved0 = 0;
	ck_assert_int_eq(kvt_seq_open(kh.c, &bad, &id), 0);
	ck_assert_int_eq(kvt_seq_close(kh.c, id), 0);
	kvt_disconnect(kh.c);
}
END_TEST

START_TEST(t_bad_input)
{
	struct client k;
	uint8_t small[64];
	uint32_t list[4] = {0, 1, 2, 9999}, out[8];
	struct kvt_seq_stat before, after;

	client_open(&k, 0.5f, 0.0f, 0.0f, 5);
	for (int t = 0; t < 40; t++)
		step(&k);
	ck_assert_int_eq(kvt_seq_stat(k.c, k.seq, &before), 0);
	/* RETIER whose output does not fit: -ENOSPC, nothing changed */
	ck_assert_int_eq(kvt_retier(k.c, k.seq, small, sizeof(small)), -ENOSPC);
	/* FETCH into a region too small (start row near the end) */
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, KVT_FETCH_F_T1, 0, L, STEPS - 2, out, 8),
			 before.tier_count[1] > 2 ? -ENOSPC : (int)before.tier_count[1]);
	/* positions beyond n, layers out of range, mixed flags */
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, KVT_FETCH_F_LIST, 0, 1, 0, list, 4), -EINVAL);
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, KVT_FETCH_F_LIST, 0, L + 1, 0, list, 3), -EINVAL);
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, KVT_FETCH_F_LIST | KVT_FETCH_F_T1, 0, 1, 0, list, 3),
			 -EINVAL);
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, 0, 0, 1, 0, list, 3), -EINVAL);
	/* an explicit list works and stages in the order given */
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, KVT_FETCH_F_LIST, 1, 1, 0, list, 3), 3);
	ck_assert(!memcmp(stage_row(&k, 2, 1, 1), k.ref + 2 * TOK + 3 * ROW, ROW * 4));
	ck_assert_int_eq(kvt_seq_stat(k.c, k.seq, &after), 0);
	ck_assert(!memcmp(before.tier_count, after.tier_count, sizeof(before.tier_count)));
	/* RETIER and FETCH on a closed sequence */
	ck_assert_int_eq(kvt_seq_close(k.c, k.seq), 0);
	ck_assert_int_eq(kvt_retier(k.c, k.seq, out, sizeof(out)), -ENOENT);
	ck_assert_int_eq(kvt_fetch(k.c, k.seq, KVT_FETCH_F_T1, 0, 1, 0, out, 8), -ENOENT);
	kvt_disconnect(k.c);
	free(k.ref);
}
END_TEST

static void
up(void)
{
	daemon_start(&Dm, NULL);
}

static void
down(void)
{
	ck_assert_int_eq(daemon_stop(&Dm), 0);
}

int
main(void)
{
	Suite *s = suite_create("tier");
	TCase *tc = tcase_create("tier");

	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, t_prop1_bit_exact, 0, 5);
	tcase_add_test(tc, t_evict_and_int8);
	tcase_add_test(tc, t_t2_key_channel);
	tcase_add_test(tc, t_bad_input);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
