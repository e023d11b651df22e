/* SPDX-License-Identifier: MIT */
/*
 * kvt_cli.h - a tool's command-line options described once. One row per option holds its long
 * name, short letter, value, help text and how it applies to the tool's options; getopt_long's
 * table, the short-option string, the usage text and the option lists of messages are derived
 * from the rows, so an option cannot be parsed and not documented, or documented under another
 * name. Header only, for the programs in tools/ (kvtierd's options are rows of its config
 * table, daemon/config.c).
 *
 * A tool declares its rows and one struct kvt_cli, then calls kvt_cli_parse(); --help is a row
 * like any other (kvt_cli_help()). Not thread-safe: getopt_long keeps global state.
 */
#ifndef KVT_CLI_H
#define KVT_CLI_H

#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVT_CLI_MAX_OPTS 64

struct kvt_cli;
struct kvt_cli_opt;

/* Applies @arg (NULL for an option without a value) to the tool's options @o. Returns 0, or
 * -EINVAL after printing one line to stderr that starts "prog: " and names the option. */
typedef int (*kvt_cli_apply_fn)(const struct kvt_cli *cli, const struct kvt_cli_opt *d,
				const char *arg, void *o);

struct kvt_cli_opt {
	const char *name;	/* long name without "--"; NULL ends the table */
	char short_opt;		/* -X as well; 0: the long name only */
	const char *arg;	/* the value's name in the usage text ("N"); NULL: takes none */
	const char *help;	/* usage text; '\n' starts a continuation line */
	const char *heading;	/* a section title printed above this row, after a blank line */
	kvt_cli_apply_fn apply; /* kvt_cli_flag() and the others below, or the tool's own */
	size_t off;		/* the member of the tool's options that apply sets (offsetof) */
	double min, max;	/* its range, for the integer and number apply functions below */
	unsigned group; /* the tool's own bits: options checked together (kvt_cli_names()) */
};

struct kvt_cli {
	const char *prog;		/* messages start "prog: " */
	const char *intro;		/* usage text above the options, ending in '\n' */
	const char *outro;		/* below them, after a blank line; NULL: none */
	const struct kvt_cli_opt *opts; /* at most KVT_CLI_MAX_OPTS rows, then one with name NULL */
};

/* Column the help text starts in, in the usage text. */
#define KVT_CLI_HELP_COL 24

/* The usage text: intro, one entry per row ("  -X, --name ARG   help"), outro. */
static inline void
kvt_cli_usage(const struct kvt_cli *cli, FILE *f)
{
	fputs(cli->intro, f);
	for (const struct kvt_cli_opt *d = cli->opts; d->name; d++) {
		char left[64];
		const char *h = d->help ? d->help : "";
		int n;

		if (d->heading)
			fprintf(f, "\n%s\n", d->heading);
		n = snprintf(left, sizeof(left), "  %c%c%c --%s%s%s", d->short_opt ? '-' : ' ',
			     d->short_opt ? d->short_opt : ' ', d->short_opt ? ',' : ' ', d->name,
			     d->arg ? " " : "", d->arg ? d->arg : "");
		fprintf(f, "%s%*s", left, n < KVT_CLI_HELP_COL - 1 ? KVT_CLI_HELP_COL - n : 2, "");
		for (const char *nl; (nl = strchr(h, '\n')); h = nl + 1)
			fprintf(f, "%.*s\n%*s", (int)(nl - h), h, KVT_CLI_HELP_COL, "");
		fprintf(f, "%s\n", h);
	}
	if (cli->outro)
		fprintf(f, "\n%s", cli->outro);
}

/* "--a, --b and --c": the rows whose group has a bit of @group, for messages. */
static inline const char *
kvt_cli_names(const struct kvt_cli *cli, unsigned group, char *buf, size_t len)
{
	const struct kvt_cli_opt *d;
	unsigned n = 0, i = 0;
	size_t at = 0;

	buf[0] = '\0';
	for (d = cli->opts; d->name; d++)
		n += (d->group & group) != 0;
	for (d = cli->opts; d->name && at < len; d++) {
		if (!(d->group & group))
			continue;
		i++;
		at += (size_t)snprintf(buf + at, len - at, "%s--%s",
				       i == 1	? ""
				       : i == n ? " and "
						: ", ",
				       d->name);
	}
	return buf;
}

/* The row getopt_long returned @c for (its short letter, or 256 + its index). */
static inline const struct kvt_cli_opt *
kvt_cli_row(const struct kvt_cli *cli, int c)
{
	for (int i = 0; cli->opts[i].name; i++)
		if ((cli->opts[i].short_opt && cli->opts[i].short_opt == c) || 256 + i == c)
			return &cli->opts[i];
	return NULL;
}

/*
 * kvt_cli_parse() - apply every option of @argv to @o, each through its row's apply function,
 * in the order given; the group bits of the options given are ORed into @ret_groups (NULL: not
 * wanted). Options and operands may mix; optind then indexes the first operand. Returns 0, or
 * -EINVAL after one line on stderr: an unknown option, a missing value, or apply's refusal.
 */
