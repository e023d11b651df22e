/* SPDX-License-Identifier: MIT */
/*
 * Re-tiering. A plan is computed in a few linear passes: one builds the candidate keys, two
 * radix selects find the eviction and T0 boundaries, one pass in position order classifies
 * every position and emits the move lists (so every list comes out ascending), a third select
 * picks new int8 positions among the middle ones, and a scan of the slot map hands out slots.
 * Keeping every step a function of (scores, positions) alone makes the plan deterministic.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "select.h"
#include "tier.h"

#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

/* ---- parameters ------------------------------------------------------------------------- */

static int
frac_ok(float f)
{
	return f >= 0.0f && f <= 1.0f; /* false for NaN */
}

static int
fail(const char **ret_reason, const char *why)
{
	if (ret_reason)
		*ret_reason = why;
	return -EINVAL;
}

int
kvt_tier_validate(const struct kvt_seq_params *p, const char **ret_reason)
{
	uint64_t head, t0;

	if (!p)
		return fail(ret_reason, "no parameters");
	if (p->policy >= KVT_POLICY__COUNT)
		return fail(ret_reason, "unknown policy");
	if (p->score_mode >= KVT_SCORE__COUNT)
		return fail(ret_reason, "unknown score_mode");
	if (p->protect_prompt > 1)
		return fail(ret_reason, "protect_prompt must be 0 or 1");
	if (p->delta == 0)
		return fail(ret_reason, "delta must be at least 1");
	if (!frac_ok(p->hbm_frac))
		return fail(ret_reason, "hbm_frac must be in [0, 1]");
	if (!frac_ok(p->evict_frac))
		return fail(ret_reason, "evict_frac must be in [0, 1]");
	if (!frac_ok(p->t2_frac))
		return fail(ret_reason, "t2_frac must be in [0, 1]");
	/* The budgets are counts of the same n; a small slack absorbs f32 rounding (0.7f+0.3f). */
	if (p->policy == KVT_POLICY_TIERED &&
	    (double)p->hbm_frac + p->evict_frac + p->t2_frac > 1.0 + 1e-6)
		return fail(ret_reason, "hbm_frac + evict_frac + t2_frac exceeds 1");
	if (p->t0_buf_id && !p->t0_slots)
		return fail(ret_reason, "t0_slots is 0 but a T0 buffer is given");
	t0 = p->t0_buf_id ? p->t0_slots : 0;
	if (t0) {
		if (p->delta > t0)
			return fail(ret_reason, "delta larger than t0_slots");
		if (p->window > t0)
			return fail(ret_reason, "window larger than t0_slots");
		head = p->sinks;
		if (p->protect_prompt && p->prompt_len > head)
			head = p->prompt_len;
		/* The protected set always stays in T0, with delta slots kept free. */
		if (head + p->window + p->delta > t0)
			return fail(ret_reason,
				    "sinks/protected prompt + window + delta exceed t0_slots");
	}
	return 0;
}

int
kvt_tier_cfg_init(const struct kvt_seq_params *p, struct kvt_tier_cfg *ret_cfg,
		  const char **ret_reason)
{
	int r = kvt_tier_validate(p, ret_reason);

	if (r < 0)
		return r;
	if (!ret_cfg)
		return fail(ret_reason, "no output");
	*ret_cfg = (struct kvt_tier_cfg){
	    .policy = p->policy,
	    .score_mode = p->score_mode,
	    .protect_prompt = p->protect_prompt,
	    .delta = p->delta,
	    .sinks = p->sinks,
	    .window = p->window,
	    .prompt_len = p->prompt_len,
	    .t0_slots = p->t0_buf_id ? p->t0_slots : 0,
	    .hbm_frac = p->hbm_frac,
	    .evict_frac = p->evict_frac,
	    .t2_frac = p->t2_frac,
	};
	return 0;
}

/* ---- sequence state --------------------------------------------------------------------- */

/*
 * The FETCH list holds T1 positions at [0, n1) and T2 positions at [cap + 1 - n2, cap + 1), plus
 * one spare entry at each end of the gap: commit rebuilds both parts in one branch-free pass
 * that writes every position to both cursors and advances only the right one, so each cursor
 * writes one entry past its part (list[n1], which is below the T2 part since n1 + n2 <= cap,
 * and list[cap + 1]).
 */
#define LIST_SPARE 2

