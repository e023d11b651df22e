/* SPDX-License-Identifier: MIT */
/*
 * Prefix sharing across processes with the real model (kvtier-llm --share-prefix, docs/prefix.md):
 * processes run one after the other against one kvtierd.
 *   1. A, cold: nothing to share yet; it computes its whole prompt and publishes its full blocks.
 *   2. B, the same prompt: it opens from A's blocks (every full block but the one holding the last
 *      prompt token, whose logits it needs), computes only the rest, and generates exactly A's
 *      tokens; its sequence holds only the rows it computed itself.
 *   3. C, a prompt that shares only a first part with A's, against the same prompt run without
 *      sharing: a partial match (the blocks before the first differing token), the same tokens.
 * Then the pool holds the shared blocks once: A's and C's new ones, nothing else.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "generate.h"
#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_test.h"
#include "llm_test.h"

#define GEN "16"
#define BT  16 /* the default block size */

static const char *model_path;

/* About 170 tokens both prompts share, then a question of their own. */
#define DOC                                                                                        \
	"The history of the steam engine begins in the first century, when Hero of Alexandria "    \
	"described the aeolipile, a sphere that spun when steam escaped from two bent nozzles. "   \
	"Centuries later, Thomas Savery and Thomas Newcomen built engines to pump water out of "   \
	"flooded mines, and James Watt improved them with a separate condenser that saved most "   \
	"of the fuel they burned. Engines then drove mills, looms and pumps, and soon railways "   \
	"and ships: Richard Trevithick ran a locomotive on rails in 1804, George Stephenson's "    \
	"Rocket won the Rainhill trials in 1829, and steamships crossed the Atlantic a few years " \
	"later. By the end of the century steam turbines, invented by Charles Parsons, were "      \
	"turning the generators of the first power stations."

static const char *const prompt_a = DOC " Question: who added the separate condenser? Answer:";
static const char *const prompt_c =
    DOC " Question: what did Hero of Alexandria build, what made it "
	"spin, and was it ever used to do any useful work? Answer:";

/* Runs kvtier-llm on @prompt (with --share-prefix if @share) to its end; its JSON output. */
static struct json_object *
run_llm(const char *sock, const char *prompt, int share)
{
	static char buf[1 << 16];
	size_t len = 0;
	struct json_object *doc;
	int p[2], st;
	pid_t pid;

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(p[1], 1);
		execl(KVTIER_LLM_PATH, "kvtier-llm", "--model", model_path, "--prompt", prompt,
		      "--max-tokens", GEN, "--json", "--kv", "kvtier", "--socket", sock,
		      share ? "--share-prefix" : (char *)NULL, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	for (;;) {
		ssize_t n = read(p[0], buf + len, sizeof(buf) - 1 - len);

		ck_assert_int_ge(n, 0);
		if (!n)
			break;
		len += (size_t)n;
		ck_assert_uint_lt(len, sizeof(buf) - 1);
	}
	close(p[0]);
	buf[len] = '\0';
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvtier-llm status %d", st);
	doc = json_tokener_parse(buf);
	ck_assert_msg(doc, "kvtier-llm printed no JSON: %s", buf);
	return doc;
}

static const char *
jstr(struct json_object *o, const char *k)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, k, &v), "no '%s' in %s", k,
		      json_object_to_json_string(o));
	return json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
}

static int64_t
ji(struct json_object *o, const char *k)
{
	int64_t v = json_get_i64(o, k);

	ck_assert_msg(v >= 0, "no '%s' in %s", k, json_object_to_json_string(o));
	return v;
}

/* The two prompts' token ids as kvtier-llm builds them: their lengths and common prefix. */
static void
prompt_ids(size_t *ret_na, size_t *ret_nc, size_t *ret_common)
{
	struct llm_model *m;
	struct llm_tok *t;
	struct llm_ids a = {0}, c = {0};
	char err[256];
	size_t i = 0;

	ck_assert_int_eq(llm_model_load(model_path, &m, err, sizeof(err)), 0);
	ck_assert_int_eq(llm_tok_load(m->gguf, &t, err, sizeof(err)), 0);
	ck_assert_int_eq(llm_plain_prompt(t, m->gguf, prompt_a, &a), 0);
	ck_assert_int_eq(llm_plain_prompt(t, m->gguf, prompt_c, &c), 0);
	while (i < a.n && i < c.n && a.v[i] == c.v[i])
		i++;
	*ret_na = a.n;
	*ret_nc = c.n;
	*ret_common = i;
	llm_ids_free(&a);
	llm_ids_free(&c);
	llm_tok_free(t);
	llm_model_free(m);
}

/* Sessions end asynchronously after their process exits: wait until the daemon has none. */
static void
wait_no_sessions(const char *sock)
{
	for (int i = 0; i < 1000; i++) {
		struct json_object *o = admin_request(sock, KVT_CTL_STATUS);
		int64_t n;

		ck_assert_ptr_nonnull(o);
		n = json_get_i64(o, "sessions");
		json_object_put(o);
		if (n == 0)
			return;
		usleep(10000);
	}
	ck_abort_msg("kvtierd still has sessions 10 s after its clients exited");
}

