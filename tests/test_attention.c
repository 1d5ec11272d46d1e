/* test_attention.c — the paged multi-token attention kernel against a dense
 * float64 oracle of the values it multiplies (as stored, and rounded to
 * bf16 where it multiplies in bf16), and its batch invariance: the same query gives bit-identical
 * output alone, in a batch, with shuffled blocks, in two-range form and with
 * 1 or 2 threads. Also the KV pool against a flat model. */
#include "test_util.h"

#include <math.h>

#include "base/err.h"
#include "base/mem.h"
#include "base/threadpool.h"
#include "cache/kv_pool.h"
#include "compute/attention.h"
#include "compute/ops.h"

typedef struct Fixture {
    int n_head, n_head_kv, head_dim, kv_dim, block_tokens, n_ctx;
    int window;    /* sliding window (0: none) */
    float softcap; /* 0: none */
    float *q;    /* (n_ctx, n_head*head_dim) one query per position */
    float *k, *v; /* (n_ctx, kv_dim) dense */
} Fixture;

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static void fixture_init(Fixture *f, int n_head, int n_head_kv, int head_dim, int block_tokens, int n_ctx) {
    f->n_head = n_head;
    f->n_head_kv = n_head_kv;
    f->head_dim = head_dim;
    f->kv_dim = n_head_kv * head_dim;
    f->block_tokens = block_tokens;
    f->n_ctx = n_ctx;
    f->window = 0;
    f->softcap = 0.0f;
    f->q = malloc(sizeof(float) * (size_t)n_ctx * n_head * head_dim);
    f->k = malloc(sizeof(float) * (size_t)n_ctx * f->kv_dim);
    f->v = malloc(sizeof(float) * (size_t)n_ctx * f->kv_dim);
    for (long i = 0; i < (long)n_ctx * n_head * head_dim; i++) f->q[i] = 2.0f * frand();
    for (long i = 0; i < (long)n_ctx * f->kv_dim; i++) {
        f->k[i] = frand();
        f->v[i] = frand();
    }
}

static void fixture_free(Fixture *f) {
    free(f->q);
    free(f->k);
    free(f->v);
}

/* Put the dense K/V of positions [0, n_ctx) into a pool through table. */
static void fill_pool(const Fixture *f, KvPool *p, const int32_t *table) {
    for (int pos = 0; pos < f->n_ctx; pos++) {
        int32_t slot = table[pos / f->block_tokens];
        size_t row = (size_t)(pos % f->block_tokens) * f->kv_dim;
        const float *k = f->k + (size_t)pos * f->kv_dim, *v = f->v + (size_t)pos * f->kv_dim;
        if (p->kv_type == MN_TYPE_F32) {
            memcpy((float *)kvpool_k(p, 0, slot) + row, k, sizeof(float) * f->kv_dim);
            memcpy((float *)kvpool_v(p, 0, slot) + row, v, sizeof(float) * f->kv_dim);
        } else {
            ops_f32_to_f16((uint16_t *)kvpool_k(p, 0, slot) + row, k, f->kv_dim);
            ops_f32_to_f16((uint16_t *)kvpool_v(p, 0, slot) + row, v, f->kv_dim);
        }
    }
}

/* x rounded to bf16, to nearest even (finite x). */
static float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* x as the kernel multiplies it: as stored in a KV cache of kv_type (K, V
 * only), then rounded to bf16 where the kernel multiplies in bf16. */
static float as_multiplied(float x, MnType kv_type, int head_dim, bool stored) {
    if (stored && kv_type == MN_TYPE_F16) {
        uint16_t h;
        ops_f32_to_f16(&h, &x, 1);
        ops_f16_to_f32(&x, &h, 1);
    }
    return attn_uses_bf16(kv_type, head_dim) ? round_bf16(x) : x;
}

/* Dense float64 attention of the query at pos (over its window, soft-capped),
 * of the values the kernel multiplies for a KV cache of kv_type: K and V as
 * stored, and, where the kernel multiplies in bf16, q, K, V and the
 * normalized weights rounded to bf16 (see attn_uses_bf16). */
