/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "kvdump.h"
#include "llm_pool.h"
#include "simd.h"

/* ---- loading ------------------------------------------------------------------------------ */

static int
bind_mat(const struct gguf_file *f, const char *name, uint32_t cols, uint32_t rows,
	 struct llm_mat *ret_mat, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_find_tensor(f, name);

	if (!t) {
		snprintf(err, errlen, "tensor %s is missing", name);
		return -EINVAL;
	}
	if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
		snprintf(err, errlen, "tensor %s is [%llu, %llu, %llu, %llu], expected [%u, %u]",
			 name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			 (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], cols, rows);
		return -EINVAL;
	}
	if (!llm_type_supported(t->type)) {
		snprintf(err, errlen, "tensor %s has type %s, which kvtier-llm does not support",
			 name, ggml_type_name(t->type));
		return -ENOTSUP;
	}
	ret_mat->type = t->type;
	ret_mat->rows = rows;
	ret_mat->cols = cols;
	ret_mat->row_bytes = llm_row_bytes(t->type, cols);
	ret_mat->data = t->data;
	return 0;
}

/* A 1-D weight (norms) as an owned f32 copy, whatever its stored type. */
static int
load_vec(const struct gguf_file *f, const char *name, uint32_t n, float **ret_vec, char *err,
	 size_t errlen)
{
	struct llm_mat m;
	float *v;
	int ret;

	ret = bind_mat(f, name, n, 1, &m, err, errlen);
	if (ret < 0)
		return ret;
	v = malloc(n * sizeof(float));
	if (!v)
		return -ENOMEM;
	llm_dequant_row(m.type, m.data, v, n);
	*ret_vec = v;
	return 0;
}

static int
need_u32(const struct gguf_file *f, const char *key, uint32_t *ret_val, char *err, size_t errlen)
{
	int ret = gguf_get_u32(f, key, ret_val);

	if (ret < 0)
		snprintf(err, errlen, "metadata %s: %s", key,
			 ret == -ENOENT ? "missing" : "not a u32 integer");
	return ret < 0 ? -EINVAL : 0;
}

static int
load_config(const struct gguf_file *f, struct llm_config *c, char *err, size_t errlen)
{
	struct gguf_str arch;
	uint64_t n_tokens;
	const struct gguf_kv *kv;
	uint32_t v;
	int ret;

	ret = gguf_get_str(f, "general.architecture", &arch);
	if (ret < 0) {
		snprintf(err, errlen, "metadata general.architecture is missing");
		return -EINVAL;
	}
	if (!gguf_str_eq(arch, "llama")) {
		snprintf(err, errlen, "architecture '%.*s' is not supported (only llama)",
			 (int)arch.len, arch.ptr);
		return -ENOTSUP;
	}
	if ((ret = need_u32(f, "llama.block_count", &c->n_layer, err, errlen)) < 0 ||
	    (ret = need_u32(f, "llama.embedding_length", &c->n_embd, err, errlen)) < 0 ||
	    (ret = need_u32(f, "llama.feed_forward_length", &c->n_ff, err, errlen)) < 0 ||
	    (ret = need_u32(f, "llama.attention.head_count", &c->n_head, err, errlen)) < 0)
		return ret;
	c->n_head_kv = c->n_head;
	gguf_get_u32(f, "llama.attention.head_count_kv", &c->n_head_kv);
	c->n_ctx_train = 2048;
	gguf_get_u32(f, "llama.context_length", &c->n_ctx_train);
	if (!c->n_head || !c->n_head_kv || c->n_head % c->n_head_kv || c->n_embd % c->n_head) {
		snprintf(err, errlen, "bad head counts: %u heads, %u kv heads, %u dims", c->n_head,
			 c->n_head_kv, c->n_embd);
		return -EINVAL;
	}
	c->head_dim = c->n_embd / c->n_head;
	if (!gguf_get_u32(f, "llama.attention.key_length", &v) && v != c->head_dim) {
		snprintf(err, errlen, "key_length %u != embedding / heads (%u)", v, c->head_dim);
		return -ENOTSUP;
	}
	c->rope_dim = c->head_dim;
	gguf_get_u32(f, "llama.rope.dimension_count", &c->rope_dim);
	if (c->rope_dim > c->head_dim || c->rope_dim % 2) {
		snprintf(err, errlen, "rope dimension %u does not fit head_dim %u", c->rope_dim,
			 c->head_dim);
		return -EINVAL;
	}
	c->rope_base = 10000.0f;
	gguf_get_f32(f, "llama.rope.freq_base", &c->rope_base);
	c->rms_eps = 1e-5f;
	gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps);
	if (gguf_find_kv(f, "llama.rope.scaling.type") &&
	    !gguf_get_str(f, "llama.rope.scaling.type", &arch) && !gguf_str_eq(arch, "none")) {
		snprintf(err, errlen, "rope scaling '%.*s' is not supported", (int)arch.len,
			 arch.ptr);
		return -ENOTSUP;
	}
	if (!gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &n_tokens, &kv))
		c->n_vocab = (uint32_t)n_tokens;
	else if ((ret = need_u32(f, "llama.vocab_size", &c->n_vocab, err, errlen)) < 0)
		return ret;
	if (c->head_dim > KVT_LLM_MAX_HEAD_DIM) {
		snprintf(err, errlen, "head_dim %u is above %u", c->head_dim, KVT_LLM_MAX_HEAD_DIM);
		return -ENOTSUP;
	}
	return 0;
}

