/* threadpool.c — see threadpool.h.
 *
 * One 64-bit word, the gate, publishes each job: its generation in the high
 * 32 bits, whether the job is shared, whether a shared job is closed, and
 * how many workers are in it. The caller writes the job's fields, then a
 * new gate under the lock, and broadcasts; workers spin on the gate's
 * generation for a short while after a job (a decode step issues hundreds
 * of small jobs back to back, and a futex wake-up per job would cost more
 * than the job), then sleep on the condition variable. Spins yield the CPU
 * every TPOOL_YIELD_EVERY rounds.
 *
 * tpool_run: every worker runs the job and counts itself in n_done; the
 * caller spins until all have (so the job's fields stay put meanwhile).
 * tpool_share: a worker joins by adding one to the gate, which fails once
 * the generation moved on or the caller closed the job; only a worker that
 * joined reads the job's fields, and it leaves by taking its one back. The
 * caller closes the job when its own call returns (no work is left to
 * take) and spins until the workers in it have left.
 * The pool struct is owned by the thread that created it.
 */
#include "base/threadpool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

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

#define GATE_SHARED (UINT64_C(1) << 31)
#define GATE_CLOSED (UINT64_C(1) << 30)
#define GATE_JOINED (GATE_CLOSED - 1)
#define GATE_GEN(g) ((uint32_t)((g) >> 32))

struct ThreadPool {
    int n_threads;
    pthread_t *workers; /* (n_threads - 1) */
    int n_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    _Atomic uint64_t gate; /* generation | GATE_SHARED | GATE_CLOSED | workers joined */
    atomic_int n_done;     /* workers finished with the current tpool_run job */
    atomic_bool is_stopping;
    TpoolFn fn;
    void *ctx;
    TpoolTestHooks hooks;
};

typedef struct {
    ThreadPool *tp;
    int ith;
} WorkerArg;

/* The gate once its generation is not `seen`: spinning a while, then asleep. */
static uint64_t wait_next_job(ThreadPool *tp, uint32_t seen) {
    uint64_t g;
    for (int spins = 1; spins <= TPOOL_SPIN_ITERS; spins++) {
        g = atomic_load_explicit(&tp->gate, memory_order_acquire);
        if (GATE_GEN(g) != seen) return g;
        CPU_RELAX();
        if (spins % TPOOL_YIELD_EVERY == 0) sched_yield();
    }
    pthread_mutex_lock(&tp->lock);
    while (GATE_GEN(g = atomic_load_explicit(&tp->gate, memory_order_acquire)) == seen)
        pthread_cond_wait(&tp->wake, &tp->lock);
    pthread_mutex_unlock(&tp->lock);
    return g;
}

/* Count the calling worker into shared job `gen`, unless it is over. */
static bool join_shared(ThreadPool *tp, uint32_t gen) {
    uint64_t g = atomic_load_explicit(&tp->gate, memory_order_relaxed);
    do {
        if (GATE_GEN(g) != gen || (g & GATE_CLOSED)) return false;
    } while (!atomic_compare_exchange_weak_explicit(&tp->gate, &g, g + 1, memory_order_acquire,
                                                    memory_order_relaxed));
    return true;
}

static void *worker_main(void *arg_) {
    WorkerArg *arg = arg_;
    ThreadPool *tp = arg->tp;
    int ith = arg->ith;
    mn_free(arg);
    uint32_t seen = 0;
    for (;;) {
        uint64_t g = wait_next_job(tp, seen);
        seen = GATE_GEN(g);
        if (atomic_load_explicit(&tp->is_stopping, memory_order_acquire)) return NULL;
        if (!(g & GATE_SHARED)) {
            tp->fn(tp->ctx, ith, tp->n_threads);
            atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
            continue;
        }
        if (tp->hooks.before_join) tp->hooks.before_join(tp->hooks.ctx, ith);
        if (!join_shared(tp, seen)) continue;
        tp->fn(tp->ctx, ith, tp->n_threads);
        atomic_fetch_sub_explicit(&tp->gate, 1, memory_order_release);
    }
}

ThreadPool *tpool_new_hooked(int n_threads, const TpoolTestHooks *hooks) {
    if (n_threads < 1) return NULL;
    ThreadPool *tp = mn_calloc(1, sizeof *tp);
    if (tp == NULL) return NULL;
    tp->n_threads = n_threads;
    if (hooks != NULL) tp->hooks = *hooks;
    pthread_mutex_init(&tp->lock, NULL);
    pthread_cond_init(&tp->wake, NULL);
    atomic_init(&tp->gate, 0);
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

ThreadPool *tpool_new(int n_threads) { return tpool_new_hooked(n_threads, NULL); }

/* A new generation with `flags`, woken. The job's fields are written. */
static void publish(ThreadPool *tp, uint64_t flags) {
    pthread_mutex_lock(&tp->lock);
    uint64_t g = atomic_load_explicit(&tp->gate, memory_order_relaxed);
    assert((g & GATE_JOINED) == 0);
    atomic_store_explicit(&tp->gate, ((uint64_t)(GATE_GEN(g) + 1u) << 32) | flags, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->lock);
}

void tpool_free(ThreadPool *tp) {
    if (tp == NULL) return;
    atomic_store_explicit(&tp->is_stopping, true, memory_order_release);
    publish(tp, 0);
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i], NULL);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->lock);
    mn_free(tp->workers);
    mn_free(tp);
}

int tpool_size(const ThreadPool *tp) { return tp->n_threads; }

/* Whether the caller may return from its job: every worker has run it,
 * or every worker that joined the shared job has left it. */
static bool is_job_over(ThreadPool *tp, bool is_shared) {
    if (is_shared) return (atomic_load_explicit(&tp->gate, memory_order_acquire) & GATE_JOINED) == 0;
    return atomic_load_explicit(&tp->n_done, memory_order_acquire) == tp->n_threads - 1;
}

/* The caller's side of a job: publish it, run ith 0, close it if shared,
 * and spin until it is over. */
static void run_job(ThreadPool *tp, TpoolFn fn, void *ctx, bool is_shared) {
    assert(tp != NULL && fn != NULL);
    if (tp->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    publish(tp, is_shared ? GATE_SHARED : 0);
    fn(ctx, 0, tp->n_threads);
    if (is_shared) atomic_fetch_or_explicit(&tp->gate, GATE_CLOSED, memory_order_relaxed);
    for (int spins = 1; !is_job_over(tp, is_shared); spins++) {
        CPU_RELAX();
        if (spins % TPOOL_YIELD_EVERY == 0) sched_yield();
    }
}

void tpool_run(ThreadPool *tp, TpoolFn fn, void *ctx) { run_job(tp, fn, ctx, false); }

void tpool_share(ThreadPool *tp, TpoolFn fn, void *ctx) { run_job(tp, fn, ctx, true); }

void tpool_split(long n, long grain, int ith, int nth, long *lo, long *hi) {
    if (grain < 1) grain = 1;
    long n_chunks = (n + grain - 1) / grain;
    long per = n_chunks / nth, extra = n_chunks % nth;
    long c0 = ith * per + (ith < extra ? ith : extra);
    long c1 = c0 + per + (ith < extra ? 1 : 0);
    *lo = c0 * grain < n ? c0 * grain : n;
    *hi = c1 * grain < n ? c1 * grain : n;
}
