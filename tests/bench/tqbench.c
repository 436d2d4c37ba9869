/* tqbench — the benchmark driver: `tqbench SUITE [options]`. */
#include <stdio.h>
#include <string.h>

#include "bench.h"

static struct bench_suite *suites;

void bench_register(struct bench_suite *s)
{
	struct bench_suite **p = &suites;

	/* keep them sorted by name for --help */
	while (*p && strcmp((*p)->name, s->name) < 0)
		p = &(*p)->next;
	s->next = *p;
	*p = s;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: tqbench SUITE [options]\n\nsuites:\n");
	for (struct bench_suite *s = suites; s; s = s->next)
		fprintf(f, "  tqbench %s\n", s->usage);
	fprintf(f, "\nRun with nothing else busy on the machine: every figure is compared\n"
		   "with a baseline measured in the same run.  `tqbench SUITE --help` for details.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
#ifdef TQ_SANITIZER
	/* a sanitized build's binaries replace build/bin's (make check
	 * SANITIZER=...): its figures are several times slower than the
	 * product's, so say so before any */
	fprintf(stderr, "tqbench: WARNING: this is a SANITIZER=%s build: its timings mean nothing "
			"(a plain `make` rebuilds build/bin without it)\n", TQ_SANITIZER);
#endif
	for (struct bench_suite *s = suites; s; s = s->next)
		if (!strcmp(s->name, argv[1]))
			return s->main(argc - 1, argv + 1);
	fprintf(stderr, "tqbench: unknown suite '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
