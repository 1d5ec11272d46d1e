/* test_mover.c — the mover thread (cache/mover.h) and the restore paths
 * under the engine: saves and layer-by-layer loads through the RAM and disk
 * tiers, the order of events, reads served before writes, a failed load,
 * and the mixed restore — leading blocks recomputed, the middle loaded from
 * disk while the forward pass waits per layer, the tail in the pool — whose
 * logits must be bit-identical to a full recompute. */
#include "test_util.h"
#include "test_tier_util.h"

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/sched.h"
#include "cache/index.h"
#include "cache/mover.h"
#include "engine/forward.h"
#include "engine/runner.h"
#include "model/model.h"

/* ---- an event sink ------------------------------------------------------------ */

typedef struct Sink {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int layers;            /* LAYER events of the current load */
    MoverJob *lj[16];      /* loads seen, and each one's LAYER events */
    int lj_layers[16], n_lj;
    MoverJob *done[16];    /* DONE jobs in order */
    int done_dropped[16];  /* n_dropped when each DONE came */
    int n_done;
    int n_dropped;         /* blocks reported dropped */
    bool is_holding;       /* the mover waits in the first DONE until released */
    uint64_t mover_slice;  /* the slice of the thread the last event came on */
} Sink;

static void on_event(void *ctx, MoverEvent *ev) {
    Sink *s = ctx;
    uint64_t slice = mn_thread_slice();
    pthread_mutex_lock(&s->lock);
    s->mover_slice = slice;
    if (ev->kind == MOVER_EV_LAYER) {
        int i = 0;
        while (i < s->n_lj && s->lj[i] != ev->job) i++;
        if (i == s->n_lj) {
            assert_true(s->n_lj < 16);
            s->lj[s->n_lj] = ev->job;
            s->lj_layers[s->n_lj++] = 0;
        }
        assert_int_equal(ev->layer, s->lj_layers[i]); /* each load's in order, none skipped */
        s->lj_layers[i] = ev->layer + 1;
        s->layers++;
    } else if (ev->kind == MOVER_EV_DONE) {
        if (s->n_done < 16) {
            s->done_dropped[s->n_done] = s->n_dropped;
            s->done[s->n_done++] = ev->job;
        }
        pthread_cond_broadcast(&s->cond);
        while (s->is_holding) pthread_cond_wait(&s->cond, &s->lock); /* the mover thread waits here */
    } else {
        s->n_dropped += ev->n;
        mover_event_free(ev);
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void sink_init(Sink *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
}

/* Wait until n jobs are done, a minute at most; whether they are. */
static bool sink_done_within_a_minute(Sink *s, int n) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    while (s->n_done < n && rc == 0) rc = pthread_cond_timedwait(&s->cond, &s->lock, &until);
    bool is_done = s->n_done >= n;
    pthread_mutex_unlock(&s->lock);
    return is_done;
}

/* Wait until n jobs are done: a job that never ends fails the test after
 * a minute instead of hanging the run. */
static void sink_wait_done(Sink *s, int n) {
    if (!sink_done_within_a_minute(s, n)) fail_msg("%d of %d jobs done after a minute", s->n_done, n);
}

/* Let the mover out of the DONE it is held in (is_holding). */
static void sink_release(Sink *s) {
    pthread_mutex_lock(&s->lock);
    s->is_holding = false;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void sink_free(Sink *s) {
    for (int i = 0; i < s->n_done; i++) mover_job_free(s->done[i]);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
}

/* A mover with only a 16 MiB disk tier in dir, reporting to sink. */
static Mover *disk_mover(KvPool *p, const char *dir, Sink *sink) {
    MoverConfig mc = {.pool = p, .disk_dir = dir, .disk_bytes = 16 << 20, .on_event = on_event, .event_ctx = sink};
    Mover *m;
    MnErr err = {0};
    if (mover_new(&mc, &m, &err) != MN_OK) fail_msg("mover_new: %s", err.msg);
    return m;
}

static Hash128 block_hash(int i) {
    Hash128 h;
    memset(&h, 0, sizeof h);
    h.b[0] = (uint8_t)(i + 1);
    h.b[15] = 0x5a;
    return h;
}

static MoverJob *save_job(int first, int n) {
    MoverJob *j = mover_job_new(MOVER_SAVE, n, 0);
    for (int i = 0; i < n; i++) {
        j->hashes[i] = block_hash(first + i);
        j->slots[i] = first + i;
    }
    return j;
}

static MoverJob *load_job(int first, int n, int to_slot, int tier, int n_layer) {
    MoverJob *j = mover_job_new(MOVER_LOAD, n, n_layer);
    for (int i = 0; i < n; i++) {
        j->hashes[i] = block_hash(first + i);
        j->slots[i] = to_slot + i;
        j->tier[i] = (uint8_t)tier;
    }
    return j;
}

/* ---- saves, loads, events ------------------------------------------------------- */

/* Runs saved to RAM and disk come back bit for bit from each, with one
 * LAYER event per layer in order before DONE. */
static void test_save_load_roundtrip(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 32, 8, 32, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 8; s++) fill_slot(&p, s, (uint32_t)s);
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    sink_init(&sink);
    MoverConfig mc = {.pool = &p, .ram_bytes = 1 << 20, .disk_dir = dir, .disk_bytes = 16 << 20, .is_durable = true,
                      .on_event = on_event, .event_ctx = &sink};
    Mover *m;
    MnErr err = {0};
    assert_int_equal(mover_new(&mc, &m, &err), MN_OK);
    assert_int_equal(mover_n_tiers(m), 2);
    assert_string_equal(mover_tier_name(m, 0), "ram");
    assert_string_equal(mover_tier_name(m, 1), "disk");
    assert_int_equal(mover_submit(m, save_job(0, 8)), MN_OK);
    sink_wait_done(&sink, 1);
    assert_int_equal(sink.done[0]->rc, MN_OK);
    assert_int_equal(sink.done[0]->saved_tiers, 3u);
    for (int tier = 0; tier < 2; tier++) {
        sink.layers = 0;
        assert_int_equal(mover_submit(m, load_job(0, 8, 16, tier, 3)), MN_OK);
        sink_wait_done(&sink, 2 + tier);
        MoverJob *j = sink.done[1 + tier];
        assert_int_equal(j->rc, MN_OK);
        assert_int_equal(sink.layers, 3);
        for (int l = 0; l < 3; l++)
            for (int s = 0; s < 8; s++)
                assert_memory_equal(kvpool_k(&p, l, 16 + s), kvpool_k(&p, l, s), p.block_bytes);
        for (int s = 16; s < 24; s++) memset(kvpool_k(&p, 0, s), 0, p.block_bytes);
    }
    MoverTierStats st;
    mover_stats(m, 1, &st);
    assert_true(st.tier.bytes_read > 0 && st.tier.bytes_written > 0);
    assert_int_equal(st.reads.n, 1); /* one streamed read of every layer */
    assert_int_equal(st.tier.n_layer_reads, 3);
    assert_int_equal(st.writes.n, 1);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* On a thread of its own: *arg = whether a 250 us slice is taken and kept. */
static void *try_slice(void *arg) {
    bool *ok = arg;
    *ok = mn_thread_set_slice(250000) == MN_OK && mn_thread_slice() == 250000;
    return NULL;
}

/* Whether this kernel takes and keeps a slice (EEVDF, 6.12+; a seccomp
 * filter may refuse the call), tried on a thread of its own. */
static bool kernel_keeps_slices(void) {
    bool ok = false;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, try_slice, &ok), 0);
    pthread_join(th, NULL);
    return ok;
}

