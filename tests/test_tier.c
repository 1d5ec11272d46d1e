/* test_tier.c — the tiers below the pool and their aio layer.
 *
 * aio: batches larger than the queue depth round-trip bit for bit, both
 * backends; misaligned requests are refused; end of file, injected ENOSPC,
 * EDQUOT and EIO come back as the right MN_* codes; an O_DIRECT open that
 * fails with EINVAL falls back to buffered.
 * Tiers (RAM, disk over io_uring, disk over the sync backend): runs of a
 * real KvPool with random contents come back bit-exact, layer by layer,
 * into other slots and across runs; LRU eviction under a small budget;
 * has / locate / drop / drop_run and re-put semantics; stats counters.
 * Disk only: a corrupted byte is a checksum failure (counted, run dropped,
 * tier still working), a truncated file too; ENOSPC (injected into writes
 * and into the slab's fallocate) refuses the put with MN_EFULL and the
 * tier keeps working; EIO is sticky until tier_reset. A randomized test
 * runs each tier beside a trivially correct model (block id -> content,
 * held or not) and compares every result.
 * Expiry (every tier): tier_expire drops what was not used since a cutoff
 * (a layer-0 read counts as use), reported as TIER_DROP_EXPIRED;
 * tier_foreach_run lists the live blocks in LRU order.
 * Persistence (disk over a CacheStore): after freeing tier and store and
 * opening both again the same blocks are held in the same runs, bit for
 * bit, in the same order of use, and new run ids continue above the old;
 * a corrupted extent fails its checksum when read and its row goes; rows
 * that are damaged, misfiled, of another model, outside their slab or
 * overlapping a later run are dropped at open; a truncated slab file loses
 * its runs (never served); a smaller budget drops the least recently used
 * runs and removes empty slab files past it; a failed row commit stores
 * nothing (SQLITE_FULL not sticky, an I/O error sticky); a copy of the
 * directory taken while open (a crash image) opens to the committed
 * state; and a child process SIGKILLed at arbitrary moments, four times
 * over one directory, leaves every completed put served exactly.
 * Data at rest: the directory is made 0700 and every file in it 0600
 * whatever the umask, an earlier mnemo's readable ones are tightened; a
 * directory others can write, or another user's, or a symlink in a cache
 * file's place is refused. purge_disk_tier erases one namespace — its runs
 * are not held afterwards, and a raw look at the slab, database and WAL
 * bytes finds neither its KV (nor an earlier dropped run's) nor its reply
 * text, while the other namespace's runs read back exact — and is refused
 * while a server holds the directory.
 */
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
#include "cache/aio.h"
#include "cache/index.h"
#include "cache/kv_pool.h"
#include "cache/purge.h"
#include "cache/store.h"
#include "cache/tier.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- helpers ------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A block hash that carries its id in the first four bytes. */
static Hash128 h_of(uint32_t id) {
    Hash128 h;
    memset(h.b, 0xa5, 16);
    for (int i = 0; i < 4; i++) h.b[i] = (uint8_t)(id >> (8 * i));
    return h;
}

static uint32_t id_of(const Hash128 *h) {
    return (uint32_t)h->b[0] | (uint32_t)h->b[1] << 8 | (uint32_t)h->b[2] << 16 | (uint32_t)h->b[3] << 24;
}

/* The content of block `id` in layer l: a pure function of (id, l). */
static void content_of(uint32_t id, int layer, uint8_t *out, size_t n) {
    uint64_t s = ((uint64_t)id << 20) ^ (uint64_t)layer * 0x51ed27u;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = splitmix(&s);
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(out + i, &v, k);
    }
}

static void fill_slot(KvPool *p, int32_t slot, uint32_t id) {
    for (int l = 0; l < p->n_layer; l++) content_of(id, l, kvpool_k(p, l, slot), p->block_bytes);
}

static bool slot_is(const KvPool *p, int layer, int32_t slot, uint32_t id) {
    uint8_t want[8192];
    assert_true(p->block_bytes <= sizeof want);
    content_of(id, layer, want, p->block_bytes);
    return memcmp(want, kvpool_k(p, layer, slot), p->block_bytes) == 0;
}

