/* test_threadpool.c — base/threadpool: tpool_run calls every ith once per
 * job; tpool_share's calls do every item once whoever joins, never two
 * calls with one ith at a time, and the caller neither waits for a worker
 * that has not joined (held before it joins: the caller does the job
 * alone) nor leaves before a worker that joined has finished its item. */
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/threadpool.h"

enum { N_ITEMS = 997, MAX_TH = 4 };

typedef struct Job {
    atomic_long next;          /* the first item not yet taken */
    atomic_int done[N_ITEMS];  /* times each item was done */
    atomic_int busy[MAX_TH];   /* calls running with each ith */
    atomic_int calls[MAX_TH];  /* calls made with each ith */
    atomic_int overlap;        /* calls that found their ith busy */
} Job;

static void job_reset(Job *j) {
    atomic_init(&j->next, 0);
    for (int i = 0; i < N_ITEMS; i++) atomic_init(&j->done[i], 0);
    for (int i = 0; i < MAX_TH; i++) atomic_init(&j->busy[i], 0), atomic_init(&j->calls[i], 0);
    atomic_init(&j->overlap, 0);
}

static void take_items(void *ctx, int ith, int nth) {
    Job *j = ctx;
    assert_true(ith >= 0 && ith < nth && nth <= MAX_TH);
    if (atomic_fetch_add(&j->busy[ith], 1) != 0) atomic_fetch_add(&j->overlap, 1);
    atomic_fetch_add(&j->calls[ith], 1);
    for (long i; (i = atomic_fetch_add(&j->next, 1)) < N_ITEMS;) atomic_fetch_add(&j->done[i], 1);
    atomic_fetch_sub(&j->busy[ith], 1);
}

static void expect_each_item_once(Job *j) {
    for (int i = 0; i < N_ITEMS; i++) assert_int_equal(atomic_load(&j->done[i]), 1);
    assert_int_equal(atomic_load(&j->overlap), 0);
}

static void test_run_calls_every_ith(void **state) {
    (void)state;
    for (int nth = 1; nth <= MAX_TH; nth++) {
        ThreadPool *tp = tpool_new(nth);
        assert_non_null(tp);
        assert_int_equal(tpool_size(tp), nth);
        Job *j = test_malloc(sizeof *j);
        for (int rep = 0; rep < 200; rep++) {
            job_reset(j);
            tpool_run(tp, take_items, j);
            expect_each_item_once(j);
            for (int i = 0; i < nth; i++) assert_int_equal(atomic_load(&j->calls[i]), 1);
        }
        test_free(j);
        tpool_free(tp);
    }
    assert_null(tpool_new(0));
}

/* Shared and every-thread jobs back to back, as a forward pass issues
 * them: each shared job's items done once, by calls with distinct ith. */
static void test_share_does_every_item_once(void **state) {
    (void)state;
    for (int nth = 1; nth <= MAX_TH; nth++) {
        ThreadPool *tp = tpool_new(nth);
        assert_non_null(tp);
        Job *j = test_malloc(sizeof *j);
        for (int rep = 0; rep < 2000; rep++) {
            job_reset(j);
            if (rep % 7 == 3) tpool_run(tp, take_items, j);
            else tpool_share(tp, take_items, j);
            expect_each_item_once(j);
            assert_int_equal(atomic_load(&j->calls[0]), 1);
        }
        test_free(j);
        tpool_free(tp);
    }
}

/* Worker 1 is held before it joins while `hold` is set. */
typedef struct Hold {
    atomic_bool hold;
    atomic_int n_held; /* times worker 1 stopped at the hook */
} Hold;

static void hold_worker(void *ctx, int ith) {
    Hold *h = ctx;
    if (ith != 1 || !atomic_load(&h->hold)) return;
    atomic_fetch_add(&h->n_held, 1);
    TEST_WAIT_UNTIL(!atomic_load(&h->hold), "worker 1 still held");
}

typedef struct Caller {
    ThreadPool *tp;
    Job *j;
    atomic_bool returned;
} Caller;

static void *share_on_thread(void *arg) {
    Caller *c = arg;
    tpool_share(c->tp, take_items, c->j);
    atomic_store(&c->returned, true);
    return NULL;
}