/* The mover thread runs with its short slice (base/sched.h), so a wake-up
 * in a streamed restore waits less for a core; the thread that made the
 * mover keeps its own. The hint keeps the thread's nice value. */
static void test_mover_slice(void **state) {
    if (!kernel_keeps_slices()) skip();
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 32, 8, 8, MN_TYPE_F16), MN_OK);
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    sink_init(&sink);
    uint64_t own = mn_thread_slice();
    Mover *m = disk_mover(&p, dir, &sink);
    assert_int_equal(mover_submit(m, save_job(0, 2)), MN_OK);
    sink_wait_done(&sink, 1);
    assert_true(sink.mover_slice == MOVER_SLICE_NS);
    assert_true(mn_thread_slice() == own);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* On a thread of its own: rc[0..1] the refused slices, rc[2] raising nice
 * to rc[6], rc[3] a valid slice, rc[4] the nice value after it, rc[5] the
 * slice then (us). */
static void *slice_in_thread(void *arg) {
    int *rc = arg;
    rc[0] = mn_thread_set_slice(MN_SLICE_MIN_NS - 1);
    rc[1] = mn_thread_set_slice(MN_SLICE_MAX_NS + 1);
    rc[6] = getpriority(PRIO_PROCESS, 0) < 19 ? getpriority(PRIO_PROCESS, 0) + 1 : 19;
    rc[2] = setpriority(PRIO_PROCESS, 0, rc[6]); /* raising nice needs no privilege */
    rc[3] = mn_thread_set_slice(250000);
    rc[4] = getpriority(PRIO_PROCESS, 0);
    rc[5] = (int)(mn_thread_slice() / 1000);
    return NULL;
}

/* The hint itself: out-of-range slices are refused; a valid one is taken
 * and leaves the thread's nice value as it was. */
static void test_thread_slice(void **state) {
    int rc[7];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slice_in_thread, rc), 0);
    pthread_join(th, NULL);
    assert_int_equal(rc[0], MN_EINVAL);
    assert_int_equal(rc[1], MN_EINVAL);
    assert_int_equal(rc[2], 0);
    assert_int_equal(rc[4], rc[6]); /* kept, whether or not the kernel took the hint */
    if (!kernel_keeps_slices()) skip();
    assert_int_equal(rc[3], MN_OK);
    assert_int_equal(rc[5], 250);
}

/* On a thread of its own: each call's result and the nice value after it. */
static void *nice_in_thread(void *arg) {
    int *rc = arg;
    rc[0] = getpriority(PRIO_PROCESS, 0);
    rc[1] = mn_thread_nice_add(-1);
    rc[2] = mn_thread_nice_add(20);
    rc[3] = mn_thread_nice_add(2);
    rc[4] = getpriority(PRIO_PROCESS, 0);
    rc[5] = mn_thread_nice_add(0);
    rc[6] = getpriority(PRIO_PROCESS, 0);
    rc[7] = mn_thread_nice_add(19);
    rc[8] = getpriority(PRIO_PROCESS, 0);
    return NULL;
}

/* Lowering a thread's priority: by the increment, capped at 19, on the
 * calling thread only; increments outside [0, 19] are refused. */
static void test_thread_nice(void **state) {
    int own = getpriority(PRIO_PROCESS, 0), rc[9];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, nice_in_thread, rc), 0);
    pthread_join(th, NULL);
    assert_int_equal(rc[0], own);
    assert_int_equal(rc[1], MN_EINVAL);
    assert_int_equal(rc[2], MN_EINVAL);
    assert_int_equal(rc[3], MN_OK);
    assert_int_equal(rc[4], own + 2 > 19 ? 19 : own + 2);
    assert_int_equal(rc[5], MN_OK);
    assert_int_equal(rc[6], rc[4]);
    assert_int_equal(rc[7], MN_OK);
    assert_int_equal(rc[8], 19);
    assert_int_equal(getpriority(PRIO_PROCESS, 0), own);
}

/* A load queued behind saves runs before all of them (the mover is held in
 * the first job's DONE while the others are queued); a load of a block no
 * tier holds fails with MN_ENOTFOUND and no LAYER event. */
