/* tq_cuda.h — the GPU kernels: device facts, device and unified memory,
 * quantize-append and fused attention on pages that live on a CUDA device.
 *
 * The kernels read and write exactly the block layouts of tq_layout.h and
 * the page layout of tq_page.h (the .cu files include both and static_assert
 * the same facts as the C side), so a page written by the GPU decodes on the
 * CPU and the other way round, and spill files do not care where a page
 * was computed.
 *
 *   tqc_append   quantize-append: the same bytes as the CPU reference encoder
 *                (tq_encode_ref) for every codec, rotation and head dim;
 *   tqc_attend   fused attention, the contract of tq_attend (tq_attn.h):
 *                decode (split-K over the context, log-sum-exp merge) and
 *                causal prefill, every K/V codec pair, GQA groups sharing each
 *                decoded key and value; within 1e-3 of the output norm of
 *                tq_attend_ref.
 *
 * Built when the build has CUDA (make USE_CUDA=yes, or auto with nvcc
 * found); then the library links the CUDA runtime statically and needs only
 * the driver (libcuda.so.1) at run time.  A build without CUDA keeps this
 * interface: tqc_built() is 0 and every call fails with -ENOSYS and says so
 * (kernels/tq_cuda_none.c), so callers compile one way everywhere.
 *
 * Errors: 0 or a negative errno and a one-line reason (`why` or tq_error):
 * -ENOSYS (built without CUDA), -ENODEV (no driver, driver too old, no such
 * device), -ENOMEM (device or pinned memory), -EINVAL (arguments, the
 * contract's input checks), -ERANGE (append: values beyond the codec's
 * range), -EIO (a CUDA call failed after start: the reason names it).
 * Nothing here logs.
 *
 * Threads: a tqc_ctx (one CUDA stream and its scratch) is used by one
 * thread at a time; different contexts run concurrently.  The memory calls
 * are thread-safe.  Every call sets the calling thread's current device.
 */
#ifndef TQ_CUDA_H
#define TQ_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tq_attn.h"
#include "tq_codec.h"
#include "tq_page.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if this build has the CUDA kernels, 0 if it was built without CUDA. */
int tqc_built(void);

/* ---- devices ------------------------------------------------------------------ */
struct tqc_device_info {
	int device;
	char name[128];
	int cc_major, cc_minor;      /* compute capability, e.g. 9.0 (H100), 12.1 (GB10) */
	int sms;                     /* multiprocessors                                 */
	int integrated;              /* cudaDevAttrIntegrated: shares the host's DRAM   */
	int pageable_access;         /* cudaDevAttrPageableMemoryAccess: the GPU reads  */
				     /* pageable host memory (ATS on Grace; HMM on x86)  */
	int host_page_tables;        /* ...PageableMemoryAccessUsesHostPageTables: through */
				     /* the host's own page tables (Grace: GH200, GB10), */
				     /* not HMM's mirror of them (an x86 server's GPU:   */
				     /* its pool belongs in its own memory)              */
	int host_register;           /* cudaDevAttrHostRegisterSupported                */
	int managed;                 /* cudaDevAttrManagedMemory                        */
	uint64_t total_bytes;        /* device memory                                   */
	uint64_t free_bytes;         /* of which free now (cudaMemGetInfo)              */
	double peak_gbps;            /* peak memory bandwidth, GB/s (clock x bus x 2)   */
	int driver_version;          /* e.g. 13000                                      */
	int runtime_version;
	int smem_block_optin;        /* shared memory one kernel may ask for, bytes     */
	int smem_sm;                 /* shared memory of one multiprocessor, bytes      */
};

/* Devices the driver sees: >= 0, or -ENODEV / -ENOSYS with why (no driver,
 * driver older than this build's runtime, no device at all). */
int tqc_device_count(char *why, size_t whylen);
/* The facts of device `device`: 0, or -ENODEV (no such device: why says how
 * many there are) / -ENOSYS. */
int tqc_device_query(int device, struct tqc_device_info *out, char *why, size_t whylen);
/* 1 if the device and the CPU share memory without copies: integrated, or
 * pageable memory access through the host's page tables. */
int tqc_device_unified(const struct tqc_device_info *d);
/* After a start on `device` failed (the pool falls back to host memory):
 * destroy this process's context there (cudaDeviceReset), which holds
 * device memory (hundreds of MB on a discrete GPU; host memory on a
 * unified one) for nothing from then on.  Only while nothing of this
 * process uses the device; nothing when there is no such device. */