static inline uint32_t *
t2_list(const struct kvt_tier_seq *s)
{
	return s->list + s->cap + 1 - s->count[KVT_T2];
}

size_t
kvt_tier_seq_bytes(uint32_t cap, uint32_t t0_slots)
{
	size_t c = cap, t = t0_slots;

	if (cap > KVT_TIER_MAX_CAP || t0_slots > KVT_TIER_MAX_CAP)
		return 0;
	/* score, pos_slot, list (4 bytes each, list with LIST_SPARE more), slot_pos, tier bytes */
	return ALIGN8(4 * c) * 2 + ALIGN8(4 * (c + LIST_SPARE)) + ALIGN8(4 * t) + ALIGN8(c);
}

static void
seq_carve(struct kvt_tier_seq *s, void *mem, uint32_t cap, uint32_t t0_slots)
{
	char *p = mem;

	s->cap = cap;
	s->t0_slots = t0_slots;
	s->score = (float *)p;
	p += ALIGN8(4 * (size_t)cap);
	s->pos_slot = (int32_t *)p;
	p += ALIGN8(4 * (size_t)cap);
	s->list = (uint32_t *)p;
	p += ALIGN8(4 * ((size_t)cap + LIST_SPARE));
	s->slot_pos = (int32_t *)p;
	p += ALIGN8(4 * (size_t)t0_slots);
	s->tier = (uint8_t *)p;
}

static int
seq_args_ok(const void *mem, size_t mem_size, uint32_t cap, uint32_t t0_slots)
{
	size_t need = kvt_tier_seq_bytes(cap, t0_slots);

	return mem && !((uintptr_t)mem & 7) && cap >= 1 && need && mem_size >= need;
}

int
kvt_tier_seq_init(struct kvt_tier_seq *s, void *mem, size_t mem_size, uint32_t cap,
		  uint32_t t0_slots)
{
	if (!s || !seq_args_ok(mem, mem_size, cap, t0_slots))
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	seq_carve(s, mem, cap, t0_slots);
	memset(s->slot_pos, 0xff, 4 * (size_t)t0_slots);
	return 0;
}

int
kvt_tier_seq_move(struct kvt_tier_seq *dst, void *mem, size_t mem_size, uint32_t cap,
		  const struct kvt_tier_seq *src)
{
	struct kvt_tier_seq d;
	uint32_t n;

	if (!dst || !src || cap < src->n || !seq_args_ok(mem, mem_size, cap, src->t0_slots))
		return -EINVAL;
	n = src->n;
	d = *src;
	seq_carve(&d, mem, cap, src->t0_slots);
	memcpy(d.score, src->score, 4 * (size_t)n);
	memcpy(d.pos_slot, src->pos_slot, 4 * (size_t)n);
	memcpy(d.tier, src->tier, n);
	memcpy(d.slot_pos, src->slot_pos, 4 * (size_t)src->t0_slots);
	memcpy(d.list, src->list, 4 * (size_t)src->count[KVT_T1]);
	memcpy(t2_list(&d), t2_list(src), 4 * (size_t)src->count[KVT_T2]);
	d.gen++;
	*dst = d;
	return 0;
}

int
kvt_tier_seq_restore(struct kvt_tier_seq *s, void *mem, size_t mem_size, uint32_t cap,
		     uint32_t t0_slots, uint32_t n, uint32_t gen, const float *score,
		     const uint8_t *tier, const int32_t *pos_slot)
{
	struct kvt_tier_seq d;
	uint32_t n1 = 0, n2 = 0, *t2;

	if (!s || n > cap || (n && (!score || !tier || !pos_slot)) ||
	    kvt_tier_seq_init(&d, mem, mem_size, cap, t0_slots) < 0)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		unsigned t = tier[i];

		if (!isfinite(score[i]) || score[i] < 0.0f)
			return -EINVAL;
		if (t != KVT_T0 && t != KVT_T1 && t != KVT_T3 && t != (KVT_T0 | KVT_TIER_F_INT8) &&
		    t != (KVT_T2 | KVT_TIER_F_INT8))
			return -EINVAL;
		if ((t & KVT_TIER_MASK) == KVT_T0) {
			if (pos_slot[i] < 0 || (uint32_t)pos_slot[i] >= t0_slots ||
			    d.slot_pos[pos_slot[i]] >= 0)
				return -EINVAL;
			d.slot_pos[pos_slot[i]] = (int32_t)i;
		} else if (pos_slot[i] != -1) {
			return -EINVAL;
		}
		d.count[t & KVT_TIER_MASK]++;
		d.n_int8 += (t & KVT_TIER_F_INT8) != 0;
	}
	memcpy(d.score, score, 4 * (size_t)n);
	memcpy(d.tier, tier, n);
	memcpy(d.pos_slot, pos_slot, 4 * (size_t)n);
	/* The FETCH lists, ascending, as commit builds them (see LIST_SPARE). */
	t2 = d.list + cap + 1 - d.count[KVT_T2];
	for (uint32_t i = 0; i < n; i++) {
		unsigned t = tier[i] & KVT_TIER_MASK;

		if (t == KVT_T1)
			d.list[n1++] = i;
		else if (t == KVT_T2)
			t2[n2++] = i;
	}
	d.n = n;
	d.gen = gen;
	*s = d;
	return 0;
}