int
llm_model_load(const char *path, struct llm_model **ret_model, char *err, size_t errlen)
{
	struct llm_model *m;
	struct llm_config *c;
	char name[96];
	int ret;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	ret = gguf_open(path, &m->gguf, err, errlen);
	if (ret < 0)
		goto err_free;
	c = &m->cfg;
	ret = load_config(m->gguf, c, err, errlen);
	if (ret < 0)
		goto err_free;
	ret = bind_mat(m->gguf, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd, err,
		       errlen);
	if (ret < 0)
		goto err_free;
	if (gguf_find_tensor(m->gguf, "output.weight")) {
		ret = bind_mat(m->gguf, "output.weight", c->n_embd, c->n_vocab, &m->output, err,
			       errlen);
		if (ret < 0)
			goto err_free;
	} else {
		m->output = m->tok_embd;
		m->tied = 1;
	}
	ret = load_vec(m->gguf, "output_norm.weight", c->n_embd, &m->out_norm, err, errlen);
	if (ret < 0)
		goto err_free;
	m->layers = calloc(c->n_layer, sizeof(*m->layers));
	if (!m->layers) {
		ret = -ENOMEM;
		goto err_free;
	}
	for (uint32_t l = 0; l < c->n_layer; l++) {
		struct llm_layer *L = &m->layers[l];
		uint32_t kvd = c->n_head_kv * c->head_dim;

#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%u." suffix ".weight", l), name)
		if ((ret = load_vec(m->gguf, BLK("attn_norm"), c->n_embd, &L->attn_norm, err,
				    errlen)) < 0 ||
		    (ret = load_vec(m->gguf, BLK("ffn_norm"), c->n_embd, &L->ffn_norm, err,
				    errlen)) < 0 ||
		    (ret = bind_mat(m->gguf, BLK("attn_q"), c->n_embd, c->n_embd, &L->wq, err,
				    errlen)) < 0 ||
		    (ret = bind_mat(m->gguf, BLK("attn_k"), c->n_embd, kvd, &L->wk, err, errlen)) <
			0 ||
		    (ret = bind_mat(m->gguf, BLK("attn_v"), c->n_embd, kvd, &L->wv, err, errlen)) <
			0 ||
		    (ret = bind_mat(m->gguf, BLK("attn_output"), c->n_embd, c->n_embd, &L->wo, err,
				    errlen)) < 0 ||
		    (ret = bind_mat(m->gguf, BLK("ffn_gate"), c->n_embd, c->n_ff, &L->gate, err,
				    errlen)) < 0 ||
		    (ret = bind_mat(m->gguf, BLK("ffn_up"), c->n_embd, c->n_ff, &L->up, err,
				    errlen)) < 0 ||
		    (ret = bind_mat(m->gguf, BLK("ffn_down"), c->n_ff, c->n_embd, &L->down, err,
				    errlen)) < 0)
			goto err_free;
#undef BLK
	}
	*ret_model = m;
	return 0;

err_free:
	if (ret == -ENOMEM && errlen)
		snprintf(err, errlen, "out of memory");
	llm_model_free(m);
	return ret;
}

void
llm_model_free(struct llm_model *m)
{
	if (!m)
		return;
	if (m->layers)
		for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
			free(m->layers[l].attn_norm);
			free(m->layers[l].ffn_norm);
		}
	free(m->layers);
	free(m->out_norm);
	gguf_close(m->gguf);
	free(m);
}

