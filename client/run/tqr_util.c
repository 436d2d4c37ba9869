/* tqr_util.c — whole-file reading for tqkv-run's loaders. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tqr_util.h"

int tqr_file_read(const char *path, size_t max_bytes, unsigned char **buf, size_t *len,
		  tqr_error *err)
{
	unsigned char *b = NULL;
	struct stat st;
	size_t n, got = 0;
	int fd, rc;

	*buf = NULL;
	*len = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return tqr_fail(err, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = tqr_fail(err, -errno, "%s: %s", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = tqr_fail(err, -EINVAL, "%s: not a regular file", path);
		goto fail;
	}
	if ((uint64_t)st.st_size > max_bytes) {
		rc = tqr_fail(err, -EFBIG, "%s: %lld bytes, more than the %zu this loader accepts",
			      path, (long long)st.st_size, max_bytes);
		goto fail;
	}
	n = (size_t)st.st_size;
	b = malloc(n + 1);
	if (!b) {
		rc = tqr_fail(err, -ENOMEM, "%s: out of memory for %zu bytes", path, n);
		goto fail;
	}
	while (got < n) {
		ssize_t r = read(fd, b + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = tqr_fail(err, -errno, "%s: read: %s", path, strerror(errno));
			goto fail;
		}
		if (r == 0)
			break; /* shrank while we read: parse what is there */
		got += (size_t)r;
	}
	b[got] = 0;
	close(fd);
	*buf = b;
	*len = got;
	return 0;
fail:
	free(b);
	close(fd);
	return rc;
}
