/* test_gate.c — the gate's head check (server/gate.c, included for its
 * static functions): a head is judged only once it is whole, whatever
 * pieces it came in; each malformed head gets its status; a head that
 * fills everything the gate looks at is 414 or 431. The gate's sockets are
 * exercised end to end in test_server; here only the gate thread's turn
 * across the end of an accept rest, on a clock the test sets. */
#include "test_util.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/socket.h>

/* The clock gate.c reads (mn_now, renamed as it is included): read 0 is
 * test_clock_first, read n after it test_clock_later + n * test_clock_step. */
static double test_clock_first, test_clock_later, test_clock_step;
static atomic_int test_clock_reads;
static double test_clock_at(int n) { return n == 0 ? test_clock_first : test_clock_later + n * test_clock_step; }
static double test_clock_now(void) { return test_clock_at(atomic_fetch_add(&test_clock_reads, 1)); }

/* accept4 as gate.c calls it (renamed too): the first call fails with
 * test_accept_errno when that is set; each call notes the clock's last
 * reading in test_accept_at. */
static int test_accept_errno;
static atomic_int test_accept_calls;
static double test_accept_at[2];
static int test_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    int k = atomic_fetch_add(&test_accept_calls, 1);
    if (k < 2) test_accept_at[k] = test_clock_at(atomic_load(&test_clock_reads) - 1);
    if (k == 0 && test_accept_errno) {
        errno = test_accept_errno;
        return -1;
    }
    return accept4(fd, addr, len, flags);
}

#define mn_now test_clock_now
#define accept4 test_accept4
#include "server/gate.c"
#undef accept4
#undef mn_now

/* A head, judged on every prefix: a good one is HEAD_MORE until it is
 * whole; a bad one is HEAD_MORE until its fault has arrived (a bad request
 * line is refused before the rest of the head), then refused with status
 * on every longer prefix. Neither is ever passed early. */
static void check_prefixes(const char *head, HeadVerdict verdict, int status) {
    size_t n = strlen(head);
    HeadCheck hc;
    bool is_refused = false;
    for (size_t i = 0; i <= n; i++) {
        HeadVerdict v = head_check(head, i, false, &hc);
        bool is_ok = i < n && verdict == HEAD_PASS ? v == HEAD_MORE
                     : verdict == HEAD_PASS        ? v == HEAD_PASS
                     : v == HEAD_BAD               ? hc.status == status
                                                   : v == HEAD_MORE && !is_refused && i < n;
        if (!is_ok) fail_msg("%zu of %zu bytes of %s: verdict %d (%s)", i, n, head, v, v == HEAD_BAD ? hc.msg : "");
        is_refused = is_refused || v == HEAD_BAD;
    }
}

static void test_good_heads(void **state) {
    check_prefixes("GET /health HTTP/1.1\r\nHost: x\r\n\r\n", HEAD_PASS, 0);
    check_prefixes("GET /health HTTP/1.0\r\n\r\n", HEAD_PASS, 0);
    check_prefixes("\r\n\r\nGET /health HTTP/1.1\r\n\r\n", HEAD_PASS, 0);  /* leading empty lines */
    check_prefixes("GET /health HTTP/1.1\nHost: x\n\n", HEAD_PASS, 0);    /* bare LF */
    check_prefixes("GET  /health  HTTP/1.1\r\n\r\n", HEAD_PASS, 0);       /* runs of spaces */
    check_prefixes("POST /v1/completions HTTP/1.1\r\nContent-Length:\t12\r\nX-A: b\r\n c\r\n\r\n", HEAD_PASS, 0);
    check_prefixes("POST / HTTP/1.1\r\ncontent-length: 18446744073709551615\r\n\r\n", HEAD_PASS, 0);
    /* the body after the head is not the gate's business */
    HeadCheck hc;
    const char *with_body = "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc GARBAGE\r\n";
    assert_int_equal(head_check(with_body, strlen(with_body), false, &hc), HEAD_PASS);
}