int
kvt_tier_append(struct kvt_tier_seq *s, uint32_t count, const uint32_t *slots)
{
	uint32_t i, n;

	if (!s || count == 0)
		return -EINVAL;
	n = s->n;
	if (count > s->cap - n)
		return -ENOSPC;
	if (slots) {
		for (i = 0; i < count; i++)
			if (slots[i] >= s->t0_slots)
				return -EINVAL;
		/* Claim the slots one by one so a repeated slot shows up as busy; undo on error. */
		for (i = 0; i < count; i++) {
			if (s->slot_pos[slots[i]] >= 0) {
				while (i--)
					s->slot_pos[slots[i]] = -1;
				return -EBUSY;
			}
			s->slot_pos[slots[i]] = (int32_t)(n + i);
		}
	}
	for (i = 0; i < count; i++) {
		s->score[n + i] = 0.0f;
		if (slots) {
			s->tier[n + i] = KVT_T0;
			s->pos_slot[n + i] = (int32_t)slots[i];
		} else {
			/* Positions only grow, so the T1 list stays ascending. */
			s->tier[n + i] = KVT_T1;
			s->pos_slot[n + i] = -1;
			s->list[s->count[KVT_T1]++] = n + i;
		}
	}
	if (slots)
		s->count[KVT_T0] += count;
	s->n = n + count;
	s->gen++;
	return (int)n;
}

int
kvt_tier_score_add(struct kvt_tier_seq *s, uint32_t first, uint32_t count, const float *val)
{
	uint32_t i;

	if (!s || first > s->n || count > s->n - first || (count && !val))
		return -EINVAL;
	for (i = 0; i < count; i++)
		if (!isfinite(val[i]))
			return -EINVAL;
	for (i = 0; i < count; i++)
		s->score[first + i] += val[i];
	return 0;
}

/* ---- planning --------------------------------------------------------------------------- */

struct ws_layout {
	uint32_t *cand_pos, *cand_key, *surv, *hist;
	uint32_t *quant, *evict;
	uint32_t *demote_slot, *demote_pos, *promote_pos, *promote_slot, *free_slot;
	uint8_t *mark;
	size_t size;
};

static void
ws_layout(struct ws_layout *l, char *base, uint32_t n, uint32_t t0_slots, uint32_t delta)
{
	size_t off = 0, c = ALIGN8(4 * (size_t)n), t = ALIGN8(4 * (size_t)t0_slots);

#define TAKE(field, bytes)                                                                         \
	do {                                                                                       \
		l->field = (void *)(base ? base + off : NULL);                                     \
		off += (bytes);                                                                    \
	} while (0)
	TAKE(hist, 4 * (size_t)KVT_SELECT_HIST);
	TAKE(cand_pos, c);
	TAKE(cand_key, c);
	TAKE(surv, c);
	TAKE(quant, c);
	TAKE(evict, c);
	TAKE(demote_slot, t);
	TAKE(demote_pos, t);
	TAKE(promote_pos, t);
	TAKE(promote_slot, t);
	TAKE(free_slot, ALIGN8(4 * (size_t)delta));
	TAKE(mark, ALIGN8(t0_slots));
#undef TAKE
	l->size = off;
}

