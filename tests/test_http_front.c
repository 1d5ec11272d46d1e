/* test_http_front.c — the HTTP front's view of a client while a handler
 * makes its answer (http_peer_gone): a client that closes its side after
 * sending its request is seen gone, so a whole answer's wait can stop,
 * also after a byte nobody read; a client that stays, sending its next
 * request meanwhile, is not. A real front (gate and libmicrohttpd) on 127.0.0.1, a raw socket as
 * the client. */
#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/http.h"

typedef enum Mode {
    MODE_WAIT_GONE,  /* the handler waits until its client is gone */
    MODE_WAIT_SENT,  /* ... until the test says it sent more, then looks once */
} Mode;

typedef struct Seen {
    Mode mode;
    atomic_int n_started; /* handlers that began their final call */
    atomic_int is_sent;   /* the test sent what MODE_WAIT_SENT waits for */
    atomic_int n_gone;    /* handlers that saw their client gone */
    atomic_int n_there;   /* handlers that saw it still there */
} Seen;

/* A bounded wait on a library thread: no fail_msg here (cmocka's jump
 * belongs to the test's thread); the test sees the counters instead. */
#define HANDLER_WAIT_UNTIL(cond)                                           \
    do {                                                                   \
        for (int i_ = 0; !(cond) && i_ < TEST_HANG_GUARD_S * 100; i_++)    \
            usleep(10000);                                                 \
    } while (0)

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    Seen *seen = cls;
    if (*con_cls == NULL) { /* the head: the body (none here) comes next */
        *con_cls = seen;
        return MHD_YES;
    }
    int nth = atomic_fetch_add(&seen->n_started, 1);
    if (seen->mode == MODE_WAIT_GONE) {
        HANDLER_WAIT_UNTIL(http_peer_gone(c));
        if (http_peer_gone(c)) atomic_fetch_add(&seen->n_gone, 1);
        return MHD_NO;
    }
    if (nth == 0) HANDLER_WAIT_UNTIL(atomic_load(&seen->is_sent));
    if (http_peer_gone(c)) atomic_fetch_add(&seen->n_gone, 1);
    else atomic_fetch_add(&seen->n_there, 1);
    static const char ok[] = "ok";
    struct MHD_Response *r = MHD_create_response_from_buffer(2, (void *)ok, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static void seen_init(Seen *seen, Mode mode) {
    seen->mode = mode;
    atomic_init(&seen->n_started, 0);
    atomic_init(&seen->is_sent, 0);
    atomic_init(&seen->n_gone, 0);
    atomic_init(&seen->n_there, 0);
}

static HttpFront *front_start(Seen *seen) {
    HttpFrontConfig cfg = {.host = "127.0.0.1", .port = 0, .handler_fn = handler, .ctx = seen};
    http_limits_default(&cfg.limits);
    HttpFront *f;
    MnErr err = {0};
    if (http_front_new(&cfg, &f, &err) != MN_OK) fail_msg("cannot start the front: %s", err.msg);
    return f;
}

static int client_connect(const HttpFront *f) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_front_port(f))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_str(int fd, const char *s) { assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s)); }

/* A client that sends its request, then (when more is not NULL, once the
 * handler is waiting) more, then closes: the handler sees it gone. */
static void expect_gone(const char *more) {
    Seen seen;
    seen_init(&seen, MODE_WAIT_GONE);
    HttpFront *f = front_start(&seen);
    int fd = client_connect(f);
    send_str(fd, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    if (more) {
        TEST_WAIT_UNTIL(atomic_load(&seen.n_started) == 1, "the handler did not start");
        send_str(fd, more);
    }
    close(fd);
    TEST_WAIT_UNTIL(atomic_load(&seen.n_gone) == 1, "the handler did not see its client go");
    http_front_free(f);
}

static void test_client_gone(void **st) { expect_gone(NULL); }

/* A byte nobody reads before the close does not hide it (a peek would see
 * the byte and call the client there for good). */
static void test_client_gone_after_a_byte(void **st) { expect_gone("X"); }

/* A client that stays, sending its next request while the first is being
 * answered: not gone, and both are answered. */
static void test_client_there(void **st) {
    Seen seen;
    seen_init(&seen, MODE_WAIT_SENT);
    HttpFront *f = front_start(&seen);
    int fd = client_connect(f);
    send_str(fd, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    TEST_WAIT_UNTIL(atomic_load(&seen.n_started) == 1, "the handler did not start");
    send_str(fd, "GET /y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    atomic_store(&seen.is_sent, 1);
    char buf[4096];
    size_t got = 0;
    for (ssize_t n; got < sizeof buf - 1 && (n = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0;) got += (size_t)n;
    buf[got] = '\0';
    close(fd);
    assert_int_equal(atomic_load(&seen.n_there), 2);
    assert_int_equal(atomic_load(&seen.n_gone), 0);
    const char *second = strstr(buf + 1, "HTTP/1.1 200");
    assert_true(strncmp(buf, "HTTP/1.1 200", 12) == 0 && second != NULL);
    http_front_free(f);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_gone),
        cmocka_unit_test(test_client_gone_after_a_byte),
        cmocka_unit_test(test_client_there),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