static void dense_attention(const Fixture *f, MnType kv_type, int pos, double *out) {
    int group = f->n_head / f->n_head_kv, hd = f->head_dim;
    int lo = f->window > 0 && pos - f->window + 1 > 0 ? pos - f->window + 1 : 0;
    double *s = malloc(sizeof(double) * (pos + 1));
    for (int h = 0; h < f->n_head; h++) {
        int kvh = h / group;
        const float *q = f->q + ((size_t)pos * f->n_head + h) * hd;
        double max = -INFINITY, sum = 0;
        for (int p = lo; p <= pos; p++) {
            double d = 0;
            for (int i = 0; i < hd; i++)
                d += (double)as_multiplied(q[i], kv_type, hd, false) *
                     as_multiplied(f->k[(size_t)p * f->kv_dim + kvh * hd + i], kv_type, hd, true);
            s[p] = d / sqrt((double)hd);
            if (f->softcap > 0) s[p] = f->softcap * tanh(s[p] / f->softcap);
            max = s[p] > max ? s[p] : max;
        }
        for (int p = lo; p <= pos; p++) sum += (s[p] = exp(s[p] - max));
        for (int p = lo; p <= pos; p++) s[p] = as_multiplied((float)(s[p] / sum), kv_type, hd, false);
        for (int i = 0; i < hd; i++) {
            double o = 0;
            for (int p = lo; p <= pos; p++)
                o += s[p] * as_multiplied(f->v[(size_t)p * f->kv_dim + kvh * hd + i], kv_type, hd, true);
            out[h * hd + i] = o;
        }
    }
    free(s);
}