size_t
kvt_tier_ws_bytes(uint32_t n, uint32_t t0_slots, uint32_t delta)
{
	struct ws_layout l;

	if (n > KVT_TIER_MAX_CAP || t0_slots > KVT_TIER_MAX_CAP)
		return 0;
	ws_layout(&l, NULL, n, t0_slots, delta);
	return l.size;
}

static inline uint32_t
min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

static inline uint32_t
sub_sat(uint32_t a, uint32_t b)
{
	return a > b ? a - b : 0;
}

/* floor/ceil of frac * n, computed in double from the f32 fraction (exact for n < 2^29). */
static uint32_t
budget_floor(float frac, uint32_t n)
{
	return (uint32_t)floor((double)frac * n);
}

static uint32_t
budget_ceil(float frac, uint32_t n)
{
	double b = ceil((double)frac * n);

	return b > n ? n : (uint32_t)b;
}

/*
 * A rank window over the candidates in position order: keys below @v are in, keys equal to @v
 * are in for tie indices [tie_lo, tie_hi) counted in position order.
 */
struct cut {
	uint32_t v;
	size_t tie_lo, tie_hi;
	int active;
};

/* Bottom @m of @keys[0..@nk): ranks [0, m). */
static void
cut_bottom(struct cut *c, const uint32_t *keys, size_t nk, size_t m, uint32_t *surv, uint32_t *hist)
{
	size_t less;

	*c = (struct cut){.active = m > 0};
	if (!c->active)
		return;
	c->v = kvt_select_kth(keys, nk, m - 1, surv, hist, &less);
	c->tie_lo = 0;
	c->tie_hi = m - less;
}

/* Top @m: ranks [nk - m, nk); ties of the boundary key from index (nk - m - less) upward. */
static void
cut_top(struct cut *c, const uint32_t *keys, size_t nk, size_t m, uint32_t *surv, uint32_t *hist)
{
	size_t less;

	*c = (struct cut){.active = m > 0};
	if (!c->active)
		return;
	c->v = kvt_select_kth(keys, nk, nk - m, surv, hist, &less);
	c->tie_lo = nk - m - less;
	c->tie_hi = SIZE_MAX;
}

/* Move lists being built by kvt_tier_plan(). */
struct moves {
	struct ws_layout *w;
	struct kvt_tier_plan *p;
	uint32_t cap0, n_p1, n_p2, q_evicted;
};

/* Position @pos goes from tier @cur to @tgt (different): record the moves it needs. */
static void
move_one(struct moves *m, const struct kvt_tier_seq *s, uint32_t pos, unsigned cur, unsigned tgt,
	 unsigned q)
{
	struct ws_layout *w = m->w;
	struct kvt_tier_plan *p = m->p;

	if (cur == KVT_T0) {
		w->demote_slot[p->n_demote] = (uint32_t)s->pos_slot[pos];
		w->demote_pos[p->n_demote] = pos;
		p->n_demote++;
	} else if (tgt == KVT_T0) {
		if (q)
			w->promote_pos[m->cap0 - 1 - m->n_p2++] = pos;
		else
			w->promote_pos[m->n_p1++] = pos;
	}
	if (tgt == KVT_T3) {
		w->evict[p->n_evict++] = pos;
		m->q_evicted += q;
	}
}

/* A protected position: T0, or in pool-only mode (@tgt T1, @tgt_q T2) it stays as it is. */
static inline void
protected_one(struct moves *m, const struct kvt_tier_seq *s, uint32_t pos, unsigned tgt,
	      unsigned tgt_q, uint32_t *cnt)
{
	unsigned tb = s->tier[pos], cur = tb & KVT_TIER_MASK, q = (tb >> 2) & 1;
	unsigned t = q ? tgt_q : tgt;

	if (cur == KVT_T3)
		return; /* counted with the evicted */
	if (t != cur)
		move_one(m, s, pos, cur, t, q);
	cnt[t]++;
}

/*
 * One plan in the making: the zones of the sequence, the budgets, and what the phases of
 * kvt_tier_plan() hand each other.
 */
