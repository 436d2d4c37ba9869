/* tq_cuda.c — tq_cuda.h with CUDA: devices, memory, contexts, and the host
 * half of quantize-append and attention (checks, parameter structs from the
 * codecs, staging, launches, errors).  The kernels are in tq_cuda_encode.cu
 * and tq_cuda_attn.cu; tq_cuda_internal.h is the ABI between the two halves.
 *
 * Staging: a kernel reads and writes only memory the device can address.
 * Inputs and outputs the caller hands in are classified with
 * cudaPointerGetAttributes (locate): device memory of this device, managed
 * memory and mapped (registered / pinned) host memory are used in place,
 * through the device address the runtime gives; plain host memory goes
 * through the context's pinned staging and device scratch, another device's
 * memory through device scratch (peer copies), with async copies on the
 * context's stream.  Every call synchronizes its stream
 * before returning, so between calls a context's stream is idle: scratch,
 * staging and the dense-rotation cache are grown or evicted only then.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tq_attn_internal.h"
#include "tq_cuda.h"
#include "tq_cuda_internal.h"

_Static_assert(TQC_TILE == TQC_PAGE_TOKENS_ALIGN, "tq_cuda.h promises the tiled kernel pages of this many tokens");

#define REGION_ALIGN   ((size_t)2 << 20)   /* tqc_region_alloc: 2 MiB             */
#define SCRATCH_ALIGN  256u                /* every scratch / staging sub-buffer  */
#define ROT_CACHE      8                   /* dense rotations kept per context    */
#define LOG2E          1.4426950408889634

/* append: tokens per launch (a launch's vectors fit the status word's 32-bit
 * index with room: 32768 x 2 x 1024 heads = 2^26) and staged input bytes per
 * launch when the input is plain host memory */
#define ENC_PASS_TOKENS 32768u
#define ENC_STAGE_BYTES ((size_t)32 << 20)
/* attention: q floats per pass (queries, qrot and the staged out are this
 * big), partial floats per pass at most (unless one split needs more),
 * tokens per split at least, CTAs per SM the split count aims at */
#define ATT_PASS_FLOATS ((size_t)4 << 20)
#define ATT_PART_FLOATS ((size_t)16 << 20)
#define ATT_SPLIT_MIN   512u /* 256 was slower at 8k: BENCHMARKS 2b */
#define ATT_CTAS_PER_SM 4
/* A call that starts while another attention call of this process is in
 * flight on its device shares the GPU: its splits are at least
 * kv_len / ATT_SHARED_SPLITS keys, at most ATT_SHARED_LEN (and never below
 * the shortest split).  On an H100, 16 concurrent 32k calls with 16
 * splits of 2048 keys took 20 % less time a round than with 32 of 1024,
 * while a lone call was 9 % slower (BENCHMARKS 2b): the lone call keeps its
 * plan.  8k keeps 16 splits of 512 (4 of 2048 measured no better there);
 * from 64k on the plan is the lone one (its splits are longer already). */
#define ATT_SHARED_SPLITS 16u
#define ATT_SHARED_LEN    2048u

/* ---- messages ------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4)))
static int say(char *why, size_t whylen, const char *fmt, ...)
{
	if (why && whylen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return 0;
}

/* The errno for a failed CUDA call (after start). */
static int cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaErrorMemoryAllocation: return -ENOMEM;
	case cudaErrorInvalidDevice:
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver: return -ENODEV;
	default: return -EIO;
	}
}

/* ---- a lost device ----------------------------------------------------------------
 * Some errors leave the process's CUDA context unusable: they are "sticky"
 * (every later call on the context returns them) and what the device's
 * memory held is gone with the context — a kernel's illegal address or
 * instruction, a hardware exception, an uncorrectable ECC or NVLink error,
 * a device that fell off the bus.  The first one is remembered: from then
 * on every call here fails at once with -ENOTRECOVERABLE and its reason,
 * and tqc_device_lost says so (tqkvd then stops, for its supervisor to
 * start it again on a new context).  Set once, never cleared. */
static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;
static int lost_flag;        /* atomic; lost_why is immutable once it is set */
static char lost_why[320];

/* The errors the CUDA documentation calls sticky ("the process must be
 * terminated and relaunched"); an unknown error only when the device
 * refuses a synchronization after it too (a device off the bus answers
 * every call so; a one-off does not cost the process its sessions). */
static int cuda_sticky(cudaError_t e)
{
	switch ((int)e) {
	/* by number, for headers older than CUDA 13's, which name them and
	 * call all three sticky: error containment (Hopper and later), a
	 * leaked tensor memory allocation, an MPS client its server ended */
	case 226: /* cudaErrorContained */
	case 721: /* cudaErrorTensorMemoryLeak */
	case 810: /* cudaErrorMpsClientTerminated */
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorLaunchTimeout:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorECCUncorrectable:
	case cudaErrorNvlinkUncorrectable:
	case cudaErrorContextIsDestroyed:
	case cudaErrorExternalDevice: return 1;
	case cudaErrorUnknown: return cudaDeviceSynchronize() != cudaSuccess;
	default: return 0;
	}
}

static void lost_note(const char *what, cudaError_t e)
{
	int dev = -1;

	if (cudaGetDevice(&dev) != cudaSuccess)
		dev = -1;
	pthread_mutex_lock(&lost_mu);
	if (!__atomic_load_n(&lost_flag, __ATOMIC_RELAXED)) {
		snprintf(lost_why, sizeof(lost_why),
			 "CUDA device %d failed (%s: %s, %s): its context is lost and its memory with it; "
			 "GPU calls fail until a restart", dev, what,
			 cudaGetErrorString(e), cudaGetErrorName(e));
		__atomic_store_n(&lost_flag, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lost_mu);
}

int tqc_device_lost(char *why, size_t whylen)
{
	if (!__atomic_load_n(&lost_flag, __ATOMIC_ACQUIRE))
		return 0;
	say(why, whylen, "%s", lost_why);
	return 1;
}

/* -ENOTRECOVERABLE with the reason once the device is lost, else 0 */
static int lost_fail(char *why, size_t whylen)
{
	return tqc_device_lost(why, whylen) ? -ENOTRECOVERABLE : 0;
}

static int lost_err(tq_error *err)
{
	return lost_fail(err ? err->msg : NULL, err ? sizeof(err->msg) : 0);
}

/* Names the failed call; clears the thread's last-error state so that a
 * later launch check does not see this error as its own.  A sticky error
 * marks the device lost (-ENOTRECOVERABLE). */
static int cuda_fail(char *why, size_t whylen, const char *what, cudaError_t e)
{
	(void)cudaGetLastError();
	if (cuda_sticky(e)) {
		lost_note(what, e);
		return lost_fail(why, whylen);
	}
	say(why, whylen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
	return cuda_errno(e);
}

static int err_fail(tq_error *err, const char *what, cudaError_t e)
{
	return cuda_fail(err ? err->msg : NULL, err ? sizeof(err->msg) : 0, what, e);
}

/* ---- devices -------------------------------------------------------------------- */

int tqc_built(void)
{
	return 1;
}

int tqc_device_count(char *why, size_t whylen)
{
	/* the runtime reports a missing driver as an old one: look first */
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char *de = dlerror();
		say(why, whylen, "no CUDA driver: libcuda.so.1 not found (%s)", de ? de : "dlopen failed");
		return -ENODEV;
	}
	dlclose(lib);

	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaErrorInsufficientDriver) {
		int drv = 0, rt = 0;
		(void)cudaDriverGetVersion(&drv);
		(void)cudaRuntimeGetVersion(&rt);
		(void)cudaGetLastError();
		if (drv <= 0) /* a libcuda.so.1 without a working driver behind it */
			say(why, whylen,
			    "CUDA driver unusable: libcuda.so.1 is present but reports no CUDA version "
			    "(a broken or mismatched NVIDIA driver install?); this build's runtime is CUDA %d.%d",
			    rt / 1000, rt % 1000 / 10);
		else
			say(why, whylen,
			    "CUDA driver too old for this build's CUDA runtime: the driver supports CUDA %d.%d, "
			    "the runtime is CUDA %d.%d (update the NVIDIA driver)",
			    drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
		return -ENODEV;
	}
	if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0)) {
		(void)cudaGetLastError();
		say(why, whylen, "no CUDA device");
		return -ENODEV;
	}
	if (e != cudaSuccess) { /* the driver's probe: no context to lose yet */
		(void)cudaGetLastError();
		say(why, whylen, "no usable CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
		    cudaGetErrorName(e));
		return -ENODEV;
	}
	return n;
}

