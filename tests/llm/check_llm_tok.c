/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer with the real SmolLM2 vocabulary: encode then decode gives the text back, and the
 * ids match those of Hugging Face `tokenizers` (BPE from the same vocab/merges with the
 * SmolLM2 pre-tokenizer: Digits(individual_digits) + ByteLevel(add_prefix_space=False)),
 * recorded once and pinned here. Skips (77) when the model is absent.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "llm_test.h"
#include "kvt_test.h"

static struct llm_model *model;
static struct llm_tok *tok;

static void
setup(void)
{
	char err[256];

	ck_assert_msg(llm_model_load(llm_test_path, &model, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(llm_tok_load(model->gguf, &tok, err, sizeof(err)) == 0, "%s", err);
}

static void
teardown(void)
{
	llm_tok_free(tok);
	llm_model_free(model);
}

static const char *const texts[] = {
    "Hello world",
    "The capital of France is Paris.",
    "I've been to 1984 places, they're 3.14159 times better!",
    "  leading spaces and    multiple   gaps  ",
    "line one\nline two\n\n  indented\ttab",
    "Ünïcödé façade — naïve café, 日本語のテキスト, emoji 🎉🚀 and math ∑x²",
    "don't won't it's we'll I'm you'd THEY'RE",
    "def foo(x):\n    return x**2 + 1  # comment",
    "   \n\n\n   ",
    "$100.00 @user #tag https://example.com/path?q=1&r=2",
    "invalid utf-8: \xc3\x28 \xe2\x82 end",
    "",
};

START_TEST(test_roundtrip)
{
	const char *s = texts[_i];
	struct llm_ids ids = {0};
	char *back;

	ck_assert_int_eq(llm_tok_encode(tok, s, strlen(s), false, &ids), 0);
	back = llm_tok_decode(tok, ids.v, ids.n, false);
	ck_assert_ptr_nonnull(back);
	ck_assert_str_eq(back, s);
	if (*s)
		ck_assert_uint_gt(ids.n, 0);
	for (size_t i = 0; i < ids.n; i++)
		ck_assert_int_eq(llm_tok_type(tok, ids.v[i]), LLM_TOK_NORMAL);
	free(back);
	llm_ids_free(&ids);
}
END_TEST

struct known {
	const char *text;
	uint32_t n;
	uint32_t ids[40];
};

/* From Hugging Face tokenizers 0.23 over the GGUF's vocab and merges (see the file comment). */
static const struct known known[] = {
    {"Hello world", 2, {19556, 905}},
    {"The capital of France is Paris.", 7, {504, 3575, 282, 4649, 314, 7042, 30}},
    {"I've been to 1984 places, they're 3.14159 times better!",
     24,
     {57,   3543, 719, 288, 216, 33, 41, 40, 36, 3373, 28,   502,
      2316, 216,  35,  30,  33,	 36, 33, 37, 41, 1711, 1365, 17}},
    {"line one\nline two\n\n  indented\ttab",
     10,
     {1311, 582, 198, 1311, 827, 8866, 641, 6574, 197, 15999}},
    {"def foo(x):\n    return x**2 + 1  # comment",
     16,
     {1604, 29856, 24, 104, 727, 472, 1003, 1792, 828, 34, 1232, 216, 33, 216, 907, 5189}},
};

START_TEST(test_known_ids)
{
	for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
		struct llm_ids ids = {0};

		ck_assert_int_eq(
		    llm_tok_encode(tok, known[k].text, strlen(known[k].text), false, &ids), 0);
		ck_assert_uint_eq(ids.n, known[k].n);
		for (uint32_t i = 0; i < known[k].n; i++)
			ck_assert_msg(ids.v[i] == known[k].ids[i], "'%s' id %u: %u != %u",
				      known[k].text, i, ids.v[i], known[k].ids[i]);
		llm_ids_free(&ids);
	}
}
END_TEST

START_TEST(test_digits_split)
{
	struct llm_ids ids = {0};

	/* SmolLM2's pre-tokenizer isolates every digit: 12345 is five tokens "1".."5". */
	ck_assert_int_eq(llm_tok_encode(tok, "12345", 5, false, &ids), 0);
	ck_assert_uint_eq(ids.n, 5);
	for (int i = 0; i < 5; i++) {
		char c[4];

		ck_assert_int_eq(llm_tok_piece(tok, ids.v[i], false, c, sizeof(c)), 1);
		ck_assert_int_eq(c[0], '1' + i);
	}
	llm_ids_free(&ids);
}
END_TEST

/*
 * Bytes that the vocabulary has no byte-level token for (SmolLM2 lacks 0xC0, 0xC1, 0xF5..0xFF,
 * which never occur in UTF-8, and a few C0 controls) are dropped, as they cannot be encoded.
 */
START_TEST(test_unencodable_bytes)
{
	struct llm_ids ids = {0};
	char *back;

	ck_assert_int_eq(llm_tok_encode(tok,
					"a\xff\xfe"
					"b",
					4, false, &ids),
			 0);
	back = llm_tok_decode(tok, ids.v, ids.n, false);
	ck_assert_str_eq(back, "ab");
	free(back);
	llm_ids_free(&ids);
}
END_TEST

START_TEST(test_specials)
{
	const char *s = "<|im_start|>user\nhi<|im_end|>";
	int start = llm_tok_find(tok, "<|im_start|>"), end = llm_tok_find(tok, "<|im_end|>");
	struct llm_ids ids = {0};
	char *back;

	ck_assert_int_eq(start, 1);
	ck_assert_int_eq(end, 2);
	ck_assert_int_eq(llm_tok_eos(tok), 2);
	ck_assert(llm_tok_is_eog(tok, 2));
	ck_assert(llm_tok_is_eog(tok, 0)); /* <|endoftext|> */
	ck_assert(!llm_tok_is_eog(tok, 1));
	ck_assert_int_eq(llm_tok_type(tok, 1), LLM_TOK_CONTROL);

	/* Parsed as specials: the control ids appear, and decode drops them unless asked. */
	ck_assert_int_eq(llm_tok_encode(tok, s, strlen(s), true, &ids), 0);
	ck_assert_uint_eq(ids.v[0], 1);
	ck_assert_uint_eq(ids.v[ids.n - 1], 2);
	back = llm_tok_decode(tok, ids.v, ids.n, false);
	ck_assert_str_eq(back, "user\nhi");
	free(back);
	back = llm_tok_decode(tok, ids.v, ids.n, true);
	ck_assert_str_eq(back, s);
	free(back);
	llm_ids_free(&ids);

	/* Not parsed: the same text is plain text and round-trips as such. */
	ck_assert_int_eq(llm_tok_encode(tok, s, strlen(s), false, &ids), 0);
	for (size_t i = 0; i < ids.n; i++)
		ck_assert_int_eq(llm_tok_type(tok, ids.v[i]), LLM_TOK_NORMAL);
	back = llm_tok_decode(tok, ids.v, ids.n, false);
	ck_assert_str_eq(back, s);
	free(back);
	llm_ids_free(&ids);
}
END_TEST

START_TEST(test_chat_prompt)
{
	struct llm_ids ids = {0};
	char *text;

	ck_assert_int_eq(llm_chat_prompt(tok, NULL, "Hi there", &ids), 0);
	text = llm_tok_decode(tok, ids.v, ids.n, true);
	ck_assert_str_eq(text, "<|im_start|>system\n" LLM_DEFAULT_SYSTEM "<|im_end|>\n"
			       "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
	free(text);
	llm_ids_free(&ids);

	ck_assert_int_eq(llm_chat_prompt(tok, "", "<|im_end|>", &ids), 0);
	text = llm_tok_decode(tok, ids.v, ids.n, true);
	ck_assert_str_eq(text, "<|im_start|>user\n<|im_end|><|im_end|>\n<|im_start|>assistant\n");
	/* The user's "<|im_end|>" is text, not the control token: 3 control ids in all. */
	{
		int ctl = 0;

		for (size_t i = 0; i < ids.n; i++)
			ctl += llm_tok_type(tok, ids.v[i]) == LLM_TOK_CONTROL;
		ck_assert_int_eq(ctl, 3);
	}
	free(text);
	llm_ids_free(&ids);
}
END_TEST

int
main(void)
{
	Suite *s = suite_create("llm_tok");
	TCase *tc = tcase_create("tok");

	llm_test_model_or_skip("check_llm_tok");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_roundtrip, 0, sizeof(texts) / sizeof(texts[0]));
	tcase_add_test(tc, test_known_ids);
	tcase_add_test(tc, test_digits_split);
	tcase_add_test(tc, test_unencodable_bytes);
	tcase_add_test(tc, test_specials);
	tcase_add_test(tc, test_chat_prompt);
	suite_add_tcase(s, tc);
	return kvt_check_run(s);
}
