/* SPDX-License-Identifier: MIT */
/*
 * kvtier-llm --dump-kv with the real SmolLM2-135M-Instruct (skips with 77 when it is absent):
 *  - a 512-token greedy run, then a short second run appended to the same file: the header
 *    (magic, version, geometry of the model, dtype, counts) describes the file, the records are
 *    numbered (sequence, position) in order;
 *  - every key row of the first run is, in f16, the row the in-process local KV cache holds
 *    after the same generation; the layer-0 keys and queries of the first tokens equal
 *    RoPE(W * rms(embedding)) computed here from the weights (so they are post-RoPE);
 *  - kvtier-bench-retrieval --data real reads the dump and measures kvtier and the exact scan
 *    on it at the dump's n;
 *  - a file that is not a dump is refused by both, and left as it was; a truncated dump is
 *    refused by the benchmark.
 */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "kvdump.h"
#include "llm_quant.h"
#include "llm_test.h"
#include "kvt_test.h"

#define PROMPT "Once upon a time, in a village at the edge of a great forest, there lived"
#define GEN    512

struct run {
	int status;
	char *out;
	char err[16384];
};

static void
slurp(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	ssize_t r;

	while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0)
		n += (size_t)r;
	buf[n] = '\0';
}

/* Runs @argv[0] with @argv (NULL-terminated); stdout and stderr go to temp files. */
static void
run(struct run *r, const char *const *argv)
{
	char outp[64], errp[64];
	int fo = kvt_test_tmpfile(outp, sizeof(outp), "kvdump-out"),
	    fe = kvt_test_tmpfile(errp, sizeof(errp), "kvdump-err"), st;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(fo, 1);
		dup2(fe, 2);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	r->status = WEXITSTATUS(st);
	free(r->out);
	r->out = malloc(1 << 20);
	ck_assert_ptr_nonnull(r->out);
	lseek(fo, 0, SEEK_SET);
	lseek(fe, 0, SEEK_SET);
	slurp(fo, r->out, 1 << 20);
	slurp(fe, r->err, sizeof(r->err));
	close(fo);
	close(fe);
	unlink(outp);
	unlink(errp);
}

