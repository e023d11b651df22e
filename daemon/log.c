/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static _Atomic int log_level = KVTD_LOG_INFO;

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

void
kvtd_log(int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	if (level > kvtd_log_level())
		return;
	/* One write per line so lines from several threads never interleave. */
	n = snprintf(line, sizeof(line), "<%d>", level);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	fwrite(line, 1, n, stderr);
}