/* ---- context ------------------------------------------------------------------------------ */

int
llm_ctx_create(const struct llm_model *m, struct kv_backend *kv, uint32_t n_threads,
	       struct llm_ctx **ret_ctx)
{
	const struct llm_config *c = &m->cfg;
	struct llm_ctx *x;
	uint32_t big = c->n_embd > c->n_ff ? c->n_embd : c->n_ff;
	int ret;

	if (kv->layers != c->n_layer || kv->kv_heads != c->n_head_kv ||
	    kv->head_dim != c->head_dim || !n_threads)
		return -EINVAL;
	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->m = m;
	x->kv = kv;
	x->n_threads = n_threads;
	x->x = calloc(c->n_embd, sizeof(float));
	x->xb = calloc(big, sizeof(float));
	x->xb2 = calloc(c->n_embd, sizeof(float));
	x->q = calloc(c->n_embd, sizeof(float));
	x->hb = calloc(c->n_ff, sizeof(float));
	x->hb2 = calloc(c->n_ff, sizeof(float));
	x->logits = calloc(c->n_vocab, sizeof(float));
	x->tok = calloc(kv->token_floats, sizeof(float));
	x->rope_cos = calloc(c->rope_dim / 2 + 1, sizeof(float));
	x->rope_sin = calloc(c->rope_dim / 2 + 1, sizeof(float));
	if (!x->x || !x->xb || !x->xb2 || !x->q || !x->hb || !x->hb2 || !x->logits || !x->tok ||
	    !x->rope_cos || !x->rope_sin) {
		ret = -ENOMEM;
		goto err_free;
	}
	ret = llm_pool_create(n_threads, &x->pool);
	if (ret < 0)
		goto err_free;
	*ret_ctx = x;
	return 0;

err_free:
	llm_ctx_free(x);
	return ret;
}

void
llm_ctx_free(struct llm_ctx *c)
{
	if (!c)
		return;
	llm_pool_free(c->pool);
	free(c->x);
	free(c->xb);
	free(c->xb2);
	free(c->q);
	free(c->hb);
	free(c->hb2);
	free(c->logits);
	free(c->tok);
	free(c->att);
	free(c->att_mean);
	free(c->att_pos);
	free(c->rope_cos);
	free(c->rope_sin);
	free(c);
}

static int
att_reserve(struct llm_ctx *c, uint32_t need)
{
	uint32_t cap = c->att_cap ? c->att_cap : 256;
	void *p;

	if (need <= c->att_cap)
		return 0;
	while (cap < need)
		cap = cap > UINT32_MAX / 2 ? need : cap * 2;
	p = realloc(c->att, (size_t)cap * c->m->cfg.n_head * sizeof(float));
	if (!p)
		return -ENOMEM;
	c->att = p;
	p = realloc(c->att_mean, (size_t)cap * sizeof(float));
	if (!p)
		return -ENOMEM;
	c->att_mean = p;
	p = realloc(c->att_pos, (size_t)cap * sizeof(uint32_t));
	if (!p)
		return -ENOMEM;
	c->att_pos = p;
	c->att_cap = cap;
	return 0;
}

/* ---- kernels ------------------------------------------------------------------------------ */

static void
rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
	double ss = 0.0;
	float scale;

	for (uint32_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	scale = (float)(1.0 / sqrt(ss / n + eps));
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * scale * w[i];
}

/*
 * cos/sin of pos * base^(-2i/rope_dim), with theta advanced by repeated multiplication in f32
 * as ggml's rope does, so our angles match llama.cpp's to the last bit of the recurrence.
 */
static void
rope_angles(struct llm_ctx *c, uint32_t pos)
{
	const struct llm_config *cfg = &c->m->cfg;
	float theta_scale = powf(cfg->rope_base, -2.0f / (float)cfg->rope_dim);
	float theta = (float)pos;

	for (uint32_t i = 0; i < cfg->rope_dim / 2; i++) {
		c->rope_cos[i] = cosf(theta);
		c->rope_sin[i] = sinf(theta);
		theta *= theta_scale;
	}
}

