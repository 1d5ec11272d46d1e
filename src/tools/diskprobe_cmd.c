/* diskprobe_cmd.c — `mnemo disk-probe DIR` (see diskprobe_cmd.h).
 *
 * Parses the options, then either samples raw reads until a count or a
 * signal (--sample-ms), or runs the raw probe, then with --restore the
 * tier probe, all of it while --memory-load threads copy memory when
 * asked. Each figure is printed twice: a sentence for people, then
 * key=value pairs for scripts. Runs on the caller's thread; while
 * sampling, SIGTERM and SIGINT are blocked and waited for between reads,
 * and the old mask is restored before it returns.
 */
#include "tools/diskprobe_cmd.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/cli.h"
#include "base/mem.h"
#include "base/stats.h"
#include "tools/diskprobe.h"
#include "tools/memload.h"
#include "tools/tierprobe.h"

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- --sample-ms ------------------------------------------------------------------ */

/* --sample-ms: the reads' rates, each printed as it comes; between reads
 * the wait is a sigtimedwait for SIGTERM or SIGINT (blocked meanwhile), so
 * a signal ends the sampling at once and the file is still removed. */
typedef struct Sampling {
    sigset_t stop;
    struct timespec every;
    int max;       /* reads to take; 0: until a signal */
    double *rates; /* (cap) */
    int n, cap;
    bool is_short; /* ran out of memory for the rates */
} Sampling;

static bool sampling_next(void *ctx, double last) {
    Sampling *s = ctx;
    if (last >= 0) {
        if (s->n == s->cap) {
            int cap = s->cap ? 2 * s->cap : 256;
            double *grown = mn_realloc(s->rates, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                s->is_short = true;
                return false;
            }
            s->rates = grown;
            s->cap = cap;
        }
        s->rates[s->n++] = last;
        printf("sample_read_mbps=%.1f\n", last);
        fflush(stdout);
    }
    if (s->max > 0 && s->n >= s->max) return false;
    return sigtimedwait(&s->stop, NULL, &s->every) < 0; /* a timeout (or another signal): go on */
}

static int sample_main(const char *dir, uint64_t mb, uint64_t sample_mb, int every_ms, int max,
                       const DiskProbeOpts *o) {
    Sampling s = {.every = {every_ms / 1000, (long)(every_ms % 1000) * 1000000L}, .max = max};
    sigset_t old;
    sigemptyset(&s.stop);
    sigaddset(&s.stop, SIGTERM);
    sigaddset(&s.stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &s.stop, &old);
    DiskProbeResult res;
    MnErr err = {0};
    int rc = diskprobe_sample(dir, mb << 20, sample_mb << 20, o, sampling_next, &s, &res, &err);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == MN_OK && s.is_short) rc = mn_err_set(&err, MN_ENOMEM, "out of memory for the samples");
    if (rc != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        mn_free(s.rates);
        return 1;
    }
    double median = 0, q1 = 0, q3 = 0;
    if (s.n > 0) {
        median = mn_median_sort(s.rates, s.n);
        q1 = s.rates[(s.n - 1) / 4];
        q3 = s.rates[3 * (s.n - 1) / 4];
        printf("disk-probe %s: %d reads of %" PRIu64 " MiB, one every %d ms: median %.1f MB/s (%.1f to %.1f); "
               "write %.1f MB/s (%" PRIu64 " MiB, %s)\n",
               dir, s.n, sample_mb, every_ms, median, s.rates[0], s.rates[s.n - 1], res.write_mbps, mb,
               aio_backend_name(res.backend));
    }
    printf("samples=%d median_read_mbps=%.1f q1_read_mbps=%.1f q3_read_mbps=%.1f\n", s.n, median, q1, q3);
    mn_free(s.rates);
    return 0;
}

/* ---- the probe, --restore and --memory-load -------------------------------------- */

/* The probe (and with restore, the tier probe) of dir, printed: the exit
 * code. */
static int probe_main(const char *dir, uint64_t mb, const DiskProbeOpts *o, bool restore) {
    MnErr err = {0};
    DiskProbeResult res;
    if (diskprobe_run_opts(dir, mb << 20, o, &res, &err) != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        return 1;
    }
    char huge[48] = "";
    if (res.huge_share >= 0) snprintf(huge, sizeof huge, ", buffers %.0f%% in huge pages", res.huge_share * 100);
    printf("disk-probe %s: write %.1f MB/s, read %.1f MB/s (%" PRIu64 " MiB, %s%s%s)\n", dir, res.write_mbps,
           res.read_mbps, mb, aio_backend_name(res.backend), res.is_direct ? "" : ", buffered: O_DIRECT refused", huge);
    printf("read_mbps=%.1f write_mbps=%.1f\n", res.read_mbps, res.write_mbps);
    if (!restore) return 0;
    TierProbeResult rr;
    if (tierprobe_run(dir, mb << 20, NULL, &rr, &err) != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        return 1;
    }
    printf("disk-probe %s: the disk tier restores at %.1f MB/s, %.2f of the raw read (%d restores of 2 runs x 5 "
           "blocks, %.1f MB)\n",
           dir, rr.restore_mbps, res.read_mbps > 0 ? rr.restore_mbps / res.read_mbps : 0.0, rr.n_restores,
           (double)rr.bytes / 1e6);
    printf("restore_mbps=%.1f\n", rr.restore_mbps);
    return 0;
}

