/* devsim.c — see devsim.h. */

#include "devsim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct sim {
	int fd;
	uint8_t *dev;      /* what the pool hands out: PROT_NONE */
	uint8_t *shadow;   /* the same bytes, readable and writable */
	uint64_t bytes;
};

static struct devsim_stats st;
static uint64_t fail_nth;
static uint64_t fail_att;
static int fail_reg;
static char lost_why[200]; /* set before lost (release), read after it (acquire) */
static int lost;

void devsim_lose(const char *why)
{
	if (why)
		snprintf(lost_why, sizeof(lost_why), "%s", why);
	__atomic_store_n(&lost, why != NULL, __ATOMIC_RELEASE);
}

static int sim_lost(const struct backend_region *r, char *why, size_t whylen)
{
	if (!__atomic_load_n(&lost, __ATOMIC_ACQUIRE))
		return 0;
	snprintf(why, whylen, "%s", lost_why);
	return 1;
}

void devsim_stats(struct devsim_stats *out)
{
	/* the counters move under the daemon's workers: read each atomically */
#define LD(f) out->f = __atomic_load_n(&st.f, __ATOMIC_RELAXED)
	LD(copies_to_dev); LD(copies_from_dev); LD(copy_bytes);
	LD(appends); LD(attends); LD(append_attends); LD(registered); LD(registers);
#undef LD
}

void devsim_fail_register(int on)
{
	__atomic_store_n(&fail_reg, on, __ATOMIC_SEQ_CST);
}

void devsim_fail_attend(uint64_t nth)
{
	__atomic_store_n(&fail_att, nth, __ATOMIC_SEQ_CST);
}

void devsim_fail_copy(uint64_t nth)
{
	__atomic_store_n(&fail_nth, nth, __ATOMIC_SEQ_CST);
}

static int sim_alloc(const struct backend_params *p, struct backend_region *out, char *why, size_t whylen)
{
	struct sim *s = calloc(1, sizeof(*s));
	uint64_t bytes = (p->bytes + 4095) & ~(uint64_t)4095;

	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	if (!s)
		return -ENOMEM;
	s->fd = memfd_create("devsim", MFD_CLOEXEC);
	if (s->fd < 0 || ftruncate(s->fd, (off_t)bytes) < 0) {
		snprintf(why, whylen, "devsim: memfd: %s", strerror(errno));
		goto fail;
	}
	s->dev = mmap(NULL, bytes, PROT_NONE, MAP_SHARED, s->fd, 0);
	s->shadow = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
	if (s->dev == MAP_FAILED || s->shadow == MAP_FAILED) {
		snprintf(why, whylen, "devsim: mmap: %s", strerror(errno));
		goto fail;
	}
	s->bytes = bytes;
	out->base = s->dev;
	out->bytes = bytes;
	out->host_accessible = false;
	out->priv = s;
	snprintf(out->desc, sizeof(out->desc), "simulated device memory (tests)");
	return 0;
fail:
	if (s->dev && s->dev != MAP_FAILED)
		munmap(s->dev, bytes);
	if (s->shadow && s->shadow != MAP_FAILED)
		munmap(s->shadow, bytes);
	if (s->fd >= 0)
		close(s->fd);
	free(s);
	return -ENOMEM;
}

static void sim_free(struct backend_region *r)
{
	struct sim *s = r->priv;

	if (s) {
		munmap(s->dev, s->bytes);
		munmap(s->shadow, s->bytes);
		close(s->fd);
		free(s);
	}
	memset(r, 0, sizeof(*r));
	r->numa_node = -1;
}

static void sim_stats(const struct backend_region *r, struct backend_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->bytes = r->bytes;
	out->resident_bytes = r->bytes;
	out->numa_node = -1;
}

