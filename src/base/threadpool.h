/* threadpool.h — the compute pool: a fixed set of workers that run one
 * data-parallel job at a time (fork-join), used by the kernels inside an
 * engine step.
 *
 * tpool_run(tp, fn, ctx) calls fn(ctx, ith, nth) once for every ith in
 * [0, nth), nth = tpool_size(tp), in parallel; the calling thread runs
 * ith = 0 itself. It returns when every call has returned, so memory written
 * by the calls is visible to the caller afterwards. Only one thread may call
 * tpool_run or tpool_share on a pool at a time (the engine thread owns its
 * pool). Jobs must split work by output (rows, heads, tokens), never by a
 * reduction axis, so results do not depend on nth (batch invariance,
 * DESIGN.md).
 *
 * tpool_share(tp, fn, ctx) is the same for jobs whose calls take their work
 * from a counter in ctx until none is left, so that any subset of the calls
 * does all of it: the caller's call (ith 0) and those of the workers that
 * join before it returns. A worker that the kernel has not run since the
 * job began (the machine has more runnable threads than cores: HTTP
 * threads, the mover, a client) does not hold the job up; it finds the job
 * closed and waits for the next. The caller waits only for workers that
 * joined, each finishing the item it took. ith stays unique among the
 * calls of a job (per-thread scratch may be indexed by it).
 */
#ifndef MN_THREADPOOL_H
#define MN_THREADPOOL_H

typedef struct ThreadPool ThreadPool;
typedef void (*TpoolFn)(void *ctx, int ith, int nth);

/* For tests: called by worker ith when it has seen a shared job and is
 * about to join it (it may find the job closed after the call). */
typedef struct TpoolTestHooks {
    void (*before_join)(void *ctx, int ith);
    void *ctx;
} TpoolTestHooks;

/* A pool of n_threads (>= 1) including the caller; NULL on failure.
 * hooks may be NULL (the struct is copied). */
ThreadPool *tpool_new(int n_threads);
ThreadPool *tpool_new_hooked(int n_threads, const TpoolTestHooks *hooks);
void tpool_free(ThreadPool *tp);
int tpool_size(const ThreadPool *tp);
void tpool_run(ThreadPool *tp, TpoolFn fn, void *ctx);
void tpool_share(ThreadPool *tp, TpoolFn fn, void *ctx);

/* The half-open range [*lo, *hi) of n items that worker ith of nth takes,
 * rounded to multiples of `grain` (except the last). */
void tpool_split(long n, long grain, int ith, int nth, long *lo, long *hi);

#endif
