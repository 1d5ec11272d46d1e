/* test_diskprobe.c — the tools behind `mnemo disk-probe` (tools/): the raw
 * probe measures a temporary directory, leaves nothing behind, and names
 * missing directories and a full disk (injected ENOSPC) or a failing read
 * (EIO); sampled reads are each timed and stop at a count or at SIGTERM;
 * the tier probe restores whole runs of a real disk tier and counts every
 * extent, and fails cleanly on injected faults; the memory load's threads
 * copy until stopped and are gone after; the command prints the lines
 * scripts/bench parses and refuses bad options with exit status 2.
 * (Moved here from test_bench.c when the probe left bench/.) */
#include "test_util.h"

#include <math.h>
#include <stdbool.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mem.h"
#include "cache/aio.h"
#include "cache/tier.h"
#include "tools/diskprobe.h"
#include "tools/diskprobe_cmd.h"
#include "tools/memload.h"
#include "tools/tierprobe.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static int n_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

typedef struct Fault {
    unsigned op_mask;
    int n_skip, errnum;
} Fault;

static void inject(Aio *a, void *ctx) {
    const Fault *f = ctx;
    aio_fault_set(a, f->op_mask, f->n_skip, 1000, f->errnum);
}

/* SIGTERM to the thread running a sampling disk-probe command, once the
 * command has printed its first sample to out_path (or, should it never,
 * after TEST_HANG_GUARD_S). */
typedef struct Signaller {
    pthread_t target;
    const char *out_path;
} Signaller;

static void *signal_after_first_sample(void *arg) {
    Signaller *sg = arg;
    for (int i = 0; i < TEST_HANG_GUARD_S * 100; i++) {
        char *text = test_read_file(sg->out_path, NULL);
        bool has_sample = text && strstr(text, "sample_read_mbps=");
        free(text);
        if (has_sample) break;
        usleep(10 * 1000);
    }
    pthread_kill(sg->target, SIGTERM);
    return NULL;
}

/* What `mnemo disk-probe argv...` prints on stdout (it must succeed),
 * malloc'd; with sg, a signaller thread watches it meanwhile. */
