/* SPDX-License-Identifier: MIT */
/*
 * unit-seccomp-exec - run a program under the system call filter a systemd unit describes, so the
 * tests can run the real daemon under kvtierd.service's SystemCallFilter= on hosts where systemd
 * is not the init system.
 *
 *   KVT_UNIT_FILE=UNIT KVT_EXEC=PROGRAM unit-seccomp-exec [ARG...]
 *
 * execs PROGRAM with ARGs (same pid) after loading the filter the way systemd builds it: the
 * SystemCallFilter= lines in order (the first decides allow-list or deny-list, "~" lines remove
 * from an allow-list), groups expanded by systemd-analyze syscall-filter, names this architecture
 * lacks skipped, and SystemCallErrorNumber= as the action for every other call (else the process
 * is killed). Exit 127 with a message when the filter cannot be built.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_NAMES 2048

struct names {
	char *v[MAX_NAMES];
	unsigned n;
};

static void
die(const char *what, const char *detail)
{
	fprintf(stderr, "unit-seccomp-exec: %s%s%s\n", what, detail ? ": " : "",
		detail ? detail : "");
	exit(127);
}

static int
names_has(const struct names *s, const char *name)
{
	for (unsigned i = 0; i < s->n; i++)
		if (!strcmp(s->v[i], name))
			return 1;
	return 0;
}

static void
names_add(struct names *s, const char *name)
{
	if (names_has(s, name))
		return;
	if (s->n == MAX_NAMES)
		die("too many system calls", name);
	s->v[s->n] = strdup(name);
	if (!s->v[s->n])
		die("out of memory", NULL);
	s->n++;
}

static void
names_del(struct names *s, const char *name)
{
	for (unsigned i = 0; i < s->n; i++)
		if (!strcmp(s->v[i], name)) {
			free(s->v[i]);
			s->v[i] = s->v[--s->n];
			return;
		}
}

/* @group -> its system calls, from systemd's own table (systemd-analyze syscall-filter). */
static void
expand(const char *name, struct names *out, int depth)
{
	char cmd[256], line[512];
	int first = 1;
	FILE *p;

	if (name[0] != '@') {
		names_add(out, name);
		return;
	}
	if (depth > 8)
		die("system call groups nest too deep", name);
	snprintf(cmd, sizeof(cmd), "systemd-analyze syscall-filter --no-pager '%s' 2>&1", name);
	p = popen(cmd, "r");
	if (!p)
		die("cannot run systemd-analyze", strerror(errno));
	while (fgets(line, sizeof(line), p)) {
		char *s = line + strspn(line, " \t");

		s[strcspn(s, " \t\r\n")] = '\0';
		if (!*s || *s == '#')
			continue;
		if (first) { /* the group's own name heads the listing */
			first = 0;
			if (strcmp(s, name))
				die("unknown system call group", name);
			continue;
		}
		expand(s, out, depth + 1);
	}
	if (pclose(p) != 0)
		die("systemd-analyze syscall-filter failed for", name);
}

/* One SystemCallFilter= value: space-separated names and @groups, "~" first to remove. */
static void
apply_line(char *val, int *mode, struct names *set)
{
	int deny = 0;
	struct names tmp = {0};
	char *save = NULL;

	if (*val == '~') {
		deny = 1;
		val++;
	}
	if (!*val) {
		/* empty assignment: reset */
		for (unsigned i = 0; i < set->n; i++)
			free(set->v[i]);
		set->n = 0;
		*mode = 0;
		return;
	}
	for (char *t = strtok_r(val, " \t", &save); t; t = strtok_r(NULL, " \t", &save))
		expand(t, &tmp, 0);
	if (!*mode)
		*mode =
		    deny ? -1 : 1; /* the first line decides: allow-list (1) or deny-list (-1) */
	for (unsigned i = 0; i < tmp.n; i++) {
		if ((*mode > 0) == !deny)
			names_add(set, tmp.v[i]);
		else
			names_del(set, tmp.v[i]);
		free(tmp.v[i]);
	}
}

int
main(int argc, char **argv)
{
	const char *unit = getenv("KVT_UNIT_FILE"), *prog = getenv("KVT_EXEC");
	struct names set = {0};
	uint32_t action = SCMP_ACT_KILL_PROCESS;
	char line[4096];
	unsigned rules = 0;
	scmp_filter_ctx ctx;
	int mode = 0, r;
	FILE *f;

	(void)argc;
	if (!unit || !prog)
		die("set KVT_UNIT_FILE (the unit) and KVT_EXEC (the program to run)", NULL);
	f = fopen(unit, "re");
	if (!f)
		die(unit, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = '\0';
		if (!strncmp(line, "SystemCallFilter=", 17)) {
			apply_line(line + 17, &mode, &set);
		} else if (!strncmp(line, "SystemCallErrorNumber=", 22)) {
			const char *v = line + 22;

			if (!strcmp(v, "EPERM"))
				action = SCMP_ACT_ERRNO(EPERM);
			else if (!strcmp(v, "ENOSYS"))
				action = SCMP_ACT_ERRNO(ENOSYS);
			else if (!strcmp(v, "kill"))
				action = SCMP_ACT_KILL_PROCESS;
			else
				die("SystemCallErrorNumber= value not handled here", v);
		}
	}
	fclose(f);
	if (!mode)
		die(unit, "has no SystemCallFilter=");

	ctx = seccomp_init(mode > 0 ? action : SCMP_ACT_ALLOW);
	if (!ctx)
		die("seccomp_init failed", NULL);
	for (unsigned i = 0; i < set.n; i++) {
		int nr = seccomp_syscall_resolve_name(set.v[i]);

		if (nr == __NR_SCMP_ERROR)
			continue; /* not a system call on this architecture */
		r = seccomp_rule_add(ctx, mode > 0 ? SCMP_ACT_ALLOW : action, nr, 0);
		if (r < 0 && r != -EEXIST)
			die("seccomp_rule_add failed for", set.v[i]);
		rules++;
	}
	if (!rules)
		die(unit, "SystemCallFilter= names no system call of this architecture");
	/* NoNewPrivileges=yes in the unit; seccomp needs it too (libseccomp sets it on load) */
	r = seccomp_load(ctx);
	if (r < 0)
		die("seccomp_load failed", strerror(-r));
	seccomp_release(ctx);
	argv[0] = (char *)prog;
	execv(prog, argv);
	die(prog, strerror(errno));
	return 127;
}