START_TEST(t_share_across_processes)
{
	static const char *const extra[] = {"--pool-size", "256M", NULL};
	struct kvtd_proc d;
	struct json_object *a, *b, *c, *c_ref;
	size_t na, nc, common;
	int64_t tb, matched, shared_blocks;

	prompt_ids(&na, &nc, &common);
	ck_assert_uint_ge(na, 100);
	ck_assert_uint_ge(common, 2 * BT);
	ck_assert_uint_lt(common / BT, (nc - 1) / BT); /* C matches only a part */
	daemon_start(&d, extra);
	ck_assert_int_eq(pool_used(d.sock), 0);

	/* A: cold, publishes every full block of its prompt */
	a = run_llm(d.sock, prompt_a, 1);
	ck_assert_int_eq(ji(a, "prompt_tokens"), (int64_t)na);
	ck_assert_int_eq(ji(a, "matched_tokens"), 0);
	ck_assert_int_eq(ji(a, "prefill_tokens"), (int64_t)na);
	ck_assert_int_eq(ji(a, "block_tokens"), BT);
	ck_assert_int_eq(ji(a, "published_blocks"), (int64_t)(na / BT));
	ck_assert_int_eq(ji(a, "published_new_blocks"), (int64_t)(na / BT));
	ck_assert_int_eq(ji(a, "generated_tokens"), 16);
	tb = ji(a, "kv_bytes_per_token");
	/* the published rows are the store's, the rest is A's */
	ck_assert_int_eq(ji(a, "pool_bytes"),
			 (ji(a, "kv_positions") - (int64_t)(na / BT) * BT) * tb);

	/* B: same prompt, computes only what follows the shared blocks */
	b = run_llm(d.sock, prompt_a, 1);
	matched = (int64_t)((na - 1) / BT) * BT;
	ck_assert_int_eq(ji(b, "matched_tokens"), matched);
	ck_assert_int_gt(matched, 0);
	ck_assert_int_eq(ji(b, "prefill_tokens"), (int64_t)na - matched);
	ck_assert_str_eq(jstr(b, "tokens"), jstr(a, "tokens"));
	ck_assert_str_eq(jstr(b, "text"), jstr(a, "text"));
	ck_assert_str_eq(jstr(b, "namespace"), jstr(a, "namespace"));
	ck_assert_int_eq(ji(b, "published_blocks"), (int64_t)(na / BT));
	ck_assert_int_eq(ji(b, "published_new_blocks"), 0);
	ck_assert_int_eq(ji(b, "kv_positions"), ji(a, "kv_positions"));
	/* B's sequence holds only the rows it computed past the prompt's full blocks */
	ck_assert_int_eq(ji(b, "pool_bytes"),
			 (ji(b, "kv_positions") - (int64_t)(na / BT) * BT) * tb);
	ck_assert_int_lt(ji(b, "pool_bytes"), ji(b, "kv_positions") * tb);

	/* C: another question on the same document, against its own run without sharing */
	c_ref = run_llm(d.sock, prompt_c, 0);
	ck_assert_int_eq(ji(c_ref, "pool_bytes"), ji(c_ref, "kv_positions") * tb);
	ck_assert_int_eq(ji(c_ref, "prefill_tokens"), (int64_t)nc);
	c = run_llm(d.sock, prompt_c, 1);
	matched = (int64_t)(common / BT) * BT;
	ck_assert_int_eq(ji(c, "matched_tokens"), matched);
	ck_assert_int_eq(ji(c, "prefill_tokens"), (int64_t)nc - matched);
	ck_assert_str_eq(jstr(c, "tokens"), jstr(c_ref, "tokens"));
	ck_assert_str_eq(jstr(c, "text"), jstr(c_ref, "text"));
	ck_assert_int_eq(ji(c, "published_blocks"), (int64_t)(nc / BT));
	ck_assert_int_eq(ji(c, "published_new_blocks"), (int64_t)(nc / BT - common / BT));

	/* everyone gone: the pool holds each shared block once and nothing else */
	wait_no_sessions(d.sock);
	shared_blocks = (int64_t)(na / BT + nc / BT - common / BT);
	ck_assert_int_eq(pool_used(d.sock), shared_blocks * BT * tb);
	ck_assert_int_eq(daemon_stop(&d), 0);
	json_object_put(a);
	json_object_put(b);
	json_object_put(c);
	json_object_put(c_ref);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_prefix");
	TCase *tc = tcase_create("llm_prefix");

	model_path = llm_test_model_or_skip("check_llm_prefix");
	tcase_set_timeout(tc, 1800);
	tcase_add_test(tc, t_share_across_processes);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