static void test_reads_before_writes(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 64, 8, 64, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 32; s++) fill_slot(&p, s, (uint32_t)s);
    Sink sink;
    sink_init(&sink);
    MoverConfig mc = {.pool = &p, .ram_bytes = 4 << 20, .on_event = on_event, .event_ctx = &sink};
    Mover *m;
    MnErr err = {0};
    assert_int_equal(mover_new(&mc, &m, &err), MN_OK);
    sink.is_holding = true;
    assert_int_equal(mover_submit(m, save_job(0, 4)), MN_OK);
    sink_wait_done(&sink, 1);
    for (int k = 0; k < 4; k++) assert_int_equal(mover_submit(m, save_job(4 + 4 * k, 4)), MN_OK);
    MoverJob *ld = load_job(0, 4, 40, 0, 2);
    ld->id = 99;
    assert_int_equal(mover_submit(m, ld), MN_OK);
    sink_release(&sink);
    sink_wait_done(&sink, 6);
    assert_int_equal(sink.done[1]->id, 99); /* before every save queued ahead of it */
    assert_int_equal(sink.done[1]->rc, MN_OK);
    sink.layers = 0;
    assert_int_equal(mover_submit(m, load_job(50, 2, 44, 0, 2)), MN_OK);
    sink_wait_done(&sink, 7);
    assert_int_equal(sink.done[6]->rc, MN_ENOTFOUND);
    assert_int_equal(sink.done[6]->failed_tier, 0);
    assert_int_equal(sink.layers, 0);
    /* a load naming a tier the chain lacks fails alone, in the same batch
     * as a sound one (the mover held in a DONE while both queue) */
    sink.is_holding = true;
    assert_int_equal(mover_submit(m, save_job(0, 1)), MN_OK);
    sink_wait_done(&sink, 8);
    MoverJob *bad = load_job(0, 2, 48, 3, 2), *good = load_job(0, 4, 52, 0, 2);
    bad->id = 7;
    good->id = 8;
    assert_int_equal(mover_submit(m, bad), MN_OK);
    assert_int_equal(mover_submit(m, good), MN_OK);
    sink.layers = 0;
    sink_release(&sink);
    sink_wait_done(&sink, 10);
    for (int i = 8; i < 10; i++) {
        MoverJob *j = sink.done[i];
        assert_int_equal(j->rc, j->id == 7 ? MN_EINVAL : MN_OK);
        if (j->id == 7) assert_int_equal(j->failed_tier, -1);
    }
    assert_int_equal(sink.layers, 2); /* the sound load's layers only */
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 4; k++) assert_memory_equal(kvpool_k(&p, l, 52 + k), kvpool_k(&p, l, k), p.block_bytes);
    mover_free(m);
    sink_free(&sink);
    kvpool_deinit(&p);
}

/* The mover hands --evict and the look-ahead window (a WINDOW job) to its
 * tiers: with room for two runs, a third evicts the run outside the window,
 * though pensieve alone would take the window's cheaper leading run. */
/* A mover over a RAM tier with room for two and a half runs of 4 blocks
 * (slots 0..11 filled), evicting by evict. */
