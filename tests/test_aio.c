/* test_aio.c — cache/aio, the disk tier's I/O layer: batches larger than
 * the queue depth round-trip bit for bit, both backends; submitting never
 * waits for the device and the in-flight limit holds; misaligned requests
 * are refused; end of file, injected ENOSPC, EDQUOT and EIO come back as
 * the right MN_* codes, and a broken ring fails what it held; an O_DIRECT
 * open that fails with EINVAL falls back to buffered; transfer buffers are
 * aligned and advised for huge pages. (Split from test_tier.c.)
 */
#include "test_tier_util.h"

/* ---- aio ----------------------------------------------------------------- */

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
    for (size_t i = 0; i < total; i++) src[i] = (uint8_t)rng_splitmix64(&seed);
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

/* Transfer buffers (mn_huge_alloc): aligned to and rounded up to MN_HUGE_ALIGN, zeroed,
 * writable to the end, advised for huge pages, carrying a read; the
 * refused sizes fail cleanly. */
static void test_aio_buf(void **state) {
    size_t cap = 1;
    assert_null(mn_huge_alloc(0, &cap));
    assert_int_equal(cap, 0);
    assert_null(mn_huge_alloc(SIZE_MAX, &cap));
    assert_int_equal(cap, 0);
    assert_null(mn_huge_alloc(SIZE_MAX / 2, &cap)); /* passes the size check; no kernel maps 2^63 bytes */
    assert_int_equal(cap, 0);

    size_t want = MN_HUGE_ALIGN + 4096;
    uint8_t *b = mn_huge_alloc(want, &cap);
    assert_non_null(b);
    assert_int_equal(cap, 2 * (size_t)MN_HUGE_ALIGN);
    assert_int_equal((uintptr_t)b % MN_HUGE_ALIGN, 0);
    for (size_t i = 0; i < cap; i += 4096) assert_int_equal(b[i], 0);
    assert_int_equal(b[cap - 1], 0);
    memset(b, 0xA5, cap);
    long long huge = mn_huge_bytes(b, cap);
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
    mn_huge_free(b, cap);
    assert_int_equal(mn_huge_bytes(b, cap), -1); /* unmapped: nothing there to tell */
    mn_huge_free(NULL, 0);
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
        uint64_t x = rng_splitmix64(&seed);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