static void scramble_pool(KvPool *p, uint64_t seed) {
    for (int l = 0; l < p->n_layer; l++)
        for (size_t i = 0; i < (size_t)p->n_blocks * p->block_bytes; i++) p->arenas[l][i] = (uint8_t)splitmix(&seed);
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
static uint64_t run_bytes(const Param *pa, const KvPool *p, int n) {
    uint64_t payload = (uint64_t)n * p->block_bytes;
    if (pa->kind == KIND_DISK) payload = (payload + 4095) & ~(uint64_t)4095;
    return payload * (uint64_t)p->n_layer;
}

/* A tier of this kind; a disk tier keeps read_window bytes of a streamed
 * read in flight (0: its default). */
static void fx_open_window(Fixture *fx, const Param *pa, const KvPool *p, uint64_t capacity, uint64_t slab_bytes,
                           bool is_durable, uint64_t read_window) {
    memset(fx, 0, sizeof *fx);
    if (pa->kind == KIND_RAM) {
        assert_int_equal(tier_ram_new(p->n_layer, p->block_bytes, capacity, &fx->tier), MN_OK);
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

static void fx_open(Fixture *fx, const Param *pa, const KvPool *p, uint64_t capacity, uint64_t slab_bytes,
                    bool is_durable) {
    fx_open_window(fx, pa, p, capacity, slab_bytes, is_durable, 0);
}

static void fx_close(Fixture *fx) {
    tier_free(fx->tier);
    fx->tier = NULL;
    if (fx->has_dir) test_rm_dir(fx->dir);
}

/* Put blocks ids[0..n) from pool slots (filled with their content here). */
static int put_ids_at(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, int32_t pos) {
    Hash128 h[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) {
        h[i] = h_of(ids[i]);
        fill_slot(p, slots[i], ids[i]);
    }
    TierRunInfo info = {.pos = pos};
    return tier_put_run(t, h, n, p, slots, &info);
}

static int put_ids(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n) {
    return put_ids_at(t, p, ids, slots, n, 0);
}

/* Put blocks first .. first+n-1 as a run whose first token is at pos. */
static int put_range_at(Tier *t, KvPool *p, uint32_t first, int n, int32_t first_slot, int32_t pos) {
    uint32_t ids[64];
    int32_t slots[64];
    for (int i = 0; i < n; i++) {
        ids[i] = first + (uint32_t)i;
        slots[i] = (first_slot + i) % p->n_blocks;
    }
    return put_ids_at(t, p, ids, slots, n, pos);
}

static int put_range(Tier *t, KvPool *p, uint32_t first, int n, int32_t first_slot) {
    return put_range_at(t, p, first, n, first_slot, 0);
}

static int read_ids(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, int layer) {
    Hash128 h[64];
    for (int i = 0; i < n; i++) h[i] = h_of(ids[i]);
    return tier_read_layer(t, h, n, layer, p, slots);
}

/* Read every layer of ids [first, first+n) into slots from `dst` on and
 * check the bytes. */
static void expect_range(Tier *t, KvPool *p, uint32_t first, int n, int32_t dst) {
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
static void sweep_bound(int k, const char *test) {
    if (k >= SWEEP_MAX) fail_msg("%s: still failing after %d allocations", test, k);
}

/* Drop callback that records what it saw. */
typedef struct Drops {
    int n_calls, n_blocks;
    TierDropReason last_why;
    uint32_t ids[256];
    bool *held; /* when set, clears the model's flags */
} Drops;

static void on_drop(void *ctx, const Hash128 *hashes, int n, TierDropReason why) {
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

static bool dropped(const Drops *d, uint32_t id) {
    for (int i = 0; i < d->n_blocks && i < 256; i++)
        if (d->ids[i] == id) return true;
    return false;
}

/* ---- aio ----------------------------------------------------------------- */

static void make_tmp(char *dir) {
    strcpy(dir, "/tmp/mnemo-aio-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void test_aio_roundtrip(void **state) {
    const Param *pa = *state;
    char dir[64], path[128];
    make_tmp(dir);
    snprintf(path, sizeof path, "%s/f.dat", dir);
    Aio *a;
    assert_int_equal(aio_new(pa->backend, 4, &a), MN_OK);
    assert_int_equal(aio_backend(a), pa->backend);
    AioFile f;
    assert_int_equal(aio_open(a, path, AIO_OPEN_CREATE | AIO_OPEN_TRUNC, &f), MN_OK);
    assert_true(f.is_direct); /* /tmp here is a disk filesystem */

    enum { N = 23 }; /* more than the queue depth; sizes 4..12 KiB */
    uint64_t seed = 7, off = 0;
    size_t total = 0;
    AioReq w[N], r[N];
    uint64_t offs[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        lens[i] = 4096u * (size_t)(1 + i % 3);
        offs[i] = off;
        off += lens[i];
        total += lens[i];
    }
    uint8_t *src = mn_alloc_aligned(total, 4096), *dst = mn_alloc_aligned(total, 4096);
    for (size_t i = 0; i < total; i++) src[i] = (uint8_t)splitmix(&seed);
    memset(dst, 0, total);
    for (int i = 0; i < N; i++)
        w[i] = (AioReq){.op = AIO_OP_WRITE, .file = &f, .buf = src + offs[i], .offset = offs[i], .len = lens[i],
                        .user = (void *)(intptr_t)i};
    assert_int_equal(aio_submit(a, w, N), MN_OK);
    assert_int_equal(aio_n_outstanding(a), N);
    /* hand-back in pieces: at least 5, at most 7 each time */
    int seen = 0;
    bool got[N] = {0};
    while (seen < N) {
        AioReq *done[7];
        int n;
        int min = N - seen < 5 ? N - seen : 5;
        assert_int_equal(aio_wait(a, min, 7, done, &n), MN_OK);
        assert_true(n >= min && n <= 7);
        for (int k = 0; k < n; k++) {
            assert_int_equal(done[k]->result, MN_OK);
            int i = (int)(intptr_t)done[k]->user;
            assert_false(got[i]);
            got[i] = true;
        }
        seen += n;
    }
    assert_int_equal(aio_n_outstanding(a), 0);
    AioReq *none[1];
    int n_none;
    assert_int_equal(aio_wait(a, 1, 1, none, &n_none), MN_EINVAL); /* nothing outstanding */
    assert_int_equal(aio_fdatasync(a, &f), MN_OK);

    for (int i = 0; i < N; i++)
        r[i] = (AioReq){.op = AIO_OP_READ, .file = &f, .buf = dst + offs[i], .offset = offs[i], .len = lens[i]};
    assert_int_equal(aio_run(a, r, N), MN_OK);
    assert_memory_equal(src, dst, total);

    /* one large request, longer than one chunk of anything */
    aio_close(&f);
    aio_close(&f); /* twice is fine */
    assert_int_equal(aio_open(a, path, AIO_OPEN_RDONLY, &f), MN_OK);
    memset(dst, 0, total);
    AioReq big = {.op = AIO_OP_READ, .file = &f, .buf = dst, .offset = 0, .len = total};
    assert_int_equal(aio_run(a, &big, 1), MN_OK);
    assert_memory_equal(src, dst, total);

    aio_close(&f);
    aio_free(a);
    mn_free_aligned(src);
    mn_free_aligned(dst);
    test_rm_dir(dir);
}

/* A batch larger than the ring: aio_submit returns at once with the
 * rest waiting (before, it waited for the device to free room, and the
 * disk tier's stream placed nothing meanwhile), and each completion starts
 * the next. Reads of a pipe stay in flight until it is written, so a
 * submit that waited would never return: the alarm (no handler) then
 * kills the test binary, which fails the run.
 * aio_free with requests waiting and in flight returns once those in
 * flight finish (end of file here); the waiting ones never started. */
static void test_aio_submit_never_waits(void **state) {
    (void)state;
    Aio *a;
    assert_int_equal(aio_new(AIO_BACKEND_URING, 2, &a), MN_OK);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    AioFile in = {.fd = fds[0]};
    enum { N = 6, LEN = 4096 };
    uint8_t *buf = mn_alloc_aligned(N * LEN, 4096);
    memset(buf, 0xee, N * LEN);
    AioReq r[N];
    for (int i = 0; i < N; i++) r[i] = (AioReq){.op = AIO_OP_READ, .file = &in, .buf = buf + i * LEN, .len = LEN};
    alarm(TEST_HANG_GUARD_S); /* the whole test: a guard against a hang */
    assert_int_equal(aio_submit(a, r, N), MN_OK);
    assert_int_equal(aio_n_outstanding(a), N);
    AioReq *done[N];
    int n;
    assert_int_equal(aio_wait(a, 0, N, done, &n), MN_OK);
    assert_int_equal(n, 0); /* nothing has arrived */
    uint8_t chunk[LEN];
    for (int i = 0; i < N; i++) {
        memset(chunk, i, LEN);
        assert_int_equal(write(fds[1], chunk, LEN), LEN);
    }
    int seen = 0, firsts = 0;
    while (seen < N) {
        assert_int_equal(aio_wait(a, 1, N, done, &n), MN_OK);
        for (int k = 0; k < n; k++) {
            assert_int_equal(done[k]->result, MN_OK);
            const uint8_t *b = done[k]->buf;
            for (int j = 1; j < LEN; j++) assert_int_equal(b[j], b[0]);
            firsts |= 1 << b[0];
        }
        seen += n;
    }
    assert_int_equal(firsts, (1 << N) - 1); /* every chunk read once */
    assert_int_equal(aio_n_outstanding(a), 0);

    assert_int_equal(aio_submit(a, r, N), MN_OK);
    close(fds[1]);
    aio_free(a);
    close(fds[0]);

    /* the ring breaks as a completion hands it the next waiting request:
     * the wait fails, the Aio refuses everything after, and aio_free
     * returns (the request in flight finishes; the waiting ones never
     * started) */
    assert_int_equal(aio_new(AIO_BACKEND_URING, 2, &a), MN_OK);
    assert_int_equal(pipe(fds), 0);
    in.fd = fds[0];
    for (int i = 0; i < N; i++) {
        memset(chunk, i, LEN);
        assert_int_equal(write(fds[1], chunk, LEN), LEN);
    }
    /* ring checks: the submit's flush, then each wait, then the feed's flush */
    aio_fault_set(a, AIO_OP_RING, 2, 1, EIO);
    assert_int_equal(aio_submit(a, r, N), MN_OK);
    assert_int_equal(aio_wait(a, N, N, done, &n), MN_EIO);
    assert_int_equal(aio_submit(a, r, 1), MN_EIO);
    aio_free(a);
    close(fds[1]);
    close(fds[0]);
    mn_free_aligned(buf);
    alarm(0);
}

/* aio_set_inflight: with a limit of 2, six reads of a pipe put two in the
 * ring and each completion starts the next; raising the limit starts the
 * waiting ones at once, lowering it lets those in the ring finish; limits
 * outside 1..queue_depth are refused. aio_take_peak reports the most in
 * the ring since it last asked. The sync backend takes a limit and has
 * nothing in flight. */
static void test_aio_inflight_limit(void **state) {
    (void)state;
    Aio *a;
    assert_int_equal(aio_new(AIO_BACKEND_URING, 8, &a), MN_OK);
    assert_int_equal(aio_set_inflight(a, 0), MN_EINVAL);
    assert_int_equal(aio_set_inflight(a, 9), MN_EINVAL);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    AioFile in = {.fd = fds[0]};
    enum { N = 6, LEN = 4096 };
    uint8_t *buf = mn_alloc_aligned(N * LEN, 4096);
    AioReq r[N];
    for (int i = 0; i < N; i++) r[i] = (AioReq){.op = AIO_OP_READ, .file = &in, .buf = buf + i * LEN, .len = LEN};
    uint8_t chunk[LEN];
    memset(chunk, 7, LEN);
    alarm(TEST_HANG_GUARD_S); /* the whole test: a guard against a hang */
    assert_int_equal(aio_set_inflight(a, 2), MN_OK);
    assert_int_equal(aio_submit(a, r, N), MN_OK);
    assert_int_equal(aio_n_inflight(a), 2);
    assert_int_equal(aio_take_peak(a), 2);
    AioReq *done[N];
    int n;
    assert_int_equal(write(fds[1], chunk, LEN), LEN); /* one read can finish */
    assert_int_equal(aio_wait(a, 1, N, done, &n), MN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(aio_n_inflight(a), 2); /* the third took its place */
    assert_int_equal(aio_set_inflight(a, 8), MN_OK);
    assert_int_equal(aio_n_inflight(a), 5);
    assert_int_equal(aio_take_peak(a), 5);
    assert_int_equal(aio_set_inflight(a, 1), MN_OK);
    assert_int_equal(aio_n_inflight(a), 5);
    for (int i = 1; i < N; i++) assert_int_equal(write(fds[1], chunk, LEN), LEN);
    for (int seen = 1; seen < N; seen += n) assert_int_equal(aio_wait(a, 1, N, done, &n), MN_OK);
    assert_int_equal(aio_n_inflight(a), 0);
    assert_int_equal(aio_take_peak(a), 5); /* those in the ring when the limit went down */
    assert_int_equal(aio_submit(a, r, 3), MN_OK); /* the limit of 1 holds */
    assert_int_equal(aio_n_inflight(a), 1);
    for (int i = 0; i < 3; i++) assert_int_equal(write(fds[1], chunk, LEN), LEN);
    for (int seen = 0; seen < 3; seen += n) {
        assert_int_equal(aio_wait(a, 1, 1, done, &n), MN_OK);
        assert_true(aio_n_inflight(a) <= 1);
    }
    assert_int_equal(aio_take_peak(a), 1);
    aio_free(a);
    close(fds[1]);
    close(fds[0]);
    mn_free_aligned(buf);
    alarm(0);

    assert_int_equal(aio_new(AIO_BACKEND_SYNC, 4, &a), MN_OK);
    assert_int_equal(aio_set_inflight(a, 2), MN_OK);
    assert_int_equal(aio_set_inflight(a, 5), MN_EINVAL);
    assert_int_equal(aio_n_inflight(a), 0);
    aio_free(a);
}

/* Whether the mapping holding p carries the huge-page advice (VmFlags
 * "hg" in /proc/self/smaps). */
static bool mapping_advised_huge(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[512];
    bool inside = false, advised = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && strncmp(line, "VmFlags:", 8) == 0) advised = strstr(line, " hg") != NULL;
    }
    fclose(f);
    return advised;
}

/* Transfer buffers: aligned to and rounded up to AIO_BUF_ALIGN, zeroed,
 * writable to the end, advised for huge pages, carrying a read; the
 * refused sizes fail cleanly. */
static void test_aio_buf(void **state) {
    size_t cap = 1;
    assert_null(aio_buf_new(0, &cap));
    assert_int_equal(cap, 0);
    assert_null(aio_buf_new(SIZE_MAX, &cap));
    assert_int_equal(cap, 0);
    assert_null(aio_buf_new(SIZE_MAX / 2, &cap)); /* passes the size check; no kernel maps 2^63 bytes */
    assert_int_equal(cap, 0);

    size_t want = AIO_BUF_ALIGN + 4096;
    uint8_t *b = aio_buf_new(want, &cap);
    assert_non_null(b);
    assert_int_equal(cap, 2 * (size_t)AIO_BUF_ALIGN);
    assert_int_equal((uintptr_t)b % AIO_BUF_ALIGN, 0);
    for (size_t i = 0; i < cap; i += 4096) assert_int_equal(b[i], 0);
    assert_int_equal(b[cap - 1], 0);
    memset(b, 0xA5, cap);
    long long huge = aio_buf_huge_bytes(b, cap);
    assert_true(huge >= 0 && huge <= (long long)cap);
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (thp) {
        if (fgets(mode, sizeof mode, thp) == NULL) mode[0] = '\0';
        fclose(thp);
    }
    if (thp != NULL && strstr(mode, "[never]") == NULL) assert_true(mapping_advised_huge(b));
    else fprintf(stderr, "test_aio_buf: no transparent huge pages here; the advice is not checked\n");
    fprintf(stderr, "test_aio_buf: %lld of %zu bytes in huge pages\n", huge, cap);

    /* a read lands in it exactly */
    char dir[64], path[128];
    make_tmp(dir);
    snprintf(path, sizeof path, "%s/f.dat", dir);
    Aio *a;
    assert_int_equal(aio_new(AIO_BACKEND_AUTO, 4, &a), MN_OK);
    AioFile f;
    assert_int_equal(aio_open(a, path, AIO_OPEN_CREATE | AIO_OPEN_TRUNC, &f), MN_OK);
    AioReq w = {.op = AIO_OP_WRITE, .file = &f, .buf = b, .offset = 0, .len = cap};
    assert_int_equal(aio_run(a, &w, 1), MN_OK);
    memset(b, 0, cap);
    AioReq r = {.op = AIO_OP_READ, .file = &f, .buf = b + 4096, .offset = 4096, .len = cap - 8192};
    assert_int_equal(aio_run(a, &r, 1), MN_OK);
    assert_int_equal(b[0], 0);
    assert_int_equal(b[4096], 0xA5);
    assert_int_equal(b[cap - 4097], 0xA5);
    assert_int_equal(b[cap - 1], 0);
    aio_close(&f);
    aio_free(a);
    aio_buf_free(b, cap);
    assert_int_equal(aio_buf_huge_bytes(b, cap), -1); /* unmapped: nothing there to tell */
    aio_buf_free(NULL, 0);
    test_rm_dir(dir);
}

static void test_aio_errors(void **state) {
    const Param *pa = *state;
    char dir[64], path[128];
    make_tmp(dir);
    snprintf(path, sizeof path, "%s/f.dat", dir);
    Aio *a;
    assert_int_equal(aio_new(pa->backend, 2, &a), MN_OK);
    AioFile f;
    assert_int_equal(aio_open(a, path, AIO_OPEN_CREATE, &f), MN_OK);
    uint8_t *buf = mn_alloc_aligned(3 * 4096, 4096);
    memset(buf, 0x5a, 3 * 4096);

    /* misaligned: refused before anything runs */
    AioReq bad[3] = {
        {.op = AIO_OP_WRITE, .file = &f, .buf = buf + 512, .offset = 0, .len = 4096},
        {.op = AIO_OP_WRITE, .file = &f, .buf = buf, .offset = 100, .len = 4096},
        {.op = AIO_OP_WRITE, .file = &f, .buf = buf, .offset = 0, .len = 1000},
    };
    for (int i = 0; i < 3; i++) assert_int_equal(aio_submit(a, &bad[i], 1), MN_EINVAL);
    AioReq zero = {.op = AIO_OP_READ, .file = &f, .buf = buf, .offset = 0, .len = 0};
    assert_int_equal(aio_submit(a, &zero, 1), MN_EINVAL);
    assert_int_equal(aio_n_outstanding(a), 0);

    /* one page written; reading two meets end of file */
    AioReq w = {.op = AIO_OP_WRITE, .file = &f, .buf = buf, .offset = 0, .len = 4096};
    assert_int_equal(aio_run(a, &w, 1), MN_OK);
    AioReq r = {.op = AIO_OP_READ, .file = &f, .buf = buf, .offset = 0, .len = 2 * 4096};
    assert_int_equal(aio_run(a, &r, 1), MN_EFORMAT);
    r.offset = 8 * 4096;
    r.len = 4096;
    assert_int_equal(aio_run(a, &r, 1), MN_EFORMAT);

    /* injected failures, converted at the edge */
    aio_fault_set(a, AIO_OP_WRITE, 1, 1, ENOSPC); /* the second write fails */
    AioReq ws[3];
    for (int i = 0; i < 3; i++)
        ws[i] = (AioReq){.op = AIO_OP_WRITE, .file = &f, .buf = buf + 4096 * i, .offset = 4096u * (unsigned)i,
                         .len = 4096};
    assert_int_equal(aio_run(a, ws, 3), MN_EFULL);
    assert_int_equal(ws[0].result, MN_OK);
    assert_int_equal(ws[1].result, MN_EFULL);
    assert_int_equal(ws[2].result, MN_OK);
    aio_fault_set(a, AIO_OP_WRITE, 0, 1, EDQUOT);
    assert_int_equal(aio_run(a, &w, 1), MN_EFULL);
    assert_int_equal(aio_run(a, &w, 1), MN_OK); /* the fault is used up */
    aio_fault_set(a, AIO_OP_READ, 0, 1, EIO);
    r.offset = 0;
    assert_int_equal(aio_run(a, &r, 1), MN_EIO);
    aio_fault_set(a, AIO_OP_FDATASYNC, 0, 1, EIO);
    assert_int_equal(aio_fdatasync(a, &f), MN_EIO);
    assert_int_equal(aio_fdatasync(a, &f), MN_OK);
    aio_fault_set(a, AIO_OP_FALLOCATE, 0, 1, ENOSPC);
    assert_int_equal(aio_fallocate(a, &f, 4096, 4096), MN_EFULL);
    assert_int_equal(aio_fallocate(a, &f, 4096, 1 << 20), MN_OK);
    struct stat st;
    assert_int_equal(fstat(f.fd, &st), 0);
    assert_true(st.st_size >= 4096 + (1 << 20));
    aio_fault_set(a, AIO_OP_WRITE, 0, 5, ENOSPC);
    aio_fault_set(a, 0, 0, 0, 0); /* cleared */
    assert_int_equal(aio_run(a, &w, 1), MN_OK);
    aio_close(&f);

    /* a filesystem that refuses O_DIRECT: buffered instead */
    aio_fault_set(a, AIO_OP_OPEN, 0, 1, EINVAL);
    assert_int_equal(aio_open(a, path, 0, &f), MN_OK);
    assert_false(f.is_direct);
    assert_int_equal(aio_run(a, &w, 1), MN_OK);
    aio_close(&f);
    assert_int_equal(aio_open(a, path, AIO_OPEN_BUFFERED, &f), MN_OK);
    assert_false(f.is_direct);
    aio_close(&f);
    aio_fault_set(a, AIO_OP_OPEN, 0, 1, EACCES);
    assert_int_equal(aio_open(a, path, 0, &f), MN_EIO);
    assert_int_equal(f.fd, -1);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/no/such", dir);
    assert_int_equal(aio_open(a, missing, AIO_OPEN_CREATE, &f), MN_ENOTFOUND);

    assert_int_equal(aio_errno_to_mn(ENOSPC), MN_EFULL);
    assert_int_equal(aio_errno_to_mn(EIO), MN_EIO);
    assert_int_equal(aio_errno_to_mn(ENOMEM), MN_ENOMEM);
    assert_int_equal(aio_errno_to_mn(0), MN_OK);
    assert_string_equal(aio_backend_name(pa->backend), pa->backend == AIO_BACKEND_URING ? "io_uring" : "sync");

    aio_free(a);
    mn_free_aligned(buf);
    test_rm_dir(dir);
}

/* A ring that breaks with reads in flight: aio_free still waits until
 * the kernel is done with their buffers (every byte is in place when it
 * returns), and does not wait for requests a failed submit left queued. */
static void test_aio_ring_broken(void **state) {
    (void)state;
    char dir[64], path[128];
    make_tmp(dir);
    snprintf(path, sizeof path, "%s/f.dat", dir);
    enum { N = 8, LEN = 1 << 20 };
    Aio *a;
    assert_int_equal(aio_new(AIO_BACKEND_URING, N, &a), MN_OK);
    AioFile f;
    assert_int_equal(aio_open(a, path, AIO_OPEN_CREATE | AIO_OPEN_TRUNC, &f), MN_OK);
    uint8_t *src = mn_alloc_aligned((size_t)N * LEN, 4096), *dst = mn_alloc_aligned((size_t)N * LEN, 4096);
    uint64_t seed = 11;
    for (size_t i = 0; i < (size_t)N * LEN; i += 8) {
        uint64_t x = splitmix(&seed);
        memcpy(src + i, &x, 8);
    }
    AioReq w = {.op = AIO_OP_WRITE, .file = &f, .buf = src, .offset = 0, .len = (size_t)N * LEN};
    assert_int_equal(aio_run(a, &w, 1), MN_OK);
    assert_int_equal(aio_fdatasync(a, &f), MN_OK);

    /* the wait breaks: the kernel still holds all N reads */
    memset(dst, 0, (size_t)N * LEN);
    AioReq r[N];
    for (int i = 0; i < N; i++)
        r[i] = (AioReq){.op = AIO_OP_READ, .file = &f, .buf = dst + (size_t)i * LEN, .offset = (uint64_t)i * LEN,
                        .len = LEN};
    assert_int_equal(aio_submit(a, r, N), MN_OK);
    aio_fault_set(a, AIO_OP_RING, 0, 1, EIO);
    AioReq *done[N];
    int n_done;
    assert_int_equal(aio_wait(a, N, N, done, &n_done), MN_EIO);
    assert_int_equal(aio_submit(a, r, 1), MN_EIO); /* broken from now on */
    assert_int_equal(aio_wait(a, 0, N, done, &n_done), MN_EIO);
    aio_free(a);
    assert_memory_equal(src, dst, (size_t)N * LEN);

    /* the same, and aio_free's own waits fail too: it polls the completion
     * queue until every read is back */
    assert_int_equal(aio_new(AIO_BACKEND_URING, N, &a), MN_OK);
    memset(dst, 0, (size_t)N * LEN);
    assert_int_equal(aio_submit(a, r, N), MN_OK);
    aio_fault_set(a, AIO_OP_RING, 0, 1 << 30, EIO);
    assert_int_equal(aio_wait(a, N, N, done, &n_done), MN_EIO);
    aio_free(a);
    assert_memory_equal(src, dst, (size_t)N * LEN);

    /* the submit breaks: nothing was taken, aio_free returns at once */
    assert_int_equal(aio_new(AIO_BACKEND_URING, N, &a), MN_OK);
    aio_fault_set(a, AIO_OP_RING, 0, 1, EIO);
    assert_int_equal(aio_submit(a, r, N), MN_EIO);
    aio_free(a);

    /* the sync backend never waits on a ring: the fault does nothing */
    assert_int_equal(aio_new(AIO_BACKEND_SYNC, N, &a), MN_OK);
    aio_fault_set(a, AIO_OP_RING, 0, 1, EIO);
    assert_int_equal(aio_run(a, r, N), MN_OK);
    aio_free(a);

    aio_close(&f);
    mn_free_aligned(src);
    mn_free_aligned(dst);
    test_rm_dir(dir);
}

static void test_aio_auto(void **state) {
    Aio *a;
    assert_int_equal(aio_new(AIO_BACKEND_AUTO, 8, &a), MN_OK);
    assert_true(aio_backend(a) == AIO_BACKEND_URING || aio_backend(a) == AIO_BACKEND_SYNC);
    aio_free(a);
    assert_int_equal(aio_new(AIO_BACKEND_SYNC, 0, &a), MN_EINVAL);
    assert_null(a);
}

/* ---- tiers: round trips ------------------------------------------------------ */

/* Geometries: 128-byte blocks (much padding on disk), 4096 (none), 576. */
typedef struct Geom {
    int n_layer, kv_dim, block_tokens;
    MnType type;
} Geom;
static const Geom GEOMS[] = {{3, 8, 4, MN_TYPE_F16}, {2, 64, 16, MN_TYPE_F16}, {4, 24, 3, MN_TYPE_F32}};

static void test_tier_roundtrip(void **state) {
    const Param *pa = *state;
    for (size_t g = 0; g < sizeof GEOMS / sizeof GEOMS[0]; g++) {
        const Geom *ge = &GEOMS[g];
        KvPool p;
        assert_int_equal(kvpool_init(&p, ge->n_layer, ge->kv_dim, ge->block_tokens, 48, ge->type), MN_OK);
        scramble_pool(&p, 11 + g);
        Fixture fx;
        fx_open(&fx, pa, &p, 1 << 20, 0, true);
        Tier *t = fx.tier;
        /* a run of 5 from scattered slots, one of 1, one of 7 */
        uint32_t ids[5] = {100, 101, 102, 103, 104};
        int32_t slots[5] = {7, 2, 30, 31, 0};
        assert_int_equal(put_ids(t, &p, ids, slots, 5), MN_OK);
        assert_int_equal(put_range(t, &p, 200, 1, 40), MN_OK);
        assert_int_equal(put_range(t, &p, 300, 7, 10), MN_OK);
        tier_check(t);
        scramble_pool(&p, 99); /* the pool's copy is gone */
        expect_range(t, &p, 100, 5, 20);
        expect_range(t, &p, 200, 1, 3);
        expect_range(t, &p, 300, 7, 41); /* wraps around the pool's end */

        TierStats s;
        tier_stats(t, &s);
        uint64_t want = run_bytes(pa, &p, 5) + run_bytes(pa, &p, 1) + run_bytes(pa, &p, 7);
        assert_string_equal(s.name, pa->kind == KIND_RAM ? "ram" : "disk");
        assert_int_equal(s.capacity_bytes, 1 << 20);
        assert_int_equal(s.occupancy_bytes, want);
        assert_int_equal(s.bytes_written, want);
        assert_int_equal(s.n_runs, 3);
        assert_int_equal(s.n_blocks, 13);
        assert_int_equal(s.n_puts, 3);
        assert_int_equal(s.n_layer_reads, 3 * ge->n_layer);
        /* whole runs were read: every byte once more */
        uint64_t want_read = pa->kind == KIND_RAM ? 13ull * p.block_bytes * (uint64_t)ge->n_layer : want;
        assert_int_equal(s.bytes_read, want_read);
        assert_true(s.write_seconds >= 0 && s.read_seconds >= 0);
        assert_int_equal(s.n_evicted_runs + s.n_checksum_failures + s.n_io_errors + s.n_puts_full, 0);
        assert_false(s.is_failed);
        fx_close(&fx);
        kvpool_deinit(&p);
    }
}

/* Layers one at a time, into different slots each time, out of order, and
 * across runs: blocks 3..9 when runs hold 0..5 and 6..12. */
static void test_tier_layers_and_spans(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 4, 8, 4, 40, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 6, 0), MN_OK);
    assert_int_equal(put_range(t, &p, 6, 7, 6), MN_OK);
    scramble_pool(&p, 5);
    for (int l = 3; l >= 0; l--) {
        uint32_t ids[7];
        int32_t slots[7];
        for (int i = 0; i < 7; i++) {
            ids[i] = 3 + (uint32_t)i;
            slots[i] = 39 - 5 * l - i; /* different slots per layer */
        }
        assert_int_equal(read_ids(t, &p, ids, slots, 7, l), MN_OK);
        for (int i = 0; i < 7; i++) assert_true(slot_is(&p, l, slots[i], ids[i]));
        /* the other layers of those slots were not touched by this read */
        if (l < 3) assert_false(slot_is(&p, l + 1, slots[0], ids[0]));
    }
    /* any order, blocks interleaved from both runs */
    uint32_t ids[4] = {12, 0, 7, 5};
    int32_t slots[4] = {1, 2, 3, 4};
    assert_int_equal(read_ids(t, &p, ids, slots, 4, 2), MN_OK);
    for (int i = 0; i < 4; i++) assert_true(slot_is(&p, 2, slots[i], ids[i]));
    TierLoc loc;
    Hash128 h = h_of(8);
    assert_int_equal(tier_locate(t, &h, &loc), MN_OK);
    assert_int_equal(loc.index, 2);
    assert_int_equal(loc.n_blocks, 7);
    TierLoc loc0;
    h = h_of(0);
    assert_int_equal(tier_locate(t, &h, &loc0), MN_OK);
    assert_true(loc0.run_id != loc.run_id);
    /* refused requests */
    uint32_t missing[2] = {1, 77};
    assert_int_equal(read_ids(t, &p, missing, slots, 2, 0), MN_ENOTFOUND);
    assert_int_equal(read_ids(t, &p, ids, slots, 1, 4), MN_EINVAL);
    int32_t bad_slot[1] = {40};
    assert_int_equal(read_ids(t, &p, ids, bad_slot, 1, 0), MN_EINVAL);
    Hash128 hs[1] = {h_of(500)};
    assert_int_equal(tier_put_run(t, hs, 0, &p, slots, NULL), MN_EINVAL);
    KvPool other;
    assert_int_equal(kvpool_init(&other, 4, 16, 4, 8, MN_TYPE_F16), MN_OK);
    assert_int_equal(tier_put_run(t, hs, 1, &other, slots, NULL), MN_EINVAL);
    kvpool_deinit(&other);
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

static void corrupt_byte(const char *path, uint64_t offset) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)offset), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)offset), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* ---- tiers: streamed reads of every layer ---------------------------------------- */

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