/* Normal (non-NeoX) rotation of adjacent pairs, in place, for @heads heads. */
static void
rope_apply(const struct llm_ctx *c, float *v, uint32_t heads)
{
	const struct llm_config *cfg = &c->m->cfg;

	for (uint32_t h = 0; h < heads; h++) {
		float *p = v + h * cfg->head_dim;

		for (uint32_t i = 0; i < cfg->rope_dim / 2; i++) {
			float x0 = p[2 * i], x1 = p[2 * i + 1];

			p[2 * i] = x0 * c->rope_cos[i] - x1 * c->rope_sin[i];
			p[2 * i + 1] = x0 * c->rope_sin[i] + x1 * c->rope_cos[i];
		}
	}
}

/* Rows [r0, r1) of a split of @rows rows into @n near-equal parts. */
static inline void
split(uint32_t rows, uint32_t t, uint32_t n, uint32_t *r0, uint32_t *r1)
{
	*r0 = (uint32_t)((uint64_t)rows * t / n);
	*r1 = (uint32_t)((uint64_t)rows * (t + 1) / n);
}

/* Job: c->job_n matvecs of the same input, each matrix's rows split across threads. */
static void
job_matvec(void *arg, uint32_t t, uint32_t n)
{
	struct llm_ctx *c = arg;

	for (uint32_t j = 0; j < c->job_n; j++) {
		uint32_t r0, r1;

		split(c->job_mats[j]->rows, t, n, &r0, &r1);
		llm_matvec(c->job_mats[j], c->cur_x, c->job_outs[j], r0, r1);
	}
}

static void
matvecs(struct llm_ctx *c, float *x, uint32_t nmat, const struct llm_mat *m0, float *y0,
	const struct llm_mat *m1, float *y1, const struct llm_mat *m2, float *y2)
{
	c->cur_x = x;
	c->job_n = nmat;
	c->job_mats[0] = m0;
	c->job_outs[0] = y0;
	c->job_mats[1] = m1;
	c->job_outs[1] = y1;
	c->job_mats[2] = m2;
	c->job_outs[2] = y2;
	llm_pool_run(c->pool, job_matvec, c);
}

/*
 * Job: attention for query heads split across threads. Each head's result depends only on its
 * inputs and the view order, never on which thread ran it.
 */
static void
job_attention(void *arg, uint32_t t, uint32_t nt)
{
	struct llm_ctx *c = arg;
	const struct llm_config *cfg = &c->m->cfg;
	const struct kv_view *vw = &c->view;
	uint32_t D = cfg->head_dim, group = cfg->n_head / cfg->n_head_kv;
	uint32_t n = vw->n + 1; /* the view, then the step itself */
	const float *self_k = c->tok + kv_row_off(c->kv, c->cur_layer, 0);
	const float *self_v = c->tok + kv_row_off(c->kv, c->cur_layer, 1);
	float scale = 1.0f / sqrtf((float)D);
	int simd = kvt_simd_level();
	uint32_t h0, h1;

	split(cfg->n_head, t, nt, &h0, &h1);
	for (uint32_t h = h0; h < h1; h++) {
		uint32_t kvh = h / group;
		const float *q = c->q + h * D;
		float *w = c->att + (size_t)h * c->att_cap;
		float *out = c->xb2 + h * D;
		float max = -INFINITY, sum = 0.0f, inv;

		for (uint32_t i = 0; i < vw->n; i++)
			w[i] = llm_dot(simd, GGML_TYPE_F32, vw->k[i] + kvh * D, q, D) * scale;
		w[vw->n] = llm_dot(simd, GGML_TYPE_F32, self_k + kvh * D, q, D) * scale;
		for (uint32_t i = 0; i < n; i++)
			max = w[i] > max ? w[i] : max;
		for (uint32_t i = 0; i < n; i++) {
			w[i] = expf(w[i] - max);
			sum += w[i];
		}
		inv = 1.0f / sum;
		memset(out, 0, D * sizeof(float));
		for (uint32_t i = 0; i < n; i++) {
			const float *v = (i < vw->n ? vw->v[i] : self_v) + kvh * D;
			float a = w[i] * inv;

			w[i] = a;
			for (uint32_t d = 0; d < D; d++)
				out[d] += a * v[d];
		}
	}
}

static int
check_view(struct llm_ctx *c, uint32_t layer)
{
	const struct kv_view *vw = &c->view;

	if (vw->n > c->cur_pos)
		return -EPROTO;
	if (layer == 0) {
		for (uint32_t i = 0; i < vw->n; i++) {
			if (vw->pos[i] >= c->cur_pos || (i && vw->pos[i] <= vw->pos[i - 1]))
				return -EPROTO;
			c->att_pos[i] = vw->pos[i];
		}
		return 0;
	}
	/* Later layers must show the positions layer 0 showed. */
	if (vw->n && memcmp(c->att_pos, vw->pos, (size_t)vw->n * sizeof(uint32_t)))
		return -EPROTO;
	return 0;
}

