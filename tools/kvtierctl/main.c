/* SPDX-License-Identifier: MIT */
/*
 * kvtierctl - inspect a running kvtierd over its control socket.
 *
 * Each command sends admin requests (proto/kvt_ctl.h: STATUS, CLIENTS, SEQS, BLOCKS, RESTART; no
 * HELLO) and formats the JSON replies (their fields and schema version: proto/kvt_ctl.h; every
 * key is optional here). `metrics` prints what the daemon formats (KVT_CTL_METRICS), the text that
 * its /metrics serves.
 *
 * Exit status: 0 success, 1 the daemon could not be reached, refused or answered badly, 2 bad
 * usage.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "kvt_cli.h"
#include "kvt_ctl.h"
#include "kvt_version.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"

#define DEFAULT_SOCKET KVT_DEFAULT_SOCKET

enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

struct opts {
	const char *socket;
	int json;
	int sessions; /* metrics: the per-session and per-sequence families too */
	int timeout_ms;
	double interval_s;
	long count; /* top: refreshes, 0 = until interrupted */
};

/* The documents of one refresh; any may be NULL when not asked for. */
struct docs {
	struct json_object *status;
	struct json_object *clients;
	struct json_object *seqs;
	struct json_object *blocks;
};

static const struct kvt_cli ctl_cli;

static void
usage(FILE *f)
{
	kvt_cli_usage(&ctl_cli, f);
}

static const char *
type_name(uint32_t type)
{
	switch (type) {
	case KVT_CTL_STATUS:
		return "STATUS";
	case KVT_CTL_CLIENTS:
		return "CLIENTS";
	case KVT_CTL_SEQS:
		return "SEQS";
	case KVT_CTL_BLOCKS:
		return "BLOCKS";
	case KVT_CTL_RESTART:
		return "RESTART";
	case KVT_CTL_METRICS:
		return "METRICS";
	default:
		return "request";
	}
}

static int
conn_open(struct kvtctl_conn *c, const struct opts *o)
{
	int r = kvtctl_connect(c, o->socket, o->timeout_ms);

	switch (r) {
	case 0:
		return 0;
	case -ENOENT:
	case -ECONNREFUSED:
		fprintf(stderr,
			"kvtierctl: kvtierd is not running (%s %s): start it with "
			"'systemctl start kvtierd' or 'kvtierd --socket %s'\n",
			r == -ENOENT ? "no socket at" : "nothing listens on", o->socket, o->socket);
		break;
	case -EACCES:
	case -EPERM:
		fprintf(stderr,
			"kvtierctl: permission denied on %s: join the socket's group (socket_group "
			"in kvtierd.conf) or run as root\n",
			o->socket);
		break;
	default:
		fprintf(stderr, "kvtierctl: cannot connect to %s: %s\n", o->socket, strerror(-r));
		break;
	}
	return r;
}

/* Says why request @type failed with @r; returns @r. */
static int
report_request(const struct kvtctl_conn *c, uint32_t type, int r)
{
	if (c->err_msg[0])
		fprintf(stderr, "kvtierctl: kvtierd refused %s: %s (%s)\n", type_name(type),
			c->err_msg, strerror(-r));
	else if (r == -EPROTO)
		fprintf(stderr, "kvtierctl: malformed reply to %s from %s\n", type_name(type),
			c->path);
	else
		fprintf(stderr, "kvtierctl: %s request to %s failed: %s\n", type_name(type),
			c->path, strerror(-r));
	return r;
}

/* One request, its reply parsed. Prints why it failed; returns 0 or -errno. */
static int
fetch(struct kvtctl_conn *c, uint32_t type, struct json_object **ret)
{
	enum json_tokener_error jerr;
	struct json_object *doc;
	char *text = NULL;
	int r;

	r = kvtctl_request(c, type, &text);
	if (r < 0)
		return report_request(c, type, r);
	doc = json_tokener_parse_verbose(text, &jerr);
	free(text);
	if (!doc || !json_object_is_type(doc, json_type_object)) {
		fprintf(stderr, "kvtierctl: kvtierd answered %s with invalid JSON: %s\n",
			type_name(type), doc ? "not an object" : json_tokener_error_desc(jerr));
		json_object_put(doc);
		return -EPROTO;
	}
	*ret = doc;
	return 0;
}