static Mover *two_run_mover(KvPool *p, Sink *sink, EvictPolicy evict) {
    assert_int_equal(kvpool_init(p, 2, 64, 8, 64, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 12; s++) fill_slot(p, s, (uint32_t)s);
    sink_init(sink);
    uint64_t run = 4 * (uint64_t)p->block_bytes * (uint64_t)p->n_layer;
    MoverConfig mc = {.pool = p, .ram_bytes = 2 * run + run / 2, .on_event = on_event, .event_ctx = sink,
                      .evict = evict};
    Mover *m;
    MnErr err = {0};
    assert_int_equal(mover_new(&mc, &m, &err), MN_OK);
    return m;
}

/* After four jobs: run A (blocks 0..3) is still held, run B (4..7) went. */
static void expect_a_kept_b_gone(Mover *m, Sink *sink) {
    sink_wait_done(sink, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(sink->done[i]->rc, MN_OK);
    assert_int_equal(sink->n_dropped, 4);
    assert_int_equal(mover_submit(m, load_job(0, 4, 20, 0, 2)), MN_OK);
    sink_wait_done(sink, 5);
    assert_int_equal(sink->done[4]->rc, MN_OK);
    assert_int_equal(mover_submit(m, load_job(4, 4, 24, 0, 2)), MN_OK);
    sink_wait_done(sink, 6);
    assert_int_equal(sink->done[5]->rc, MN_ENOTFOUND);
}

static void test_window_reaches_tiers(void **state) {
    KvPool p;
    Sink sink;
    Mover *m = two_run_mover(&p, &sink, EVICT_PENSIEVE_LOOKAHEAD);
    MoverJob *a = save_job(0, 4), *b = save_job(4, 4), *c = save_job(8, 4);
    a->pos = 0; /* leading: the cheapest */
    b->pos = 32;
    c->pos = 64;
    assert_int_equal(mover_submit(m, a), MN_OK);
    assert_int_equal(mover_submit(m, b), MN_OK);
    MoverJob *w = mover_job_new(MOVER_WINDOW, 1, 0);
    w->hashes[0] = block_hash(2); /* a block of A: the request at the window's head */
    w->slots[0] = 0;
    assert_int_equal(mover_submit(m, w), MN_OK);
    assert_int_equal(mover_submit(m, c), MN_OK);
    expect_a_kept_b_gone(m, &sink);
    mover_free(m);
    sink_free(&sink);
    kvpool_deinit(&p);
}

/* A finished turn (a CONV job, here without a session id) makes the tier
 * runs holding its blocks used now: lru then takes the other run. Without
 * it, the older run A would go. */
static void test_conv_touches_tiers(void **state) {
    KvPool p;
    Sink sink;
    Mover *m = two_run_mover(&p, &sink, EVICT_LRU);
    assert_int_equal(mover_submit(m, save_job(0, 4)), MN_OK); /* A */
    assert_int_equal(mover_submit(m, save_job(4, 4)), MN_OK); /* B */
    MoverJob *t = mover_job_new(MOVER_CONV, 2, 0);
    t->hashes[0] = block_hash(1); /* A's blocks, as a turn that found them in the pool */
    t->hashes[1] = block_hash(3);
    t->when = mn_wall_now() + 10;
    assert_int_equal(mover_submit(m, t), MN_OK);
    assert_int_equal(mover_submit(m, save_job(8, 4)), MN_OK); /* C evicts B */
    expect_a_kept_b_gone(m, &sink);
    mover_free(m);
    sink_free(&sink);
    kvpool_deinit(&p);
}

/* Loads queued together are read together: three loads from the disk
 * tier, queued while the mover is held, come back bit for bit, each with
 * its own LAYER events in order, in one streamed read of the tier; a load
 * naming a block the tier does not hold fails alone (MN_ENOTFOUND, no
 * LAYER event), and the load batched with it is still read. */
static void test_loads_batched(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 32, 8, 64, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 12; s++) fill_slot(&p, s, (uint32_t)s);
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    sink_init(&sink);
    Mover *m = disk_mover(&p, dir, &sink);
    for (int k = 0; k < 3; k++) assert_int_equal(mover_submit(m, save_job(4 * k, 4)), MN_OK);
    sink_wait_done(&sink, 3);
    sink.is_holding = true;
    assert_int_equal(mover_submit(m, save_job(0, 4)), MN_OK); /* the mover waits in its DONE */
    sink_wait_done(&sink, 4);
    for (int k = 0; k < 3; k++) assert_int_equal(mover_submit(m, load_job(4 * k, 4, 20 + 4 * k, 0, 3)), MN_OK);
    sink_release(&sink);
    sink_wait_done(&sink, 7);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(sink.done[4 + k]->rc, MN_OK);
        assert_int_equal(sink.lj_layers[k], 3);
    }
    assert_int_equal(sink.n_lj, 3);
    for (int l = 0; l < 3; l++)
        for (int s = 0; s < 12; s++) assert_memory_equal(kvpool_k(&p, l, 20 + s), kvpool_k(&p, l, s), p.block_bytes);
    MoverTierStats st;
    mover_stats(m, 0, &st);
    assert_int_equal(st.reads.n, 1);
    assert_int_equal(st.tier.n_layer_reads, 3);

    sink.is_holding = true;
    assert_int_equal(mover_submit(m, save_job(4, 4)), MN_OK);
    sink_wait_done(&sink, 8);
    assert_int_equal(mover_submit(m, load_job(0, 4, 40, 0, 3)), MN_OK);
    assert_int_equal(mover_submit(m, load_job(30, 2, 44, 0, 3)), MN_OK); /* never saved */
    sink_release(&sink);
    sink_wait_done(&sink, 10);
    assert_int_equal(sink.done[8]->rc, MN_OK); /* read, though its batch mate fails */
    for (int l = 0; l < 3; l++)
        for (int s = 0; s < 4; s++) assert_memory_equal(kvpool_k(&p, l, 40 + s), kvpool_k(&p, l, s), p.block_bytes);
    assert_int_equal(sink.done[9]->rc, MN_ENOTFOUND);
    assert_int_equal(sink.done[9]->failed_tier, 0);
    assert_int_equal(sink.lj_layers[3], 3); /* the sound job's LAYER events; none for the other */
    assert_int_equal(sink.n_lj, 4);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* A damaged disk extent: the load fails with MN_ECHECKSUM before that
 * layer's event, and the run is reported dropped. */
static void test_load_checksum_failure(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 32, 8, 32, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 4; s++) fill_slot(&p, s, (uint32_t)s);
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    sink_init(&sink);
    Mover *m = disk_mover(&p, dir, &sink);
    assert_int_equal(mover_submit(m, save_job(0, 4)), MN_OK);
    sink_wait_done(&sink, 1);
    /* damage layer 1's extent: layer 0 still arrives */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "dd if=/dev/urandom of=%s/slab-00000.dat bs=4096 seek=2 count=1 conv=notrunc status=none", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mover_submit(m, load_job(0, 4, 8, 0, 3)), MN_OK);
    sink_wait_done(&sink, 2);
    assert_int_equal(sink.done[1]->rc, MN_ECHECKSUM);
    assert_int_equal(sink.layers, 1);
    assert_int_equal(sink.n_dropped, 4);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* ---- promotes -------------------------------------------------------------------- */

/* A mover with a RAM tier of ram_bytes under evict over a 16 MiB disk
 * tier in dir, reporting to sink (initialized here). */
static Mover *ram_disk_mover_of(KvPool *p, const char *dir, Sink *sink, uint64_t ram_bytes, EvictPolicy evict) {
    sink_init(sink);
    MoverConfig mc = {.pool = p, .ram_bytes = ram_bytes, .disk_dir = dir, .disk_bytes = 16 << 20,
                      .on_event = on_event, .event_ctx = sink, .evict = evict};
    Mover *m;
    MnErr err = {0};
    if (mover_new(&mc, &m, &err) != MN_OK) fail_msg("mover_new: %s", err.msg);
    return m;
}

/* A RAM tier with room for two and a half runs of 4 blocks over a disk
 * tier in dir (slots 0..11 filled), lru; runs A (0..3), B (4..7) and C
 * (8..11) saved, so RAM holds B and C and only the disk holds A. */