static void on_layer(void *ctx, int layer) {
    LayerLog *lg = ctx;
    assert_int_equal(layer, lg->n_calls);
    lg->n_calls++;
    for (int i = 0; i < lg->n; i++) assert_true(slot_is(lg->p, layer, lg->slots[i], lg->ids[i]));
    if (layer + 1 < lg->p->n_layer) assert_false(slot_is(lg->p, layer + 1, lg->slots[0], lg->ids[0]));
}

static int read_all_layers(Tier *t, KvPool *p, const uint32_t *ids, const int32_t *slots, int n, LayerLog *lg) {
    Hash128 h[64];
    for (int i = 0; i < n; i++) h[i] = h_of(ids[i]);
    *lg = (LayerLog){p, ids, slots, n, 0};
    return tier_read_layers(t, h, n, p, slots, on_layer, lg);
}

/* tier_read_layers across three runs (two partly), with a window of two
 * layers' extents on disk so the staging slots are reused, and with the
 * default window: every layer arrives in order, in place when reported;
 * whole extents are counted; a missing block reads nothing. */
static void test_tier_read_layers(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 6, 8, 4, 64, MN_TYPE_F16), MN_OK); /* 128-byte blocks */
    for (int w = 0; w < 2; w++) {
        Fixture fx;
        fx_open_window(&fx, pa, &p, 1 << 20, 0, false, w == 0 ? 2 * 3 * 4096 : 0);
        Tier *t = fx.tier;
        assert_int_equal(put_range(t, &p, 0, 6, 0), MN_OK);
        assert_int_equal(put_range(t, &p, 6, 7, 6), MN_OK);
        assert_int_equal(put_range(t, &p, 20, 3, 13), MN_OK);
        scramble_pool(&p, 17 + (uint64_t)w);
        uint32_t ids[8] = {3, 4, 5, 6, 7, 8, 9, 21};
        int32_t slots[8] = {63, 40, 41, 42, 20, 1, 2, 50};
        LayerLog lg;
        assert_int_equal(read_all_layers(t, &p, ids, slots, 8, &lg), MN_OK);
        assert_int_equal(lg.n_calls, p.n_layer);
        for (int l = 0; l < p.n_layer; l++)
            for (int i = 0; i < 8; i++) assert_true(slot_is(&p, l, slots[i], ids[i]));
        TierStats s;
        tier_stats(t, &s);
        assert_int_equal(s.n_layer_reads, p.n_layer);
        uint64_t want = pa->kind == KIND_RAM ? 8ull * p.block_bytes * 6 : 3ull * 4096 * 6; /* whole extents */
        assert_int_equal(s.bytes_read, want);
        /* the same without a callback, and into other slots */
        Hash128 h[3] = {h_of(0), h_of(12), h_of(22)};
        int32_t other[3] = {30, 31, 32};
        assert_int_equal(tier_read_layers(t, h, 3, &p, other, NULL, NULL), MN_OK);
        for (int l = 0; l < p.n_layer; l++) {
            assert_true(slot_is(&p, l, 30, 0));
            assert_true(slot_is(&p, l, 31, 12));
            assert_true(slot_is(&p, l, 32, 22));
        }
        /* refused: a block not held (nothing read), a bad slot */
        uint32_t missing[2] = {1, 77};
        assert_int_equal(read_all_layers(t, &p, missing, slots, 2, &lg), MN_ENOTFOUND);
        assert_int_equal(lg.n_calls, 0);
        int32_t bad_slot[1] = {64};
        assert_int_equal(read_all_layers(t, &p, ids, bad_slot, 1, &lg), MN_EINVAL);
        tier_stats(t, &s);
        assert_int_equal(s.n_layer_reads, 2 * p.n_layer);
        assert_false(s.is_failed);
        tier_check(t);
        fx_close(&fx);
    }
    kvpool_deinit(&p);
}

/* Three runs of strides 384, 120 and 8 KiB (8 KiB blocks, seven layers)
 * into t; blocks of each to read into ids / slots; returns how many. */
static int put_three_strides(Tier *t, KvPool *p, uint32_t *ids, int32_t *slots, uint64_t seed) {
    assert_int_equal(put_range(t, p, 0, 48, 0), MN_OK);    /* stride 384 KiB */
    assert_int_equal(put_range(t, p, 100, 15, 48), MN_OK); /* 120 KiB */
    assert_int_equal(put_range(t, p, 200, 1, 63), MN_OK);  /* 8 KiB */
    scramble_pool(p, seed);
    int n = 0;
    for (uint32_t i = 0; i < 48; i += 2) ids[n++] = i; /* half of the first run */
    for (uint32_t i = 103; i < 115; i++) ids[n++] = i;
    ids[n++] = 200;
    for (int i = 0; i < n; i++) slots[i] = 127 - 2 * i;
    return n;
}

/* A streamed read takes a run's consecutive layers (a span) in one
 * request: three runs whose strides differ (384, 120 and 8 KiB), spans of
 * two layers (a request holds two of the longest), seven layers, so four
 * spans of three requests each: 12 requests where one per extent would be
 * 21. With a window of two spans the staging slots are reused; with the
 * default window every span is in flight at once, two requests of them
 * in the device at a time (read_inflight; a put after it has the whole
 * ring again). The blocks arrive exact and every layer is reported in
 * order, in place. */
static void test_disk_read_spans(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 7, 128, 16, 128, MN_TYPE_F16), MN_OK); /* 8 KiB blocks */
    assert_int_equal(p.block_bytes, 8192);
    for (int w = 0; w < 2; w++) {
        Fixture fx;
        fx_open_window(&fx, pa, &p, 16u << 20, 0, false, w == 0 ? 2u << 20 : 0);
        Tier *t = fx.tier;
        uint32_t ids[64];
        int32_t slots[64];
        int n = put_three_strides(t, &p, ids, slots, 31 + (uint64_t)w);
        Aio *a = tier_disk_aio(t);
        uint64_t before = aio_n_requests(a);
        aio_take_peak(a);
        LayerLog lg;
        assert_int_equal(read_all_layers(t, &p, ids, slots, n, &lg), MN_OK);
        assert_int_equal(lg.n_calls, p.n_layer);
        assert_int_equal(aio_n_requests(a) - before, 12);
        if (aio_backend(a) == AIO_BACKEND_URING) assert_int_equal(aio_take_peak(a), 2); /* read_inflight */
        for (int l = 0; l < p.n_layer; l++)
            for (int i = 0; i < n; i++) assert_true(slot_is(&p, l, slots[i], ids[i]));
        TierStats s;
        tier_stats(t, &s);
        assert_int_equal(s.bytes_read, (48ull + 15 + 1) * 8192 * 7); /* whole extents, no padding here */
        assert_int_equal(put_range(t, &p, 300, 48, 0), MN_OK); /* 2.6 MiB: writes have the whole ring again */
        if (aio_backend(a) == AIO_BACKEND_URING) assert_int_equal(aio_take_peak(a), 3);
        tier_check(t);
        fx_close(&fx);
    }
    kvpool_deinit(&p);
}

/* A read nobody consumes layer by layer (no layer_fn: a promote) keeps
 * four times the window in flight. The runs of test_disk_read_spans with a
 * 1 MiB window: read with a consumer, the window holds two of the seven
 * layers, so spans are one layer (two in flight) and take 21 requests;
 * without, the 4 MiB holds them all, spans are two layers (as much as a
 * request holds of the longest stride), 12 requests. Both exact. */
static void test_disk_read_bulk(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 7, 128, 16, 128, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open_window(&fx, pa, &p, 16u << 20, 0, false, 1u << 20);
    Tier *t = fx.tier;
    uint32_t ids[64];
    int32_t slots[64];
    int n = put_three_strides(t, &p, ids, slots, 41);
    Aio *a = tier_disk_aio(t);
    for (int bulk = 0; bulk < 2; bulk++) {
        scramble_pool(&p, 42 + (uint64_t)bulk);
        uint64_t before = aio_n_requests(a);
        LayerLog lg;
        if (bulk) {
            Hash128 h[64];
            for (int i = 0; i < n; i++) h[i] = h_of(ids[i]);
            assert_int_equal(tier_read_layers(t, h, n, &p, slots, NULL, NULL), MN_OK);
        } else {
            assert_int_equal(read_all_layers(t, &p, ids, slots, n, &lg), MN_OK);
            assert_int_equal(lg.n_calls, p.n_layer);
        }
        assert_int_equal(aio_n_requests(a) - before, bulk ? 12 : 21);
        for (int l = 0; l < p.n_layer; l++)
            for (int i = 0; i < n; i++) assert_true(slot_is(&p, l, slots[i], ids[i]));
    }
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* This process's anonymous resident memory, in KiB. */
static long rss_anon_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) break;
    fclose(f);
    assert_true(kb >= 0);
    return kb;
}

/* Whether madvise(MADV_POPULATE_WRITE) exists here (Linux 5.14+). Without
 * it aio_buf_new's pages are faulted in on first use, and resident memory
 * does not show the staging buffer at open. */
static bool kernel_populates(void) {
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    bool ok = madvise(m, 4096, MADV_POPULATE_WRITE) == 0;
    munmap(m, 4096);
    return ok;
}

/* The staging buffer is made, and its pages populated, when the tier
 * opens — at the bulk window (32 MiB by default), or the budget when that
 * is smaller — so no read or put while serving stalls to grow it. A run
 * bigger than it still grows it, and running out of memory at each of
 * that put's allocations in turn fails the put alone. */
static void test_disk_staging_at_open(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 8, MN_TYPE_F16), MN_OK);
    uint64_t caps[2] = {256u << 20, 4u << 20};
    for (int i = 0; i < 2 && kernel_populates(); i++) { /* else pages come on first use */
        long before = rss_anon_kb();
        Fixture fx;
        fx_open(&fx, pa, &p, caps[i], 64u << 20, false);
        long grew = rss_anon_kb() - before;
        if (i == 0) assert_true(grew >= 32 * 1024);
        else assert_true(grew >= 4 * 1024 && grew < 16 * 1024);
        fx_close(&fx);
    }
    kvpool_deinit(&p);
    /* 64 KiB blocks, a 64 KiB window: 1 MiB of staging (the least), and a
     * run of 20 blocks (2.5 MiB) grows it */
    assert_int_equal(kvpool_init(&p, 2, 1024, 16, 32, MN_TYPE_F16), MN_OK);
    int n_failures = 0;
    for (int k = 0;; k++) {
        sweep_bound(k, __func__);
        Fixture fx;
        fx_open_window(&fx, pa, &p, 16u << 20, 0, false, 64u << 10);
        tier_disk_fault_alloc(fx.tier, k, 1);
        int rc = put_range(fx.tier, &p, 0, 20, 0);
        tier_disk_fault_alloc(fx.tier, 0, 0);
        TierStats s;
        tier_stats(fx.tier, &s);
        assert_false(s.is_failed);
        if (rc == MN_OK) {
            fx_close(&fx);
            break;
        }
        assert_int_equal(rc, MN_ENOMEM);
        assert_int_equal(s.n_runs, 0);
        assert_int_equal(put_range(fx.tier, &p, 0, 20, 0), MN_OK);
        tier_check(fx.tier);
        fx_close(&fx);
        n_failures++;
    }
    assert_true(n_failures >= 2); /* the run's record, the staging buffer */
    kvpool_deinit(&p);
}

/* With transparent huge pages off for the process (prctl, in a child so
 * the other tests keep them), the staging buffer gets none, and the tier
 * says so once, on stderr (the child's goes to a file): at open, and not
 * again when a 2.5 MiB run grows the 1 MiB buffer. */
static void test_disk_no_huge_pages(void **state) {
    const Param *pa = *state;
    char log_path[] = "/tmp/mnemo-thp-XXXXXX", dir[] = "/tmp/mnemo-thp-dir-XXXXXX";
    int log_fd = mkstemp(log_path);
    assert_true(log_fd >= 0);
    unlink(log_path); /* the descriptor is all it takes */
    assert_non_null(mkdtemp(dir));
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (dup2(log_fd, STDERR_FILENO) < 0 || prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) _exit(2);
        KvPool p; /* 64 KiB blocks; a 64 KiB window: a staging buffer of 1 MiB */
        if (kvpool_init(&p, 2, 1024, 16, 32, MN_TYPE_F16) != MN_OK) _exit(3);
        TierDiskConfig cfg = {.dir = dir, .capacity_bytes = 16u << 20, .n_layer = 2, .block_bytes = p.block_bytes,
                              .kv_format = 1, .aio_backend = pa->backend, .queue_depth = 4,
                              .read_window_bytes = 64u << 10};
        Tier *t;
        MnErr err = {0};
        if (tier_disk_new(&cfg, &t, &err) != MN_OK) _exit(4);
        if (put_range(t, &p, 0, 20, 0) != MN_OK) _exit(5); /* grows it */
        tier_free(t);
        kvpool_deinit(&p);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char text[4096] = "";
    ssize_t n = pread(log_fd, text, sizeof text - 1, 0);
    assert_true(n > 0);
    text[n] = '\0';
    const char *hit = strstr(text, "staging buffer no huge pages");
    if (hit == NULL) fail_msg("no warning; the child said: %s", text);
    assert_null(strstr(hit + 1, "staging buffer no huge pages")); /* once */
    close(log_fd);
    test_rm_dir(dir);
}

/* A streamed read that meets a bad extent: layers before it are reported
 * (and in place), the bad run is dropped and counted, the other run stays;
 * a short file likewise; an injected EIO mid-stream is sticky. Windows of
 * one layer and of four (spans of w = 1 and 2 layers: a window that cannot
 * hold every layer keeps two spans in flight), so requests are in flight
 * past the failure. */
static void test_disk_read_layers_faults(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 6, 8, 4, 64, MN_TYPE_F16), MN_OK);
    for (int w = 1; w <= 2; w++) {
        Fixture fx;
        fx_open_window(&fx, pa, &p, 1 << 20, 0, true, (uint64_t)(w == 1 ? 1 : 4) * 2 * 4096);
        Tier *t = fx.tier;
        Drops drops = {0};
        tier_set_drop_fn(t, on_drop, &drops);
        assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
        assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
        char path[256];
        uint64_t off, len;
        Hash128 h = h_of(11);
        assert_int_equal(tier_disk_extent(t, &h, 3, path, sizeof path, &off, &len), MN_OK);
        corrupt_byte(path, off + 5);
        scramble_pool(&p, 3);
        uint32_t ids[4] = {1, 2, 11, 12};
        int32_t slots[4] = {20, 21, 22, 23};
        LayerLog lg;
        assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_ECHECKSUM);
        assert_int_equal(lg.n_calls, 3); /* layers 0, 1, 2 */
        TierStats s;
        tier_stats(t, &s);
        assert_int_equal(s.n_checksum_failures, 1);
        assert_false(s.is_failed);
        assert_int_equal(drops.n_blocks, 4);
        assert_int_equal(drops.last_why, TIER_DROP_CHECKSUM);
        assert_true(dropped(&drops, 10) && dropped(&drops, 13) && !dropped(&drops, 0));
        assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_ENOTFOUND);
        scramble_pool(&p, 6);
        assert_int_equal(read_all_layers(t, &p, ids, slots, 2, &lg), MN_OK);
        assert_int_equal(lg.n_calls, p.n_layer);

        /* the data file cut short inside layer 4 of the second run: the
         * short read fails its span, so the layers of the spans before it
         * are reported (w = 2: this one run fits the window whole, a span
         * of all six layers, and none is) */
        assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
        h = h_of(10);
        assert_int_equal(tier_disk_extent(t, &h, 4, path, sizeof path, &off, &len), MN_OK);
        assert_int_equal(truncate(path, (off_t)off), 0);
        scramble_pool(&p, 4);
        assert_int_equal(read_all_layers(t, &p, (uint32_t[]){10}, slots, 1, &lg), MN_ECHECKSUM);
        assert_int_equal(lg.n_calls, w == 1 ? 4 : 0);
        tier_stats(t, &s);
        assert_int_equal(s.n_checksum_failures, 2);
        assert_false(s.is_failed);
        tier_check(t);

        /* an I/O error on the fifth read request: sticky. One request
         * per run and span; a span is w layers, so the fifth is the first
         * of layer 2 (w = 1) or of layers 4-5 (w = 2), and the layers
         * before it are reported */
        assert_int_equal(tier_reset(t), MN_OK);
        assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
        assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
        scramble_pool(&p, 5);
        aio_fault_set(tier_disk_aio(t), AIO_OP_READ, 4, 1, EIO);
        assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_EIO);
        assert_int_equal(lg.n_calls, 2 * w);
        tier_stats(t, &s);
        assert_true(s.is_failed);
        assert_int_equal(read_all_layers(t, &p, ids, slots, 2, &lg), MN_EIO);
        assert_int_equal(lg.n_calls, 0);
        assert_int_equal(tier_reset(t), MN_OK);
        assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
        scramble_pool(&p, 7);
        assert_int_equal(read_all_layers(t, &p, ids, slots, 2, &lg), MN_OK);
        assert_int_equal(lg.n_calls, p.n_layer);
        tier_check(t);

        /* the ring itself breaks mid-stream (io_uring only): sticky like
         * an I/O error; the reset waits out the reads the kernel holds
         * (their staging buffer is reused) and starts a new ring */
        if (pa->backend == AIO_BACKEND_URING) {
            assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
            scramble_pool(&p, 9);
            aio_fault_set(tier_disk_aio(t), AIO_OP_RING, 2, 1, EIO);
            assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_EIO);
            assert_true(lg.n_calls < p.n_layer);
            tier_stats(t, &s);
            assert_true(s.is_failed);
            assert_int_equal(tier_reset(t), MN_OK);
            assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
            assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
            scramble_pool(&p, 8);
            assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_OK);
            assert_int_equal(lg.n_calls, p.n_layer);
            tier_check(t);
        }
        fx_close(&fx);
    }
    kvpool_deinit(&p);
}

