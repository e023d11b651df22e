/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
/* CODE_FILE/LINE/FUNC would always name vlog() below: the fields a call site sets say more */
#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>

#include "log.h"

static _Atomic int log_level = KVTD_LOG_INFO;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static bool log_journal; /* set once, under log_once */

void
kvtd_log_set_level(int level)
{
	atomic_store_explicit(&log_level, level, memory_order_relaxed);
}

int
kvtd_log_level(void)
{
	return atomic_load_explicit(&log_level, memory_order_relaxed);
}

int
kvtd_log_parse_level(const char *name)
{
	static const char *const names[] = {[KVTD_LOG_ERR] = "err",
					    [KVTD_LOG_WARNING] = "warning",
					    [KVTD_LOG_NOTICE] = "notice",
					    [KVTD_LOG_INFO] = "info",
					    [KVTD_LOG_DEBUG] = "debug"};

	for (int i = KVTD_LOG_ERR; i <= KVTD_LOG_DEBUG; i++)
		if (!strcmp(name, names[i]))
			return i;
	return -EINVAL;
}

int
kvtd_log_stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	int n = 0;

	if (!e || sscanf(e, "%llu:%llu%n", &dev, &ino, &n) != 2 || e[n])
		return 0;
	if (fstat(2, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

static void
log_choose(void)
{
	log_journal = kvtd_log_stderr_is_journal();
}

int
kvtd_log_journal_fields(int level, const struct kvtd_log_fields *f, const char *msg, char *buf,
			size_t len, struct iovec *iov, unsigned max_iov)
{
	size_t off = 0;
	unsigned n = 0;
	int r = 0;

#define FIELD(...)                                                                                 \
	do {                                                                                       \
		int w_;                                                                            \
		if (n == max_iov || off >= len) {                                                  \
			r = -ENOSPC;                                                               \
			break;                                                                     \
		}                                                                                  \
		w_ = snprintf(buf + off, len - off, __VA_ARGS__);                                  \
		if (w_ < 0 || (size_t)w_ >= len - off) {                                           \
			r = -ENOSPC;                                                               \
			break;                                                                     \
		}                                                                                  \
		iov[n].iov_base = buf + off;                                                       \
		iov[n++].iov_len = (size_t)w_;                                                     \
		off += (size_t)w_ + 1;                                                             \
	} while (0)

	FIELD("PRIORITY=%d", level);
	FIELD("SYSLOG_IDENTIFIER=kvtierd");
	if (f && f->session)
		FIELD("SESSION=%u", f->session);
	if (f && f->pid)
		FIELD("PID=%d", (int)f->pid);
	if (f && f->seq)
		FIELD("SEQ=%u", f->seq);
	if (f && f->op)
		FIELD("OP=%s", f->op);
	/* last, so a message cut to fit still leaves the fields in place */
	if (r == 0 && n < max_iov && off + sizeof("MESSAGE=") < len) {
		int w = snprintf(buf + off, len - off, "MESSAGE=%s", msg);

		iov[n].iov_base = buf + off;
		iov[n++].iov_len = w < 0 ? 0 : (size_t)w < len - off ? (size_t)w : len - off - 1;
	} else {
		r = -ENOSPC;
	}
#undef FIELD
	return r < 0 ? r : (int)n;
}

static void
vlog(int level, const struct kvtd_log_fields *f, const char *fmt, va_list ap)
{
	char line[1024];
	int n;

	if (level > kvtd_log_level())
		return;
	pthread_once(&log_once, log_choose);
	if (log_journal) {
		char msg[1024], buf[1536];
		struct iovec iov[8];
		int k;

		vsnprintf(msg, sizeof(msg), fmt, ap);
		k = kvtd_log_journal_fields(level, f, msg, buf, sizeof(buf), iov, 8);
		if (k > 0 && sd_journal_sendv(iov, k) >= 0)
			return;
		/* the journal refused it: stderr still reaches the journal, without fields */
		n = snprintf(line, sizeof(line), "<%d>%s\n", level, msg);
		fwrite(line, 1, n < (int)sizeof(line) ? (size_t)n : sizeof(line) - 1, stderr);
		return;
	}
	/* One write per line so lines from several threads never interleave. */
	n = snprintf(line, sizeof(line), "<%d>", level);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	fwrite(line, 1, n, stderr);
}

void
kvtd_log(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, NULL, fmt, ap);
	va_end(ap);
}

void
kvtd_log_f(int level, const struct kvtd_log_fields *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, f, fmt, ap);
	va_end(ap);
}
