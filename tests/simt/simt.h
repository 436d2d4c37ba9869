/* simt.h — run CUDA kernels' device code on the CPU for testing: every
 * thread of a block is a coroutine; warp collectives and barriers are
 * cooperative barriers that need every lane (thread) of the warp (block):
 * lanes that diverge either wait for ever (the scheduler aborts: a
 * deadlock) or reach a collective after another lane exited (aborted at
 * once).  A count of collectives per lane could not tell more: a barrier
 * completes only when all its lanes arrive, so their counts always agree. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <functional>

/* (after the CUDA runtime's headers where a file includes them: its own
 * definitions of these give way) */
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __grid_constant__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static

struct simt_dim { unsigned x, y, z; };
#ifndef __VECTOR_TYPES_H__ /* the CUDA runtime's headers define it */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
#endif
static inline float4 simt_float4(float x, float y, float z, float w) { float4 v; v.x = x, v.y = y, v.z = z, v.w = w; return v; }
static inline float2 simt_float2(float x, float y) { float2 v; v.x = x, v.y = y; return v; }
#define make_float4 simt_float4
#define make_float2 simt_float2
struct simt_thread {
	void *sp;
	simt_dim tidx;
	int warp, lane;
	bool done;
	char *stack;
};
extern simt_thread *simt_cur;
extern simt_dim simt_block, simt_grid;
#define threadIdx (simt_cur->tidx)
#define blockIdx simt_block
#define gridDim simt_grid

void simt_wbar(void);
void simt_bbar(void);
uint64_t *simt_wbuf(void);  /* this warp's exchange buffer [32] */
void simt_check_mask(unsigned m);

/* Runs gx*gy*gz blocks of nthreads threads, each executing body. */
void simt_run(unsigned gx, unsigned gy, unsigned gz, int nthreads, const std::function<void()> &body);

template <class T> static inline uint64_t simt_bits(T v) { uint64_t u = 0; memcpy(&u, &v, sizeof(T)); return u; }
template <class T> static inline T simt_from(uint64_t u) { T v; memcpy(&v, &u, sizeof(T)); return v; }

template <class T> static inline T simt_shfl_src(T v, int src)
{
	uint64_t *b = simt_wbuf();
	b[simt_cur->lane] = simt_bits(v);
	simt_wbar();
	T r = simt_from<T>(b[src]);
	simt_wbar();
	return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int o) { simt_check_mask(m); return simt_shfl_src(v, simt_cur->lane ^ o); }
template <class T> static inline T __shfl_down_sync(unsigned m, T v, int d) { simt_check_mask(m); int s = simt_cur->lane + d; return simt_shfl_src(v, s < 32 ? s : simt_cur->lane); }
template <class T> static inline T __shfl_sync(unsigned m, T v, int s) { simt_check_mask(m); return simt_shfl_src(v, s); }
static inline unsigned simt_reduce(unsigned v, int op)
{
	uint64_t *b = simt_wbuf();
	b[simt_cur->lane] = v;
	simt_wbar();
	unsigned r = (unsigned)b[0];
	for (int i = 1; i < 32; i++) {
		unsigned x = (unsigned)b[i];
		r = op == 0 ? (x < r ? x : r) : op == 1 ? (x > r ? x : r) : (r | x);
	}
	simt_wbar();
	return r;
}
static inline unsigned __reduce_min_sync(unsigned m, unsigned v) { simt_check_mask(m); return simt_reduce(v, 0); }
static inline unsigned __reduce_max_sync(unsigned m, unsigned v) { simt_check_mask(m); return simt_reduce(v, 1); }
static inline int __any_sync(unsigned m, int p) { simt_check_mask(m); return simt_reduce(p ? 1u : 0u, 2) != 0; }
static inline int __all_sync(unsigned m, int p) { simt_check_mask(m); return simt_reduce(p ? 1u : 0u, 0) != 0; }
static inline unsigned __ballot_sync(unsigned m, int p) { simt_check_mask(m); return simt_reduce(p ? 1u << simt_cur->lane : 0u, 2); }
static inline void __syncwarp(unsigned m = 0xffffffffu) { simt_check_mask(m); simt_wbar(); }
static inline void __syncthreads(void) { simt_bbar(); }

static inline float __fmul_rn(float a, float b) { return a * b; }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __uint2float_rn(unsigned u) { return (float)u; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = *p;
	if (v < o)
		*p = v;
	return o;
}
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = *p;
	if (v > o)
		*p = v;
	return o;
}
/* the SM's cycle counter: here monotonic nanoseconds (the phase clocks of
 * TQC_PHASES builds; %globaltimer reads the same) */
static inline long long clock64(void) { return (long long)std::chrono::steady_clock::now().time_since_epoch().count(); }
/* blocks run one after another, threads one at a time: plain updates are atomic */
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	unsigned o = *p;
	*p = o + v;
	return o;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = *p;
	*p = o + v;
	return o;
}
static inline unsigned long long atomicExch(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = *p;
	*p = v;
	return o;
}
static inline void __threadfence(void) {}
static inline void __threadfence_system(void) {}
using std::isnan;
using std::isfinite;