/* Out of memory while setting up a streamed read (its request array must
 * grow: a put takes one request here, the read one per run): MN_ENOMEM,
 * no layer reported, nothing dropped, the tier stays up; the next read of
 * the same blocks works. */
static void test_disk_read_out_of_memory(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 6, 8, 4, 64, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
    uint32_t ids[4] = {1, 2, 11, 12};
    int32_t slots[4] = {20, 21, 22, 23};
    LayerLog lg;
    scramble_pool(&p, 51);
    tier_disk_fault_alloc(t, 0, 1);
    assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_ENOMEM);
    assert_int_equal(lg.n_calls, 0);
    TierStats s;
    tier_stats(t, &s);
    assert_false(s.is_failed);
    assert_int_equal(s.n_runs, 2);
    assert_int_equal(read_all_layers(t, &p, ids, slots, 4, &lg), MN_OK);
    assert_int_equal(lg.n_calls, p.n_layer);
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- tiers: eviction, drop ----------------------------------------------------- */

static void test_tier_lru(void **state) {
    const Param *pa = *state;
    KvPool p; /* 4096-byte blocks: a run takes the same room in RAM and on disk */
    assert_int_equal(kvpool_init(&p, 2, 128, 8, 32, MN_TYPE_F16), MN_OK);
    assert_int_equal(p.block_bytes, 4096);
    uint64_t rb = run_bytes(pa, &p, 4);
    Fixture fx;
    /* room for three runs of 4 (disk: two slabs, so room spans files) */
    fx_open(&fx, pa, &p, 3 * rb + rb / 2, 2 * rb, false);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);   /* A */
    assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);  /* B */
    assert_int_equal(put_range(t, &p, 20, 4, 8), MN_OK);  /* C */
    assert_int_equal(drops.n_calls, 0);
    expect_range(t, &p, 0, 4, 16);                        /* A is now the most recent */
    assert_int_equal(put_range(t, &p, 30, 4, 12), MN_OK); /* D evicts B */
    tier_check(t);
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.n_blocks, 4);
    assert_int_equal(drops.last_why, TIER_DROP_EVICTED);
    for (uint32_t i = 0; i < 4; i++) {
        assert_true(dropped(&drops, 10 + i));
        Hash128 h = h_of(10 + i);
        assert_false(tier_has(t, &h));
        h = h_of(i);
        assert_true(tier_has(t, &h));
        h = h_of(20 + i);
        assert_true(tier_has(t, &h));
    }
    expect_range(t, &p, 0, 4, 16);
    expect_range(t, &p, 20, 4, 16);
    expect_range(t, &p, 30, 4, 16);
    /* LRU order is now A C D. A run of 8 needs two runs' room: A and C go.
     * On disk the room must also be contiguous within one slab — slab 0
     * (2 runs' room) holds D in its second half, slab 1 has 1.5 runs' room
     * — so D goes too. */
    drops.n_calls = drops.n_blocks = 0;
    assert_int_equal(put_range(t, &p, 40, 8, 0), MN_OK);
    tier_check(t);
    assert_true(dropped(&drops, 0));
    assert_true(dropped(&drops, 20));
    Hash128 h = h_of(20);
    assert_false(tier_has(t, &h));
    h = h_of(30);
    bool is_disk = pa->kind == KIND_DISK;
    assert_int_equal(tier_has(t, &h), !is_disk);
    if (!is_disk) expect_range(t, &p, 30, 4, 8);
    expect_range(t, &p, 40, 8, 8);
    /* bigger than the budget: refused, nothing evicted */
    drops.n_calls = drops.n_blocks = 0;
    assert_int_equal(put_range(t, &p, 100, 20, 0), MN_EFULL);
    assert_int_equal(drops.n_calls, 0);
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_puts_full, 1);
    assert_int_equal(s.n_evicted_runs, is_disk ? 4 : 3);
    assert_int_equal(s.n_evicted_blocks, is_disk ? 16 : 12);
    assert_int_equal(s.n_runs, is_disk ? 1 : 2);
    assert_int_equal(s.n_blocks, is_disk ? 8 : 12);
    assert_true(s.occupancy_bytes <= s.capacity_bytes);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* Put a run of 4 blocks (first .. first+3, at pos) into a tier with room
 * for three; the run it evicts must be the one holding `victim`. */
static void put_evicts(Tier *t, KvPool *p, Drops *d, uint32_t first, int32_t pos, uint32_t victim) {
    d->n_calls = d->n_blocks = 0;
    assert_int_equal(put_range_at(t, p, first, 4, (int32_t)first % p->n_blocks, pos), MN_OK);
    tier_check(t);
    assert_int_equal(d->n_calls, 1);
    assert_int_equal(d->n_blocks, 4);
    if (!dropped(d, victim)) fail_msg("putting run %u evicted run %u, not %u", first, d->ids[0], victim);
}

/* Runs of 4 in the order B (blocks 100.., at position 256), A (0.., at 0:
 * leading, the cheapest) and C (200.., at 128). */
static void put_bac(Tier *t, KvPool *p) {
    assert_int_equal(put_range_at(t, p, 100, 4, 0, 256), MN_OK);
    assert_int_equal(put_range_at(t, p, 0, 4, 4, 0), MN_OK);
    assert_int_equal(put_range_at(t, p, 200, 4, 8, 128), MN_OK);
}

/* --evict below the pool: the tiers score whole runs by the policy
 * (pensieve: cheap leading runs first, whatever the recency), runs in the
 * look-ahead window go last and the window's tail first, and a cleared
 * window gives the plain order back. */
static void test_tier_policy(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 128, 8, 64, MN_TYPE_F16), MN_OK);
    uint64_t rb = run_bytes(pa, &p, 4);
    Fixture fx;
    fx_open(&fx, pa, &p, 3 * rb + rb / 2, 4 * rb, false); /* room for three runs of 4 */
    Tier *t = fx.tier;
    Drops d = {0};
    tier_set_drop_fn(t, on_drop, &d);
    tier_set_policy(t, EVICT_PENSIEVE, NULL); /* cost grows with the position */
    put_bac(t, &p);
    put_evicts(t, &p, &d, 300, 512, 0);                           /* D: A goes (lru would take B) */

    /* the window: C at its head, B behind it; D outside goes first, though
     * pensieve alone would pick C */
    tier_set_policy(t, EVICT_PENSIEVE_LOOKAHEAD, NULL);
    Hash128 wh[3] = {h_of(201), h_of(100), h_of(0)};
    int32_t wi[3] = {0, 1, 2};
    assert_int_equal(tier_set_window(t, wh, wi, 3), MN_OK);
    put_evicts(t, &p, &d, 400, 0, 300); /* E (pos 0, outside) */
    /* everything in the window (E too, behind C): its tail goes first, B */
    wh[1] = h_of(403);
    wh[2] = h_of(100);
    assert_int_equal(tier_set_window(t, wh, wi, 3), MN_OK);
    put_evicts(t, &p, &d, 500, 1024, 100); /* F */
    /* a plain lookahead keeps the window and orders the rest by recency */
    tier_set_policy(t, EVICT_LOOKAHEAD, NULL);
    assert_int_equal(tier_set_window(t, wh + 1, wi, 1), MN_OK); /* E only */
    put_evicts(t, &p, &d, 600, 2048, 200);                     /* G: C, the least recent outside */
    /* window cleared: pensieve again picks the cheapest, E */
    tier_set_policy(t, EVICT_PENSIEVE_LOOKAHEAD, NULL);
    assert_int_equal(tier_set_window(t, NULL, NULL, 0), MN_OK);
    put_evicts(t, &p, &d, 700, 4096, 400);
    /* fifo: the earliest put of what is left (F, G, H) goes, even after a read */
    tier_set_policy(t, EVICT_FIFO, NULL);
    expect_range(t, &p, 500, 4, 16);
    put_evicts(t, &p, &d, 800, 0, 500);
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_evicted_runs, 6);
    fx_close(&fx);
    kvpool_deinit(&p);
}

static void test_tier_has_drop(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 3, 0), MN_OK); /* run X: 0 1 2 */
    Hash128 h0 = h_of(0), h1 = h_of(1), h2 = h_of(2), h3 = h_of(3), h9 = h_of(9);
    assert_true(tier_has(t, &h0));
    assert_false(tier_has(t, &h9));
    TierLoc loc;
    assert_int_equal(tier_locate(t, &h9, &loc), MN_ENOTFOUND);
    assert_int_equal(tier_drop(t, &h9), MN_ENOTFOUND);
    assert_int_equal(tier_drop_run(t, &h9), MN_ENOTFOUND);

    /* dropping one block keeps the rest of the run */
    TierStats s;
    tier_stats(t, &s);
    uint64_t occ = s.occupancy_bytes;
    assert_int_equal(tier_drop(t, &h1), MN_OK);
    assert_false(tier_has(t, &h1));
    assert_int_equal(drops.n_calls, 0); /* the caller knows */
    uint32_t ids[2] = {0, 2};
    int32_t slots[2] = {20, 21};
    assert_int_equal(read_ids(t, &p, ids, slots, 2, 1), MN_OK);
    assert_true(slot_is(&p, 1, 20, 0) && slot_is(&p, 1, 21, 2));
    assert_int_equal(read_ids(t, &p, (uint32_t[]){1}, slots, 1, 0), MN_ENOTFOUND);
    tier_stats(t, &s);
    assert_int_equal(s.occupancy_bytes, occ);
    assert_int_equal(s.n_blocks, 2);

    /* re-put 2 3: block 2 moves to the new run Y; X keeps only 0 */
    assert_int_equal(put_range(t, &p, 2, 2, 4), MN_OK);
    assert_int_equal(tier_locate(t, &h2, &loc), MN_OK);
    assert_int_equal(loc.index, 0);
    assert_int_equal(loc.n_blocks, 2);
    tier_check(t);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 2);
    /* dropping X's last live block frees X */
    assert_int_equal(tier_drop(t, &h0), MN_OK);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 1);
    assert_int_equal(s.occupancy_bytes, run_bytes(pa, &p, 2));
    tier_check(t);
    /* a run entirely re-put is freed at once */
    assert_int_equal(put_range(t, &p, 2, 2, 8), MN_OK);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 1);
    /* drop_run reports every live block of the run */
    assert_int_equal(tier_drop_run(t, &h3), MN_OK);
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.n_blocks, 2);
    assert_int_equal(drops.last_why, TIER_DROP_CALLER);
    assert_false(tier_has(t, &h2));
    tier_stats(t, &s);
    assert_int_equal(s.n_runs + s.n_blocks + s.occupancy_bytes, 0);
    /* reset reports what is left and the tier goes on */
    assert_int_equal(put_range(t, &p, 50, 3, 0), MN_OK);
    assert_int_equal(tier_reset(t), MN_OK);
    assert_int_equal(drops.n_blocks, 5);
    Hash128 h50 = h_of(50);
    assert_false(tier_has(t, &h50));
    assert_int_equal(put_range(t, &p, 60, 3, 0), MN_OK);
    expect_range(t, &p, 60, 3, 10);
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- disk: corruption, space, I/O errors --------------------------------------- */

static void test_disk_checksum(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, true);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 5, 0), MN_OK);
    assert_int_equal(put_range(t, &p, 10, 2, 5), MN_OK);
    char path[256];
    uint64_t off, len;
    Hash128 h = h_of(2);
    assert_int_equal(tier_disk_extent(t, &h, 1, path, sizeof path, &off, &len), MN_OK);
    assert_int_equal(off % 4096, 0);
    assert_int_equal(len, 4096);
    corrupt_byte(path, off + 3 * p.block_bytes + 17); /* block 3 of layer 1 */

    uint32_t ids[5] = {0, 1, 2, 3, 4};
    int32_t slots[5] = {20, 21, 22, 23, 24};
    assert_int_equal(read_ids(t, &p, ids, slots, 5, 0), MN_OK); /* layer 0 is intact */
    assert_int_equal(read_ids(t, &p, ids, slots, 1, 1), MN_ECHECKSUM); /* block 0 shares the extent */
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_checksum_failures, 1);
    assert_false(s.is_failed);
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.n_blocks, 5);
    assert_int_equal(drops.last_why, TIER_DROP_CHECKSUM);
    for (uint32_t i = 0; i < 5; i++) {
        h = h_of(i);
        assert_false(tier_has(t, &h));
    }
    assert_int_equal(read_ids(t, &p, ids, slots, 5, 2), MN_ENOTFOUND); /* never used again */
    /* the tier keeps working; the other run is fine; the pages are reused */
    expect_range(t, &p, 10, 2, 0);
    assert_int_equal(put_range(t, &p, 0, 5, 0), MN_OK);
    expect_range(t, &p, 0, 5, 20);
    /* padding counts too: corrupt a byte after the blocks */
    h = h_of(10);
    assert_int_equal(tier_disk_extent(t, &h, 2, path, sizeof path, &off, &len), MN_OK);
    corrupt_byte(path, off + len - 1);
    assert_int_equal(read_ids(t, &p, (uint32_t[]){11}, slots, 1, 2), MN_ECHECKSUM);
    tier_stats(t, &s);
    assert_int_equal(s.n_checksum_failures, 2);
    tier_check(t);
    /* a data file cut short: a short read counts as a checksum failure */
    h = h_of(0);
    assert_int_equal(tier_disk_extent(t, &h, 0, path, sizeof path, &off, &len), MN_OK);
    assert_int_equal(truncate(path, (off_t)off), 0);
    assert_int_equal(read_ids(t, &p, ids, slots, 5, 0), MN_ECHECKSUM);
    tier_stats(t, &s);
    assert_int_equal(s.n_checksum_failures, 3);
    assert_false(s.is_failed);
    tier_check(t);
    assert_int_equal(tier_disk_extent(t, &h, 0, path, sizeof path, &off, &len), MN_ENOTFOUND);
    assert_int_equal(tier_disk_extent(t, &h, 7, path, sizeof path, &off, &len), MN_EINVAL);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* Corrupt the byte `at` bytes into block b of the layer-`layer` extent of
 * the run holding block id. */
static void corrupt_block(Tier *t, uint32_t id, int layer, const KvPool *p, int b, uint64_t at) {
    char path[256];
    uint64_t off, len;
    Hash128 h = h_of(id);
    assert_int_equal(tier_disk_extent(t, &h, layer, path, sizeof path, &off, &len), MN_OK);
    corrupt_byte(path, off + (uint64_t)b * p->block_bytes + at);
}

/* A layer is hashed and copied in one pass when its blocks are asked for in
 * rising order. Blocks asked for out of order, or with gaps, come back
 * exact; a damaged byte fails the check wherever it lies — before the
 * first block asked for, between two, after the last (test_disk_checksum)
 * or with the blocks out of order — in single-layer and streamed reads. */
static void test_disk_checksum_block_order(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 64, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, true);
    Tier *t = fx.tier;
    for (uint32_t r = 0; r < 4; r++) assert_int_equal(put_range(t, &p, 10 * r, 6, 6 * (int32_t)r), MN_OK);
    scramble_pool(&p, 5);
    uint32_t shuffled[3] = {4, 1, 2}, gaps[3] = {30, 32, 35};
    int32_t slots[3] = {40, 41, 42};
    LayerLog lg;
    for (int c = 0; c < 2; c++) {
        const uint32_t *ids = c == 0 ? shuffled : gaps;
        assert_int_equal(read_all_layers(t, &p, ids, slots, 3, &lg), MN_OK);
        for (int l = 0; l < p.n_layer; l++)
            for (int i = 0; i < 3; i++) assert_true(slot_is(&p, l, slots[i], ids[i]));
    }

    corrupt_block(t, 0, 1, &p, 1, 9);   /* before the first block asked for */
    corrupt_block(t, 10, 1, &p, 2, 70); /* between the two asked for */
    corrupt_block(t, 20, 1, &p, 0, 0);  /* blocks asked for out of order */
    assert_int_equal(read_ids(t, &p, (uint32_t[]){3, 4}, slots, 2, 1), MN_ECHECKSUM);
    assert_int_equal(read_ids(t, &p, (uint32_t[]){10, 14}, slots, 2, 1), MN_ECHECKSUM);
    assert_int_equal(read_ids(t, &p, (uint32_t[]){23, 21}, slots, 2, 1), MN_ECHECKSUM);
    corrupt_block(t, 30, 2, &p, 3, 1); /* streamed: between two, in the last layer */
    assert_int_equal(read_all_layers(t, &p, (uint32_t[]){31, 35}, slots, 2, &lg), MN_ECHECKSUM);
    assert_int_equal(lg.n_calls, 2);
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_checksum_failures, 4);
    for (uint32_t r = 0; r < 4; r++) {
        Hash128 h = h_of(10 * r);
        assert_false(tier_has(t, &h));
    }
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

