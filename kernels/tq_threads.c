/* tq_threads.c — persistent worker pool (see tq_threads.h).
 *
 * Job protocol: the caller bumps `gen` (the futex word workers wait on) after
 * publishing fn/arg/n_tasks.  Tasks are claimed from `claim`, a 64-bit word
 * holding (generation << 32 | next task), with a compare-and-swap that fails
 * when the generation moved on, so a worker that woke late for an old job can
 * never run a new job's task with the old job's function.  `done` counts
 * finished tasks; the worker finishing the last one wakes the caller if it
 * went to sleep.
 *
 * A worker late for job g reads fn/arg/n_tasks, then claims with g.  If it
 * read the next job's n_tasks (larger) while `claim` still held g's
 * exhausted count, it could claim "task n_g" of g and run the next job's
 * function on it, a task that job then runs again (and count it in `done`
 * after the caller reset it).  So the caller first closes g's claims
 * (claim = the new generation with no task left, seq_cst), then publishes
 * fn/arg/n_tasks with release stores that the workers read with acquire:
 * a worker that read any of the new values also sees the closed claim word,
 * and its compare-and-swap with g fails.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tq_threads.h"

void (*tq_threads_test_pause)(void);

#define SPIN_ITERS 20000  /* ~40-80 us of polling before a futex sleep */

struct tq_threads {
	int n;                      /* threads including the caller            */
	int n_started;              /* workers actually created                 */
	pthread_t *tid;             /* [n - 1]                                  */
	pthread_mutex_t run_lock;   /* serializes tq_threads_run()              */

	/* the current job: written by the caller before `gen` is bumped (atomic
	 * only because a worker late for an old job may read them while a new
	 * job writes them; the generation check makes such a read harmless) */
	_Atomic(tq_task_fn) fn;
	_Atomic(void *) arg;
	_Atomic int n_tasks;

	_Atomic uint32_t gen;       /* job generation: futex word of idle workers */
	_Atomic uint64_t claim;     /* gen << 32 | next task                      */
	_Atomic uint32_t done;      /* finished tasks: futex word of the caller   */
	_Atomic int sleepers;       /* workers in (or entering) futex_wait        */
	_Atomic int caller_sleeps;
	_Atomic int stop;
};

struct worker_arg {
	tq_threads *t;
	int index;
};

static void futex_wait(_Atomic uint32_t *w, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w, int n)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/* Claims and runs tasks of generation g until none is left. */
static void run_tasks(tq_threads *t, uint32_t g, tq_task_fn fn, void *arg, int n_tasks, int self)
{
	for (;;) {
		uint64_t c = atomic_load_explicit(&t->claim, memory_order_acquire);
		if ((uint32_t)(c >> 32) != g || (int)(uint32_t)c >= n_tasks)
			return;
		if (!atomic_compare_exchange_weak_explicit(&t->claim, &c, c + 1,
							   memory_order_acq_rel, memory_order_acquire))
			continue;
		fn(arg, (int)(uint32_t)c, self);
		uint32_t d = atomic_fetch_add(&t->done, 1) + 1; /* seq_cst: pairs with caller_sleeps */
		if ((int)d == n_tasks && atomic_load(&t->caller_sleeps))
			futex_wake(&t->done, 1);
	}
}

static void *worker_main(void *p)
{
	struct worker_arg *wa = p;
	tq_threads *t = wa->t;
	int self = wa->index;
	uint32_t seen = 0;

	free(wa);
	for (;;) {
		uint32_t g;
		int spins = 0;
		while ((g = atomic_load_explicit(&t->gen, memory_order_acquire)) == seen) {
			if (++spins < SPIN_ITERS) {
				cpu_relax();
				continue;
			}
			atomic_fetch_add(&t->sleepers, 1);
			if (atomic_load(&t->gen) == seen)
				futex_wait(&t->gen, seen);
			atomic_fetch_sub(&t->sleepers, 1);
			spins = 0;
		}
		if (atomic_load_explicit(&t->stop, memory_order_acquire))
			return NULL;
		seen = g;
		/* fn/arg/n_tasks were published before gen (release/acquire);
		 * if a newer job replaced them meanwhile, its generation differs
		 * and run_tasks claims nothing with the stale copy. */
		tq_task_fn fn = atomic_load_explicit(&t->fn, memory_order_acquire);
		void *arg = atomic_load_explicit(&t->arg, memory_order_acquire);
		int n_tasks = atomic_load_explicit(&t->n_tasks, memory_order_acquire);
		uint64_t c = atomic_load_explicit(&t->claim, memory_order_acquire);
		if ((uint32_t)(c >> 32) == g)
			run_tasks(t, g, fn, arg, n_tasks, self);
	}
}

