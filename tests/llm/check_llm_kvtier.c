/* SPDX-License-Identifier: MIT */
/*
 * The kvtier KV backend of kvtier-llm against a real kvtierd (the built binary, $KVTIERD, in a
 * private directory, as tests/integration/harness.c starts it):
 *  - Proposition 1 on the real model: with policy full, and with tiered at evict 0 / t2 0 at
 *    two hbm fractions, every step's logits are bit-identical to the local backend's (run in
 *    lockstep on the same tokens), so the greedy tokens are too. The tiered runs must really
 *    have rows in T1 (staged by FETCH), else the test proves nothing.
 *  - Prefix sharing: a backend that opens from the blocks another one published (same
 *    namespace) steps only from the matched position on, with every logit bit-identical to the
 *    local backend's at the same position; it holds only its own rows; another namespace name
 *    never hits.
 *  - Eviction: tiered with evict 0.1 evicts floor(0.1 n) positions, generation goes on, and
 *    the daemon's score total equals the number of steps (each step's weights sum to 1).
 *  - kvtierd killed mid-generation: the next step fails with -ECONNRESET, promptly (the test's
 *    timeout is the "no hang" check), later steps fail the same way, and destroy returns.
 *  - The CLI: `kvtier-llm --kv kvtier --json` gives the local backend's tokens and tier counts;
 *    no daemon exits 1 with a message; a tiny `--eval --json` has every row, with agreement 1
 *    and the full-cache perplexity wherever nothing is evicted or quantized.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "kv_kvtier.h"
#include "llm_test.h"
#include "model.h"
#include "kvt_test.h"

static struct llm_model *model;
static struct llm_tok *tok;

struct kvtd {
	pid_t pid;
	char dir[64];
	char sock[100];
	char log[160];
};

static struct kvtd D;

/* Starts kvtierd and waits until a client can connect. */
static void
daemon_start(struct kvtd *p)
{
	const char *bin = getenv("KVTIERD");
	struct kvt_client *c = NULL;

	ck_assert_msg(bin, "KVTIERD is not set");
	kvt_test_tmpdir(p->dir, sizeof(p->dir), "llm-test");
	snprintf(p->sock, sizeof(p->sock), "%s/kvtierd.sock", p->dir);
	snprintf(p->log, sizeof(p->log), "%s/kvtierd.log", p->dir);
	p->pid = fork();
	ck_assert(p->pid >= 0);
	if (p->pid == 0) {
		int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, bin, "--config", "/dev/null", "--socket", p->sock, "--pool-size", "128M",
		      "--log-level", "info", "--backend", "host", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1000; i++) {
		if (access(p->sock, F_OK) == 0 && kvt_connect(p->sock, NULL, &c) == 0) {
			kvt_disconnect(c);
			return;
		}
		ck_assert_msg(waitpid(p->pid, NULL, WNOHANG) == 0,
			      "kvtierd exited at start (log %s)", p->log);
		usleep(10000);
	}
	ck_abort_msg("kvtierd did not accept a client within 10 s");
}

static void
daemon_stop(struct kvtd *p)
{
	int st = 0;

	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, &st, 0);
	}
	p->pid = 0;
	unlink(p->log);
	rmdir(p->dir);
}

