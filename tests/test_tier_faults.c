/* test_tier_faults.c — the disk tier when its data or its device fails: a
 * corrupted byte is a checksum failure (counted, run dropped, tier still
 * working), a truncated file too, and a damaged block is found whatever
 * order its blocks are asked in; ENOSPC (injected into writes and into
 * the slab's fallocate) refuses the put with MN_EFULL and the tier keeps
 * working; EIO is sticky until tier_reset; bad configurations are
 * refused. (Split from test_tier.c.)
 */
#include "test_tier_util.h"

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

/* tier_measure_read meeting a failing device: a failed read back or a
 * failed write is MN_EIO and the tier is off, as after a failed read or
 * put; what it held stays listed (reset drops it), nothing of the
 * scratch run is left, and a full device (ENOSPC on the write) is
 * MN_EFULL, the tier on. */
static void test_disk_measure_faults(void **state) {
    const Param *pa = *state;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 2, 8, 4, 32, MN_TYPE_F16), MN_OK);
    Fixture fx;
    fx_open(&fx, pa, &p, 1 << 20, 0, false);
    Tier *t = fx.tier;
    assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    int32_t slots[4] = {20, 21, 22, 23};
    TierReadRate r;
    aio_fault_set(tier_disk_aio(t), AIO_OP_WRITE, 0, 1, ENOSPC);
    assert_int_equal(tier_measure_read(t, &p, slots, 4, 1, &r), MN_EFULL);
    TierStats s;
    tier_stats(t, &s);
    assert_false(s.is_failed);
    assert_int_equal(s.n_runs, 1);
    static const unsigned ops[2] = {AIO_OP_READ, AIO_OP_WRITE};
    for (int k = 0; k < 2; k++) {
        aio_fault_set(tier_disk_aio(t), ops[k], 0, 1, EIO);
        assert_int_equal(tier_measure_read(t, &p, slots, 4, 2, &r), MN_EIO);
        assert_int_equal(r.bytes, 0);
        tier_stats(t, &s);
        assert_true(s.is_failed);
        assert_int_equal(s.n_io_errors, (uint64_t)k + 1);
        assert_int_equal(s.n_runs, 1);
        assert_int_equal(s.occupancy_bytes, run_bytes(pa, &p, 4));
        tier_check(t);
        assert_int_equal(tier_measure_read(t, &p, slots, 4, 3, &r), MN_EIO); /* sticky */
        assert_int_equal(tier_reset(t), MN_OK);
        assert_int_equal(put_range(t, &p, 0, 4, 0), MN_OK);
    }
    assert_int_equal(tier_measure_read(t, &p, slots, 4, 4, &r), MN_OK);
    expect_range(t, &p, 0, 4, 10);
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

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        DISK_TESTS(test_disk_checksum),
        DISK_TESTS(test_disk_checksum_block_order),
        DISK_TESTS(test_disk_enospc),
        DISK_TESTS(test_disk_eio_sticky),
        DISK_TESTS(test_disk_measure_faults),
        cmocka_unit_test(test_disk_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