static void test_disk_enospc(void **state) {
    const Param *pa = *state;
    KvPool p; /* one layer: a run of up to 32 blocks is one 4 KiB page */
    assert_int_equal(kvpool_init(&p, 1, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 64 << 10, true);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);

    /* no room for the first slab file */
    aio_fault_set(tier_disk_aio(t), AIO_OP_FALLOCATE, 0, 1, ENOSPC);
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_EFULL);
    Hash128 h = h_of(0);
    assert_false(tier_has(t, &h));
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    /* the device fills up during a write */
    aio_fault_set(tier_disk_aio(t), AIO_OP_WRITE, 0, 1, ENOSPC);
    assert_int_equal(put_range(t, &p, 10, 4, 4), MN_EFULL);
    h = h_of(10);
    assert_false(tier_has(t, &h));
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_puts_full, 2);
    assert_int_equal(s.n_runs, 1);
    assert_int_equal(s.occupancy_bytes, run_bytes(pa, &p, 4));
    assert_false(s.is_failed);
    tier_check(t);
    /* ... or while syncing */
    aio_fault_set(tier_disk_aio(t), AIO_OP_FDATASYNC, 0, 1, ENOSPC);
    assert_int_equal(put_range(t, &p, 10, 4, 4), MN_EFULL);
    /* and the tier keeps working */
    assert_int_equal(put_range(t, &p, 10, 4, 4), MN_OK);
    expect_range(t, &p, 0, 4, 20);
    expect_range(t, &p, 10, 4, 20);
    /* a second slab file cannot be created: older runs make room instead */
    for (uint32_t k = 0; k < 14; k++) assert_int_equal(put_range(t, &p, 100 + 4 * k, 4, 8), MN_OK);
    tier_stats(t, &s);
    uint64_t runs_before = s.n_runs;
    assert_int_equal(runs_before, 16); /* one 64 KiB slab holds 16 runs of 4 KiB */
    aio_fault_set(tier_disk_aio(t), AIO_OP_FALLOCATE, 0, 1000, ENOSPC);
    assert_int_equal(put_range(t, &p, 200, 4, 12), MN_OK);
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 16);
    assert_int_equal(s.n_evicted_runs, 1);
    h = h_of(0); /* the least recently used */
    assert_false(tier_has(t, &h));
    expect_range(t, &p, 200, 4, 20);
    aio_fault_set(tier_disk_aio(t), 0, 0, 0, 0);
    assert_int_equal(put_range(t, &p, 300, 4, 12), MN_OK); /* now the second slab */
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 17);
    tier_check(t);
    fx_close(&fx);
    kvpool_deinit(&p);
}

static void test_disk_eio_sticky(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    aio_fault_set(tier_disk_aio(t), AIO_OP_READ, 0, 1, EIO);
    uint32_t ids[1] = {0};
    int32_t slots[1] = {9};
    assert_int_equal(read_ids(t, &p, ids, slots, 1, 0), MN_EIO);
    TierStats s;
    tier_stats(t, &s);
    assert_true(s.is_failed);
    assert_int_equal(s.n_io_errors, 1);
    /* sticky: nothing touches the device until reset, though it would work */
    assert_int_equal(read_ids(t, &p, ids, slots, 1, 0), MN_EIO);
    assert_int_equal(put_range(t, &p, 10, 2, 0), MN_EIO);
    Hash128 h = h_of(0);
    assert_true(tier_has(t, &h)); /* bookkeeping still answers */
    assert_int_equal(tier_reset(t), MN_OK);
    assert_false(tier_has(t, &h));
    tier_stats(t, &s);
    assert_false(s.is_failed);
    assert_int_equal(s.n_runs, 0);
    assert_int_equal(put_range(t, &p, 10, 2, 0), MN_OK);
    expect_range(t, &p, 10, 2, 5);
    /* a failed write is sticky too, and the run is not stored */
    aio_fault_set(tier_disk_aio(t), AIO_OP_WRITE, 0, 1, EIO);
    assert_int_equal(put_range(t, &p, 20, 2, 0), MN_EIO);
    h = h_of(20);
    assert_false(tier_has(t, &h));
    tier_stats(t, &s);
    assert_true(s.is_failed);
    assert_int_equal(s.n_io_errors, 2);
    tier_check(t);
    assert_int_equal(tier_reset(t), MN_OK);
    assert_int_equal(put_range(t, &p, 20, 2, 0), MN_OK);
    expect_range(t, &p, 20, 2, 5);
    fx_close(&fx);
    kvpool_deinit(&p);
}

static void test_disk_config(void **state) {
    Tier *t = (Tier *)1;
    MnErr err = {0};
    TierDiskConfig cfg = {.dir = "", .capacity_bytes = 1 << 20, .n_layer = 2, .block_bytes = 128};
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_EINVAL);
    assert_null(t);
    cfg.dir = "/tmp/mnemo-no-such-parent-dir/x/y";
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, "mnemo-no-such-parent-dir"));
    char dir[64];
    make_tmp(dir);
    cfg.dir = dir;
    cfg.capacity_bytes = 100;
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_EINVAL);
    cfg.capacity_bytes = 1 << 20;
    cfg.n_layer = 0;
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_EINVAL);
    /* a run larger than a slab can never fit */
    cfg.n_layer = 2;
    cfg.slab_bytes = 8192;
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_OK);
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 8, MN_TYPE_F16), MN_OK);
    assert_int_equal(put_range(t, &p, 0, 1, 0), MN_OK);
    assert_int_equal(put_range(t, &p, 10, 33, 0), MN_EFULL);
    tier_free(t);
    kvpool_deinit(&p);
    test_rm_dir(dir);
}

/* ---- expiry (every tier) -------------------------------------------------------- */


/* Sleep a little so that wall-clock stamps before and after differ. */
static void tick(void) {
    struct timespec ts = {0, 3 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

typedef struct Listed {
    int n_runs;
    int n_blocks[16];
    uint32_t first[16];
    uint32_t ids[16][16];
} Listed;

static void on_run(void *ctx, const Hash128 *hashes, int n) {
    Listed *l = ctx;
    assert_true(l->n_runs < 16 && n <= 16);
    l->n_blocks[l->n_runs] = n;
    l->first[l->n_runs] = n > 0 ? id_of(&hashes[0]) : 0;
    for (int i = 0; i < n; i++) l->ids[l->n_runs][i] = id_of(&hashes[i]);
    l->n_runs++;
}

static void test_tier_expire(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    Drops drops = {0};
    tier_set_drop_fn(t, on_drop, &drops);
    assert_int_equal(put_range(t, &p, 0, 3, 0), MN_OK);  /* A */
    tick();
    double t1 = mn_wall_now();
    tick();
    assert_int_equal(put_range(t, &p, 10, 2, 3), MN_OK); /* B */
    assert_int_equal(put_range(t, &p, 20, 2, 5), MN_OK); /* C */
    Hash128 h = h_of(1);
    assert_int_equal(tier_drop(t, &h), MN_OK);           /* A keeps 0 and 2 live */
    assert_int_equal(tier_expire(t, t1), 2);             /* A only: its live blocks */
    assert_int_equal(drops.n_calls, 1);
    assert_int_equal(drops.last_why, TIER_DROP_EXPIRED);
    assert_true(dropped(&drops, 0) && dropped(&drops, 2) && !dropped(&drops, 1));
    h = h_of(0);
    assert_false(tier_has(t, &h));
    tick();
    double t2 = mn_wall_now();
    tick();
    /* a read of layer 0 makes B recent; a read of another layer does not (C) */
    uint32_t ids[2] = {10, 11};
    int32_t slots[2] = {20, 21};
    assert_int_equal(read_ids(t, &p, ids, slots, 2, 0), MN_OK);
    ids[0] = 20;
    ids[1] = 21;
    assert_int_equal(read_ids(t, &p, ids, slots, 2, 1), MN_OK);
    Listed l = {0};
    tier_foreach_run(t, on_run, &l); /* LRU first: any read makes a run the most recent */
    assert_int_equal(l.n_runs, 2);
    assert_int_equal(l.first[0], 10);
    assert_int_equal(l.first[1], 20);
    assert_int_equal(tier_expire(t, t2), 2);             /* C */
    h = h_of(20);
    assert_false(tier_has(t, &h));
    h = h_of(10);
    assert_true(tier_has(t, &h));
    assert_int_equal(tier_expire(t, t2), 0);
    assert_int_equal(tier_expire(t, mn_wall_now() + 1), 2); /* B */
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_runs + s.n_blocks + s.occupancy_bytes, 0);
    assert_int_equal(s.n_expired_runs, 3);
    assert_int_equal(s.n_expired_blocks, 6);
    assert_int_equal(drops.n_calls, 3);
    tier_check(t);
    l.n_runs = 0;
    tier_foreach_run(t, on_run, &l);
    assert_int_equal(l.n_runs, 0);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- disk: persistence across restarts ------------------------------------------- */

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

static StoreIdentity pool_identity(const KvPool *p) {
    StoreIdentity id = {.kv_format = 1 | (uint32_t)p->block_tokens << 8, .n_layer = p->n_layer,
                        .block_bytes = p->block_bytes};
    memset(id.model_fingerprint.b, 0x3c, 16); /* as fx_open */
    return id;
}

static TierDiskConfig pfx_config(const PFix *fx, const KvPool *p) {
    TierDiskConfig cfg = {
        .dir = fx->dir,
        .capacity_bytes = fx->capacity,
        .n_layer = p->n_layer,
        .block_bytes = p->block_bytes,
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
static void pfx_open(PFix *fx, const KvPool *p) {
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

static void pfx_new(PFix *fx, const Param *pa, const KvPool *p, uint64_t capacity, uint64_t slab_bytes) {
    memset(fx, 0, sizeof *fx);
    strcpy(fx->dir, "/tmp/mnemo-persist-XXXXXX");
    assert_non_null(mkdtemp(fx->dir));
    fx->backend = pa->backend;
    fx->capacity = capacity;
    fx->slab_bytes = slab_bytes;
    fx->is_durable = true;
    pfx_open(fx, p);
}

static void pfx_close(PFix *fx) {
    tier_free(fx->tier);
    fx->tier = NULL;
    store_close(fx->store);
    fx->store = NULL;
}

static void pfx_reopen(PFix *fx, const KvPool *p) {
    pfx_close(fx);
    pfx_open(fx, p);
}

static int64_t pfx_rows(PFix *fx) {
    int64_t n = -1;
    assert_int_equal(store_run_count(fx->store, &n), MN_OK);
    return n;
}

static void expect_held(Tier *t, uint32_t first, int n, bool held) {
    for (int i = 0; i < n; i++) {
        Hash128 h = h_of(first + (uint32_t)i);
        if (tier_has(t, &h) != held) {
            tier_dump(t);
            fail_msg("block %u: held %d, want %d", first + (uint32_t)i, !held, held);
        }
    }
}

/* The out-of-memory sweeps: put r holds ids 100 r .. and size(r) blocks. */
typedef int (*SweepSize)(int r);

/* Put runs 0..n_puts-1 while an allocation is set to fail: at most one
 * put may fail, with MN_ENOMEM. Its index, or -1 when none met it. */
static int sweep_puts(Tier *t, KvPool *p, int n_puts, SweepSize size, int k) {
    int failed = -1;
    for (int r = 0; r < n_puts; r++) {
        int rc = put_range(t, p, 100 * (uint32_t)r, size(r), (5 * r) % 40);
        if (rc == MN_ENOMEM && failed < 0) failed = r;
        else if (rc != MN_OK) fail_msg("allocation %d: put %d: %s", k, r, mn_strerror(rc));
    }
    return failed;
}

/* After sweep_puts: the failed put left nothing, every other run reads
 * back exact, and the tier takes a further put. */
static void expect_swept(Tier *t, KvPool *p, int n_puts, SweepSize size, int failed) {
    TierStats st;
    tier_stats(t, &st);
    assert_false(st.is_failed);
    assert_int_equal(st.n_runs, n_puts - (failed >= 0));
    for (int r = 0; r < n_puts; r++) {
        if (r == failed) expect_held(t, 100 * (uint32_t)r, size(r), false);
        else expect_range(t, p, 100 * (uint32_t)r, size(r), 40);
    }
    assert_int_equal(put_range(t, p, 5000, 4, 44), MN_OK);
    tier_check(t);
}

static int growing(int r) { return 2 + 2 * r; } /* 2..20: the scratch and the map grow */
static int small(int r) { return 3 + r % 3; }   /* ~5 runs a 64 KiB slab: slabs are made */

/* Out of memory at each allocation of the core that puts meet, in turn
 * (the key map and scratch growing, each run's record, the kind's room):
 * the put that met it fails with MN_ENOMEM and leaves nothing; the tier
 * stays up and every other run reads back exact. */
static void test_tier_put_out_of_memory(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 64, MN_TYPE_F16), MN_OK);
    enum { N_PUTS = 10 };
    int n_failures = 0;
    for (int k = 0;; k++) {
        sweep_bound(k, __func__);
        Fixture fx;
        fx_open(&fx, pa, &p, 4 << 20, 0, false);
        tier_fault_alloc(fx.tier, k, 1);
        int failed = sweep_puts(fx.tier, &p, N_PUTS, growing, k);
        tier_fault_alloc(fx.tier, 0, 0);
        expect_swept(fx.tier, &p, N_PUTS, growing, failed);
        fx_close(&fx);
        if (failed < 0) break; /* k is past every allocation the puts make */
        n_failures++;
    }
    assert_true(n_failures >= 2 * N_PUTS + 2); /* a record and room per put, the growths */
    kvpool_deinit(&p);
}

/* Out of memory at each allocation of the disk tier that puts make, in
 * turn (a run's own record, a new slab's free list, that list's growth,
 * the request array, the encoded run record; the staging buffer was made
 * at open): as
 * above, and no row is left for the failed put, so a reopen finds exactly
 * the runs that were acknowledged. */
static void test_persist_put_out_of_memory(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 48, MN_TYPE_F16), MN_OK);
    enum { N_PUTS = 8 };
    int n_failures = 0;
    for (int k = 0;; k++) {
        sweep_bound(k, __func__);
        PFix fx;
        pfx_new(&fx, pa, &p, 1 << 20, 64 << 10);
        tier_disk_fault_alloc(fx.tier, k, 1);
        int failed = sweep_puts(fx.tier, &p, N_PUTS, small, k);
        tier_disk_fault_alloc(fx.tier, 0, 0);
        assert_int_equal(pfx_rows(&fx), N_PUTS - (failed >= 0));
        expect_swept(fx.tier, &p, N_PUTS, small, failed);
        pfx_reopen(&fx, &p);
        for (int r = 0; r < N_PUTS; r++) expect_held(fx.tier, 100 * (uint32_t)r, small(r), r != failed);
        expect_range(fx.tier, &p, 5000, 4, 40);
        pfx_close(&fx);
        test_rm_dir(fx.dir);
        if (failed < 0) break; /* k is past every allocation the puts make */
        n_failures++;
    }
    /* a DiskRun per put, a free list per slab (2 slabs), a growth of one,
     * the request array, the record buffer: at least 12 */
    assert_true(n_failures >= 12);
    kvpool_deinit(&p);
}

/* Out of memory at each allocation that reopening a disk tier makes, in
 * turn (the kind, its directory name, the slab list, the staging buffer,
 * each reopened slab's free list, the core and its key map, the collected rows and their
 * copies, each adopted run's record in the kind and in the core, the
 * core's scratch and map growing): the open fails with MN_ENOMEM and
 * loses nothing, as an open without the fault then adopts every run and
 * reads each back exact. Once the sweep passes the last allocation the
 * open succeeds, and the unspent fault does not outlive it. */
static void test_persist_reopen_out_of_memory(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 48, MN_TYPE_F16), MN_OK);
    enum { N_RUNS = 8 };
    PFix fx;
    pfx_new(&fx, pa, &p, 1 << 20, 64 << 10);
    for (int r = 0; r < N_RUNS; r++) assert_int_equal(put_range(fx.tier, &p, 100 * (uint32_t)r, small(r), 0), MN_OK);
    pfx_close(&fx);
    int n_failures = 0;
    for (int k = 0;; k++) {
        sweep_bound(k, __func__);
        StoreIdentity id = pool_identity(&p);
        MnErr err = {0};
        assert_int_equal(store_open(fx.dir, &id, &fx.store, &err), MN_OK);
        TierDiskConfig cfg = pfx_config(&fx, &p);
        cfg.test_open_alloc_skip = k;
        cfg.test_open_alloc_fail = 1;
        int rc = tier_disk_new(&cfg, &fx.tier, &err);
        if (rc == MN_OK) { /* past every allocation the open makes */
            TierStats st;
            tier_stats(fx.tier, &st);
            assert_int_equal(st.n_adopted_runs, N_RUNS);
            assert_int_equal(put_range(fx.tier, &p, 5000, 4, 44), MN_OK); /* no fault left over */
            pfx_close(&fx);
            break;
        }
        if (rc != MN_ENOMEM) fail_msg("allocation %d: %s", k, err.msg);
        assert_null(fx.tier);
        assert_int_equal(pfx_rows(&fx), N_RUNS); /* nothing deleted */
        store_close(fx.store);
        fx.store = NULL;
        pfx_open(&fx, &p);
        for (int r = 0; r < N_RUNS; r++) expect_range(fx.tier, &p, 100 * (uint32_t)r, small(r), 40);
        pfx_close(&fx);
        n_failures++;
    }
    /* the kind, its name, the slab list, the staging buffer, 2 free lists,
     * the core, its map, the row list, 8 copies, 8 records in the kind and
     * 8 in the core */
    fprintf(stderr, "test_persist_reopen_out_of_memory: %d allocations failed in turn\n", n_failures);
    assert_true(n_failures >= 32);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