/* A device pointer's host twin, or NULL when p is not in the region. */
static uint8_t *xlat(const struct backend_region *r, const void *p, size_t n)
{
	const struct sim *s = r->priv;
	const uint8_t *b = p;

	if (b < s->dev || b >= s->dev + s->bytes || n > (size_t)(s->dev + s->bytes - b))
		return NULL;
	return s->shadow + (b - s->dev);
}

static int sim_copy(const struct backend_region *r, void *dst, const void *src, size_t n, char *why, size_t whylen)
{
	uint8_t *d = xlat(r, dst, n);
	const uint8_t *sp = xlat(r, src, n);
	uint64_t f = __atomic_load_n(&fail_nth, __ATOMIC_SEQ_CST);

	if (sim_lost(r, why, whylen))
		return -ENOTRECOVERABLE;
	if (f && __atomic_sub_fetch(&fail_nth, 1, __ATOMIC_SEQ_CST) == 0) {
		snprintf(why, whylen, "devsim: injected copy failure");
		return -EIO;
	}
	if (!d && !sp) {
		snprintf(why, whylen, "devsim: a copy between two host buffers");
		return -EINVAL;
	}
	memcpy(d ? d : dst, sp ? sp : src, n);
	__atomic_add_fetch(d ? &st.copies_to_dev : &st.copies_from_dev, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&st.copy_bytes, n, __ATOMIC_RELAXED);
	return 0;
}

static int sim_register(const struct backend_region *r, void *p, size_t n, char *why, size_t whylen)
{
	if (sim_lost(r, why, whylen))
		return -ENOTRECOVERABLE;
	if (__atomic_load_n(&fail_reg, __ATOMIC_SEQ_CST)) {
		snprintf(why, whylen, "devsim: injected registration failure");
		return -ENOMEM;
	}
	__atomic_add_fetch(&st.registered, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&st.registers, 1, __ATOMIC_RELAXED);
	return 0;
}

static void sim_unregister(const struct backend_region *r, void *p)
{
	__atomic_sub_fetch(&st.registered, 1, __ATOMIC_RELAXED);
}

/* The page table with its pages translated: [n] pointers, malloc'ed. */
static const uint8_t **table_xlat(const struct backend_region *r, const struct tq_page_table *pt)
{
	uint64_t pb = tq_page_bytes(&pt->geom);
	const uint8_t **t = malloc(sizeof(*t) * (pt->n_pages + 1));

	if (!t)
		return NULL;
	for (uint32_t i = 0; i < pt->n_pages; i++)
		if (!(t[i] = xlat(r, pt->pages[i], pb))) {
			free(t);
			return NULL;
		}
	return t;
}

static int sim_append(const struct backend_region *r, const struct tqc_append *a, uint32_t *bad, tq_error *err)
{
	const struct tq_page_geom *g = &a->kv->geom;
	const uint8_t **pages = table_xlat(r, a->kv);
	int dim = tq_codec_dim(a->k_codec);
	size_t row = (size_t)dim * tq_dtype_size(a->dtype);
	int e = 0;

	if (sim_lost(r, err->msg, sizeof(err->msg))) {
		free(pages);
		return -ENOTRECOVERABLE;
	}
	if (!pages) {
		snprintf(err->msg, sizeof(err->msg), "devsim: a page outside the region");
		return -EINVAL;
	}
	__atomic_add_fetch(&st.appends, 1, __ATOMIC_RELAXED);
	for (uint32_t t = 0; t < a->n && !e; t++) {
		uint32_t p = a->pos + t, slot = p % g->page_tokens;
		uint8_t *page = (uint8_t *)pages[p / g->page_tokens];
		for (uint32_t h = 0; h < g->n_kv_heads && !e; h++) {
			size_t off = ((size_t)t * g->n_kv_heads + h) * row;
			tq_error te;
			if ((e = tq_encode(a->k_codec, (const uint8_t *)a->k + off, a->dtype, 1,
					   page + tq_page_k_off(g, h, slot), &te)) < 0 ||
			    (e = tq_encode(a->v_codec, (const uint8_t *)a->v + off, a->dtype, 1,
					   page + tq_page_v_off(g, h, slot), &te)) < 0) {
				*bad = t;
				snprintf(err->msg, sizeof(err->msg), "token %u head %u: %.150s", t, h, te.msg);
			}
		}
	}
	free(pages);
	return e;
}

