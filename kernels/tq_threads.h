/* tq_threads.h — a small persistent thread pool, passed explicitly by the
 * caller (kernels/ keeps no global state).
 *
 * A pool of n threads = the calling thread + (n - 1) workers created by
 * tq_threads_new().  tq_threads_run() runs tasks 0..n_tasks-1 on the caller
 * and the workers and returns when all of them are done.  Idle workers spin
 * for a few tens of microseconds (so back-to-back calls, e.g. one per layer,
 * do not pay a wake-up) and then sleep on a futex.
 *
 * Thread safety: tq_threads_run() may be called from any thread; calls on one
 * pool are serialized (a second caller waits for the first job to finish), so
 * daemon workers that must not wait for each other should each own a pool.
 * A task must not call tq_threads_run() on its own pool (it would deadlock).
 */
#ifndef TQ_THREADS_H
#define TQ_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tq_threads tq_threads;

/* fn(arg, task, thread): task in [0, n_tasks), thread in [0, n_threads) —
 * 0 is the caller; each thread runs one task at a time, so per-thread
 * scratch indexed by `thread` needs no locking. */
typedef void (*tq_task_fn)(void *arg, int task, int thread);

#define TQ_THREADS_MAX 256

/* n_threads in [1, TQ_THREADS_MAX]: 0, -EINVAL, -ENOMEM or the error of
 * pthread_create (negated). */
int tq_threads_new(tq_threads **out, int n_threads);
/* Stops and joins the workers.  NULL is fine.  No run may be in flight. */
void tq_threads_free(tq_threads *t);
/* Threads of the pool, caller included; 1 for NULL. */
int tq_threads_count(const tq_threads *t);
/* Runs the tasks; t may be NULL (then everything runs on the caller as
 * thread 0).  Returns 0, or -EINVAL when n_tasks < 0 or fn is NULL. */
int tq_threads_run(tq_threads *t, tq_task_fn fn, void *arg, int n_tasks);

/* For tests: when set, tq_threads_run calls it after publishing a job and
 * before opening its tasks to the workers (a preemption there: the window
 * a worker late for the previous job must not slip through).  NULL by
 * default; set it only while no pool runs a job. */
extern void (*tq_threads_test_pause)(void);

#ifdef __cplusplus
}
#endif
#endif /* TQ_THREADS_H */