struct planner {
	const struct kvt_tier_cfg *cfg;
	const struct kvt_tier_seq *s;
	struct ws_layout w;
	struct kvt_tier_plan p;
	struct moves mv;
	uint32_t n;
	uint32_t cap0;	 /* T0 slots positions may hold (delta kept free), 0 when pool-only */
	uint32_t pre;	 /* [0, pre): the protected head (sinks, the prompt if protected) */
	uint32_t wstart; /* [wstart, n): the protected window; candidates lie between */
	uint32_t ncand;	 /* live candidates, their keys in w.cand_key */
	uint32_t np_live;
	uint32_t t0c;	/* candidates promoted to or kept in T0 */
	uint32_t e_new; /* candidates newly evicted */
	uint32_t q_tgt; /* int8 positions wanted (tiered policy) */
	uint32_t nmid;	/* middle candidates without an int8 copy, in w.cand_pos/cand_key */
	uint32_t cnt[4];
};

/* The protected head and window around the candidates. */
static void
plan_zones(struct planner *pl)
{
	const struct kvt_tier_cfg *cfg = pl->cfg;
	uint32_t head, n = pl->n;

	pl->cap0 = cfg->t0_slots ? cfg->t0_slots - cfg->delta : 0;
	head = cfg->sinks;
	if (cfg->protect_prompt && cfg->prompt_len > head)
		head = cfg->prompt_len;
	pl->pre = min_u32(head, n);
	pl->wstart = n > cfg->window ? n - cfg->window : 0;
	if (pl->wstart < pl->pre)
		pl->wstart = pl->pre;
}

/* Candidates: [pre, wstart) minus evicted, their keys in position order; live protected ones. */
static void
plan_candidates(struct planner *pl)
{
	const struct kvt_tier_seq *s = pl->s;
	uint32_t i, ncand = 0, np_live = 0, n = pl->n;

	for (i = pl->pre; i < pl->wstart; i++) {
		float sc;

		if ((s->tier[i] & KVT_TIER_MASK) == KVT_T3)
			continue;
		sc = s->score[i];
		if (pl->cfg->score_mode == KVT_SCORE_MEAN)
			sc /= (float)(n - i);
		pl->w.cand_key[ncand] = kvt_score_key(sc);
		ncand++;
	}
	for (i = 0; i < pl->pre; i++)
		np_live += (s->tier[i] & KVT_TIER_MASK) != KVT_T3;
	for (i = pl->wstart; i < n; i++)
		np_live += (s->tier[i] & KVT_TIER_MASK) != KVT_T3;
	pl->ncand = ncand;
	pl->np_live = np_live;
}

/* How many candidates each policy keeps in T0, evicts, and how many int8 rows it wants. */
static int
plan_budgets(struct planner *pl)
{
	const struct kvt_tier_cfg *cfg = pl->cfg;
	uint32_t n = pl->n, cap0 = pl->cap0, ncand = pl->ncand, np_live = pl->np_live, t0_tot;

	/* kvt_tier_cfg_init() guarantees this; a hand-made cfg could overflow the slot lists. */
	if (cap0 && np_live > cap0)
		return -EINVAL;
	t0_tot = budget_ceil(cfg->hbm_frac, n);
	if (t0_tot < np_live)
		t0_tot = np_live;
	t0_tot = min_u32(t0_tot, cap0);
	pl->q_tgt = 0;
	switch (cfg->policy) {
	case KVT_POLICY_TIERED:
		pl->e_new =
		    min_u32(sub_sat(budget_floor(cfg->evict_frac, n), pl->s->count[KVT_T3]), ncand);
		pl->t0c = min_u32(sub_sat(t0_tot, np_live), ncand - pl->e_new);
		pl->q_tgt = budget_floor(cfg->t2_frac, n);
		break;
	case KVT_POLICY_H2O:
		pl->t0c = min_u32(sub_sat(t0_tot, np_live), ncand);
		pl->e_new = ncand - pl->t0c;
		break;
	case KVT_POLICY_STREAMING:
		pl->t0c = 0;
		pl->e_new = ncand;
		break;
	default: /* KVT_POLICY_FULL */
		pl->t0c = min_u32(sub_sat(cap0, np_live), ncand);
		pl->e_new = 0;
		break;
	}
	return 0;
}

/*
 * The candidates between the eviction cut @lo and the T0 cut @hi: each one's target tier, its
 * moves, and (when the int8 set may grow) the middle ones without an int8 copy compacted into
 * cand_pos/cand_key for the T2 selection (index mi < ci: the key written was already read).
 * Branch-free except for the rare positions that move (and evicted ones, ~evict_frac of them).
 */