/* Makes `device` current for this thread: 0, or -ENODEV / -EIO with why
 * (the reason of tqc_device_count when there is no usable device at all). */
static int set_device(int device, char *why, size_t whylen)
{
	cudaError_t e = device >= 0 ? cudaSetDevice(device) : cudaErrorInvalidDevice;

	if (e == cudaSuccess)
		return 0;
	(void)cudaGetLastError();
	int n = tqc_device_count(why, whylen);
	if (n < 0)
		return n;
	if (device < 0 || device >= n) {
		say(why, whylen, "no CUDA device %d (there are %d)", device, n);
		return -ENODEV;
	}
	return cuda_fail(why, whylen, "cudaSetDevice", e);
}

/* The same, cheaper, for a device a context already proved to exist. */
static int set_ctx_device(int device, tq_error *err)
{
	cudaError_t e = cudaSetDevice(device);

	return e == cudaSuccess ? 0 : err_fail(err, "cudaSetDevice", e);
}

static int attr(enum cudaDeviceAttr a, int device)
{
	int v = 0;

	if (cudaDeviceGetAttribute(&v, a, device) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return v;
}

int tqc_device_query(int device, struct tqc_device_info *out, char *why, size_t whylen)
{
	struct cudaDeviceProp pr;
	size_t fr = 0, tot = 0;
	cudaError_t e;
	int rc;

	if (!out)
		return say(why, whylen, "tqc_device_query: NULL info"), -EINVAL;
	memset(out, 0, sizeof(*out));
	if ((rc = set_device(device, why, whylen)) < 0)
		return rc;
	if ((e = cudaGetDeviceProperties(&pr, device)) != cudaSuccess)
		return cuda_fail(why, whylen, "cudaGetDeviceProperties", e);
	out->device = device;
	size_t nl = strnlen(pr.name, sizeof(out->name) - 1); /* pr.name is longer */
	memcpy(out->name, pr.name, nl);
	out->name[nl] = '\0';
	out->cc_major = pr.major;
	out->cc_minor = pr.minor;
	out->sms = pr.multiProcessorCount;
	out->integrated = attr(cudaDevAttrIntegrated, device);
	out->pageable_access = attr(cudaDevAttrPageableMemoryAccess, device);
	out->host_page_tables = attr(cudaDevAttrPageableMemoryAccessUsesHostPageTables, device);
	out->host_register = attr(cudaDevAttrHostRegisterSupported, device);
	out->managed = attr(cudaDevAttrManagedMemory, device);
	out->smem_block_optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
	out->smem_sm = attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
	out->total_bytes = pr.totalGlobalMem;
	if ((e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess)
		return cuda_fail(why, whylen, "cudaMemGetInfo", e);
	out->free_bytes = fr;
	if (tot)
		out->total_bytes = tot;
	/* kHz x bus bytes x 2 (double data rate) */
	double khz = attr(cudaDevAttrMemoryClockRate, device), bus = attr(cudaDevAttrGlobalMemoryBusWidth, device);
	out->peak_gbps = khz * 1e3 * (bus / 8.0) * 2.0 / 1e9;
	(void)cudaDriverGetVersion(&out->driver_version);
	(void)cudaRuntimeGetVersion(&out->runtime_version);
	(void)cudaGetLastError();
	return 0;
}

void tqc_device_release(int device)
{
	int n = 0;

	if (device >= 0 && cudaGetDeviceCount(&n) == cudaSuccess && device < n && cudaSetDevice(device) == cudaSuccess)
		(void)cudaDeviceReset();
	(void)cudaGetLastError();
}

int tqc_device_unified(const struct tqc_device_info *d)
{
	/* HMM (an x86 host with the open kernel modules) also reads pageable
	 * memory, through a mirror of the host's page tables: a pool there
	 * would sit in host DRAM behind PCIe, not in the GPU's memory */
	return d && (d->integrated || (d->pageable_access && d->host_page_tables));
}

/* ---- memory --------------------------------------------------------------------- */

/* Regions that had to be over-allocated for their 2 MiB alignment: the
 * pointer handed out and the one to free.  A region that came aligned is
 * not listed. */
struct region {
	void *user, *base;
	struct region *next;
};
static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions;

static cudaError_t raw_alloc(void **p, size_t bytes, int unified)
{
	*p = NULL;
	return unified ? cudaHostAlloc(p, bytes, cudaHostAllocMapped | cudaHostAllocPortable)
		       : cudaMalloc(p, bytes);
}

static void raw_free(void *p, int unified)
{
	if (unified)
		(void)cudaFreeHost(p);
	else
		(void)cudaFree(p);
	(void)cudaGetLastError();
}

int tqc_region_alloc(int device, uint64_t bytes, int unified, void **out, char *why, size_t whylen)
{
	void *base = NULL, *user;
	cudaError_t e;
	int rc;

	if (out)
		*out = NULL;
	if (!out || bytes == 0 || bytes > (uint64_t)SIZE_MAX - REGION_ALIGN)
		return say(why, whylen, "region: bad size %llu", (unsigned long long)bytes), -EINVAL;
	if ((rc = lost_fail(why, whylen)) < 0 || (rc = set_device(device, why, whylen)) < 0)
		return rc;
	if ((e = raw_alloc(&base, (size_t)bytes, unified)) != cudaSuccess)
		goto fail;
	user = base;
	if ((uintptr_t)base & (REGION_ALIGN - 1)) {
		struct region *r = malloc(sizeof(*r));
		raw_free(base, unified);
		if (!r)
			return say(why, whylen, "region: out of memory"), -ENOMEM;
		if ((e = raw_alloc(&base, (size_t)bytes + REGION_ALIGN, unified)) != cudaSuccess) {
			free(r);
			goto fail;
		}
		user = (void *)(((uintptr_t)base + REGION_ALIGN - 1) & ~(uintptr_t)(REGION_ALIGN - 1));
		r->user = user;
		r->base = base;
		pthread_mutex_lock(&region_lock);
		r->next = regions;
		regions = r;
		pthread_mutex_unlock(&region_lock);
	}
	if (unified) {
		/* the contract: the same address on the host and the device */
		void *dp = NULL;
		if ((e = cudaHostGetDevicePointer(&dp, user, 0)) != cudaSuccess || dp != user) {
			tqc_region_free(device, user, unified);
			if (e != cudaSuccess)
				return cuda_fail(why, whylen, "region: cudaHostGetDevicePointer", e);
			say(why, whylen, "region: device %d maps host memory at another address", device);
			return -ENODEV;
		}
	}
	*out = user;
	return 0;
fail:
	rc = cuda_fail(why, whylen, unified ? "region: cudaHostAlloc" : "region: cudaMalloc", e);
	if (rc == -ENOMEM)
		say(why, whylen, "region of %llu bytes on device %d: out of %s memory", (unsigned long long)bytes,
		    device, unified ? "pinned host" : "device");
	return rc;
}

void tqc_region_free(int device, void *p, int unified)
{
	void *base = p;

	if (!p)
		return;
	pthread_mutex_lock(&region_lock);
	for (struct region **pp = &regions; *pp; pp = &(*pp)->next)
		if ((*pp)->user == p) {
			struct region *r = *pp;
			base = r->base;
			*pp = r->next;
			free(r);
			break;
		}
	pthread_mutex_unlock(&region_lock);
	if (cudaSetDevice(device) != cudaSuccess)
		(void)cudaGetLastError();
	raw_free(base, unified);
}

int tqc_host_register(int device, void *p, size_t bytes, char *why, size_t whylen)
{
	cudaError_t e;
	int rc;

	if (!p || !bytes)
		return say(why, whylen, "host register: NULL or empty range"), -EINVAL;
	if ((rc = lost_fail(why, whylen)) < 0 || (rc = set_device(device, why, whylen)) < 0)
		return rc;
	e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
	if (e == cudaSuccess)
		return 0;
	rc = cuda_fail(why, whylen, "cudaHostRegister", e);
	switch (e) {
	case cudaErrorHostMemoryAlreadyRegistered: return -EEXIST;
	case cudaErrorNotSupported: return -EOPNOTSUPP;
	case cudaErrorInvalidValue: return -EINVAL;
	default: return rc;
	}
}

void tqc_host_unregister(int device, void *p)
{
	if (!p)
		return;
	if (cudaSetDevice(device) != cudaSuccess || cudaHostUnregister(p) != cudaSuccess)
		(void)cudaGetLastError();
}

int tqc_copy(int device, void *dst, const void *src, size_t bytes, char *why, size_t whylen)
{
	cudaError_t e;
	int rc;

	if (!bytes)
		return 0;
	if (!dst || !src)
		return say(why, whylen, "copy: NULL pointer"), -EINVAL;
	if ((rc = lost_fail(why, whylen)) < 0 || (rc = set_device(device, why, whylen)) < 0)
		return rc;
	/* From pageable host memory cudaMemcpy may return once the bytes are
	 * staged, before they land; the workers' streams do not wait for the
	 * legacy stream: the copy is synchronized before a kernel can read it */
	if ((e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)) != cudaSuccess ||
	    (e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess)
		return (rc = cuda_fail(why, whylen, "copy: cudaMemcpy", e)) == -ENOTRECOVERABLE ? rc : -EIO;
	return 0;
}

void *tqc_pinned_alloc(int device, size_t bytes)
{
	void *p = NULL;

	if (!bytes || lost_fail(NULL, 0) < 0 || set_device(device, NULL, 0) < 0)
		return NULL;
	if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	return p;
}

void tqc_pinned_free(void *p)
{
	if (p && cudaFreeHost(p) != cudaSuccess)
		(void)cudaGetLastError();
}

/* ---- contexts ------------------------------------------------------------------- */

struct rot_ent {
	int dim;                 /* 0: empty */
	uint64_t seed;
	float *mat, *mat_t;      /* device copies of R and R^T */
	uint64_t used;           /* LRU stamp */
};

struct tqc_ctx {
	int device;
	int sms;
	int smem_optin;          /* shared memory a kernel may ask for, bytes      */
	int mc_dim;              /* mma_config: its answer (mc_warps, mc_per_sm)   */
	uint32_t mc_kb, mc_vb;   /* for (mc_dim, mc_kb, mc_vb, mc_ko); mc_dim 0:   */
	int mc_ko;               /* none                                          */
	int mc_warps, mc_per_sm;
	int attn_general;        /* TQ_CUDA_ATTN=general: never attn_mma            */
	int enc_general;         /* TQ_CUDA_ENC=general: never enc_reg              */
	int ctas_per_sm;         /* TQ_CUDA_CTAS_PER_SM, else 0: ATT_CTAS_PER_SM    */
	uint32_t split_min;      /* TQ_CUDA_SPLIT_MIN, else ATT_SPLIT_MIN           */
	uint32_t shared_len;     /* TQ_CUDA_SPLIT_SHARED, else ATT_SHARED_LEN       */
	uint32_t enc_pass;       /* TQ_CUDA_ENC_PASS, else ENC_PASS_TOKENS          */
				 /* (attn_mma: at most as many as run at once)     */
	const char *last_attn;   /* tqc_ctx_last_attn                              */
	const char *last_enc;    /* tqc_ctx_last_append                            */
	int plan_warps, plan_per_sm, plan_splits; /* the last pass's, in words by */
	uint32_t plan_len;       /* tqc_ctx_last_attn_plan into attn_plan           */
	int plan_shared;         /* planned as sharing the GPU (att_inflight)       */
	int ev0_kept;            /* attend: the GPU time's start is recorded (by    */
				 /* tqc_append_attend's queued append)             */
	int last_fused;          /* tqc_ctx_last_fused                              */
	char attn_plan[160];
	cudaStream_t stream;
	cudaEvent_t ev0, ev1;
	double last_us;
	uint8_t *dev;            /* device scratch */
	size_t dev_cap;
	uint8_t *pin;            /* pinned staging */
	uint8_t *enc_state;      /* device: the encoder's status word and CTA count */
	uint32_t *att_cnt;       /* device: attn_mma's per-row-block counts, zeros  */
	size_t att_cnt_cap;
	unsigned long long *report, *report_dev; /* host-mapped: its report       */
	size_t pin_cap;
	struct rot_ent rot[ROT_CACHE];
	uint64_t tick;
};

int tqc_ctx_new(tqc_ctx **out, int device, tq_error *err)
{
	char why[sizeof(((tq_error *)0)->msg)];
	tqc_ctx *x;
	cudaError_t e;
	int rc;

	if (!out)
		return tq_fail(err, "tqc_ctx_new: NULL out");
	*out = NULL;
	if ((rc = lost_fail(why, sizeof(why))) < 0 || (rc = set_device(device, why, sizeof(why))) < 0) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "%s", why);
		return rc;
	}
	if (!(x = calloc(1, sizeof(*x)))) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "GPU context: out of memory");
		return -ENOMEM;
	}
	x->device = device;
	x->sms = attr(cudaDevAttrMultiProcessorCount, device);
	if (x->sms < 1)
		x->sms = 1;
	x->smem_optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
	x->last_attn = "";
	x->last_enc = "";
	/* knobs for tests and tuning (tq_cuda.h) */
	const char *ev = getenv("TQ_CUDA_ATTN");
	x->attn_general = ev && !strcmp(ev, "general");
	ev = getenv("TQ_CUDA_ENC");
	x->enc_general = ev && !strcmp(ev, "general");
	ev = getenv("TQ_CUDA_CTAS_PER_SM");
	x->ctas_per_sm = ev && atoi(ev) >= 1 && atoi(ev) <= 64 ? atoi(ev) : 0;
	ev = getenv("TQ_CUDA_SPLIT_MIN");
	x->split_min = ev && atoi(ev) >= 32 && atoi(ev) <= (1 << 20) ? (uint32_t)atoi(ev) : ATT_SPLIT_MIN;
	ev = getenv("TQ_CUDA_SPLIT_SHARED");
	x->shared_len = ev && atoi(ev) >= 32 && atoi(ev) <= (1 << 20) ? (uint32_t)atoi(ev) : ATT_SHARED_LEN;
	ev = getenv("TQ_CUDA_ENC_PASS");
	x->enc_pass = ev && atoi(ev) >= 1 && atoi(ev) <= (int)ENC_PASS_TOKENS ? (uint32_t)atoi(ev) : ENC_PASS_TOKENS;
	if ((e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		rc = err_fail(err, "GPU context: cudaStreamCreateWithFlags", e);
		free(x);
		return rc;
	}
	if ((e = cudaEventCreate(&x->ev0)) != cudaSuccess || (e = cudaEventCreate(&x->ev1)) != cudaSuccess) {
		rc = err_fail(err, "GPU context: cudaEventCreate", e);
		tqc_ctx_free(x);
		return rc;
	}
	/* the encoder's status (~0: nothing failed) and finished-CTA count (0),
	 * which each launch leaves as it found them, and its host-mapped report */
	static const uint64_t enc_init[2] = { ~(uint64_t)0, 0 };
	void *rp = NULL, *rd = NULL;
	if ((e = cudaMalloc((void **)&x->enc_state, sizeof(enc_init))) != cudaSuccess ||
	    (e = cudaMemcpy(x->enc_state, enc_init, sizeof(enc_init), cudaMemcpyHostToDevice)) != cudaSuccess ||
	    (e = cudaHostAlloc(&rp, sizeof(unsigned long long), cudaHostAllocMapped | cudaHostAllocPortable)) !=
		    cudaSuccess ||
	    (x->report = rp, (e = cudaHostGetDevicePointer(&rd, rp, 0)) != cudaSuccess)) {
		rc = err_fail(err, "GPU context: the encoder's status words", e);
		tqc_ctx_free(x);
		return rc;
	}
	x->report_dev = rd;
	*out = x;
	return 0;
}

