/* ringfix.c — see ringfix.h. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "ringfix.h"

#define MiB (1ull << 20)

const struct backend_ops *srv_backend;

int srv_start(struct srv *s, uint64_t pool_bytes, uint32_t workers)
{
	char err[CONFIG_ERR_MAX], why[200];
	const char *text = "[pool]\npool_bytes = 64M\n"
			   "[tenant big]\nlimit = 64M\nallow_uids = *\n"
			   "[tenant small]\nlimit = 1M\nallow_uids = *\n";
	struct pool_params pp = { .bytes = pool_bytes, .page_bytes = RINGFIX_PAGE_BYTES, .numa_node = -1,
				  .hugepages = true, .backend = srv_backend };
	struct ring_params rp = { .n_workers = workers, .attn_threads = 1, .max_clients = 16, .spin_us = 20 };

	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "/tmp/tqkv-test-ring.XXXXXX");
	if (!mkdtemp(s->dir) || config_load_string(&s->cfg, "t.conf", text, err, sizeof(err)) != 0 ||
	    tenant_table_new(&s->tt, &s->cfg) < 0 || pool_new(&s->pool, &pp, why, sizeof(why)) < 0 ||
	    !(s->cache = tq_cache_new()) || kvstore_new(&s->ks, s->pool, s->cache) < 0 ||
	    session_table_new(&s->st, 1000, kvstore_release, s->ks) < 0)
		return -1;
	session_table_set_ending(s->st, kvstore_ending);
	rp.run_dir = s->dir;
	if (ring_server_new(&s->rs, &rp, s->st, s->ks, why, sizeof(why)) < 0) {
		fprintf(stderr, "ring_server_new: %s\n", why);
		return -1;
	}
	return 0;
}

void srv_stop(struct srv *s)
{
	char path[128];

	ring_server_free(s->rs);
	session_table_free(s->st);
	kvstore_free(s->ks);
	tq_cache_free(s->cache);
	pool_free(s->pool);
	tenant_table_free(s->tt);
	snprintf(path, sizeof(path), "%s/%s", s->dir, TQKV_DATA_SOCK);
	unlink(path);
	rmdir(s->dir);
}

int srv_wait_idle(struct srv *s)
{
	struct pool_stats ps;

	pool_stats(s->pool, &ps);
	for (int i = 0; i < 500; i++) {
		struct ring_stats rst;
		ring_server_stats(s->rs, &rst);
		if (rst.clients == 0 && pool_pages_free_count(s->pool) == ps.pages_total)
			return 0;
		usleep(10000);
	}
	return -1;
}

int raw_connect(struct raw *r, const char *dir, uint32_t sqn, uint32_t cqn, uint64_t arena, int how)
{
	struct tqkv_ring_layout lay;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct tqkv_hello h = { TQKV_RING_MAGIC, TQKV_RING_VERSION, 0, sqn, cqn, arena, 0, { 0 } };
	union { struct cmsghdr c; char buf[CMSG_SPACE(sizeof(int))]; } cb;
	struct iovec iov = { &h, sizeof(h) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.buf, .msg_controllen = sizeof(cb.buf) };
	int memfd;

	memset(r, 0, sizeof(*r));
	r->memfd = -1;
	memset(&cb, 0, sizeof(cb));
	if (tqkv_ring_layout(sqn, cqn, arena, &lay) < 0)
		return -EINVAL;
	memfd = memfd_create("raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (memfd < 0 || ftruncate(memfd, (off_t)lay.total_bytes) < 0)
		return -errno;
	if (!(how & RAW_NOSEAL))
		fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
	r->map = mmap(NULL, lay.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	r->bytes = lay.total_bytes;
	r->hdr = (void *)r->map;
	r->sq = (void *)(r->map + lay.sq_off);
	r->cq = (void *)(r->map + lay.cq_off);
	r->arena = r->map + lay.arena_off;
	r->arena_off = lay.arena_off;
	r->sqn = sqn;
	r->cqn = cqn;
	r->arena_bytes = arena;
	h.total_bytes = lay.total_bytes + ((how & RAW_BADSIZE) ? 4096 : 0);
	if (how & RAW_BADMAGIC)
		h.magic ^= 1;
	if (how & RAW_BADVER)
		h.version = (TQKV_RING_VERSION_MAJOR + 1) << 16;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, TQKV_DATA_SOCK);
	r->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (how & RAW_KEEPFD)
		r->memfd = memfd;
	if (connect(r->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -errno;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
	/* a refusal may come before the hello is read (a cap): the daemon
	 * answers first, so its reason is there to read even after EPIPE */
	int sent = sendmsg(r->fd, &m, 0) < 0 ? -errno : 0;
	if (!(how & RAW_KEEPFD))
		close(memfd);
	/* a daemon that closed with our hello unread makes the first read
	 * report ECONNRESET before the queued refusal: read again (as
	 * libtqkv does) */
	ssize_t n = recv(r->fd, &r->w, sizeof(r->w), 0);
	if (n < 0 && errno == ECONNRESET)
		n = recv(r->fd, &r->w, sizeof(r->w), 0);
	if (n != sizeof(r->w))
		return sent < 0 ? sent : -EPROTO;
	return r->w.res;
}

void raw_close(struct raw *r)
{
	if (r->fd > 0)
		close(r->fd);
	if (r->memfd >= 0)
		close(r->memfd);
	if (r->map)
		munmap(r->map, r->bytes);
	memset(r, 0, sizeof(*r));
	r->memfd = -1;
}

void raw_submit(struct raw *r, const struct tqkv_sqe *e)
{
	r->sq[r->tail & (r->sqn - 1)] = *e;
	r->tail++;
	__atomic_store_n(&r->hdr->sq_tail, r->tail, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, &r->hdr->sq_tail, FUTEX_WAKE, 1, NULL, NULL, 0);
}

int raw_reap(struct raw *r, struct tqkv_cqe *out)
{
	for (int i = 0; i < 30000 + 2000; i++) {
		if (__atomic_load_n(&r->hdr->cq_tail, __ATOMIC_ACQUIRE) != r->head) {
			*out = r->cq[r->head & (r->cqn - 1)];
			r->head++;
			__atomic_store_n(&r->hdr->cq_head, r->head, __ATOMIC_SEQ_CST);
			return 0;
		}
		if (i < 2000)
			sched_yield();   /* most answers come within microseconds */
		else
			usleep(100);
	}
	return -ETIMEDOUT;
}

int raw_op(struct raw *r, const struct tqkv_sqe *e, int *res)
{
	struct tqkv_cqe c;
	raw_submit(r, e);
	if (raw_reap(r, &c) < 0)
		return -1000;
	if (c.user_data != e->user_data)
		return -1001;
	*res = c.res;
	return c.status;
}

int raw_attach(struct raw *r, struct srv *s, uint64_t id, int ephemeral)
{
	struct tqkv_sqe e = { .opcode = TQKV_OP_ATTACH, .session = id, .user_data = 1,
			      .flags = ephemeral ? TQKV_SQE_EPHEMERAL : 0 };
	int res;
	if (raw_connect(r, s->dir, 8, 16, 1 * MiB, RAW_OK) < 0)
		return -1;
	return id ? raw_op(r, &e, &res) : 0;
}
