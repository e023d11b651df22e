/* SPDX-License-Identifier: MIT */
/*
 * Integration: kvtierd opens its [spill] store at start and closes it at exit; a store on tmpfs,
 * or one another daemon holds, stops the start with a message that says what to do; a restart in
 * place lets go of the store so that the new process opens it (nothing in it is carried yet).
 * What operators see of the store: STATUS's "spill", `kvtierctl status` and /metrics show its
 * path, size and nothing used at start, and a daemon without a store shows none of it.
 * The store goes where O_DIRECT works ($KVT_SPILL_TEST_DIR, /var/tmp, /tmp), as in check_spill.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_direct.h"
#include "kvt_test.h"

/* This test's store file (absent), in a directory where O_DIRECT works. */
static void
store_path(char *store, size_t len)
{
	ck_assert_msg(kvt_test_direct_dir(store, len),
		      "no directory here supports O_DIRECT: set KVT_SPILL_TEST_DIR");
	snprintf(store + strlen(store), len - strlen(store), "/kvt-itest-spill-%d.dat",
		 (int)getpid());
	unlink(store);
}

/* A config file in @p's directory with a [spill] store at @store. */
static void
write_config(const struct kvtd_proc *p, const char *store, char *conf, size_t len)
{
	FILE *f;

	snprintf(conf, len, "%s/kvtierd.conf", p->dir);
	f = fopen(conf, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "[spill]\npath = %s\nsize = 16M\nqueue_depth = 8\n", store);
	fclose(f);
}

static int
log_has(const struct kvtd_proc *p, const char *what)
{
	char buf[16384];
	FILE *f = fopen(p->log, "r");
	size_t n;

	ck_assert_ptr_nonnull(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return strstr(buf, what) != NULL;
}

START_TEST(t_tmpfs_refused)
{
	struct kvtd_proc p;
	char store[128], conf[256];

	daemon_prepare(&p);
	snprintf(store, sizeof(store), "/dev/shm/kvt-itest-spill-%d", (int)getpid());
	write_config(&p, store, conf, sizeof(conf));
	daemon_spawn(&p, (const char *const[]){"--config", conf, NULL});
	ck_assert_int_eq(daemon_wait(&p, 30000), 1);
	ck_assert_msg(log_has(&p, "tmpfs or ramfs, which is memory") &&
			  log_has(&p, "put the store on a disk file system"),
		      "log %s", p.log);
	unlink(store);
	unlink(conf);
	unlink(p.log);
	rmdir(p.dir);
}
END_TEST

START_TEST(t_open_and_close)
{
	struct kvtd_proc p, q;
	char store[600] = "", conf[256], conf2[256];
	struct stat st;

	store_path(store, sizeof(store));
	daemon_prepare(&p);
	write_config(&p, store, conf, sizeof(conf));
	daemon_spawn(&p, (const char *const[]){"--config", conf, NULL});
	daemon_wait_ready(&p);
	ck_assert_msg(log_has(&p, "spill store: ") && log_has(&p, "16 MiB (file), queue depth 8"),
		      "log %s", p.log);
	ck_assert_int_eq(stat(store, &st), 0);
	ck_assert_int_eq(st.st_size, 16 << 20);
	/* a second daemon on the same store stops at start */
	daemon_prepare(&q);
	write_config(&q, store, conf2, sizeof(conf2));
	daemon_spawn(&q, (const char *const[]){"--config", conf2, NULL});
	ck_assert_int_eq(daemon_wait(&q, 30000), 1);
	ck_assert_msg(log_has(&q, "is in use"), "log %s", q.log);
	unlink(conf2);
	unlink(q.log);
	rmdir(q.dir);
	ck_assert(daemon_alive(&p));
	unlink(conf);
	ck_assert_int_eq(daemon_stop(&p), 0);
	/* closed at exit: the next daemon opens it */
	daemon_prepare(&q);
	write_config(&q, store, conf2, sizeof(conf2));
	daemon_spawn(&q, (const char *const[]){"--config", conf2, NULL});
	daemon_wait_ready(&q);
	unlink(conf2);
	ck_assert_int_eq(daemon_stop(&q), 0);
	unlink(store);
}
END_TEST

/* Restarts in place with a store configured: each new process opens it again and serves. */
START_TEST(t_restart_reopens)
{
	struct kvtd_proc p;
	char store[600] = "", conf[256];

	store_path(store, sizeof(store));
	daemon_prepare(&p);
	write_config(&p, store, conf, sizeof(conf));
	daemon_spawn(&p, (const char *const[]){"--config", conf, NULL});
	daemon_wait_ready(&p);
	for (int i = 0; i < 3; i++) {
		struct json_object *o = admin_request(p.sock, KVT_CTL_RESTART), *v;

		ck_assert_msg(o, "no reply to RESTART (log %s)", p.log);
		ck_assert_msg(json_object_object_get_ex(o, "restarted", &v) &&
				  json_object_get_boolean(v),
			      "RESTART: %s (log %s)", json_object_to_json_string(o), p.log);
		json_object_put(o);
		ck_assert_msg(daemon_alive(&p), "log %s", p.log);
	}
	ck_assert_msg(!log_has(&p, "is in use"), "log %s", p.log);
	unlink(conf);
	ck_assert_int_eq(daemon_stop(&p), 0);
	unlink(store);
}
END_TEST

/* Runs kvtierctl on @sock with @args: its output (malloc'ed); asserts it exits 0. */
static char *
ctl_out(const char *sock, const char *args)
{
	char cmd[512], *out = malloc(1 << 16);
	size_t n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "%s --socket %s %s 2>&1", getenv("KVTIERCTL"), sock, args);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (n + 1 < (1 << 16) && fgets(out + n, (int)((1 << 16) - n), p))
		n += strlen(out + n);
	out[n] = '\0';
	ck_assert_msg(WEXITSTATUS(pclose(p)) == 0, "kvtierctl %s: %s", args, out);
	return out;
}