static Mover *ram_disk_mover(KvPool *p, const char *dir, Sink *sink) {
    assert_int_equal(kvpool_init(p, 2, 64, 8, 64, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 12; s++) fill_slot(p, s, (uint32_t)s);
    uint64_t run = 4 * (uint64_t)p->block_bytes * (uint64_t)p->n_layer;
    Mover *m = ram_disk_mover_of(p, dir, sink, 2 * run + run / 2, EVICT_LRU);
    for (int k = 0; k < 3; k++) assert_int_equal(mover_submit(m, save_job(4 * k, 4)), MN_OK);
    sink_wait_done(sink, 3);
    for (int k = 0; k < 3; k++) assert_int_equal(sink->done[k]->saved_tiers, 3u);
    assert_int_equal(sink->n_dropped, 4); /* A, from RAM */
    return m;
}

static MoverJob *promote_job(int first, int n, int from_tier) {
    MoverJob *j = mover_job_new(MOVER_PROMOTE, n, 0);
    for (int i = 0; i < n; i++) {
        j->hashes[i] = block_hash(first + i);
        j->tier[i] = (uint8_t)from_tier;
    }
    j->pos = first * 8;
    return j;
}

/* Load blocks first..first+n-1 from tier into slots to.., which must then
 * equal slots first.. bit for bit; returns the load's rc. */
static int load_and_compare(Mover *m, Sink *sink, KvPool *p, int first, int n, int to, int tier) {
    int n_done = sink->n_done;
    assert_int_equal(mover_submit(m, load_job(first, n, to, tier, p->n_layer)), MN_OK);
    sink_wait_done(sink, n_done + 1);
    int rc = sink->done[n_done]->rc;
    for (int l = 0; rc == MN_OK && l < p->n_layer; l++)
        for (int k = 0; k < n; k++)
            assert_memory_equal(kvpool_k(p, l, to + k), kvpool_k(p, l, first + k), p->block_bytes);
    return rc;
}

/* A promote copies a run only the disk holds into RAM (evicting there as
 * a put does), bit for bit; two promotes queued at once are read from disk
 * in one streamed read; a load queued behind them goes first. */
static void test_promote_into_ram(void **state) {
    KvPool p;
    Sink sink;
    char *dir = test_tmpdir_new("mover");
    Mover *m = ram_disk_mover(&p, dir, &sink);
    assert_int_equal(mover_promote_max_blocks(m), 10); /* the RAM tier's budget: staging holds no more */
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 4, 20, 0), MN_ENOTFOUND);
    MoverTierStats disk0;
    mover_stats(m, 1, &disk0);
    MoverJob *a = promote_job(0, 4, 1);
    assert_int_equal(mover_submit(m, a), MN_OK);
    sink_wait_done(&sink, 5);
    assert_int_equal(a->rc, MN_OK);
    assert_int_equal(a->saved_tiers, 1u);
    assert_int_equal(sink.n_dropped, 8); /* B went from RAM to make room */
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 4, 20, 0), MN_OK);
    /* two promotes and a load, queued while the mover is held */
    sink.is_holding = true;
    assert_int_equal(mover_submit(m, save_job(0, 1)), MN_OK);
    sink_wait_done(&sink, 7);
    MoverJob *b1 = promote_job(4, 2, 1), *b2 = promote_job(6, 2, 1);
    MoverJob *ld = load_job(8, 4, 30, 0, 2);
    ld->id = 5;
    assert_int_equal(mover_submit(m, b1), MN_OK);
    assert_int_equal(mover_submit(m, b2), MN_OK);
    assert_int_equal(mover_submit(m, ld), MN_OK);
    MoverTierStats disk1;
    mover_stats(m, 1, &disk1);
    sink_release(&sink);
    sink_wait_done(&sink, 10);
    assert_int_equal(sink.done[7]->id, 5); /* the load first */
    assert_true(sink.done[8] == b1 && sink.done[9] == b2);
    assert_int_equal(b1->rc, MN_OK);
    assert_int_equal(b2->rc, MN_OK);
    MoverTierStats disk2;
    mover_stats(m, 1, &disk2);
    assert_int_equal(disk1.reads.n, disk0.reads.n + 1);
    assert_int_equal(disk2.reads.n, disk1.reads.n + 1); /* both promotes in one read */
    assert_int_equal(load_and_compare(m, &sink, &p, 4, 4, 40, 0), MN_OK);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* Promotes read together are put one by one, and each one's DONE comes
 * before the evictions the next one's put makes: here the second put
 * evicts the first run (the window's tail), and the engine must hear
 * "held" before "dropped", or it would believe RAM holds it. A RAM tier
 * of 6 blocks under lookahead; runs A (0..2), B (4..6), C (8..10), D
 * (12..14) saved, so RAM holds C and D; the window is C, B, A. */
static void test_promote_done_before_its_eviction(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 64, 8, 64, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 16; s++) fill_slot(&p, s, (uint32_t)s);
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    Mover *m = ram_disk_mover_of(&p, dir, &sink, 6 * 2 * (uint64_t)p.block_bytes, EVICT_LOOKAHEAD);
    for (int k = 0; k < 4; k++) assert_int_equal(mover_submit(m, save_job(4 * k, 3)), MN_OK);
    sink_wait_done(&sink, 4);
    sink.is_holding = true;
    MoverJob *w = mover_job_new(MOVER_WINDOW, 3, 0);
    int first[3] = {8, 4, 0}; /* C at the head, A at the tail */
    for (int i = 0; i < 3; i++) {
        w->hashes[i] = block_hash(first[i]);
        w->slots[i] = i;
    }
    assert_int_equal(mover_submit(m, w), MN_OK);
    sink_wait_done(&sink, 5);
    MoverJob *a = promote_job(0, 3, 1), *b = promote_job(4, 3, 1);
    assert_int_equal(mover_submit(m, a), MN_OK);
    assert_int_equal(mover_submit(m, b), MN_OK);
    sink_release(&sink);
    sink_wait_done(&sink, 7);
    assert_true(sink.done[5] == a && sink.done[6] == b);
    assert_int_equal(a->rc, MN_OK);
    assert_int_equal(b->rc, MN_OK);
    assert_int_equal(sink.done_dropped[6] - sink.done_dropped[5], 3); /* A, after its DONE */
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 3, 40, 0), MN_ENOTFOUND);
    assert_int_equal(load_and_compare(m, &sink, &p, 4, 3, 40, 0), MN_OK);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* A promote whose blocks come from runs stored differently is put into
 * RAM as one run per stretch; when a later stretch's put fails, the
 * earlier one is dropped again (reported), as the engine records none of
 * a failed promote's blocks in RAM. Hidden blocks of twice the K/V's size
 * make the second put too big for a RAM tier of 4 K/V blocks: X (block
 * 0, K/V) and W (1..4, K/V) are saved, W pushing X out of RAM; Y (5..7,
 * every layer hidden) fits the disk only. Promoting X and Y: X's put
 * evicts W, Y's is refused, and X goes again. */
