/* test_tier_util.h — what the tier tests share (test_aio, test_tier,
 * test_tier_read, test_tier_faults, test_tier_persist, test_tier_dir), and
 * the pool helpers test_mover uses too: blocks whose content is a pure function of (id, layer), tier
 * fixtures of every kind (RAM, disk over io_uring, disk over the sync
 * backend) and of a disk tier over a CacheStore, puts and checked reads of
 * runs, drop and layer callbacks that record what they saw, and damage
 * done to a tier's files (test_util.h has test_corrupt_slabs). Header-only; its functions are static inline, so
 * a test that uses some of them is not warned about the rest.
 */
#ifndef MN_TEST_TIER_UTIL_H
#define MN_TEST_TIER_UTIL_H

#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/mem.h"
#include "base/rng.h"
#include "cache/aio.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "cache/purge.h"
#include "cache/store.h"
#include "cache/tier.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- helpers ------------------------------------------------------------- */

/* A block hash that carries its id in the first four bytes. */
static inline Hash128 h_of(uint32_t id) {
    Hash128 h;
    memset(h.b, 0xa5, 16);
    for (int i = 0; i < 4; i++) h.b[i] = (uint8_t)(id >> (8 * i));
    return h;
}

static inline uint32_t id_of(const Hash128 *h) {
    return (uint32_t)h->b[0] | (uint32_t)h->b[1] << 8 | (uint32_t)h->b[2] << 16 | (uint32_t)h->b[3] << 24;
}

/* The content of block `id` in layer l: a pure function of (id, l). */
static inline void content_of(uint32_t id, int layer, uint8_t *out, size_t n) {
    uint64_t s = ((uint64_t)id << 20) ^ (uint64_t)layer * 0x51ed27u;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rng_splitmix64(&s);
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(out + i, &v, k);
    }
}

static inline void fill_slot(KvPool *p, int32_t slot, uint32_t id) {
    for (int l = 0; l < p->n_layer; l++) content_of(id, l, kvpool_k(p, l, slot), p->block_bytes);
}

/* Whether the n bytes at got are block `id`'s in layer l (content_of). */
static inline bool bytes_are(uint32_t id, int layer, const void *got, size_t n) {
    uint8_t want[8192];
    assert_true(n <= sizeof want);
    content_of(id, layer, want, n);
    return memcmp(want, got, n) == 0;
}

static inline bool slot_is(const KvPool *p, int layer, int32_t slot, uint32_t id) {
    return bytes_are(id, layer, kvpool_k(p, layer, slot), p->block_bytes);
}

/* The hidden rows of block `id` in layer l: another id's content, so
 * that neither is taken for the other. */
#define HIDDEN_ID(id) ((id) ^ 0x40000u)

static inline void fill_hidden(KvPool *p, int32_t slot, uint32_t id) {
    for (int l = 0; l < p->n_hidden_layers; l++) content_of(HIDDEN_ID(id), l, kvpool_h(p, l, slot), p->hidden_bytes);
}

static inline bool hidden_is(const KvPool *p, int layer, int32_t slot, uint32_t id) {
    return bytes_are(HIDDEN_ID(id), layer, kvpool_h(p, layer, slot), p->hidden_bytes);
}

static inline void scramble_pool(KvPool *p, uint64_t seed) {
    for (int l = 0; l < p->n_layer; l++)
        for (size_t i = 0; i < (size_t)p->n_blocks * p->block_bytes; i++) p->arenas[l][i] = (uint8_t)rng_splitmix64(&seed);
}

/* ---- tiers under test ------------------------------------------------------ */

typedef enum { KIND_RAM, KIND_DISK } Kind;

typedef struct Param {
    Kind kind;
    AioBackend backend;
} Param;

static const Param P_RAM = {KIND_RAM, AIO_BACKEND_AUTO};
static const Param P_DISK_URING = {KIND_DISK, AIO_BACKEND_URING};
static const Param P_DISK_SYNC = {KIND_DISK, AIO_BACKEND_SYNC};
static const Param P_URING = {KIND_DISK, AIO_BACKEND_URING};
static const Param P_SYNC = {KIND_DISK, AIO_BACKEND_SYNC};

typedef struct Fixture {
    Tier *tier;
    char dir[64];
    bool has_dir;
} Fixture;

/* Bytes a run of n blocks takes in this kind of tier. */
static inline uint64_t run_bytes(const Param *pa, const KvPool *p, int n) {
    uint64_t payload = (uint64_t)n * p->block_bytes;
    if (pa->kind == KIND_DISK) payload = (payload + 4095) & ~(uint64_t)4095;
    return payload * (uint64_t)p->n_layer;
}

