/* idstore.c — the persistent session-id high-water mark (see idstore.h). */
#include "idstore.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

#define MAGIC "tqkvd session-ids 1 reserved_through="

struct idstore {
	char path[CONFIG_DIR_MAX + 32];
	char tmp[CONFIG_DIR_MAX + 32];
	char dir[CONFIG_DIR_MAX];
	uint64_t reserved;
};

static int parse(const char *buf, uint64_t *out)
{
	const char *p = buf + strlen(MAGIC);
	char *end;

	if (strncmp(buf, MAGIC, strlen(MAGIC)) != 0 || *p < '0' || *p > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(p, &end, 10);
	if (errno || (*end != '\n' && *end != '\0') || (*end == '\n' && end[1] != '\0'))
		return -EINVAL;
	*out = v;
	return 0;
}

int idstore_open(struct idstore **out, const char *dir, uint64_t *first_id, char *why, size_t whylen)
{
	struct idstore *is = calloc(1, sizeof(*is));
	char buf[128];
	ssize_t n;
	int fd, r;

	*out = NULL;
	if (!is) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	snprintf(is->dir, sizeof(is->dir), "%s", dir);
	snprintf(is->path, sizeof(is->path), "%s/%s", dir, IDSTORE_FILE);
	snprintf(is->tmp, sizeof(is->tmp), "%s/%s.tmp", dir, IDSTORE_FILE);
	fd = open(is->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 && errno != ENOENT) {
		r = -errno;
		snprintf(why, whylen, "%s: %s", is->path, strerror(errno));
		goto fail;
	}
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		r = n < 0 ? -errno : 0;
		close(fd);
		if (r < 0) {
			snprintf(why, whylen, "%s: %s", is->path, strerror(-r));
			goto fail;
		}
		buf[n] = '\0';
		if (parse(buf, &is->reserved) < 0 || is->reserved == UINT64_MAX) {
			r = -EINVAL;
			snprintf(why, whylen, "%s is not a session-id file (expected \"%sN\"); it keeps ids "
				 "from repeating across restarts, so tqkvd will not guess: restore it, or "
				 "delete it if no client may remember a session id", is->path, MAGIC);
			goto fail;
		}
	}
	*first_id = is->reserved + 1;
	*out = is;
	return 0;
fail:
	free(is);
	return r;
}

int idstore_reserve(void *ctx, uint64_t through, char *why, size_t whylen)
{
	struct idstore *is = ctx;
	char buf[128];
	int fd, dfd, r = 0, k;

	k = snprintf(buf, sizeof(buf), MAGIC "%" PRIu64 "\n", through);
	fd = open(is->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
	if (fd < 0)
		goto fail_errno;
	ssize_t w = write(fd, buf, (size_t)k);
	if (w != k) {
		r = w < 0 ? -errno : -EIO; /* a short write sets no errno */
		close(fd);
		goto fail_tmp;
	}
	if (fsync(fd) < 0) {
		r = -errno;
		close(fd);
		goto fail_tmp;
	}
	close(fd);
	if (rename(is->tmp, is->path) < 0) {
		r = -errno;
		goto fail_tmp;
	}
	/* the rename itself must survive a crash: a directory that cannot be
	 * opened to sync it (out of descriptors) is a failure too, or ids
	 * handed out now could come again after a power loss */
	if ((dfd = open(is->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		goto fail_errno;
	if (fsync(dfd) < 0)
		r = -errno;
	close(dfd);
	if (r < 0)
		goto fail;
	is->reserved = through;
	return 0;
fail_tmp:
	unlink(is->tmp);
	goto fail;
fail_errno:
	r = -errno;
fail:
	snprintf(why, whylen, "cannot persist the session-id counter in %s: %s", is->path, strerror(-r));
	return r;
}

void idstore_close(struct idstore *is)
{
	free(is);
}
