/* threadpool.h — the compute pool: a fixed set of workers that run one
 * data-parallel job at a time (fork-join), used by the kernels inside an
 * engine step.
 *
 * tpool_run(tp, fn, ctx) calls fn(ctx, ith, nth) once for every ith in
 * [0, nth), nth = tpool_size(tp), in parallel; the calling thread runs
 * ith = 0 itself. It returns when every call has returned, so memory written
 * by the calls is visible to the caller afterwards. Only one thread may call
 * tpool_run on a pool at a time (the engine thread owns its pool). Jobs must
 * split work by output (rows, heads, tokens), never by a reduction axis, so
 * results do not depend on nth (batch invariance, DESIGN.md).
 */
#ifndef MN_THREADPOOL_H
#define MN_THREADPOOL_H

typedef struct ThreadPool ThreadPool;
typedef void (*TpoolFn)(void *ctx, int ith, int nth);

/* A pool of n_threads (>= 1) including the caller; NULL on failure. */
ThreadPool *tpool_new(int n_threads);
void tpool_free(ThreadPool *tp);
int tpool_size(const ThreadPool *tp);
void tpool_run(ThreadPool *tp, TpoolFn fn, void *ctx);

/* The half-open range [*lo, *hi) of n items that worker ith of nth takes,
 * rounded to multiples of `grain` (except the last). */
void tpool_split(long n, long grain, int ith, int nth, long *lo, long *hi);

#endif
