/* tierprobe.c — the disk tier's restore rate, measured alone (see
 * tierprobe.h).
 *
 * A KvPool of one restore's blocks (runs_per_restore runs of run_blocks)
 * is filled with incompressible bytes once; every run is put from its
 * first run_blocks slots under hashes no two blocks share (run r, block
 * i), until about `bytes` are stored, with room enough in the tier that
 * nothing is evicted. The restores then read the runs back a group at a
 * time in a scattered order (a stride prime to the group count) into the
 * pool's slots, streamed like a serving restore. The time is the tier's
 * own read seconds from tier_stats, so what the probe does around the
 * reads is not counted.
 */
#include "tools/tierprobe.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/mem.h"
#include "cache/aio.h"
#include "cache/kv_pool.h"
#include "tools/diskprobe.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* Block i of run r: a hash no two blocks share. */
static Hash128 restore_hash(uint64_t run, int i) {
    uint64_t key[2] = {run, (uint64_t)i};
    return hash128(key, sizeof key);
}

/* Remove the tier's scratch directory: its slab files, then itself. */
static void remove_scratch(const char *path) {
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *de;
        char file[4096 + 256];
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            snprintf(file, sizeof file, "%s/%s", path, de->d_name);
            unlink(file);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Put n_runs runs of run_blocks blocks (from pool slots 0..run_blocks). */
static int restore_fill(Tier *t, KvPool *pool, int n_runs, int run_blocks, Hash128 *hashes, int32_t *slots) {
    for (int r = 0; r < n_runs; r++) {
        for (int i = 0; i < run_blocks; i++) {
            hashes[i] = restore_hash((uint64_t)r, i);
            slots[i] = i;
        }
        TierRunInfo info = {.pos = 0};
        int rc = tier_put_run(t, hashes, run_blocks, pool, slots, &info);
        if (rc != MN_OK) return rc;
    }
    return MN_OK;
}

static int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

/* Read the runs back rpr at a time, the groups in a scattered order (a
 * stride prime to their count), into pool slots 0..rpr*run_blocks. */
static int restore_read(Tier *t, KvPool *pool, int n_runs, int run_blocks, int rpr, Hash128 *hashes,
                        int32_t *slots, int *n_restores) {
    int n_groups = n_runs / rpr, stride = 1;
    for (int c = 7; c < n_groups; c++)
        if (gcd(c, n_groups) == 1) {
            stride = c;
            break;
        }
    for (int k = 0; k < n_groups; k++) {
        int g = (int)(((int64_t)k * stride) % n_groups), n = 0;
        for (int r = g * rpr; r < (g + 1) * rpr; r++)
            for (int i = 0; i < run_blocks; i++, n++) {
                hashes[n] = restore_hash((uint64_t)r, i);
                slots[n] = n;
            }
        int rc = tier_read_layers(t, hashes, n, pool, slots, NULL, NULL);
        if (rc != MN_OK) return rc;
        (*n_restores)++;
    }
    return MN_OK;
}

/* ---- the probe ------------------------------------------------------------------------ */

int tierprobe_run(const char *dir, uint64_t bytes, const TierProbeOpts *o, TierProbeResult *out, MnErr *err) {
    memset(out, 0, sizeof *out);
    TierProbeOpts opts = o ? *o : (TierProbeOpts){0};
    int run_blocks = opts.run_blocks > 0 ? opts.run_blocks : 5;
    int rpr = opts.runs_per_restore > 0 ? opts.runs_per_restore : 2;
    int n_layer = opts.n_layer > 0 ? opts.n_layer : TIERPROBE_N_LAYER;
    int kv_dim = opts.kv_dim > 0 ? opts.kv_dim : TIERPROBE_KV_DIM;
    int block_tokens = opts.block_tokens > 0 ? opts.block_tokens : TIERPROBE_BLOCK_TOKENS;
    if (run_blocks > 4096 || rpr > 64)
        return mn_err_set(err, MN_EINVAL, "runs of %d blocks, %d per restore: too many", run_blocks, rpr);
    int rc = diskprobe_check_dir(dir, err);
    if (rc != MN_OK) return rc;
    KvPool pool;
    rc = kvpool_init(&pool, n_layer, kv_dim, block_tokens, run_blocks * rpr, MN_TYPE_F16);
    if (rc != MN_OK) return mn_err_set(err, rc, "the restore probe's pool: %s", mn_strerror(rc));
    uint64_t run_bytes = (uint64_t)run_blocks * pool.block_bytes * (uint64_t)n_layer;
    uint64_t n_runs = bytes / run_bytes / (uint64_t)rpr * (uint64_t)rpr;
    uint64_t stored = n_runs * (run_bytes + (uint64_t)AIO_ALIGN * (uint64_t)n_layer);
    Hash128 *hashes = mn_malloc((size_t)(run_blocks * rpr) * sizeof *hashes);
    int32_t *slots = mn_malloc((size_t)(run_blocks * rpr) * sizeof *slots);
    char path[4096];
    bool has_dir = false;
    Tier *t = NULL;
    if (n_runs == 0 || n_runs > (1u << 20)) {
        rc = mn_err_set(err, MN_EINVAL, "%" PRIu64 " bytes hold no whole restore of %d runs of %" PRIu64 " bytes",
                        bytes, rpr, run_bytes);
        goto done;
    }
    if (hashes == NULL || slots == NULL) {
        rc = mn_err_set(err, MN_ENOMEM, "out of memory for the restore probe");
        goto done;
    }
    for (int l = 0; l < n_layer; l++) /* incompressible, like KV */
        diskprobe_fill(kvpool_k(&pool, l, 0), (uint64_t)pool.n_blocks * pool.block_bytes);
    if (snprintf(path, sizeof path, "%s/.mnemo-restore-probe-XXXXXX", dir) >= (int)sizeof path) {
        rc = mn_err_set(err, MN_EINVAL, "%s: path too long", dir);
        goto done;
    }
    if (mkdtemp(path) == NULL) {
        rc = mn_err_set(err, aio_errno_to_mn(errno), "%s: cannot make a scratch directory: %s", dir, strerror(errno));
        goto done;
    }
    has_dir = true;
    TierDiskConfig cfg = {.dir = path,
                          /* room for every run with its padding, and
                             for what the slabs' ends waste: none goes */
                          .capacity_bytes = stored + stored / 16 + (8u << 20),
                          .n_layer = n_layer,
                          .block_bytes = pool.block_bytes,
                          .aio_backend = AIO_BACKEND_AUTO};
    rc = tier_disk_new(&cfg, &t, err);
    if (rc != MN_OK) goto done;
    if (opts.tier_hook_fn) opts.tier_hook_fn(t, opts.tier_hook_ctx);
    rc = restore_fill(t, &pool, (int)n_runs, run_blocks, hashes, slots);
    if (rc != MN_OK) {
        rc = diskprobe_io_error(err, rc, dir, "storing the probe's runs", bytes);
        goto done;
    }
    TierStats before, after;
    tier_stats(t, &before);
    rc = restore_read(t, &pool, (int)n_runs, run_blocks, rpr, hashes, slots, &out->n_restores);
    if (rc != MN_OK) {
        rc = diskprobe_io_error(err, rc == MN_ECHECKSUM ? MN_EIO : rc, dir, "restoring the probe's runs", bytes);
        out->n_restores = 0;
        goto done;
    }
    tier_stats(t, &after);
    out->bytes = after.bytes_read - before.bytes_read;
    out->read_s = after.read_seconds - before.read_seconds;
    out->restore_mbps = out->read_s > 0 ? (double)out->bytes / out->read_s / 1e6 : 0;

done:
    tier_free(t);
    if (has_dir) remove_scratch(path);
    mn_free(hashes);
    mn_free(slots);
    kvpool_deinit(&pool);
    return rc;
}