void tqc_device_release(int device);

/* 1 once a CUDA call of this process failed with an error that leaves its
 * context unusable (a kernel's illegal address, a hardware exception, an
 * uncorrectable ECC error, a device that fell off the bus: "sticky" errors,
 * every later call returns them and the device's memory is gone), with the
 * first such failure in why; else 0.  From then on every call here that
 * would touch the device fails at once with -ENOTRECOVERABLE and that
 * reason: only a new process gets a new context. */
int tqc_device_lost(char *why, size_t whylen);

/* ---- memory ------------------------------------------------------------------ */
/* A region for the page pool on `device`, `bytes` long, 2 MiB aligned:
 *   unified = 0: device memory (cudaMalloc): only kernels and tqc_copy touch it;
 *   unified = 1: memory the CPU and the GPU both read and write, no copies
 *                (pinned, mapped host memory; on an integrated GPU it is the
 *                GPU's memory too): *out is a valid host pointer and the
 *                same address on the device.
 * 0, or -ENOMEM / -ENODEV / -EINVAL with why. */
int tqc_region_alloc(int device, uint64_t bytes, int unified, void **out, char *why, size_t whylen);
void tqc_region_free(int device, void *p, int unified);
/* Pin host memory the daemon has mapped (a client's shared arena) so that
 * kernels read and write it directly (cudaHostRegister, mapped).
 * 0, or a negative errno with why; then the data path stages copies. */
int tqc_host_register(int device, void *p, size_t bytes, char *why, size_t whylen);
void tqc_host_unregister(int device, void *p);
/* Copy between any two of host, registered and device memory (unified
 * addressing), synchronously: 0, or -EIO with why. */
int tqc_copy(int device, void *dst, const void *src, size_t bytes, char *why, size_t whylen);
/* Pinned host memory (cudaHostAlloc), for staging: NULL on failure. */
void *tqc_pinned_alloc(int device, size_t bytes);
void tqc_pinned_free(void *p);

/* ---- execution contexts ------------------------------------------------------- */
typedef struct tqc_ctx tqc_ctx;

/* A CUDA stream on `device` (non-blocking) with its own scratch (device
 * buffers for page tables, queries and split-K partials; pinned staging),
 * grown on demand and kept.  0, or a negative errno with err set. */
int tqc_ctx_new(tqc_ctx **out, int device, tq_error *err);
void tqc_ctx_free(tqc_ctx *x);
int tqc_ctx_device(const tqc_ctx *x);
/* GPU time of the last tqc_append / tqc_attend on this context, in
 * microseconds (CUDA events around its stream work); 0 before any. */
double tqc_ctx_last_us(const tqc_ctx *x);
/* The encoder the last tqc_append ran (its last launch): "reg" or "general"
 * (tqc_append); "" before any. */
const char *tqc_ctx_last_append(const tqc_ctx *x);
/* The attention kernel the last tqc_attend ran (its last pass): "mma" (tiles
 * of 32 keys staged in shared memory, scores and values on the tensor cores:
 * head dims 64 / 128 / 256, K and V codecs tq2..tq4 / q8 or K tq3o / tq4o,
 * pages of a multiple of 32 tokens, Hadamard or no rotation) or "general"
 * (any shape);
 * "" before any.  The environment, read by tqc_ctx_new, can steer it for
 * tests and tuning: TQ_CUDA_ATTN=general never runs the tiled kernel;
 * TQ_CUDA_CTAS_PER_SM=N (1..64) sets the CTAs per SM the context split aims
 * at (default: 4 for the general kernel; for the tiled one, as many as run
 * at once by the runtime's occupancy query, at most 4); the split fills
 * whole waves (CTAs <= N x SMs); TQ_CUDA_ENC_PASS=N (1..32768) the most
 * tokens one append launch takes (default 32768; fewer: a call's several
 * launches and their errors tested on short inputs); TQ_CUDA_SPLIT_MIN=N
 * (32..2^20) the fewest
 * keys a split may have (default 512: shorter splits repeat the CTA's
 * set-up for too few tiles); TQ_CUDA_SPLIT_SHARED=N (32..2^20) the longest
 * a split is made when the GPU is shared (default 2048: a tiled call that
 * starts while another tqc_attend of this process is in flight on its
 * device, tqc_attn_inflight, splits its context in at most 16, into splits
 * of at most N keys and at least the shortest; N at or below the shortest
 * split turns that off). */