/* A worker off the CPU when a shared job begins (here: held before it
 * joins) does not hold the job up: the caller takes every item and
 * returns while the worker is still held. Let go, the worker finds the job
 * closed and does nothing of it; the next jobs of both kinds run as usual. */
static void test_share_leaves_out_held_worker(void **state) {
    (void)state;
    Hold h;
    atomic_init(&h.hold, true);
    atomic_init(&h.n_held, 0);
    ThreadPool *tp = tpool_new_hooked(2, &(TpoolTestHooks){.before_join = hold_worker, .ctx = &h});
    assert_non_null(tp);
    Job *j = test_malloc(sizeof *j);
    job_reset(j);
    Caller c = {.tp = tp, .j = j};
    atomic_init(&c.returned, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, share_on_thread, &c), 0);
    TEST_WAIT_UNTIL(atomic_load(&c.returned), "tpool_share waits for a worker that never joined");
    assert_int_equal(atomic_load(&h.n_held), 1); /* it saw the job, and is still held */
    expect_each_item_once(j);
    assert_int_equal(atomic_load(&j->calls[0]), 1);
    assert_int_equal(atomic_load(&j->calls[1]), 0);
    atomic_store(&h.hold, false);
    assert_int_equal(pthread_join(th, NULL), 0);
    Job *j2 = test_malloc(sizeof *j2);
    job_reset(j2);
    tpool_run(tp, take_items, j2); /* worker 1 takes part again, the held job behind it */
    expect_each_item_once(j2);
    assert_int_equal(atomic_load(&j2->calls[1]), 1);
    assert_int_equal(atomic_load(&j->calls[1]), 0); /* it made no call of the held job */
    expect_each_item_once(j);
    job_reset(j2);
    tpool_share(tp, take_items, j2);
    expect_each_item_once(j2);
    test_free(j2);
    test_free(j);
    tpool_free(tp);
}

/* The caller of a shared job returns only when a worker that joined has
 * finished: worker 1 takes the first item and waits for the caller's own
 * call to end before finishing it. */
typedef struct Late {
    atomic_long next;
    atomic_bool first_taken, caller_done, worker_done;
} Late;

static void late_items(void *ctx, int ith, int nth) {
    Late *l = ctx;
    if (ith == 1) { /* the caller takes nothing before this */
        atomic_fetch_add(&l->next, 1);
        atomic_store(&l->first_taken, true);
        TEST_WAIT_UNTIL(atomic_load(&l->caller_done), "the caller's call never ended");
        for (volatile int spin = 0; spin < 1000000; spin++) {
        }
        atomic_store(&l->worker_done, true);
        return;
    }
    TEST_WAIT_UNTIL(atomic_load(&l->first_taken), "worker 1 never took the first item");
    while (atomic_fetch_add(&l->next, 1) < N_ITEMS) {
    }
    atomic_store(&l->caller_done, true);
}

static void test_share_waits_for_joined_worker(void **state) {
    (void)state;
    ThreadPool *tp = tpool_new(2);
    assert_non_null(tp);
    for (int rep = 0; rep < 5; rep++) {
        Late l;
        atomic_init(&l.next, 0);
        atomic_init(&l.first_taken, false);
        atomic_init(&l.caller_done, false);
        atomic_init(&l.worker_done, false);
        tpool_share(tp, late_items, &l);
        assert_true(atomic_load(&l.caller_done));
        assert_true(atomic_load(&l.worker_done));
    }
    tpool_free(tp);
}

static void test_split(void **state) {
    (void)state;
    long lo, hi, next = 0;
    for (int ith = 0; ith < 3; ith++) {
        tpool_split(100, 16, ith, 3, &lo, &hi);
        assert_int_equal(lo, next);
        assert_true(lo % 16 == 0 && hi >= lo);
        next = hi;
    }
    assert_int_equal(next, 100);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_calls_every_ith),
        cmocka_unit_test(test_share_does_every_item_once),
        cmocka_unit_test(test_share_leaves_out_held_worker),
        cmocka_unit_test(test_share_waits_for_joined_worker),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
