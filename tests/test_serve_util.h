/* test_serve_util.h — start and stop a `mnemo serve` process on a free
 * loopback port for the integration tests (header-only; each test is one .c).
 * The binary is $MNEMO_BIN (tests/run.sh sets it to the build's mnemo). */
#ifndef MN_TEST_SERVE_UTIL_H
#define MN_TEST_SERVE_UTIL_H

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

typedef struct Srv {
    pid_t pid;
    int port;
    char log[64];
    char model[128]; /* the served id, as /v1/models lists it: the model's file name */
} Srv;

/* The port from the server's start-up line ("serving ... on
 * http://127.0.0.1:PORT") into s->port, once it is in the log; else 0. */
static inline int srv_port(Srv *s) {
    char *log = test_read_file(s->log, NULL);
    char *p = log ? strstr(log, "on http://127.0.0.1:") : NULL;
    if (p) s->port = atoi(p + strlen("on http://127.0.0.1:"));
    free(log);
    return s->port;
}

/* Start `mnemo serve -m MODEL --port 0 --block-tokens 8 EXTRA`; returns 0
 * once it listens (the port is read from its start-up line), -1 when the
 * model file is missing (the test is skipped). A server that exits first,
 * or is not listening after TEST_HANG_GUARD_S, fails the test. */
static inline int srv_start(Srv *s, const char *model, const char *extra) {
    char path[512], rel[256], cmd[2048];
    snprintf(rel, sizeof rel, "models/%s.gguf", model);
    test_data_path(path, sizeof path, rel);
    if (!test_require_file(path)) return -1;
    snprintf(s->model, sizeof s->model, "%s.gguf", model);
    snprintf(s->log, sizeof s->log, "/tmp/mnemo-test-srv-%d-XXXXXX", (int)getpid());
    int fd = mkstemp(s->log);
    close(fd);
    const char *bin = getenv("MNEMO_BIN") ? getenv("MNEMO_BIN") : "./build/release/mnemo";
    snprintf(cmd, sizeof cmd, "exec %s serve -m %s --port 0 --block-tokens 8 %s 2>%s", bin, path, extra, s->log);
    s->pid = fork();
    if (s->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    s->port = 0;
    TEST_WAIT_UNTIL(srv_port(s) > 0 || waitpid(s->pid, &status, WNOHANG) == s->pid,
                    "the server is not listening after %d s; see %s", TEST_HANG_GUARD_S, s->log);
    if (s->port <= 0) {
        s->pid = 0; /* reaped: nothing to stop */
        fail_msg("the server exited (status 0x%x) before listening; see %s", status, s->log);
    }
    return 0;
}

/* SIGTERM, and the server must exit 0. */
static inline void srv_stop(Srv *s) {
    kill(s->pid, SIGTERM);
    int st;
    waitpid(s->pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(s->log);
}

#endif
