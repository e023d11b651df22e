/* SPDX-License-Identifier: MIT */
/*
 * libkvtier's tiering driver (kvt_driver_*) against a real kvtierd:
 *  - the cadence: no RETIER before the prompt is in, one when it is, then one every Δ tokens
 *    and no other; step_begin() says 1 exactly at those passes;
 *  - the view: at every pass its positions are increasing, every live position once (evict 0:
 *    all of them), and every entry's rows, read where its location says (T0 slot or staging
 *    row), every layer, K and V, are the rows written for that position;
 *  - T0 slots: a pass gets distinct slots no view entry holds; before the first RETIER the
 *    prompt takes 0..q-1; kvt_driver_t0_slots() sizes the region as documented;
 *  - the queued ops reach the daemon: its token count stays behind until a RETIER or a flush
 *    submits the queue (one submit per Δ), and the scores it summed are the weights given;
 *  - errors: bad arguments and passes out of order are refused with a reason and lose
 *    nothing; past max_tokens -ENOSPC; a queued op the daemon refuses fails the flush with
 *    its reason, and every later call with the same error;
 *  - a sequence opened from shared prefix blocks starts with their rows staged as its view.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvtier.h"
#include "kvt_test.h"

enum { L = 2, H = 2, D = 8, MAXT = 96, DELTA = 8, WINDOW = 8, SINKS = 2, PROMPT = 10 };
#define ROW (H * D) /* floats per (token, layer, K|V) */

static struct kvtd_proc Dm;

struct fx {
	struct kvt_client *c;
	struct kvt_buf *t0, *stage;
	struct kvt_seq_params p;
	struct kvt_driver *d;
};

/* The value written at element @i of position @pos's (layer, K|V) row. */
static float
val(uint32_t pos, uint32_t l, uint32_t kv, uint32_t i)
{
	return (float)(pos * 1000 + l * 100 + kv * 50 + i);
}

static void
params(struct fx *f, float hbm, uint32_t prompt)
{
	struct kvt_seq_params *p = &f->p;
	int ts;

	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
	p->layers = L;
	p->kv_heads = H;
	p->head_dim = D;
	p->dtype = KVT_DTYPE_F32;
	p->policy = KVT_POLICY_TIERED;
	p->score_mode = KVT_SCORE_SUM;
	p->protect_prompt = 1;
	p->delta = DELTA;
	p->sinks = SINKS;
	p->window = WINDOW;
	p->prompt_len = prompt;
	p->hbm_frac = hbm;
	p->max_tokens = MAXT;
	ts = kvt_driver_t0_slots(p);
	ck_assert_int_gt(ts, 0);
	p->t0_slots = (uint32_t)ts;
	p->stage_slots = MAXT;
	p->t0_slot_stride = p->stage_slot_stride = ROW * 4;
	p->t0_kv_stride = (uint64_t)p->t0_slots * ROW * 4;
	p->t0_layer_stride = 2 * p->t0_kv_stride;
	p->stage_kv_stride = (uint64_t)MAXT * ROW * 4;
	p->stage_layer_stride = 2 * p->stage_kv_stride;
}

static void
fx_connect(struct fx *f, float hbm, uint32_t prompt)
{
	struct kvt_opts o = {.size = sizeof(o), .spin_us = 10};

	memset(f, 0, sizeof(*f));
	params(f, hbm, prompt);
	ck_assert_int_eq(kvt_connect(Dm.sock, &o, &f->c), 0);
	ck_assert_int_eq(kvt_buf_alloc(f->c, (uint64_t)L * 2 * f->p.t0_slots * ROW * 4, &f->t0), 0);
	ck_assert_int_eq(kvt_buf_alloc(f->c, (uint64_t)L * 2 * MAXT * ROW * 4, &f->stage), 0);
	f->p.t0_buf_id = kvt_buf_id(f->t0);
	f->p.stage_buf_id = kvt_buf_id(f->stage);
}

static void
fx_open(struct fx *f, float hbm)
{
	fx_connect(f, hbm, PROMPT);
	ck_assert_msg(kvt_driver_open(f->c, &f->p, NULL, &f->d) == 0, "%s", kvt_last_error());
}

static void
fx_close(struct fx *f)
{
	ck_assert_int_eq(kvt_driver_close(f->d), 0);
	kvt_disconnect(f->c);
}