static void test_persist_reopen(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 48, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 1 << 20, 64 << 10);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 5, 0), MN_OK);   /* A: 0..4 */
    assert_int_equal(put_range(t, &p, 10, 2, 5), MN_OK);  /* B: 10 11 */
    assert_int_equal(put_range(t, &p, 20, 7, 7), MN_OK);  /* C: 20..26 */
    assert_int_equal(put_range(t, &p, 3, 2, 14), MN_OK);  /* D: 3 4 move here */
    Hash128 h = h_of(11);
    assert_int_equal(tier_drop(t, &h), MN_OK);            /* recorded nowhere: back after a restart */
    tick();
    uint32_t a_ids[3] = {0, 1, 2};
    int32_t slots[8] = {30, 31, 32, 33, 34, 35, 36, 37};
    assert_int_equal(read_ids(t, &p, a_ids, slots, 3, 0), MN_OK); /* A is the most recent */
    TierLoc before[27];
    for (uint32_t i = 0; i < 27; i++) {
        h = h_of(i);
        if (tier_locate(t, &h, &before[i]) != MN_OK) before[i].run_id = 0;
    }
    assert_int_equal(pfx_rows(&fx), 4);
    TierStats s0;
    tier_stats(t, &s0);

    pfx_reopen(&fx, &p);
    t = fx.tier;
    scramble_pool(&p, 77);
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 4);
    assert_int_equal(s.n_blocks, s0.n_blocks + 1); /* 11 is back */
    assert_int_equal(s.occupancy_bytes, s0.occupancy_bytes);
    assert_int_equal(s.n_adopted_runs, 4);
    assert_int_equal(s.n_evicted_runs, 0);
    /* the order of use came back: B, C, D, then A (read last) */
    Listed l = {0};
    tier_foreach_run(t, on_run, &l);
    assert_int_equal(l.n_runs, 4);
    const uint32_t want_first[4] = {10, 20, 3, 0}, want_n[4] = {2, 7, 2, 3};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(l.first[i], want_first[i]);
        assert_int_equal(l.n_blocks[i], want_n[i]);
    }
    assert_int_equal(l.ids[2][1], 4);
    assert_int_equal(l.ids[0][1], 11); /* back */
    for (uint32_t i = 0; i < 27; i++) {
        if (before[i].run_id == 0 && i != 11) continue;
        TierLoc loc;
        h = h_of(i);
        assert_int_equal(tier_locate(t, &h, &loc), MN_OK);
        if (i == 11) continue;
        assert_int_equal(loc.run_id, before[i].run_id);
        assert_int_equal(loc.index, before[i].index);
        assert_int_equal(loc.n_blocks, before[i].n_blocks);
    }
    expect_range(t, &p, 0, 5, 0); /* 0..2 from A, 3 4 from D */
    expect_range(t, &p, 10, 2, 8);
    expect_range(t, &p, 20, 7, 10);
    /* those reads touched A, D, B, C in that order, and the touches were
     * stored */
    pfx_reopen(&fx, &p);
    t = fx.tier;
    memset(&l, 0, sizeof l);
    tier_foreach_run(t, on_run, &l);
    assert_int_equal(l.n_runs, 4);
    assert_int_equal(l.first[0], 0);
    assert_int_equal(l.n_blocks[0], 3);
    assert_int_equal(l.first[1], 3);
    assert_int_equal(l.n_blocks[1], 2);
    assert_int_equal(l.first[2], 10);
    assert_int_equal(l.n_blocks[2], 2);
    assert_int_equal(l.first[3], 20);
    assert_int_equal(l.n_blocks[3], 7);
    /* new runs continue above the adopted ids */
    assert_int_equal(put_range(t, &p, 40, 2, 0), MN_OK);
    TierLoc loc;
    h = h_of(40);
    assert_int_equal(tier_locate(t, &h, &loc), MN_OK);
    assert_true(loc.run_id > before[20].run_id && loc.run_id > before[3].run_id);
    /* dropping a run deletes its row */
    h = h_of(10);
    assert_int_equal(tier_drop_run(t, &h), MN_OK);
    assert_int_equal(pfx_rows(&fx), 4);
    pfx_reopen(&fx, &p);
    t = fx.tier;
    expect_held(t, 10, 2, false);
    expect_range(t, &p, 40, 2, 0);
    /* a store of another identity is refused */
    tier_free(fx.tier);
    fx.tier = NULL;
    KvPool other;
    assert_int_equal(kvpool_init(&other, 3, 16, 4, 8, MN_TYPE_F16), MN_OK);
    TierDiskConfig cfg = pfx_config(&fx, &other);
    MnErr err = {0};
    Tier *bad = (Tier *)1;
    assert_int_equal(tier_disk_new(&cfg, &bad, &err), MN_EINVAL);
    assert_null(bad);
    assert_non_null(strstr(err.msg, "mnemo.db"));
    kvpool_deinit(&other);
    pfx_close(&fx);
    /* reset forgets everything, rows and files */
    pfx_open(&fx, &p);
    t = fx.tier;
    assert_true(pfx_rows(&fx) > 0);
    assert_int_equal(tier_reset(t), MN_OK);
    assert_int_equal(pfx_rows(&fx), 0);
    assert_int_equal(put_range(t, &p, 50, 2, 0), MN_OK);
    pfx_reopen(&fx, &p);
    t = fx.tier;
    expect_held(t, 0, 5, false);
    expect_held(t, 40, 2, false);
    expect_range(t, &p, 50, 2, 0);
    tier_check(t);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

static void test_persist_corrupt_extent(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 1 << 20, 0);
    assert_int_equal(put_range(fx.tier, &p, 0, 5, 0), MN_OK);
    assert_int_equal(put_range(fx.tier, &p, 10, 2, 5), MN_OK);
    char path[256];
    uint64_t off, len;
    Hash128 h = h_of(2);
    assert_int_equal(tier_disk_extent(fx.tier, &h, 1, path, sizeof path, &off, &len), MN_OK);
    pfx_close(&fx);
    corrupt_byte(path, off + 2 * p.block_bytes + 5); /* block 2 of layer 1 */
    pfx_open(&fx, &p);
    Tier *t = fx.tier;
    expect_held(t, 0, 5, true); /* nothing tells yet */
    uint32_t ids[5] = {0, 1, 2, 3, 4};
    int32_t slots[5] = {20, 21, 22, 23, 24};
    assert_int_equal(read_ids(t, &p, ids, slots, 5, 0), MN_OK);
    assert_int_equal(read_ids(t, &p, ids, slots, 5, 1), MN_ECHECKSUM);
    assert_int_equal(fx.drops.last_why, TIER_DROP_CHECKSUM);
    assert_int_equal(fx.drops.n_blocks, 5);
    expect_held(t, 0, 5, false);
    assert_int_equal(pfx_rows(&fx), 1); /* its row went with it */
    pfx_reopen(&fx, &p);
    t = fx.tier;
    expect_held(t, 0, 5, false);
    expect_range(t, &p, 10, 2, 0);
    /* its pages are free again */
    assert_int_equal(put_range(t, &p, 0, 5, 0), MN_OK);
    expect_range(t, &p, 0, 5, 20);
    tier_check(t);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* Re-stamp a record after editing it: the trailing XXH3-64 of the rest. */
static void record_reseal(uint8_t *rec, size_t len) {
    uint64_t c = XXH3_64bits_withSeed(rec, len - 8, 0);
    for (int i = 0; i < 8; i++) rec[len - 8 + (size_t)i] = (uint8_t)(c >> (8 * i));
}

static void rec_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

typedef struct Rows {
    int n;
    uint64_t ids[8];
    uint8_t recs[8][512];
    size_t lens[8];
} Rows;

static int on_row(void *ctx, uint64_t run_id, const void *record, size_t len, double last_used,
                  const Hash128 *ns_id) {
    Rows *r = ctx;
    assert_true(r->n < 8 && len <= 512);
    r->ids[r->n] = run_id;
    memcpy(r->recs[r->n], record, len);
    r->lens[r->n] = len;
    r->n++;
    return 0;
}

static void test_persist_bad_rows(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 1 << 20, 0);
    assert_int_equal(put_range(fx.tier, &p, 0, 3, 0), MN_OK);  /* A */
    assert_int_equal(put_range(fx.tier, &p, 10, 3, 3), MN_OK); /* B */
    assert_int_equal(put_range(fx.tier, &p, 20, 3, 6), MN_OK); /* C */
    assert_int_equal(put_range(fx.tier, &p, 30, 3, 9), MN_OK); /* E */
    tier_free(fx.tier);
    fx.tier = NULL;
    Rows rows = {0};
    assert_int_equal(store_run_foreach(fx.store, on_row, &rows), MN_OK);
    assert_int_equal(rows.n, 4);
    CacheStore *s = fx.store;
    double now = mn_wall_now();
    /* A: a flipped byte (record checksum) */
    rows.recs[0][90] ^= 1;
    assert_int_equal(store_run_put(s, rows.ids[0], rows.recs[0], rows.lens[0], now, NULL), MN_OK);
    /* garbage, and a valid record filed under another id */
    assert_int_equal(store_run_put(s, 999, "garbage", 7, now, NULL), MN_OK);
    assert_int_equal(store_run_put(s, 1000, rows.recs[1], rows.lens[1], now, NULL), MN_OK);
    /* a forged later run over C's pages: C loses the overlap, the forgery
     * is adopted but its extents fail their seeds when read */
    uint8_t forged[512];
    memcpy(forged, rows.recs[2], rows.lens[2]);
    rec_put_u64(forged + 16, rows.ids[2] + 100);
    record_reseal(forged, rows.lens[2]);
    assert_int_equal(store_run_put(s, rows.ids[2] + 100, forged, rows.lens[2], now, NULL), MN_OK);
    /* E moved outside its slab */
    rec_put_u64(rows.recs[3] + 32, 1ull << 40);
    record_reseal(rows.recs[3], rows.lens[3]);
    assert_int_equal(store_run_put(s, rows.ids[3], rows.recs[3], rows.lens[3], now, NULL), MN_OK);
    /* a record of another model, filed under its own id */
    memcpy(forged, rows.recs[1], rows.lens[1]);
    rec_put_u64(forged + 16, 1001);
    forged[64] ^= 1; /* fingerprint */
    record_reseal(forged, rows.lens[1]);
    assert_int_equal(store_run_put(s, 1001, forged, rows.lens[1], now, NULL), MN_OK);
    TierDiskConfig cfg = pfx_config(&fx, &p);
    MnErr err = {0};
    assert_int_equal(tier_disk_new(&cfg, &fx.tier, &err), MN_OK);
    tier_set_drop_fn(fx.tier, on_drop, &fx.drops);
    Tier *t = fx.tier;
    tier_check(t);
    expect_held(t, 0, 3, false);
    expect_held(t, 10, 3, true);
    expect_held(t, 20, 3, true); /* by the forgery */
    expect_held(t, 30, 3, false);
    TierLoc loc;
    Hash128 h = h_of(20);
    assert_int_equal(tier_locate(t, &h, &loc), MN_OK);
    assert_int_equal(loc.run_id, rows.ids[2] + 100);
    assert_int_equal(pfx_rows(&fx), 2); /* B and the forgery */
    expect_range(t, &p, 10, 3, 0);
    uint32_t ids[3] = {20, 21, 22};
    int32_t slots[3] = {0, 1, 2};
    assert_int_equal(read_ids(t, &p, ids, slots, 3, 0), MN_ECHECKSUM); /* never served */
    expect_held(t, 20, 3, false);
    assert_int_equal(pfx_rows(&fx), 1);
    /* new ids are above every id seen, adopted or not */
    assert_int_equal(put_range(t, &p, 40, 1, 0), MN_OK);
    h = h_of(40);
    assert_int_equal(tier_locate(t, &h, &loc), MN_OK);
    assert_true(loc.run_id > 1001);
    tier_check(t);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

static void test_persist_truncated_slab(void **state) {
    const Param *pa = *state;
    KvPool p; /* 2 layers of 128-byte blocks: a run of up to 32 blocks takes 8 KiB */
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 64 << 10, 16 << 10); /* slabs of 2 runs */
    for (uint32_t k = 0; k < 4; k++) assert_int_equal(put_range(fx.tier, &p, 10 * k, 4, 0), MN_OK);
    char path[256];
    uint64_t off, len;
    Hash128 h = h_of(20);
    assert_int_equal(tier_disk_extent(fx.tier, &h, 0, path, sizeof path, &off, &len), MN_OK);
    assert_non_null(strstr(path, "slab-00001.dat"));
    pfx_close(&fx);
    assert_int_equal(truncate(path, (off_t)(off + 4096)), 0); /* mid-run */
    pfx_open(&fx, &p);
    Tier *t = fx.tier;
    expect_range(t, &p, 0, 4, 0);
    expect_range(t, &p, 10, 4, 0);
    expect_held(t, 20, 4, false);
    expect_held(t, 30, 4, false);
    assert_int_equal(pfx_rows(&fx), 2);
    assert_int_equal(access(path, F_OK), -1); /* removed, made again when needed */
    for (uint32_t k = 4; k < 6; k++) assert_int_equal(put_range(t, &p, 10 * k, 4, 0), MN_OK);
    expect_range(t, &p, 40, 4, 0);
    assert_int_equal(access(path, F_OK), 0);
    tier_check(t);
    /* cut while open: a short read is a checksum failure, never served */
    h = h_of(50);
    assert_int_equal(tier_disk_extent(t, &h, 0, path, sizeof path, &off, &len), MN_OK);
    assert_int_equal(truncate(path, (off_t)off), 0);
    uint32_t ids[1] = {50};
    int32_t slots[1] = {0};
    assert_int_equal(read_ids(t, &p, ids, slots, 1, 0), MN_ECHECKSUM);
    pfx_reopen(&fx, &p); /* the cut slab (and its runs) is dropped at open */
    t = fx.tier;
    expect_held(t, 40, 4, false);
    expect_range(t, &p, 0, 4, 0);
    tier_check(t);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* Write `version` into slab file path's header, with a matching header
 * checksum (a slab written by another format version). */
static void stamp_slab_version(const char *path, uint32_t version) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t h[64];
    assert_int_equal(pread(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(version >> (8 * i));
    uint64_t sum = XXH3_64bits_withSeed(h, 56, 0);
    for (int i = 0; i < 8; i++) h[56 + i] = (uint8_t)(sum >> (8 * i));
    assert_int_equal(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    close(fd);
}

/* tier_touch: a run whose blocks a finished turn names becomes the most
 * recently used, so lru takes the other one; an older time or a block not
 * held moves nothing. On disk the time is kept in the run's row: after a
 * reopen the order holds. */
static void touch_order(Tier *t, KvPool *p, Drops *drops, bool put_first) {
    if (put_first) {
        assert_int_equal(put_range(t, p, 0, 4, 0), MN_OK);  /* A */
        assert_int_equal(put_range(t, p, 10, 4, 4), MN_OK); /* B, used later */
        Hash128 h[2] = {h_of(2), h_of(99)};
        assert_int_equal(tier_touch(t, h, 2, mn_wall_now() + 10), 1);      /* A's run, 99 not held */
        assert_int_equal(tier_touch(t, h, 1, mn_wall_now() - 100), 0);     /* older: nothing moves */
        Hash128 twice[2] = {h_of(1), h_of(3)};
        assert_int_equal(tier_touch(t, twice, 2, mn_wall_now() + 20), 1); /* one run, moved once */
    }
    drops->n_calls = drops->n_blocks = 0;
    assert_int_equal(put_range(t, p, 20, 4, 8), MN_OK); /* C evicts B, not A */
    assert_int_equal(drops->n_blocks, 4);
    assert_true(dropped(drops, 10) && !dropped(drops, 0));
    tier_check(t);
}

static void test_tier_touch(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 128, 8, 32, MN_TYPE_F16), MN_OK); /* 4096-byte blocks */
    uint64_t rb = run_bytes(pa, &p, 4);
    Fixture fx;
    fx_open(&fx, pa, &p, 2 * rb + rb / 2, 0, false);
    Drops drops = {0};
    tier_set_drop_fn(fx.tier, on_drop, &drops);
    touch_order(fx.tier, &p, &drops, true);
    fx_close(&fx);
    if (pa->kind == KIND_DISK) {
        PFix pf;
        pfx_new(&pf, pa, &p, 2 * rb + rb / 2, 4 * rb);
        assert_int_equal(put_range(pf.tier, &p, 0, 4, 0), MN_OK);
        assert_int_equal(put_range(pf.tier, &p, 10, 4, 4), MN_OK);
        Hash128 h = h_of(0);
        assert_int_equal(tier_touch(pf.tier, &h, 1, mn_wall_now() + 10), 1);
        pfx_reopen(&pf, &p);
        touch_order(pf.tier, &p, &pf.drops, false);
        pfx_close(&pf);
        test_rm_dir(pf.dir);
    }
    kvpool_deinit(&p);
}

/* A run's position is part of its record: after a restart pensieve still
 * evicts the cheap leading run before an older expensive one. */
static void test_persist_policy(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 128, 8, 64, MN_TYPE_F16), MN_OK);
    uint64_t rb = run_bytes(pa, &p, 4);
    PFix fx;
    pfx_new(&fx, pa, &p, 3 * rb + rb / 2, 4 * rb);
    put_bac(fx.tier, &p);
    pfx_reopen(&fx, &p);
    tier_set_policy(fx.tier, EVICT_PENSIEVE, NULL);
    put_evicts(fx.tier, &p, &fx.drops, 300, 512, 0);
    put_evicts(fx.tier, &p, &fx.drops, 400, 1024, 200);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* A directory whose data is of another format version is refused with a
 * message naming both versions, and nothing in it is deleted; put back,
 * it opens as before. */