static uint8_t *
read_file(const char *path, size_t *ret_len)
{
	struct stat st;
	int fd = open(path, O_RDONLY);
	uint8_t *buf;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	buf = malloc((size_t)st.st_size + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
	close(fd);
	*ret_len = (size_t)st.st_size;
	return buf;
}

/* RoPE(W * rms(embedding of @token)) at @pos for layer 0, in double where it matters. */
static void
layer0_proj(const struct llm_model *m, uint32_t token, uint32_t pos, const struct llm_mat *w,
	    uint32_t heads, float *ret)
{
	const struct llm_config *c = &m->cfg;
	float *x = malloc(c->n_embd * sizeof(float));
	double ss = 0.0;

	ck_assert_ptr_nonnull(x);
	llm_dequant_row(m->tok_embd.type, m->tok_embd.data + (size_t)token * m->tok_embd.row_bytes,
			x, c->n_embd);
	for (uint32_t i = 0; i < c->n_embd; i++)
		ss += (double)x[i] * x[i];
	ss = 1.0 / sqrt(ss / c->n_embd + c->rms_eps);
	for (uint32_t i = 0; i < c->n_embd; i++)
		x[i] = (float)(x[i] * ss) * m->layers[0].attn_norm[i];
	llm_matvec(w, x, ret, 0, heads * c->head_dim);
	for (uint32_t h = 0; h < heads; h++)
		for (uint32_t i = 0; i < c->rope_dim / 2; i++) {
			double th = pos * pow(c->rope_base, -2.0 * i / c->rope_dim);
			float *p = ret + (size_t)h * c->head_dim + 2 * i;
			double a = p[0], b = p[1];

			p[0] = (float)(a * cos(th) - b * sin(th));
			p[1] = (float)(a * sin(th) + b * cos(th));
		}
	free(x);
}

/* f16 of the dump against a value computed here: f16 rounding plus float reassociation */
static void
assert_close(const uint16_t *got, const float *want, uint32_t n, const char *what, uint32_t pos)
{
	for (uint32_t i = 0; i < n; i++) {
		float g = llm_f16_to_f32(got[i]);

		ck_assert_msg(fabsf(g - want[i]) <= 4e-3f * fabsf(want[i]) + 2e-3f,
			      "%s pos %u [%u]: dump %g, model %g", what, pos, i, g, want[i]);
	}
}

START_TEST(test_dump)
{
	char dir[64], path[128], err[256];
	const char *second = "The capital of France is";
	struct run r = {0};
	struct llm_model *m;
	struct llm_tok *tok;
	struct kv_backend *kv;
	struct llm_ctx *ctx;
	struct llm_sampler smp = {0};
	struct llm_ids prompt = {0}, out = {0};
	struct llm_gen_stats st;
	struct llm_kvdump_hdr h;
	uint8_t *buf;
	size_t len;
	uint32_t n0 = 0, kn, qn;

	kvt_test_tmpdir(dir, sizeof(dir), "kvdump");
	snprintf(path, sizeof(path), "%s/keys.kq", dir);
	run(&r, (const char *const[]){KVTIER_LLM_PATH, "--prompt", PROMPT, "--max-tokens", "512",
				      "--dump-kv", path, NULL});
	ck_assert_msg(r.status == 0, "%s", r.err);
	run(&r, (const char *const[]){KVTIER_LLM_PATH, "--prompt", second, "--max-tokens", "8",
				      "--dump-kv", path, NULL});
	ck_assert_msg(r.status == 0, "%s", r.err);

	/* the same generation in process, on the local backend */
	ck_assert_msg(llm_model_load(llm_test_path, &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(llm_tok_load(m->gguf, &tok, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(llm_plain_prompt(tok, m->gguf, PROMPT, &prompt), 0);
	ck_assert_int_eq(kv_local_create(m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim, 0, &kv),
			 0);
	ck_assert_int_eq(llm_ctx_create(m, kv, 1, &ctx), 0);
	ck_assert_int_eq(llm_sampler_init(&smp, m->cfg.n_vocab, 0.0f, 0.9f, 0), 0);
	ck_assert_int_eq(
	    llm_generate(ctx, tok, prompt.v, prompt.n, GEN, &smp, NULL, NULL, &out, &st), 0);
	ck_assert_msg(kv->n >= 256, "only %u positions: the benchmark needs 256", kv->n);

	buf = read_file(path, &len);
	ck_assert_uint_ge(len, sizeof(h));
	memcpy(&h, buf, sizeof(h));
	ck_assert_ptr_null(llm_kvdump_hdr_check(&h, len));
	ck_assert_int_eq(memcmp(h.magic, "KVTKQDMP", 8), 0);
	ck_assert_uint_eq(h.version, 1);
	ck_assert_uint_eq(h.layers, m->cfg.n_layer);
	ck_assert_uint_eq(h.kv_heads, m->cfg.n_head_kv);
	ck_assert_uint_eq(h.q_heads, m->cfg.n_head);
	ck_assert_uint_eq(h.head_dim, m->cfg.head_dim);
	ck_assert_uint_eq(h.dtype, LLM_KVDUMP_F16);
	ck_assert_uint_eq(h.n_seqs, 2);
	ck_assert_uint_eq(len, sizeof(h) + h.n_tokens * h.rec_bytes);
	ck_assert_uint_gt(h.n_tokens, kv->n);
	kn = h.kv_heads * h.head_dim;
	qn = h.q_heads * h.head_dim;

	/* records: sequence 0 is the first run, position by position, then sequence 1 from 0 */
	for (uint64_t t = 0; t < h.n_tokens; t++) {
		uint32_t id[2];

		memcpy(id, buf + sizeof(h) + t * h.rec_bytes, sizeof(id));
		if (id[0] == 0)
			n0++;
		ck_assert_uint_eq(id[0], t < n0 ? 0 : 1);
		ck_assert_uint_eq(id[1], t < n0 ? t : t - n0);
	}
	ck_assert_uint_eq(n0, kv->n);

	/* every key row equals the cache's, in f16 (a view of the local cache shows them all) */
	for (uint32_t l = 0; l < h.layers; l++) {
		struct kv_view vw;

		ck_assert_int_eq(kv->ops->view(kv, l, &vw), 0);
		ck_assert_uint_eq(vw.n, n0);
		for (uint32_t t = 0; t < n0; t++) {
			const uint16_t *k =
			    (const uint16_t *)(buf + sizeof(h) + (size_t)t * h.rec_bytes + 8) +
			    (size_t)l * kn;

			ck_assert_uint_eq(vw.pos[t], t);
			for (uint32_t i = 0; i < kn; i++)
				ck_assert_msg(k[i] == llm_f32_to_f16(vw.k[t][i]),
					      "key pos %u layer %u [%u] differs", t, l, i);
		}
	}

	/* layer 0 from the weights: post-RoPE K and Q of the first prompt tokens */
	{
		float *want = malloc(qn * sizeof(float));

		ck_assert_ptr_nonnull(want);
		for (uint32_t p = 0; p < 4; p++) {
			const uint16_t *k =
			    (const uint16_t *)(buf + sizeof(h) + (size_t)p * h.rec_bytes + 8);

			layer0_proj(m, prompt.v[p], p, &m->layers[0].wk, h.kv_heads, want);
			assert_close(k, want, kn, "layer-0 key", p);
			layer0_proj(m, prompt.v[p], p, &m->layers[0].wq, h.q_heads, want);
			assert_close(k + (size_t)h.layers * kn, want, qn, "layer-0 query", p);
		}
		free(want);
	}

#ifdef KVTIER_BENCH_RETRIEVAL_PATH
	/* the benchmark's real mode on it, briefly: two heads, 8 queries, no FAISS */
	{
		json_object *j, *rows, *v;
		int seen_refine = 0, seen_kvtier = 0, seen_exact = 0;

		run(&r,
		    (const char *const[]){KVTIER_BENCH_RETRIEVAL_PATH, "--data", "real", "--keys",
					  path, "--queries", "8", "--no-faiss", "--real-head",
					  "0.0", "--real-head", "29.2", "--json", NULL});
		ck_assert_msg(r.status == 0, "%s", r.err);
		j = json_tokener_parse(r.out);
		ck_assert_ptr_nonnull(j);
		ck_assert(json_object_object_get_ex(j, "rows", &rows));
		ck_assert_int_gt(json_object_array_length(rows), 0);
		for (size_t i = 0; i < json_object_array_length(rows); i++) {
			json_object *row = json_object_array_get_idx(rows, i);
			const char *data, *method;
			double rec, p5;

			ck_assert(json_object_object_get_ex(row, "data", &v));
			data = json_object_get_string(v);
			ck_assert_msg(!strcmp(data, "real/l0h0") || !strcmp(data, "real/l29h2"),
				      "row data %s", data);
			ck_assert(json_object_object_get_ex(row, "n", &v));
			ck_assert_int_eq(json_object_get_int64(v), (int64_t)h.n_tokens);
			ck_assert(json_object_object_get_ex(row, "method", &v));
			method = json_object_get_string(v);
			ck_assert(json_object_object_get_ex(row, "recall", &v));
			rec = json_object_get_double(v);
			ck_assert(json_object_object_get_ex(row, "recall_p5", &v));
			p5 = json_object_get_double(v);
			ck_assert(p5 <= rec + 1e-9 && rec <= 1.0 && p5 >= 0.0);
			seen_kvtier += !strcmp(method, "kvtier");
			seen_refine += !strcmp(method, "kvtier-refine");
			if (!strcmp(method, "exact")) {
				/* the exact scan over f16 keys that are f16 already */
				ck_assert_msg(rec >= 0.99, "exact recall %g", rec);
				seen_exact++;
			}
		}
		ck_assert_int_eq(seen_kvtier, 6); /* 2 heads x k 64, 100, 200 */
		ck_assert_int_eq(seen_refine, 6);
		ck_assert_int_le(seen_exact, 6); /* the exact scan needs AVX2 */
		json_object_put(j);
	}
#endif
	free(buf);
	unlink(path);
	rmdir(dir);
	free(r.out);
	llm_sampler_fini(&smp);
	llm_ids_free(&prompt);
	llm_ids_free(&out);
	llm_ctx_free(ctx);
	kv_destroy(kv);
	llm_tok_free(tok);
	llm_model_free(m);
}
END_TEST

START_TEST(test_bad_files)
{
	char dir[64], path[128], junk[100];
	struct run r = {0};
	uint8_t *buf;
	size_t len;
	int fd;

	kvt_test_tmpdir(dir, sizeof(dir), "kvdump");
	snprintf(path, sizeof(path), "%s/junk", dir);
	memset(junk, 'x', sizeof(junk));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
	close(fd);
	run(&r, (const char *const[]){KVTIER_LLM_PATH, "--prompt", "Hi", "--max-tokens", "2",
				      "--dump-kv", path, NULL});
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "not a kvtier-llm --dump-kv file"), "%s", r.err);
	buf = read_file(path, &len);
	ck_assert_uint_eq(len, sizeof(junk));
	ck_assert_int_eq(memcmp(buf, junk, sizeof(junk)), 0);
	free(buf);
	unlink(path);

#ifdef KVTIER_BENCH_RETRIEVAL_PATH
	/* a short real dump cut inside its last record */
	run(&r, (const char *const[]){KVTIER_LLM_PATH, "--prompt", "Hi", "--max-tokens", "2",
				      "--dump-kv", path, NULL});
	ck_assert_msg(r.status == 0, "%s", r.err);
	buf = read_file(path, &len);
	ck_assert_int_eq(truncate(path, (off_t)len - 2), 0);
	free(buf);
	run(&r, (const char *const[]){KVTIER_BENCH_RETRIEVAL_PATH, "--data", "real", "--keys", path,
				      "--no-faiss", NULL});
	ck_assert_int_eq(r.status, 1);
	ck_assert_msg(strstr(r.err, "shorter than its token count"), "%s", r.err);
	run(&r, (const char *const[]){KVTIER_BENCH_RETRIEVAL_PATH, "--data", "real", NULL});
	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, "--data real needs --keys"), "%s", r.err);
	unlink(path);
#endif
	free(r.out);
	rmdir(dir);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_kvdump");
	TCase *tc = tcase_create("kvdump");

	llm_test_model_or_skip("check_llm_kvdump");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_dump);
	tcase_add_test(tc, test_bad_files);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