static const float *
row_at(const struct fx *f, uint32_t loc, uint32_t l, uint32_t kv)
{
	if (loc < f->p.t0_slots)
		return (const float *)kvt_buf_ptr(f->t0) +
		       ((size_t)(l * 2 + kv) * f->p.t0_slots + loc) * ROW;
	return (const float *)kvt_buf_ptr(f->stage) +
	       ((size_t)(l * 2 + kv) * MAXT + (loc - f->p.t0_slots)) * ROW;
}

/* Writes the rows of positions n..n+q-1 into @slots, every layer, K and V. */
static void
write_rows(struct fx *f, uint32_t n, uint32_t q, const uint32_t *slots)
{
	for (uint32_t t = 0; t < q; t++)
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				float *r = (float *)row_at(f, slots[t], l, kv);

				for (uint32_t i = 0; i < ROW; i++)
					r[i] = val(n + t, l, kv, i);
			}
}

/* The view's entries: positions increasing, rows where their location says. Returns its size. */
static uint32_t
check_view(const struct fx *f)
{
	const uint32_t *pos, *loc;
	uint32_t m = kvt_driver_view(f->d, &pos, &loc);

	for (uint32_t e = 0; e < m; e++) {
		ck_assert_msg(e == 0 || pos[e] > pos[e - 1], "view entry %u: position %u after %u",
			      e, pos[e], e ? pos[e - 1] : 0);
		ck_assert_uint_lt(loc[e], f->p.t0_slots + MAXT);
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const float *r = row_at(f, loc[e], l, kv);

				for (uint32_t i = 0; i < ROW; i++)
					ck_assert_msg(
					    r[i] == val(pos[e], l, kv, i),
					    "position %u (loc %u) layer %u kv %u [%u]: %g", pos[e],
					    loc[e], l, kv, i, (double)r[i]);
			}
	}
	return m;
}

/* The daemon's token count of @seq (kvtierctl seqs), which sees only what was submitted. */
static int64_t
daemon_tokens(uint32_t seq)
{
	struct json_object *j = admin_request(Dm.sock, KVT_CTL_SEQS), *a;
	int64_t n = -1;

	ck_assert(j && json_object_object_get_ex(j, "seqs", &a));
	for (size_t i = 0; i < json_object_array_length(a); i++) {
		struct json_object *e = json_object_array_get_idx(a, i);

		if (json_get_i64(e, "seq") == seq)
			n = json_get_i64(e, "tokens");
	}
	json_object_put(j);
	return n;
}

/* One pass of @q tokens with uniform weights (summing to 1 per query). Returns step_begin's. */
static int
pass(struct fx *f, uint32_t q, double *wsum)
{
	struct kvt_driver_stats st = {.size = sizeof(st)};
	const uint32_t *slots, *pos, *loc;
	static float w[MAXT];
	uint32_t m, n;
	int r;

	ck_assert_int_eq(kvt_driver_stats(f->d, &st), 0);
	n = st.n;
	r = kvt_driver_step_begin(f->d, q, &slots);
	ck_assert_msg(r >= 0, "step_begin at n=%u: %s", n, kvt_last_error());
	m = kvt_driver_view(f->d, &pos, &loc);
	ck_assert_uint_ge(m, q);
	for (uint32_t i = 0; i < q; i++) {
		/* the pass's slots: distinct, and no other entry's */
		ck_assert_uint_eq(pos[m - q + i], n + i);
		ck_assert_uint_eq(loc[m - q + i], slots[i]);
		ck_assert_uint_lt(slots[i], f->p.t0_slots);
		for (uint32_t e = 0; e < m; e++)
			ck_assert(e == m - q + i || loc[e] != slots[i]);
	}
	write_rows(f, n, q, slots);
	check_view(f);
	for (uint32_t e = 0; e < m; e++)
		w[e] = (float)q / (float)m;
	*wsum += (double)q;
	ck_assert_msg(kvt_driver_step_end(f->d, w, m) == 0, "%s", kvt_last_error());
	return r;
}