static void
plan_classify_candidates(struct planner *pl, const struct cut *lo, const struct cut *hi)
{
	const struct kvt_tier_seq *s = pl->s;
	uint32_t *cand_pos = pl->w.cand_pos, *cand_key = pl->w.cand_key;
	/* Inactive cuts get bounds no key can meet. */
	const uint32_t lo_v = lo->active ? lo->v : 0, hi_v = hi->active ? hi->v : UINT32_MAX;
	const uint64_t lo_th = lo->active ? lo->tie_hi : 0,
		       hi_tl = hi->active ? hi->tie_lo : UINT64_MAX;
	static const uint8_t tgt_of[8] = {
	    [0] = KVT_T1, [1] = KVT_T3, [2] = KVT_T0, [3] = KVT_T0, /* no int8 copy */
	    [4] = KVT_T2, [5] = KVT_T3, [6] = KVT_T0, [7] = KVT_T0, /* int8 copy */
	};
	uint64_t t_lo = 0, t_hi = 0;
	uint32_t c_top = 0, c_q = 0, c_mid = 0, mi = 0, ci = 0, i;
	/* Middle candidates are only collected when the int8 set may grow. */
	const unsigned collect = pl->q_tgt > 0;

	for (i = pl->pre; i < pl->wstart; i++) {
		unsigned tb = s->tier[i], q = (tb >> 2) & 1;
		uint32_t k;
		unsigned eqlo, eqhi, ev, top, tgt;

		if ((tb & KVT_TIER_MASK) == KVT_T3)
			continue;
		k = cand_key[ci++];
		eqlo = k == lo_v;
		eqhi = k == hi_v;
		/* Both tie counters see every tied key, whichever cut takes it. */
		ev = (k < lo_v) | (eqlo & (t_lo < lo_th));
		top = (k > hi_v) | (eqhi & (t_hi >= hi_tl));
		tgt = tgt_of[ev | top << 1 | q << 2];
		t_lo += eqlo;
		t_hi += eqhi;
		c_top += top;
		c_q += q & !(ev | top);
		c_mid += tgt == KVT_T1;
		if (collect) {
			cand_pos[mi] = i;
			cand_key[mi] = k;
			mi += tgt == KVT_T1;
		}
		if (tgt != (tb & KVT_TIER_MASK))
			move_one(&pl->mv, s, i, tb & KVT_TIER_MASK, tgt, q);
	}
	pl->cnt[KVT_T0] += c_top;
	pl->cnt[KVT_T2] += c_q;
	pl->cnt[KVT_T1] += c_mid;
	pl->nmid = mi;
}

/*
 * One pass in position order: the protected prefix, the candidates, the window. Promotions
 * from T1 fill promote_pos from the front and those from T2 from the back (reversed by
 * plan_order_promotions()), so each part ends up ascending.
 */
static void
plan_classify(struct planner *pl)
{
	struct cut lo, hi;
	unsigned ptgt, ptgt_q;
	uint32_t i;

	cut_bottom(&lo, pl->w.cand_key, pl->ncand, pl->e_new, pl->w.surv, pl->w.hist);
	cut_top(&hi, pl->w.cand_key, pl->ncand, pl->t0c, pl->w.surv, pl->w.hist);
	pl->mv = (struct moves){.w = &pl->w, .p = &pl->p, .cap0 = pl->cap0};
	ptgt_q = pl->cap0 ? KVT_T0 : KVT_T2;
	ptgt = pl->cap0 ? KVT_T0 : KVT_T1;
	for (i = 0; i < pl->pre; i++)
		protected_one(&pl->mv, pl->s, i, ptgt, ptgt_q, pl->cnt);
	plan_classify_candidates(pl, &lo, &hi);
	for (i = pl->wstart; i < pl->n; i++)
		protected_one(&pl->mv, pl->s, i, ptgt, ptgt_q, pl->cnt);
	pl->cnt[KVT_T3] = pl->s->count[KVT_T3] + pl->p.n_evict;
}

