/* launch_probe — what a synchronous decode call on an idle stream pays on the
 * GPU outside its kernel (BENCHMARKS 2b, thirteenth session), as tqc_attend
 * times a call: an event, the work, an event, a stream synchronisation.
 *
 *   A  a copy of 17 KB (queries and page table) from pinned memory, then a
 *      kernel with a small parameter block (tqc_attend today)
 *   B  the same 17 KB passed as kernel parameters (CUDA 12.1+: up to 32 KB)
 *      instead of the copy
 *   C  the kernel alone (the floor: launch latency and the kernel)
 *   D  C with cudaFuncSetAttribute(MaxDynamicSharedMemorySize) after the
 *      event, as launch_mma calls it
 *   E  C with 2 us of host work after the event (host time there is GPU
 *      time: the stream idles until the launch)
 *   F  a copy of 1 KB, then the kernel
 *
 * The kernel is a trivial one on attn_mma's grid at 32k (1 x 32 x 8 CTAs).
 * Medians of 380 calls (20 warm-up calls dropped).  Exit 77 without a GPU.
 *
 *   build/tests/launch_probe          (scripts/gpu-check.sh probe)
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                   \
	do {                                                                                    \
		cudaError_t e_ = (x);                                                            \
		if (e_ != cudaSuccess) {                                                         \
			fprintf(stderr, "launch_probe: %s: %s\n", #x, cudaGetErrorString(e_));   \
			exit(1);                                                                 \
		}                                                                                \
	} while (0)

namespace {
constexpr int NQ = 4096, NP = 512, REPS = 400, WARM = 20;

struct small_args {
	const float *q;
	const void *const *pages;
	float *out;
	int n;
};
struct big_args {
	float q[NQ]; /* 16 KB: 32 query heads x d 128, fp32 */
	const void *pages[NP];
	float *out;
	int n;
};

template <class A>
__device__ __forceinline__ void touch(const A &a, const float *q, const void *const *pages)
{
	float s = 0.0f;
	for (int i = (int)threadIdx.x; i < 512; i += (int)blockDim.x)
		s += q[(blockIdx.y * 16 + i % 16) % NQ] + (float)(uintptr_t)pages[(blockIdx.y + i) % a.n];
	if (s == 12345.0f) /* never: keeps the loads */
		a.out[0] = s;
}
__global__ void k_small(const __grid_constant__ small_args a) { touch(a, a.q, a.pages); }
__global__ void k_big(const __grid_constant__ big_args a) { touch(a, a.q, a.pages); }
__global__ void k_smem(const __grid_constant__ small_args a)
{
	extern __shared__ float sm[];
	if (a.n < 0) { /* never */
		sm[threadIdx.x] = 1.0f;
		a.out[0] = sm[threadIdx.x ^ 1];
	}
}

double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}
} // namespace

int main(void)
{
	const size_t qb = NQ * sizeof(float), pb = 128 * sizeof(void *); /* 32k: 128 pages */
	const int smem = 100 << 10;
	int n_dev = 0;

	if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
		printf("skipped: no CUDA device\n");
		return 77;
	}
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("device 0: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);

	uint8_t *pin, *dev;
	float *out;
	cudaStream_t st;
	cudaEvent_t e0, e1;
	CK(cudaHostAlloc((void **)&pin, qb + pb, 0));
	CK(cudaMalloc((void **)&dev, qb + pb));
	CK(cudaMalloc((void **)&out, 64));
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	memset(pin, 0, qb + pb);
	const small_args s = { (const float *)(void *)(dev + pb), (const void *const *)(void *)dev, out, 128 };
	static big_args b;
	memset(&b, 0, sizeof(b));
	b.out = out;
	b.n = 128;
	const dim3 grid(1, 32, 8);
	CK(cudaFuncSetAttribute((const void *)k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

	static const char *const names[] = {
		"A copy of 17 KB, then the kernel", "B 17 KB as kernel parameters", "C the kernel alone",
		"D C + cudaFuncSetAttribute",       "E C + 2 us of host work",     "F copy of 1 KB, then the kernel",
	};
	double base = 0.0;
	for (int mode = 0; mode < 6; mode++) {
		std::vector<double> g, w;
		for (int r = 0; r < REPS; r++) {
			const auto t0 = std::chrono::steady_clock::now();
			CK(cudaEventRecord(e0, st));
			switch (mode) {
			case 0:
				CK(cudaMemcpyAsync(dev, pin, qb + pb, cudaMemcpyHostToDevice, st));
				k_small<<<grid, 192, 0, st>>>(s);
				break;
			case 1:
				memcpy(b.q, pin, qb);
				k_big<<<grid, 192, 0, st>>>(b);
				break;
			case 2: k_small<<<grid, 192, 0, st>>>(s); break;
			case 3:
				CK(cudaFuncSetAttribute((const void *)k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
				k_smem<<<grid, 192, smem, st>>>(s);
				break;
			case 4: {
				const auto h = std::chrono::steady_clock::now();
				while (std::chrono::duration<double>(std::chrono::steady_clock::now() - h).count() < 2e-6)
					;
				k_small<<<grid, 192, 0, st>>>(s);
			} break;
			default:
				CK(cudaMemcpyAsync(dev, pin, pb, cudaMemcpyHostToDevice, st));
				k_small<<<grid, 192, 0, st>>>(s);
				break;
			}
			CK(cudaGetLastError());
			CK(cudaEventRecord(e1, st));
			CK(cudaStreamSynchronize(st));
			const auto t1 = std::chrono::steady_clock::now();
			float ms;
			CK(cudaEventElapsedTime(&ms, e0, e1));
			if (r >= WARM) {
				g.push_back(ms * 1e3);
				w.push_back(std::chrono::duration<double>(t1 - t0).count() * 1e6);
			}
		}
		const double gm = median(g);
		if (mode == 2)
			base = gm;
		printf("%-36s GPU %6.2f us  wall %6.2f us\n", names[mode], gm, median(w));
	}
	printf("(C, the floor: %.2f us)\n", base);
	return 0;
}