START_TEST(t_cadence_and_view)
{
	struct kvt_driver_stats st = {.size = sizeof(st)};
	struct kvt_seq_stat ss;
	const uint32_t *slots;
	uint32_t retiers = 0, seq;
	double wsum = 0;
	struct fx f;

	fx_open(&f, 0.25f);
	seq = kvt_driver_seq(f.d);
	ck_assert_uint_ne(seq, 0);
	/* the prompt in one pass: every slot is free before the first RETIER, taken in order */
	ck_assert_int_eq(kvt_driver_step_begin(f.d, PROMPT, &slots), 0);
	for (uint32_t i = 0; i < PROMPT; i++)
		ck_assert_uint_eq(slots[i], i);
	write_rows(&f, 0, PROMPT, slots);
	ck_assert_int_eq(kvt_driver_step_end(f.d, NULL, 0), 0);
	ck_assert_int_eq(daemon_tokens(seq), 0); /* queued, not submitted */

	for (uint32_t n = PROMPT; n < MAXT; n++) {
		/* RETIER when the prompt is in, then when the Δ slots it handed out are used */
		int due = n == PROMPT || (n - PROMPT) % DELTA == 0;
		int r = pass(&f, 1, &wsum);

		ck_assert_msg(r == due, "n=%u: step_begin %d, RETIER due %d", n, r, due);
		retiers += (uint32_t)due;
		if (due)
			ck_assert_int_eq(daemon_tokens(seq), n); /* RETIER submitted the queue */
		else
			ck_assert_int_lt(daemon_tokens(seq), n + 1);
		ck_assert_int_eq(kvt_driver_stats(f.d, &st), 0);
		ck_assert_uint_eq(st.retiers, retiers);
		ck_assert_uint_eq(st.submits, retiers);
		ck_assert_uint_eq(st.last_retier_n, n - (n - PROMPT) % DELTA);
		/* evict 0: the view after the pass is every position */
		ck_assert_uint_eq(st.view, n + 1);
	}
	/* rows really came from the staging region (hbm 0.25 of 96 tokens) */
	ck_assert_uint_gt(st.fetches, 0);
	ck_assert_uint_gt(st.rows_staged, 0);
	ck_assert_uint_eq(st.tier_count[3], 0);
	ck_assert_uint_eq(st.steps, 1 + MAXT - PROMPT);
	ck_assert_uint_eq(st.score_adds, MAXT - PROMPT);

	ck_assert_int_eq(kvt_driver_flush(f.d), 0);
	ck_assert_int_eq(daemon_tokens(seq), MAXT);
	ck_assert_int_eq(kvt_seq_stat(f.c, seq, &ss), 0);
	ck_assert_uint_eq(ss.n_tokens, MAXT);
	ck_assert_uint_gt(ss.tier_count[1], 0);
	ck_assert_msg(fabs(ss.score_total - wsum) < 1e-3, "score total %g, weights given %g",
		      ss.score_total, wsum);
	fx_close(&f);
}
END_TEST

START_TEST(t_t0_slots)
{
	struct fx f;
	struct kvt_seq_params *p = &f.p;

	params(&f, 0.25f, PROMPT);
	/* ceil(0.25 * 96) = 24 >= prompt 10 + window 8, + Δ */
	ck_assert_int_eq(kvt_driver_t0_slots(p), 24 + DELTA);
	p->hbm_frac = 0.1f; /* 10 < the protected set 18 */
	ck_assert_int_eq(kvt_driver_t0_slots(p), PROMPT + WINDOW + DELTA);
	p->protect_prompt = 0; /* sinks + window = 10; still >= the prompt */
	ck_assert_int_eq(kvt_driver_t0_slots(p), SINKS + WINDOW + DELTA);
	p->window = 0;
	p->sinks = 0;
	p->delta = 1;
	p->hbm_frac = 0.0f; /* the prompt lands in T0 in one pass */
	ck_assert_int_eq(kvt_driver_t0_slots(p), PROMPT);
	params(&f, 0.25f, PROMPT);
	p->policy = KVT_POLICY_FULL;
	ck_assert_int_eq(kvt_driver_t0_slots(p), MAXT + DELTA);
	p->policy = KVT_POLICY_STREAMING;
	ck_assert_int_eq(kvt_driver_t0_slots(p), PROMPT + WINDOW + DELTA);
	p->policy = KVT_POLICY__COUNT;
	ck_assert_int_eq(kvt_driver_t0_slots(p), -EINVAL);
	params(&f, 0.25f, PROMPT);
	p->delta = 0;
	ck_assert_int_eq(kvt_driver_t0_slots(p), -EINVAL);
	params(&f, 0.25f, PROMPT);
	p->prompt_len = MAXT + 1;
	ck_assert_int_eq(kvt_driver_t0_slots(p), -EINVAL);
	ck_assert_int_eq(kvt_driver_t0_slots(NULL), -EINVAL);
}
END_TEST

