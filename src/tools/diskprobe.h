/* diskprobe.h — `mnemo disk-probe DIR`: the raw sequential bandwidth of a
 * directory, measured the way the disk tier moves its data.
 *
 * One probe writes a file of the given size under DIR with O_DIRECT through
 * cache/aio (the disk tier's Aio: AIO_BACKEND_AUTO, 1 MiB requests, 32 in
 * flight — tier_disk.c's DISK_CHUNK and default queue depth), fdatasyncs
 * it, reads it back sequentially the same way, checks what came back and
 * removes the file. Rates are in MB/s of 10^6 bytes; the write figure
 * includes the fdatasync. The disk tier's restore bandwidth that `mnemo
 * bench` reports from /metrics is meant to be compared with read_mbps.
 */
#ifndef MN_TOOLS_DISKPROBE_H
#define MN_TOOLS_DISKPROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "cache/aio.h"
#include "cache/tier.h"

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
                                -1 when the kernel does not say (aio_buf_new) */
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
 * A disk reads slower while a server computes beside it (on this machine
 * ~2.2-2.9 GB/s for 8 MiB reads against ~3.3 idle), so a probe taken
 * before or after a serving run says little about the disk while the
 * server restored from it. diskprobe_sample
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

/* ---- the disk tier's own restore path ---------------------------------------
 *
 * diskprobe_restore measures what the tier does with a restore, alone: a
 * fresh disk tier (cache/tier.h) in a scratch directory under DIR, blocks
 * of the 1.1B model's shape (22 layers, 32 tokens of a 256-wide f16 K and V:
 * 32 KiB per block and layer), runs of run_blocks blocks put until about
 * `bytes` are stored, then read back runs_per_restore runs at a time with
 * tier_read_layers (streamed, every layer) in a scattered order, as a
 * conversation's turns come back. The figure is the tier's own: bytes read
 * over read seconds (TierStats, what /metrics reports), so beside a raw
 * read of the same directory it tells the restore path's efficiency apart
 * from what serving adds (compute on the same cores, other I/O). */
typedef struct DiskRestoreOpts {
    int run_blocks;       /* blocks per run (one turn's save); 0: 5 */
    int runs_per_restore; /* 0: 2 */
    /* Test hook: called once with the tier right after it is made; NULL normally. */
    void (*tier_hook_fn)(Tier *t, void *ctx);
    void *tier_hook_ctx;
} DiskRestoreOpts;

typedef struct DiskRestoreResult {
    uint64_t bytes;      /* read by the restores (whole extents) */
    int n_restores;
    double read_s;       /* the tier's read seconds */
    double restore_mbps; /* bytes / read_s / 10^6 */
} DiskRestoreResult;

/* Measure as above (bytes >= one restore's worth). MN_OK and *out;
 * otherwise *out is zeroed and err says what failed. The scratch
 * directory and its files are removed on every path. Codes as
 * diskprobe_run's; a restore that fails (checksum, I/O) is MN_EIO. */
int diskprobe_restore(const char *dir, uint64_t bytes, const DiskRestoreOpts *o, DiskRestoreResult *out,
                      MnErr *err);

/* The command: argv[0] is the first argument after "disk-probe". Prints
 *   disk-probe DIR: write W MB/s, read R MB/s (N MiB, BACKEND)
 *   read_mbps=R write_mbps=W
 * and with --restore also
 *   disk-probe DIR: the disk tier restores at T MB/s, X of the raw read
 *     (K restores of 2 runs x 5 blocks, M MB)
 *   restore_mbps=T
 * and returns 0; 1 when the probe failed (a message on stderr), 2 for bad
 * options. */
int diskprobe_main(int argc, char **argv);

/* ---- memory traffic beside a probe -------------------------------------------
 *
 * The disk's DMA shares the memory bus with the cores. While a server
 * computes, its matmuls stream the model's weights on every core, and raw
 * reads of the same directory may slow with them (here 0.7-0.97 of the
 * idle rate under two copying threads, run to run; two threads spinning
 * without touching memory changed nothing). A probe under such a load
 * says what the disk gives while the server computes: `disk-probe
 * --memory-load N`.
 *
 * diskprobe_load_start starts n_threads (1..DISKPROBE_LOAD_MAX) threads,
 * each copying DISKPROBE_LOAD_BYTES back and forth between two buffers of
 * its own until diskprobe_load_stop, which tells them through a pipe and
 * joins them. MN_EINVAL, MN_ENOMEM (buffers, threads); *out is NULL on
 * failure, with nothing left running. */
#define DISKPROBE_LOAD_MAX 64
#define DISKPROBE_LOAD_BYTES (64u << 20)

typedef struct MemLoad MemLoad;
int diskprobe_load_start(int n_threads, MemLoad **out, MnErr *err);
/* Stop and free; the bytes copied per second over the load's life
 * (0 for NULL). */
double diskprobe_load_stop(MemLoad *l);

#endif
