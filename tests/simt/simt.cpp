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
	ret
)");

#define STACK (256 * 1024)
static void *sched_sp;
static std::vector<simt_thread> th;
static const std::function<void()> *cur_body;
struct warp_state { unsigned arrived, gen; uint64_t buf[32]; unsigned long ncoll; };
static std::vector<warp_state> warps;
static unsigned b_arrived, b_gen;
static unsigned long b_ncoll;
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
	simt_switch(&simt_cur->sp, sched_sp);
	die("resumed a finished thread");
}

uint64_t *simt_wbuf(void) { return warps[simt_cur->warp].buf; }

void simt_wbar(void)
{
	simt_thread *t = simt_cur;
	warp_state &w = warps[t->warp];
	t->ncoll++;
	for (int l = 0; l < 32; l++) {
		simt_thread &o = th[t->warp * 32 + l];
		if (o.done)
			die("warp collective after a lane of the warp exited");
	}
	if (w.arrived == 0)
		w.ncoll = t->ncoll;
	else if (w.ncoll != t->ncoll)
		die("divergent warp collective (lanes at different collectives)");
	unsigned g = w.gen;
	if (++w.arrived == 32) {
		w.arrived = 0;
		w.gen++;
		spins = 0;
		return;
	}
	while (w.gen == g)
		yield_();
}

void simt_bbar(void)
{
	simt_thread *t = simt_cur;
	unsigned n = (unsigned)th.size();
	t->nbar++;
	for (auto &o : th)
		if (o.done)
			die("__syncthreads after a thread of the block exited");
	if (b_arrived == 0)
		b_ncoll = t->nbar;
	else if (b_ncoll != t->nbar)
		die("divergent __syncthreads");
	unsigned g = b_gen;
	if (++b_arrived == n) {
		b_arrived = 0;
		b_gen++;
		spins = 0;
		return;
	}
	while (b_gen == g)
		yield_();
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
	for (unsigned z = 0; z < gz; z++)
		for (unsigned y = 0; y < gy; y++)
			for (unsigned x = 0; x < gx; x++) {
				simt_block = { x, y, z };
				b_arrived = 0;
				for (auto &w : warps)
					w.arrived = 0;
				for (int i = 0; i < nthreads; i++) {
					simt_thread &t = th[i];
					t.tidx = { (unsigned)i, 0, 0 };
					t.warp = i / 32;
					t.lane = i % 32;
					t.done = false;
					t.ncoll = 0;
					t.nbar = 0;
					uintptr_t top = ((uintptr_t)t.stack + STACK) & ~(uintptr_t)15;
					void **s = (void **)top;
					*--s = nullptr;           /* tramp's return address */
					*--s = (void *)tramp;     /* ret target */
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
