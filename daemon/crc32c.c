#include "crc32c.h"

#include <isa-l/crc.h>

uint32_t tq_crc32c(uint32_t crc, const void *buf, size_t n)
{
	const unsigned char *p = buf;

	while (n) { /* crc32_iscsi takes an int length */
		int k = n > (1u << 30) ? (1 << 30) : (int)n;
		crc = ~crc32_iscsi((unsigned char *)p, k, ~crc);
		p += k;
		n -= (size_t)k;
	}
	return crc;
}
