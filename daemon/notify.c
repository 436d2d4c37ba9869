#include "notify.h"

#include <stdio.h>
#include <systemd/sd-daemon.h>
#include <time.h>

int notify_ready(const char *status)
{
	return sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

int notify_reloading(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	/* MONOTONIC_USEC lets systemd (Type=notify-reload) tell this reload
	 * from an earlier one. */
	return sd_notifyf(0, "RELOADING=1\nSTATUS=reloading\nMONOTONIC_USEC=%llu",
			  (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000);
}

int notify_stopping(void)
{
	return sd_notify(0, "STOPPING=1\nSTATUS=stopping: draining in-flight calls");
}

int notify_status(const char *status)
{
	return sd_notifyf(0, "STATUS=%s", status);
}

int notify_extend_timeout(uint64_t usec)
{
	return sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
}

int notify_watchdog(void)
{
	return sd_notify(0, "WATCHDOG=1");
}

uint64_t notify_watchdog_period_usec(void)
{
	uint64_t usec = 0;

	/* > 0 only when WATCHDOG_USEC is set (and WATCHDOG_PID is ours) */
	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return 0;
	return usec / 2;
}