static inline int
kvt_cli_parse(const struct kvt_cli *cli, int argc, char **argv, void *o, unsigned *ret_groups)
{
	struct option lo[KVT_CLI_MAX_OPTS + 1];
	char shorts[2 * KVT_CLI_MAX_OPTS + 2], *sp = shorts;
	const struct kvt_cli_opt *d;
	int i, c, r;

	*sp++ = ':'; /* a missing value is ':', not '?' */
	for (i = 0; cli->opts[i].name && i < KVT_CLI_MAX_OPTS; i++) {
		d = &cli->opts[i];
		lo[i] = (struct option){d->name, d->arg ? required_argument : no_argument, NULL,
					d->short_opt ? d->short_opt : 256 + i};
		if (d->short_opt) {
			*sp++ = d->short_opt;
			if (d->arg)
				*sp++ = ':';
		}
	}
	lo[i] = (struct option){0};
	*sp = '\0';
	opterr = 0; /* the messages below, prefixed "prog:" */
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		d = c == ':' || c == '?' ? NULL : kvt_cli_row(cli, c);
		if (!d) {
			/* a long option is named by its argv word, a short one by optopt */
			const char *w = argv[optind - 1];

			if (!strncmp(w, "--", 2) && c == '?' && optopt && kvt_cli_row(cli, optopt))
				fprintf(stderr, "%s: option '%.*s' takes no value\n", cli->prog,
					(int)strcspn(w, "="), w);
			else if (!strncmp(w, "--", 2))
				fprintf(stderr, "%s: %s '%.*s'%s\n", cli->prog,
					c == ':' ? "option" : "unknown option",
					(int)strcspn(w, "="), w, c == ':' ? " needs a value" : "");
			else
				fprintf(stderr, "%s: %s '-%c'%s\n", cli->prog,
					c == ':' ? "option" : "unknown option", optopt,
					c == ':' ? " needs a value" : "");
			return -EINVAL;
		}
		r = d->apply(cli, d, optarg, o);
		if (r < 0)
			return r;
		if (ret_groups)
			*ret_groups |= d->group;
	}
	return 0;
}

/* Apply functions for the common cases; @d->off names the member they set. */

/* --help: the usage text on stdout, then exit(0). */
static inline int
kvt_cli_help(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	kvt_cli_usage(cli, stdout);
	exit(0);
}

/* An int set to 1. */
static inline int
kvt_cli_flag(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	*(int *)((char *)o + d->off) = 1;
	return 0;
}

/* A const char * set to the value. */
static inline int
kvt_cli_str(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	*(const char **)((char *)o + d->off) = arg;
	return 0;
}

/* An unsigned decimal integer in [d->min, d->max] (at most 2^53) into @ret_v; -EINVAL with a
 * message naming the option and its range. */
static inline int
kvt_cli_int_arg(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg,
		uint64_t *ret_v)
{
	unsigned long long v = 0;
	char *end = NULL;

	errno = 0;
	if (*arg && *arg != '-')
		v = strtoull(arg, &end, 10);
	if (!end || errno || *end || (double)v < d->min || (double)v > d->max) {
		fprintf(stderr, "%s: --%s wants %.0f..%.0f, got '%s'\n", cli->prog, d->name, d->min,
			d->max, arg);
		return -EINVAL;
	}
	*ret_v = v;
	return 0;
}

/* A uint32_t in [d->min, d->max]. */
static inline int
kvt_cli_u32(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	uint64_t v;
	int r = kvt_cli_int_arg(cli, d, arg, &v);

	if (r == 0)
		*(uint32_t *)((char *)o + d->off) = (uint32_t)v;
	return r;
}

/* An int64_t in [d->min, d->max] (a tool's -1 meaning "not given" stays out of range). */
static inline int
kvt_cli_i64(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	uint64_t v;
	int r = kvt_cli_int_arg(cli, d, arg, &v);

	if (r == 0)
		*(int64_t *)((char *)o + d->off) = (int64_t)v;
	return r;
}

/* An int in [d->min, d->max] (d->min at least 0). */
static inline int
kvt_cli_int(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	uint64_t v;
	int r = kvt_cli_int_arg(cli, d, arg, &v);

	if (r == 0)
		*(int *)((char *)o + d->off) = (int)v;
	return r;
}

/* A float in [d->min, d->max] (not NaN). */
static inline int
kvt_cli_float(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	char *end;
	float v;

	errno = 0;
	v = strtof(arg, &end);
	if (errno || !*arg || *end || !(v >= d->min && v <= d->max)) {
		fprintf(stderr, "%s: --%s wants a number in [%g, %g], got '%s'\n", cli->prog,
			d->name, d->min, d->max, arg);
		return -EINVAL;
	}
	*(float *)((char *)o + d->off) = v;
	return 0;
}

/* A double in [d->min, d->max] (not NaN). */
static inline int
kvt_cli_double(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (errno || !*arg || *end || !(v >= d->min && v <= d->max)) {
		fprintf(stderr, "%s: --%s wants a number in [%g, %g], got '%s'\n", cli->prog,
			d->name, d->min, d->max, arg);
		return -EINVAL;
	}
	*(double *)((char *)o + d->off) = v;
	return 0;
}

#endif