/* New int8 rows: the lowest keys among the middle candidates, up to the T2 budget. */
static void
plan_quantize(struct planner *pl)
{
	struct ws_layout *w = &pl->w;
	struct kvt_tier_plan *p = &pl->p;
	struct cut qc;
	uint32_t i, t_q = 0, q_live, q_new;

	q_live = pl->s->n_int8 - pl->mv.q_evicted;
	q_new = min_u32(sub_sat(pl->q_tgt, q_live), pl->nmid);
	cut_bottom(&qc, w->cand_key, pl->nmid, q_new, w->surv, w->hist);
	for (i = 0; qc.active && i < pl->nmid; i++) {
		uint32_t k = w->cand_key[i];

		if (k < qc.v || (k == qc.v && t_q++ < qc.tie_hi))
			w->quant[p->n_quant++] = w->cand_pos[i];
	}
	pl->cnt[KVT_T1] -= p->n_quant;
	pl->cnt[KVT_T2] += p->n_quant;
}

/*
 * T2-sourced promotions were written backwards from cap0 - 1: reverse them in place, then move
 * them right after the T1 ones.
 */
static void
plan_order_promotions(struct planner *pl)
{
	uint32_t *pp = pl->w.promote_pos, cap0 = pl->cap0, n_p1 = pl->mv.n_p1, n_p2 = pl->mv.n_p2;

	for (uint32_t i = 0; i < n_p2 / 2; i++) {
		uint32_t *a = &pp[cap0 - n_p2 + i], *b = &pp[cap0 - 1 - i];
		uint32_t t = *a;

		*a = *b;
		*b = t;
	}
	if (n_p2)
		memmove(&pp[n_p1], &pp[cap0 - n_p2], 4 * (size_t)n_p2);
	pl->p.n_promote = n_p1 + n_p2;
	pl->p.n_promote_t1 = n_p1;
}

/* Slots: free now or freed by a demotion, lowest first, to promotions then appends. */
static void
plan_slots(struct planner *pl)
{
	const struct kvt_tier_cfg *cfg = pl->cfg;
	struct ws_layout *w = &pl->w;
	struct kvt_tier_plan *p = &pl->p;
	uint32_t i, slot, k = 0;

	if (!cfg->t0_slots)
		return;
	memset(w->mark, 0, cfg->t0_slots);
	for (i = 0; i < p->n_demote; i++)
		w->mark[w->demote_slot[i]] = 1;
	for (slot = 0; slot < cfg->t0_slots && p->n_free < cfg->delta; slot++) {
		if (pl->s->slot_pos[slot] >= 0 && !w->mark[slot])
			continue;
		if (k < p->n_promote)
			w->promote_slot[k++] = slot;
		else
			w->free_slot[p->n_free++] = slot;
	}
}

int
kvt_tier_plan(const struct kvt_tier_cfg *cfg, const struct kvt_tier_seq *s, void *ws,
	      size_t ws_size, struct kvt_tier_plan *ret_plan)
{
	struct planner pl;
	struct kvt_tier_plan *p = &pl.p;
	int r;

	if (!cfg || !s || !ws || ((uintptr_t)ws & 7) || !ret_plan || cfg->t0_slots != s->t0_slots)
		return -EINVAL;
	if (!cfg->delta || (cfg->t0_slots && cfg->delta > cfg->t0_slots))
		return -EINVAL;
	if (ws_size < kvt_tier_ws_bytes(s->n, cfg->t0_slots, cfg->delta))
		return -EINVAL;
	pl = (struct planner){.cfg = cfg, .s = s, .n = s->n};
	ws_layout(&pl.w, ws, pl.n, cfg->t0_slots, cfg->delta);

	plan_zones(&pl);
	plan_candidates(&pl);
	r = plan_budgets(&pl);
	if (r < 0)
		return r;
	pl.p = (struct kvt_tier_plan){.n = pl.n, .gen = s->gen};
	plan_classify(&pl);
	plan_quantize(&pl);
	plan_order_promotions(&pl);
	plan_slots(&pl);

	p->demote_slot = pl.w.demote_slot;
	p->demote_pos = pl.w.demote_pos;
	p->promote_pos = pl.w.promote_pos;
	p->promote_slot = pl.w.promote_slot;
	p->quant_pos = pl.w.quant;
	p->evict_pos = pl.w.evict;
	p->free_slot = pl.w.free_slot;
	memcpy(p->count, pl.cnt, sizeof(pl.cnt));
	p->evicted_ratio = pl.n ? (float)pl.cnt[KVT_T3] / (float)pl.n : 0.0f;
	*ret_plan = *p;
	return 0;
}

/* ---- applying a plan -------------------------------------------------------------------- */

