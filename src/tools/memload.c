/* memload.c — memory traffic on demand (see memload.h).
 *
 * Each thread owns two buffers and a byte counter; the only shared thing
 * is the stop pipe, whose write end closing makes its read end readable
 * for every thread at once. The caller's thread owns the MemLoad and
 * reads the counters after pthread_join.
 */
#include "tools/memload.h"

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/mem.h"

typedef struct LoadThread {
    pthread_t th;
    int stop_fd;     /* the pipe's read end: readable (closed) = stop */
    uint8_t *a, *b;  /* MEMLOAD_BYTES each */
    uint64_t copied; /* written by the thread, read after the join */
} LoadThread;

struct MemLoad {
    int n;
    int stop_pipe[2];
    double t0;
    LoadThread *threads;
};

static bool told_to_stop(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

/* Copies once before it looks at the pipe: a load stopped before its
 * threads were first scheduled (a short probe, a busy machine) still
 * copied and reports a rate, rather than 0. */
static void *load_main(void *arg) {
    LoadThread *t = arg;
    do {
        memcpy(t->b, t->a, MEMLOAD_BYTES);
        memcpy(t->a, t->b, MEMLOAD_BYTES);
        t->copied += 2ull * MEMLOAD_BYTES;
    } while (!told_to_stop(t->stop_fd));
    return NULL;
}

/* Join the n_started threads, free everything; bytes copied per second. */
static double load_end(MemLoad *l, int n_started) {
    if (l->stop_pipe[1] >= 0) close(l->stop_pipe[1]);
    uint64_t copied = 0;
    for (int i = 0; i < n_started; i++) {
        pthread_join(l->threads[i].th, NULL);
        copied += l->threads[i].copied;
    }
    double dt = mn_now() - l->t0;
    for (int i = 0; i < l->n; i++) {
        mn_free_aligned(l->threads[i].a);
        mn_free_aligned(l->threads[i].b);
    }
    if (l->stop_pipe[0] >= 0) close(l->stop_pipe[0]);
    mn_free(l->threads);
    mn_free(l);
    return dt > 0 ? (double)copied / dt : 0.0;
}

int memload_start(int n_threads, MemLoad **out, MnErr *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > MEMLOAD_MAX_THREADS)
        return mn_err_set(err, MN_EINVAL, "a memory load of %d threads (1..%d)", n_threads, MEMLOAD_MAX_THREADS);
    MemLoad *l = mn_calloc(1, sizeof *l);
    if (l == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory for the memory load");
    l->stop_pipe[0] = l->stop_pipe[1] = -1;
    l->threads = mn_calloc((size_t)n_threads, sizeof *l->threads);
    bool ok = l->threads != NULL && pipe(l->stop_pipe) == 0;
    if (!ok) l->stop_pipe[0] = l->stop_pipe[1] = -1;
    l->n = ok ? n_threads : 0;
    for (int i = 0; ok && i < n_threads; i++) {
        LoadThread *t = &l->threads[i];
        t->stop_fd = l->stop_pipe[0];
        t->a = mn_alloc_aligned(MEMLOAD_BYTES, 4096);
        t->b = mn_alloc_aligned(MEMLOAD_BYTES, 4096);
        ok = t->a != NULL && t->b != NULL;
        if (ok) { /* touched now, so the load is copying, not faulting */
            memset(t->a, i + 1, MEMLOAD_BYTES);
            memset(t->b, 0, MEMLOAD_BYTES);
        }
    }
    l->t0 = mn_now();
    int n_started = 0;
    while (ok && n_started < n_threads) {
        ok = pthread_create(&l->threads[n_started].th, NULL, load_main, &l->threads[n_started]) == 0;
        if (ok) n_started++;
    }
    if (!ok) {
        load_end(l, n_started);
        return mn_err_set(err, MN_ENOMEM, "cannot start a memory load of %d threads", n_threads);
    }
    *out = l;
    return MN_OK;
}

double memload_stop(MemLoad *l) { return l == NULL ? 0.0 : load_end(l, l->n); }
