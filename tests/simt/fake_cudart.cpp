/* fake_cudart.cpp — the CUDA runtime calls tq_cuda.c makes, emulated on the CPU
 * for tests/simt: one fake H100; device memory is host memory placed against a
 * PROT_NONE guard page and filled with NaN bytes; streams queue their work
 * (copies, kernels on the SIMT emulator) and run it at cudaStreamSynchronize;
 * every copy and every kernel argument is checked to be memory its kind may
 * touch.  Single-threaded (test_cuda is).  Not a CUDA: a harness for the
 * device code's logic where there is no GPU. */
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cstring>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>
#include <map>
#include <mutex>

#include "fake.h"
#include "tq_cuda_internal.h"

enum kind { K_DEV, K_PINNED, K_REG, K_MANAGED };
struct alloc { size_t size; kind k; void *map; size_t maplen; };
static std::map<uintptr_t, alloc> allocs;
/* the runtime is one lock: several host threads (tqkvd-simt's workers,
 * spill and persistence) call it, and a synchronization runs its stream's
 * kernels under it (the emulated GPU runs one kernel at a time); the last
 * error is per thread, as the real runtime's */
static std::recursive_mutex mu;
#define LOCKED std::lock_guard<std::recursive_mutex> locked_(mu)
static thread_local cudaError_t last_err;
static double clock_us;
/* a device fault (fake_cuda_fault): the error every call returns from then
 * on, as a real context lost to a sticky error does; fault_in: the work
 * items a synchronization runs before the fault (-1: none armed) */
static cudaError_t sticky;
static long fault_in = -1;
static cudaError_t fault_code = cudaErrorIllegalAddress;

struct stream { std::deque<std::function<void()>> q; };
struct event { double t; bool done; };

void fake_fail(const char *what)
{
	fprintf(stderr, "FAKE CUDA: %s\n", what);
	abort();
}

extern "C" void fake_cuda_fault(long after)
{
	LOCKED;
	fault_in = after;
	fault_code = cudaErrorIllegalAddress;
}

/* the same with another sticky error than an illegal address */
extern "C" void fake_cuda_fault_code(long after, int code)
{
	LOCKED;
	fault_in = after;
	fault_code = (cudaError_t)code;
}

/* TQ_FAKE_CUDA_FAULT=N: the same from the start, for a whole program on
 * the emulator (tqkvd-simt: tests/integration/device_lost.sh) */
static const bool fault_env = [] {
	if (const char *e = getenv("TQ_FAKE_CUDA_FAULT"))
		fault_in = strtol(e, nullptr, 10);
	return true;
}();

static cudaError_t ret(cudaError_t e)
{
	if (e)
		last_err = e;
	return e;
}

static const alloc *find(const void *p, uintptr_t *base)
{
	uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);
	if (it == allocs.begin())
		return nullptr;
	--it;
	if (a >= it->first + it->second.size + (it->second.size == 0))
		return nullptr;
	*base = it->first;
	return &it->second;
}

bool fake_dev_ok(const void *p, size_t n)
{
	LOCKED;
	uintptr_t b;
	const alloc *a = find(p, &b);
	return a && (uintptr_t)p + n <= b + a->size;
}

bool fake_desc_rot_ok(const struct tqc_codec_desc *d)
{
	LOCKED;
	if (d->rot_kind != 2)
		return true;
	const size_t n = (size_t)(d->half ? d->half : d->dim), bytes = 4 * n * n;
	return fake_dev_ok(d->mat, bytes) && fake_dev_ok(d->mat_t, bytes) &&
	       (!d->half || (fake_dev_ok(d->mat_b, bytes) && fake_dev_ok(d->mat_t_b, bytes)));
}

static bool is_host(const void *p) /* pageable or pinned or registered */
{
	uintptr_t b;
	const alloc *a = find(p, &b);
	return !a || a->k != K_DEV;
}

void fake_enqueue(void *s, std::function<void()> fn)
{
	LOCKED;
	if (!s)
		fake_fail("work on the legacy default stream");
	((stream *)s)->q.push_back(std::move(fn));
}

/* Kernels' attributes, as the runtime keeps them: the dynamic shared memory
 * a launch may ask for (48 KiB until raised, at most the block opt-in) and,
 * for the occupancy query, registers per thread (said by the launcher). */
static std::map<const void *, int> func_smem_max, func_regs;
int fake_func_smem(const void *f)
{
	LOCKED;
	auto it = func_smem_max.find(f);
	return it == func_smem_max.end() ? 48 << 10 : it->second;
}
void fake_func_regs(const void *f, int regs)
{
	LOCKED;
	func_regs[f] = regs;
}

