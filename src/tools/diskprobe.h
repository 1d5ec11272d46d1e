/* diskprobe.h — the raw sequential bandwidth of a directory, measured the
 * way the disk tier moves its data (`mnemo disk-probe DIR`).
 *
 * One probe writes a file of the given size under DIR with O_DIRECT through
 * cache/aio (the disk tier's Aio: AIO_BACKEND_AUTO, 1 MiB requests, 32 in
 * flight — tier_disk.c's DISK_CHUNK and default queue depth), fdatasyncs
 * it, reads it back sequentially the same way, checks what came back and
 * removes the file. Rates are in MB/s of 10^6 bytes; the write figure
 * includes the fdatasync. The disk tier's restore bandwidth that `mnemo
 * bench` reports from /metrics is meant to be compared with read_mbps.
 *
 * A tool above cache/ (docs/DESIGN.md, "Layout"): it drives cache/aio
 * directly, as the tier does. The command (`mnemo disk-probe`) is
 * tools/diskprobe_cmd.h; the tier's own restore rate, tools/tierprobe.h;
 * memory traffic beside a probe, tools/memload.h.
 */
#ifndef MN_TOOLS_DISKPROBE_H
#define MN_TOOLS_DISKPROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "cache/aio.h"

#define DISKPROBE_REQUEST_BYTES (1u << 20) /* as tier_disk.c's DISK_CHUNK */
#define DISKPROBE_QUEUE_DEPTH 32           /* as the disk tier's default */

typedef struct DiskProbeOpts {
    uint64_t request_bytes; /* bytes per aio request, a multiple of AIO_ALIGN; 0: 1 MiB */
    int queue_depth;        /* requests in flight; 0: 32 */
    AioBackend backend;     /* AIO_BACKEND_AUTO normally */
    /* Test hook: called once with the probe's Aio right after it is made
     * (e.g. to aio_fault_set a failure); NULL normally. */
    void (*aio_hook_fn)(Aio *a, void *ctx);
    void *aio_hook_ctx;
} DiskProbeOpts;

typedef struct DiskProbeResult {
    uint64_t bytes;          /* the file's size */
    double write_s, read_s;  /* wall time: writes + fdatasync; reads */
    double write_mbps, read_mbps; /* bytes / time / 10^6 */
    AioBackend backend;      /* the backend that ran (never AUTO) */
    bool is_direct;          /* O_DIRECT; false when the filesystem refused it
                                (the page cache is dropped before reading then) */
    double huge_share;       /* of the probe's buffers in huge pages, 0..1;
                                -1 when the kernel does not say (mn_huge_alloc) */
} DiskProbeResult;

/* Probe dir with a file of bytes (> 0, a multiple of AIO_ALIGN) and the
 * disk tier's request size and queue depth. MN_OK and *out; otherwise *out
 * is zeroed, err says what failed and where, and no file is left behind:
 * MN_ENOTFOUND (dir missing), MN_EINVAL (dir is not a directory, bad
 * sizes), MN_EFULL (no space for the file), MN_EFORMAT (the data read back
 * differs from what was written), MN_EIO, MN_ENOMEM. */
int diskprobe_run(const char *dir, uint64_t bytes, DiskProbeResult *out, MnErr *err);

/* The same with other request sizes, queue depth or backend (o may be NULL). */
int diskprobe_run_opts(const char *dir, uint64_t bytes, const DiskProbeOpts *o, DiskProbeResult *out, MnErr *err);

/* ---- raw reads sampled over time -------------------------------------------
 *
 * A disk reads slower while a server computes beside it (docs/OPERATIONS.md
 * has figures), so a probe taken before or after a serving run says little
 * about the disk while the server restored from it. diskprobe_sample
 * writes the file as diskprobe_run does, then reads it sample_bytes at a
 * time (front to back, and round again), each read timed alone, for as
 * long as `next` says: next(ctx, mbps) is called before every read with
 * the previous read's rate (negative before the first) and returns false
 * to stop; it also decides how long to wait between reads. */
typedef bool (*DiskSampleFn)(void *ctx, double last_read_mbps);

/* MN_OK and *out (write figures; read_s the reads' total time, read_mbps
 * 0); codes as diskprobe_run's, and MN_EINVAL when sample_bytes is not a
 * positive multiple of AIO_ALIGN up to bytes. The file is removed on
 * every path. */
int diskprobe_sample(const char *dir, uint64_t bytes, uint64_t sample_bytes, const DiskProbeOpts *o,
                     DiskSampleFn next, void *ctx, DiskProbeResult *out, MnErr *err);

/* ---- helpers the tier probe (tools/tierprobe.h) shares ----------------------- */

/* Fill p[0..n) with a fixed incompressible pattern (xorshift64; a tail of
 * n % 8 bytes is left as it is). */
void diskprobe_fill(uint8_t *p, uint64_t n);

/* MN_OK when dir is a directory; MN_ENOTFOUND (missing), MN_EINVAL (not a
 * directory) or MN_EIO, with err naming dir. */
int diskprobe_check_dir(const char *dir, MnErr *err);

/* Set err for a failure rc while doing `what` (a phrase: "writing the probe
 * file") under dir; a full disk (MN_EFULL) is said as such, with the
 * probe's size in MiB. Returns rc. */
int diskprobe_io_error(MnErr *err, int rc, const char *dir, const char *what, uint64_t bytes);

#endif
