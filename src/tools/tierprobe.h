/* tierprobe.h — the disk tier's own restore rate, measured alone.
 *
 * tierprobe_run makes a fresh disk tier (cache/tier.h) in a scratch
 * directory under DIR, with blocks of a model's KV shape (by default the
 * 1.1B llama `make bench` serves: 22 layers, blocks of 32 tokens of a
 * 256-wide f16 K and V, 32 KiB per block and layer), puts runs of
 * run_blocks blocks until about `bytes` are stored, then reads them back
 * runs_per_restore runs at a time with tier_read_layers (streamed, every
 * layer) in a scattered order, as a conversation's turns come back. The
 * figure is the tier's own: bytes read over read seconds (TierStats, what
 * /metrics reports), so beside a raw read of the same directory
 * (tools/diskprobe.h) it tells the restore path's efficiency apart from
 * what serving adds (compute on the same cores, other I/O).
 *
 * One call owns its tier, pool and scratch directory; nothing is shared.
 */
#ifndef MN_TOOLS_TIERPROBE_H
#define MN_TOOLS_TIERPROBE_H

#include <stdint.h>

#include "base/err.h"
#include "cache/tier.h"

/* The default shape: the 1.1B model's KV (scripts/bench). */
#define TIERPROBE_N_LAYER 22
#define TIERPROBE_KV_DIM 256 /* 4 KV heads of 64 */
#define TIERPROBE_BLOCK_TOKENS 32

typedef struct TierProbeOpts {
    int run_blocks;       /* blocks per run (one turn's save); 0: 5 */
    int runs_per_restore; /* 0: 2 */
    int n_layer;          /* the KV shape (f16); 0: TIERPROBE_N_LAYER */
    int kv_dim;           /* 0: TIERPROBE_KV_DIM */
    int block_tokens;     /* 0: TIERPROBE_BLOCK_TOKENS */
    /* Test hook: called once with the tier right after it is made; NULL normally. */
    void (*tier_hook_fn)(Tier *t, void *ctx);
    void *tier_hook_ctx;
} TierProbeOpts;

typedef struct TierProbeResult {
    uint64_t bytes;      /* read by the restores (whole extents) */
    int n_restores;
    double read_s;       /* the tier's read seconds */
    double restore_mbps; /* bytes / read_s / 10^6 */
} TierProbeResult;

/* Measure as above (o may be NULL; bytes >= one restore's worth). MN_OK
 * and *out; otherwise *out is zeroed and err says what failed:
 * MN_ENOTFOUND (dir missing), MN_EINVAL (not a directory, sizes that hold
 * no whole restore, too many blocks), MN_EFULL (no space), MN_EIO (a
 * failed read or checksum), MN_ENOMEM. The scratch directory and its
 * files are removed on every path. */
int tierprobe_run(const char *dir, uint64_t bytes, const TierProbeOpts *o, TierProbeResult *out, MnErr *err);

#endif