const char *tqc_ctx_last_attn(const tqc_ctx *x);
/* The same pass's launch in words, for benchmarks and logs: the kernel, its
 * warps per CTA and CTAs per SM (mma), the context's splits and their
 * length, and " (GPU shared)" when planned as sharing the GPU, e.g. "mma: 6
 * warps x 2 CTAs/SM, 33 splits of 4000 keys"; "" before any.  Valid until
 * the next call on x (formatted here, not per call). */
const char *tqc_ctx_last_attn_plan(tqc_ctx *x);
/* tqc_attend calls in flight on the device in this process now, of every
 * context (a call counts from its start to its return); 0 without CUDA. */
int tqc_attn_inflight(int device);

/* Quantize-append n tokens of one layer: token i goes to slot pos + i, that
 * is page (pos + i) / page_tokens at slot (pos + i) % page_tokens, K blocks
 * with k_codec and V blocks with v_codec. */
struct tqc_append {
	const tq_codec *k_codec;     /* the layer's codecs (same dim)                   */
	const tq_codec *v_codec;
	const struct tq_page_table *kv; /* the layer's page table: pages are device     */
				     /* (or unified) pointers, the array is host memory; */
				     /* n_pages must cover tokens up to pos + n          */
	uint32_t pos;                /* first slot to write                             */
	uint32_t n;                  /* tokens, >= 1                                    */
	const void *k;               /* [n][n_kv_heads][dim] of dtype                   */
	const void *v;               /* [n][n_kv_heads][dim] of dtype                   */
	enum tq_dtype dtype;
};
/* 0, after the stream finished.  The inputs may be device, registered,
 * managed or plain host memory (plain host memory is staged through pinned
 * buffers first).  Every value is checked on the device: a NaN or Inf
 * (-EINVAL) or a vector the codec cannot represent (-ERANGE, as
 * tq_encode_ref) fails the call, *bad = the first failing token and err
 * names the token, the K or V side, the head and (NaN/Inf) the element.
 * On failure blocks of any token may have been written, and a failing
 * vector's block is zeroed (never left with the slot's earlier bytes,
 * which may be another session's: see tqc_append_attend): slots at or past
 * the layer's committed length carry no meaning (tq_page.h), so the caller
 * keeps the layer as it was by not committing the tokens.  The kernel: a
 * register-resident one for head dims 64 / 128 / 256 with K and V codecs
 * tq2..tq4 / q8 / tq3o / tq4o (Hadamard rotation) and inputs aligned to
 * their element,
 * else the general one (any shape); both write the same bytes.
 * TQ_CUDA_ENC=general in the environment (read by tqc_ctx_new) always runs
 * the general one, for tests and baselines. */
int tqc_append(tqc_ctx *x, const struct tqc_append *a, uint32_t *bad, tq_error *err);

/* Fused attention on the device: the contract, checks and errors of
 * tq_attend (tq_attn.h) with these differences:
 *   - kv->pages: device (or unified) page pointers in a host array;
 *   - q and q_pos: host memory (they are checked on the host, then copied
 *     to the device with the page table);
 *   - out: device, registered, managed or plain host memory;
 *   - isa, threads, plan_n_q and workspace are ignored;
 *   - sparse_v > 0 skips a value chunk by tq_attend's rule, where a chunk is
 *     a warp's tile of 32 keys (the tiled kernel) or one key (the general
 *     one); stats are counted only then (sparse_v = 0 runs exact and counts
 *     nothing, so that an exact call reads nothing back).  The same call
 *     skips the same chunks every time (the same bits).
 * Returns after the stream finished. */
int tqc_attend(tqc_ctx *x, const struct tq_attn_params *p, tq_error *err);

/* The tiled attention kernel (decode) reads a layer in tiles of this many
 * tokens, each inside one page: it serves pages whose page_tokens is a
 * multiple of it (and head_dim 64, 128 or 256 with codecs it decodes);
 * other pages go to the general kernel, several times slower (an H200 at
 * 8k context: 68-token pages made tqkvd's decode step about 8 x slower
 * than 64-token ones).  A GPU pool cuts its pages to a multiple of it
 * (backend.h's page_tokens_align). */
#define TQC_PAGE_TOKENS_ALIGN 32u

