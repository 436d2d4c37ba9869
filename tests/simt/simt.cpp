#include "simt.h"

#include <vector>

simt_thread *simt_cur;
simt_dim simt_block, simt_grid;

extern "C" void simt_switch(void **save_sp, void *new_sp);
asm(R"(
.text
.globl simt_switch
.type simt_switch,@function
simt_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	popq %rax
	jmpq *%rax
)");

/* Each thread's stack: STACK_USE bytes below its top, the top STACK_SKEW(i)
 * below the end of its allocation.  Allocations of this size are
 * page-aligned, so tops at the same offset in every one would share their
 * L1 and L2 cache sets: a switch to another thread then missed on that
 * thread's saved registers nearly every time (most of the emulator's time
 * at 128 threads and more).  Skewed, the tops fall in different sets. */
#define STACK_USE (256 * 1024)
#define STACK_SKEW(i) ((uintptr_t)(i) * 17u * 64u % (64u * 1024u))
#define STACK (STACK_USE + 64 * 1024)
static void *sched_sp;
static std::vector<simt_thread> th;
static const std::function<void()> *cur_body;
/* n_done: the warp's lanes that have exited (counted, so that a collective
 * need not look at all 32 lanes each time: it ran once per lane and
 * collective, the emulator's hottest loop) */
struct warp_state { unsigned arrived, gen, n_done; uint64_t buf[32]; };
static std::vector<warp_state> warps;
static unsigned b_arrived, b_gen, b_done; /* b_done: the block's threads that exited */
static unsigned long spins;

static void die(const char *m)
{
	fprintf(stderr, "SIMT: %s (block %u,%u,%u thread %u)\n", m, simt_block.x, simt_block.y, simt_block.z,
		simt_cur ? simt_cur->tidx.x : 0);
	abort();
}

void simt_check_mask(unsigned m)
{
	if (m != 0xffffffffu)
		die("collective with a partial mask");
}

static void yield_(void)
{
	simt_thread *t = simt_cur;
	simt_switch(&t->sp, sched_sp);
}

static void tramp(void)
{
	(*cur_body)();
	simt_cur->done = true;
	warps[simt_cur->warp].n_done++;
	b_done++;
	simt_switch(&simt_cur->sp, sched_sp);
	die("resumed a finished thread");
}

uint64_t *simt_wbuf(void) { return warps[simt_cur->warp].buf; }

void simt_wbar(void)
{
	warp_state &w = warps[simt_cur->warp];
	if (w.n_done)
		die("warp collective after a lane of the warp exited");
	unsigned g = w.gen;
	if (++w.arrived == 32) {
		w.arrived = 0;
		w.gen++;
		spins = 0;
		return;
	}
	while (w.gen == g) {
		yield_();
		/* a lane that exited meanwhile will never arrive */
		if (w.gen == g && w.n_done)
			die("warp collective after a lane of the warp exited");
	}
}

void simt_bbar(void)
{
	unsigned n = (unsigned)th.size();
	if (b_done)
		die("__syncthreads after a thread of the block exited");
	unsigned g = b_gen;
	if (++b_arrived == n) {
		b_arrived = 0;
		b_gen++;
		spins = 0;
		return;
	}
	while (b_gen == g) {
		yield_();
		/* a thread that exited meanwhile will never arrive */
		if (b_gen == g && b_done)
			die("__syncthreads after a thread of the block exited");
	}
}

#include <time.h>
double simt_seconds;
static void report(void) { fprintf(stderr, "SIMT time in emulated kernels: %.1f s\n", simt_seconds); }
void simt_run(unsigned gx, unsigned gy, unsigned gz, int nthreads, const std::function<void()> &body)
{
	static bool reg;
	if (!reg) { reg = true; atexit(report); }
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (nthreads % 32)
		die("block size not a multiple of 32");
	if (th.size() != (size_t)nthreads) {
		for (auto &t : th)
			free(t.stack);
		th.assign(nthreads, simt_thread());
		for (auto &t : th)
			t.stack = (char *)malloc(STACK);
		warps.assign(nthreads / 32, warp_state());
	}
	cur_body = &body;
	simt_grid = { gx, gy, gz };
	/* The CTAs one after another, in a shuffled order: a GPU runs them in
	 * any order and at once, so a kernel whose result depends on the order
	 * (a count shared where it should not be, a merge before its inputs)
	 * fails here too instead of passing in grid order.  SIMT_CTA_SEED=N
	 * picks another order; 0 runs them in grid order (x fastest). */
	static const uint64_t seed0 = getenv("SIMT_CTA_SEED") ? strtoull(getenv("SIMT_CTA_SEED"), nullptr, 0) : 1;
	static uint64_t launches;
	const size_t n_cta = (size_t)gx * gy * gz;
	std::vector<size_t> order(n_cta);
	for (size_t i = 0; i < n_cta; i++)
		order[i] = i;
	if (seed0) {
		uint64_t r = seed0 * 0x9E3779B97F4A7C15ull + ++launches;
		for (size_t i = n_cta; i > 1; i--) { /* Fisher-Yates, splitmix64 */
			uint64_t z = (r += 0x9E3779B97F4A7C15ull);
			z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
			z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
			z ^= z >> 31;
			std::swap(order[i - 1], order[z % i]);
		}
	}
	for (size_t oi = 0; oi < n_cta; oi++) {
		const size_t ci = order[oi];
		const unsigned x = (unsigned)(ci % gx), y = (unsigned)(ci / gx % gy), z = (unsigned)(ci / gx / gy);
		simt_block = { x, y, z };
		b_arrived = 0;
		b_done = 0;
		for (auto &w : warps)
			w.arrived = w.n_done = 0;
		for (int i = 0; i < nthreads; i++) {
			simt_thread &t = th[i];
			t.tidx = { (unsigned)i, 0, 0 };
			t.warp = i / 32;
			t.lane = i % 32;
			t.done = false;
			uintptr_t top = ((uintptr_t)t.stack + STACK - STACK_SKEW(i)) & ~(uintptr_t)15;
			void **s = (void **)top;
			*--s = nullptr;           /* tramp's return address */
			*--s = (void *)tramp;     /* simt_switch's jump target */
			for (int r = 0; r < 6; r++)
				*--s = nullptr;
			t.sp = s;
		}
		int live = nthreads;
		spins = 0;
		while (live) {
			live = 0;
			for (auto &t : th) {
				if (t.done)
					continue;
				simt_cur = &t;
				simt_switch(&sched_sp, t.sp);
				if (!t.done)
					live++;
			}
			simt_cur = nullptr;
			if (live && ++spins > 2000000)
				die("deadlock: threads wait at barriers that never complete");
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	simt_seconds += (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
}
