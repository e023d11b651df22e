/* SPDX-License-Identifier: MIT */
/*
 * Restart in place under real generation: two `kvtier-llm --kv kvtier` processes generate
 * through one kvtierd (host backend) that is restarted three times while they generate (at a
 * quarter, a half and three quarters of their tokens, read from the daemon's SEQS) and once more
 * while both hold their sequences open after generating. Each process's tokens, text and tier
 * counts must equal those of the same command on a kvtierd never restarted, the held restart
 * must leave `status` pool bytes, every sequence's tier counts and the daemon's descriptor count
 * as they were, and the daemon keeps its pid throughout.
 *
 * Tokens per process: $KVT_RESTART_TOKENS, default 96 so that CI stays within about two
 * minutes on two cores (four generations); the full acceptance run is
 * KVT_RESTART_TOKENS=512 (docs/design.md, "Restart and crash").
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "llm_test.h"
#include "kvt_test.h"

static const char *model_path;
static unsigned ntok = 96;

static const char *const prompts[2] = {
    "Tell me a long story about a cat.",
    "Explain how a steam engine works, step by step.",
};

struct gen {
	pid_t pid;
	int out; /* its stdout */
	char buf[1 << 16];
	size_t len;
	struct json_object *doc;
};

static void
gen_start(struct gen *g, const char *sock, int which, int hold)
{
	char tokens[16];
	int p[2];

	snprintf(tokens, sizeof(tokens), "%u", ntok);
	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	memset(g, 0, sizeof(*g));
	g->pid = fork();
	ck_assert_int_ge(g->pid, 0);
	if (g->pid == 0) {
		dup2(p[1], 1);
		execl(KVTIER_LLM_PATH, "kvtier-llm", "--model", model_path, "--chat", "--prompt",
		      prompts[which], "--max-tokens", tokens, "--json", "--kv", "kvtier",
		      "--socket", sock, "--hbm", "0.3", "--evict", "0.05", "--t2", "0.2", "--delta",
		      "8", "--window", "8", "--hold-seconds", hold ? "600" : "0", (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	g->out = p[0];
}

/* Reads its stdout until it holds one whole JSON object (printed before any hold). */
static void
gen_output(struct gen *g)
{
	while (!g->doc) {
		ssize_t n;

		ck_assert_uint_lt(g->len, sizeof(g->buf) - 1);
		n = read(g->out, g->buf + g->len, sizeof(g->buf) - 1 - g->len);
		ck_assert_msg(n > 0, "kvtier-llm %d ended without its JSON", (int)g->pid);
		g->len += (size_t)n;
		g->buf[g->len] = '\0';
		if (strchr(g->buf, '\n'))
			g->doc = json_tokener_parse(g->buf);
	}
}

/* Exit status (a held one is ended by SIGTERM: its output is complete already). */
static void
gen_end(struct gen *g, int held)
{
	int st;

	gen_output(g);
	if (held)
		kill(g->pid, SIGTERM);
	ck_assert_int_eq(waitpid(g->pid, &st, 0), g->pid);
	if (held)
		ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "status %d", st);
	else
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvtier-llm status %d", st);
	close(g->out);
}

/* Tokens of the session's only sequence, per session id (0: not open yet). */
static void
seq_tokens(const char *sock, int64_t *ret_n, unsigned n_ret)
{
	struct json_object *o = admin_request(sock, KVT_CTL_SEQS), *a;

	for (unsigned i = 0; i < n_ret; i++)
		ret_n[i] = 0;
	ck_assert_ptr_nonnull(o);
	ck_assert(json_object_object_get_ex(o, "seqs", &a));
	for (size_t i = 0; i < json_object_array_length(a) && i < n_ret; i++) {
		ret_n[i] = json_get_i64(json_object_array_get_idx(a, i), "tokens");
		ck_assert_msg(ret_n[i] >= 0, "SEQS has no \"tokens\": %s",
			      json_object_to_json_string(o));
	}
	json_object_put(o);
}

/* Waits (polling the daemon's SEQS) until both sequences hold at least @n tokens. */
static void
wait_tokens(const char *sock, int64_t n, struct gen *g)
{
	for (;;) {
		int64_t t[2];
		int st;

		seq_tokens(sock, t, 2);
		if (t[0] >= n && t[1] >= n)
			return;
		for (int i = 0; i < 2; i++) {
			struct pollfd p = {.fd = g[i].out, .events = POLLIN};

			/* one already past @n may have finished and be holding: only a process
			 * short of @n must still be generating */
			if (t[i] >= n)
				continue;
			ck_assert_msg(waitpid(g[i].pid, &st, WNOHANG) == 0,
				      "kvtier-llm %d ended before %lld tokens", (int)g[i].pid,
				      (long long)n);
			/* its JSON is out: it finished generating short of the restart point */
			ck_assert_msg(poll(&p, 1, 0) == 0,
				      "kvtier-llm %d finished before %lld tokens", (int)g[i].pid,
				      (long long)n);
		}
		usleep(20000);
	}
}

static void
restart(struct kvtd_proc *d, int sessions)
{
	struct json_object *o = admin_request(d->sock, KVT_CTL_RESTART), *v;

	ck_assert_msg(o, "no reply to RESTART (log %s)", d->log);
	ck_assert_msg(json_object_object_get_ex(o, "restarted", &v) && json_object_get_boolean(v),
		      "RESTART: %s", json_object_to_json_string(o));
	ck_assert_int_eq(json_get_i64(o, "pid"), d->pid);
	ck_assert_int_eq(json_get_i64(o, "sessions"), sessions);
	json_object_put(o);
}

static const char *
jstr(struct json_object *o, const char *k)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, k, &v), "no '%s'", k);
	return json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
}