int
kvt_tier_commit(struct kvt_tier_seq *s, const struct kvt_tier_plan *plan)
{
	uint32_t i, n1, n2, n_int8;

	if (!s || !plan)
		return -EINVAL;
	if (plan->n != s->n || plan->gen != s->gen)
		return -ESTALE;

	n_int8 = s->n_int8;
	/* Order matters: demotions free slots that promotions may reuse; quantize and evict set
	 * the final tier of demoted positions. */
	for (i = 0; i < plan->n_demote; i++) {
		uint32_t pos = plan->demote_pos[i];

		s->slot_pos[plan->demote_slot[i]] = -1;
		s->pos_slot[pos] = -1;
		s->tier[pos] =
		    (s->tier[pos] & KVT_TIER_F_INT8) ? (KVT_T2 | KVT_TIER_F_INT8) : KVT_T1;
	}
	for (i = 0; i < plan->n_quant; i++) {
		s->tier[plan->quant_pos[i]] = KVT_T2 | KVT_TIER_F_INT8;
		n_int8++;
	}
	for (i = 0; i < plan->n_evict; i++) {
		uint32_t pos = plan->evict_pos[i];

		n_int8 -= (s->tier[pos] & KVT_TIER_F_INT8) != 0;
		s->tier[pos] = KVT_T3;
	}
	for (i = 0; i < plan->n_promote; i++) {
		uint32_t pos = plan->promote_pos[i], slot = plan->promote_slot[i];

		s->slot_pos[slot] = (int32_t)pos;
		s->pos_slot[pos] = (int32_t)slot;
		s->tier[pos] = KVT_T0 | (s->tier[pos] & KVT_TIER_F_INT8);
	}

	/* Rebuild the FETCH lists in one branch-free pass (see LIST_SPARE). */
	n1 = 0;
	n2 = 0;
	{
		uint32_t *t2 = s->list + s->cap + 1 - plan->count[KVT_T2];

		for (i = 0; i < s->n; i++) {
			unsigned t = s->tier[i] & KVT_TIER_MASK;

			s->list[n1] = i;
			t2[n2] = i;
			n1 += t == KVT_T1;
			n2 += t == KVT_T2;
		}
	}
	memcpy(s->count, plan->count, sizeof(s->count));
	s->n_int8 = n_int8;
	s->gen++;
	return 0;
}

int
kvt_tier_retier(const struct kvt_tier_cfg *cfg, struct kvt_tier_seq *s, void *ws, size_t ws_size,
		struct kvt_tier_plan *ret_plan)
{
	struct kvt_tier_plan p;
	int r = kvt_tier_plan(cfg, s, ws, ws_size, &p);

	if (r < 0)
		return r;
	r = kvt_tier_commit(s, &p);
	if (r < 0)
		return r;
	if (ret_plan)
		*ret_plan = p;
	return 0;
}

int
kvt_tier_positions(const struct kvt_tier_seq *s, int tier, const uint32_t **ret_pos)
{
	if (!s || !ret_pos)
		return -EINVAL;
	if (tier == KVT_T1) {
		*ret_pos = s->list;
		return (int)s->count[KVT_T1];
	}
	if (tier == KVT_T2) {
		*ret_pos = t2_list(s);
		return (int)s->count[KVT_T2];
	}
	return -EINVAL;
}

int
kvt_tier_fetch_list(const struct kvt_tier_seq *s, unsigned tier_mask, uint32_t cap,
		    uint32_t *ret_pos)
{
	const unsigned all = (1u << KVT_T1) | (1u << KVT_T2);
	const uint32_t *a, *b;
	uint32_t na = 0, nb = 0, i = 0, j = 0, o = 0;

	if (!s || !tier_mask || (tier_mask & ~all) || (cap && !ret_pos))
		return -EINVAL;
	if (tier_mask & (1u << KVT_T1))
		na = (uint32_t)kvt_tier_positions(s, KVT_T1, &a);
	if (tier_mask & (1u << KVT_T2))
		nb = (uint32_t)kvt_tier_positions(s, KVT_T2, &b);
	if ((uint64_t)na + nb > cap)
		return -ENOBUFS;
	while (i < na && j < nb)
		ret_pos[o++] = a[i] < b[j] ? a[i++] : b[j++];
	while (i < na)
		ret_pos[o++] = a[i++];
	while (j < nb)
		ret_pos[o++] = b[j++];
	return (int)o;
}