static void
docs_put(struct docs *d)
{
	json_object_put(d->status);
	json_object_put(d->clients);
	json_object_put(d->seqs);
	json_object_put(d->blocks);
	memset(d, 0, sizeof(*d));
}

/* Fetch the documents named by @want (bits 1 status, 2 clients, 4 seqs, 8 blocks) over one
 * connection. */
static int
docs_get(const struct opts *o, unsigned int want, struct docs *d)
{
	struct kvtctl_conn c;
	int r;

	memset(d, 0, sizeof(*d));
	r = conn_open(&c, o);
	if (r < 0)
		return r;
	if (want & 1)
		r = fetch(&c, KVT_CTL_STATUS, &d->status);
	if (r == 0 && (want & 2))
		r = fetch(&c, KVT_CTL_CLIENTS, &d->clients);
	if (r == 0 && (want & 4))
		r = fetch(&c, KVT_CTL_SEQS, &d->seqs);
	if (r == 0 && (want & 8))
		r = fetch(&c, KVT_CTL_BLOCKS, &d->blocks);
	kvtctl_close(&c);
	if (r < 0)
		docs_put(d);
	return r;
}

static int
print_json(struct json_object *doc)
{
	puts(json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
						     JSON_C_TO_STRING_NOSLASHESCAPE));
	return 0;
}

/* Several documents as one object: {"status":{...},"clients":{...},"seqs":{...}}. */
static int
print_json_docs(const struct docs *d)
{
	struct json_object *all = json_object_new_object();

	if (!all)
		return -ENOMEM;
	if (d->status)
		json_object_object_add(all, "status", json_object_get(d->status));
	if (d->clients)
		json_object_object_add(all, "clients", json_object_get(d->clients));
	if (d->seqs)
		json_object_object_add(all, "seqs", json_object_get(d->seqs));
	print_json(all);
	json_object_put(all);
	return 0;
}

static int
report_fmt(int r)
{
	if (r == -EINVAL)
		fprintf(stderr, "kvtierctl: kvtierd's JSON does not have the expected shape\n");
	else if (r < 0)
		fprintf(stderr, "kvtierctl: cannot write output: %s\n", strerror(-r));
	return r;
}

static int
cmd_show(const struct opts *o, unsigned int want)
{
	struct docs d;
	int r;

	r = docs_get(o, want, &d);
	if (r < 0)
		return EXIT_FAIL;
	if (o->json)
		r = print_json(d.status	   ? d.status
			       : d.clients ? d.clients
			       : d.seqs	   ? d.seqs
					   : d.blocks);
	else if (d.status)
		r = kvtctl_fmt_status(stdout, d.status);
	else if (d.clients)
		r = kvtctl_fmt_clients(stdout, d.clients);
	else if (d.seqs)
		r = kvtctl_fmt_seqs(stdout, d.seqs);
	else
		r = kvtctl_fmt_blocks(stdout, d.blocks);
	docs_put(&d);
	return report_fmt(r) < 0 ? EXIT_FAIL : 0;
}

/* Prints what the daemon formats: the text exposition, or its JSON document pretty-printed. */
static int
cmd_metrics(const struct opts *o)
{
	uint32_t flags =
	    (o->json ? KVT_CTL_METRICS_F_JSON : 0) | (o->sessions ? KVT_CTL_METRICS_F_SESSIONS : 0);
	struct json_object *doc;
	struct kvtctl_conn c;
	char *text = NULL;
	int r;

	r = conn_open(&c, o);
	if (r < 0)
		return EXIT_FAIL;
	r = kvtctl_metrics(&c, flags, &text);
	kvtctl_close(&c);
	if (r < 0) {
		report_request(&c, KVT_CTL_METRICS, r);
		return EXIT_FAIL;
	}
	if (!o->json) {
		r = fputs(text, stdout) == EOF || fflush(stdout) ? -EIO : 0;
		free(text);
		return report_fmt(r) < 0 ? EXIT_FAIL : 0;
	}
	doc = json_tokener_parse(text);
	free(text);
	if (!json_object_is_type(doc, json_type_object)) {
		fprintf(stderr, "kvtierctl: kvtierd answered METRICS with invalid JSON\n");
		json_object_put(doc);
		return EXIT_FAIL;
	}
	print_json(doc);
	json_object_put(doc);
	return 0;
}

