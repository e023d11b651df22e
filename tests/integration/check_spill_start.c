/* SPDX-License-Identifier: MIT */
/*
 * Integration: kvtierd opens its [spill] store at start and closes it at exit; a store on tmpfs,
 * or one another daemon holds, stops the start with a message that says what to do; a restart in
 * place lets go of the store so that the new process opens it (nothing in it is carried yet).
 * The store goes where O_DIRECT works ($KVT_SPILL_TEST_DIR, /var/tmp, /tmp), as in check_spill.
 */
#define _GNU_SOURCE
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"
#include "kvt_ctl.h"
#include "kvt_test.h"

static int
direct_ok(const char *d)
{
	char p[600];
	struct statfs sfs;
	void *buf;
	int fd, ok = 0;

	snprintf(p, sizeof(p), "%s/kvt-spill-probe-%d", d, (int)getpid());
	fd = open(p, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0)
		return 0;
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type != 0x01021994 && ftruncate(fd, 4096) == 0 &&
	    posix_memalign(&buf, 4096, 4096) == 0) {
		ok = pread(fd, buf, 4096, 0) == 4096;
		free(buf);
	}
	close(fd);
	unlink(p);
	return ok;
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
	const char *cand[] = {getenv("KVT_SPILL_TEST_DIR"), "/var/tmp", "/tmp"};
	struct kvtd_proc p, q;
	char store[600] = "", conf[256], conf2[256];
	struct stat st;

	for (unsigned i = 0; i < 3 && !store[0]; i++)
		if (cand[i] && direct_ok(cand[i]))
			snprintf(store, sizeof(store), "%s/kvt-itest-spill-%d.dat", cand[i],
				 (int)getpid());
	ck_assert_msg(store[0], "no directory here supports O_DIRECT: set KVT_SPILL_TEST_DIR");
	unlink(store);
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
	const char *cand[] = {getenv("KVT_SPILL_TEST_DIR"), "/var/tmp", "/tmp"};
	struct kvtd_proc p;
	char store[600] = "", conf[256];

	for (unsigned i = 0; i < 3 && !store[0]; i++)
		if (cand[i] && direct_ok(cand[i]))
			snprintf(store, sizeof(store), "%s/kvt-itest-spill-%d.dat", cand[i],
				 (int)getpid());
	ck_assert_msg(store[0], "no directory here supports O_DIRECT: set KVT_SPILL_TEST_DIR");
	unlink(store);
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

KVT_CHECK_MAIN("spill_start", 120, NULL, NULL, t_tmpfs_refused, t_open_and_close, t_restart_reopens)