static void test_persist_other_format(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 64 << 10, 16 << 10);
    assert_int_equal(put_range(fx.tier, &p, 0, 4, 0), MN_OK);
    pfx_close(&fx);
    char path[256];
    snprintf(path, sizeof path, "%s/slab-00000.dat", fx.dir);
    stamp_slab_version(path, 2);
    StoreIdentity id = pool_identity(&p);
    MnErr err = {0};
    assert_int_equal(store_open(fx.dir, &id, &fx.store, &err), MN_OK);
    TierDiskConfig cfg = pfx_config(&fx, &p);
    assert_int_equal(tier_disk_new(&cfg, &fx.tier, &err), MN_EFORMAT);
    assert_null(fx.tier);
    assert_non_null(strstr(err.msg, "format version 2, this build uses 1"));
    assert_int_equal(access(path, F_OK), 0);
    int64_t n = -1;
    assert_int_equal(store_run_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 1); /* its row is kept too */
    store_close(fx.store);
    fx.store = NULL;
    stamp_slab_version(path, 1);
    pfx_open(&fx, &p);
    expect_range(fx.tier, &p, 0, 4, 8);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

static void test_persist_shrink(void **state) {
    const Param *pa = *state;
    KvPool p; /* runs of 4 blocks take 8 KiB */
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 64 << 10, 16 << 10); /* 4 slabs of 2 runs */
    for (uint32_t k = 0; k < 8; k++) assert_int_equal(put_range(fx.tier, &p, 10 * k, 4, 0), MN_OK);
    tick();
    /* use runs 7, 1, 6, 0 (in that order): they are the most recent now */
    uint32_t order[4] = {7, 1, 6, 0};
    for (int i = 0; i < 4; i++) expect_range(fx.tier, &p, 10 * order[i], 4, 0);
    /* half the budget: the 4 least recently used go */
    fx.capacity = 32 << 10;
    pfx_reopen(&fx, &p);
    Tier *t = fx.tier;
    TierStats s;
    tier_stats(t, &s);
    assert_int_equal(s.n_runs, 4);
    assert_int_equal(s.n_evicted_runs, 4);
    assert_int_equal(s.capacity_bytes, 32 << 10);
    for (uint32_t k = 0; k < 8; k++) expect_held(t, 10 * k, 4, k == 0 || k == 1 || k == 6 || k == 7);
    assert_int_equal(pfx_rows(&fx), 4);
    Listed l = {0};
    tier_foreach_run(t, on_run, &l);
    assert_int_equal(l.n_runs, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(l.first[i], 10 * order[i]);
    tier_check(t);
    /* runs 0 1 fill slab 0, 6 7 slab 3: slabs 1 and 2 are empty but not last */
    char path[256];
    snprintf(path, sizeof path, "%s/slab-00003.dat", fx.dir);
    assert_int_equal(access(path, F_OK), 0);
    /* drop 6 and 7: now the trailing slabs go at the next open */
    Hash128 h = h_of(60);
    assert_int_equal(tier_drop_run(t, &h), MN_OK);
    h = h_of(70);
    assert_int_equal(tier_drop_run(t, &h), MN_OK);
    pfx_reopen(&fx, &p);
    t = fx.tier;
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/slab-00002.dat", fx.dir);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/slab-00001.dat", fx.dir);
    assert_int_equal(access(path, F_OK), 0); /* the budget still wants it */
    /* full use of the smaller budget works */
    for (uint32_t k = 10; k < 14; k++) assert_int_equal(put_range(t, &p, 10 * k, 4, 0), MN_OK);
    tier_stats(t, &s);
    assert_int_equal(s.occupancy_bytes, 32 << 10);
    expect_range(t, &p, 130, 4, 0);
    tier_check(t);
    /* a run bigger than the whole budget at open is dropped */
    pfx_close(&fx);
    fx.capacity = 4 << 10;
    pfx_open(&fx, &p);
    tier_stats(fx.tier, &s);
    assert_int_equal(s.n_runs, 0);
    assert_int_equal(pfx_rows(&fx), 0);
    tier_check(fx.tier);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* A failed row commit leaves no run: MN_EFULL keeps the tier working,
 * MN_EIO is sticky. */
static void test_persist_store_faults(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 1 << 20, 0);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 3, 0), MN_OK);
    store_fault_set(fx.store, 0, 1, SQLITE_FULL);
    assert_int_equal(put_range(t, &p, 10, 3, 3), MN_EFULL);
    expect_held(t, 10, 3, false);
    TierStats s;
    tier_stats(t, &s);
    assert_false(s.is_failed);
    assert_int_equal(s.n_puts_full, 1);
    assert_int_equal(s.n_runs, 1);
    assert_int_equal(put_range(t, &p, 10, 3, 3), MN_OK);
    /* a failed touch or delete is only logged */
    store_fault_set(fx.store, 0, 1, SQLITE_IOERR);
    expect_range(t, &p, 10, 3, 6);
    tier_stats(t, &s);
    assert_false(s.is_failed);
    store_fault_set(fx.store, 0, 1, SQLITE_IOERR);
    Hash128 h = h_of(0);
    assert_int_equal(tier_drop_run(t, &h), MN_OK);
    assert_int_equal(pfx_rows(&fx), 2); /* the stale row stays ... */
    store_fault_set(fx.store, 0, 1, SQLITE_IOERR);
    assert_int_equal(put_range(t, &p, 20, 3, 0), MN_EIO);
    tier_stats(t, &s);
    assert_true(s.is_failed);
    expect_held(t, 20, 3, false);
    assert_int_equal(tier_reset(t), MN_OK);
    assert_int_equal(put_range(t, &p, 30, 5, 0), MN_OK); /* reuses the stale row's pages */
    pfx_reopen(&fx, &p); /* ... and loses the overlap to the later run at open */
    t = fx.tier;
    expect_held(t, 0, 3, false);
    expect_range(t, &p, 30, 5, 10);
    assert_int_equal(pfx_rows(&fx), 1);
    tier_check(t);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* ---- disk: crashes ---------------------------------------------------------------- */

static void copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY);
    if (in < 0) return; /* (no WAL: nothing to copy) */
    int out = open(to, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    assert_true(out >= 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0) assert_int_equal(write(out, buf, (size_t)n), n);
    assert_int_equal(n, 0);
    close(in);
    close(out);
}

/* Copy every file of dir into a new directory (a crash image: what a
 * killed process leaves, since nothing is in its memory only). */
static void copy_dir(const char *dir, char *copy) {
    strcpy(copy, "/tmp/mnemo-crash-XXXXXX");
    assert_non_null(mkdtemp(copy));
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", dir, e->d_name);
        snprintf(b, sizeof b, "%s/%s", copy, e->d_name);
        copy_file(a, b);
    }
    closedir(d);
}

static void test_persist_crash_copy(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 32, MN_TYPE_F16), MN_OK);
    PFix fx;
    pfx_new(&fx, pa, &p, 1 << 20, 32 << 10);
    for (uint32_t k = 0; k < 6; k++) assert_int_equal(put_range(fx.tier, &p, 10 * k, 1 + k, 0), MN_OK);
    Hash128 h = h_of(20);
    assert_int_equal(tier_drop_run(fx.tier, &h), MN_OK);
    char wal[256];
    snprintf(wal, sizeof wal, "%s/mnemo.db-wal", fx.dir);
    struct stat st;
    assert_int_equal(stat(wal, &st), 0);
    assert_true(st.st_size > 0); /* the rows are in the WAL only */
    PFix cx = fx;
    copy_dir(fx.dir, cx.dir);
    /* the original goes on meanwhile */
    assert_int_equal(put_range(fx.tier, &p, 100, 4, 0), MN_OK);
    pfx_open(&cx, &p);
    Tier *t = cx.tier;
    for (uint32_t k = 0; k < 6; k++) {
        if (k == 2) expect_held(t, 10 * k, 1 + (int)k, false);
        else expect_range(t, &p, 10 * k, 1 + (int)k, 0);
    }
    expect_held(t, 100, 4, false);
    tier_check(t);
    /* and the copy lives on by itself */
    assert_int_equal(put_range(t, &p, 200, 4, 0), MN_OK);
    pfx_reopen(&cx, &p);
    expect_range(cx.tier, &p, 200, 4, 0);
    pfx_close(&cx);
    test_rm_dir(cx.dir);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* A child puts runs into dir and reports each completed put on fd; it is
 * SIGKILLed at an arbitrary moment by the parent. Never returns. */
static void crash_child(const Param *pa, const char *dir, uint32_t first_run, int fd) {
    alarm(60); /* in case the parent is gone */
    KvPool p;
    if (kvpool_init(&p, 3, 8, 4, 32, MN_TYPE_F16) != MN_OK) _exit(2);
    PFix fx;
    memset(&fx, 0, sizeof fx);
    strcpy(fx.dir, dir);
    fx.backend = pa->backend;
    fx.capacity = 4 << 20;
    fx.slab_bytes = 64 << 10;
    fx.is_durable = true;
    StoreIdentity id = pool_identity(&p);
    MnErr err;
    if (store_open(fx.dir, &id, &fx.store, &err) != MN_OK) _exit(3);
    TierDiskConfig cfg = pfx_config(&fx, &p);
    if (tier_disk_new(&cfg, &fx.tier, &err) != MN_OK) _exit(4);
    for (uint32_t k = first_run;; k++) {
        if (put_range(fx.tier, &p, 1000 + 16 * k, 1 + (int)(k % 9), (int32_t)(k % 20)) != MN_OK) _exit(5);
        if (write(fd, &k, sizeof k) != (ssize_t)sizeof k) _exit(6);
        if (k % 5 == 4) { /* some churn: drops too */
            Hash128 h = h_of(1000 + 16 * (k - 3));
            tier_drop_run(fx.tier, &h);
        }
    }
}

static void test_persist_kill(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 32, MN_TYPE_F16), MN_OK);
    char dir[64];
    strcpy(dir, "/tmp/mnemo-kill-XXXXXX");
    assert_non_null(mkdtemp(dir));
    uint32_t next = 0;
    bool completed[128] = {0};
    const int kill_after[4] = {3, 11, 1, 25};
    for (int round = 0; round < 4; round++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(pa, dir, next, fds[1]);
        }
        close(fds[1]);
        uint32_t k = 0, done_until = next;
        int n = 0;
        while (n < kill_after[round] && read(fds[0], &k, sizeof k) == (ssize_t)sizeof k) {
            n++;
            assert_true(k < 127);
            completed[k] = true;
            done_until = k + 1;
        }
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        close(fds[0]);
        if (!WIFSIGNALED(status)) fail_msg("child ended on its own: status %d", status);
        assert_int_equal(n, kill_after[round]);
        /* every completed put is served bit for bit (unless dropped on
         * purpose); the one cut short is held exactly or not at all */
        PFix fx;
        memset(&fx, 0, sizeof fx);
        strcpy(fx.dir, dir);
        fx.backend = pa->backend;
        fx.capacity = 4 << 20;
        fx.slab_bytes = 64 << 10;
        fx.is_durable = true;
        pfx_open(&fx, &p);
        for (uint32_t r = 0; r <= done_until; r++) {
            int len = 1 + (int)(r % 9);
            /* run r % 5 == 1 is dropped after run r + 3 completes: maybe */
            bool may_be_dropped = r % 5 == 1 && completed[r + 3];
            Hash128 h = h_of(1000 + 16 * r);
            bool held = tier_has(fx.tier, &h);
            if (completed[r] && !may_be_dropped && !held) {
                tier_dump(fx.tier);
                fail_msg("round %d: run %u completed before the kill but is not held", round, r);
            }
            if (held) expect_range(fx.tier, &p, 1000 + 16 * r, len, 0);
            else expect_held(fx.tier, 1000 + 16 * r, len, false);
        }
        tier_check(fx.tier);
        pfx_close(&fx);
        next = done_until + 1; /* the next child starts above what may be held */
    }
    test_rm_dir(dir);
    kvpool_deinit(&p);
}

/* ---- randomized, against a model --------------------------------------------- */

enum { MODEL_IDS = 160 };

static void test_tier_model(void **state) {
    const Param *pa = *state;
    KvPool p; /* 1 KiB blocks: a disk run of n blocks takes ceil(n/4) pages a layer */
    assert_int_equal(kvpool_init(&p, 3, 32, 8, 64, MN_TYPE_F16), MN_OK);
    assert_int_equal(p.block_bytes, 1024);
    /* a budget of 40 blocks for the RAM tier; on disk 30 pages a layer, in
     * slabs of 7 so runs of 1 to 3 pages fragment them */
    uint64_t cap = pa->kind == KIND_RAM ? 40 * 3 * p.block_bytes : 30 * 3 * 4096;
    Fixture fx;
    fx_open(&fx, pa, &p, cap, 7 * 3 * 4096, false);
    Tier *t = fx.tier;
    bool held[MODEL_IDS] = {0};
    Drops drops = {.held = held};
    tier_set_drop_fn(t, on_drop, &drops);
    uint64_t seed = 1234;
    int n_ok_reads = 0, n_full = 0;
    for (int step = 0; step < 3000; step++) {
        int op = (int)(splitmix(&seed) % 100);
        if (op < 40) { /* put a run of consecutive ids, overlapping others at times */
            int n = 1 + (int)(splitmix(&seed) % 10);
            uint32_t first = (uint32_t)(splitmix(&seed) % (MODEL_IDS - (uint64_t)n));
            int32_t slot0 = (int32_t)(splitmix(&seed) % (uint64_t)p.n_blocks);
            bool inject = pa->kind == KIND_DISK && splitmix(&seed) % 20 == 0;
            if (inject) aio_fault_set(tier_disk_aio(t), AIO_OP_WRITE, 0, 1, ENOSPC);
            int rc = put_range(t, &p, first, n, slot0);
            if (inject) aio_fault_set(tier_disk_aio(t), 0, 0, 0, 0);
            /* an injected ENOSPC refuses the put, unless a new slab file's
             * header write took it (older runs then make room instead) */
            if (inject && rc == MN_EFULL) {
                n_full++; /* old copies stay; evictions were reported */
            } else {
                assert_int_equal(rc, MN_OK);
                for (int i = 0; i < n; i++) held[first + (uint32_t)i] = true;
            }
        } else if (op < 80) { /* read some held blocks, one layer */
            uint32_t ids[12];
            int32_t slots[12];
            int n = 0, want = 1 + (int)(splitmix(&seed) % 12);
            for (int tries = 0; tries < 64 && n < want; tries++) {
                uint32_t id = (uint32_t)(splitmix(&seed) % MODEL_IDS);
                if (!held[id]) continue;
                ids[n] = id;
                slots[n] = (int32_t)((uint64_t)n * 5 + splitmix(&seed) % 5); /* distinct */
                n++;
            }
            if (n == 0) continue;
            int layer = (int)(splitmix(&seed) % (uint64_t)p.n_layer);
            int rc = read_ids(t, &p, ids, slots, n, layer);
            if (rc != MN_OK) {
                tier_dump(t);
                fail_msg("step %d: read of %d held blocks: %s", step, n, mn_strerror(rc));
            }
            for (int i = 0; i < n; i++) assert_true(slot_is(&p, layer, slots[i], ids[i]));
            n_ok_reads++;
        } else if (op < 90) { /* drop one block */
            uint32_t id = (uint32_t)(splitmix(&seed) % MODEL_IDS);
            Hash128 h = h_of(id);
            assert_int_equal(tier_drop(t, &h), held[id] ? MN_OK : MN_ENOTFOUND);
            held[id] = false;
        } else if (op < 97) { /* drop a run (reported through the callback) */
            uint32_t id = (uint32_t)(splitmix(&seed) % MODEL_IDS);
            Hash128 h = h_of(id);
            bool was = held[id];
            assert_int_equal(tier_drop_run(t, &h), was ? MN_OK : MN_ENOTFOUND);
            assert_false(held[id]);
        } else { /* a read of something not held is refused, nothing read */
            uint32_t id = (uint32_t)(splitmix(&seed) % MODEL_IDS);
            if (held[id]) continue;
            int32_t slot = 0;
            assert_int_equal(read_ids(t, &p, &id, &slot, 1, 0), MN_ENOTFOUND);
        }
        tier_check(t);
        TierStats s;
        tier_stats(t, &s);
        uint64_t n_held = 0;
        for (uint32_t id = 0; id < MODEL_IDS; id++) {
            Hash128 h = h_of(id);
            if (tier_has(t, &h) != held[id]) {
                tier_dump(t);
                fail_msg("step %d: id %u: tier has %d, model %d", step, id, !held[id], held[id]);
            }
            n_held += held[id];
        }
        assert_int_equal(s.n_blocks, n_held);
        assert_true(s.occupancy_bytes <= s.capacity_bytes);
        assert_false(s.is_failed);
    }
    TierStats s;
    tier_stats(t, &s);
    assert_true(s.n_evicted_runs > 50); /* the budget was small: eviction ran often */
    assert_true(n_ok_reads > 500);
    assert_int_equal(s.n_puts_full, (uint64_t)n_full);
    assert_int_equal(s.n_checksum_failures, 0);
    fx_close(&fx);
    kvpool_deinit(&p);
}

/* ---- disk: data at rest -------------------------------------------------------- */

/* A store and a disk tier on dir (made when missing), a few runs written:
 * slab files, the database and its WAL exist. */
static void open_and_fill(const char *dir, KvPool *p) {
    PFix fx = {.backend = AIO_BACKEND_AUTO, .capacity = 1 << 20, .slab_bytes = 64 << 10, .is_durable = true};
    snprintf(fx.dir, sizeof fx.dir, "%s", dir);
    pfx_open(&fx, p);
    for (int r = 0; r < 3; r++) assert_int_equal(put_range(fx.tier, p, 10 * (uint32_t)r, 4, 4 * r), MN_OK);
    static const char *const files[] = {"mnemo.db", "mnemo.db-wal", "slab-00000.dat"};
    test_expect_private(dir, files, 3); /* while open: the WAL is there */
    pfx_close(&fx);
    test_expect_private(dir, files, 1);
}

