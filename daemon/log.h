/* SPDX-License-Identifier: MIT */
/*
 * log.h - daemon logging to stderr with sd-daemon level prefixes ("<3>..."), which journald
 * turns into priorities. The level threshold is the one piece of process-wide state the daemon
 * keeps, because every thread logs and a log call must not need a context pointer.
 */
#ifndef KVTD_LOG_H
#define KVTD_LOG_H

enum {
	KVTD_LOG_ERR = 3,
	KVTD_LOG_WARNING = 4,
	KVTD_LOG_NOTICE = 5,
	KVTD_LOG_INFO = 6,
	KVTD_LOG_DEBUG = 7
};

void kvtd_log_set_level(int level);
int kvtd_log_level(void);
/* "err", "warning", "notice", "info", "debug" -> level, or -EINVAL. */
int kvtd_log_parse_level(const char *name);
void kvtd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)	kvtd_log(KVTD_LOG_ERR, __VA_ARGS__)
#define log_warn(...)	kvtd_log(KVTD_LOG_WARNING, __VA_ARGS__)
#define log_notice(...) kvtd_log(KVTD_LOG_NOTICE, __VA_ARGS__)
#define log_info(...)	kvtd_log(KVTD_LOG_INFO, __VA_ARGS__)
#define log_debug(...)	kvtd_log(KVTD_LOG_DEBUG, __VA_ARGS__)

#endif