static void test_bad_heads(void **state) {
    check_prefixes("GET /health HTTP/2.0\r\n\r\n", HEAD_BAD, 505);
    check_prefixes("GET /health HTTP/0.9\r\n\r\n", HEAD_BAD, 505);
    check_prefixes("GET /health\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("GET /health HTTP/1.1 x\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("GE\"T / HTTP/1.1\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("GET / HTTP/1.1\r\nHost x\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("GET / HTTP/1.1\r\n: x\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("GET / HTTP/1.1\r\nHost : x\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("GET / HTTP/1.1\r\n folded\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length: 5\r\n 5\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length: 5 \r\n\r\n", HEAD_BAD, 400);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", HEAD_BAD, 400);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n", HEAD_BAD, 413);
    check_prefixes("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999999999999999999\r\n\r\n", HEAD_BAD, 413);
}

/* A buffer the gate fills without seeing the head's end. */
static void test_too_large(void **state) {
    static char buf[GATE_HEAD_MAX];
    HeadCheck hc;
    memset(buf, 'a', sizeof buf);
    memcpy(buf, "GET /", 5);
    assert_int_equal(head_check(buf, sizeof buf, true, &hc), HEAD_BAD);
    assert_int_equal(hc.status, 414);
    assert_int_equal(head_check(buf, sizeof buf, false, &hc), HEAD_MORE);
    size_t n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nX-Big: ");
    memset(buf + n, 'b', sizeof buf - n);
    assert_int_equal(head_check(buf, sizeof buf, true, &hc), HEAD_BAD);
    assert_int_equal(hc.status, 431);
    /* a head that ends within the buffer is judged on its own */
    n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\n\r\n");
    assert_int_equal(head_check(buf, sizeof buf, true, &hc), HEAD_PASS);
    /* too many header lines, however short */
    n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\n");
    for (int i = 0; i <= GATE_MAX_HEADERS; i++) n += (size_t)sprintf(buf + n, "A: %d\r\n", i);
    n += (size_t)sprintf(buf + n, "\r\n");
    assert_int_equal(head_check(buf, n, false, &hc), HEAD_BAD);
    assert_int_equal(hc.status, 431);
}

/* ---- the gate thread across an accept rest ------------------------------------------ */

static void count_hand_over(void *ctx, int fd, const struct sockaddr_in *addr) {
    atomic_fetch_add((atomic_int *)ctx, 1);
    close(fd);
}

static void ignore_rejected(void *ctx, const char *method, const char *path, int status, const char *msg) {}

/* Runs the gate thread (on the test's clock, set first) on a listening
 * socket of its own, accepting rested until rest_until; connects a client
 * that sends a whole head and waits until the gate hands it over. */
static void hand_over_one(double rest_until) {
    atomic_int n_handed = 0;
    atomic_store(&test_clock_reads, 0);
    atomic_store(&test_accept_calls, 0);
    Gate *g = mn_calloc(1, sizeof *g);
    assert_non_null(g);
    g->cb = (GateCallbacks){.hand_over_fn = count_hand_over, .rejected_fn = ignore_rejected, .ctx = &n_handed};
    g->head_wait_s = GATE_HEAD_WAIT_S;
    g->accept_paused_until = rest_until;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    g->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(g->listen_fd >= 0);
    assert_int_equal(bind(g->listen_fd, (struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(listen(g->listen_fd, 8), 0);
    assert_int_equal(getsockname(g->listen_fd, (struct sockaddr *)&addr, &len), 0);
    g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    assert_true(g->wake_fd >= 0);
    assert_int_equal(pthread_create(&g->thread, NULL, gate_main, g), 0);
    g->has_thread = true;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    const char head[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, head, sizeof head - 1, 0), (ssize_t)(sizeof head - 1));
    TEST_WAIT_UNTIL(atomic_load(&n_handed) == 1, "the connection was not handed over");
    close(fd);
    gate_free(g);
}

/* Accepting rests (out of descriptors) until a time the gate thread's first
 * clock reading falls just before and every later one after: the turn that
 * leaves the listening socket out of its poll must also wake when the rest
 * ends. It read the clock a second time for the poll's timeout, found the
 * rest over and nothing pending, and waited with no timeout: a connection
 * was never accepted (the hang guard failed). */
static void test_accept_rest_ends(void **state) {
    test_clock_first = 100.0 - 0.002; /* a short real wait: the poll's timeout is real */
    test_clock_later = 101.0;
    test_clock_step = 0;
    test_accept_errno = 0;
    hand_over_one(100.0);
}

/* An accept that fails for want of kernel memory (ENOBUFS, ENOMEM) leaves
 * the connection in the backlog as one out of descriptors does, and the
 * listening socket readable: accepting rests GATE_FD_PAUSE_S on the clock
 * before it tries again. It tried again at once (polled, the socket was
 * still readable) — a busy loop logging a line a turn while it lasted. */
static void test_accept_rests_without_memory(void **state) {
    static const int errnos[] = {ENOBUFS, ENOMEM, EMFILE};
    for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++) {
        test_clock_first = test_clock_later = 100.0;
        test_clock_step = 0.02; /* a few turns of the gate thread per rest */
        test_accept_errno = errnos[i];
        hand_over_one(0);
        assert_true(atomic_load(&test_accept_calls) >= 2);
        if (!(test_accept_at[1] - test_accept_at[0] >= GATE_FD_PAUSE_S))
            fail_msg("after %s, accept was tried again %.2f s later on the clock (want %.2f)",
                     strerror(errnos[i]), test_accept_at[1] - test_accept_at[0], GATE_FD_PAUSE_S);
    }
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_heads),
        cmocka_unit_test(test_bad_heads),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_accept_rest_ends),
        cmocka_unit_test(test_accept_rests_without_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