extern "C" {
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaGetLastError(void)
{
	LOCKED; /* sticky is written under the lock */
	cudaError_t e = sticky ? sticky : last_err;
	last_err = cudaSuccess;
	return e;
}

cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v)
{
	{
		LOCKED;
		if (!f || a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > (227 << 10))
			return ret(cudaErrorInvalidValue);
		func_smem_max[f] = v;
	}
	/* TQ_FAKE_SETATTR_US: a slow call, for tests of what another thread
	 * does between it and the launch that relies on it */
	const char *delay = getenv("TQ_FAKE_SETATTR_US");
	if (delay && atoi(delay) > 0)
		usleep((useconds_t)atoi(delay));
	return cudaSuccess;
}
/* an H100's SM: 228 KiB of shared memory (1 KiB reserved per CTA; the
 * kernel's static shared memory counted as TQC_MMA_STATIC_SMEM), 64 K
 * registers, 2048 threads; 0 blocks past the kernel's dynamic limit */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *f, int block, size_t smem)
{
	LOCKED;
	auto r = func_regs.find(f);
	if (!n || !f || block <= 0 || r == func_regs.end())
		return ret(cudaErrorInvalidValue);
	if (smem > (size_t)fake_func_smem(f)) {
		*n = 0;
		return cudaSuccess;
	}
	const int by_smem = (int)((228u << 10) / (smem + TQC_MMA_STATIC_SMEM + 1024u));
	const int by_regs = 65536 / (r->second * block), by_threads = 2048 / block;
	*n = by_smem < by_regs ? by_smem : by_regs;
	if (by_threads < *n)
		*n = by_threads;
	return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) { static thread_local char b[64]; snprintf(b, sizeof b, "fake error %d", (int)e); return b; }
const char *cudaGetErrorName(cudaError_t e)
{
	return e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation"
	       : e == cudaErrorIllegalAddress ? "cudaErrorIllegalAddress" /* fake_cuda_fault's */
	       : (int)e == 810		      ? "cudaErrorMpsClientTerminated" /* fake_cuda_fault_code's */
					      : "cudaErrorFake";
}
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void)
{
	LOCKED;
	return sticky ? ret(sticky) : cudaSuccess;
}
/* the context torn down: what a test can see is that it was (stderr) */
cudaError_t cudaDeviceReset(void)
{
	LOCKED;
	fprintf(stderr, "fake cudart: cudaDeviceReset: the context of device 0 destroyed (%zu allocations left)\n",
		allocs.size());
	return cudaSuccess;
}
cudaError_t cudaSetDevice(int d)
{
	LOCKED;
	return sticky ? ret(sticky) : d == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
	if (d != 0)
		return ret(cudaErrorInvalidDevice);
	switch (a) {
	case cudaDevAttrMultiProcessorCount: *v = 132; break;
	case cudaDevAttrMemoryClockRate: *v = 2619000; break;
	case cudaDevAttrGlobalMemoryBusWidth: *v = 5120; break;
	case cudaDevAttrHostRegisterSupported: *v = 1; break;
	case cudaDevAttrManagedMemory: *v = 1; break;
	/* TQ_FAKE_INTEGRATED=1: a GPU that shares the host's memory (GB10) */
	case cudaDevAttrIntegrated: *v = getenv("TQ_FAKE_INTEGRATED") != nullptr; break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 227 << 10; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 228 << 10; break;
	default: *v = 0; break;
	}
	return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
	if (d != 0)
		return ret(cudaErrorInvalidDevice);
	memset(p, 0, sizeof(*p));
	strcpy(p->name, "Fake H100 (CPU emulation)");
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = 132;
	p->totalGlobalMem = (size_t)80 << 30;
	return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = (size_t)70 << 30; *t = (size_t)80 << 30; return cudaSuccess; }

