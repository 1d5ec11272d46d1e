/* test_chat_input.c — the chat's line input: from a pipe, lines come as
 * typed (control characters kept, no history); on a terminal (a
 * pseudo-terminal the test writes keys into) they are edited with libedit
 * and kept in a history that Ctrl-P recalls. */
#include "test_util.h"
#include "test_tty.h"

#include <pthread.h>
#include <unistd.h>

#include "base/err.h"
#include "bench/chat_input.h"

static void write_all(int fd, const char *s) { assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s)); }

static void expect_line(ChatInput *ci, const char *want) {
    const char *line = NULL;
    assert_int_equal(chat_input_read(ci, "> ", &line), MN_OK);
    assert_string_equal(line, want);
}

static void test_pipe_lines_as_typed(void **s) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    write_all(fds[1], "upon\x01Once\nsecond\n\x10\nlast without newline");
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    FILE *out = fopen("/dev/null", "w");
    ChatInput *ci;
    assert_int_equal(chat_input_new(in, out, &ci), MN_OK);
    assert_false(chat_input_is_editing(ci));
    expect_line(ci, "upon\x01Once");
    expect_line(ci, "second");
    expect_line(ci, "\x10");
    expect_line(ci, "last without newline");
    const char *line;
    assert_int_equal(chat_input_read(ci, "> ", &line), MN_ENOTFOUND);
    assert_int_equal(chat_input_history_len(ci), 0);
    chat_input_free(ci);
    fclose(out);
    fclose(in);
}

/* The person at the terminal: waits for each prompt and for libedit to
 * have the terminal out of canonical mode (tty_wait_raw), then types. */
typedef struct Typist {
    int master;
    const char *const (*steps)[2]; /* {prompt, keys} */
    int n_steps;
} Typist;

static void *typist_run(void *arg) {
    Typist *t = arg;
    char *seen = calloc(1, 1);
    size_t len = 0;
    for (int i = 0; i < t->n_steps; i++) {
        while (strstr(seen, t->steps[i][0]) == NULL) {
            char buf[1024];
            ssize_t k = read(t->master, buf, sizeof buf);
            if (k <= 0) goto out;
            seen = realloc(seen, len + (size_t)k + 1);
            memcpy(seen + len, buf, (size_t)k);
            len += (size_t)k;
            seen[len] = '\0';
        }
        tty_wait_raw(t->master);
        if (write(t->master, t->steps[i][1], strlen(t->steps[i][1])) < 0) break;
    }
out:
    free(seen);
    return NULL;
}

static void expect_line_at(ChatInput *ci, const char *prompt, const char *want) {
    const char *line = NULL;
    assert_int_equal(chat_input_read(ci, prompt, &line), MN_OK);
    assert_string_equal(line, want);
}

static void test_terminal_edits_and_remembers(void **s) {
    int master;
    char name[128];
    tty_open_pair(&master, name, sizeof name);
    int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    assert_true(slave >= 0);
    setenv("TERM", "xterm", 1);
    FILE *in = fdopen(slave, "r");
    FILE *out = fdopen(dup(slave), "w"); /* the prompt and the echo, read by the typist */
    ChatInput *ci;
    assert_int_equal(chat_input_new(in, out, &ci), MN_OK);
    assert_true(chat_input_is_editing(ci));
    static const char *const steps[][2] = {
        {"p1> ", "upon a time\x01Once \r"}, /* Ctrl-A moves to the start of the line */
        {"p2> ", "\x10\r"},                   /* Ctrl-P recalls it */
        {"p3> ", "second\r"},
        {"p4> ", "\x10\x10\r"},              /* two back */
        {"p5> ", "\r"},                       /* an empty line */
        {"p6> ", "\x04"},                     /* Ctrl-D on an empty line: the end */
    };
    Typist typist = {master, steps, (int)(sizeof steps / sizeof steps[0])};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, typist_run, &typist), 0);
    expect_line_at(ci, "p1> ", "Once upon a time");
    assert_int_equal(chat_input_history_len(ci), 1);
    expect_line_at(ci, "p2> ", "Once upon a time");
    assert_int_equal(chat_input_history_len(ci), 1); /* the same line twice in a row is kept once */
    expect_line_at(ci, "p3> ", "second");
    assert_int_equal(chat_input_history_len(ci), 2);
    expect_line_at(ci, "p4> ", "Once upon a time");
    assert_int_equal(chat_input_history_len(ci), 3);
    expect_line_at(ci, "p5> ", "");
    assert_int_equal(chat_input_history_len(ci), 3); /* not remembered */
    const char *line;
    assert_int_equal(chat_input_read(ci, "p6> ", &line), MN_ENOTFOUND);
    chat_input_free(ci);
    fclose(out);
    fclose(in);
    close(master); /* ends the typist's read, if it still reads */
    pthread_join(th, NULL);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipe_lines_as_typed),
        cmocka_unit_test(test_terminal_edits_and_remembers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