/* The reply comes from the new process once it serves: the wait is the restart's pause. */
static int
cmd_restart(const struct opts *o)
{
	struct kvtctl_conn c;
	struct json_object *doc = NULL, *v;
	int r;

	r = conn_open(&c, o);
	if (r < 0)
		return EXIT_FAIL;
	r = fetch(&c, KVT_CTL_RESTART, &doc);
	kvtctl_close(&c);
	if (r < 0)
		return EXIT_FAIL;
	if (o->json)
		print_json(doc);
	else
		printf("kvtierd restarted in place: %lld session(s) kept, paused %.1f ms\n",
		       json_object_object_get_ex(doc, "sessions", &v)
			   ? (long long)json_object_get_int64(v)
			   : 0,
		       json_object_object_get_ex(doc, "pause_ms", &v) ? json_object_get_double(v)
								      : 0.0);
	json_object_put(doc);
	return 0;
}

static void
sleep_s(double s)
{
	struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (time_t)s) * 1e9)};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/*
 * A plain ANSI "home + clear" between frames when stdout is a terminal, so top needs no
 * terminfo; into a pipe or file each frame just follows the last one, separated by its header.
 */
static int
cmd_top(const struct opts *o)
{
	bool tty = isatty(STDOUT_FILENO);
	long i;
	int r = 0;

	for (i = 0; !o->count || i < o->count; i++) {
		struct docs d;
		time_t now = time(NULL);
		char when[32];

		if (i)
			sleep_s(o->interval_s);
		if (docs_get(o, 7, &d) < 0)
			return EXIT_FAIL;
		if (o->json) {
			r = print_json_docs(&d);
		} else {
			strftime(when, sizeof(when), "%H:%M:%S", localtime(&now));
			printf("%skvtierd at %s, %s, every %gs\n\n",
			       tty ? "\033[H\033[2J"
			       : i ? "\n"
				   : "",
			       o->socket, when, o->interval_s);
			r = kvtctl_fmt_status(stdout, d.status);
			if (r == 0) {
				putchar('\n');
				r = kvtctl_fmt_clients(stdout, d.clients);
			}
			if (r == 0) {
				putchar('\n');
				r = kvtctl_fmt_seqs(stdout, d.seqs);
			}
		}
		fflush(stdout);
		docs_put(&d);
		if (report_fmt(r) < 0)
			return EXIT_FAIL;
	}
	return 0;
}

static bool
parse_seconds(const char *s, double *ret)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > 86400)
		return false;
	*ret = v;
	return true;
}

static int
opt_socket(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	if (!*arg) {
		fprintf(stderr, "kvtierctl: --socket needs a path\n");
		return -EINVAL;
	}
	((struct opts *)o)->socket = arg;
	return 0;
}

static int
opt_timeout(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	double secs;

	if (!parse_seconds(arg, &secs) || secs < 0.001) {
		fprintf(stderr, "kvtierctl: bad --timeout '%s': seconds, > 0\n", arg);
		return -EINVAL;
	}
	((struct opts *)o)->timeout_ms = (int)(secs * 1000);
	return 0;
}

static int
opt_interval(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	if (!parse_seconds(arg, &((struct opts *)o)->interval_s)) {
		fprintf(stderr, "kvtierctl: bad --interval '%s': seconds, > 0\n", arg);
		return -EINVAL;
	}
	return 0;
}