void tqc_ctx_free(tqc_ctx *x)
{
	if (!x)
		return;
	if (cudaSetDevice(x->device) == cudaSuccess && x->stream)
		(void)cudaStreamSynchronize(x->stream);
	for (int i = 0; i < ROT_CACHE; i++) {
		if (x->rot[i].mat)
			(void)cudaFree(x->rot[i].mat);
		if (x->rot[i].mat_t)
			(void)cudaFree(x->rot[i].mat_t);
	}
	if (x->dev)
		(void)cudaFree(x->dev);
	if (x->pin)
		(void)cudaFreeHost(x->pin);
	if (x->enc_state)
		(void)cudaFree(x->enc_state);
	if (x->att_cnt)
		(void)cudaFree(x->att_cnt);
	if (x->report)
		(void)cudaFreeHost(x->report);
	if (x->ev0)
		(void)cudaEventDestroy(x->ev0);
	if (x->ev1)
		(void)cudaEventDestroy(x->ev1);
	if (x->stream)
		(void)cudaStreamDestroy(x->stream);
	(void)cudaGetLastError();
	free(x);
}

int tqc_ctx_device(const tqc_ctx *x)
{
	return x ? x->device : -1;
}

double tqc_ctx_last_us(const tqc_ctx *x)
{
	return x ? x->last_us : 0.0;
}