/* ---- the command ------------------------------------------------------------------ */

int diskprobe_cmd(int argc, char **argv) {
    uint64_t mb = 512, request_kb = DISKPROBE_REQUEST_BYTES / 1024;
    int queue_depth = DISKPROBE_QUEUE_DEPTH;
    uint64_t sample_mb = 8;
    int sample_ms = 0, samples = 0;
    bool restore = false;
    int memory_load = 0;
    CliOpt opts[] = {
        {"mb", 0, CLI_U64, &mb, "N", "size of the probe file in MiB (default 512)"},
        {"request-kb", 0, CLI_U64, &request_kb, "KB", "bytes per request in KiB, a multiple of 4 (default 1024)"},
        {"queue-depth", 0, CLI_INT, &queue_depth, "N", "requests in flight (default 32, as the disk tier)"},
        {"restore", 0, CLI_FLAG, &restore, NULL,
         "also time the disk tier's own restores of --mb MiB (2 runs of 5 blocks of the 1.1B model each)"},
        {"sample-ms", 0, CLI_INT, &sample_ms, "MS",
         "instead: read --sample-mb of the file every MS ms, each read timed, until SIGTERM or SIGINT"},
        {"sample-mb", 0, CLI_U64, &sample_mb, "N", "MiB per sampled read (default 8)"},
        {"samples", 0, CLI_INT, &samples, "N", "stop sampling after N reads (default 0: at a signal only)"},
        {"memory-load", 0, CLI_INT, &memory_load, "N",
         "probe while N threads copy memory, as a server's compute does (default 0: none)"},
    };
    const char *synopsis = "mnemo disk-probe DIR [--mb N] [--request-kb KB] [--queue-depth N] [--restore] "
                           "[--memory-load N]\n"
                           "       mnemo disk-probe DIR --sample-ms MS [--sample-mb N] [--samples N] [--mb N] ...";
    const char *pos[1];
    int n_pos = 0;
    MnErr err = {0};
    int rc = cli_parse(argc, argv, opts, N_OPTS(opts), pos, 1, &n_pos, &err);
    if (rc == MN_ECANCELED) {
        cli_usage(stdout, synopsis, opts, N_OPTS(opts));
        return 0;
    }
    if (rc == MN_OK && n_pos != 1) rc = mn_err_set(&err, MN_EINVAL, "needs one DIR argument");
    if (rc == MN_OK && (mb < 1 || mb > (1u << 20))) rc = mn_err_set(&err, MN_EINVAL, "--mb must be in 1..1048576");
    if (rc == MN_OK && (request_kb < 4 || request_kb % 4 != 0 || request_kb > (1u << 20)))
        rc = mn_err_set(&err, MN_EINVAL, "--request-kb must be a multiple of 4 in 4..1048576");
    if (rc == MN_OK && (queue_depth < 1 || queue_depth > 1024))
        rc = mn_err_set(&err, MN_EINVAL, "--queue-depth must be in 1..1024");
    if (rc == MN_OK && (sample_ms < 0 || sample_ms > 3600000))
        rc = mn_err_set(&err, MN_EINVAL, "--sample-ms must be in 0..3600000");
    if (rc == MN_OK && sample_ms > 0 && (sample_mb < 1 || sample_mb > mb))
        rc = mn_err_set(&err, MN_EINVAL, "--sample-mb must be in 1..--mb");
    if (rc == MN_OK && samples < 0) rc = mn_err_set(&err, MN_EINVAL, "--samples must be 0 or more");
    if (rc == MN_OK && sample_ms > 0 && restore) rc = mn_err_set(&err, MN_EINVAL, "--restore does not sample");
    if (rc == MN_OK && (memory_load < 0 || memory_load > MEMLOAD_MAX_THREADS))
        rc = mn_err_set(&err, MN_EINVAL, "--memory-load must be in 0..%d", MEMLOAD_MAX_THREADS);
    if (rc == MN_OK && sample_ms > 0 && memory_load > 0)
        rc = mn_err_set(&err, MN_EINVAL, "--memory-load does not sample");
    if (rc != MN_OK) {
        cli_error(stderr, synopsis, err.msg);
        return 2;
    }
    DiskProbeOpts o = {.request_bytes = request_kb * 1024, .queue_depth = queue_depth};
    if (sample_ms > 0) return sample_main(pos[0], mb, sample_mb, sample_ms, samples, &o);
    MemLoad *load = NULL;
    if (memory_load > 0 && memload_start(memory_load, &load, &err) != MN_OK) {
        fprintf(stderr, "mnemo disk-probe: %s\n", err.msg);
        return 1;
    }
    int code = probe_main(pos[0], mb, &o, restore);
    double copied = memload_stop(load);
    if (memory_load > 0) {
        printf("disk-probe %s: all of the above while %d threads copied memory at %.1f GB/s\n", pos[0], memory_load,
               copied / 1e9);
        printf("memory_load_threads=%d memory_load_gbps=%.1f\n", memory_load, copied / 1e9);
    }
    return code;
}
