#include "harness.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

int t_case_failed;
static int n_pass, n_fail;

/* Whether the comma-separated list l names the case. */
static int listed(const char *l, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = l; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
			return 1;
	return 0;
}

/* TQ_TEST_SKIP: case names not to run (the aarch64 check under emulation
 * leaves out the long statistical cases); TQ_TEST_ONLY: the only ones to
 * run (with the same list in TQ_TEST_SKIP, a second process runs the
 * rest: cuda_simt.sh splits a suite so). */
static const char *skipped(const char *name)
{
	const char *only = getenv("TQ_TEST_ONLY");

	if (listed(getenv("TQ_TEST_SKIP"), name))
		return "TQ_TEST_SKIP";
	return only && !listed(only, name) ? "not in TQ_TEST_ONLY" : NULL;
}

void t_run(const char *name, void (*fn)(void))
{
	const char *why = skipped(name);
	struct timespec a, b;

	if (why) {
		fprintf(stderr, "skip    %s (%s)\n", name, why);
		return;
	}
	t_case_failed = 0;
	clock_gettime(CLOCK_MONOTONIC, &a);
	fn();
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
	if (t_case_failed) {
		n_fail++;
		fprintf(stderr, "not ok  %s (%.0f ms)\n", name, ms);
	} else {
		n_pass++;
		fprintf(stderr, "ok      %s (%.0f ms)\n", name, ms);
	}
}

int t_done(void)
{
	fprintf(stderr, "%d cases passed, %d failed\n", n_pass, n_fail);
	return n_fail ? 1 : 0;
}

_Noreturn void t_skip(const char *why)
{
	fprintf(stderr, "skipped: %s\n", why);
	exit(77);
}

/* Tests use fixed seeds; TQ_TEST_SEED overrides them to explore. */
uint64_t t_seed(void)
{
	const char *s = getenv("TQ_TEST_SEED");
	return s ? strtoull(s, NULL, 0) : 0x5eed1234abcdULL;
}

static FILE *cap_file; /* the capture's file, NULL when none */
static int cap_saved = -1; /* the real standard error meanwhile */

/* The captured text, and standard error back. */
static char *cap_stop(void)
{
	char *text = NULL;
	long n;

	if (!cap_file)
		return NULL;
	fflush(stderr);
	dup2(cap_saved, STDERR_FILENO);
	close(cap_saved);
	cap_saved = -1;
	if (fseek(cap_file, 0, SEEK_END) == 0 && (n = ftell(cap_file)) >= 0 && fseek(cap_file, 0, SEEK_SET) == 0 &&
	    (text = malloc((size_t)n + 1)) != NULL) {
		text[fread(text, 1, (size_t)n, cap_file)] = '\0';
		fputs(text, stderr);
	}
	fclose(cap_file);
	cap_file = NULL;
	return text;
}

static void cap_at_exit(void)
{
	free(cap_stop());
}

void t_stderr_begin(void)
{
	static int registered;

	if (cap_file)
		return;
	if (!registered && atexit(cap_at_exit) == 0)
		registered = 1;
	fflush(stderr);
	if (!(cap_file = tmpfile()))
		return;
	if ((cap_saved = dup(STDERR_FILENO)) < 0 || dup2(fileno(cap_file), STDERR_FILENO) < 0) {
		if (cap_saved >= 0)
			close(cap_saved);
		cap_saved = -1;
		fclose(cap_file);
		cap_file = NULL;
	}
}

char *t_stderr_end(void)
{
	return cap_stop();
}