const char *tqc_ctx_last_append(const tqc_ctx *x)
{
	return x ? x->last_enc : "";
}

const char *tqc_ctx_last_attn(const tqc_ctx *x)
{
	return x ? x->last_attn : "";
}

const char *tqc_ctx_last_attn_plan(tqc_ctx *x)
{
	if (!x)
		return "";
	if (!x->plan_splits) /* no attention yet */
		x->attn_plan[0] = '\0';
	else if (x->plan_warps)
		snprintf(x->attn_plan, sizeof(x->attn_plan), "mma: %d warps x %d CTA%s/SM, %d split%s of %u keys%s",
			 x->plan_warps, x->plan_per_sm, x->plan_per_sm > 1 ? "s" : "", x->plan_splits,
			 x->plan_splits > 1 ? "s" : "", x->plan_len, x->plan_shared ? " (GPU shared)" : "");
	else
		snprintf(x->attn_plan, sizeof(x->attn_plan), "general: %d split%s of %u keys%s", x->plan_splits,
			 x->plan_splits > 1 ? "s" : "", x->plan_len, x->plan_shared ? " (GPU shared)" : "");
	return x->attn_plan;
}

/* Scratch and staging of at least `dev` / `pin` bytes.  Only while the
 * stream is idle (at the start of a call): the old buffers are freed. */
static size_t grow_size(size_t need)
{
	size_t cap = need + need / 2;

	if (cap < need)
		cap = need;
	return (cap + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
}

static int reserve(tqc_ctx *x, size_t dev, size_t pin, tq_error *err)
{
	cudaError_t e;

	if (dev > x->dev_cap) {
		if (x->dev)
			(void)cudaFree(x->dev);
		x->dev = NULL;
		x->dev_cap = 0;
		size_t cap = grow_size(dev);
		if ((e = cudaMalloc((void **)&x->dev, cap)) != cudaSuccess) {
			(void)cudaGetLastError();
			cap = dev;
			if ((e = cudaMalloc((void **)&x->dev, cap)) != cudaSuccess) {
				x->dev = NULL;
				int rc = err_fail(err, "GPU scratch: cudaMalloc", e);
				if (rc == -ENOMEM && err)
					snprintf(err->msg, sizeof(err->msg),
						 "GPU scratch of %zu bytes: out of device memory", dev);
				return rc;
			}
		}
		x->dev_cap = cap;
	}
	if (pin > x->pin_cap) {
		if (x->pin)
			(void)cudaFreeHost(x->pin);
		x->pin = NULL;
		x->pin_cap = 0;
		size_t cap = grow_size(pin);
		if ((e = cudaHostAlloc((void **)&x->pin, cap, cudaHostAllocPortable)) != cudaSuccess) {
			x->pin = NULL;
			int rc = err_fail(err, "GPU staging: cudaHostAlloc", e);
			if (rc == -ENOMEM && err)
				snprintf(err->msg, sizeof(err->msg),
					 "GPU staging of %zu bytes: out of pinned host memory", pin);
			return rc;
		}
		x->pin_cap = cap;
	}
	return 0;
}

/* Carves sub-buffers out of a scratch buffer: returns the offset of `bytes`. */
static size_t carve(size_t *top, size_t bytes)
{
	size_t o = (*top + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1);

	*top = o + bytes;
	return o;
}

/* Device copies of a dense rotation (R and R^T), cached per (dim, seed): the
 * rotation depends on nothing else (tq_rotation_init).  NULLs for a
 * rotation that is not dense.  Only while the stream is idle (eviction
 * frees); a call takes at most 4 (K and V, two halves each), and never
 * evicts one it took (stamped last). */
static int rot_get(tqc_ctx *x, const struct tq_rotation *r, const float **mat, const float **mat_t, tq_error *err)
{
	const int d = r->dim;
	const size_t bytes = sizeof(float) * (size_t)d * (size_t)d;
	struct rot_ent *v = &x->rot[0];
	cudaError_t e;

	*mat = *mat_t = NULL;
	if (r->kind != TQ_ROT_DENSE)
		return 0;
	for (int i = 0; i < ROT_CACHE; i++)
		if (x->rot[i].dim == d && x->rot[i].seed == r->seed) {
			x->rot[i].used = ++x->tick;
			*mat = x->rot[i].mat;
			*mat_t = x->rot[i].mat_t;
			return 0;
		}
	/* the least recently used entry */
	for (int i = 1; i < ROT_CACHE; i++)
		if (x->rot[i].used < v->used)
			v = &x->rot[i];
	if (v->mat)
		(void)cudaFree(v->mat);
	if (v->mat_t)
		(void)cudaFree(v->mat_t);
	memset(v, 0, sizeof(*v));
	if ((e = cudaMalloc((void **)&v->mat, bytes)) != cudaSuccess ||
	    (e = cudaMalloc((void **)&v->mat_t, bytes)) != cudaSuccess) {
		if (v->mat)
			(void)cudaFree(v->mat);
		memset(v, 0, sizeof(*v));
		return err_fail(err, "dense rotation: cudaMalloc", e);
	}
	/* pageable sources: the copies have taken the data when they return */
	if ((e = cudaMemcpyAsync(v->mat, r->mat, bytes, cudaMemcpyHostToDevice, x->stream)) != cudaSuccess ||
	    (e = cudaMemcpyAsync(v->mat_t, r->mat_t, bytes, cudaMemcpyHostToDevice, x->stream)) != cudaSuccess) {
		(void)cudaStreamSynchronize(x->stream);
		(void)cudaFree(v->mat);
		(void)cudaFree(v->mat_t);
		memset(v, 0, sizeof(*v));
		return err_fail(err, "dense rotation: cudaMemcpyAsync", e);
	}
	v->dim = d;
	v->seed = r->seed;
	v->used = ++x->tick;
	*mat = v->mat;
	*mat_t = v->mat_t;
	return 0;
}

/* A codebook of `levels` into the descriptor's arrays of capacity `cap`. */
static int desc_codebook(const tq_codebook *cb, int cap, float *centroid, float *bound, tq_error *err)
{
	if (cb->bits < 1 || cb->levels != 1 << cb->bits || cb->levels > cap)
		return tq_fail(err, "GPU: codebook of %d bits not supported", cb->bits);
	for (int i = 0; i < cb->levels; i++)
		centroid[i] = cb->centroid[i];
	for (int i = 0; i < cb->levels - 1; i++)
		bound[i] = cb->bound[i];
	return 0;
}

/* Hadamard signs of a rotation of r->dim into bits [at, at + dim) of the mask. */
static void desc_signs(const struct tq_rotation *r, int at, uint32_t *mask)
{
	for (int i = 0; i < r->dim; i++)
		if (r->sign[i] < 0.0f)
			mask[(at + i) / 32] |= 1u << ((at + i) % 32);
}

/* The kernels' view of a codec, with its dense rotations on the device. */
static int desc_make(tqc_ctx *x, const tq_codec *c, struct tqc_codec_desc *d, tq_error *err)
{
	const int parts = tq_codec_parts(c);
	int rc;

	memset(d, 0, sizeof(*d));
	if ((int)c->id < 0 || c->id >= TQ_CODEC__COUNT)
		return tq_fail(err, "GPU: unknown codec id %d", (int)c->id);
	if (tq_dim_check(c->dim, err) < 0)
		return -EINVAL;
	if ((rc = rot_get(x, &c->rot, &d->mat, &d->mat_t, err)) < 0)
		return rc;
	if (parts == 2 && (rc = rot_get(x, &c->rot_b, &d->mat_b, &d->mat_t_b, err)) < 0)
		return rc;
	d->id = (int32_t)c->id;
	d->dim = c->dim;
	d->bits = parts == 2 ? c->cb.bits : c->bits;
	d->block_bytes = c->block_bytes;
	d->rot_kind = (int32_t)c->rot.kind;
	d->h16_scale = d->h16_scale_b = 1.0f;
	if (parts == 2) {
		/* two halves of one rotation kind and scale (tq_rotation_init
		 * picks both from the dim) */
		if (c->half * 2 != c->dim || c->rot.dim != c->half || c->rot_b.dim != c->half ||
		    c->rot_b.kind != c->rot.kind ||
		    (c->rot.kind == TQ_ROT_HADAMARD && c->rot_b.inv_sqrt_dim != c->rot.inv_sqrt_dim))
			return tq_fail(err, "GPU: codec %s of dim %d: halves the kernels do not take",
				       tq_codec_name(c->id), c->dim);
		d->half = c->half;
		d->bits_b = c->cb_b.bits;
		if ((rc = desc_codebook(&c->cb, TQC_CB_MAX, d->centroid, d->bound, err)) < 0 ||
		    (rc = desc_codebook(&c->cb_b, TQC_CB_B_MAX, d->centroid_b, d->bound_b, err)) < 0)
			return rc;
		d->h16_scale = c->cb.h16_scale;
		d->h16_scale_b = c->cb_b.h16_scale;
	} else if (c->id == TQ_CODEC_TQ2 || c->id == TQ_CODEC_TQ3 || c->id == TQ_CODEC_TQ4) {
		if ((rc = desc_codebook(&c->cb, 16, d->centroid, d->bound, err)) < 0)
			return rc;
		d->h16_scale = c->cb.h16_scale;
	}
	if (c->rot.kind == TQ_ROT_HADAMARD) {
		d->inv_sqrt_dim = c->rot.inv_sqrt_dim;
		desc_signs(&c->rot, 0, d->sign_mask);
		if (parts == 2)
			desc_signs(&c->rot_b, c->half, d->sign_mask);
	} else if (c->rot.kind == TQ_ROT_DENSE && (!d->mat || !d->mat_t || (parts == 2 && (!d->mat_b || !d->mat_t_b)))) {
		return tq_fail(err, "GPU: dense rotation of dim %d not on the device", c->rot.dim);
	}
	return 0;
}

/* Where a caller's buffer is, for the kernels on x->device:
 *   in place  device memory of this device, managed memory, mapped pinned
 *             or registered host memory: *dp = the device address;
 *   host      plain (pageable) host memory: staged through pinned memory;
 *   peer      another device's memory: staged with device-to-device copies. */
enum where { W_IN_PLACE, W_HOST, W_PEER };

static enum where locate(const tqc_ctx *x, const void *p, void **dp)
{
	struct cudaPointerAttributes at;

	*dp = NULL;
	if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
		(void)cudaGetLastError();
		return W_HOST;
	}
	switch (at.type) {
	case cudaMemoryTypeDevice:
		if (at.device != x->device || !at.devicePointer)
			return W_PEER;
		*dp = at.devicePointer;
		return W_IN_PLACE;
	case cudaMemoryTypeManaged:
		*dp = at.devicePointer ? at.devicePointer : (void *)p;
		return W_IN_PLACE;
	case cudaMemoryTypeHost: /* pinned or registered: mapped unless NULL */
		if (!at.devicePointer)
			return W_HOST;
		*dp = at.devicePointer;
		return W_IN_PLACE;
	default:
		return W_HOST;
	}
}

