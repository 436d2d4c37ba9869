/* tq_size.h — the text form of byte sizes, one grammar for the config file
 * (daemon/config.c) and the command lines (tqctl, libtqkv users).
 *
 *   parse:  an integer with an optional binary unit K, M, G, T, P, each may
 *           be followed by "iB" or "B" ("512M" = "512MiB" = 512 * 2^20);
 *           surrounding blanks allowed.  0, -EINVAL (not a size) or -ERANGE.
 *   format: "1.50 GiB" — 3 significant digits, for tables and messages.
 * Header-only (static inline): daemon and client share it without linking
 * each other. */
#ifndef TQ_SIZE_H
#define TQ_SIZE_H

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline int tq_size_parse(const char *s, uint64_t *out)
{
	static const char units[] = "KMGTP";
	const char *p = s, *u;
	uint64_t v = 0;
	unsigned shift = 0;

	while (isspace((unsigned char)*p))
		p++;
	if (!isdigit((unsigned char)*p))
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++) {
		if (v > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	while (*p == ' ')
		p++;
	u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
	if (u) {
		shift = 10 * (unsigned)(u - units + 1);
		p++;
	}
	if (shift && (strcmp(p, "iB") == 0 || strcmp(p, "B") == 0 || strcmp(p, "b") == 0))
		p += strlen(p);
	else if (!shift && (strcmp(p, "B") == 0 || strcmp(p, "b") == 0))
		p++;
	while (isspace((unsigned char)*p))
		p++;
	if (*p)
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = v << shift;
	return 0;
}

static inline void tq_size_format_human(uint64_t v, char *buf, size_t n)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024.0 && u < 6) {
		d /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%" PRIu64 " B", v);
	else if (d < 10.0)
		snprintf(buf, n, "%.2f %s", d, unit[u]);
	else if (d < 100.0)
		snprintf(buf, n, "%.1f %s", d, unit[u]);
	else
		snprintf(buf, n, "%.0f %s", d, unit[u]);
}

#endif