/* device memory: right-aligned (256) against a PROT_NONE page, filled with 0xFF (NaN floats) */
cudaError_t cudaMalloc(void **p, size_t n)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	/* TQ_FAKE_MALLOC_MAX: a smaller device (tests of a failed start) */
	static const size_t max = [] {
		const char *e = getenv("TQ_FAKE_MALLOC_MAX");
		return e ? (size_t)strtoull(e, nullptr, 0) : (size_t)8 << 30;
	}();
	if (n > max)
		return ret(cudaErrorMemoryAllocation);
	size_t r256 = (n + 255) & ~(size_t)255, len = (r256 + 4095) & ~(size_t)4095;
	char *m = (char *)mmap(nullptr, len + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return ret(cudaErrorMemoryAllocation);
	mprotect(m + len, 4096, PROT_NONE);
	char *u = m + len - r256;
	memset(u, 0xFF, r256);
	allocs[(uintptr_t)u] = alloc{ n, K_DEV, m, len + 4096 };
	*p = u;
	return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
	LOCKED;
	if (!p)
		return cudaSuccess;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end() || it->second.k != K_DEV)
		fake_fail("cudaFree of a pointer cudaMalloc did not return");
	munmap(it->second.map, it->second.maplen);
	allocs.erase(it);
	return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	void *m = malloc(n ? n : 1);
	memset(m, 0xEE, n);
	allocs[(uintptr_t)m] = alloc{ n, K_PINNED, nullptr, 0 };
	*p = m;
	return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p)
{
	LOCKED;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end() || it->second.k != K_PINNED)
		fake_fail("cudaFreeHost of a pointer cudaHostAlloc did not return");
	free(p);
	allocs.erase(it);
	return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void **dp, void *p, unsigned f)
{
	LOCKED;
	uintptr_t b;
	const alloc *a = find(p, &b);
	if (!a || (a->k != K_PINNED && a->k != K_REG))
		return ret(cudaErrorInvalidValue);
	*dp = p;
	return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned f)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	uintptr_t b;
	if (find(p, &b) || find((char *)p + n - 1, &b))
		return ret(cudaErrorHostMemoryAlreadyRegistered);
	allocs[(uintptr_t)p] = alloc{ n, K_REG, nullptr, 0 };
	return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p)
{
	LOCKED;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end() || it->second.k != K_REG)
		return ret(cudaErrorHostMemoryNotRegistered);
	allocs.erase(it);
	return cudaSuccess;
}
static void check_copy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
	uintptr_t b;
	if (find(d, &b) && !fake_dev_ok(d, n))
		fake_fail("copy past the end of the destination allocation");
	if (find(s, &b) && !fake_dev_ok(s, n))
		fake_fail("copy past the end of the source allocation");
	if (k == cudaMemcpyHostToDevice && (!is_host(s) || is_host(d)))
		fake_fail("cudaMemcpyHostToDevice between the wrong kinds of memory");
	if (k == cudaMemcpyDeviceToHost && (is_host(s) || !is_host(d)))
		fake_fail("cudaMemcpyDeviceToHost between the wrong kinds of memory");
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	check_copy(d, s, n, k);
	memmove(d, s, n);
	return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	uintptr_t b;
	check_copy(d, s, n, k);
	if (!find(s, &b)) { /* pageable source: staged now, as the driver does */
		auto tmp = std::make_shared<std::vector<char>>((const char *)s, (const char *)s + n);
		fake_enqueue(st, [d, tmp]() { memcpy(d, tmp->data(), tmp->size()); });
	} else {
		fake_enqueue(st, [d, s, n]() { memmove(d, s, n); });
	}
	return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	if (!fake_dev_ok(p, n))
		fake_fail("cudaMemsetAsync outside device memory");
	fake_enqueue(st, [p, v, n]() { memset(p, v, n); });
	return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p)
{
	LOCKED;
	uintptr_t b;
	const alloc *a = find(p, &b);
	memset(at, 0, sizeof(*at));
	if (!a) {
		at->type = cudaMemoryTypeUnregistered;
		at->device = -2;
		return cudaSuccess;
	}
	at->device = 0;
	at->devicePointer = (void *)p;
	at->type = a->k == K_DEV ? cudaMemoryTypeDevice : a->k == K_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeHost;
	if (a->k != K_DEV)
		at->hostPointer = (void *)p;
	return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f)
{
	LOCKED;
	if (f != cudaStreamNonBlocking)
		fake_fail("a blocking stream");
	*s = (cudaStream_t)(void *)new stream();
	return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	LOCKED;
	if (!((stream *)(void *)s)->q.empty())
		fake_fail("stream destroyed with work pending");
	delete (stream *)(void *)s;
	return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	LOCKED;
	if (s == cudaStreamLegacy || s == nullptr) /* its copies ran when they were made */
		return sticky ? ret(sticky) : cudaSuccess;
	stream *x = (stream *)(void *)s;
	while (!x->q.empty()) {
		if (fault_in == 0) { /* an illegal address in this work: the rest never runs */
			sticky = fault_code;
			fault_in = -1;
		}
		if (sticky) {
			x->q.clear();
			return ret(sticky);
		}
		auto fn = std::move(x->q.front());
		x->q.pop_front();
		fn();
		clock_us += 1.0;
		if (fault_in > 0)
			fault_in--;
	}
	return sticky ? ret(sticky) : cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	LOCKED;
	*e = (cudaEvent_t)(void *)new event{ 0, false };
	return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	LOCKED;
	delete (event *)(void *)e;
	return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	LOCKED;
	if (sticky)
		return ret(sticky);
	event *v = (event *)(void *)e;
	v->done = false;
	fake_enqueue(s, [v]() { v->t = clock_us; v->done = true; });
	return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	LOCKED;
	event *x = (event *)(void *)a, *y = (event *)(void *)b;
	if (!x->done || !y->done)
		return ret(cudaErrorNotReady);
	*ms = (float)((y->t - x->t) / 1000.0);
	return cudaSuccess;
}
}