/* Every page the call reads or writes must exist and be TQ_PAGE_ALIGN
 * aligned (the kernels' aligned f16 / f32 loads rely on it). */
static int check_pages(const struct tq_page_table *kv, uint32_t first, uint32_t end, const char *who,
		       tq_error *err)
{
	if (end > first && !kv->pages)
		return tq_fail(err, "%s: NULL page list", who);
	for (uint32_t i = first; i < end; i++) {
		if (!kv->pages[i])
			return tq_fail(err, "%s: page %u is NULL", who, i);
		if ((uintptr_t)kv->pages[i] & (TQ_PAGE_ALIGN - 1))
			return tq_fail(err, "%s: page %u is not %u-byte aligned", who, i, TQ_PAGE_ALIGN);
	}
	return 0;
}

static void timing_done(tqc_ctx *x)
{
	float ms = 0.0f;

	if (cudaEventElapsedTime(&ms, x->ev0, x->ev1) == cudaSuccess)
		x->last_us = (double)ms * 1e3;
	else
		(void)cudaGetLastError();
}

/* A CUDA call of append / attend: on failure, name it and bail out. */
/* This launch's rows [off, off + bytes) of one append input: in place (dev:
 * its device address), or copied to the device scratch at d_off — through
 * the pinned staging at h_off when it is plain host memory. */
static cudaError_t input_rows(tqc_ctx *x, const uint8_t *dev, const void *in, enum where w, size_t h_off,
			      size_t d_off, size_t off, size_t bytes, const uint8_t **out)
{
	const void *src = (const uint8_t *)in + off;

	if (dev) {
		*out = dev + off;
		return cudaSuccess;
	}
	if (w == W_HOST) {
		memcpy(x->pin + h_off, src, bytes);
		src = x->pin + h_off;
	}
	*out = x->dev + d_off;
	return cudaMemcpyAsync(x->dev + d_off, src, bytes, cudaMemcpyDefault, x->stream);
}

#define CK(name, call)                            \
	do {                                      \
		if ((e = (call)) != cudaSuccess) { \
			what = name;              \
			goto cuda_err;            \
		}                                 \
	} while (0)

/* After a failed CUDA call in append / attend: the stream drained, the
 * error named; -ENOMEM or -EIO. */
static int call_failed(tqc_ctx *x, const char *who, const char *what, cudaError_t e, tq_error *err)
{
	char name[96];

	snprintf(name, sizeof(name), "%s: %s", who, what);
	int rc = err_fail(err, name, e);
	(void)cudaStreamSynchronize(x->stream);
	(void)cudaGetLastError();
	return rc == -ENOMEM || rc == -ENOTRECOVERABLE ? rc : -EIO;
}

/* ---- quantize-append -------------------------------------------------------------- */

/* The encoder's report of the launch of tokens [t0, ...) (read once the
 * stream finished): 0, or the first failing vector (token-major, K before
 * V, then head) as tqc_append's error. */
static int enc_report(tqc_ctx *x, uint32_t t0, uint32_t n_kv, const tq_codec *kc, const tq_codec *vc,
		      uint32_t *bad, tq_error *err)
{
	const unsigned long long st = *(volatile unsigned long long *)x->report;

	if (st == ~0ull)
		return 0;
	const uint32_t vec = (uint32_t)(st >> 32), code = (uint32_t)st;
	const uint32_t t = t0 + vec / (2u * n_kv), side = vec / n_kv % 2u, head = vec % n_kv;
	if (bad)
		*bad = t;
	if (code & TQC_ST_NONFINITE) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "token %u %s head %u: NaN or Inf at element %u", t,
				 side ? "V" : "K", head, code & TQC_ST_ELEM_MASK);
		return -EINVAL;
	}
	if (err)
		snprintf(err->msg, sizeof(err->msg), "token %u %s head %u: %s", t, side ? "V" : "K", head,
			 (side ? vc : kc)->id == TQ_CODEC_F16
				 ? "a value is beyond the fp16 range"
				 : "values too large to encode (norm or range overflows fp32/fp16)");
	return -ERANGE;
}

/* An append whose stream work is queued and not waited for (append_run
 * with a pending): its report is read by enc_report once the stream has
 * finished. */
struct enc_pending {
	int on;
	uint32_t t0, n_kv;
	const tq_codec *kc, *vc;
};

/* tqc_append.  With pd: when the append is one launch that uses none of
 * the context's scratch or staging (inputs in place, its pages in the
 * launch's arguments), it returns after queueing it, with pd->on = 1 and
 * the GPU time's start event recorded; otherwise (pd->on = 0) as
 * tqc_append. */
