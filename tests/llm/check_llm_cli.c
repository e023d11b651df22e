/* SPDX-License-Identifier: MIT */
/*
 * kvtier-llm's command line: --help, usage errors (exit 2 with a message), a missing model
 * (exit 1 naming tools/fetch-model.sh), and, when the model is present, one --json run.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "llm_test.h"
#include "kvt_test.h"

struct run {
	int status;
	char out[65536];
	char err[65536];
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

/* Runs kvtier-llm with @argv (NULL-terminated, without argv[0]); output goes to temp files. */
static void
run(struct run *r, const char *const *argv)
{
	char outp[64], errp[64];
	int fo = kvt_test_tmpfile(outp, sizeof(outp), "llm-cli-out"),
	    fe = kvt_test_tmpfile(errp, sizeof(errp), "llm-cli-err"), st;
	const char *args[32] = {KVTIER_LLM_PATH};
	pid_t pid;

	for (int i = 0; argv[i]; i++)
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
	ck_assert(WIFEXITED(st));
	r->status = WEXITSTATUS(st);
	lseek(fo, 0, SEEK_SET);
	lseek(fe, 0, SEEK_SET);
	slurp(fo, r->out, sizeof(r->out));
	slurp(fe, r->err, sizeof(r->err));
	close(fo);
	close(fe);
	unlink(outp);
	unlink(errp);
}

static struct run r;

START_TEST(test_help)
{
	run(&r, (const char *const[]){"--help", NULL});
	ck_assert_int_eq(r.status, 0);
	ck_assert_ptr_nonnull(strstr(r.out, "Usage: kvtier-llm"));
	ck_assert_ptr_nonnull(strstr(r.out, "--max-tokens"));
}
END_TEST

static const struct {
	const char *argv[12];
	const char *msg;
} bad[] = {
    {{NULL}, "--prompt is required"},
    {{"--bogus", NULL}, "unknown option '--bogus'"},
    {{"--prompt", "x", "--max-tokens", "abc", NULL}, "--max-tokens"},
    {{"--prompt", "x", "--temp", "-1", NULL}, "--temp"},
    {{"--prompt", "x", "--top-p", "0", NULL}, "--top-p"},
    {{"--prompt", "x", "--threads", "0", NULL}, "--threads"},
    {{"--prompt", "x", "--system", "s", NULL}, "--system only"},
    {{"--prompt", "x", "extra", NULL}, "unexpected argument 'extra'"},
    {{"--prompt", NULL}, "needs a value"},
    {{"--prompt", "x", "--kv", "gpu", NULL}, "--kv wants local or kvtier"},
    {{"--prompt", "x", "--kv", "kvtier", "--policy", "lru", NULL}, "--policy wants"},
    {{"--prompt", "x", "--kv", "kvtier", "--hbm", "1.5", NULL}, "--hbm wants a number"},
    {{"--prompt", "x", "--kv", "kvtier", "--delta", "0", NULL}, "--delta wants 1.."},
    {{"--prompt", "x", "--kv", "kvtier", "--hbm", "0.6", "--evict", "0.5", NULL},
     "must not exceed 1"},
    {{"--prompt", "x", "--policy", "h2o", NULL}, "need --kv kvtier"},
    {{"--prompt", "x", "--quick", NULL}, "go with --eval"},
    {{"--eval", "--prompt", "x", NULL}, "--eval takes no --prompt"},
    {{"--eval", "--jobs", "0", NULL}, "--jobs wants 1.."},
    {{"--prompt", "x", "--share-prefix", NULL}, "need --kv kvtier"},
    {{"--prompt", "x", "--kv", "kvtier", "--block-tokens", "8", NULL}, "goes with --share-prefix"},
    {{"--prompt", "x", "--kv", "kvtier", "--share-prefix", "--block-tokens", "0", NULL},
     "--block-tokens wants 1..1024"},
    {{"--prompt", "x", "--kv", "kvtier", "--share-prefix", "--block-tokens", "1025", NULL},
     "--block-tokens wants 1..1024"},
    {{"--prompt", "x", "--kv", "kvtier", "--share-prefix", "--dump-kv", "f", NULL},
     "--dump-kv records every prompt step"},
    {{"--eval", "--share-prefix", NULL}, "--eval takes no"},
    {{"--prompt", "x", "--json=1", NULL}, "option '--json' takes no value"},
    {{"--prompt", "x", "-j", NULL}, "option '-j' needs a value"},
};

START_TEST(test_bad_usage)
{
	run(&r, bad[_i].argv);
	ck_assert_int_eq(r.status, 2);
	ck_assert_msg(strstr(r.err, bad[_i].msg), "stderr '%s' lacks '%s'", r.err, bad[_i].msg);
	ck_assert_ptr_nonnull(strstr(r.err, "--help"));
}
END_TEST

START_TEST(test_missing_model)
{
	run(&r, (const char *const[]){"--model", "/nonexistent/m.gguf", "--prompt", "x", NULL});
	ck_assert_int_eq(r.status, 1);
	ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/m.gguf"));
	ck_assert_ptr_nonnull(strstr(r.err, "tools/fetch-model.sh"));
}
END_TEST

START_TEST(test_not_gguf)
{
	run(&r, (const char *const[]){"--model", "/proc/self/cmdline", "--prompt", "x", NULL});
	ck_assert_int_eq(r.status, 1);
	ck_assert_ptr_nonnull(strstr(r.err, "cannot load"));
}
END_TEST

START_TEST(test_json_run)
{
	struct json_object *j, *v;

	if (llm_default_model_path(llm_test_path, sizeof(llm_test_path)) < 0 ||
	    access(llm_test_path, R_OK) < 0) {
		fprintf(stderr, "check_llm_cli: model absent, --json run not checked\n");
		return;
	}
	run(&r,
	    (const char *const[]){"--model", llm_test_path, "--prompt", "The capital of France is",
				  "--max-tokens", "4", "--json", NULL});
	ck_assert_msg(r.status == 0, "stderr: %s", r.err);
	j = json_tokener_parse(r.out);
	ck_assert_ptr_nonnull(j);
	ck_assert(json_object_object_get_ex(j, "generated_tokens", &v));
	ck_assert_int_eq(json_object_get_int(v), 4);
	ck_assert(json_object_object_get_ex(j, "prompt_tokens", &v));
	ck_assert_int_eq(json_object_get_int(v), 5);
	ck_assert(json_object_object_get_ex(j, "text", &v));
	ck_assert_str_eq(json_object_get_string(v), " Paris.\n\n");
	ck_assert(json_object_object_get_ex(j, "decode_tokens_per_s", &v));
	ck_assert(json_object_get_double(v) > 0.0);
	ck_assert(json_object_object_get_ex(j, "kv_positions", &v));
	ck_assert_int_eq(json_object_get_int(v), 5 + 3); /* the last token is never stepped */
	json_object_put(j);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_cli");
	TCase *tc = tcase_create("cli");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_help);
	tcase_add_loop_test(tc, test_bad_usage, 0, sizeof(bad) / sizeof(bad[0]));
	tcase_add_test(tc, test_missing_model);
	tcase_add_test(tc, test_not_gguf);
	tcase_add_test(tc, test_json_run);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
