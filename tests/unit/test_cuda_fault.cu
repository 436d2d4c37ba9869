/* test_cuda_fault — a real device fault against tq_cuda.h's lost-device rule,
 * on a GPU (the emulator's twin is test_cuda test_device_lost).
 *
 * A kernel of this program writes to an address no allocation holds: the
 * CUDA context is lost to a sticky error (cudaErrorIllegalAddress).  Then
 * the next tq_cuda call that touches the device must fail with
 * -ENOTRECOVERABLE and say so (the device, the call, the error), and
 * tqc_device_lost report it; every later call fails at once with the same
 * reason.  This checks that the runtime's errors after a real fault are
 * the ones tq_cuda.c recognises.  One process per fault: the context does
 * not come back.  Exit 0, 1 (a check failed) or 77 (no usable GPU).
 *
 *   build/tests/test_cuda_fault          (scripts/gpu-check.sh fault)
 */
#include <cuda_runtime.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "tq_cuda.h"

namespace {
int failed;

void check(bool ok, const char *what, const char *detail)
{
	printf("%s  %s%s%s\n", ok ? "ok  " : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
	failed |= !ok;
}
} // namespace

__global__ void write_nowhere(int *p)
{
	p[threadIdx.x] = 1;
}

int main()
{
	char why[512], w2[512];
	const int dev = 0;
	uint8_t host[256];

	if (tqc_device_count(why, sizeof(why)) <= 0) {
		printf("skipped: %s\n", why);
		return 77;
	}
	memset(host, 7, sizeof(host));
	void *region = nullptr;
	if (tqc_region_alloc(dev, 1 << 20, 0, &region, why, sizeof(why)) < 0) {
		printf("FAIL  tqc_region_alloc: %s\n", why);
		return 1;
	}
	check(tqc_copy(dev, region, host, sizeof(host), why, sizeof(why)) == 0, "a copy before the fault", why);
	check(tqc_device_lost(why, sizeof(why)) == 0, "not lost before the fault", nullptr);

	/* the fault: an address far from any allocation */
	write_nowhere<<<1, 32>>>(reinterpret_cast<int *>(uintptr_t{ 0x10 }));
	const cudaError_t e = cudaDeviceSynchronize();
	snprintf(w2, sizeof(w2), "%s", cudaGetErrorName(e));
	check(e == cudaErrorIllegalAddress, "the kernel's fault", w2);

	/* the next call that touches the device meets it */
	why[0] = 0;
	const int rc = tqc_copy(dev, region, host, sizeof(host), why, sizeof(why));
	check(rc == -ENOTRECOVERABLE, "the next call: -ENOTRECOVERABLE", why);
	check(strstr(why, "cudaErrorIllegalAddress") && strstr(why, "context is lost"), "its reason", why);
	check(tqc_device_lost(w2, sizeof(w2)) == 1 && strcmp(w2, why) == 0, "tqc_device_lost", w2);

	/* every later call: at once, the same reason (a tq_error holds its first
	 * sizeof(msg) - 1 bytes) */
	tqc_ctx *x = nullptr;
	tq_error err;
	check(tqc_ctx_new(&x, dev, &err) == -ENOTRECOVERABLE && !x && strncmp(err.msg, why, sizeof(err.msg) - 1) == 0,
	      "tqc_ctx_new after",
	      err.msg);
	void *r2 = nullptr;
	check(tqc_region_alloc(dev, 1 << 20, 0, &r2, w2, sizeof(w2)) == -ENOTRECOVERABLE && !r2, "tqc_region_alloc after",
	      w2);
	check(tqc_pinned_alloc(dev, 4096) == nullptr, "tqc_pinned_alloc after", nullptr);
	printf("%s\n", failed ? "test_cuda_fault: FAILED" : "test_cuda_fault: passed");
	return failed ? 1 : 0;
}