int
llm_step(struct llm_ctx *c, uint32_t token, const float **ret_logits)
{
	const struct llm_model *m = c->m;
	const struct llm_config *cfg = &m->cfg;
	struct kv_backend *kv = c->kv;
	uint32_t E = cfg->n_embd, n_view = 0;
	int ret;

	if (token >= cfg->n_vocab)
		return -EINVAL;
	c->cur_pos = kv->n;
	if (kv->ops->begin) {
		ret = kv->ops->begin(kv, c->cur_pos);
		if (ret < 0)
			return ret;
	}
	llm_dequant_row(m->tok_embd.type, m->tok_embd.data + (size_t)token * m->tok_embd.row_bytes,
			c->x, E);
	rope_angles(c, c->cur_pos);

	for (uint32_t l = 0; l < cfg->n_layer; l++) {
		const struct llm_layer *L = &m->layers[l];
		float *k = c->tok + kv_row_off(kv, l, 0), *v = c->tok + kv_row_off(kv, l, 1);

		c->cur_layer = l;
		rmsnorm(c->xb, c->x, L->attn_norm, E, cfg->rms_eps);
		matvecs(c, c->xb, 3, &L->wq, c->q, &L->wk, k, &L->wv, v);
		rope_apply(c, c->q, cfg->n_head);
		rope_apply(c, k, cfg->n_head_kv);
		if (c->dump)
			llm_kvdump_layer(c->dump, l, c->q, k);

		ret = kv->ops->view(kv, l, &c->view);
		if (ret < 0)
			return ret;
		if (l == 0) {
			n_view = c->view.n;
			ret = att_reserve(c, n_view + 1);
			if (ret < 0)
				return ret;
			memset(c->att_mean, 0, (n_view + 1) * sizeof(float));
		} else if (c->view.n != n_view) {
			return -EPROTO;
		}
		ret = check_view(c, l);
		if (ret < 0)
			return ret;
		llm_pool_run(c->pool, job_attention, c);
		/* Fixed order (head, then position) so the mean is the same for any thread count.
		 */
		for (uint32_t h = 0; h < cfg->n_head; h++) {
			const float *w = c->att + (size_t)h * c->att_cap;

			for (uint32_t i = 0; i <= n_view; i++)
				c->att_mean[i] += w[i];
		}

		matvecs(c, c->xb2, 1, &L->wo, c->xb, NULL, NULL, NULL, NULL);
		for (uint32_t i = 0; i < E; i++)
			c->x[i] += c->xb[i];

		rmsnorm(c->xb, c->x, L->ffn_norm, E, cfg->rms_eps);
		matvecs(c, c->xb, 2, &L->gate, c->hb, &L->up, c->hb2, NULL, NULL);
		for (uint32_t i = 0; i < cfg->n_ff; i++) {
			float g = c->hb[i];

			c->hb[i] = g / (1.0f + expf(-g)) * c->hb2[i];
		}
		matvecs(c, c->hb, 1, &L->down, c->xb, NULL, NULL, NULL, NULL);
		for (uint32_t i = 0; i < E; i++)
			c->x[i] += c->xb[i];
	}

	rmsnorm(c->xb, c->x, m->out_norm, E, cfg->rms_eps);
	matvecs(c, c->xb, 1, &m->output, c->logits, NULL, NULL, NULL, NULL);

	ret = kv->ops->append(kv, c->cur_pos, c->tok);
	if (ret < 0)
		return ret;
	if (c->dump) {
		ret = llm_kvdump_token(c->dump, c->cur_pos);
		if (ret < 0)
			return ret;
	}
	if (kv->ops->score) {
		float norm = 1.0f / ((float)cfg->n_layer * (float)cfg->n_head);

		for (uint32_t i = 0; i <= n_view; i++)
			c->att_mean[i] *= norm;
		c->att_pos[n_view] = c->cur_pos;
		ret = kv->ops->score(kv, n_view + 1, c->att_pos, c->att_mean);
		if (ret < 0)
			return ret;
	}
	*ret_logits = c->logits;
	return 0;
}
