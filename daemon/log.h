/* SPDX-License-Identifier: MIT */
/*
 * log.h - daemon logging. Under systemd, when stderr is the journal's stream (JOURNAL_STREAM
 * names stderr's device and inode), each message goes to the journal through sd_journal_sendv()
 * with PRIORITY= and, where the call site knows them, structured fields: SESSION= (session id),
 * PID= (the client's pid), SEQ= (sequence id), OP= (opcode name), so `journalctl SESSION=3`
 * finds one session's story. Elsewhere it writes one line per message to stderr with an
 * sd-daemon level prefix ("<3>..."), which a journal reading stderr also turns into priorities.
 * The level threshold and the output chosen at the first message are the process-wide state
 * the daemon keeps, because every thread logs and a log call must not need a context pointer.
 */
#ifndef KVTD_LOG_H
#define KVTD_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum {
	KVTD_LOG_ERR = 3,
	KVTD_LOG_WARNING = 4,
	KVTD_LOG_NOTICE = 5,
	KVTD_LOG_INFO = 6,
	KVTD_LOG_DEBUG = 7
};

/* What a message is about; zero / NULL members are left out. */
struct kvtd_log_fields {
	uint32_t session;
	int32_t pid;
	uint32_t seq;
	const char *op;
};

void kvtd_log_set_level(int level);
int kvtd_log_level(void);
/* "err", "warning", "notice", "info", "debug" -> level, or -EINVAL. */
int kvtd_log_parse_level(const char *name);
void kvtd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As kvtd_log(), with structured fields for the journal (@f may be NULL). */
void kvtd_log_f(int level, const struct kvtd_log_fields *f, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * kvtd_log_journal_fields() - the journal entry of one message: "PRIORITY=",
 * "SYSLOG_IDENTIFIER=kvtierd", SESSION=, PID=, SEQ=, OP= for the members of @f that are set, and
 * "MESSAGE=@msg" last (cut to fit), each an iovec into @buf (@len bytes). Returns the number of
 * iovecs (at most @max_iov), or -ENOSPC when @buf or @iov is too small for the fields.
 */
int kvtd_log_journal_fields(int level, const struct kvtd_log_fields *f, const char *msg, char *buf,
			    size_t len, struct iovec *iov, unsigned max_iov);

/* kvtd_log_stderr_is_journal() - 1 when $JOURNAL_STREAM ("DEV:INODE") names file descriptor 2,
 * as systemd sets it for a service whose stderr is the journal; else 0. */
int kvtd_log_stderr_is_journal(void);

#define log_err(...)	kvtd_log(KVTD_LOG_ERR, __VA_ARGS__)
#define log_warn(...)	kvtd_log(KVTD_LOG_WARNING, __VA_ARGS__)
#define log_notice(...) kvtd_log(KVTD_LOG_NOTICE, __VA_ARGS__)
#define log_info(...)	kvtd_log(KVTD_LOG_INFO, __VA_ARGS__)
#define log_debug(...)	kvtd_log(KVTD_LOG_DEBUG, __VA_ARGS__)

#endif
