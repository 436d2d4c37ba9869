/* bench.h — tqbench suites register themselves; main() dispatches by name.
 *
 * Each suite lives in its own file under tests/bench/ and registers with
 *   TQ_BENCH_SUITE(codec, "codec [--dim D] [--codec C] [--json]", bench_codec_main)
 * Output: one JSON object per line with --json, else an aligned table.
 * Every figure is printed next to a baseline measured in the same run. */
#ifndef TQ_BENCH_H
#define TQ_BENCH_H

#include <stdint.h>
#include <time.h>

struct bench_suite {
	const char *name;
	const char *usage;
	int (*main)(int argc, char **argv);   /* argv[0] is the suite name */
	struct bench_suite *next;
};

void bench_register(struct bench_suite *s);

#define TQ_BENCH_SUITE(id, usage_, fn)                                        \
	static struct bench_suite bench_suite_##id = { #id, usage_, fn, 0 };  \
	__attribute__((constructor)) static void bench_register_##id(void)    \
	{ bench_register(&bench_suite_##id); }

static inline double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Defeat dead-code elimination of a benchmarked result. */
static inline void bench_sink(const void *p)
{
	__asm__ volatile("" : : "r"(p) : "memory");
}

#endif