static void test_promote_all_or_nothing(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 64, 8, 64, MN_TYPE_F16), MN_OK);
    assert_int_equal(kvpool_init_hidden(&p, 2 * p.block_bytes / 8), MN_OK); /* hidden_bytes = 2 * block_bytes */
    for (int s = 0; s < 8; s++) {
        fill_slot(&p, s, (uint32_t)s);
        fill_hidden(&p, s, (uint32_t)s);
    }
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    Mover *m = ram_disk_mover_of(&p, dir, &sink, 4 * 2 * (uint64_t)p.block_bytes, EVICT_LRU);
    assert_int_equal(mover_promote_max_blocks(m), 4);
    MoverJob *y = save_job(5, 3);
    y->hidden = 0x3;
    assert_int_equal(mover_submit(m, save_job(0, 1)), MN_OK);
    assert_int_equal(mover_submit(m, save_job(1, 4)), MN_OK);
    assert_int_equal(mover_submit(m, y), MN_OK);
    sink_wait_done(&sink, 3);
    assert_int_equal(sink.done[1]->saved_tiers, 3u);
    assert_int_equal(y->saved_tiers, 2u);
    assert_int_equal(sink.n_dropped, 1); /* X, from RAM */
    MoverJob *pr = promote_job(0, 4, 1); /* X, then Y */
    for (int i = 1; i < 4; i++) pr->hashes[i] = block_hash(4 + i);
    assert_int_equal(mover_submit(m, pr), MN_OK);
    sink_wait_done(&sink, 4);
    assert_int_equal(pr->rc, MN_EFULL);
    assert_int_equal(pr->saved_tiers, 0u);
    assert_int_equal(sink.n_dropped, 1 + 4 + 1); /* W to make room for X; then X */
    MoverTierStats ram;
    mover_stats(m, 0, &ram);
    assert_int_equal(ram.tier.n_blocks, 0);
    assert_int_equal(ram.tier.occupancy_bytes, 0);
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 1, 20, 0), MN_ENOTFOUND);
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 1, 20, 1), MN_OK); /* the disk still has it */
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* What a promote refuses: none or more blocks than the RAM tier holds
 * (at submit), tier 0 as its source, a block the disk does not hold, a
 * damaged extent (MN_ECHECKSUM: nothing reaches RAM, the run is dropped
 * from disk); a chain without two tiers, or whose RAM tier holds not one block,
 * promotes nothing. */
