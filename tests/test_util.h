/* test_util.h — helpers shared by the cmocka tests: where the shared test
 * data lives, reading small files, temporary directories, damage to a disk
 * tier's files. Header-only (each test is one .c). */
#ifndef MN_TEST_UTIL_H
#define MN_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* How long a test waits for something that must happen before it calls
 * the run hung. Never a measure of speed, only a guard against hanging:
 * long enough for any load a shared machine may be under, so that its
 * expiry means a bug. */
#define TEST_HANG_GUARD_S 60

/* CLOCK_REALTIME TEST_HANG_GUARD_S from now, for pthread_cond_timedwait. */
static inline struct timespec test_hang_deadline(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += TEST_HANG_GUARD_S;
    return ts;
}

/* Poll until cond holds (every 10 ms); after TEST_HANG_GUARD_S fail with
 * the printf-style message. For state a test can only read (a counter, a
 * metric, a file), not wait on. */
#define TEST_WAIT_UNTIL(cond, ...)                                                   \
    do {                                                                             \
        struct timespec t0_, t_;                                                     \
        clock_gettime(CLOCK_MONOTONIC, &t0_);                                        \
        while (!(cond)) {                                                            \
            clock_gettime(CLOCK_MONOTONIC, &t_);                                     \
            if (t_.tv_sec - t0_.tv_sec > TEST_HANG_GUARD_S) fail_msg(__VA_ARGS__);   \
            usleep(10000);                                                           \
        }                                                                            \
    } while (0)

/* Run only the cases whose names match $MNEMO_TEST_FILTER (a cmocka
 * pattern: '*' and '?'), when it is set; call first thing in main. */
static inline void test_apply_filter(void) {
    const char *f = getenv("MNEMO_TEST_FILTER");
    if (f && f[0]) cmocka_set_test_filter(f);
}

/* Path of a file under ../shared/data (or $MNEMO_DATA) in a static buffer
 * per call site is not thread-safe; tests are single-threaded. */
static inline const char *test_data_path(char *buf, size_t cap, const char *rel) {
    const char *root = getenv("MNEMO_DATA");
    if (root == NULL || root[0] == '\0') root = "../shared/data";
    snprintf(buf, cap, "%s/%s", root, rel);
    return buf;
}

/* Skip the calling test when the shared data is missing, except in CI
 * (CI=true), where missing data is a failure. */
static inline int test_require_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) { fclose(f); return 1; }
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) fail_msg("test data missing: %s", path);
    fprintf(stderr, "skipping: test data missing: %s\n", path);
    skip();
    return 0;
}

/* Read a whole file into a malloc'd buffer (NUL-terminated); NULL on error. */
static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = '\0'; if (len) *len = (size_t)n; }
    return buf;
}

/* Whether the bytes needle[0..n) occur anywhere in the file at path (false
 * when it cannot be read): a raw look at what a file still holds. */
static inline int test_file_contains(const char *path, const void *needle, size_t n) {
    size_t len = 0;
    char *data = test_read_file(path, &len);
    int found = data != NULL && memmem(data, len, needle, n) != NULL;
    free(data);
    return found;
}

/* Whether a file of dir whose name begins with prefix holds the bytes
 * needle[0..n). */
static inline int test_dir_contains(const char *dir, const char *prefix, const void *needle, size_t n) {
    DIR *d = opendir(dir);
    int found = 0;
    if (d == NULL) return 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        found = test_file_contains(path, needle, n);
    }
    closedir(d);
    return found;
}

/* The disk tier's directory is private: dir is 0700, every entry in it a
 * regular file of mode 0600, and the ones named in want[] exist. */
static inline void test_expect_private(const char *dir, const char *const *want, int n_want) {
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    if ((st.st_mode & 07777) != 0700) fail_msg("%s has mode %04o, want 0700", dir, (unsigned)(st.st_mode & 07777));
    for (int i = 0; i < n_want; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, want[i]);
        if (lstat(path, &st) != 0) fail_msg("%s is missing", path);
    }
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        assert_int_equal(lstat(path, &st), 0);
        if (!S_ISREG(st.st_mode) || (st.st_mode & 07777) != 0600)
            fail_msg("%s: mode %06o, want a regular file of mode 0600", path, (unsigned)st.st_mode);
    }
    closedir(d);
}

/* Make a fresh directory from a mkdtemp template ("/tmp/name-XXXXXX",
 * rewritten in place); fails the test when it cannot. */
static inline char *test_make_dir(char *tmpl) {
    if (mkdtemp(tmpl) == NULL) fail_msg("mkdtemp %s failed", tmpl);
    return tmpl;
}

/* Remove a directory and the files in it (one level: the tests make no
 * subdirectories). */
static inline void test_rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        char path[1024];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* A fresh directory /tmp/mnemo-test-NAME-XXXXXX, its path malloc'd; fails
 * the test when it cannot be made. */
static inline char *test_tmpdir_new(const char *name) {
    size_t cap = strlen(name) + 32;
    char *dir = malloc(cap);
    if (dir == NULL) {
        fail_msg("out of memory");
        return NULL;
    }
    snprintf(dir, cap, "/tmp/mnemo-test-%s-XXXXXX", name);
    return test_make_dir(dir);
}

/* Remove a directory of test_tmpdir_new with its files and free its path
 * (NULL is fine). */
static inline void test_tmpdir_free(char *dir) {
    if (dir == NULL) return;
    test_rm_dir(dir);
    free(dir);
}

/* Overwrite up to max_pages (0: all) 4 KiB pages of the data area (what
 * follows the 4096-byte header) of every slab file of the disk tier in
 * dir with random bytes; returns the bytes overwritten (0: no slab file
 * has a data area). Fails the test when a write fails. */
static inline long test_corrupt_slabs(const char *dir, long max_pages) {
    char pattern[1024], cmd[1400] = "";
    snprintf(pattern, sizeof pattern, "%s/slab-*.dat", dir);
    glob_t g;
    long total = 0;
    if (glob(pattern, 0, NULL, &g) != 0) return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct stat sb;
        if (stat(g.gl_pathv[i], &sb) != 0 || sb.st_size <= 4096) continue;
        long pages = (long)((sb.st_size - 4096) / 4096);
        if (max_pages > 0 && pages > max_pages) pages = max_pages;
        snprintf(cmd, sizeof cmd, "dd if=/dev/urandom of='%s' bs=4096 seek=1 count=%ld conv=notrunc status=none",
                 g.gl_pathv[i], pages);
        if (system(cmd) != 0) break;
        total += pages * 4096;
        cmd[0] = '\0';
    }
    globfree(&g);
    if (cmd[0]) fail_msg("failed: %s", cmd);
    return total;
}

/* Remove a HOME made for a test and what mnemo writes under it: the files
 * of HOME/.cache/mnemo and of HOME, and the directories. */
static inline void test_rm_home(const char *home) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/.cache/mnemo", home);
    test_rm_dir(dir);
    snprintf(dir, sizeof dir, "%s/.cache", home);
    rmdir(dir);
    test_rm_dir(home);
}

#endif