static int append_run(tqc_ctx *x, const struct tqc_append *a, uint32_t *bad, struct enc_pending *pd, tq_error *err)
{
	struct tqc_enc_args args;
	const char *what = "";
	cudaError_t e;
	int rc;

	if (pd)
		pd->on = 0;
	if (bad)
		*bad = UINT32_MAX; /* no failing token */
	if ((rc = lost_err(err)) < 0)
		return rc;
	if (!x || !a || !a->k_codec || !a->v_codec || !a->kv)
		return tq_fail(err, "append: NULL context, arguments, codec or page table");
	const tq_codec *kc = a->k_codec, *vc = a->v_codec;
	const struct tq_page_table *kv = a->kv;
	const struct tq_page_geom *g = &kv->geom;
	const int dim = kc->dim;
	const size_t esz = tq_dtype_size(a->dtype);

	if (vc->dim != dim)
		return tq_fail(err, "append: K dim %d != V dim %d", dim, vc->dim);
	if (!esz)
		return tq_fail(err, "append: unknown input dtype %d", (int)a->dtype);
	if (a->n < 1)
		return tq_fail(err, "append: no tokens");
	if (!a->k || !a->v)
		return tq_fail(err, "append: NULL k or v");
	if (!tq_page_geom_valid(g))
		return tq_fail(err, "append: page geometry out of range");
	if (g->k_block_bytes != kc->block_bytes || g->v_block_bytes != vc->block_bytes)
		return tq_fail(err, "append: page block sizes %u/%u do not match the codecs (%u/%u)",
			       g->k_block_bytes, g->v_block_bytes, kc->block_bytes, vc->block_bytes);
	const uint64_t end = (uint64_t)a->pos + a->n; /* one past the last slot */
	if (end > (uint64_t)UINT32_MAX + 1)
		return tq_fail(err, "append: slots %u + %u overflow", a->pos, a->n);
	const uint32_t pt = g->page_tokens, p_first = a->pos / pt;
	const uint32_t p_end = (uint32_t)((end - 1) / pt + 1); /* one past the last page */
	if (kv->n_pages < p_end)
		return tq_fail(err, "append: %u pages cannot hold slots up to %llu", kv->n_pages,
			       (unsigned long long)end);
	if ((rc = check_pages(kv, p_first, p_end, "append", err)) < 0)
		return rc;
	if ((rc = set_ctx_device(x->device, err)) < 0)
		return rc;
	memset(&args, 0, sizeof(args));
	if ((rc = desc_make(x, kc, &args.kc, err)) < 0 || (rc = desc_make(x, vc, &args.vc, err)) < 0)
		return rc;

	/* inputs in place, or staged per launch */
	void *kdp, *vdp;
	const enum where kw = locate(x, a->k, &kdp), vw = locate(x, a->v, &vdp);
	const uint8_t *kd = kdp, *vd = vdp; /* NULL: staged */
	const uint32_t n_kv = g->n_kv_heads;
	const size_t tok_bytes = (size_t)n_kv * (size_t)dim * esz; /* one token of K (or V) */
	const size_t n_staged = (size_t)!kd + (size_t)!vd;
	uint32_t pass = a->n < x->enc_pass ? a->n : x->enc_pass;
	if (n_staged && (size_t)pass * tok_bytes * n_staged > ENC_STAGE_BYTES) {
		size_t np = ENC_STAGE_BYTES / (tok_bytes * n_staged);
		pass = np < 1 ? 1 : (uint32_t)np;
	}
	const size_t stage = (size_t)pass * tok_bytes;
	/* a few pages ride in the launch's arguments, more in a table */
	const uint32_t n_pt = p_end - p_first;
	const size_t n_tab = n_pt <= TQC_ENC_PAGES_INLINE ? 0 : n_pt;
	size_t dtop = 0, ptop = 0;
	const size_t d_pages = carve(&dtop, sizeof(void *) * n_tab);
	const size_t d_k = carve(&dtop, kd ? 0 : stage), d_v = carve(&dtop, vd ? 0 : stage);
	const size_t h_pages = carve(&ptop, sizeof(void *) * n_tab);
	const size_t h_k = carve(&ptop, kw == W_HOST ? stage : 0), h_v = carve(&ptop, vw == W_HOST ? stage : 0);
	if ((rc = reserve(x, dtop, ptop, err)) < 0)
		return rc;

	args.geom = *g;
	args.dtype = (int32_t)a->dtype;
	args.general = x->enc_general;
	args.status = (unsigned long long *)(void *)x->enc_state;
	args.done = (uint32_t *)(void *)(x->enc_state + 8);
	args.report = x->report_dev;
	CK("cudaEventRecord", cudaEventRecord(x->ev0, x->stream));
	if (n_tab) {
		memcpy(x->pin + h_pages, kv->pages + p_first, sizeof(void *) * n_tab);
		args.pages = (const uint8_t *const *)(void *)(x->dev + d_pages);
		CK("page table copy", cudaMemcpyAsync(x->dev + d_pages, x->pin + h_pages, sizeof(void *) * n_tab,
						      cudaMemcpyHostToDevice, x->stream));
	} else {
		for (uint32_t i = 0; i < n_pt; i++)
			args.page_inline[i] = kv->pages[p_first + i];
	}

	for (uint32_t t0 = 0; t0 < a->n; t0 += pass) {
		const uint32_t nt = a->n - t0 < pass ? a->n - t0 : pass;
		const size_t off = (size_t)t0 * tok_bytes, bytes = (size_t)nt * tok_bytes;

		CK("K input copy", input_rows(x, kd, a->k, kw, h_k, d_k, off, bytes, &args.k));
		CK("V input copy", input_rows(x, vd, a->v, vw, h_v, d_v, off, bytes, &args.v));
		args.slot0 = a->pos + t0 - p_first * pt;
		args.n_tok = nt;
		*(volatile unsigned long long *)x->report = ~0ull; /* the kernel's last CTA writes it */
		x->last_enc = tqc_enc_reg_dim(&args) ? "reg" : "general";
		CK("encode kernel launch", (cudaError_t)tqc_launch_encode(&args, x->stream));
		if (pd && nt == a->n && dtop == 0 && ptop == 0) {
			/* queued, nothing of the context's to keep alive: the
			 * caller's next stream work follows it */
			*pd = (struct enc_pending){ .on = 1, .t0 = 0, .n_kv = n_kv, .kc = kc, .vc = vc };
			return 0;
		}
		CK("cudaEventRecord", cudaEventRecord(x->ev1, x->stream));
		CK("encode kernel", cudaStreamSynchronize(x->stream));
		if ((rc = enc_report(x, t0, n_kv, kc, vc, bad, err)) < 0) {
			timing_done(x);
			return rc; /* the first launch with a failing vector */
		}
	}
	timing_done(x);
	return 0;
cuda_err:
	return call_failed(x, "append", what, e, err);
}

int tqc_append(tqc_ctx *x, const struct tqc_append *a, uint32_t *bad, tq_error *err)
{
	return append_run(x, a, bad, NULL, err);
}

/* ---- attention -------------------------------------------------------------------- */

/* attn_mma's warps per CTA and CTAs per SM for blocks of kb / vb bytes
 * (tq_cuda_internal.h: two CTAs of TQC_MMA_WARPS_PAIR warps where they fit
 * an SM, else one of as many warps as fit a block's shared memory); warps
 * 0: attn_mma does not fit.  Remembered for the last shape asked. */
static void mma_config(tqc_ctx *x, int dim, uint32_t kb, uint32_t vb, int ko, size_t smem_max, int *warps,
		       int *per_sm)
{
	if (x->mc_dim != dim || x->mc_kb != kb || x->mc_vb != vb || x->mc_ko != ko) {
		int w = 0, n = 0;

		/* the two-CTA build exists at d <= 128 (mma_kernel) */
		if (dim <= 128 && tqc_attn_mma_warps(dim, kb, vb, smem_max) >= TQC_MMA_WARPS_PAIR) {
			n = tqc_attn_mma_ctas_per_sm(dim, tqc_attn_mma_smem(dim, kb, vb, TQC_MMA_WARPS_PAIR),
						     TQC_MMA_WARPS_PAIR, ko);
			if (n >= 2)
				w = TQC_MMA_WARPS_PAIR;
		}
		if (!w && (w = tqc_attn_mma_warps(dim, kb, vb, smem_max)) > 0)
			n = tqc_attn_mma_ctas_per_sm(dim, tqc_attn_mma_smem(dim, kb, vb, w), w, ko);
		x->mc_dim = dim;
		x->mc_kb = kb;
		x->mc_vb = vb;
		x->mc_ko = ko;
		x->mc_warps = w;
		x->mc_per_sm = n > 0 ? n : 1; /* the runtime cannot tell: one surely fits */
	}
	*warps = x->mc_warps;
	*per_sm = x->mc_per_sm;
}

/* The kernel and context split of one attention pass. */
struct att_plan {
	int tiled, rows_blk;     /* tqc_attn_args.tiled, .rows_blk                  */
	int mma_warps;           /* tqc_attn_args.mma_warps (tiled)                 */
	int rows_ph, n_rb, n_split;
	uint32_t split_len;
	size_t part_rows;        /* n_kv * rows_pad * n_split: partial rows written */
	int shared;              /* split as on a shared GPU (ATT_SHARED_SPLITS)   */
};

/* The tiled kernel (attn_mma) where it applies and its shared memory fits,
 * else the general one (attn_main); splits
 * so that the grid has a few CTAs per SM, no split is shorter than
 * ATT_SPLIT_MIN tokens (tiled: a multiple of the tile) and the partials stay
 * within ATT_PART_FLOATS (one split always fits). */
