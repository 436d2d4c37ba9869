/* Tiny test harness: one binary per module, one function per case.
 *
 *   static void test_foo(void) { T_ASSERT(x == 1); T_NEAR(a, b, 1e-6); }
 *   int main(void) { T_RUN(test_foo); return t_done(); }
 *
 * A failed check prints file:line and the values, marks the case failed and
 * returns from it.  t_skip() ends the program with exit code 77 (skipped). */
#ifndef TQ_TEST_HARNESS_H
#define TQ_TEST_HARNESS_H

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

extern int t_case_failed;
int t_done(void);
void t_run(const char *name, void (*fn)(void));
_Noreturn void t_skip(const char *why);
uint64_t t_seed(void);
/* What the code under test writes to standard error (fd 2: the daemon's
 * log) from t_stderr_begin to t_stderr_end: the text, NUL-terminated, to
 * free(), and written to the real standard error too; NULL if it could
 * not be captured.  One capture at a time; an exit() in between prints
 * what was captured. */
void t_stderr_begin(void);
char *t_stderr_end(void);

#define T_RUN(fn) t_run(#fn, fn)

#define T_FAIL(...) do { \
	fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
	t_case_failed = 1; return; } while (0)

#define T_ASSERT(c) do { if (!(c)) T_FAIL("assertion failed: %s", #c); } while (0)

#define T_EQ(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
	if (_a != _b) T_FAIL("%s == %s: %lld != %lld", #a, #b, _a, _b); } while (0)

#define T_NEAR(a, b, tol) do { double _a = (a), _b = (b), _t = (tol); \
	if (!(fabs(_a - _b) <= _t)) \
		T_FAIL("%s ~ %s: %.9g vs %.9g (|diff| %.3g > %.3g)", #a, #b, _a, _b, fabs(_a - _b), _t); \
	} while (0)

#endif