/* Run the kernel for the queries at positions pos[0..n) of one sequence. */
static float *run_kernel(const Fixture *f, const KvPool *p, const int32_t *table, int n_blocks, const int32_t *pos,
                         int n, ThreadPool *tp) {
    int dim = f->n_head * f->head_dim;
    float *q = malloc(sizeof(float) * (size_t)n * dim);
    float *out = malloc(sizeof(float) * (size_t)n * dim);
    int32_t *seq = calloc((size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++) memcpy(q + (size_t)i * dim, f->q + (size_t)pos[i] * dim, sizeof(float) * dim);
    AttnSeq s = {table, n_blocks};
    AttnBatch b = {.n_tok = n, .q = q, .seq = seq, .pos = pos, .seqs = &s, .n_head = f->n_head,
                   .n_head_kv = f->n_head_kv, .head_dim = f->head_dim, .window = f->window, .softcap = f->softcap};
    AttnKv kv = {p->arenas[0], p->block_bytes, p->block_bytes / 2, p->block_tokens, p->kv_dim, p->kv_type};
    int nth = tp ? tpool_size(tp) : 1;
    size_t per = attn_scratch_floats(f->n_ctx, f->n_head, f->n_head_kv, f->head_dim);
    float *scratch = malloc(sizeof(float) * per * nth);
    attn_forward(tp, out, &b, &kv, scratch, per);
    free(scratch);
    free(q);
    free(seq);
    return out;
}

static void shuffled_table(int32_t *table, int n_blocks, int n_slots, uint64_t seed) {
    int32_t *perm = malloc(sizeof(int32_t) * n_slots);
    for (int i = 0; i < n_slots; i++) perm[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        seed = seed * 6364136223846793005ull + 1;
        int j = (int)((seed >> 33) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(table, perm, sizeof(int32_t) * n_blocks);
    free(perm);
}

/* The kernel against dense_attention: within 1e-5 (f32 sums in another
 * order), 1e-4 where it multiplies in bf16 (a weight that rounds to the
 * other side of a bf16 tie in f32 than in double moves by 2^-9). */
static void check_against_dense_with(MnType kv_type, int n_head, int n_head_kv, int head_dim, int bt, int n_ctx,
                                     int window, float softcap) {
    const double tol = attn_uses_bf16(kv_type, head_dim) ? 1e-4 : 1e-5;
    Fixture f;
    fixture_init(&f, n_head, n_head_kv, head_dim, bt, n_ctx);
    f.window = window;
    f.softcap = softcap;
    int n_blocks = (n_ctx + bt - 1) / bt;
    KvPool p;
    assert_int_equal(kvpool_init(&p, 1, f.kv_dim, bt, n_blocks + 3, kv_type), MN_OK);
    int32_t *table = malloc(sizeof(int32_t) * n_blocks);
    shuffled_table(table, n_blocks, n_blocks + 3, 7);
    fill_pool(&f, &p, table);
    int32_t *pos = malloc(sizeof(int32_t) * n_ctx);
    for (int i = 0; i < n_ctx; i++) pos[i] = i;
    float *out = run_kernel(&f, &p, table, n_blocks, pos, n_ctx, NULL);
    int dim = n_head * head_dim;
    double *ref = malloc(sizeof(double) * dim);
    double max_err = 0;
    for (int t = 0; t < n_ctx; t++) {
        dense_attention(&f, kv_type, t, ref);
        for (int i = 0; i < dim; i++) {
            double e = fabs(ref[i] - out[(size_t)t * dim + i]);
            max_err = e > max_err ? e : max_err;
        }
    }
    if (max_err > tol) fail_msg("paged attention differs from dense by %g (tolerance %g)", max_err, tol);
    free(ref);
    free(out);
    free(pos);
    free(table);
    kvpool_deinit(&p);
    fixture_free(&f);
}

static void check_against_dense(MnType kv_type, int n_head, int n_head_kv, int head_dim, int bt, int n_ctx) {
    check_against_dense_with(kv_type, n_head, n_head_kv, head_dim, bt, n_ctx, 0, 0.0f);
}

/* Sliding windows (shorter than, equal to and longer than a block; longer
 * than the context) and soft-capped scores (a cap low enough to bite: the
 * fixture's scores reach about 4), alone and together. */
static void test_window_softcap(void **state) {
    check_against_dense_with(MN_TYPE_F32, 4, 2, 16, 8, 70, 5, 0.0f);
    check_against_dense_with(MN_TYPE_F32, 4, 2, 16, 8, 70, 8, 0.0f);
    check_against_dense_with(MN_TYPE_F32, 8, 1, 64, 5, 40, 17, 0.0f);
    check_against_dense_with(MN_TYPE_F32, 4, 2, 16, 8, 33, 100, 0.0f);
    check_against_dense_with(MN_TYPE_F32, 4, 4, 8, 32, 33, 0, 1.5f);
    check_against_dense_with(MN_TYPE_F16, 4, 2, 16, 8, 70, 9, 2.0f);
    check_against_dense_with(MN_TYPE_F16, 8, 2, 64, 16, 70, 9, 2.0f);
}

static void test_matches_dense_f32(void **state) {
    check_against_dense(MN_TYPE_F32, 4, 2, 16, 8, 70);
    check_against_dense(MN_TYPE_F32, 4, 4, 8, 32, 33);
    check_against_dense(MN_TYPE_F32, 8, 1, 64, 5, 40);
}

static void test_matches_dense_f16(void **state) {
    check_against_dense(MN_TYPE_F16, 4, 2, 16, 8, 70);
}

/* The head sizes whose V rows stay in registers (64, 128: with an f16
 * cache, the bf16 path where the build has it) and one that does not
 * (48), over contexts of several blocks of V rows, with windows that start
 * and end inside a block and on odd positions (the bf16 path pairs
 * positions). */
static void test_head_sizes(void **state) {
    check_against_dense(MN_TYPE_F16, 8, 2, 64, 16, 100);
    check_against_dense_with(MN_TYPE_F16, 8, 2, 64, 16, 100, 21, 0.0f);
    check_against_dense_with(MN_TYPE_F32, 4, 1, 128, 8, 90, 45, 0.0f);
    check_against_dense_with(MN_TYPE_F16, 4, 1, 128, 8, 90, 45, 0.0f);
    check_against_dense_with(MN_TYPE_F16, 6, 3, 48, 16, 75, 21, 0.0f);
    /* odd groups (rows left after the pairs), head sizes that are a
     * multiple of 32 but not of 64, of 8 but not of 16 */
    check_against_dense_with(MN_TYPE_F16, 6, 2, 96, 16, 75, 21, 0.0f);
    check_against_dense_with(MN_TYPE_F32, 3, 1, 40, 16, 60, 0, 0.0f);
}

/* Bit-identical outputs for the same query whatever the batch around it. */
static void test_invariance(void **state) {
    for (int kt = 0; kt < 4; kt++) { /* f32, f16; then each with a window of 6 and a soft cap */
        MnType kv_type = kt % 2 ? MN_TYPE_F16 : MN_TYPE_F32;
        Fixture f;
        int bt = 4, n_ctx = 37;
        fixture_init(&f, 4, 2, 16, bt, n_ctx);
        f.window = kt >= 2 ? 6 : 0;
        f.softcap = kt >= 2 ? 2.0f : 0.0f;
        int n_blocks = (n_ctx + bt - 1) / bt, dim = f.n_head * f.head_dim;
        KvPool p1, p2;
        assert_int_equal(kvpool_init(&p1, 1, f.kv_dim, bt, n_blocks, kv_type), MN_OK);
        assert_int_equal(kvpool_init(&p2, 1, f.kv_dim, bt, 2 * n_blocks, kv_type), MN_OK);
        int32_t *contig = malloc(sizeof(int32_t) * n_blocks), *shuf = malloc(sizeof(int32_t) * n_blocks);
        for (int i = 0; i < n_blocks; i++) contig[i] = i;
        shuffled_table(shuf, n_blocks, 2 * n_blocks, 99);
        fill_pool(&f, &p1, contig);
        fill_pool(&f, &p2, shuf);
        ThreadPool *tp2 = tpool_new(2);
        /* baseline: the whole sequence in one batch, one thread */
        int32_t *all = malloc(sizeof(int32_t) * n_ctx);
        for (int i = 0; i < n_ctx; i++) all[i] = i;
        float *base = run_kernel(&f, &p1, contig, n_blocks, all, n_ctx, NULL);
        /* each token alone (decode), shuffled blocks, 2 threads */
        for (int t = 0; t < n_ctx; t++) {
            float *one = run_kernel(&f, &p2, shuf, n_blocks, &all[t], 1, tp2);
            assert_memory_equal(one, base + (size_t)t * dim, sizeof(float) * dim);
            free(one);
        }
        /* two-range form: a leading range [0, 5) and a trailing range [29, 37) */
        int32_t two[13];
        int n_two = 0;
        for (int i = 0; i < 5; i++) two[n_two++] = i;
        for (int i = 29; i < 37; i++) two[n_two++] = i;
        float *tw = run_kernel(&f, &p2, shuf, n_blocks, two, n_two, tp2);
        for (int i = 0; i < n_two; i++)
            assert_memory_equal(tw + (size_t)i * dim, base + (size_t)two[i] * dim, sizeof(float) * dim);
        free(tw);
        free(base);
        free(all);
        tpool_free(tp2);
        free(contig);
        free(shuf);
        kvpool_deinit(&p1);
        kvpool_deinit(&p2);
        fixture_free(&f);
    }
}

/* The kernel scores positions in blocks of 16 starting at multiples of 16
 * and sums the softmax in lanes keyed by position, so a tile's first
 * block depends on which tokens share it. Bit-identical outputs whatever
 * the tile: batches of 1, 3, 16 and 17 tokens (a tile of 16 and one of 1)
 * starting on and off those block boundaries, with windows whose starts
 * fall inside a block, KV blocks of 5 positions, head sizes that take the
 * register paths (64, 128) and one that does not (24), and query groups of
 * 8, 6 and 3 heads per KV head. */
static void test_invariance_tiles(void **state) {
    static const struct {
        int n_head, n_head_kv, head_dim, window;
        MnType kv_type;
        float softcap;
    } cfg[] = {
        {16, 2, 64, 0, MN_TYPE_F16, 0.0f},
        {16, 2, 64, 23, MN_TYPE_F16, 0.0f},
        {12, 2, 128, 21, MN_TYPE_F32, 0.0f},
        {6, 2, 24, 19, MN_TYPE_F16, 2.0f},
    };
    static const int sizes[] = {1, 3, 16, 17};
    static const int starts[] = {0, 5, 15, 16, 31, 40, 53};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        Fixture f;
        int bt = 5, n_ctx = 70;
        fixture_init(&f, cfg[c].n_head, cfg[c].n_head_kv, cfg[c].head_dim, bt, n_ctx);
        f.window = cfg[c].window;
        f.softcap = cfg[c].softcap;
        int n_blocks = (n_ctx + bt - 1) / bt, dim = f.n_head * f.head_dim;
        KvPool p;
        assert_int_equal(kvpool_init(&p, 1, f.kv_dim, bt, n_blocks + 2, cfg[c].kv_type), MN_OK);
        int32_t *table = malloc(sizeof(int32_t) * n_blocks), *all = malloc(sizeof(int32_t) * n_ctx);
        shuffled_table(table, n_blocks, n_blocks + 2, 5);
        fill_pool(&f, &p, table);
        for (int i = 0; i < n_ctx; i++) all[i] = i;
        ThreadPool *tp2 = tpool_new(2);
        float *alone = malloc(sizeof(float) * (size_t)n_ctx * dim);
        for (int t = 0; t < n_ctx; t++) {
            float *one = run_kernel(&f, &p, table, n_blocks, &all[t], 1, NULL);
            memcpy(alone + (size_t)t * dim, one, sizeof(float) * dim);
            free(one);
        }
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t st = 0; st < sizeof starts / sizeof starts[0]; st++) {
                int n = sizes[si], t0 = starts[st];
                if (t0 + n > n_ctx) continue;
                float *out = run_kernel(&f, &p, table, n_blocks, &all[t0], n, st % 2 ? tp2 : NULL);
                for (int i = 0; i < n; i++)
                    if (memcmp(out + (size_t)i * dim, alone + (size_t)(t0 + i) * dim, sizeof(float) * dim) != 0)
                        fail_msg("config %zu: position %d differs in a batch of %d from %d", c, t0 + i, n, t0);
                free(out);
            }
        free(alone);
        tpool_free(tp2);
        free(all);
        free(table);
        kvpool_deinit(&p);
        fixture_free(&f);
    }
}

/* Two sequences in one batch each get what they get alone. */
static void test_two_sequences(void **state) {
    Fixture a, b;
    int bt = 8;
    fixture_init(&a, 4, 2, 16, bt, 20);
    fixture_init(&b, 4, 2, 16, bt, 20);
    KvPool p;
    assert_int_equal(kvpool_init(&p, 1, a.kv_dim, bt, 6, MN_TYPE_F32), MN_OK);
    int32_t ta[3] = {4, 0, 2}, tb[3] = {1, 5, 3};
    fill_pool(&a, &p, ta);
    fill_pool(&b, &p, tb);
    int dim = 64;
    int32_t pos_a = 19, pos_b = 11;
    float *alone_a = run_kernel(&a, &p, ta, 3, &pos_a, 1, NULL);
    float *alone_b = run_kernel(&b, &p, tb, 3, &pos_b, 1, NULL);
    float q[2 * 64], out[2 * 64];
    memcpy(q, a.q + (size_t)pos_a * dim, sizeof(float) * dim);
    memcpy(q + dim, b.q + (size_t)pos_b * dim, sizeof(float) * dim);
    AttnSeq seqs[2] = {{ta, 3}, {tb, 3}};
    int32_t seq[2] = {0, 1}, pos[2] = {pos_a, pos_b};
    AttnBatch batch = {.n_tok = 2, .q = q, .seq = seq, .pos = pos, .seqs = seqs, .n_head = 4, .n_head_kv = 2,
                       .head_dim = 16};
    AttnKv kv = {p.arenas[0], p.block_bytes, p.block_bytes / 2, bt, p.kv_dim, p.kv_type};
    size_t per = attn_scratch_floats(20, 4, 2, 16);
    float *scratch = malloc(sizeof(float) * per);
    attn_forward(NULL, out, &batch, &kv, scratch, per);
    assert_memory_equal(out, alone_a, sizeof(float) * dim);
    assert_memory_equal(out + dim, alone_b, sizeof(float) * dim);
    free(scratch);
    free(alone_a);
    free(alone_b);
    kvpool_deinit(&p);
    fixture_free(&a);
    fixture_free(&b);
}

/* The pool against a trivially correct model: refcounts, states and an LRU
 * order of cached slots kept in plain arrays. */
typedef struct PoolModel {
    int ref[10];
    int state[10];      /* 0 free, 1 in use, 2 cached */
    bool cacheable[10];
    int lru[10], n_lru; /* cached slots, least recent first */
    int evicted;        /* last slot reported by the evict callback */
} PoolModel;

static void on_evict(void *ctx, int32_t slot) { ((PoolModel *)ctx)->evicted = slot; }

static void test_pool_model(void **state) {
    KvPool p;
    assert_int_equal(kvpool_init(&p, 3, 16, 4, 10, MN_TYPE_F16), MN_OK);
    PoolModel m = {0};
    kvpool_set_evict_fn(&p, on_evict, &m);
    int32_t held[64];
    int n_held = 0;
    uint64_t s = 12345;
    for (int step = 0; step < 20000; step++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int op = (int)((s >> 33) % 5);
        int pick = (int)((s >> 45) % 64);
        if (op == 0) {
            int32_t slot;
            m.evicted = -1;
            int rc = kvpool_alloc(&p, &slot);
            int n_free = 0;
            for (int i = 0; i < 10; i++) n_free += m.state[i] == 0;
            if (n_free == 0 && m.n_lru == 0) {
                assert_int_equal(rc, MN_EFULL);
                continue;
            }
            assert_int_equal(rc, MN_OK);
            if (n_free == 0) { /* must evict the least recently used cached slot */
                assert_int_equal(slot, m.lru[0]);
                assert_int_equal(m.evicted, slot);
                memmove(m.lru, m.lru + 1, sizeof(int) * (size_t)--m.n_lru);
            } else {
                assert_int_equal(m.state[slot], 0);
                assert_int_equal(m.evicted, -1);
            }
            m.state[slot] = 1;
            m.ref[slot] = 1;
            m.cacheable[slot] = false;
            if (n_held < 64) held[n_held++] = slot;
            else kvpool_release(&p, slot), m.ref[slot] = 0, m.state[slot] = 0;
        } else if (op == 1 && n_held > 0 && n_held < 64) {
            int i = pick % n_held;
            kvpool_retain(&p, held[i]);
            m.ref[held[i]]++;
            held[n_held++] = held[i];
        } else if (op == 2 && n_held > 0) {
            int i = pick % n_held, slot = held[i];
            kvpool_release(&p, slot);
            held[i] = held[--n_held];
            if (--m.ref[slot] == 0) {
                m.state[slot] = m.cacheable[slot] ? 2 : 0;
                if (m.cacheable[slot]) m.lru[m.n_lru++] = slot;
            }
        } else if (op == 3 && n_held > 0) {
            int slot = held[pick % n_held];
            kvpool_set_cacheable(&p, slot);
            m.cacheable[slot] = true;
        } else if (op == 4 && m.n_lru > 0 && n_held < 64) { /* a cache hit revives a cached slot */
            int k = pick % m.n_lru, slot = m.lru[k];
            kvpool_retain(&p, slot);
            memmove(m.lru + k, m.lru + k + 1, sizeof(int) * (size_t)(m.n_lru - k - 1));
            m.n_lru--;
            m.state[slot] = 1;
            m.ref[slot] = 1;
            held[n_held++] = slot;
        }
        kvpool_check(&p);
        int n_free = 0;
        for (int i = 0; i < 10; i++) {
            assert_int_equal(p.refcount[i], m.ref[i]);
            assert_int_equal(p.state[i], m.state[i]);
            n_free += m.state[i] == 0;
        }
        assert_int_equal(kvpool_n_free(&p), n_free);
        assert_int_equal(kvpool_n_cached(&p), m.n_lru);
        int k = 0;
        for (int32_t sl = p.lru_head; sl >= 0; sl = p.lru_next[sl]) assert_int_equal(sl, m.lru[k++]);
    }
    assert_true(p.n_evictions > 0);
    /* every slot is distinct memory in every layer */
    assert_true((uint8_t *)kvpool_v(&p, 2, 9) + p.block_bytes / 2 == p.arenas[2] + 10 * p.block_bytes);
    kvpool_deinit(&p);
    assert_int_equal(kvpool_init(&p, 1, 16, 4, 10, MN_TYPE_Q8_0), MN_EINVAL);
    assert_int_equal(kvpool_init(&p, 1, 16, 0, 10, MN_TYPE_F16), MN_EINVAL);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_dense_f32),
        cmocka_unit_test(test_matches_dense_f16),
        cmocka_unit_test(test_head_sizes),
        cmocka_unit_test(test_window_softcap),
        cmocka_unit_test(test_invariance),
        cmocka_unit_test(test_invariance_tiles),
        cmocka_unit_test(test_two_sequences),
        cmocka_unit_test(test_pool_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