static void att_plan_make(tqc_ctx *x, const struct tqa_shape *sh, const struct tqc_attn_args *args,
			  size_t nq, int shared, struct att_plan *pl)
{
	const size_t rows_ph = nq * (size_t)sh->group;
	const size_t smem_max = (size_t)(x->smem_optin > 0 ? x->smem_optin : 48 << 10);
	const uint32_t kb = args->geom.k_block_bytes, vb = args->geom.v_block_bytes;
	int mma_per_sm = 0;
	pl->mma_warps = 0;
	pl->tiled = !x->attn_general && sh->kv_len <= UINT32_MAX - TQC_TILE &&
		    tqc_attn_tiled_ok(&args->kc, &args->vc, args->geom.page_tokens);
	if (pl->tiled) {
		const int ko = args->kc.id == TQ_CODEC_TQ3O || args->kc.id == TQ_CODEC_TQ4O;
		mma_config(x, sh->dim, kb, vb, ko, smem_max, &pl->mma_warps, &mma_per_sm);
		pl->tiled = pl->mma_warps > 0;
	}
	const int R = pl->tiled ? TQC_TILE_ROWS : tqc_attn_rows(tqc_attn_vpl(sh->dim));
	pl->rows_blk = R;
	const size_t n_rb = (rows_ph + (size_t)R - 1) / (size_t)R;
	const size_t rows = (size_t)sh->n_kv * n_rb * (size_t)R; /* partial rows per split */
	/* CTAs per SM the splits aim at: attn_mma's shared memory (its decode
	 * tables) and registers let only a few run at once (one, of many
	 * warps), and a second wave would redo their set-up: whole waves only */
	size_t per_sm = x->ctas_per_sm > 0 ? (size_t)x->ctas_per_sm : ATT_CTAS_PER_SM;
	if (pl->tiled && x->ctas_per_sm <= 0 && (size_t)mma_per_sm < per_sm)
		per_sm = (size_t)mma_per_sm;
	size_t want = per_sm * (size_t)x->sms / ((size_t)sh->n_kv * n_rb);
	if (want < 1)
		want = 1;
	/* the shortest split: longer for the tiled kernel on a shared GPU
	 * (ATT_SHARED_SPLITS) */
	uint32_t smin = x->split_min;
	pl->shared = pl->tiled && shared;
	if (pl->shared) {
		uint32_t s_len = sh->kv_len / ATT_SHARED_SPLITS;
		if (s_len > x->shared_len)
			s_len = x->shared_len;
		if (s_len > smin)
			smin = s_len;
	}
	const size_t by_len = sh->kv_len / smin, by_mem = ATT_PART_FLOATS / (rows * (size_t)(sh->dim + 2));
	size_t ns = want;

	if (ns > by_len)
		ns = by_len;
	if (ns > by_mem)
		ns = by_mem;
	if (ns > TQC_SPLITS_MAX)
		ns = TQC_SPLITS_MAX;
	if (ns < 1)
		ns = 1;
	uint32_t len = (uint32_t)((sh->kv_len + ns - 1) / ns);
	if (len < 1)
		len = 1;
	if (pl->tiled)
		len = (len + TQC_TILE - 1) / TQC_TILE * TQC_TILE; /* no wrap: kv_len checked */
	ns = sh->kv_len ? (sh->kv_len + (size_t)len - 1) / len : 1;
	pl->rows_ph = (int)rows_ph;
	pl->n_rb = (int)n_rb;
	pl->n_split = (int)ns;
	pl->split_len = len;
	pl->part_rows = rows * ns;
}

/* At least n zeroed counts for attn_mma's fused finish (each launch leaves
 * them zero). */
static cudaError_t att_counters(tqc_ctx *x, size_t n)
{
	cudaError_t e;

	if (n <= x->att_cnt_cap)
		return cudaSuccess;
	if (x->att_cnt) {
		(void)cudaStreamSynchronize(x->stream);
		(void)cudaFree(x->att_cnt);
		x->att_cnt = NULL;
		x->att_cnt_cap = 0;
	}
	if ((e = cudaMalloc((void **)&x->att_cnt, n * sizeof(uint32_t))) != cudaSuccess)
		return e;
	if ((e = cudaMemsetAsync(x->att_cnt, 0, n * sizeof(uint32_t), x->stream)) != cudaSuccess)
		return e; /* on the context's stream: before the kernel that counts */
	x->att_cnt_cap = n;
	return cudaSuccess;
}

/* tqc_attend calls in flight in this process, every context's, by device
 * (devices 64 apart share a count: a plan's hint, nothing more) */
#define ATT_INFLIGHT_DEVS 64
static int att_inflight[ATT_INFLIGHT_DEVS];

static int *inflight_of(int device)
{
	return &att_inflight[device > 0 ? device % ATT_INFLIGHT_DEVS : 0];
}

int tqc_attn_inflight(int device)
{
	return device < 0 ? 0 : __atomic_load_n(inflight_of(device), __ATOMIC_RELAXED);
}

/* The CPU path's checks and messages (tqa_validate), less what the GPU
 * ignores. */
static int attn_validate(const struct tq_attn_params *p, struct tqa_shape *sh, tq_error *err)
{
	struct tq_attn_params v;

	if (!p)
		return tq_fail(err, "attention: NULL params, codec or page table");
	v = *p;
	v.isa = TQ_ISA_AUTO;
	v.threads = NULL;
	v.plan_n_q = 0;
	v.workspace = NULL;
	v.workspace_bytes = 0;
	return tqa_validate(&v, sh, err);
}

/* tqc_attend; shared: another call was in flight when it started (its
 * every pass is planned so, so that the partials reserved fit each) */