static char *probe_output_signalled(int argc, char **argv, Signaller *sg) {
    char out_path[] = "/tmp/mnemo-test-diskprobe-out-XXXXXX";
    int out_fd = mkstemp(out_path);
    assert_true(out_fd >= 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    pthread_t th;
    if (sg) {
        sg->target = pthread_self();
        sg->out_path = out_path;
        assert_int_equal(pthread_create(&th, NULL, signal_after_first_sample, sg), 0);
    }
    int rc = diskprobe_cmd(argc, argv);
    if (sg) pthread_join(th, NULL);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(out_fd);
    assert_int_equal(rc, 0);
    char *text = test_read_file(out_path, NULL);
    unlink(out_path);
    assert_non_null(text);
    return text;
}

static char *probe_output(int argc, char **argv) { return probe_output_signalled(argc, argv, NULL); }

static void test_disk_probe(void **state) {
    char dir[] = "/tmp/mnemo-test-diskprobe-XXXXXX";
    assert_non_null(mkdtemp(dir));
    MnErr err = {0};
    DiskProbeResult res;
    int rc = diskprobe_run(dir, 4u << 20, &res, &err);
    if (rc) fail_msg("diskprobe_run: %s", err.msg);
    assert_true(res.bytes == 4u << 20);
    assert_true(res.read_mbps > 0 && res.write_mbps > 0 && res.read_s > 0 && res.write_s > 0);
    assert_true(fabs(res.read_mbps - (double)res.bytes / res.read_s / 1e6) < 1e-6 * res.read_mbps);
    assert_true(res.backend == AIO_BACKEND_URING || res.backend == AIO_BACKEND_SYNC);
    assert_true(res.huge_share >= 0 && res.huge_share <= 1); /* its buffers are mapped while it reads */
    assert_int_equal(n_dir_entries(dir), 0); /* the file is gone */

    /* a size the requests do not divide, few in flight, both backends */
    for (int b = 0; b < 2; b++) {
        DiskProbeOpts o = {.request_bytes = 64 * 1024, .queue_depth = 3,
                           .backend = b ? AIO_BACKEND_SYNC : AIO_BACKEND_AUTO};
        rc = diskprobe_run_opts(dir, (1u << 20) + 12 * 1024, &o, &res, &err);
        if (rc) fail_msg("diskprobe_run_opts: %s", err.msg);
        if (b) assert_int_equal(res.backend, AIO_BACKEND_SYNC);
        assert_int_equal(n_dir_entries(dir), 0);
    }

    /* a full disk, at reservation and in the middle of writing; a failing read */
    Fault faults[] = {{AIO_OP_FALLOCATE, 0, ENOSPC}, {AIO_OP_WRITE, 2, ENOSPC}, {AIO_OP_READ, 1, EIO}};
    int codes[] = {MN_EFULL, MN_EFULL, MN_EIO};
    for (int i = 0; i < 3; i++) {
        DiskProbeOpts o = {.aio_hook_fn = inject, .aio_hook_ctx = &faults[i]};
        err.msg[0] = '\0';
        assert_int_equal(diskprobe_run_opts(dir, 4u << 20, &o, &res, &err), codes[i]);
        assert_non_null(strstr(err.msg, dir));
        if (codes[i] == MN_EFULL) assert_non_null(strstr(err.msg, "no space left"));
        assert_true(res.bytes == 0 && res.read_mbps == 0);
        assert_int_equal(n_dir_entries(dir), 0);
    }

    /* bad places and sizes */
    char missing[96];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    assert_int_equal(diskprobe_run(missing, 1u << 20, &res, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, missing));
    char file[96];
    snprintf(file, sizeof file, "%s/f", dir);
    close(open(file, O_CREAT | O_WRONLY, 0600));
    assert_int_equal(diskprobe_run(file, 1u << 20, &res, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "not a directory"));
    unlink(file);
    assert_int_equal(diskprobe_run(dir, 1000, &res, &err), MN_EINVAL);
    assert_int_equal(diskprobe_run(dir, 0, &res, &err), MN_EINVAL);

    /* the command: its two lines on stdout, exit codes */
    char *argv[] = {dir, "--mb", "2"};
    char *text = probe_output(3, argv);
    char head[128];
    snprintf(head, sizeof head, "disk-probe %s: write ", dir);
    double w = 0, r = 0;
    char *line2 = strstr(text, "read_mbps=");
    if (strncmp(text, head, strlen(head)) != 0 || !strstr(text, " MB/s, read ") || !strstr(text, " MB/s (2 MiB, ") ||
        line2 == NULL || sscanf(line2, "read_mbps=%lf write_mbps=%lf", &r, &w) != 2 || !(r > 0 && w > 0))
        fail_msg("disk-probe printed:\n%s", text);
    free(text);
    assert_int_equal(n_dir_entries(dir), 0);
    char *missing_argv[] = {missing, "--mb", "1"};
    assert_int_equal(diskprobe_cmd(3, missing_argv), 1);
    char *bad_mb[] = {dir, "--mb", "0"};
    assert_int_equal(diskprobe_cmd(3, bad_mb), 2);
    char *no_dir[] = {"--mb", "1"};
    assert_int_equal(diskprobe_cmd(2, no_dir), 2);
    char *bad_kb[] = {dir, "--request-kb", "6"};
    assert_int_equal(diskprobe_cmd(3, bad_kb), 2);
    assert_int_equal(rmdir(dir), 0);
}

/* Threads of this process now. */
static int n_threads_now(void) {
    return n_dir_entries("/proc/self/task");
}

/* Threads of this process once those ending have left /proc (a joined
 * thread may linger there a moment, longer on a loaded machine): at most
 * `most`, or as many as remain after TEST_HANG_GUARD_S. */
static int threads_settled(int most) {
    int n = n_threads_now();
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (n > most) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > TEST_HANG_GUARD_S) break;
        usleep(10 * 1000);
        n = n_threads_now();
    }
    return n;
}

/* The memory load: refused sizes; threads that copy until stopped, each
 * at least once however soon that is (and are gone after); the command
 * prints its figure after the probe's, and refuses it with sampling or out
 * of range. How fast they copy is the machine's business. */