static int sim_attend(const struct backend_region *r, const struct tq_attn_params *p, tq_error *err)
{
	const uint8_t **pages = table_xlat(r, p->kv);
	struct tq_page_table pt = *p->kv;
	struct tq_attn_params ap = *p;
	int e;

	if (sim_lost(r, err->msg, sizeof(err->msg))) {
		free(pages);
		return -ENOTRECOVERABLE;
	}
	if (!pages) {
		snprintf(err->msg, sizeof(err->msg), "devsim: a page outside the region");
		return -EINVAL;
	}
	__atomic_add_fetch(&st.attends, 1, __ATOMIC_RELAXED);
	uint64_t n = __atomic_load_n(&fail_att, __ATOMIC_SEQ_CST);
	if (n && __atomic_sub_fetch(&fail_att, 1, __ATOMIC_SEQ_CST) == 0) {
		free(pages);
		snprintf(err->msg, sizeof(err->msg), "devsim: an injected launch failure");
		return -EIO;
	}
	pt.pages = pages;
	ap.kv = &pt;
	ap.workspace = NULL; /* the GPU path ignores the caller's CPU workspace */
	ap.workspace_bytes = 0;
	e = tq_attend(&ap, err);
	free(pages);
	return e;
}

/* the calling thread's last call: its time on the CPU stands for GPU time */
static __thread double last_us;
static __thread int last_one;

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int sim_append_timed(const struct backend_region *r, const struct tqc_append *a, uint32_t *bad, tq_error *err)
{
	double t0 = now_us();
	int e = sim_append(r, a, bad, err);

	last_us = now_us() - t0;
	last_one = 0;
	return e;
}

static int sim_attend_timed(const struct backend_region *r, const struct tq_attn_params *p, tq_error *err)
{
	double t0 = now_us();
	int e = sim_attend(r, p, err);

	last_us = now_us() - t0;
	last_one = 0;
	return e;
}

static void sim_last_call(const struct backend_region *r, double *gpu_us, int *one_wait)
{
	*gpu_us = last_us;
	*one_wait = last_one;
}

/* As a GPU's queued append: the attention runs over the slots whatever the
 * append found, and the append's failure is the one reported. */
static int sim_append_attend(const struct backend_region *r, const struct tqc_append *a,
			     const struct tq_attn_params *p, uint32_t *bad, int *stage, tq_error *err)
{
	tq_error e2;
	int e1, r2;
	double t0 = now_us();

	last_one = 0;
	*stage = TQC_STAGE_APPEND;
	if ((e1 = sim_append(r, a, bad, err)) == -ENOTRECOVERABLE)
		return e1;
	__atomic_add_fetch(&st.append_attends, 1, __ATOMIC_RELAXED);
	memset(&e2, 0, sizeof(e2));
	r2 = sim_attend(r, p, &e2);
	last_us = now_us() - t0;
	if (e1 < 0)
		return e1;
	if (r2 < 0) {
		*stage = TQC_STAGE_ATTEND;
		*err = e2;
		return r2;
	}
	*stage = TQC_STAGE_NONE;
	last_one = 1;
	return 0;
}

const struct backend_ops backend_devsim = {
	.name = "devsim",
	.page_tokens_align = TQC_PAGE_TOKENS_ALIGN,
	.region_alloc = sim_alloc,
	.region_free = sim_free,
	.stats = sim_stats,
	.copy = sim_copy,
	.host_register = sim_register,
	.host_unregister = sim_unregister,
	.append = sim_append_timed,
	.attend = sim_attend_timed,
	.append_attend = sim_append_attend,
	.last_call = sim_last_call,
	.lost = sim_lost,
};