START_TEST(t_bad_calls)
{
	struct kvt_driver_opts o = {.size = sizeof(o)};
	struct kvt_driver *d = NULL;
	const uint32_t *slots;
	float w[MAXT];
	double wsum = 0;
	uint32_t m;
	struct fx f;

	fx_connect(&f, 0.25f, PROMPT);
	ck_assert_int_eq(kvt_driver_open(NULL, &f.p, NULL, &d), -EINVAL);
	o.reserved[1] = 1;
	ck_assert_int_eq(kvt_driver_open(f.c, &f.p, &o, &d), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "reserved"));
	o.reserved[1] = 0;
	o.prefix_blocks = 1; /* without a namespace */
	ck_assert_int_eq(kvt_driver_open(f.c, &f.p, &o, &d), -EINVAL);
	f.p.stage_buf_id = 0;
	ck_assert_int_eq(kvt_driver_open(f.c, &f.p, NULL, &d), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "staging region"));
	f.p.stage_buf_id = kvt_buf_id(f.stage);
	f.p.t0_slots = DELTA;
	ck_assert_int_eq(kvt_driver_open(f.c, &f.p, NULL, &d), -EINVAL);
	ck_assert_ptr_null(d);
	params(&f, 0.25f, PROMPT);
	f.p.t0_buf_id = kvt_buf_id(f.t0);
	f.p.stage_buf_id = kvt_buf_id(f.stage);
	f.p.window = f.p.t0_slots; /* the daemon refuses: its reason comes back */
	ck_assert_int_eq(kvt_driver_open(f.c, &f.p, NULL, &d), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "window"));
	f.p.window = WINDOW;
	ck_assert_int_eq(kvt_driver_open(f.c, &f.p, NULL, &f.d), 0);

	/* out of order: refused, nothing lost */
	ck_assert_int_eq(kvt_driver_step_end(f.d, NULL, 0), -EINVAL);
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 0, &slots), -EINVAL);
	ck_assert_int_eq(kvt_driver_step_begin(f.d, MAXT + 1, &slots), -ENOSPC);
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 2, &slots), 0);
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 1, &slots), -EBUSY);
	ck_assert_int_eq(kvt_driver_flush(f.d), -EBUSY);
	m = kvt_driver_view(f.d, NULL, NULL);
	ck_assert_uint_eq(m, 2);
	write_rows(&f, 0, 2, slots);
	w[0] = 0.5f;
	w[1] = -0.25f;
	ck_assert_int_eq(kvt_driver_step_end(f.d, w, m), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "weight 1"));
	w[1] = NAN;
	ck_assert_int_eq(kvt_driver_step_end(f.d, w, m), -EINVAL);
	w[1] = 0.5f;
	ck_assert_int_eq(kvt_driver_step_end(f.d, w, m - 1), -EINVAL);
	w[1] = -0.0f; /* taken as 0 */
	ck_assert_int_eq(kvt_driver_step_end(f.d, w, m), 0);
	while (kvt_driver_view(f.d, NULL, NULL) < MAXT)
		pass(&f, 1, &wsum);
	/* past max_tokens: refused, the driver goes on */
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 1, &slots), -ENOSPC);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "max_tokens"));
	ck_assert_int_eq(kvt_driver_flush(f.d), 0);
	ck_assert_int_eq(daemon_tokens(kvt_driver_seq(f.d)), MAXT);
	fx_close(&f);
}
END_TEST

