/* test_http_front.c — the HTTP front's view of a client while a handler
 * makes its answer (http_peer_gone): a client that closes its side after
 * sending its request is seen gone, so a whole answer's wait can stop; a
 * client that stays, with the bytes of a next request already sent, is
 * not. A real front (gate and libmicrohttpd) on 127.0.0.1, a raw socket as
 * the client. */
#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/http.h"

typedef struct Seen {
    atomic_int n_gone;  /* handlers that saw their client gone */
    atomic_int n_there; /* handlers that saw it still there */
    bool is_wait_gone;  /* a handler waits until its client is gone */
} Seen;

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    Seen *seen = cls;
    if (*con_cls == NULL) { /* the head: the body (none here) comes next */
        *con_cls = seen;
        return MHD_YES;
    }
    if (seen->is_wait_gone) {
        TEST_WAIT_UNTIL(http_peer_gone(c), "the client's close was not seen");
        atomic_fetch_add(&seen->n_gone, 1);
        return MHD_NO;
    }
    if (http_peer_gone(c)) atomic_fetch_add(&seen->n_gone, 1);
    else atomic_fetch_add(&seen->n_there, 1);
    static const char ok[] = "ok";
    struct MHD_Response *r = MHD_create_response_from_buffer(2, (void *)ok, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
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

static void test_client_gone(void **st) {
    Seen seen = {.is_wait_gone = true};
    atomic_init(&seen.n_gone, 0);
    atomic_init(&seen.n_there, 0);
    HttpFront *f = front_start(&seen);
    int fd = client_connect(f);
    send_str(fd, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    close(fd);
    TEST_WAIT_UNTIL(atomic_load(&seen.n_gone) == 1, "the handler did not see its client go");
    http_front_free(f);
}

static void test_client_there(void **st) {
    Seen seen = {.is_wait_gone = false};
    atomic_init(&seen.n_gone, 0);
    atomic_init(&seen.n_there, 0);
    HttpFront *f = front_start(&seen);
    int fd = client_connect(f);
    /* two requests at once: the second's bytes wait while the first is answered */
    send_str(fd, "GET /x HTTP/1.1\r\nHost: x\r\n\r\nGET /y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
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
        cmocka_unit_test(test_client_there),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
