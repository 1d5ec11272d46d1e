/* test_tty.h — pseudo-terminals for the tests that type into `mnemo chat`
 * as a person would (header-only; each test is one .c). */
#ifndef MN_TEST_TTY_H
#define MN_TEST_TTY_H

#include <fcntl.h>
#include <termios.h>
#include <time.h>

#include "test_util.h"

/* A new pseudo-terminal: its controlling side in *master, the path of the
 * terminal side in slave. */
static inline void tty_open_pair(int *master, char *slave, size_t cap) {
    *master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    assert_true(*master >= 0);
    assert_int_equal(grantpt(*master), 0);
    assert_int_equal(unlockpt(*master), 0);
    assert_int_equal(ptsname_r(*master, slave, cap), 0);
}

/* Wait until the terminal is out of canonical mode, as libedit puts it to
 * edit a line: a state to wait for, checked every millisecond. Keys typed
 * earlier reach a cooked line discipline: a whole line is then read
 * without editing, and Ctrl-D is taken as the end of input by the terminal
 * rather than by libedit. */
static inline void tty_wait_raw(int master) {
    struct termios tio;
    while (tcgetattr(master, &tio) == 0 && (tio.c_lflag & ICANON)) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

#endif