/* A tier of this kind; a disk tier keeps read_window bytes of a streamed
 * read in flight (0: its default). */
static inline void fx_open_window(Fixture *fx, const Param *pa, const KvPool *p, uint64_t capacity, uint64_t slab_bytes,
                           bool is_durable, uint64_t read_window) {
    memset(fx, 0, sizeof *fx);
    if (pa->kind == KIND_RAM) {
        assert_int_equal(tier_ram_new_hidden(p->n_layer, p->block_bytes, p->hidden_bytes, capacity, &fx->tier), MN_OK);
        return;
    }
    strcpy(fx->dir, "/tmp/mnemo-tier-XXXXXX");
    assert_non_null(mkdtemp(fx->dir));
    fx->has_dir = true;
    TierDiskConfig cfg = {
        .dir = fx->dir,
        .capacity_bytes = capacity,
        .n_layer = p->n_layer,
        .block_bytes = p->block_bytes,
        .hidden_bytes = p->hidden_bytes,
        .kv_format = 1 | (uint32_t)p->block_tokens << 8,
        .slab_bytes = slab_bytes,
        .aio_backend = pa->backend,
        .queue_depth = 4,
        .read_inflight = 2, /* streamed reads use the aio's queue */
        .read_window_bytes = read_window,
        .is_durable = is_durable,
    };
    memset(cfg.model_fingerprint.b, 0x3c, 16);
    MnErr err = {0};
    int rc = tier_disk_new(&cfg, &fx->tier, &err);
    if (rc != MN_OK) fail_msg("tier_disk_new: %s", err.msg);
    Aio *a = tier_disk_aio(fx->tier);
    assert_non_null(a);
    assert_int_equal(aio_backend(a), pa->backend);
}

static inline void fx_open(Fixture *fx, const Param *pa, const KvPool *p, uint64_t capacity, uint64_t slab_bytes,
                    bool is_durable) {
    fx_open_window(fx, pa, p, capacity, slab_bytes, is_durable, 0);
}

static inline void fx_close(Fixture *fx) {
    tier_free(fx->tier);
    fx->tier = NULL;
    if (fx->has_dir) test_rm_dir(fx->dir);
}

/* Put blocks ids[0..n) from pool slots (filled with their content here). */
static inline int put_ids_at(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, int32_t pos) {
    Hash128 h[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) {
        h[i] = h_of(ids[i]);
        fill_slot(p, slots[i], ids[i]);
    }
    TierRunInfo info = {.pos = pos};
    return tier_put_run(t, h, n, p, slots, &info);
}

static inline int put_ids(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n) {
    return put_ids_at(t, p, ids, slots, n, 0);
}

/* Put blocks first .. first+n-1 as a run whose first token is at pos. */
static inline int put_range_at(Tier *t, KvPool *p, uint32_t first, int n, int32_t first_slot, int32_t pos) {
    uint32_t ids[64];
    int32_t slots[64];
    for (int i = 0; i < n; i++) {
        ids[i] = first + (uint32_t)i;
        slots[i] = (first_slot + i) % p->n_blocks;
    }
    return put_ids_at(t, p, ids, slots, n, pos);
}

static inline int put_range(Tier *t, KvPool *p, uint32_t first, int n, int32_t first_slot) {
    return put_range_at(t, p, first, n, first_slot, 0);
}

static inline int read_ids(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, int layer) {
    Hash128 h[64];
    for (int i = 0; i < n; i++) h[i] = h_of(ids[i]);
    return tier_read_layer(t, h, n, layer, p, slots);
}

/* Read every layer of ids [first, first+n) into slots from `dst` on and
 * check the bytes. */
static inline void expect_range(Tier *t, KvPool *p, uint32_t first, int n, int32_t dst) {
    uint32_t ids[64];
    int32_t slots[64];
    for (int i = 0; i < n; i++) {
        ids[i] = first + (uint32_t)i;
        slots[i] = (dst + i) % p->n_blocks;
    }
    for (int l = 0; l < p->n_layer; l++) {
        int rc = read_ids(t, p, ids, slots, n, l);
        if (rc != MN_OK) {
            tier_dump(t);
            fail_msg("read layer %d of %u..%u: %s", l, first, first + (uint32_t)n - 1, mn_strerror(rc));
        }
        for (int i = 0; i < n; i++) assert_true(slot_is(p, l, slots[i], ids[i]));
    }
}