int tq_threads_new(tq_threads **out, int n_threads)
{
	tq_threads *t;
	int rc = 0;

	*out = NULL;
	if (n_threads < 1 || n_threads > TQ_THREADS_MAX)
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->n = n_threads;
	pthread_mutex_init(&t->run_lock, NULL);
	if (n_threads > 1) {
		t->tid = calloc((size_t)n_threads - 1, sizeof(*t->tid));
		if (!t->tid) {
			rc = -ENOMEM;
			goto fail;
		}
	}
	for (int i = 0; i < n_threads - 1; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));
		if (!wa) {
			rc = -ENOMEM;
			goto fail;
		}
		wa->t = t;
		wa->index = i + 1;
		int e = pthread_create(&t->tid[i], NULL, worker_main, wa);
		if (e) {
			free(wa);
			rc = -e;
			goto fail;
		}
		t->n_started++;
	}
	*out = t;
	return 0;
fail:
	tq_threads_free(t);
	return rc;
}

void tq_threads_free(tq_threads *t)
{
	if (!t)
		return;
	atomic_store(&t->stop, 1);
	atomic_fetch_add(&t->gen, 1);
	futex_wake(&t->gen, INT_MAX);
	for (int i = 0; i < t->n_started; i++)
		pthread_join(t->tid[i], NULL);
	pthread_mutex_destroy(&t->run_lock);
	free(t->tid);
	free(t);
}

int tq_threads_count(const tq_threads *t)
{
	return t ? t->n : 1;
}

int tq_threads_run(tq_threads *t, tq_task_fn fn, void *arg, int n_tasks)
{
	if (!fn || n_tasks < 0)
		return -EINVAL;
	if (n_tasks == 0)
		return 0;
	if (!t || t->n == 1 || n_tasks == 1) {
		for (int i = 0; i < n_tasks; i++)
			fn(arg, i, 0);
		return 0;
	}
	pthread_mutex_lock(&t->run_lock);
	uint32_t g = atomic_load_explicit(&t->gen, memory_order_relaxed) + 1;
	/* the last job's claims closed before its parameters change (above) */
	atomic_store(&t->claim, (uint64_t)g << 32 | (uint64_t)INT32_MAX); /* no task left */
	atomic_store_explicit(&t->fn, fn, memory_order_release);
	atomic_store_explicit(&t->arg, arg, memory_order_release);
	atomic_store_explicit(&t->n_tasks, n_tasks, memory_order_release);
	atomic_store_explicit(&t->done, 0, memory_order_relaxed);
	if (tq_threads_test_pause)
		tq_threads_test_pause();
	atomic_store_explicit(&t->claim, (uint64_t)g << 32, memory_order_release);
	atomic_store(&t->gen, g); /* seq_cst: pairs with the sleepers check */
	if (atomic_load(&t->sleepers) > 0)
		futex_wake(&t->gen, INT_MAX);

	run_tasks(t, g, fn, arg, n_tasks, 0);

	int spins = 0;
	uint32_t d;
	while ((int)(d = atomic_load_explicit(&t->done, memory_order_acquire)) < n_tasks) {
		if (++spins < SPIN_ITERS) {
			cpu_relax();
			continue;
		}
		atomic_store(&t->caller_sleeps, 1);
		d = atomic_load(&t->done);
		if ((int)d < n_tasks)
			futex_wait(&t->done, d);
		atomic_store(&t->caller_sleeps, 0);
		spins = 0;
	}
	pthread_mutex_unlock(&t->run_lock);
	return 0;
}