START_TEST(t_generate_through_restarts)
{
	static const char *const extra[] = {"--pool-size", "256M", NULL};
	struct kvtd_proc d;
	struct gen g[2], ref[2];
	struct json_object *before, *after;
	struct kvtd_usage u0, u1;
	int64_t used0, used1;

	/* Uninterrupted. */
	daemon_start(&d, extra);
	gen_start(&ref[0], d.sock, 0, 0);
	gen_start(&ref[1], d.sock, 1, 0);
	gen_end(&ref[0], 0);
	gen_end(&ref[1], 0);
	ck_assert_int_eq(daemon_stop(&d), 0);

	/* Restarted three times while generating, once while holding. */
	daemon_start(&d, extra);
	gen_start(&g[0], d.sock, 0, 1);
	gen_start(&g[1], d.sock, 1, 1);
	for (int k = 1; k <= 3; k++) {
		wait_tokens(d.sock, 30 + (int64_t)ntok * k / 4, g);
		restart(&d, 2);
	}
	gen_output(&g[0]);
	gen_output(&g[1]);
	/* Both hold their sequence: nothing moves, a restart must change nothing. */
	before = admin_request(d.sock, KVT_CTL_SEQS);
	used0 = pool_used(d.sock);
	u0 = daemon_usage(&d);
	restart(&d, 2);
	after = admin_request(d.sock, KVT_CTL_SEQS);
	used1 = pool_used(d.sock);
	u1 = daemon_usage(&d);
	ck_assert_int_gt(used0, 0);
	ck_assert_int_eq(used1, used0);
	ck_assert_int_eq(u1.fds, u0.fds);
	ck_assert_str_eq(json_object_to_json_string(before), json_object_to_json_string(after));
	json_object_put(before);
	json_object_put(after);
	gen_end(&g[0], 1);
	gen_end(&g[1], 1);
	ck_assert_int_eq(daemon_stop(&d), 0);

	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(json_get_i64(g[i].doc, "generated_tokens"), ntok);
		ck_assert_str_eq(jstr(g[i].doc, "tokens"), jstr(ref[i].doc, "tokens"));
		ck_assert_str_eq(jstr(g[i].doc, "text"), jstr(ref[i].doc, "text"));
		ck_assert_str_eq(jstr(g[i].doc, "tiers"), jstr(ref[i].doc, "tiers"));
		json_object_put(g[i].doc);
		json_object_put(ref[i].doc);
	}
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_restart");
	TCase *tc = tcase_create("llm_restart");
	const char *e = getenv("KVT_RESTART_TOKENS");

	model_path = llm_test_model_or_skip("check_llm_restart");
	if (e && atoi(e) >= 40)
		ntok = (unsigned)atoi(e);
	tcase_set_timeout(tc, 3600);
	tcase_add_test(tc, t_generate_through_restarts);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