START_TEST(t_refused_op_sticks)
{
	const uint32_t *slots;
	double wsum = 0;
	struct fx f;

	fx_open(&f, 0.25f);
	pass(&f, PROMPT, &wsum);
	ck_assert_int_eq(kvt_driver_flush(f.d), 0);
	/* the sequence goes behind the driver's back: its next queued APPEND is refused */
	ck_assert_int_eq(kvt_seq_close(f.c, kvt_driver_seq(f.d)), 0);
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 1, &slots), -ENOENT); /* RETIER */
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "RETIER"));
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 1, &slots), -ENOENT);
	ck_assert_int_eq(kvt_driver_flush(f.d), -ENOENT);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "RETIER"));
	ck_assert_int_eq(kvt_driver_close(f.d), -ENOENT);
	kvt_disconnect(f.c);

	/* a queued op refused: the flush says which, at which n, and why */
	fx_open(&f, 0.25f);
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 3, &slots), 0);
	write_rows(&f, 0, 3, slots);
	ck_assert_int_eq(kvt_seq_close(f.c, kvt_driver_seq(f.d)), 0);
	ck_assert_int_eq(kvt_driver_step_end(f.d, NULL, 0), 0); /* queued */
	ck_assert_int_eq(kvt_driver_flush(f.d), -ENOENT);
	ck_assert_msg(strstr(kvt_last_error(), "queued APPEND") && strstr(kvt_last_error(), "n=3"),
		      "%s", kvt_last_error());
	ck_assert_int_eq(kvt_driver_step_begin(f.d, 1, &slots), -ENOENT);
	ck_assert_ptr_nonnull(strstr(kvt_last_error(), "queued APPEND"));
	ck_assert_int_eq(kvt_driver_close(f.d), -ENOENT);
	kvt_disconnect(f.c);
}
END_TEST

START_TEST(t_prefix_staged)
{
	struct kvt_ns_params np = {.size = sizeof(np)};
	struct kvt_driver_opts o = {.size = sizeof(o)};
	struct kvt_driver_stats st = {.size = sizeof(st)};
	struct kvt_block_key keys[4];
	uint32_t tok[48], ns, loc0;
	const uint32_t *pos, *loc;
	double wsum = 0;
	struct fx a, b;
	int nk, m;

	for (uint32_t i = 0; i < 48; i++)
		tok[i] = 7 * i + 1;
	np.layers = L;
	np.kv_heads = H;
	np.head_dim = D;
	np.dtype = KVT_DTYPE_F32;
	np.block_tokens = 16;
	snprintf(np.name, sizeof(np.name), "check_driver");
	nk = kvt_block_keys(&np, NULL, tok, 48, keys, 4);
	ck_assert_int_eq(nk, 3);

	/* a: prefills the 48 tokens and publishes their 3 blocks */
	fx_connect(&a, 0.25f, 48);
	ck_assert_int_eq(kvt_ns_open(a.c, &np, &ns), 0);
	o.ns = ns;
	ck_assert_msg(kvt_driver_open(a.c, &a.p, &o, &a.d) == 0, "%s", kvt_last_error());
	pass(&a, 48, &wsum);
	ck_assert_int_eq(kvt_driver_flush(a.d), 0);
	ck_assert_int_eq(kvt_publish(a.c, kvt_driver_seq(a.d), keys, 3, NULL), 3);

	/* b: opens from 2 of them (one prompt token is always left to compute) */
	fx_connect(&b, 0.25f, 48);
	ck_assert_int_eq(kvt_ns_open(b.c, &np, &ns), 0);
	m = kvt_lookup(b.c, ns, keys, 2, KVT_LOOKUP_F_PIN);
	ck_assert_int_eq(m, 2);
	o.ns = ns;
	o.prefix_blocks = 2;
	ck_assert_msg(kvt_driver_open(b.c, &b.p, &o, &b.d) == 0, "%s", kvt_last_error());
	ck_assert_int_eq(kvt_driver_stats(b.d, &st), 0);
	ck_assert_uint_eq(st.n, 32);
	ck_assert_uint_eq(st.prefix_tokens, 32);
	ck_assert_uint_eq(st.fetches, 1);
	ck_assert_uint_eq(kvt_driver_view(b.d, &pos, &loc), 32);
	/* staged, in staging rows 0.., with a's rows */
	loc0 = b.p.t0_slots;
	for (uint32_t e = 0; e < 32; e++) {
		ck_assert_uint_eq(pos[e], e);
		ck_assert_uint_eq(loc[e], loc0 + e);
	}
	ck_assert_uint_eq(check_view(&b), 32);
	/* and it goes on from there: the rest of the prompt, then the RETIER at its end */
	ck_assert_int_eq(pass(&b, 16, &wsum), 0);
	ck_assert_int_eq(pass(&b, 1, &wsum), 1);
	ck_assert_int_eq(kvt_driver_stats(b.d, &st), 0);
	ck_assert_uint_eq(st.retiers, 1);
	ck_assert_uint_eq(st.view, 49);
	fx_close(&b);
	fx_close(&a);
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

KVT_CHECK_MAIN("driver", 120, up, down, t_cadence_and_view, t_t0_slots, t_bad_calls,
	       t_refused_op_sticks, t_prefix_staged)
