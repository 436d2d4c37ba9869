/* notify.h — the systemd service protocol (sd_notify), used by the main
 * thread only.  Without NOTIFY_SOCKET every call is a no-op returning 0.
 *
 *   READY=1       once the control socket accepts calls, and after a reload
 *   RELOADING=1   when SIGHUP starts a reload (with MONOTONIC_USEC)
 *   STATUS=...    a one-line summary, refreshed periodically
 *   WATCHDOG=1    every half WATCHDOG_USEC when the unit sets WatchdogSec
 *   STOPPING=1    when SIGTERM/SIGINT starts the drain
 *   EXTEND_TIMEOUT_USEC=...  while the stop runs (main.c's stop keeper,
 *                 the one call made from another thread: sd_notify opens
 *                 a socket per call)
 */
#ifndef TQKVD_NOTIFY_H
#define TQKVD_NOTIFY_H

#include <stdint.h>

/* Return sd_notify's value: > 0 sent, 0 no NOTIFY_SOCKET, < 0 -errno. */
int notify_ready(const char *status);
int notify_reloading(void);
int notify_stopping(void);
int notify_status(const char *status);
int notify_watchdog(void);
/* Ask for usec more than now before the manager's start/stop timeout. */
int notify_extend_timeout(uint64_t usec);
/* The keep-alive period the manager asks for (half of WATCHDOG_USEC), in
 * microseconds; 0 when the watchdog is off. */
uint64_t notify_watchdog_period_usec(void);

#endif
