/* log.h — the daemon's one logger (stderr).
 *
 * Only the top layer logs: main, the RPC handlers and (next) the worker loop.
 * Modules below return negative errno and leave the wording to their caller.
 *
 * Under systemd (JOURNAL_STREAM or NOTIFY_SOCKET set) each line carries a
 * syslog priority prefix ("<3>text") that journald turns into the entry's
 * priority; otherwise lines start with a local timestamp and the level name.
 * Thread-safe: one write(2) per line, so lines from threads never interleave.
 */
#ifndef TQKVD_LOG_H
#define TQKVD_LOG_H

#include <stdbool.h>
#include <syslog.h> /* LOG_ERR .. LOG_DEBUG: the level values */

enum log_style {
	LOG_STYLE_PLAIN = 0,   /* "2025-01-31 12:00:00.123 info: text" */
	LOG_STYLE_JOURNAL = 1, /* "<6>text"                            */
};

/* Picks the style from the environment (JOURNAL_STREAM / NOTIFY_SOCKET). */
void log_init(void);
void log_set_style(enum log_style style);
/* level: LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO or LOG_DEBUG. */
void log_set_level(int level);
int log_get_level(void);
bool log_enabled(int level);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)     log_msg(LOG_ERR, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_notice(...)  log_msg(LOG_NOTICE, __VA_ARGS__)
#define log_info(...)    log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)   do { if (log_enabled(LOG_DEBUG)) log_msg(LOG_DEBUG, __VA_ARGS__); } while (0)

/* "err", "warning", "notice", "info", "debug"; NULL for other values. */
const char *log_level_name(int level);
/* The level for a name above, or -EINVAL. */
int log_level_from_name(const char *name);

#endif
