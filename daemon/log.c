#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[] = {
	[LOG_ERR] = "err", [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
	[LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

/* Written by the main thread (start-up, reload), read by every thread. */
static int cur_level = LOG_INFO;
static int cur_style = LOG_STYLE_PLAIN;

void log_init(void)
{
	const char *js = getenv("JOURNAL_STREAM"), *ns = getenv("NOTIFY_SOCKET");

	log_set_style((js && *js) || (ns && *ns) ? LOG_STYLE_JOURNAL : LOG_STYLE_PLAIN);
}

void log_set_style(enum log_style style)
{
	__atomic_store_n(&cur_style, (int)style, __ATOMIC_RELAXED);
}

void log_set_level(int level)
{
	if (level < LOG_ERR)
		level = LOG_ERR;
	if (level > LOG_DEBUG)
		level = LOG_DEBUG;
	__atomic_store_n(&cur_level, level, __ATOMIC_RELAXED);
}

int log_get_level(void)
{
	return __atomic_load_n(&cur_level, __ATOMIC_RELAXED);
}

bool log_enabled(int level)
{
	return level <= log_get_level();
}

const char *log_level_name(int level)
{
	if (level < LOG_ERR || level > LOG_DEBUG)
		return NULL;
	return level_names[level];
}

int log_level_from_name(const char *name)
{
	for (int l = LOG_ERR; l <= LOG_DEBUG; l++)
		if (strcmp(name, level_names[l]) == 0)
			return l;
	if (strcmp(name, "error") == 0)
		return LOG_ERR;
	if (strcmp(name, "warn") == 0)
		return LOG_WARNING;
	return -EINVAL;
}

void log_msg(int level, const char *fmt, ...)
{
	char line[2048];
	size_t n = 0;
	va_list ap;

	if (!log_enabled(level))
		return;
	if (level < LOG_ERR)
		level = LOG_ERR;
	if (__atomic_load_n(&cur_style, __ATOMIC_RELAXED) == LOG_STYLE_JOURNAL) {
		n = (size_t)snprintf(line, sizeof(line), "<%d>", level);
	} else {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		n = strftime(line, sizeof(line), "%Y-%m-%d %H:%M:%S", &tm);
		n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ld %s: ",
				      ts.tv_nsec / 1000000, log_level_name(level));
	}
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	n += (size_t)m;
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	/* One record per line: a message must not forge a second journal entry. */
	for (size_t i = 0; i < n; i++)
		if (line[i] == '\n')
			line[i] = ' ';
	line[n++] = '\n';
	/* Best effort: a logger has nobody to report its own failure to. */
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}
