/* test_tier_read.c — streamed reads (tier_read_layers): every layer of
 * several runs arrives in order and is in place when reported, whole
 * extents are counted, a missing block reads nothing; on disk, spans of
 * layers per request, the bulk window of a read without a layer consumer,
 * the staging buffer made (and populated) when the tier opens, reads
 * without huge pages, and failures and allocation faults in the middle of
 * a stream. (Split from test_tier.c.)
 */
#include "test_tier_util.h"

/* ---- tiers: streamed reads of every layer ---------------------------------------- */

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
 * it mn_huge_alloc's pages are faulted in on first use, and resident memory
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

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        TIER_TESTS(test_tier_read_layers),
        DISK_TESTS(test_disk_read_spans),
        DISK_TESTS(test_disk_read_bulk),
        DISK_TESTS(test_disk_staging_at_open),
        DISK_TESTS(test_disk_no_huge_pages),
        DISK_TESTS(test_disk_read_layers_faults),
        DISK_TESTS(test_disk_read_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
