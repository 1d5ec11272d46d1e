/* threadpool.c — see threadpool.h.
 *
 * Each job is published by bumping `generation` under the lock and
 * broadcasting; workers spin on the generation for a short while after a
 * job (a decode step issues hundreds of small jobs back to back, and a futex
 * wake-up per job would cost more than the job), then sleep on the condition
 * variable. Completion is a count of finished workers the caller spins on.
 * Both spins yield the CPU every TPOOL_YIELD_EVERY rounds.
 * The pool struct is owned by the thread that created it; workers only read
 * the job fields after seeing a new generation, and write `n_done`.
 */
#include "base/threadpool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/mem.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spinning yields the CPU now and then: when the machine has more runnable
 * threads than cores (several servers, tests in parallel), a spinner that
 * never yields can keep the very worker it waits for off the CPU. */
enum { TPOOL_SPIN_ITERS = 200000, TPOOL_YIELD_EVERY = 1024 };

struct ThreadPool {
    int n_threads;
    pthread_t *workers; /* (n_threads - 1) */
    int n_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation; /* bumped once per job; odd values never special */
    atomic_int n_done;      /* workers finished with the current job */
    atomic_bool is_stopping;
    TpoolFn fn;
    void *ctx;
};

typedef struct {
    ThreadPool *tp;
    int ith;
} WorkerArg;

static void *worker_main(void *arg_) {
    WorkerArg *arg = arg_;
    ThreadPool *tp = arg->tp;
    int ith = arg->ith;
    mn_free(arg);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               spins < TPOOL_SPIN_ITERS) {
            CPU_RELAX();
            if (++spins % TPOOL_YIELD_EVERY == 0) sched_yield();
        }
        if (gen == seen) {
            pthread_mutex_lock(&tp->lock);
            while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&tp->wake, &tp->lock);
            pthread_mutex_unlock(&tp->lock);
        }
        seen = gen;
        if (atomic_load_explicit(&tp->is_stopping, memory_order_acquire)) return NULL;
        tp->fn(tp->ctx, ith, tp->n_threads);
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    }
}

ThreadPool *tpool_new(int n_threads) {
    if (n_threads < 1) return NULL;
    ThreadPool *tp = mn_calloc(1, sizeof *tp);
    if (tp == NULL) return NULL;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->lock, NULL);
    pthread_cond_init(&tp->wake, NULL);
    atomic_init(&tp->generation, 0);
    atomic_init(&tp->n_done, 0);
    atomic_init(&tp->is_stopping, false);
    tp->workers = mn_calloc((size_t)n_threads, sizeof *tp->workers);
    if (tp->workers == NULL) goto fail;
    for (int i = 1; i < n_threads; i++) {
        WorkerArg *arg = mn_malloc(sizeof *arg);
        if (arg == NULL) goto fail;
        arg->tp = tp;
        arg->ith = i;
        if (pthread_create(&tp->workers[i - 1], NULL, worker_main, arg) != 0) {
            mn_free(arg);
            goto fail;
        }
        tp->n_started++;
    }
    return tp;
fail:
    tpool_free(tp);
    return NULL;
}

void tpool_free(ThreadPool *tp) {
    if (tp == NULL) return;
    pthread_mutex_lock(&tp->lock);
    atomic_store_explicit(&tp->is_stopping, true, memory_order_release);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->lock);
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i], NULL);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->lock);
    mn_free(tp->workers);
    mn_free(tp);
}

int tpool_size(const ThreadPool *tp) { return tp->n_threads; }

void tpool_run(ThreadPool *tp, TpoolFn fn, void *ctx) {
    assert(tp != NULL && fn != NULL);
    if (tp->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&tp->lock);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->lock);
    fn(ctx, 0, tp->n_threads);
    for (int spins = 1; atomic_load_explicit(&tp->n_done, memory_order_acquire) != tp->n_threads - 1; spins++) {
        CPU_RELAX();
        if (spins % TPOOL_YIELD_EVERY == 0) sched_yield();
    }
}

void tpool_split(long n, long grain, int ith, int nth, long *lo, long *hi) {
    if (grain < 1) grain = 1;
    long n_chunks = (n + grain - 1) / grain;
    long per = n_chunks / nth, extra = n_chunks % nth;
    long c0 = ith * per + (ith < extra ? ith : extra);
    long c1 = c0 + per + (ith < extra ? 1 : 0);
    *lo = c0 * grain < n ? c0 * grain : n;
    *hi = c1 * grain < n ? c1 * grain : n;
}
