/* simt_selftest.cpp — the SIMT emulator's own checks: a convergent kernel
 * runs and its shuffles, reductions and barriers give a GPU's results, and
 * each mistake the emulator exists to catch ends the process with its
 * reason (a lane that exits while the rest of its warp is at or on its
 * way to a collective, the same for __syncthreads and a block, lanes that
 * wait at barriers that never complete, a partial mask).  Each mistake runs in a child process, which must abort
 * (SIGABRT) with the reason on its standard error.  cuda_simt.sh runs it
 * before the kernels' suite: a check that no longer fires would let the
 * suite pass kernels that hang or read garbage on a GPU. */
#include "simt.h"

#include <string>
#include <sys/wait.h>
#include <unistd.h>

static int failed;

#define CHECK(c)                                                                 \
	do {                                                                     \
		if (!(c)) {                                                      \
			fprintf(stderr, "  %s:%d: %s\n", __FILE__, __LINE__, #c); \
			failed = 1;                                              \
		}                                                                \
	} while (0)

/* A kernel where every lane and thread meets every collective: butterfly
 * sums, a broadcast, a ballot, and a block barrier between a shared write
 * and the reads of it, in every CTA of a 3 x 2 grid of 96 threads. */
static void good_kernel(void)
{
	static unsigned out[6][96]; /* [CTA][thread] */
	static int sums[6][3];       /* [CTA][warp]: the butterfly sum */
	static bool ran[6];

	memset(out, 0, sizeof(out));
	memset(ran, 0, sizeof(ran));
	simt_run(3, 2, 1, 96, []() {
		__shared__ unsigned s_lane_sum[3];
		const unsigned t = threadIdx.x, lane = t & 31u, warp = t >> 5;
		const unsigned cta = blockIdx.y * gridDim.x + blockIdx.x;
		int v = (int)lane;
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		const int from7 = __shfl_sync(0xffffffffu, (int)(lane * 10u), 7);
		const unsigned odd = __ballot_sync(0xffffffffu, (int)(lane & 1u));
		const unsigned mx = __reduce_max_sync(0xffffffffu, lane + warp);
		if (lane == 0)
			s_lane_sum[warp] = (unsigned)v + warp;
		__syncthreads();
		/* every thread reads every warp's value: written before the barrier */
		out[cta][t] = s_lane_sum[0] + s_lane_sum[1] + s_lane_sum[2];
		if (lane == 0) {
			sums[cta][warp] = v;
			ran[cta] = true;
		}
		if (from7 != 70 || odd != 0xaaaaaaaau || mx != 31u + warp)
			out[cta][t] = 0; /* noticed below */
		__syncthreads();
	});
	for (int c = 0; c < 6; c++) {
		CHECK(ran[c]);
		for (int w = 0; w < 3; w++)
			CHECK(sums[c][w] == 496); /* 0 + 1 + ... + 31 */
		for (int t = 0; t < 96; t++)
			CHECK(out[c][t] == 3u * 496u + 0u + 1u + 2u);
	}
}

/* One mistake, in a child: its exit must be SIGABRT with `want` in its
 * standard error. */
static void must_abort(const char *what, const char *want, void (*kernel)(void))
{
	int fd[2];
	if (pipe(fd) < 0) {
		perror("pipe");
		exit(1);
	}
	fflush(stderr);
	const pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0) {
		close(fd[0]);
		dup2(fd[1], STDERR_FILENO);
		kernel();
		_exit(0); /* the emulator let it pass */
	}
	close(fd[1]);
	std::string err;
	char buf[512];
	ssize_t n;
	while ((n = read(fd[0], buf, sizeof(buf))) > 0)
		err.append(buf, (size_t)n);
	close(fd[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	const bool aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
	const bool said = err.find(want) != std::string::npos;
	while (!err.empty() && err.back() == '\n')
		err.pop_back();
	fprintf(stderr, "%-4s %s: %s\n", aborted && said ? "ok" : "FAIL", what,
		aborted ? err.c_str() : "the emulator let it run to the end");
	if (!aborted || !said) {
		fprintf(stderr, "  expected an abort saying '%s'\n", want);
		failed = 1;
	}
}

int main(void)
{
	good_kernel();
	fprintf(stderr, "%-4s a convergent kernel: shuffles, ballot, reduction and barriers as on a GPU\n",
		failed ? "FAIL" : "ok");
	must_abort("a lane exits, the rest of its warp shuffles", "warp collective after a lane of the warp exited",
		   []() {
			   simt_run(1, 1, 1, 64, []() {
				   if (threadIdx.x == 37)
					   return;
				   (void)__shfl_xor_sync(0xffffffffu, 1, 1);
			   });
		   });
	must_abort("a thread exits, the rest of its block waits at __syncthreads",
		   "__syncthreads after a thread of the block exited", []() {
			   simt_run(2, 1, 1, 64, []() {
				   if (blockIdx.x == 1 && threadIdx.x == 63)
					   return;
				   __syncthreads();
			   });
		   });
	must_abort("half a warp at one more __syncwarp than the other half",
		   "warp collective after a lane of the warp exited", []() {
			   simt_run(1, 1, 1, 32, []() {
				   if (threadIdx.x < 16)
					   __syncwarp();
				   __syncwarp();
				   __syncwarp();
			   });
		   });
	must_abort("half a warp at __syncwarp, the other half at __syncthreads",
		   "threads wait at barriers that never complete", []() {
			   simt_run(1, 1, 1, 64, []() {
				   if ((threadIdx.x & 31u) < 16) {
					   __syncwarp();
					   __syncthreads();
				   } else {
					   __syncthreads();
					   __syncwarp();
				   }
			   });
		   });
	must_abort("one warp at a __syncthreads the other never reaches",
		   "__syncthreads after a thread of the block exited", []() {
			   simt_run(1, 1, 1, 64, []() {
				   if (threadIdx.x < 32)
					   __syncthreads();
			   });
		   });
	must_abort("a partial mask", "collective with a partial mask", []() {
		simt_run(1, 1, 1, 32, []() { (void)__shfl_sync(0x0000ffffu, 1, 0); });
	});
	fprintf(stderr, "%s\n", failed ? "simt_selftest: FAILED" : "simt_selftest: every check fired");
	return failed;
}
