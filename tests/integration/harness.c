/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_test.h"
#include "kvt_ctl.h"

void
daemon_prepare(struct kvtd_proc *p)
{
	kvt_test_tmpdir(p->dir, sizeof(p->dir), "test");
	snprintf(p->sock, sizeof(p->sock), "%s/kvtierd.sock", p->dir);
	snprintf(p->log, sizeof(p->log), "%s/kvtierd.log", p->dir);
}

void
daemon_spawn(struct kvtd_proc *p, const char *const *extra)
{
	const char *bin = getenv("KVTIERD");
	const char *argv[48];
	int n = 0;

	ck_assert_msg(bin, "KVTIERD is not set");
	argv[n++] = bin;
	argv[n++] = "--config";
	argv[n++] = "/dev/null";
	argv[n++] = "--socket";
	argv[n++] = p->sock;
	argv[n++] = "--pool-size";
	argv[n++] = "64M";
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	/* host buffers (kvt_buf_alloc) on any machine; a later --backend in @extra wins */
	argv[n++] = "--backend";
	argv[n++] = "host";
	for (int i = 0; extra && extra[i] && n < 46; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	p->pid = fork();
	ck_assert(p->pid >= 0);
	if (p->pid == 0) {
		int fd;

		/* a failed test exits without its teardown: take the daemon with it */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		/* stdio only, as under systemd: no descriptor of the test's (Check's temp file and
		 * pipe) rides along, so the daemon's descriptor counts are its own */
		if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0)
			for (fd = 3; fd < 1024; fd++)
				close(fd);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
}

void
daemon_start(struct kvtd_proc *p, const char *const *extra)
{
	daemon_prepare(p);
	daemon_spawn(p, extra);
	daemon_wait_ready(p);
}

void
daemon_start_conf(struct kvtd_proc *p, const char *conf, unsigned flags, const char *const *extra)
{
	char path[sizeof(p->dir) + 16];
	const char *args[16] = {"--config", path};
	unsigned n = 2;
	FILE *f;

	daemon_prepare(p);
	if (flags & DAEMON_SHARED)
		ck_assert_int_eq(chmod(p->dir, 0711), 0);
	snprintf(path, sizeof(path), "%s/kvtierd.conf", p->dir);
	f = fopen(path, "we");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "%s%s", flags & DAEMON_SHARED ? "[daemon]\nsocket_mode = 0666\n" : "",
		conf ? conf : "");
	ck_assert_int_eq(fclose(f), 0);
	for (; extra && *extra; extra++) {
		ck_assert_uint_lt(n, sizeof(args) / sizeof(args[0]) - 1);
		args[n++] = *extra;
	}
	args[n] = NULL;
	daemon_spawn(p, args);
	daemon_wait_ready(p);
}

void
daemon_wait_ready(struct kvtd_proc *p)
{
	for (int i = 0; i < 500; i++) {
		struct json_object *o = admin_request(p->sock, KVT_CTL_STATUS);

		if (o) {
			json_object_put(o);
			return;
		}
		ck_assert_msg(daemon_alive(p), "kvtierd exited at start (log %s)", p->log);
		usleep(10000);
	}
	ck_abort_msg("kvtierd did not answer within 5 s");
}

int
daemon_alive(struct kvtd_proc *p)
{
	return waitpid(p->pid, NULL, WNOHANG) == 0;
}

int
daemon_wait(struct kvtd_proc *p, int timeout_ms)
{
	int st = 0;

	for (int waited = 0;; waited += 10) {
		pid_t r = waitpid(p->pid, &st, WNOHANG);

		if (r < 0)
			return -1;
		if (r == p->pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (waited >= timeout_ms) { /* a daemon that ignores SIGTERM fails, not hangs */
			kill(p->pid, SIGKILL);
			waitpid(p->pid, NULL, 0);
			return -1;
		}
		usleep(10000);
	}
}

int
daemon_stop(struct kvtd_proc *p)
{
	int r;

	char path[sizeof(p->dir) + 16];

	kill(p->pid, SIGTERM);
	r = daemon_wait(p, 30000);
	snprintf(path, sizeof(path), "%s/kvtierd.conf", p->dir);
	unlink(path); /* daemon_start_conf()'s, if any */
	if (getenv("KVT_TEST_KEEP_LOG") == NULL) {
		unlink(p->log);
		rmdir(p->dir);
	}
	return r;
}

int
ctl_raw_connect(const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = -errno;

		close(fd);
		return r;
	}
	return fd;
}

ssize_t
ctl_raw_recv(int fd, void *buf, size_t len, int timeout_ms)
{
	union {
		char b[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	ssize_t n;

	if (poll(&pfd, 1, timeout_ms) != 1)
		return -ETIMEDOUT;
	n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return -errno;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
				close(((int *)CMSG_DATA(cm))[i]);
	return n;
}

struct json_object *
admin_request(const char *sock, uint32_t type)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvt_ctl_hdr h = {.type = type, .len = sizeof(h), .id = 7};
	static char buf[KVT_CTL_MAX_MSG];
	struct timeval tv = {5, 0};
	struct json_object *o = NULL;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ssize_t n;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || send(fd, &h, sizeof(h), 0) < 0)
		goto out;
	n = recv(fd, buf, sizeof(buf) - 1, 0);
	if (n > (ssize_t)sizeof(h) && ((struct kvt_ctl_hdr *)buf)->type == KVT_CTL_JSON) {
		buf[n] = '\0';
		o = json_tokener_parse(buf + sizeof(h));
	}
out:
	close(fd);
	return o;
}

int64_t
json_get_i64(struct json_object *o, const char *path)
{
	char tmp[128], *save = NULL;

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *k = strtok_r(tmp, ".", &save); k; k = strtok_r(NULL, ".", &save))
		if (!json_object_object_get_ex(o, k, &o))
			return -1;
	return json_object_get_int64(o);
}

int64_t
pool_used(const char *sock)
{
	struct json_object *o = admin_request(sock, KVT_CTL_STATUS);
	int64_t v;

	if (!o)
		return -1;
	v = json_get_i64(o, "pool.used");
	json_object_put(o);
	return v;
}

static struct kvtd_usage
usage_once(const struct kvtd_proc *p)
{
	struct kvtd_usage u = {0, 0, 0, -1, 0};
	char path[64], line[512];
	struct dirent *de;
	DIR *dir;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)p->pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((de = readdir(dir)))
		u.fds += de->d_name[0] != '.';
	closedir(dir);
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)p->pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		u.maps += strchr(line, '\n') != NULL;
		u.named_maps += strchr(line, '/') != NULL; /* a path: "/file" or "/memfd:name" */
		u.sanitized |= strstr(line, "/libasan.") || strstr(line, "/libtsan.");
	}
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/status", (int)p->pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			u.rss_kb = atol(line + 6);
	fclose(f);
	return u;
}

struct kvtd_usage
daemon_usage(const struct kvtd_proc *p)
{
	struct kvtd_usage a = usage_once(p), b;

	for (int i = 0; i < 100; i++, a = b) {
		usleep(20000);
		b = usage_once(p);
		if (a.fds == b.fds && a.maps == b.maps)
			return b;
	}
	ck_abort_msg("the daemon's descriptors and mappings never settled");
}