/* The fault sweeps fail allocation k = 0, 1, ... in turn until the
 * operation meets none. One that still fails after this many is broken
 * (say, an allocation per retry), not slow: fail rather than spin. */
enum { SWEEP_MAX = 1000 };
static inline void sweep_bound(int k, const char *test) {
    if (k >= SWEEP_MAX) fail_msg("%s: still failing after %d allocations", test, k);
}

/* Drop callback that records what it saw. */
typedef struct Drops {
    int n_calls, n_blocks;
    TierDropReason last_why;
    uint32_t ids[256];
    bool *held; /* when set, clears the model's flags */
} Drops;

static inline void on_drop(void *ctx, const Hash128 *hashes, int n, TierDropReason why) {
    Drops *d = ctx;
    d->n_calls++;
    d->last_why = why;
    for (int i = 0; i < n; i++) {
        uint32_t id = id_of(&hashes[i]);
        if (d->n_blocks < 256) d->ids[d->n_blocks] = id;
        d->n_blocks++;
        if (d->held) d->held[id] = false;
    }
}

static inline bool dropped(const Drops *d, uint32_t id) {
    for (int i = 0; i < d->n_blocks && i < 256; i++)
        if (d->ids[i] == id) return true;
    return false;
}

/* ---- more fixtures and callbacks -------------------------------------------- */

/* A fresh directory in dir (a buffer of at least 32 bytes). */
static inline void make_tmp(char *dir) {
    strcpy(dir, "/tmp/mnemo-aio-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

/* Flip a bit of the byte at offset of the file at path, durably. */
static inline void corrupt_byte(const char *path, uint64_t offset) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)offset), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)offset), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* A TierLayerFn that checks, as each layer is reported, that the layers
 * come in order, that the reported layer of every block is in place, and
 * that the next one has not been written yet (the pool was scrambled). */
typedef struct LayerLog {
    const KvPool *p;
    const uint32_t *ids;
    const int32_t *slots;
    int n;
    int n_calls;
} LayerLog;

static inline void on_layer(void *ctx, int layer) {
    LayerLog *lg = ctx;
    assert_int_equal(layer, lg->n_calls);
    lg->n_calls++;
    for (int i = 0; i < lg->n; i++) assert_true(slot_is(lg->p, layer, lg->slots[i], lg->ids[i]));
    if (layer + 1 < lg->p->n_layer) assert_false(slot_is(lg->p, layer + 1, lg->slots[0], lg->ids[0]));
}

static inline int read_all_layers(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, LayerLog *lg) {
    Hash128 h[64];
    for (int i = 0; i < n; i++) h[i] = h_of(ids[i]);
    *lg = (LayerLog){p, ids, slots, n, 0};
    return tier_read_layers(t, h, n, p, slots, on_layer, lg);
}

/* Put a run of 4 blocks (first .. first+3, at pos) into a tier with room
 * for three; the run it evicts must be the one holding `victim`. */
static inline void put_evicts(Tier *t, KvPool *p, Drops *d, uint32_t first, int32_t pos, uint32_t victim) {
    d->n_calls = d->n_blocks = 0;
    assert_int_equal(put_range_at(t, p, first, 4, (int32_t)first % p->n_blocks, pos), MN_OK);
    tier_check(t);
    assert_int_equal(d->n_calls, 1);
    assert_int_equal(d->n_blocks, 4);
    if (!dropped(d, victim)) fail_msg("putting run %u evicted run %u, not %u", first, d->ids[0], victim);
}

/* Runs of 4 in the order B (blocks 100.., at position 256), A (0.., at 0:
 * leading, the cheapest) and C (200.., at 128), then given one last use
 * (in that order, so LRU still sees B, A, C): pensieve divides a run's
 * cost by its idle time, and how long the puts took (a loaded machine
 * stretches them) must not decide between runs its positions order. */
static inline void put_bac(Tier *t, KvPool *p) {
    assert_int_equal(put_range_at(t, p, 100, 4, 0, 256), MN_OK);
    assert_int_equal(put_range_at(t, p, 0, 4, 4, 0), MN_OK);
    assert_int_equal(put_range_at(t, p, 200, 4, 8, 128), MN_OK);
    Hash128 bac[3] = {h_of(100), h_of(0), h_of(200)};
    assert_int_equal(tier_touch(t, bac, 3, mn_wall_now()), 3);
}