/* One layer's decode step: tqc_append of a, then tqc_attend of p over the
 * layer with a's tokens (p->kv: a's pages, n_tokens = a->pos + a->n), on
 * the context's stream.  When the append is a single launch that needs
 * none of the context's staging (k and v device, registered, managed or
 * mapped pinned memory; its pages few enough to ride in the launch's
 * arguments, as a decode token's do; one pass), the attention is queued
 * behind it and the host waits once, for both: the append adds its
 * kernel's time and not a launch and a wait of its own
 * (tqc_ctx_last_fused: 1).  Otherwise the two run one after the other, as
 * the two calls would (tqc_ctx_last_fused: 0).  Either way:
 *   - 0 when both succeeded, after the stream finished; tqc_ctx_last_us is
 *     the GPU time of both;
 *   - else the error of the first part that failed, *stage saying which
 *     (TQC_STAGE_APPEND: with *bad and err as tqc_append's, and the
 *     tokens must not be committed; TQC_STAGE_ATTEND: the append
 *     succeeded, err is the attention's).  A queued append's failure is
 *     found after the attention has run over its slots: the output is then
 *     meaningless, as after any failed call, but made of this call's own
 *     inputs and the layer's tokens only (a failing vector's block is
 *     zeroed before the attention reads it: the pages' earlier contents
 *     never reach out).
 * TQC_STAGE_* are for *stage (may be NULL). */
enum { TQC_STAGE_NONE = 0, TQC_STAGE_APPEND = 1, TQC_STAGE_ATTEND = 2 };
int tqc_append_attend(tqc_ctx *x, const struct tqc_append *a, const struct tq_attn_params *p, uint32_t *bad,
		      int *stage, tq_error *err);
/* 1 when the last tqc_append_attend on x queued its attention behind its
 * append with no wait between (and succeeded), else 0. */
int tqc_ctx_last_fused(const tqc_ctx *x);

/* ---- profiling: where the tiled kernel's time goes ---------------------------
 * In a build of tq_cuda_attn.cu with TQC_PHASES (`make phases`:
 * build/bin/tqbench-phases, for `tqbench attn --backend cuda --phases N`;
 * never the daemon's build), each CTA of attn_mma stamps its clocks at its
 * phase boundaries into a record while the records are armed.  clock64 (the
 * SM's cycles) times the phases within a CTA; %globaltimer (nanoseconds, at
 * the driver's resolution: 32 ns to 1 us) places the CTAs against each
 * other.  The instrumentation is a few global stores by one thread a phase
 * and an atomic a warp at the end; the other builds carry none of it. */
struct tqc_phase_rec {
	uint64_t gt_entry;           /* %globaltimer at the CTA's entry                 */
	uint64_t gt_end;             /* %globaltimer at its last warp's exit           */
	uint64_t c_entry;            /* clock64: entry                                  */
	uint64_t c_qrot;             /* the queries rotated, codebooks loaded (barrier) */
	uint64_t c_tables;           /* the decode tables filled (barrier)              */
	uint64_t c_tile1;            /* warp 0's first tile landed (0: none)            */
	uint64_t c_loop_first;       /* the first warp out of the tile loop             */
	uint64_t c_loop_last;        /* the last one                                    */
	uint64_t c_part;             /* the CTA's partials written (barrier)            */
	uint64_t c_end;              /* the last warp's exit (after the merge if last)  */
	uint32_t smid;               /* the SM it ran on                                */
	uint32_t last;               /* 1: it merged its row block's splits            */
	uint32_t grid[3];            /* the launch's gridDim: row blocks, splits, heads */
	uint32_t warps;              /* blockDim.x / 32                                 */
	uint32_t tiles;              /* the split's tiles (after the rows' limits)      */
	uint32_t written;            /* 1: the CTA wrote this record                    */
};
/* Arm records for up to max_ctas CTAs of the next attn_mma launches on
 * `device`: CTA (x, y, z) of a launch writes record x + X (y + Y z) (CTAs
 * past max_ctas write none).  0; -ENOTSUP in a build without TQC_PHASES;
 * another negative errno with why set. */
int tqc_phases_arm(int device, uint32_t max_ctas, char *why, size_t whylen);
/* After a call (tqc_attend returned): copy the records out (up to max; *n:
 * the last launch's CTAs, from its records) and clear them for the next
 * call.  0, or a negative errno with why set. */
int tqc_phases_take(struct tqc_phase_rec *out, uint32_t max, uint32_t *n, char *why, size_t whylen);
/* Stop recording and free the records. */
void tqc_phases_disarm(void);

#ifdef __cplusplus
}
#endif
#endif /* TQ_CUDA_H */