/* The tier's directory is made 0700 and every file in it 0600, whatever
 * the umask (022, the usual one that made mnemo.db 0644, and 0277, which
 * takes even the owner's write bit): the database, its WAL, the slabs,
 * and the directory of a tier without a store. A directory and database
 * left readable by an earlier mnemo are tightened when opened. */
static void test_disk_dir_private(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    mode_t old = umask(022);
    char base[64], dir[128];
    strcpy(base, "/tmp/mnemo-private-XXXXXX");
    assert_non_null(mkdtemp(base));
    static const mode_t masks[] = {022, 0277, 0};
    for (int m = 0; m < 3; m++) {
        umask(masks[m]);
        snprintf(dir, sizeof dir, "%s/tier%d", base, m); /* missing: made by store_open */
        open_and_fill(dir, &p);
        test_rm_dir(dir);
    }
    /* without a store, tier_disk_new makes the directory */
    umask(022);
    snprintf(dir, sizeof dir, "%s/bare", base);
    TierDiskConfig cfg = {.dir = dir, .capacity_bytes = 1 << 20, .n_layer = p.n_layer, .block_bytes = p.block_bytes,
                          .kv_format = 1 | (uint32_t)p.block_tokens << 8, .slab_bytes = 64 << 10};
    Tier *t = NULL;
    MnErr err = {0};
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_OK);
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    static const char *const slab[] = {"slab-00000.dat"};
    test_expect_private(dir, slab, 1);
    tier_free(t);
    test_rm_dir(dir);
    /* an earlier mnemo's 0755 directory and 0644 database: made private */
    snprintf(dir, sizeof dir, "%s/old", base);
    open_and_fill(dir, &p);
    char db[160];
    snprintf(db, sizeof db, "%s/mnemo.db", dir);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chmod(db, 0644), 0);
    open_and_fill(dir, &p);
    test_rm_dir(dir);
    rmdir(base);
    umask(old);
    kvpool_deinit(&p);
}

/* Open dir as a server would (store, then tier) and as a tier alone:
 * both must refuse it with MN_EINVAL and a message naming `names` and
 * saying `fix`. */
static void expect_refused(const char *dir, const KvPool *p, const char *names, const char *fix) {
    StoreIdentity id = pool_identity(p);
    CacheStore *s = (CacheStore *)1;
    MnErr err = {0};
    assert_int_equal(store_open(dir, &id, &s, &err), MN_EINVAL);
    assert_null(s);
    if (strstr(err.msg, names) == NULL || strstr(err.msg, fix) == NULL)
        fail_msg("store_open: \"%s\" names no %s or no \"%s\"", err.msg, names, fix);
    TierDiskConfig cfg = {.dir = dir, .capacity_bytes = 1 << 20, .n_layer = p->n_layer, .block_bytes = p->block_bytes,
                          .kv_format = 1 | (uint32_t)p->block_tokens << 8};
    Tier *t = (Tier *)1;
    memset(&err, 0, sizeof err);
    assert_int_equal(tier_disk_new(&cfg, &t, &err), MN_EINVAL);
    assert_null(t);
    if (strstr(err.msg, names) == NULL || strstr(err.msg, fix) == NULL)
        fail_msg("tier_disk_new: \"%s\" names no %s or no \"%s\"", err.msg, names, fix);
}

/* A tier directory that other users can write (group, others, the sticky
 * /tmp kind) is refused, and left as it was; so is one owned by another
 * user, a database or slab owned by another user, and a symlink where a
 * cache file belongs. */
static void test_disk_dir_refused(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    char dir[64], path[128];
    strcpy(dir, "/tmp/mnemo-refused-XXXXXX");
    assert_non_null(mkdtemp(dir));
    static const mode_t loose[] = {0770, 0720, 0702, 01777};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(chmod(dir, loose[i]), 0);
        expect_refused(dir, &p, dir, "chmod 700");
        struct stat st;
        assert_int_equal(stat(dir, &st), 0);
        assert_int_equal(st.st_mode & 07777, loose[i]); /* not tightened behind the operator's back */
        snprintf(path, sizeof path, "%s/mnemo.db", dir);
        assert_int_equal(access(path, F_OK), -1); /* nothing made in it */
    }
    assert_int_equal(chmod(dir, 0700), 0);
    open_and_fill(dir, &p);
    /* a symlink where the database or a slab belongs */
    static const char *const names[] = {"mnemo.db", "slab-00000.dat"};
    for (int i = 0; i < 2; i++) {
        char moved[160];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(moved, sizeof moved, "%s.real", path);
        assert_int_equal(rename(path, moved), 0);
        assert_int_equal(symlink(moved, path), 0);
        expect_refused(dir, &p, path, "not a regular file");
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rename(moved, path), 0);
    }
    if (geteuid() == 0) { /* another owner: only root can make one */
        assert_int_equal(chown(dir, 65534, 65534), 0);
        expect_refused(dir, &p, dir, "belongs to uid 65534");
        assert_int_equal(chown(dir, 0, 0), 0);
        snprintf(path, sizeof path, "%s/slab-00000.dat", dir);
        assert_int_equal(chown(path, 65534, 65534), 0);
        expect_refused(dir, &p, path, "belongs to uid 65534");
        assert_int_equal(chown(path, 0, 0), 0);
    } else {
        fprintf(stderr, "(not root: the foreign-owner cases are skipped)\n");
    }
    open_and_fill(dir, &p); /* fine again */
    test_rm_dir(dir);
    kvpool_deinit(&p);
}

/* Blocks ids first.. of a run in namespace ns (NULL: not known), each
 * filled with the byte `fill` in every layer: a pattern a raw look at the
 * slab files can find. */
static void put_marked(Tier *t, KvPool *p, uint32_t first, int n, const Hash128 *ns, uint8_t fill) {
    Hash128 h[16];
    int32_t slots[16];
    for (int i = 0; i < n; i++) {
        h[i] = h_of(first + (uint32_t)i);
        slots[i] = i;
        for (int l = 0; l < p->n_layer; l++) memset(kvpool_k(p, l, i), fill, p->block_bytes);
    }
    TierRunInfo info = {.ns_id = ns};
    assert_int_equal(tier_put_run(t, h, n, p, slots, &info), MN_OK);
}

static void expect_marked(Tier *t, KvPool *p, uint32_t first, int n, uint8_t fill) {
    uint8_t want[4096];
    assert_true(p->block_bytes <= sizeof want);
    memset(want, fill, p->block_bytes);
    for (int i = 0; i < n; i++) {
        Hash128 h = h_of(first + (uint32_t)i);
        for (int l = 0; l < p->n_layer; l++) {
            assert_int_equal(tier_read_layer(t, &h, 1, l, p, &(int32_t){8}), MN_OK);
            assert_memory_equal(kvpool_k(p, l, 8), want, p->block_bytes);
        }
    }
}

/* Whether a slab file of dir holds 64 bytes of `fill`. */
static bool slabs_hold(const char *dir, uint8_t fill) {
    uint8_t pat[64];
    memset(pat, fill, sizeof pat);
    return test_dir_contains(dir, "slab-", pat, sizeof pat);
}

/* Whether mnemo.db or its WAL holds text. */
static bool db_holds(const char *dir, const char *text) {
    return test_dir_contains(dir, "mnemo.db", text, strlen(text));
}

static void put_reply(CacheStore *s, const Hash128 *ns, const char *text, int32_t id) {
    Hash128 key = hash128(text, strlen(text));
    assert_int_equal(store_reply_put(s, ns, &key, text, strlen(text), &id, 1, 1000 + id), MN_OK);
}

enum { MARK_A = 0xa7, MARK_B = 0x5c, MARK_OLD = 0xe1 };
static const char TEXT_A[] = "the reply of tenant A, secret", TEXT_B[] = "the reply of tenant B, kept",
                  TEXT_OLD[] = "a reply stored before namespaces were", KEY_A[] = "key-of-tenant-a";

/* A new directory (store and tier open) with tenants A and B: runs (and
 * a run of A dropped before, its bytes still in the slab), reply memory
 * and conversations of each, plus a run and a reply of no known
 * namespace. */
static void tenants_new(PFix *fx, KvPool *p) {
    assert_int_equal(kvpool_init(p, 3, 8, 4, 16, MN_TYPE_F16), MN_OK);
    pfx_new(fx, &P_DISK_URING, p, 1 << 20, 64 << 10);
    Hash128 a = index_namespace_id(KEY_A), b = index_namespace_id("key-of-tenant-b");
    put_marked(fx->tier, p, 1, 4, &a, MARK_A);
    put_marked(fx->tier, p, 5, 2, &a, MARK_A);
    put_marked(fx->tier, p, 10, 4, &b, MARK_B);
    put_marked(fx->tier, p, 20, 2, NULL, MARK_OLD);
    put_marked(fx->tier, p, 30, 3, &a, MARK_A);
    Hash128 h = h_of(30);
    assert_int_equal(tier_drop_run(fx->tier, &h), MN_OK); /* evicted, say: its row goes, its bytes stay */
    put_reply(fx->store, &a, TEXT_A, 1);
    put_reply(fx->store, &b, TEXT_B, 2);
    put_reply(fx->store, NULL, TEXT_OLD, 3);
    assert_int_equal(store_conv_put(fx->store, 41, &a, 100, 64), MN_OK);
    assert_int_equal(store_conv_put(fx->store, 42, &b, 100, 64), MN_OK);
}

/* mnemo cache purge, namespace A: afterwards A's runs are not held, and
 * neither their KV bytes (nor those of A's earlier, dropped run) nor A's
 * reply text are anywhere in the slab, database or WAL files; B's runs
 * still read back exact, its reply and conversation are kept. What has no
 * known namespace goes with any purge. Then --all leaves nothing: slab
 * data areas all zero, no reply text. */
static void test_disk_purge(void **state) {
    KvPool p;
    PFix fx;
    tenants_new(&fx, &p);
    pfx_close(&fx);
    /* the raw look finds them before */
    assert_true(slabs_hold(fx.dir, MARK_A));
    assert_true(slabs_hold(fx.dir, MARK_OLD));
    assert_true(db_holds(fx.dir, TEXT_A));
    assert_true(db_holds(fx.dir, TEXT_OLD));

    PurgeReport r;
    MnErr err = {0};
    int rc = purge_disk_tier(fx.dir, KEY_A, &r, &err);
    if (rc != MN_OK) fail_msg("purge: %s", err.msg);
    assert_int_equal(r.n_runs, 3); /* A's two, and the one of no namespace */
    assert_int_equal(r.n_blocks, 8);
    assert_int_equal(r.n_replies, 2);
    assert_int_equal(r.n_convs, 1);
    assert_true(r.n_zeroed_bytes >= 3ull * 3 * 4096); /* three runs' extents at least, of 3 layers */
    assert_false(slabs_hold(fx.dir, MARK_A));
    assert_false(slabs_hold(fx.dir, MARK_OLD));
    assert_true(slabs_hold(fx.dir, MARK_B));
    assert_false(db_holds(fx.dir, TEXT_A));
    assert_false(db_holds(fx.dir, TEXT_OLD));
    assert_true(db_holds(fx.dir, TEXT_B));
    static const char *const files[] = {"mnemo.db", "slab-00000.dat"};
    test_expect_private(fx.dir, files, 2);

    pfx_open(&fx, &p);
    expect_held(fx.tier, 1, 6, false);
    expect_held(fx.tier, 20, 2, false);
    expect_held(fx.tier, 10, 4, true);
    expect_marked(fx.tier, &p, 10, 4, MARK_B);
    int64_t n = -1;
    assert_int_equal(store_reply_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(store_conv_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 1);
    pfx_close(&fx);

    /* again, nothing of A is left to purge */
    assert_int_equal(purge_disk_tier(fx.dir, KEY_A, &r, &err), MN_OK);
    assert_int_equal(r.n_runs + r.n_replies + r.n_convs, 0);
    /* every namespace */
    assert_int_equal(purge_disk_tier(fx.dir, NULL, &r, &err), MN_OK);
    assert_int_equal(r.n_runs, 1);
    assert_int_equal(r.n_replies, 1);
    assert_int_equal(r.n_convs, 1);
    assert_false(slabs_hold(fx.dir, MARK_B));
    assert_false(db_holds(fx.dir, TEXT_B));
    char path[128];
    snprintf(path, sizeof path, "%s/slab-00000.dat", fx.dir);
    size_t len = 0;
    uint8_t *slab = (uint8_t *)test_read_file(path, &len);
    assert_non_null(slab);
    assert_true(len > 4096);
    for (size_t i = 4096; i < len; i++)
        if (slab[i] != 0) fail_msg("byte %zu of %s is %#x after purging everything", i, path, slab[i]);
    free(slab);
    pfx_open(&fx, &p);
    TierStats st;
    tier_stats(fx.tier, &st);
    assert_int_equal(st.n_runs, 0);
    pfx_close(&fx);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* A purge on a directory a server holds (its store open) is refused with
 * MN_EBUSY and a message that says to stop the server; nothing changed. */
static void test_disk_purge_busy(void **state) {
    KvPool p;
    PFix fx;
    tenants_new(&fx, &p);
    PurgeReport r;
    MnErr err = {0};
    assert_int_equal(purge_disk_tier(fx.dir, KEY_A, &r, &err), MN_EBUSY);
    assert_non_null(strstr(err.msg, fx.dir));
    assert_non_null(strstr(err.msg, "stop the server"));
    assert_non_null(strstr(err.msg, "nothing was changed"));
    expect_held(fx.tier, 1, 6, true); /* the holder goes on */
    expect_marked(fx.tier, &p, 1, 4, MARK_A);
    pfx_reopen(&fx, &p);
    expect_held(fx.tier, 1, 6, true);
    int64_t n = -1;
    assert_int_equal(store_reply_count(fx.store, &n), MN_OK);
    assert_int_equal(n, 3);
    pfx_close(&fx);
    assert_true(slabs_hold(fx.dir, MARK_A));
    assert_true(db_holds(fx.dir, TEXT_A));
    /* no cache there at all */
    char empty[128];
    snprintf(empty, sizeof empty, "%s/none", fx.dir);
    assert_int_equal(purge_disk_tier(empty, NULL, &r, &err), MN_ENOTFOUND);
    assert_int_equal(mkdir(empty, 0700), 0);
    assert_int_equal(purge_disk_tier(empty, NULL, &r, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, "mnemo.db"));
    assert_int_equal(rmdir(empty), 0);
    test_rm_dir(fx.dir);
    kvpool_deinit(&p);
}

/* ---- main ------------------------------------------------------------------ */

#define TIER_TESTS(f)                                                                                               \
    cmocka_unit_test_prestate(f, (void *)&P_RAM), cmocka_unit_test_prestate(f, (void *)&P_DISK_URING),              \
        cmocka_unit_test_prestate(f, (void *)&P_DISK_SYNC)
#define DISK_TESTS(f)                                                                                               \
    cmocka_unit_test_prestate(f, (void *)&P_DISK_URING), cmocka_unit_test_prestate(f, (void *)&P_DISK_SYNC)

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_aio_roundtrip, (void *)&P_URING),
        cmocka_unit_test_prestate(test_aio_roundtrip, (void *)&P_SYNC),
        cmocka_unit_test_prestate(test_aio_errors, (void *)&P_URING),
        cmocka_unit_test_prestate(test_aio_errors, (void *)&P_SYNC),
        cmocka_unit_test(test_aio_ring_broken),
        cmocka_unit_test(test_aio_submit_never_waits),
        cmocka_unit_test(test_aio_inflight_limit),
        cmocka_unit_test(test_aio_auto),
        cmocka_unit_test(test_aio_buf),
        TIER_TESTS(test_tier_roundtrip),
        TIER_TESTS(test_tier_layers_and_spans),
        TIER_TESTS(test_tier_read_layers),
        DISK_TESTS(test_disk_read_spans),
        DISK_TESTS(test_disk_read_bulk),
        DISK_TESTS(test_disk_staging_at_open),
        DISK_TESTS(test_disk_no_huge_pages),
        DISK_TESTS(test_disk_read_layers_faults),
        DISK_TESTS(test_disk_read_out_of_memory),
        TIER_TESTS(test_tier_put_out_of_memory),
        TIER_TESTS(test_tier_lru),
        TIER_TESTS(test_tier_touch),
        TIER_TESTS(test_tier_policy),
        TIER_TESTS(test_tier_has_drop),
        DISK_TESTS(test_disk_checksum),
        DISK_TESTS(test_disk_checksum_block_order),
        DISK_TESTS(test_disk_enospc),
        DISK_TESTS(test_disk_eio_sticky),
        cmocka_unit_test(test_disk_config),
        TIER_TESTS(test_tier_expire),
        DISK_TESTS(test_persist_reopen),
        DISK_TESTS(test_persist_put_out_of_memory),
        DISK_TESTS(test_persist_reopen_out_of_memory),
        DISK_TESTS(test_persist_corrupt_extent),
        DISK_TESTS(test_persist_bad_rows),
        DISK_TESTS(test_persist_truncated_slab),
        DISK_TESTS(test_persist_other_format),
        DISK_TESTS(test_persist_policy),
        DISK_TESTS(test_persist_shrink),
        DISK_TESTS(test_persist_store_faults),
        DISK_TESTS(test_persist_crash_copy),
        DISK_TESTS(test_persist_kill),
        cmocka_unit_test(test_disk_dir_private),
        cmocka_unit_test(test_disk_dir_refused),
        cmocka_unit_test(test_disk_purge),
        cmocka_unit_test(test_disk_purge_busy),
        TIER_TESTS(test_tier_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