/* Sleep a little so that wall-clock stamps before and after differ. */
static inline void tick(void) {
    struct timespec ts = {0, 3 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

typedef struct Listed {
    int n_runs;
    int n_blocks[16];
    uint32_t first[16];
    uint32_t ids[16][16];
} Listed;

static inline void on_run(void *ctx, const Hash128 *hashes, int n) {
    Listed *l = ctx;
    assert_true(l->n_runs < 16 && n <= 16);
    l->n_blocks[l->n_runs] = n;
    l->first[l->n_runs] = n > 0 ? id_of(&hashes[0]) : 0;
    for (int i = 0; i < n; i++) l->ids[l->n_runs][i] = id_of(&hashes[i]);
    l->n_runs++;
}

/* A disk tier over a CacheStore, on a directory that outlives both. */
typedef struct PFix {
    char dir[64];
    AioBackend backend;
    uint64_t capacity, slab_bytes;
    bool is_durable;
    CacheStore *store;
    Tier *tier;
    Drops drops;
} PFix;

static inline StoreIdentity pool_identity(const KvPool *p) {
    StoreIdentity id = {.kv_format = 1 | (uint32_t)p->block_tokens << 8, .n_layer = p->n_layer,
                        .block_bytes = p->block_bytes};
    memset(id.model_fingerprint.b, 0x3c, 16); /* as fx_open */
    return id;
}

static inline TierDiskConfig pfx_config(const PFix *fx, const KvPool *p) {
    TierDiskConfig cfg = {
        .dir = fx->dir,
        .capacity_bytes = fx->capacity,
        .n_layer = p->n_layer,
        .block_bytes = p->block_bytes,
        .hidden_bytes = p->hidden_bytes,
        .kv_format = 1 | (uint32_t)p->block_tokens << 8,
        .slab_bytes = fx->slab_bytes,
        .aio_backend = fx->backend,
        .queue_depth = 4,
        .is_durable = fx->is_durable,
        .store = fx->store,
    };
    memset(cfg.model_fingerprint.b, 0x3c, 16);
    return cfg;
}

/* Open the store and the tier on fx->dir (as they are). */
static inline void pfx_open(PFix *fx, const KvPool *p) {
    StoreIdentity id = pool_identity(p);
    MnErr err = {0};
    int rc = store_open(fx->dir, &id, &fx->store, &err);
    if (rc != MN_OK) fail_msg("store_open: %s", err.msg);
    TierDiskConfig cfg = pfx_config(fx, p);
    rc = tier_disk_new(&cfg, &fx->tier, &err);
    if (rc != MN_OK) fail_msg("tier_disk_new: %s", err.msg);
    memset(&fx->drops, 0, sizeof fx->drops);
    tier_set_drop_fn(fx->tier, on_drop, &fx->drops);
    tier_check(fx->tier);
}

static inline void pfx_new(PFix *fx, const Param *pa, const KvPool *p, uint64_t capacity, uint64_t slab_bytes) {
    memset(fx, 0, sizeof *fx);
    strcpy(fx->dir, "/tmp/mnemo-persist-XXXXXX");
    assert_non_null(mkdtemp(fx->dir));
    fx->backend = pa->backend;
    fx->capacity = capacity;
    fx->slab_bytes = slab_bytes;
    fx->is_durable = true;
    pfx_open(fx, p);
}

static inline void pfx_close(PFix *fx) {
    tier_free(fx->tier);
    fx->tier = NULL;
    store_close(fx->store);
    fx->store = NULL;
}

static inline void pfx_reopen(PFix *fx, const KvPool *p) {
    pfx_close(fx);
    pfx_open(fx, p);
}

static inline void expect_held(Tier *t, uint32_t first, int n, bool held) {
    for (int i = 0; i < n; i++) {
        Hash128 h = h_of(first + (uint32_t)i);
        if (tier_has(t, &h) != held) {
            tier_dump(t);
            fail_msg("block %u: held %d, want %d", first + (uint32_t)i, !held, held);
        }
    }
}

/* ---- cmocka lists ---------------------------------------------------------------- */

/* A test run against every kind of tier, or against both disk backends;
 * its state is the Param. */
#define TIER_TESTS(f)                                                                                               \
    cmocka_unit_test_prestate(f, (void *)&P_RAM), cmocka_unit_test_prestate(f, (void *)&P_DISK_URING),              \
        cmocka_unit_test_prestate(f, (void *)&P_DISK_SYNC)
#define DISK_TESTS(f)                                                                                               \
    cmocka_unit_test_prestate(f, (void *)&P_DISK_URING), cmocka_unit_test_prestate(f, (void *)&P_DISK_SYNC)

#endif