static int
opt_count(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	long *count = &((struct opts *)o)->count;
	char *end;

	errno = 0;
	*count = strtol(arg, &end, 10);
	if (errno || end == arg || *end || *count < 0) {
		fprintf(stderr, "kvtierctl: bad --count '%s': an integer >= 0\n", arg);
		return -EINVAL;
	}
	return 0;
}

static int
opt_version(const struct kvt_cli *cli, const struct kvt_cli_opt *d, const char *arg, void *o)
{
	printf("kvtierctl %s (ABI %d.%d)\n", KVT_VERSION, KVT_ABI_MAJOR, KVT_ABI_MINOR);
	exit(0);
}

static const struct kvt_cli_opt ctl_opts[] = {
    {"socket", 's', "PATH", "control socket (default: $KVTIER_SOCKET, else " DEFAULT_SOCKET ")",
     .apply = opt_socket},
    {"json", 'j', NULL, "print the daemon's JSON documents, pretty-printed", .apply = kvt_cli_flag,
     .off = offsetof(struct opts, json)},
    {"sessions", 'S', NULL, "metrics: add per-session and per-sequence families",
     .apply = kvt_cli_flag, .off = offsetof(struct opts, sessions)},
    {"timeout", 't', "SEC", "wait at most SEC seconds for each reply (default 5)",
     .apply = opt_timeout},
    {"interval", 'i', "SEC", "top: seconds between refreshes (default 2)", .apply = opt_interval},
    {"count", 'n', "N", "top: stop after N refreshes (default 0: until interrupted)",
     .apply = opt_count},
    {"help", 'h', NULL, "this text", .apply = kvt_cli_help},
    {"version", 'V', NULL, "print the version", .apply = opt_version},
    {NULL},
};

static const struct kvt_cli ctl_cli = {
    .prog = "kvtierctl",
    .intro = "usage: kvtierctl [OPTIONS] COMMAND\n"
	     "\n"
	     "Inspect a running kvtierd over its control socket.\n"
	     "\n"
	     "Commands:\n"
	     "  status    version, backend, pool occupancy, counters, tier totals\n"
	     "  clients   connected sessions, one row each\n"
	     "  seqs      open sequences with their geometry and tokens per tier\n"
	     "  blocks    shared prefix blocks: namespaces, blocks, bytes, hit rate, totals\n"
	     "  metrics   kvtierd's metrics in Prometheus text format (--json: as JSON)\n"
	     "  top       redraw status, clients and seqs every --interval seconds\n"
	     "  restart   re-execute kvtierd in place, keeping every session (admin only)\n"
	     "\n"
	     "Options:\n",
    .outro = "Exit status: 0 success, 1 kvtierd unreachable or the request failed, 2 bad usage.\n",
    .opts = ctl_opts,
};

int
main(int argc, char **argv)
{
	struct opts o = {.timeout_ms = 5000, .interval_s = 2, .count = 0};
	const char *cmd;

	o.socket = getenv("KVTIER_SOCKET");
	if (!o.socket || !*o.socket)
		o.socket = DEFAULT_SOCKET;

	if (kvt_cli_parse(&ctl_cli, argc, argv, &o, NULL) < 0) {
		fprintf(stderr, "Try 'kvtierctl --help'.\n");
		return EXIT_USAGE;
	}
	if (optind + 1 != argc) {
		fprintf(stderr, "kvtierctl: %s\n",
			optind == argc ? "missing command" : "one command at a time");
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[optind];

	if (!strcmp(cmd, "status"))
		return cmd_show(&o, 1);
	if (!strcmp(cmd, "clients"))
		return cmd_show(&o, 2);
	if (!strcmp(cmd, "seqs"))
		return cmd_show(&o, 4);
	if (!strcmp(cmd, "blocks"))
		return cmd_show(&o, 8);
	if (!strcmp(cmd, "metrics"))
		return cmd_metrics(&o);
	if (!strcmp(cmd, "top"))
		return cmd_top(&o);
	if (!strcmp(cmd, "restart"))
		return cmd_restart(&o);
	fprintf(stderr, "kvtierctl: unknown command '%s'; see 'kvtierctl --help'\n", cmd);
	return EXIT_USAGE;
}