static void
setup(void)
{
	char err[256];
	const char *path = llm_test_model_or_skip("check_llm_kvtier");

	ck_assert_msg(llm_model_load(path, &model, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(llm_tok_load(model->gguf, &tok, err, sizeof(err)) == 0, "%s", err);
	daemon_start(&D);
}

static void
teardown(void)
{
	daemon_stop(&D);
	llm_tok_free(tok);
	llm_model_free(model);
}

static struct kv_backend *
local(void)
{
	struct kv_backend *kv;

	ck_assert_int_eq(
	    kv_local_create(model->cfg.n_layer, model->cfg.n_head_kv, model->cfg.head_dim, 0, &kv),
	    0);
	return kv;
}

/* Small Δ and window so that 150 tokens go through many RETIERs with most rows in T1. */
static struct kv_backend *
kvtier(uint8_t policy, float hbm, float evict, uint32_t prompt_len, uint32_t max_tokens)
{
	struct kv_kvtier_opts o;
	struct kv_backend *kv = NULL;
	char err[256];
	int r;

	kv_kvtier_opts_default(&o);
	o.socket = D.sock;
	o.name = "check_llm_kvtier";
	o.policy = policy;
	o.hbm_frac = hbm;
	o.evict_frac = evict;
	o.delta = 8;
	o.window = 8;
	o.prompt_len = prompt_len;
	o.max_tokens = max_tokens;
	r = kv_kvtier_create(model->cfg.n_layer, model->cfg.n_head_kv, model->cfg.head_dim, &o, &kv,
			     err, sizeof(err));
	ck_assert_msg(r == 0, "kv_kvtier_create: %s", err);
	return kv;
}

static uint32_t
argmax(const float *l)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < model->cfg.n_vocab; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

enum { GEN = 120 };

/*
 * Local and kvtier in lockstep on the local greedy tokens: logits must be equal bit for bit at
 * every step. Returns the kvtier sequence's stat at the end.
 */
static void
lockstep(uint8_t policy, float hbm, struct kvt_seq_stat *ret_st)
{
	struct llm_ids prompt = {0};
	struct kv_backend *kl = local(), *kk;
	struct llm_ctx *cl, *ck;
	const float *ll = NULL, *lk = NULL;
	uint32_t id, gen = 0;

	ck_assert_int_eq(llm_chat_prompt(tok, NULL, "Tell me a long story about a cat.", &prompt),
			 0);
	kk = kvtier(policy, hbm, 0.0f, (uint32_t)prompt.n, (uint32_t)prompt.n + GEN);
	ck_assert_int_eq(llm_ctx_create(model, kl, 1, &cl), 0);
	ck_assert_int_eq(llm_ctx_create(model, kk, 1, &ck), 0);
	for (size_t i = 0; i < prompt.n; i++) {
		ck_assert_int_eq(llm_step(cl, prompt.v[i], &ll), 0);
		ck_assert_int_eq(llm_step(ck, prompt.v[i], &lk), 0);
		ck_assert_msg(!memcmp(ll, lk, model->cfg.n_vocab * sizeof(float)),
			      "prompt step %zu: logits differ", i);
	}
	for (uint32_t t = 0; t < GEN; t++) {
		id = argmax(ll);
		ck_assert_uint_eq(argmax(lk), id);
		gen++;
		if (t + 1 == GEN)
			break;
		ck_assert_int_eq(llm_step(cl, id, &ll), 0);
		ck_assert_int_eq(llm_step(ck, id, &lk), 0);
		ck_assert_msg(!memcmp(ll, lk, model->cfg.n_vocab * sizeof(float)),
			      "generated step %u: logits differ", t);
	}
	ck_assert_uint_eq(gen, GEN);
	ck_assert_int_eq(kv_kvtier_stat(kk, ret_st), 0);
	ck_assert_uint_eq(ret_st->n_tokens, prompt.n + GEN - 1);
	ck_assert_uint_eq(ret_st->tier_count[3], 0);
	ck_assert_uint_eq(ret_st->tier_count[2], 0);
	llm_ctx_free(cl);
	llm_ctx_free(ck);
	kv_destroy(kl);
	kv_destroy(kk);
	llm_ids_free(&prompt);
}

START_TEST(test_full_identical)
{
	struct kvt_seq_stat st;

	lockstep(KVT_POLICY_FULL, 1.0f, &st);
	ck_assert_uint_eq(st.tier_count[0], st.n_tokens); /* T0 holds everything */
}
END_TEST

START_TEST(test_tiered_evict0_identical)
{
	static const float hbm[] = {0.2f, 0.6f};
	struct kvt_seq_stat st;

	lockstep(KVT_POLICY_TIERED, hbm[_i], &st);
	/* Most rows came from the staging region, and T0 followed hbm_frac (+ the protected
	 * prompt and window, + the appends since the last RETIER). */
	ck_assert_uint_gt(st.tier_count[1], st.n_tokens / 4);
	ck_assert_uint_lt(st.tier_count[0], st.n_tokens);
	ck_assert_uint_eq(st.tier_count[0] + st.tier_count[1], st.n_tokens);
}
END_TEST

/* A backend in namespace @ns (prefix sharing) for @prompt, tiered at hbm 0.2, evict 0. */
static struct kv_backend *
kvtier_shared(const char *ns, const struct llm_ids *prompt, uint32_t max_tokens)
{
	struct kv_kvtier_opts o;
	struct kv_backend *kv = NULL;
	char err[256];
	int r;

	kv_kvtier_opts_default(&o);
	o.socket = D.sock;
	o.name = "check_llm_kvtier";
	o.hbm_frac = 0.2f;
	o.evict_frac = 0.0f;
	o.delta = 8;
	o.window = 8;
	o.prompt_len = (uint32_t)prompt->n;
	o.max_tokens = max_tokens;
	o.share_ns = ns;
	o.prompt = prompt->v;
	r = kv_kvtier_create(model->cfg.n_layer, model->cfg.n_head_kv, model->cfg.head_dim, &o, &kv,
			     err, sizeof(err));
	ck_assert_msg(r == 0, "kv_kvtier_create: %s", err);
	return kv;
}

/*
 * Prefix sharing in process: A computes the whole prompt and publishes it; B opens from A's
 * blocks at n = the matched tokens and steps only from there. Every logit of every step of both
 * is bit-identical to the local backend's at the same position.
 */
START_TEST(test_shared_prefix_identical)
{
	enum { SGEN = 24, BT = 16 };
	struct llm_ids prompt = {0}, toks = {0};
	struct kv_backend *kl = local(), *ka, *kb;
	struct llm_ctx *cl, *ca, *cb;
	struct kv_kvtier_share sh;
	struct kvt_seq_stat st;
	const float *l = NULL;
	float *ref;
	size_t nv = model->cfg.n_vocab, total;
	uint32_t m;

	ck_assert_int_eq(llm_chat_prompt(tok, NULL,
					 "Tell me a long story about a cat who lives in a "
					 "lighthouse, and about the ships she watches at night.",
					 &prompt),
			 0);
	ck_assert_uint_ge(prompt.n, 2 * BT);
	/* the local run: its tokens and its logits at every position */
	total = prompt.n + SGEN - 1;
	ref = malloc(total * nv * sizeof(float));
	ck_assert_ptr_nonnull(ref);
	ck_assert_int_eq(llm_ctx_create(model, kl, 1, &cl), 0);
	for (size_t i = 0; i < total; i++) {
		if (i < prompt.n)
			ck_assert_int_eq(llm_ids_push(&toks, prompt.v[i]), 0);
		ck_assert_int_eq(llm_step(cl, toks.v[i], &l), 0);
		memcpy(ref + i * nv, l, nv * sizeof(float));
		if (i + 1 >= prompt.n)
			ck_assert_int_eq(llm_ids_push(&toks, argmax(l)), 0);
	}

	/* A: nothing to share yet; publishes when its first generated token's step begins */
	ka = kvtier_shared("check_llm_kvtier-model", &prompt, (uint32_t)total + 1);
	kv_kvtier_share_info(ka, &sh);
	ck_assert_uint_eq(sh.matched_tokens, 0);
	ck_assert_int_eq(sh.published, -1);
	ck_assert_int_eq(llm_ctx_create(model, ka, 1, &ca), 0);
	for (size_t i = 0; i < total; i++) {
		ck_assert_int_eq(llm_step(ca, toks.v[i], &l), 0);
		ck_assert_msg(!memcmp(l, ref + i * nv, nv * sizeof(float)), "A step %zu differs",
			      i);
	}
	kv_kvtier_share_info(ka, &sh);
	ck_assert_int_eq(sh.published, (int)(prompt.n / BT));
	ck_assert_uint_eq(sh.published_new, prompt.n / BT);

	/* B: opens from A's blocks, computes the rest */
	kb = kvtier_shared("check_llm_kvtier-model", &prompt, (uint32_t)total + 1);
	kv_kvtier_share_info(kb, &sh);
	m = (uint32_t)((prompt.n - 1) / BT * BT);
	ck_assert_uint_eq(sh.matched_tokens, m);
	ck_assert_uint_eq(kb->n, m);
	ck_assert_int_eq(llm_ctx_create(model, kb, 1, &cb), 0);
	for (size_t i = m; i < total; i++) {
		ck_assert_int_eq(llm_step(cb, toks.v[i], &l), 0);
		ck_assert_msg(!memcmp(l, ref + i * nv, nv * sizeof(float)), "B step %zu differs",
			      i);
	}
	kv_kvtier_share_info(kb, &sh);
	ck_assert_int_eq(sh.published, (int)(prompt.n / BT));
	ck_assert_uint_eq(sh.published_new, 0);
	/* B holds only the rows past the shared blocks */
	ck_assert_int_eq(kv_kvtier_stat(kb, &st), 0);
	ck_assert_uint_eq(st.n_tokens, total);
	ck_assert_uint_eq(st.pool_bytes,
			  (total - prompt.n / BT * BT) * (uint64_t)kb->token_floats * 4);
	/* the same tokens under another namespace name (another model) never hit */
	{
		struct kv_backend *ko =
		    kvtier_shared("check_llm_kvtier-other", &prompt, (uint32_t)total + 1);

		kv_kvtier_share_info(ko, &sh);
		ck_assert_uint_eq(sh.matched_tokens, 0);
		kv_destroy(ko);
	}
	llm_ctx_free(cl);
	llm_ctx_free(ca);
	llm_ctx_free(cb);
	kv_destroy(kl);
	kv_destroy(ka);
	kv_destroy(kb);
	llm_ids_free(&prompt);
	llm_ids_free(&toks);
	free(ref);
}
END_TEST

START_TEST(test_evict)
{
	struct llm_ids prompt = {0};
	struct kv_backend *kk;
	struct llm_ctx *ck;
	struct kvt_seq_stat st;
	const float *lk = NULL;
	uint32_t steps = 0;

	ck_assert_int_eq(llm_chat_prompt(tok, NULL, "Tell me a long story about a cat.", &prompt),
			 0);
	kk = kvtier(KVT_POLICY_TIERED, 0.3f, 0.1f, (uint32_t)prompt.n, (uint32_t)prompt.n + GEN);
	ck_assert_int_eq(llm_ctx_create(model, kk, 1, &ck), 0);
	for (size_t i = 0; i < prompt.n; i++, steps++)
		ck_assert_int_eq(llm_step(ck, prompt.v[i], &lk), 0);
	for (uint32_t t = 0; t + 1 < GEN; t++, steps++)
		ck_assert_int_eq(llm_step(ck, argmax(lk), &lk), 0);
	ck_assert_int_eq(kv_kvtier_stat(kk, &st), 0);
	ck_assert_uint_eq(st.n_tokens, steps);
	/* The last RETIER ran at a multiple of Δ = 8 past the prompt: floor(0.1 n) then. */
	ck_assert_uint_gt(st.tier_count[3], 0);
	ck_assert_uint_le(st.tier_count[3], (uint64_t)floor(0.1 * steps));
	ck_assert_uint_ge(st.tier_count[3], (uint64_t)floor(0.1 * (steps - 8)));
	/* Each step's weights sum to 1: the daemon's total is the step count, to f32 rounding. */
	ck_assert_msg(fabs(st.score_total - steps) < 1e-3 * steps, "score_total %f, %u steps",
		      st.score_total, steps);
	llm_ctx_free(ck);
	kv_destroy(kk);
	llm_ids_free(&prompt);
}
END_TEST

START_TEST(test_daemon_killed)
{
	struct llm_ids prompt = {0};
	struct kv_backend *kk;
	struct llm_ctx *ck;
	const float *lk = NULL;
	int st, r = 0;

	ck_assert_int_eq(llm_chat_prompt(tok, NULL, "Tell me a long story about a cat.", &prompt),
			 0);
	kk = kvtier(KVT_POLICY_TIERED, 0.3f, 0.0f, (uint32_t)prompt.n, (uint32_t)prompt.n + GEN);
	ck_assert_int_eq(llm_ctx_create(model, kk, 1, &ck), 0);
	for (size_t i = 0; i < prompt.n; i++)
		ck_assert_int_eq(llm_step(ck, prompt.v[i], &lk), 0);
	for (uint32_t t = 0; t < 5; t++)
		ck_assert_int_eq(llm_step(ck, argmax(lk), &lk), 0);
	kill(D.pid, SIGKILL);
	ck_assert_int_eq(waitpid(D.pid, &st, 0), D.pid);
	D.pid = 0;
	/* Steps queue their APPEND/SCORE_ADD; the next RETIER (at most Δ = 8 steps on) submits
	 * the queue and finds the daemon gone. */
	for (uint32_t t = 0; t < 9 && r == 0; t++)
		r = llm_step(ck, argmax(lk), &lk);
	ck_assert_int_eq(r, -ECONNRESET);
	ck_assert_int_eq(llm_step(ck, 0, &lk), -ECONNRESET);
	llm_ctx_free(ck);
	kv_destroy(kk);
	llm_ids_free(&prompt);
}
END_TEST

START_TEST(test_no_daemon)
{
	struct kv_kvtier_opts o;
	struct kv_backend *kv = NULL;
	char err[256];
	int r;

	kv_kvtier_opts_default(&o);
	o.socket = "/nonexistent/kvtierd.sock";
	r = kv_kvtier_create(model->cfg.n_layer, model->cfg.n_head_kv, model->cfg.head_dim, &o, &kv,
			     err, sizeof(err));
	ck_assert_int_eq(r, -ENOENT);
	ck_assert_ptr_null(kv);
	ck_assert_ptr_nonnull(strstr(err, "cannot connect to kvtierd"));
}
END_TEST

/* Runs kvtier-llm with @argv (NULL-terminated, without argv[0]); returns the exit status and
 * stdout/stderr in @out/@err (NUL-terminated). */
static int
run_cli(const char *const *argv, char *out, size_t outlen, char *err, size_t errlen)
{
	char op[64], ep[64];
	int fo = kvt_test_tmpfile(op, sizeof(op), "llm-kvtier-out"),
	    fe = kvt_test_tmpfile(ep, sizeof(ep), "llm-kvtier-err"), st;
	const char *args[40] = {KVTIER_LLM_PATH};
	ssize_t n;
	pid_t pid;

	for (int i = 0; argv[i] && i < 38; i++)
		args[i + 1] = argv[i];
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(fo, 1);
		dup2(fe, 2);
		execv(KVTIER_LLM_PATH, (char *const *)args);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	n = pread(fo, out, outlen - 1, 0);
	out[n > 0 ? n : 0] = '\0';
	n = pread(fe, err, errlen - 1, 0);
	err[n > 0 ? n : 0] = '\0';
	close(fo);
	close(fe);
	unlink(op);
	unlink(ep);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static char out[1 << 16], err[1 << 16];

static struct json_object *
jget(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no '%s' in the JSON", key);
	return v;
}

START_TEST(test_cli_kvtier)
{
	const char *path = llm_test_model_or_skip("check_llm_kvtier");
	struct json_object *a, *b, *t;
	int64_t sum = 0;

	ck_assert_int_eq(run_cli((const char *const[]){"--model", path, "--chat", "--prompt",
						       "Tell me a long story about a cat.",
						       "--max-tokens", "60", "--json", NULL},
				 out, sizeof(out), err, sizeof(err)),
			 0);
	a = json_tokener_parse(out);
	ck_assert_ptr_nonnull(a);
	ck_assert_msg(run_cli((const char *const[]){"--model",
						    path,
						    "--chat",
						    "--prompt",
						    "Tell me a long story about a cat.",
						    "--max-tokens",
						    "60",
						    "--json",
						    "--kv",
						    "kvtier",
						    "--socket",
						    D.sock,
						    "--hbm",
						    "0.2",
						    "--evict",
						    "0",
						    "--delta",
						    "8",
						    "--window",
						    "8",
						    NULL},
			      out, sizeof(out), err, sizeof(err)) == 0,
		      "stderr: %s", err);
	b = json_tokener_parse(out);
	ck_assert_ptr_nonnull(b);
	ck_assert_str_eq(json_object_get_string(jget(b, "kv")), "kvtier");
	ck_assert_str_eq(json_object_get_string(jget(b, "policy")), "tiered");
	ck_assert_str_eq(json_object_get_string(jget(a, "text")),
			 json_object_get_string(jget(b, "text")));
	t = jget(b, "tiers");
	ck_assert_int_eq(json_object_array_length(t), 4);
	for (int i = 0; i < 4; i++)
		sum += json_object_get_int64(json_object_array_get_idx(t, i));
	ck_assert_int_eq(sum, json_object_get_int64(jget(b, "kv_positions")));
	ck_assert_int_gt(json_object_get_int64(json_object_array_get_idx(t, 1)), 0);
	ck_assert_int_eq(json_object_get_int64(json_object_array_get_idx(t, 3)), 0);
	json_object_put(a);
	json_object_put(b);

	ck_assert_int_eq(
	    run_cli((const char *const[]){"--model", path, "--prompt", "x", "--kv", "kvtier",
					  "--socket", "/nonexistent/k.sock", NULL},
		    out, sizeof(out), err, sizeof(err)),
	    1);
	ck_assert_msg(strstr(err, "cannot connect to kvtierd"), "stderr: %s", err);
}
END_TEST

START_TEST(test_cli_eval)
{
	const char *path = llm_test_model_or_skip("check_llm_kvtier");
	struct json_object *j, *rows;
	double ppl_full;
	size_t n;

	ck_assert_msg(
	    run_cli((const char *const[]){"--model", path, "--eval", "--eval-prompts", "1",
					  "--eval-tokens", "24", "--speed-tokens", "8",
					  "--speed-reps", "1", "--delta", "8", "--window", "8",
					  "--socket", D.sock, "--json", NULL},
		    out, sizeof(out), err, sizeof(err)) == 0,
	    "stderr: %s", err);
	j = json_tokener_parse(out);
	ck_assert_ptr_nonnull(j);
	ppl_full = json_object_get_double(jget(j, "ppl_full"));
	ck_assert(ppl_full >= 1.0);
	ck_assert(json_object_get_double(jget(j, "tok_s_kvtier")) > 0);
	ck_assert(json_object_get_double(jget(j, "tok_s_local")) > 0);
	rows = jget(j, "rows");
	n = json_object_array_length(rows);
	ck_assert_uint_ge(n, 16);
	for (size_t i = 0; i < n; i++) {
		struct json_object *r = json_object_array_get_idx(rows, i);
		const char *pol = json_object_get_string(jget(r, "policy"));
		double agree = json_object_get_double(jget(r, "agreement"));
		double ppl = json_object_get_double(jget(r, "ppl"));

		ck_assert(json_object_get_double(jget(r, "hbm_frac")) >= 0);
		ck_assert(agree >= 0 && agree <= 1);
		ck_assert(ppl >= 1.0);
		if ((!strcmp(pol, "full") || !strcmp(pol, "tiered")) &&
		    json_object_get_double(jget(r, "evict_frac")) == 0 &&
		    json_object_get_double(jget(r, "t2_frac")) == 0) {
			/* Proposition 1: same logits, so the same perplexity to the last digit. */
			ck_assert_msg(agree == 1.0, "row %zu: agreement %f", i, agree);
			ck_assert_msg(ppl == ppl_full, "row %zu: ppl %f != %f", i, ppl, ppl_full);
		}
	}
	json_object_put(j);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_kvtier");
	TCase *tc = tcase_create("kvtier");

	llm_test_model_or_skip("check_llm_kvtier");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_full_identical);
	tcase_add_loop_test(tc, test_tiered_evict0_identical, 0, 2);
	tcase_add_test(tc, test_shared_prefix_identical);
	tcase_add_test(tc, test_evict);
	tcase_add_test(tc, test_daemon_killed);
	tcase_add_test(tc, test_no_daemon);
	tcase_add_test(tc, test_cli_kvtier);
	tcase_add_test(tc, test_cli_eval);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
