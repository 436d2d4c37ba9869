/* crc32c.h — crc32c (Castagnoli), the checksum of everything tqkvd writes
 * to disk (spill pages, manifests, journals); ISA-L does the work. */
#ifndef TQKVD_CRC32C_H
#define TQKVD_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c of n bytes, continuing from crc (0 to start). */
uint32_t tq_crc32c(uint32_t crc, const void *buf, size_t n);

#endif