static int attend(tqc_ctx *x, const struct tq_attn_params *p, int shared, tq_error *err)
{
	struct tqa_shape sh;
	struct tqc_attn_args args;
	struct att_plan pl;
	const char *what = "";
	cudaError_t e;
	int rc;

	if ((rc = lost_err(err)) < 0)
		return rc;
	if (!x)
		return tq_fail(err, "attention: NULL GPU context");
	if ((rc = attn_validate(p, &sh, err)) < 0)
		return rc;
	if (p->n_q == 0)
		return 0;
	const struct tq_page_table *kv = p->kv;
	const uint32_t n_pages = tq_page_count(&kv->geom, kv->n_tokens);
	const int d = sh.dim;
	if ((rc = check_pages(kv, 0, n_pages, "attention", err)) < 0)
		return rc;
	if ((rc = set_ctx_device(x->device, err)) < 0)
		return rc;
	memset(&args, 0, sizeof(args));
	if ((rc = desc_make(x, p->k_codec, &args.kc, err)) < 0 || (rc = desc_make(x, p->v_codec, &args.vc, err)) < 0)
		return rc;

	/* passes of at most qp query tokens bound every buffer; the partials
	 * are sized for the larger of the two pass sizes' plans */
	const size_t row_floats = (size_t)p->n_q_heads * (size_t)d; /* one query token */
	size_t qp = ATT_PASS_FLOATS / row_floats;
	if (qp < 1)
		qp = 1;
	if (qp > (size_t)p->n_q)
		qp = (size_t)p->n_q;
	args.geom = kv->geom;
	size_t part_rows;
	att_plan_make(x, &sh, &args, qp, shared, &pl);
	part_rows = pl.part_rows;
	if ((size_t)p->n_q % qp) {
		att_plan_make(x, &sh, &args, (size_t)p->n_q % qp, shared, &pl);
		if (pl.part_rows > part_rows)
			part_rows = pl.part_rows;
	}

	void *odp;
	const enum where ow = locate(x, p->out, &odp);
	float *od = odp; /* NULL: staged */
	size_t dtop = 0;
	/* the page table, queries and positions have the same offsets in the
	 * scratch and the staging (carved once, first), so one copy takes them
	 * all */
	const size_t q_bytes = qp * row_floats * sizeof(float);
	const size_t o_pages = carve(&dtop, sizeof(void *) * n_pages), o_q = carve(&dtop, q_bytes);
	const size_t o_pos = carve(&dtop, qp * sizeof(int32_t));
	size_t ptop = dtop;
	const size_t d_qrot = carve(&dtop, q_bytes);
	const size_t d_acc = carve(&dtop, part_rows * (size_t)d * sizeof(float));
	const size_t d_ml = carve(&dtop, part_rows * 2 * sizeof(float));
	const size_t d_out = carve(&dtop, od ? 0 : q_bytes);
	const size_t h_out = carve(&ptop, ow == W_HOST ? q_bytes : 0);
	/* sparse-V's counts: zeroed on the stream, added to by every pass,
	 * read back after the last */
	const int sparse = p->sparse_v > 0.0f;
	const size_t sv_bytes = 2 * sizeof(unsigned long long);
	const size_t d_sv = carve(&dtop, sparse ? sv_bytes : 0), h_sv = carve(&ptop, sparse ? sv_bytes : 0);
	if ((rc = reserve(x, dtop, ptop, err)) < 0)
		return rc;

	args.pages = (const uint8_t *const *)(void *)(x->dev + o_pages);
	args.geom = kv->geom;
	args.kv_len = sh.kv_len;
	args.n_q_heads = p->n_q_heads;
	args.group = sh.group;
	args.n_kv = sh.n_kv;
	args.causal = p->causal ? 1 : 0;
	args.scale2 = (float)((double)sh.scale * LOG2E);
	args.q_pos = (const int32_t *)(void *)(x->dev + o_pos);
	args.q = (const float *)(void *)(x->dev + o_q);
	args.qrot = (float *)(void *)(x->dev + d_qrot);
	args.part_acc = (float *)(void *)(x->dev + d_acc);
	args.part_ml = (float *)(void *)(x->dev + d_ml);
	args.sparse_v = sparse ? p->sparse_v : 0.0f;
	args.sv_counts = sparse ? (unsigned long long *)(void *)(x->dev + d_sv) : NULL;

	if (n_pages)
		memcpy(x->pin + o_pages, kv->pages, sizeof(void *) * n_pages);
	for (size_t q0 = 0; q0 < (size_t)p->n_q; q0 += qp) {
		const size_t nq = (size_t)p->n_q - q0 < qp ? (size_t)p->n_q - q0 : qp;
		const size_t bytes = nq * row_floats * sizeof(float);
		float *hq = (float *)(void *)(x->pin + o_q);

		/* queries as fp32 (tqa_q_row: the CPU path's conversion) */
		for (size_t r = 0; r < nq * (size_t)p->n_q_heads; r++)
			tqa_q_row(p, d, q0 * (size_t)p->n_q_heads + r, hq + r * (size_t)d);
		if (p->causal)
			memcpy(x->pin + o_pos, p->q_pos + q0, nq * sizeof(int32_t));
		att_plan_make(x, &sh, &args, nq, shared, &pl);
		args.n_q = (int32_t)nq;
		args.tiled = pl.tiled;
		args.mma_warps = pl.tiled ? pl.mma_warps : 0;
		x->last_attn = pl.tiled ? "mma" : "general";
		x->plan_warps = pl.tiled ? pl.mma_warps : 0;
		x->plan_per_sm = pl.tiled ? x->mc_per_sm : 0;
		x->plan_splits = pl.n_split;
		x->plan_len = pl.split_len;
		x->plan_shared = pl.shared;
		args.rows_blk = pl.rows_blk;
		args.rows_ph = pl.rows_ph;
		args.n_rb = pl.n_rb;
		args.rows_pad = pl.n_rb * pl.rows_blk;
		args.n_split = pl.n_split;
		args.split_len = pl.split_len;
		if (pl.tiled)
			CK("attention counts", att_counters(x, (size_t)sh.n_kv * (size_t)pl.n_rb));
		args.counters = pl.tiled ? x->att_cnt : NULL;
		args.out = od ? od + q0 * row_floats : (float *)(void *)(x->dev + d_out);
		/* one copy: the page table (first pass), the queries, the positions;
		 * the call's GPU time starts there, not during the host's staging
		 * and planning (host time after the event is GPU time: the stream
		 * idles until the launch) */
		const size_t c0 = q0 == 0 ? o_pages : o_q, c1 = p->causal ? o_pos + nq * sizeof(int32_t) : o_q + bytes;
		if (q0 == 0 && !x->ev0_kept)
			CK("cudaEventRecord", cudaEventRecord(x->ev0, x->stream));
		if (q0 == 0 && sparse)
			CK("sparse-V counts", cudaMemsetAsync(x->dev + d_sv, 0, sv_bytes, x->stream));
		CK("query copy", cudaMemcpyAsync(x->dev + c0, x->pin + c0, c1 - c0, cudaMemcpyHostToDevice, x->stream));
		CK("kernel launch", (cudaError_t)tqc_launch_attend(&args, x->stream));
		if (ow == W_HOST)
			CK("output copy", cudaMemcpyAsync(x->pin + h_out, x->dev + d_out, bytes, cudaMemcpyDeviceToHost,
							  x->stream));
		else if (ow == W_PEER)
			CK("output copy", cudaMemcpyAsync(p->out + q0 * row_floats, x->dev + d_out, bytes,
							  cudaMemcpyDefault, x->stream));
		if (sparse && q0 + nq == (size_t)p->n_q)
			CK("sparse-V counts", cudaMemcpyAsync(x->pin + h_sv, x->dev + d_sv, sv_bytes,
							      cudaMemcpyDeviceToHost, x->stream));
		CK("cudaEventRecord", cudaEventRecord(x->ev1, x->stream));
		CK("kernels", cudaStreamSynchronize(x->stream));
		if (ow == W_HOST)
			memcpy(p->out + q0 * row_floats, x->pin + h_out, bytes);
	}
	if (sparse && p->stats) {
		unsigned long long c[2];
		memcpy(c, x->pin + h_sv, sizeof(c));
		__atomic_fetch_add(&p->stats->v_chunks, (uint64_t)c[0], __ATOMIC_RELAXED);
		__atomic_fetch_add(&p->stats->v_skipped, (uint64_t)c[1], __ATOMIC_RELAXED);
	}
	timing_done(x);
	return 0;
cuda_err:
	return call_failed(x, "attention", what, e, err);
}

int tqc_attend(tqc_ctx *x, const struct tq_attn_params *p, tq_error *err)
{
	int *const n = inflight_of(x ? x->device : 0);
	const int others = __atomic_fetch_add(n, 1, __ATOMIC_RELAXED);
	const int rc = attend(x, p, others > 0, err);

	__atomic_fetch_sub(n, 1, __ATOMIC_RELAXED);
	return rc;
}

/* ---- one layer's decode step: append, then attention (tqc_append_attend) ---------- */

int tqc_append_attend(tqc_ctx *x, const struct tqc_append *a, const struct tq_attn_params *p, uint32_t *bad,
		      int *stage, tq_error *err)
{
	struct enc_pending pd;
	tq_error e2;
	cudaError_t e;
	int rc, r2;

	if (stage)
		*stage = TQC_STAGE_APPEND;
	if (x)
		x->last_fused = 0;
	if ((rc = append_run(x, a, bad, &pd, err)) < 0)
		return rc;
	/* not queued (staged inputs, a page table or several launches): it
	 * has finished; the attention's GPU time adds to its */
	const double us_append = pd.on ? 0.0 : x->last_us;
	memset(&e2, 0, sizeof(e2));
	x->ev0_kept = pd.on;
	r2 = tqc_attend(x, p, &e2);
	x->ev0_kept = 0;
	if (pd.on && r2 == 0 && p->n_q == 0 && cudaEventRecord(x->ev1, x->stream) != cudaSuccess)
		(void)cudaGetLastError(); /* no query, no attention: the GPU time is the append's */
	if (pd.on) {
		/* the attention waited for the stream, unless it failed before
		 * queueing anything: wait here (at once when it did) */
		if ((e = cudaStreamSynchronize(x->stream)) != cudaSuccess) {
			/* the append's kernel failed: a lost device is what the
			 * caller must hear, whatever the attention said (it may
			 * have failed before queueing anything, on its arguments
			 * or out of memory, and seen no fault) */
			const int rf = call_failed(x, "append", "encode kernel", e, err);
			if (rf == -ENOTRECOVERABLE || r2 >= 0)
				return rf;
			if (err)
				*err = e2;
			return r2;
		}
		if ((rc = enc_report(x, pd.t0, pd.n_kv, pd.kc, pd.vc, bad, err)) < 0)
			return rc; /* its attention ran on tokens that do not count */
		x->last_fused = r2 == 0;
		if (r2 == 0 && p->n_q == 0)
			timing_done(x);
	}
	if (r2 < 0) {
		if (stage)
			*stage = TQC_STAGE_ATTEND;
		if (err)
			*err = e2;
		return r2;
	}
	if (stage)
		*stage = TQC_STAGE_NONE;
	x->last_us += us_append;
	return 0;
}

int tqc_ctx_last_fused(const tqc_ctx *x)
{
	return x ? x->last_fused : 0;
}
