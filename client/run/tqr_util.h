/* tqr_util.h — what tqkv-run's modules (model, tokenizer, sampler, KV
 * backends) share: the error carrier and whole-file reading.
 *
 * Functions return 0 (or a count) on success and a negative errno on
 * failure; when `err` is not NULL it receives one line saying what was wrong
 * and where (file, field, offset).  Only tqkv-run's main() prints it. */
#ifndef TQR_UTIL_H
#define TQR_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef struct tqr_error {
	char msg[512];
} tqr_error;

/* Writes the message (when err is not NULL) and returns `rc` (a negative errno). */
__attribute__((format(printf, 3, 4)))
static inline int tqr_fail(tqr_error *err, int rc, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* Reads a regular file of at most max_bytes into a new malloc'd buffer
 * (*buf, *len; one extra NUL byte after the data).  -errno of open/read,
 * -EFBIG beyond max_bytes, -EINVAL for a non-regular file, -ENOMEM. */
int tqr_file_read(const char *path, size_t max_bytes, unsigned char **buf, size_t *len,
		  tqr_error *err);

#endif /* TQR_UTIL_H */