static void test_promote_refused(void **state) {
    KvPool p;
    Sink sink;
    char *dir = test_tmpdir_new("mover");
    Mover *m = ram_disk_mover(&p, dir, &sink);
    MoverJob *none = promote_job(0, 0, 1), *many = promote_job(0, mover_promote_max_blocks(m) + 1, 1);
    assert_int_equal(mover_submit(m, none), MN_EINVAL);
    assert_int_equal(mover_submit(m, many), MN_EINVAL);
    mover_job_free(none);
    mover_job_free(many);
    MoverJob *from0 = promote_job(4, 4, 0), *absent = promote_job(30, 2, 1);
    assert_int_equal(mover_submit(m, from0), MN_OK);
    assert_int_equal(mover_submit(m, absent), MN_OK);
    sink_wait_done(&sink, 5);
    assert_int_equal(from0->rc, MN_EINVAL);
    assert_int_equal(absent->rc, MN_ENOTFOUND);
    assert_int_equal(absent->failed_tier, 1);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "dd if=/dev/urandom of=%s/slab-00000.dat bs=4096 seek=1 count=2 conv=notrunc status=none", dir);
    assert_int_equal(system(cmd), 0); /* layer 0 of A */
    int n_dropped = sink.n_dropped;
    MoverJob *bad = promote_job(0, 4, 1);
    assert_int_equal(mover_submit(m, bad), MN_OK);
    sink_wait_done(&sink, 6);
    assert_int_equal(bad->rc, MN_ECHECKSUM);
    assert_int_equal(bad->failed_tier, 1);
    assert_int_equal(sink.n_dropped, n_dropped + 4);
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 4, 40, 0), MN_ENOTFOUND);
    mover_free(m);
    sink_free(&sink);
    Sink s2;
    sink_init(&s2);
    m = disk_mover(&p, dir, &s2);
    assert_int_equal(mover_promote_max_blocks(m), 0);
    MoverJob *one = promote_job(4, 1, 0);
    assert_int_equal(mover_submit(m, one), MN_EINVAL);
    mover_job_free(one);
    mover_free(m);
    MoverConfig tiny = {.pool = &p, .ram_bytes = 2 * p.block_bytes - 1, .disk_dir = dir, .disk_bytes = 16 << 20,
                        .on_event = on_event, .event_ctx = &s2}; /* RAM holds not one block */
    MnErr err = {0};
    assert_int_equal(mover_new(&tiny, &m, &err), MN_OK);
    assert_int_equal(mover_n_tiers(m), 2);
    assert_int_equal(mover_promote_max_blocks(m), 0);
    mover_free(m);
    sink_free(&s2);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* A SAVE into tier 0 alone (a restored run copied up into RAM) reaches
 * the RAM tier only, and is served with the promotes: before a save down
 * the chain queued ahead of it. A job still queued can be withdrawn
 * (MN_OK: it is the caller's again and no event of it comes); one the
 * thread has taken cannot (MN_EBUSY). Runs as in ram_disk_mover: A
 * (blocks 0..3, still in slots 0..3) only on disk, B and C in RAM. */
static void test_copy_up_and_withdraw(void **state) {
    KvPool p;
    Sink sink;
    char *dir = test_tmpdir_new("mover");
    Mover *m = ram_disk_mover(&p, dir, &sink);
    MoverTierStats ram0, disk0;
    mover_stats(m, 0, &ram0);
    mover_stats(m, 1, &disk0);
    sink.is_holding = true;
    assert_int_equal(mover_submit(m, save_job(8, 1)), MN_OK);
    sink_wait_done(&sink, 4); /* the mover is held in its DONE: taken */
    MoverJob *held = sink.done[3];
    assert_true(mover_is_taken(m, held));
    assert_int_equal(mover_withdraw(m, held), MN_EBUSY);
    MoverJob *down = save_job(4, 4), *up = save_job(0, 4), *gone = promote_job(0, 2, 1);
    up->into_tiers = 1u;
    assert_int_equal(mover_submit(m, down), MN_OK);
    assert_int_equal(mover_submit(m, gone), MN_OK);
    assert_int_equal(mover_submit(m, up), MN_OK);
    assert_false(mover_is_taken(m, gone));
    assert_int_equal(mover_withdraw(m, gone), MN_OK);
    mover_job_free(gone);
    MoverJob *never = promote_job(0, 1, 1);
    assert_int_equal(mover_withdraw(m, never), MN_EINVAL); /* never submitted */
    mover_job_free(never);
    sink_release(&sink);
    assert_int_equal(mover_submit(m, mover_job_new(MOVER_FLUSH, 0, 0)), MN_OK);
    sink_wait_done(&sink, 7);
    assert_true(sink.done[4] == up && sink.done[5] == down); /* and nothing of the withdrawn one */
    assert_int_equal(sink.done[6]->kind, MOVER_FLUSH);
    assert_int_equal(up->rc, MN_OK);
    assert_int_equal(up->saved_tiers, 1u);
    assert_int_equal(down->saved_tiers, 3u);
    MoverTierStats ram1, disk1;
    mover_stats(m, 0, &ram1);
    mover_stats(m, 1, &disk1);
    assert_int_equal(ram1.tier.n_puts, ram0.tier.n_puts + 3);   /* held, up, down */
    assert_int_equal(disk1.tier.n_puts, disk0.tier.n_puts + 2); /* held, down */
    assert_int_equal(disk1.reads.n, disk0.reads.n);             /* the withdrawn promote read nothing */
    assert_int_equal(load_and_compare(m, &sink, &p, 0, 4, 40, 0), MN_OK); /* A, from RAM */
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* ---- the mover under a hostile kernel ------------------------------------------------ */

/* Run fn(arg) in a child process with stderr going to a file; the child's
 * exit status must be 0 (a code of fn's says which check failed). The
 * child's stderr, NUL-terminated, into text. */
static void run_in_child(int (*fn)(void *), void *arg, char *text, size_t cap) {
    char log_path[] = "/tmp/mnemo-mover-log-XXXXXX";
    int log_fd = mkstemp(log_path);
    assert_true(log_fd >= 0);
    unlink(log_path); /* the descriptor is all it takes */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(dup2(log_fd, STDERR_FILENO) < 0 ? 100 : fn(arg));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    ssize_t n = pread(log_fd, text, cap - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(log_fd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child failed (status %d); it said: %s", status, text);
}

typedef struct ChildMover {
    MoverConfig mc;
    KvPool *p;
} ChildMover;

/* In the child: a kernel that refuses sched_setattr (a seccomp filter
 * answers EPERM, as a container's may). */
static int refuse_sched_setattr(void) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sched_setattr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* The child of test_mover_slice_refused: the mover starts without its
 * slice, saves a run and loads it back bit for bit. No cmocka checks here:
 * a failure in a child would go on to run the other tests there. */
static int slice_refused_child(void *arg) {
    ChildMover *c = arg;
    if (refuse_sched_setattr() != 0) return 2;
    if (mn_thread_set_slice(250000) != MN_EUNSUPPORTED) return 3;
    Sink sink;
    sink_init(&sink);
    c->mc.event_ctx = &sink;
    Mover *m;
    MnErr err = {0};
    if (mover_new(&c->mc, &m, &err) != MN_OK) return 4;
    if (mover_submit(m, save_job(0, 4)) != MN_OK) return 5;
    if (!sink_done_within_a_minute(&sink, 1)) return 6;
    if (sink.done[0]->rc != MN_OK || sink.mover_slice == MOVER_SLICE_NS) return 7;
    if (mover_submit(m, load_job(0, 4, 8, 0, c->p->n_layer)) != MN_OK) return 8;
    if (!sink_done_within_a_minute(&sink, 2) || sink.done[1]->rc != MN_OK) return 9;
    for (int l = 0; l < c->p->n_layer; l++)
        for (int k = 0; k < 4; k++)
            if (memcmp(kvpool_k(c->p, l, 8 + k), kvpool_k(c->p, l, k), c->p->block_bytes) != 0) return 10;
    mover_free(m);
    sink_free(&sink);
    return 0;
}

/* A kernel that refuses the mover's scheduling hint: the mover says so
 * once, in the words OPERATIONS.md gives, and works without it. */
static void test_mover_slice_refused(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 32, 8, 16, MN_TYPE_F16), MN_OK);
    for (int s = 0; s < 4; s++) fill_slot(&p, s, (uint32_t)s);
    char *dir = test_tmpdir_new("mover");
    ChildMover c = {.mc = {.pool = &p, .disk_dir = dir, .disk_bytes = 16 << 20, .on_event = on_event}, .p = &p};
    char text[4096];
    run_in_child(slice_refused_child, &c, text, sizeof text);
    const char *said = "mover: the kernel takes no scheduling hint", *hit = strstr(text, said);
    if (hit == NULL) fail_msg("no message; the child said: %s", text);
    assert_null(strstr(hit + strlen(said), said)); /* once */
    test_tmpdir_free(dir);
    kvpool_deinit(&p);
}

/* ---- the mixed restore ------------------------------------------------------------- */

typedef struct Waiter {
    Sink *sink;
    int n_waits;
} Waiter;

static void wait_layer(void *ctx, int layer) {
    Waiter *w = ctx;
    pthread_mutex_lock(&w->sink->lock);
    while (w->sink->layers <= layer && w->sink->n_done < 2) pthread_cond_wait(&w->sink->cond, &w->sink->lock);
    pthread_mutex_unlock(&w->sink->lock);
    w->n_waits++;
}

typedef struct RowCopy {
    float *out;
    int n_vocab;
} RowCopy;
static int row_copy(void *ctx, int idx, const float *logits) {
    RowCopy *c = ctx;
    memcpy(c->out, logits, (size_t)c->n_vocab * sizeof *logits);
    return 0;
}

/* A 70-token sequence whose KV blocks 0-1 were dropped (recomputed in the
 * same pass), 2-5 are on disk (loaded while the pass runs, waited for per
 * layer) and 6-7 are in the pool: the next token's logits equal a full
 * recompute's bit for bit. */
static void test_mixed_restore_logits(void **state) {
    char path[512];
    test_data_path(path, sizeof path, "models/stories260K.gguf");
    if (!test_require_file(path)) return;
    Model *md;
    MnErr err = {0};
    assert_int_equal(model_load(path, &md, &err), MN_OK);
    const int N = 70, bt = 8, nv = md->cfg.n_vocab;
    int32_t toks[70];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(3 + (seed >> 33) % (uint64_t)(nv - 3));
    }
    toks[0] = 1;
    /* the reference: a full recompute */
    Runner r;
    RunnerOptions ro;
    runner_options_default(&ro);
    ro.n_ctx = N + 1;
    ro.block_tokens = bt;
    assert_int_equal(runner_init(&r, md, &ro, &err), MN_OK);
    float *ref = malloc(sizeof(float) * (size_t)nv), *got = malloc(sizeof(float) * (size_t)nv);
    RowCopy rc = {ref, nv};
    assert_int_equal(runner_eval(&r, toks, N, false, row_copy, &rc, &err), MN_OK);
    runner_deinit(&r);
    /* turn 1 in our own pool: all 70 tokens in slots 0..8 */
    KvPool p;
    assert_int_equal(kvpool_init(&p, md->cfg.n_layer, md->cfg.kv_dim, bt, 32, MN_TYPE_F16), MN_OK);
    Forward *f;
    FwdOptions fo = {.max_tokens = 128, .max_logits = 4, .max_ctx = 128, .n_threads = 2};
    assert_int_equal(fwd_new(md, &p, &fo, &f, &err), MN_OK);
    int32_t tok[128], seq[128], pos[128], li[1];
    int32_t table1[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    AttnSeq s1 = {table1, 9};
    for (int i = 0; i < N; i++) {
        tok[i] = toks[i];
        seq[i] = 0;
        pos[i] = i;
    }
    li[0] = N - 1;
    FwdBatch b1 = {.n_tok = N, .tokens = tok, .seq = seq, .pos = pos, .seqs = &s1, .n_seqs = 1, .logit_idx = li,
                   .n_logits = 1};
    const float *logits;
    assert_int_equal(fwd_run(f, &b1, &logits, &err), MN_OK);
    assert_memory_equal(logits, ref, sizeof(float) * (size_t)nv);
    /* blocks 2..5 go to disk */
    char *dir = test_tmpdir_new("mover");
    Sink sink;
    sink_init(&sink);
    MoverConfig mc = {.pool = &p, .disk_dir = dir, .disk_bytes = 16 << 20, .is_durable = true,
                      .on_event = on_event, .event_ctx = &sink};
    Mover *m;
    assert_int_equal(mover_new(&mc, &m, &err), MN_OK);
    MoverJob *sv = mover_job_new(MOVER_SAVE, 4, 0);
    for (int i = 0; i < 4; i++) {
        sv->hashes[i] = block_hash(2 + i);
        sv->slots[i] = 2 + i;
    }
    assert_int_equal(mover_submit(m, sv), MN_OK);
    sink_wait_done(&sink, 1);
    assert_int_equal(sink.done[0]->rc, MN_OK);
    /* the returning turn: fresh slots 10,11 for the dropped leading blocks,
     * 12..15 loaded from disk, 6 and 7 as they are, 16 for the new tokens */
    int32_t table2[9] = {10, 11, 12, 13, 14, 15, 6, 7, 16};
    for (int s = 10; s <= 16; s++)
        for (int l = 0; l < p.n_layer; l++) memset(kvpool_k(&p, l, s), 0xff, p.block_bytes); /* NaN garbage */
    MoverJob *ld = mover_job_new(MOVER_LOAD, 4, p.n_layer);
    for (int i = 0; i < 4; i++) {
        ld->hashes[i] = block_hash(2 + i);
        ld->slots[i] = 12 + i;
        ld->tier[i] = 0;
    }
    sink.layers = 0;
    assert_int_equal(mover_submit(m, ld), MN_OK);
    int n = 0;
    for (int i = 0; i < 2 * bt; i++, n++) { /* leading range */
        tok[n] = toks[i];
        seq[n] = 0;
        pos[n] = i;
    }
    for (int i = 8 * bt; i < N; i++, n++) { /* the tail */
        tok[n] = toks[i];
        seq[n] = 0;
        pos[n] = i;
    }
    li[0] = n - 1;
    AttnSeq s2 = {table2, 9};
    Waiter w = {&sink, 0};
    FwdBatch b2 = {.n_tok = n, .tokens = tok, .seq = seq, .pos = pos, .seqs = &s2, .n_seqs = 1, .logit_idx = li,
                   .n_logits = 1, .wait_layer = wait_layer, .wait_ctx = &w};
    assert_int_equal(fwd_run(f, &b2, &logits, &err), MN_OK);
    memcpy(got, logits, sizeof(float) * (size_t)nv);
    sink_wait_done(&sink, 2);
    assert_int_equal(sink.done[1]->rc, MN_OK);
    assert_int_equal(w.n_waits, p.n_layer);
    assert_memory_equal(got, ref, sizeof(float) * (size_t)nv);
    mover_free(m);
    sink_free(&sink);
    test_tmpdir_free(dir);
    fwd_free(f);
    kvpool_deinit(&p);
    free(ref);
    free(got);
    model_free(md);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_mover_slice),
        cmocka_unit_test(test_thread_slice),
        cmocka_unit_test(test_thread_nice),
        cmocka_unit_test(test_mover_slice_refused),
        cmocka_unit_test(test_reads_before_writes),
        cmocka_unit_test(test_loads_batched),
        cmocka_unit_test(test_window_reaches_tiers),
        cmocka_unit_test(test_conv_touches_tiers),
        cmocka_unit_test(test_load_checksum_failure),
        cmocka_unit_test(test_promote_into_ram),
        cmocka_unit_test(test_promote_refused),
        cmocka_unit_test(test_promote_all_or_nothing),
        cmocka_unit_test(test_promote_done_before_its_eviction),
        cmocka_unit_test(test_copy_up_and_withdraw),
        cmocka_unit_test(test_mixed_restore_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