static void test_disk_probe_memory_load(void **state) {
    MnErr err = {0};
    MemLoad *l = (MemLoad *)&err;
    assert_int_equal(memload_start(0, &l, &err), MN_EINVAL);
    assert_null(l);
    assert_int_equal(memload_start(MEMLOAD_MAX_THREADS + 1, &l, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "memory load"));
    assert_true(memload_stop(NULL) == 0.0);

    int before = threads_settled(1);
    assert_int_equal(memload_start(2, &l, &err), MN_OK);
    assert_int_equal(n_threads_now(), before + 2);
    double rate = memload_stop(l); /* at once: they may not have run yet */
    assert_true(rate > 0);
    assert_int_equal(threads_settled(before), before);

    char dir[] = "/tmp/mnemo-test-diskprobe-load-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *argv[] = {dir, "--mb", "4", "--memory-load", "1"};
    char *text = probe_output(5, argv);
    int n = 0;
    double gbps = 0;
    char *line = strstr(text, "memory_load_threads=");
    if (!strstr(text, "read_mbps=") || line == NULL || sscanf(line, "memory_load_threads=%d memory_load_gbps=%lf", &n,
                                                              &gbps) != 2 || n != 1 || !(gbps >= 0))
        fail_msg("disk-probe printed:\n%s", text);
    free(text);
    assert_int_equal(threads_settled(before), before);
    char *sampled[] = {dir, "--sample-ms", "10", "--memory-load", "1"};
    assert_int_equal(diskprobe_cmd(5, sampled), 2);
    char too_many_n[16];
    snprintf(too_many_n, sizeof too_many_n, "%d", MEMLOAD_MAX_THREADS + 1);
    char *too_many[] = {dir, "--memory-load", too_many_n};
    assert_int_equal(diskprobe_cmd(3, too_many), 2);
    assert_int_equal(n_dir_entries(dir), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* Takes `want` samples, keeping their rates. */
typedef struct Samples {
    int want, n, n_calls;
    double rates[16];
} Samples;

static bool take_samples(void *ctx, double last) {
    Samples *s = ctx;
    s->n_calls++;
    if (last >= 0) s->rates[s->n++] = last;
    return s->n < s->want;
}

/* Raw reads sampled over time: each read timed and reported, the file
 * removed on every path; the command stops at a count or at SIGTERM. */
static void test_disk_probe_sample(void **state) {
    char dir[] = "/tmp/mnemo-test-sampleprobe-XXXXXX";
    assert_non_null(mkdtemp(dir));
    MnErr err = {0};
    DiskProbeResult res;
    Samples s = {.want = 5};
    int rc = diskprobe_sample(dir, 4u << 20, 2u << 20, NULL, take_samples, &s, &res, &err);
    if (rc) fail_msg("diskprobe_sample: %s", err.msg);
    assert_int_equal(s.n, 5);
    assert_int_equal(s.n_calls, 6); /* before each read, and once after the last */
    for (int i = 0; i < 5; i++) assert_true(s.rates[i] > 0);
    assert_true(res.bytes == 4u << 20 && res.write_mbps > 0 && res.read_s > 0 && res.read_mbps == 0);
    assert_int_equal(n_dir_entries(dir), 0);

    /* sizes that do not fit */
    uint64_t bad[] = {0, 1000, 8u << 20};
    for (int i = 0; i < 3; i++) {
        s = (Samples){.want = 1};
        assert_int_equal(diskprobe_sample(dir, 4u << 20, bad[i], NULL, take_samples, &s, &res, &err), MN_EINVAL);
        assert_int_equal(s.n_calls, 0);
    }

    /* the third read fails (two 1 MiB requests a read): the two before are
     * reported, the error says where, nothing is left */
    Fault f = {AIO_OP_READ, 4, EIO};
    DiskProbeOpts o = {.aio_hook_fn = inject, .aio_hook_ctx = &f};
    s = (Samples){.want = 5};
    assert_int_equal(diskprobe_sample(dir, 4u << 20, 2u << 20, &o, take_samples, &s, &res, &err), MN_EIO);
    assert_int_equal(s.n, 2);
    assert_non_null(strstr(err.msg, dir));
    assert_true(res.bytes == 0);
    assert_int_equal(n_dir_entries(dir), 0);

    /* the command, stopped by a count: a line per read, then the summary */
    char *argv[] = {dir, "--mb", "4", "--sample-mb", "2", "--sample-ms", "10", "--samples", "3"};
    char *text = probe_output(9, argv);
    int n_lines = 0, n = -1;
    for (const char *at = text; (at = strstr(at, "sample_read_mbps=")) != NULL; at++) n_lines++;
    double median = 0, q1 = 0, q3 = 0;
    const char *sum = strstr(text, "samples=");
    if (n_lines != 3 || sum == NULL ||
        sscanf(sum, "samples=%d median_read_mbps=%lf q1_read_mbps=%lf q3_read_mbps=%lf", &n, &median, &q1, &q3) != 4 ||
        n != 3 || !(q1 > 0 && q1 <= median && median <= q3) ||
        !strstr(text, ": 3 reads of 2 MiB, one every 10 ms: median "))
        fail_msg("disk-probe printed:\n%s", text);
    free(text);
    assert_int_equal(n_dir_entries(dir), 0);

    /* the command, stopped by SIGTERM (to this thread, which it blocks and
     * waits for between reads) after its first sample: it ends normally
     * and removes its file */
    Signaller sg;
    char *argv2[] = {dir, "--mb", "4", "--sample-mb", "2", "--sample-ms", "20"};
    text = probe_output_signalled(7, argv2, &sg);
    sum = strstr(text, "samples=");
    if (sum == NULL || sscanf(sum, "samples=%d", &n) != 1 || n < 1) fail_msg("disk-probe printed:\n%s", text);
    free(text);
    assert_int_equal(n_dir_entries(dir), 0);
    sigset_t pending;
    sigpending(&pending);
    assert_false(sigismember(&pending, SIGTERM)); /* taken, not left for later */

    char *too_big[] = {dir, "--mb", "4", "--sample-mb", "8", "--sample-ms", "10"};
    assert_int_equal(diskprobe_cmd(7, too_big), 2);
    char *negative[] = {dir, "--sample-ms", "-1"};
    assert_int_equal(diskprobe_cmd(3, negative), 2);
    char *with_restore[] = {dir, "--sample-ms", "10", "--restore"};
    assert_int_equal(diskprobe_cmd(4, with_restore), 2);
    assert_int_equal(rmdir(dir), 0);
}

typedef struct TierFault {
    Fault f;
    bool hit; /* the hook ran */
} TierFault;

static void inject_tier(Tier *t, void *ctx) {
    TierFault *tf = ctx;
    tf->hit = true;
    inject(tier_disk_aio(t), &tf->f);
}

/* The disk tier's restores alone: whole restores of the runs put, every
 * extent counted, the scratch directory gone on every path. */
static void test_disk_probe_restore(void **state) {
    char dir[] = "/tmp/mnemo-test-restoreprobe-XXXXXX";
    assert_non_null(mkdtemp(dir));
    MnErr err = {0};
    TierProbeResult res;
    /* 16 MiB: four runs of 5 blocks (160 KiB a layer, 22 layers), two restores */
    int rc = tierprobe_run(dir, 16u << 20, NULL, &res, &err);
    if (rc) fail_msg("diskprobe_restore: %s", err.msg);
    assert_int_equal(res.n_restores, 2);
    assert_true(res.bytes == 2ull * 2 * 22 * 5 * 32768);
    assert_true(res.read_s > 0 && res.restore_mbps > 0);
    assert_true(fabs(res.restore_mbps - (double)res.bytes / res.read_s / 1e6) < 1e-6 * res.restore_mbps);
    assert_int_equal(n_dir_entries(dir), 0);

    /* runs of one block, three to a restore: 23 runs fit, 21 are read */
    TierProbeOpts o = {.run_blocks = 1, .runs_per_restore = 3};
    rc = tierprobe_run(dir, 16u << 20, &o, &res, &err);
    if (rc) fail_msg("diskprobe_restore: %s", err.msg);
    assert_int_equal(res.n_restores, 7);
    assert_true(res.bytes == 7ull * 3 * 22 * 32768);
    assert_int_equal(n_dir_entries(dir), 0);

    /* a failing read (the 11th: a restore takes 8, one per run and span
     * of 6 layers), a full disk while storing */
    TierFault faults[] = {{{AIO_OP_READ, 10, EIO}, false}, {{AIO_OP_WRITE, 3, ENOSPC}, false}};
    int codes[] = {MN_EIO, MN_EFULL};
    const char *what[] = {"restoring", "no space left"};
    for (int i = 0; i < 2; i++) {
        TierProbeOpts fo = {.tier_hook_fn = inject_tier, .tier_hook_ctx = &faults[i]};
        err.msg[0] = '\0';
        assert_int_equal(tierprobe_run(dir, 16u << 20, &fo, &res, &err), codes[i]);
        assert_true(faults[i].hit);
        assert_non_null(strstr(err.msg, what[i]));
        assert_true(res.bytes == 0 && res.n_restores == 0);
        assert_int_equal(n_dir_entries(dir), 0);
    }

    /* too small for one restore; no such directory */
    assert_int_equal(tierprobe_run(dir, 1u << 20, NULL, &res, &err), MN_EINVAL);
    assert_non_null(strstr(err.msg, "no whole restore"));
    char missing[96];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    assert_int_equal(tierprobe_run(missing, 16u << 20, NULL, &res, &err), MN_ENOTFOUND);

    /* the command with --restore: the third and fourth lines */
    char *argv[] = {dir, "--mb", "8", "--restore"};
    char *text = probe_output(4, argv);
    double t = 0;
    char *line = strstr(text, "restore_mbps=");
    if (!strstr(text, "the disk tier restores at ") || !strstr(text, "(1 restores of 2 runs x 5 blocks") ||
        line == NULL || sscanf(line, "restore_mbps=%lf", &t) != 1 || !(t > 0))
        fail_msg("disk-probe --restore printed:\n%s", text);
    free(text);
    assert_int_equal(n_dir_entries(dir), 0);
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk_probe),
        cmocka_unit_test(test_disk_probe_restore),
        cmocka_unit_test(test_disk_probe_sample),
        cmocka_unit_test(test_disk_probe_memory_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