/* GET /metrics from the daemon at @sock (its STATUS says where it listens): the reply. */
static char *
scrape(const char *sock)
{
	struct json_object *o = admin_request(sock, KVT_CTL_STATUS), *u;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	size_t cap = 1 << 16, got = 0;
	char *buf = malloc(cap + 1);
	unsigned port;
	ssize_t n;
	int fd;

	ck_assert(o && json_object_object_get_ex(o, "metrics_url", &u));
	ck_assert_int_eq(sscanf(json_object_get_string(u), "http://127.0.0.1:%u/metrics", &port),
			 1);
	json_object_put(o);
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(req) - 1);
	while ((n = recv(fd, buf + got, cap - got, 0)) > 0) {
		got += (size_t)n;
		if (got == cap)
			buf = realloc(buf, (cap *= 2) + 1);
	}
	buf[got] = '\0';
	close(fd);
	ck_assert_msg(!strncmp(buf, "HTTP/1.0 200 OK", 15), "%.200s", buf);
	return buf;
}

START_TEST(t_status_and_metrics)
{
	static const char *const extra[] = {"--metrics-listen", "127.0.0.1:0", NULL};
	struct kvtd_proc p;
	char store[600] = "", conf[256], want[700], *out;
	struct json_object *o, *sp, *v;

	store_path(store, sizeof(store));
	daemon_prepare(&p);
	write_config(&p, store, conf, sizeof(conf));
	daemon_spawn(
	    &p, (const char *const[]){"--config", conf, "--metrics-listen", "127.0.0.1:0", NULL});
	daemon_wait_ready(&p);
	unlink(store); /* open, the file lives on; a failed test leaves no store behind */

	/* STATUS: the store as opened, nothing in it */
	o = admin_request(p.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	ck_assert_msg(json_object_object_get_ex(o, "spill", &sp) &&
			  json_object_is_type(sp, json_type_object),
		      "%s", json_object_to_json_string(o));
	ck_assert(json_object_object_get_ex(sp, "path", &v));
	ck_assert_str_eq(json_object_get_string(v), store);
	ck_assert(json_object_object_get_ex(sp, "kind", &v));
	ck_assert_str_eq(json_object_get_string(v), "file");
	ck_assert_int_eq(json_get_i64(o, "spill.size"), 16 << 20);
	ck_assert_int_eq(json_get_i64(o, "spill.used"), 0);
	ck_assert_int_eq(json_get_i64(o, "spill.free"), 16 << 20);
	ck_assert_int_eq(json_get_i64(o, "spill.extents"), 0);
	ck_assert_int_eq(json_get_i64(o, "spill.queue_depth"), 8);
	ck_assert_int_eq(json_get_i64(o, "spill.uid_share"), 8 << 20); /* the default, 50% */
	ck_assert(json_object_object_get_ex(sp, "uids", &v));
	ck_assert_uint_eq(json_object_array_length(v), 0);
	ck_assert_int_eq(json_get_i64(o, "spill.io.reads"), 0);
	ck_assert_int_eq(json_get_i64(o, "spill.io.writes"), 0);
	ck_assert_int_eq(json_get_i64(o, "spill.errors.eio"), 0);
	ck_assert_int_eq(json_get_i64(o, "spill.dropped.extents"), 0);
	json_object_put(o);

	/* kvtierctl status */
	out = ctl_out(p.sock, "status");
	snprintf(want, sizeof(want), "\nspill path     %s\nspill kind     file\n", store);
	ck_assert_msg(strstr(out, want), "%s", out);
	ck_assert_msg(strstr(out, "\nspill size     16.0 MiB\nspill used     0 B (0.0%)\n"
				  "spill free     16.0 MiB\nspill extents  0\n"
				  "spill uids     none; share 8.0 MiB\n"),
		      "%s", out);
	ck_assert_msg(strstr(out, "\nspill errors   eio 0, enospc 0, short 0, other 0\n"), "%s",
		      out);
	free(out);

	/* /metrics */
	out = scrape(p.sock);
	snprintf(want, sizeof(want), "\nkvtier_spill_info{path=\"%s\",kind=\"file\"} 1\n", store);
	ck_assert_msg(strstr(out, want), "%s", out);
	ck_assert_msg(strstr(out, "\nkvtier_spill_size_bytes 16777216\n"), "%s", out);
	ck_assert_msg(strstr(out, "\nkvtier_spill_used_bytes 0\n"), "%s", out);
	ck_assert_msg(strstr(out, "\nkvtier_spill_free_bytes 16777216\n"), "%s", out);
	ck_assert_msg(strstr(out, "\nkvtier_spill_errors_total{kind=\"eio\"} 0\n"), "%s", out);
	ck_assert_msg(strstr(out, "\nkvtier_spill_dropped_extents_total 0\n"), "%s", out);
	free(out);
	unlink(conf);
	ck_assert_int_eq(daemon_stop(&p), 0);

	/* a daemon without a store shows none of it */
	daemon_start(&p, extra);
	o = admin_request(p.sock, KVT_CTL_STATUS);
	ck_assert_ptr_nonnull(o);
	ck_assert(!json_object_object_get_ex(o, "spill", NULL));
	json_object_put(o);
	out = ctl_out(p.sock, "status");
	ck_assert_msg(strstr(out, "\ntiers ") && !strstr(out, "spill"), "%s", out);
	free(out);
	out = scrape(p.sock);
	ck_assert_msg(strstr(out, "kvtier_pool_size_bytes") && !strstr(out, "kvtier_spill_"), "%s",
		      out);
	free(out);
	ck_assert_int_eq(daemon_stop(&p), 0);
}
END_TEST

KVT_CHECK_MAIN("spill_start", 120, NULL, NULL, t_tmpfs_refused, t_open_and_close, t_restart_reopens,
	       t_status_and_metrics)
