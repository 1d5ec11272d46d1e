/* test_matmul.c — mm_matmul against the scalar reference for every weight
 * type; quantized weights against the F32 product with their dequantized
 * values (bit-exact: the kernels dequantize exactly and share the float
 * accumulation order); dq_row against ttype_dequantize_row, bit for bit, on
 * random blocks; the reference quantizers' accuracy; and batch invariance:
 * every output must be bit-identical whatever n_tok, the token's position,
 * the tiling and the thread count. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "test_util.h"

#include "base/mem.h"
#include "base/threadpool.h"
#include "base/ttype.h"
#include "compute/dequant.h"
#include "compute/kquant.h"
#include "compute/matmul.h"
#include "compute/q32.h"

/* ---- helpers ------------------------------------------------------------- */

typedef struct Rng {
    uint64_t s;
} Rng;

static uint32_t rng_u32(Rng *r) {
    r->s = r->s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(r->s >> 33);
}

/* Uniform in [-1, 1), with an occasional large value so quantization
 * scales differ from block to block. */
static float rng_f(Rng *r) {
    float v = (float)rng_u32(r) / 2147483648.0f - 1.0f;
    if (rng_u32(r) % 61 == 0) v *= 9.0f;
    return v;
}

typedef struct TestMat {
    MatW w;
    void *data;
    float *deq; /* (n_out, n_in) dequantized weights */
} TestMat;

static void mat_make(TestMat *m, MnType type, int64_t n_out, int64_t n_in, uint64_t seed) {
    uint64_t row_bytes;
    assert_int_equal(ttype_row_bytes(type, (uint64_t)n_in, &row_bytes), 0);
    m->data = mn_alloc_aligned((size_t)(row_bytes * (uint64_t)n_out) + 64, 64);
    m->deq = mn_malloc((size_t)(n_out * n_in) * sizeof(float));
    assert_non_null(m->data);
    assert_non_null(m->deq);
    Rng rng = {seed};
    float *src = mn_malloc((size_t)n_in * sizeof(float));
    assert_non_null(src);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t k = 0; k < n_in; k++) src[k] = rng_f(&rng);
        uint8_t *row = (uint8_t *)m->data + r * row_bytes;
        ttype_quantize_row(type, src, row, n_in);
        ttype_dequantize_row(type, row, m->deq + r * n_in, n_in);
    }
    mn_free(src);
    m->w = (MatW){.type = type, .n_in = n_in, .n_out = n_out, .data = m->data};
}

static void mat_free(TestMat *m) {
    mn_free_aligned(m->data);
    mn_free(m->deq);
}

static float *acts_make(int64_t n_tok, int64_t n_in, uint64_t seed) {
    float *x = mn_malloc((size_t)(n_tok * n_in) * sizeof(float));
    assert_non_null(x);
    Rng rng = {seed};
    for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = rng_f(&rng);
    return x;
}

static const MnType all_types[] = {MN_TYPE_F32,  MN_TYPE_F16,  MN_TYPE_BF16, MN_TYPE_Q8_0,   MN_TYPE_Q4_0,
                                   MN_TYPE_Q4_1, MN_TYPE_Q5_0, MN_TYPE_Q5_1, MN_TYPE_Q2_K,   MN_TYPE_Q3_K,
                                   MN_TYPE_Q4_K, MN_TYPE_Q5_K, MN_TYPE_Q6_K, MN_TYPE_IQ4_NL, MN_TYPE_IQ4_XS};
enum { N_TYPES = sizeof all_types / sizeof all_types[0], N_FLOAT_TYPES = 3 };

/* Whether rows of n_in elements are whole blocks of type. */
static bool fits(MnType type, int64_t n_in) { return n_in % (int64_t)ttype_traits(type)->block_elems == 0; }

/* ---- against the reference ------------------------------------------------ */

/* One shape: SIMD with tp vs reference; tolerance from the f32 rounding
 * bound of a 16-lane sum over n_in terms, relative to sum |w x|. */
static void check_shape(ThreadPool *tp, MnType type, int64_t n_out, int64_t n_in, int n_tok, uint64_t seed) {
    TestMat m;
    mat_make(&m, type, n_out, n_in, seed);
    float *x = acts_make(n_tok, n_in, seed + 1);
    float *got = mn_malloc((size_t)(n_tok * n_out) * sizeof(float));
    float *want = mn_malloc((size_t)(n_tok * n_out) * sizeof(float));
    mm_matmul(tp, got, &m.w, x, n_tok);
    mm_matmul_ref(want, &m.w, x, n_tok);
    double gamma = ((double)n_in / 16.0 + 12.0) * 0x1p-24 * 1.5;
    for (int t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < n_out; r++) {
            double abs_sum = 0.0;
            for (int64_t k = 0; k < n_in; k++) abs_sum += fabs((double)m.deq[r * n_in + k] * x[t * n_in + k]);
            double g = got[t * n_out + r], e = want[t * n_out + r];
            double tol = gamma * abs_sum + 1e-30;
            if (!(fabs(g - e) <= tol))
                fail_msg("%s n_out=%lld n_in=%lld n_tok=%d: out[%d][%lld] = %.9g, ref %.9g (tol %.3g)",
                         ttype_traits(type)->name, (long long)n_out, (long long)n_in, n_tok, t, (long long)r,
                         g, e, tol);
        }
    }
    mn_free(want);
    mn_free(got);
    mn_free(x);
    mat_free(&m);
}

static void test_matches_reference(void **state) {
    (void)state;
    ThreadPool *tp = tpool_new(2);
    assert_non_null(tp);
    static const int64_t n_ins[] = {32, 64, 96, 256, 544, 768, 2048};
    static const int64_t n_outs[] = {1, 5, 37};
    static const int toks[] = {1, 2, 5, 8, 13, 70};
    uint64_t seed = 1;
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t i = 0; i < sizeof n_ins / sizeof n_ins[0]; i++)
            for (size_t o = 0; o < sizeof n_outs / sizeof n_outs[0]; o++)
                for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++)
                    if (fits(all_types[ti], n_ins[i])) check_shape(tp, all_types[ti], n_outs[o], n_ins[i], toks[k], seed++);
    tpool_free(tp);
}

static void test_matches_reference_large(void **state) {
    (void)state;
    ThreadPool *tp = tpool_new(2);
    assert_non_null(tp);
    for (int ti = 0; ti < N_TYPES; ti++) {
        check_shape(tp, all_types[ti], 67, 5632, 1, 100 + ti);
        check_shape(tp, all_types[ti], 67, 5632, 19, 200 + ti);
        check_shape(tp, all_types[ti], 130, 2048, 33, 300 + ti);
    }
    /* long rows: q32.c's groups of fewer tokens */
    check_shape(tp, MN_TYPE_Q4_0, 9, 65568, 12, 310);
    check_shape(tp, MN_TYPE_Q8_0, 5, 131104, 10, 311);
    /* 32-element types whose rows end in a partial step of ktile */
    check_shape(tp, MN_TYPE_Q5_1, 13, 5664, 9, 312);
    check_shape(tp, MN_TYPE_IQ4_NL, 13, 2080, 1, 313);
    /* rows too long for ktile's panel buffer: step by step at any n_tok */
    check_shape(tp, MN_TYPE_Q4_K, 7, 8192, 13, 314);
    check_shape(tp, MN_TYPE_Q5_1, 5, 8224, 10, 315);
    /* rows too long for q32.c's buffer of quantized activations: the
     * float kernels, on the dequantized weights */
    check_shape(tp, MN_TYPE_Q4_0, 3, 420000, 5, 316);
    check_shape(tp, MN_TYPE_IQ4_NL, 2, 420000, 1, 317);
    check_shape(tp, MN_TYPE_Q8_0, 3, 420000, 9, 318);
    check_shape(tp, MN_TYPE_Q8_0, 9, 420000, 1, 319);
    tpool_free(tp);
}

/* Float weights accept any n_in (masked tails). */
static void test_float_odd_n_in(void **state) {
    (void)state;
    ThreadPool *tp = tpool_new(2);
    assert_non_null(tp);
    static const int64_t n_ins[] = {1, 7, 15, 17, 40, 100, 1001};
    for (int ti = 0; ti < N_FLOAT_TYPES; ti++)
        for (size_t i = 0; i < sizeof n_ins / sizeof n_ins[0]; i++) {
            check_shape(tp, all_types[ti], 9, n_ins[i], 1, 400 + i);
            check_shape(tp, all_types[ti], 9, n_ins[i], 11, 500 + i);
        }
    tpool_free(tp);
}

/* An exact case: every output is one product, so SIMD and reference must
 * agree bit for bit (F32 weights: a permutation matrix). */
static void test_exact_single_term(void **state) {
    (void)state;
    enum { N = 77, T = 9 };
    float *wf = mn_calloc(N * N, sizeof(float));
    assert_non_null(wf);
    for (int r = 0; r < N; r++) wf[r * N + (r * 7) % N] = 1.0f;
    MatW w = {.type = MN_TYPE_F32, .n_in = N, .n_out = N, .data = wf};
    float *x = acts_make(T, N, 7);
    float got[T * N], want[T * N];
    mm_matmul(NULL, got, &w, x, T);
    mm_matmul_ref(want, &w, x, T);
    assert_memory_equal(got, want, sizeof got);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < N; r++) assert_true(got[t * N + r] == x[t * N + (r * 7) % N]);
    mn_free(x);
    mn_free(wf);
}

/* Rows too long for the int8 kernels' buffers of quantized tokens (far
 * beyond any model's) keep f32 activations: their weights are dequantized
 * exactly (an f16 scale times a small integer is exact in f32) and go
 * through the float accumulation order, so the product must equal, bit for
 * bit, the F32 product with the dequantized matrix: for every quantized
 * type, at token counts of each tile shape and on one thread and two. */
static void test_quant_equals_float(void **state) {
    (void)state;
    enum { N_OUT = 9, N_IN = 1641 * 256, MAXT = 9 }; /* 9 rows: a tile of 8 and one of 1; 2 of 4 and one */
    ThreadPool *tp1 = tpool_new(1), *tp2 = tpool_new(2);
    assert_non_null(tp1);
    assert_non_null(tp2);
    static const int toks[] = {1, 2, 7, 9};
    float *x = acts_make(MAXT, N_IN, 2000);
    float *got = mn_malloc((size_t)(MAXT * N_OUT) * sizeof(float));
    float *want = mn_malloc((size_t)(MAXT * N_OUT) * sizeof(float));
    assert_non_null(got);
    assert_non_null(want);
    for (int qi = N_FLOAT_TYPES; qi < N_TYPES; qi++) {
        TestMat m;
        mat_make(&m, all_types[qi], N_OUT, N_IN, 2001 + qi);
        assert_int_equal(mm_pack_kind(&m.w), MM_PACK_NONE); /* f32 activations */
        MatW wf = {.type = MN_TYPE_F32, .n_in = N_IN, .n_out = N_OUT, .data = m.deq};
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            int n = toks[k];
            mm_matmul(tp1, want, &wf, x, n);
            for (int th = 0; th < 2; th++) {
                mm_matmul(th ? tp2 : tp1, got, &m.w, x, n);
                for (int64_t i = 0; i < n * N_OUT; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                        fail_msg("%s n_tok=%d (%d threads): out[%lld][%lld] = %.9g, f32 weights give %.9g",
                                 ttype_traits(all_types[qi])->name, n, th + 1, (long long)(i / N_OUT),
                                 (long long)(i % N_OUT), got[i], want[i]);
            }
        }
        mat_free(&m);
    }
    mn_free(want);
    mn_free(got);
    mn_free(x);
    tpool_free(tp2);
    tpool_free(tp1);
}

/* ---- batch invariance ----------------------------------------------------- */

static void check_invariance(ThreadPool *tp1, ThreadPool *tp2, MnType type, int64_t n_out, int64_t n_in,
                             uint64_t seed) {
    static const int batches[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64};
    enum { MAXT = 64 };
    TestMat m;
    mat_make(&m, type, n_out, n_in, seed);
    float *x = acts_make(MAXT, n_in, seed + 1);
    float *xr = mn_malloc((size_t)(MAXT * n_in) * sizeof(float));
    float *single = mn_malloc((size_t)(MAXT * n_out) * sizeof(float));
    float *batch = mn_malloc((size_t)(MAXT * n_out) * sizeof(float));
    float *other = mn_malloc((size_t)(MAXT * n_out) * sizeof(float));
    size_t row = (size_t)n_out * sizeof(float);
    /* each token alone, single-threaded */
    for (int t = 0; t < MAXT; t++) mm_matmul(tp1, single + t * n_out, &m.w, x + t * n_in, 1);
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
        int n = batches[bi];
        for (int th = 0; th < 2; th++) {
            mm_matmul(th ? tp2 : tp1, batch, &m.w, x, n);
            for (int t = 0; t < n; t++)
                if (memcmp(batch + t * n_out, single + t * n_out, row) != 0)
                    fail_msg("%s n_out=%lld n_in=%lld: token %d of %d (%d threads) differs from alone",
                             ttype_traits(type)->name, (long long)n_out, (long long)n_in, t, n, th + 1);
        }
        /* the same tokens in reverse order, at other positions */
        for (int t = 0; t < n; t++) memcpy(xr + t * n_in, x + (n - 1 - t) * n_in, (size_t)n_in * sizeof(float));
        mm_matmul(tp2, other, &m.w, xr, n);
        for (int t = 0; t < n; t++)
            if (memcmp(other + t * n_out, single + (n - 1 - t) * n_out, row) != 0)
                fail_msg("%s n_out=%lld n_in=%lld: reversed batch %d, position %d differs",
                         ttype_traits(type)->name, (long long)n_out, (long long)n_in, n, t);
        /* a batch that starts at an odd token (other tile boundaries) */
        if (n + 1 <= MAXT) {
            mm_matmul(tp2, other, &m.w, x + n_in, n);
            assert_memory_equal(other, single + n_out, (size_t)n * row);
        }
    }
    /* repeated calls */
    mm_matmul(tp2, batch, &m.w, x, MAXT);
    mm_matmul(tp2, other, &m.w, x, MAXT);
    assert_memory_equal(batch, other, (size_t)MAXT * row);
    mn_free(other);
    mn_free(batch);
    mn_free(single);
    mn_free(xr);
    mn_free(x);
    mat_free(&m);
}

static void test_batch_invariance(void **state) {
    (void)state;
    ThreadPool *tp1 = tpool_new(1), *tp2 = tpool_new(2);
    assert_non_null(tp1);
    assert_non_null(tp2);
    static const int64_t shapes[][2] = {{37, 32},   {45, 96},   {11, 256},  {130, 544},
                                        {7, 1280},  {67, 2048}, {19, 5632}, {21, 4768}};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            if (fits(all_types[ti], shapes[s][1]))
                check_invariance(tp1, tp2, all_types[ti], shapes[s][0], shapes[s][1], 77 + 13 * s + ti);
    /* float weights with a masked tail */
    for (int ti = 0; ti < N_FLOAT_TYPES; ti++) check_invariance(tp1, tp2, all_types[ti], 23, 1001, 991 + ti);
    /* long quantized rows: tokens quantized in smaller groups */
    check_invariance(tp1, tp2, MN_TYPE_Q4_0, 7, 65568, 995);
    check_invariance(tp1, tp2, MN_TYPE_Q6_K, 9, 6400, 996);
    check_invariance(tp1, tp2, MN_TYPE_IQ4_NL, 8, 6176, 997);
    /* rows too long for the int8 buffers: f32 activations (ktile) */
    check_invariance(tp1, tp2, MN_TYPE_Q8_0, 3, 420000, 998);
    tpool_free(tp2);
    tpool_free(tp1);
}

/* ---- int8 activations: K-quants and IQ4_XS, and the 32-element types ---------- */

static const MnType i8_types[] = {MN_TYPE_Q2_K, MN_TYPE_Q3_K, MN_TYPE_Q4_K, MN_TYPE_Q5_K,   MN_TYPE_Q6_K,
                                  MN_TYPE_IQ4_XS, MN_TYPE_Q4_0, MN_TYPE_Q4_1, MN_TYPE_Q5_0, MN_TYPE_Q5_1,
                                  MN_TYPE_Q8_0, MN_TYPE_IQ4_NL};
enum { N_I8_TYPES = sizeof i8_types / sizeof i8_types[0] };

/* Whether the type's weights have a min per block (x = d * q + m). */
static bool has_min(MnType type) { return type == MN_TYPE_Q4_1 || type == MN_TYPE_Q5_1; }

/* Elements per block of quantized activations for weights of type. */
static int64_t act_block(MnType type) { return kq_has_type(type) ? 256 : 32; }

/* Activations of n_tok tokens quantized for weights of `type` by this
 * build's path (got) and by the plain C one (want): bytes, and their count. */
static size_t quantize_both(MnType type, const float *x, int64_t n_in, int n_tok, uint8_t **got, uint8_t **want) {
    size_t bytes = kq_has_type(type) ? kq_acts_bytes(n_in, n_tok) : q32_acts_bytes(n_in, n_tok);
    *got = mn_alloc_aligned(bytes, 64);
    *want = mn_alloc_aligned(bytes, 64);
    assert_non_null(*got);
    assert_non_null(*want);
    memset(*got, 0xa5, bytes);
    memset(*want, 0x5a, bytes);
    if (kq_has_type(type)) {
        kq_quantize(type, x, n_in, n_tok, *got);
        kq_quantize_ref(type, x, n_in, n_tok, *want);
    } else {
        q32_quantize(x, n_in, n_tok, *got);
        q32_quantize_ref(x, n_in, n_tok, *want);
    }
    return bytes;
}

/* kq_quantize and q32_quantize (this build's paths) write exactly their
 * plain C twins' bytes for every token count (both layouts, a last tile
 * filled up with zero tokens), for the weights of every int8 type (the K
 * layouts depend on it): random blocks, a block of zeros, ties at +-amax,
 * values that round at .5, a NaN (clamped to -127 by both) and an
 * infinity. */
static void test_i8_quantize_exact(void **state) {
    (void)state;
    enum { N = 4 * 256, MAXT = 40 };
    float *x = acts_make(MAXT, N, 4242);
    for (int j = 256; j < 512; j++) x[j] = 0.0f;          /* token 0, 256-block 1: zeros */
    x[512] = 2.0f, x[513] = -2.0f, x[514] = 1.0f / 127.0f; /* block 2: +-amax, exact halves */
    for (int j = 515; j < 768; j++) x[j] = (float)(j % 9) / 254.0f * 2.0f;
    x[800] = NAN;                                          /* block 3 */
    x[N + 40] = INFINITY;                                  /* token 1, block 0 */
    for (int k = 64; k < 96; k++) x[2 * N + k] = 0.0f;     /* token 2: a 32-block of zeros */
    static const int toks[] = {1, 2, 3, 4, 5, 8, 15, 16, 17, 33, 40};
    for (size_t ti = 0; ti < N_I8_TYPES; ti++)
        for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
            uint8_t *got, *want;
            size_t bytes = quantize_both(i8_types[ti], x, N, toks[i], &got, &want);
            for (size_t k = 0; k < bytes; k++)
                if (got[k] != want[k])
                    fail_msg("%s, %d tokens (%s path): quantized activations differ at byte %zu: %02x vs %02x",
                             ttype_traits(i8_types[ti])->name, toks[i], mm_simd_name(), k, got[k], want[k]);
            mn_free_aligned(want);
            mn_free_aligned(got);
        }
    mn_free(x);
}

/* mm_matmul on the int8 types equals mm_matmul_ref (int8 activations, scalar)
 * bit for bit, at every tile shape (kquant.c's 4 x 4 and 16 x 1, both
 * modules' tiles of 8 rows x 16 tokens and their rows of 16, and the
 * edges; for the 32-element types an odd number of blocks too, which the
 * AVX2 decode kernel's pairs of blocks leave one over), token count and
 * thread count: so the AVX-512, AVX2 and scalar builds give the
 * same bits. And the product stays near the f32 one against the
 * dequantized weights: rounding an activation to its block's step (amax /
 * 127) moves it by at most half a step, so the product moves by at most
 * sum over blocks of amax / 254 * sum |w| (plus f32 rounding). */
static void test_kq_equals_reference(void **state) {
    (void)state;
    ThreadPool *tp1 = tpool_new(1), *tp2 = tpool_new(2);
    assert_non_null(tp1);
    assert_non_null(tp2);
    static const MnType *types = i8_types;
    static const int64_t shapes[][2] = {{1, 256},   {5, 512},   {37, 768}, {16, 2048},
                                        {70, 1280}, {21, 5632}, {9, 800},  {11, 96}};
    static const int toks[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 70};
    uint64_t seed = 7000;
    for (size_t ti = 0; ti < N_I8_TYPES; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t n_out = shapes[s][0], n_in = shapes[s][1];
            if (!fits(types[ti], n_in)) continue;
            TestMat m;
            mat_make(&m, types[ti], n_out, n_in, seed++);
            MatW wf = {.type = MN_TYPE_F32, .n_in = n_in, .n_out = n_out, .data = m.deq};
            enum { MAXT = 70 };
            float *x = acts_make(MAXT, n_in, seed++);
            float *got = mn_malloc((size_t)(MAXT * n_out) * sizeof(float));
            float *want = mn_malloc((size_t)(MAXT * n_out) * sizeof(float));
            float *fl = mn_malloc((size_t)(MAXT * n_out) * sizeof(float));
            assert_non_null(got);
            assert_non_null(want);
            assert_non_null(fl);
            mm_matmul_ref(want, &m.w, x, MAXT);
            mm_matmul(tp1, fl, &wf, x, MAXT);
            for (int64_t i = 0; i < MAXT * n_out; i++) {
                int64_t t = i / n_out, r = i % n_out;
                double abs_sum = 0.0, bound = 0.0;
                int64_t bs = act_block(types[ti]);
                for (int64_t k0 = 0; k0 < n_in; k0 += bs) {
                    double amax = 0.0, wsum = 0.0, wmax = 0.0;
                    for (int64_t k = k0; k < k0 + bs; k++) {
                        abs_sum += fabs((double)m.deq[r * n_in + k] * x[t * n_in + k]);
                        amax = fmax(amax, fabs((double)x[t * n_in + k]));
                        wsum += fabs((double)m.deq[r * n_in + k]);
                        wmax = fmax(wmax, fabs((double)m.deq[r * n_in + k]));
                    }
                    if (q32_has_type(types[ti])) /* the f16 step, and the min counted apart */
                        bound += amax * (1.0 / 254.0 + 1.0 / 2048.0) * (wsum + (has_min(types[ti]) ? 2.0 * bs * wmax : 0.0));
                    else
                        bound += amax / 254.0 * wsum;
                }
                if (!(fabs((double)want[i] - fl[i]) <= 1.001 * bound + 1e-5 * abs_sum))
                    fail_msg("%s n_in=%lld: out[%lld][%lld] = %.7g with int8 activations, %.7g in f32 (sum |wx| %.4g)",
                             ttype_traits(types[ti])->name, (long long)n_in, (long long)t, (long long)r, want[i], fl[i],
                             abs_sum);
            }
            for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++)
                for (int th = 0; th < 2; th++) {
                    int n = toks[k];
                    mm_matmul(th ? tp2 : tp1, got, &m.w, x, n);
                    for (int64_t i = 0; i < n * n_out; i++)
                        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                            fail_msg("%s n_out=%lld n_in=%lld n_tok=%d (%d threads): out[%lld][%lld] = %.9g, "
                                     "reference %.9g",
                                     ttype_traits(types[ti])->name, (long long)n_out, (long long)n_in, n, th + 1,
                                     (long long)(i / n_out), (long long)(i % n_out), got[i], want[i]);
                }
            mn_free(fl);
            mn_free(want);
            mn_free(got);
            mn_free(x);
            mat_free(&m);
        }
    tpool_free(tp2);
    tpool_free(tp1);
}

/* ---- dequantization ------------------------------------------------------- */

/* Byte offsets of the f16 fields of each quantized type's block. */
static int f16_fields(MnType type, int off[2]) {
    switch (type) {
    case MN_TYPE_Q4_1: case MN_TYPE_Q5_1: case MN_TYPE_Q4_K: case MN_TYPE_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case MN_TYPE_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case MN_TYPE_Q3_K: off[0] = 108; return 1;
    case MN_TYPE_Q6_K: off[0] = 208; return 1;
    default: off[0] = 0; return 1; /* Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS */
    }
}

/* dq_row (the kernels' dequantization) gives ttype_dequantize_row's values
 * bit for bit, on blocks of random bytes — every code, every sub-block
 * scale, negative scales and zeros of both signs — with finite f16
 * scales. */
static void test_dequant_exact(void **state) {
    (void)state;
    enum { N_BLOCKS = 64, MAXN = N_BLOCKS * 256 };
    Rng rng = {4242};
    float *want = mn_malloc(MAXN * sizeof(float)), *got = mn_malloc(MAXN * sizeof(float));
    uint8_t *blocks = mn_malloc(N_BLOCKS * 256);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(blocks);
    for (int ti = N_FLOAT_TYPES; ti < N_TYPES; ti++) {
        MnType type = all_types[ti];
        const TypeTraits *tt = ttype_traits(type);
        int64_t n = N_BLOCKS * (int64_t)tt->block_elems;
        for (int round = 0; round < 20; round++) {
            for (size_t i = 0; i < N_BLOCKS * tt->block_bytes; i++) blocks[i] = (uint8_t)rng_u32(&rng);
            int off[2], n_f = f16_fields(type, off);
            for (int b = 0; b < N_BLOCKS; b++)
                for (int f = 0; f < n_f; f++) {
                    uint8_t *h = blocks + (size_t)b * tt->block_bytes + off[f];
                    if ((h[1] & 0x7c) == 0x7c) h[1] &= 0xbf; /* inf or nan: make it finite */
                    if (round == 0 && b % 7 == 0) h[0] = 0, h[1] &= 0x80; /* zero scales, both signs */
                }
            ttype_dequantize_row(type, blocks, want, n);
            memset(got, 0xff, (size_t)n * sizeof(float));
            dq_row(type, blocks, got, n);
            for (int64_t k = 0; k < n; k++)
                if (memcmp(&got[k], &want[k], sizeof(float)) != 0)
                    fail_msg("%s (%s path): element %lld of block %lld = %.9g, reference %.9g", tt->name, mm_simd_name(),
                             (long long)(k % (int64_t)tt->block_elems), (long long)(k / (int64_t)tt->block_elems),
                             got[k], want[k]);
        }
    }
    mn_free(blocks);
    mn_free(got);
    mn_free(want);
}

/* The int8 types on weight blocks of random bytes (every code, every
 * scale and min, Q6_K's scale -128, IQ4_XS's -127 level, Q8_0's code
 * -128, which AVX2 multiplies as |c| = 128 (q32.c's dot4); f16 scales kept
 * near 1/8 so sums stay finite) and activations that reach the int8
 * codes' ends: every path equals mm_matmul_ref bit for bit. Tokens of
 * +-1 only quantize exactly (codes +-127, d = 1/127; q32.c's d is that
 * rounded to f16), so there the reference must equal the product of
 * ttype_dequantize_row's values to f32 (f16) rounding: that checks
 * kquant.c's and q32.c's unpacking against ttype.c's. */
static void test_kq_random_blocks(void **state) {
    (void)state;
    enum { N_OUT = 37, N_IN = 1024, N_TOK = 17 }; /* up to both modules' tiles */
    ThreadPool *tp2 = tpool_new(2);
    assert_non_null(tp2);
    Rng rng = {5151};
    float *x = acts_make(N_TOK, N_IN, 5152);
    for (int k = 0; k < N_IN; k++) {
        x[k] = rng_u32(&rng) % 2 ? 1.0f : -1.0f;          /* token 0: +-1 */
        x[N_IN + k] = k % 512 < 256 ? 1.0f : -1.0f;       /* token 1: blocks of +1 and of -1 */
        x[2 * N_IN + k] *= k % 256 == 7 ? 1000.0f : 1.0f; /* token 2: one large value per block */
    }
    float *deq = mn_malloc((size_t)N_OUT * N_IN * sizeof(float));
    float *got = mn_malloc((size_t)N_TOK * N_OUT * sizeof(float)), *want = mn_malloc((size_t)N_TOK * N_OUT * sizeof(float));
    assert_non_null(deq);
    assert_non_null(got);
    assert_non_null(want);
    for (size_t ti = 0; ti < N_I8_TYPES; ti++) {
        MnType type = i8_types[ti];
        const TypeTraits *tt = ttype_traits(type);
        size_t row_bytes = (size_t)(N_IN / tt->block_elems) * tt->block_bytes, bytes = (size_t)N_OUT * row_bytes;
        uint8_t *blocks = mn_alloc_aligned(bytes + 64, 64);
        assert_non_null(blocks);
        for (size_t i = 0; i < bytes; i++) blocks[i] = (uint8_t)rng_u32(&rng);
        int off[2], n_f = f16_fields(type, off);
        for (size_t b = 0; b < bytes / tt->block_bytes; b++)
            for (int f = 0; f < n_f; f++) {
                uint8_t *h = blocks + b * tt->block_bytes + off[f];
                h[1] = (uint8_t)((h[1] & 0x83) | 0x30); /* exponent 12: 2^-3 .. 2^-2 */
            }
        MatW w = {.type = type, .n_in = N_IN, .n_out = N_OUT, .data = blocks};
        for (int r = 0; r < N_OUT; r++)
            ttype_dequantize_row(type, blocks + (size_t)r * row_bytes, deq + (size_t)r * N_IN, N_IN);
        mm_matmul_ref(want, &w, x, N_TOK);
        for (int t = 0; t < 2; t++)
            for (int r = 0; r < N_OUT; r++) {
                double dot = 0.0, abs_sum = 0.0;
                for (int k = 0; k < N_IN; k++) {
                    dot += (double)deq[(size_t)r * N_IN + k] * x[t * N_IN + k];
                    abs_sum += fabs((double)deq[(size_t)r * N_IN + k]);
                }
                /* q32.c's steps are f16: 1/127 within 2^-12 */
                double tol = q32_has_type(type) ? 0x1p-10 : 1e-5;
                if (!(fabs(want[t * N_OUT + r] - dot) <= tol * abs_sum))
                    fail_msg("%s: token %d row %d = %.9g with int8 activations, %.9g from the dequantized row", tt->name,
                             t, r, want[t * N_OUT + r], dot);
            }
        for (int n = 1; n <= N_TOK; n += 4)
            for (int th = 0; th < 2; th++) {
                mm_matmul(th ? tp2 : NULL, got, &w, x, n);
                for (int i = 0; i < n * N_OUT; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                        fail_msg("%s (%s path) n_tok=%d: out[%d][%d] = %.9g, reference %.9g", tt->name, mm_simd_name(),
                                 n, i / N_OUT, i % N_OUT, got[i], want[i]);
            }
        mn_free_aligned(blocks);
    }
    mn_free(want);
    mn_free(got);
    mn_free(deq);
    mn_free(x);
    tpool_free(tp2);
}

/* The reference quantizers write blocks whose values are close to their
 * input: RMS error relative to the input's RMS within a bound per type
 * (about 1.25 times what they give: the bits per weight decide it, and the
 * input's occasional 9-fold outliers, which stretch their blocks' scales). */
static void test_quantize_accuracy(void **state) {
    (void)state;
    enum { N = 4096 };
    static const struct {
        MnType type;
        double max_rel;
    } bounds[] = {{MN_TYPE_Q8_0, 0.012}, {MN_TYPE_Q4_0, 0.19},  {MN_TYPE_Q4_1, 0.10},   {MN_TYPE_Q5_0, 0.10},
                  {MN_TYPE_Q5_1, 0.05},  {MN_TYPE_Q2_K, 0.33},  {MN_TYPE_Q3_K, 0.30},   {MN_TYPE_Q4_K, 0.10},
                  {MN_TYPE_Q5_K, 0.05},  {MN_TYPE_Q6_K, 0.036}, {MN_TYPE_IQ4_NL, 0.145}, {MN_TYPE_IQ4_XS, 0.145}};
    float *x = acts_make(1, N, 99), *y = mn_malloc(N * sizeof(float));
    void *q = mn_malloc(N * 2);
    assert_non_null(y);
    assert_non_null(q);
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        ttype_quantize_row(bounds[i].type, x, q, N);
        ttype_dequantize_row(bounds[i].type, q, y, N);
        double e2 = 0.0, x2 = 0.0;
        for (int k = 0; k < N; k++) {
            e2 += ((double)y[k] - x[k]) * ((double)y[k] - x[k]);
            x2 += (double)x[k] * x[k];
        }
        double rel = sqrt(e2 / x2);
        printf("    %-6s relative RMS error %.4f (bound %.2f)\n", ttype_traits(bounds[i].type)->name, rel,
               bounds[i].max_rel);
        if (!(rel <= bounds[i].max_rel))
            fail_msg("%s: relative RMS error %.4f > %.2f", ttype_traits(bounds[i].type)->name, rel, bounds[i].max_rel);
    }
    mn_free(q);
    mn_free(y);
    mn_free(x);
}

/* mm_matmul_packed on packed rows (mm_pack_row) equals mm_matmul on the
 * rows they were packed from, bit for bit, for every type that takes them
 * (each orders its codes and sums its own way, and the packed form is one
 * per kind), at token counts of both activation layouts (rows, and tiles
 * with a last one part empty) and on one thread and two; and
 * mm_pack_kind is kquant.c's types for MM_PACK_KQ, q32.c's for
 * MM_PACK_Q32. */
static void test_packed_equals_matmul(void **state) {
    (void)state;
    enum { N_OUT = 37, N_IN = 768, MAXT = 33 };
    ThreadPool *tp2 = tpool_new(2);
    assert_non_null(tp2);
    float *x = acts_make(MAXT, N_IN, 9191);
    static const MmPack kinds[] = {MM_PACK_KQ, MM_PACK_Q32};
    uint8_t *packed[2];
    for (int k = 0; k < 2; k++) {
        const size_t row = mm_packed_row_bytes(kinds[k], N_IN);
        packed[k] = mn_malloc(row * MAXT);
        assert_non_null(packed[k]);
        for (int t = 0; t < MAXT; t++) mm_pack_row(kinds[k], x + (size_t)t * N_IN, N_IN, packed[k] + (size_t)t * row);
    }
    assert_int_equal(mm_packed_row_bytes(MM_PACK_KQ, N_IN), N_IN / 256 * KQ_PACKED_BYTES);
    assert_int_equal(mm_packed_row_bytes(MM_PACK_Q32, N_IN), N_IN / 32 * 44);
    float *got = mn_malloc((size_t)MAXT * N_OUT * sizeof(float)), *want = mn_malloc((size_t)MAXT * N_OUT * sizeof(float));
    assert_non_null(got);
    assert_non_null(want);
    static const int toks[] = {1, 3, 9, 10, 16, 17, 33};
    uint64_t seed = 9300;
    int n_tested = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        TestMat m;
        mat_make(&m, all_types[ti], N_OUT, N_IN, seed++);
        const MmPack kind = mm_pack_kind(&m.w);
        assert_int_equal(kind, kq_has_type(all_types[ti])    ? MM_PACK_KQ
                               : q32_has_type(all_types[ti]) ? MM_PACK_Q32
                                                             : MM_PACK_NONE);
        if (kind == MM_PACK_NONE) {
            mat_free(&m);
            continue;
        }
        const uint8_t *rows = packed[kind == MM_PACK_KQ ? 0 : 1];
        uint8_t *scratch = mn_alloc_aligned(mm_packed_scratch_bytes(&m.w, MAXT), 64);
        assert_non_null(scratch);
        for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++)
            for (int th = 0; th < 2; th++) {
                const int n = toks[i];
                assert_true(mm_packed_scratch_bytes(&m.w, n) <= mm_packed_scratch_bytes(&m.w, MAXT));
                mm_matmul(th ? tp2 : NULL, want, &m.w, x, n);
                memset(got, 0xa5, (size_t)n * N_OUT * sizeof(float));
                mm_matmul_packed(th ? tp2 : NULL, got, &m.w, rows, n, scratch);
                for (int k = 0; k < n * N_OUT; k++)
                    if (memcmp(&got[k], &want[k], sizeof(float)) != 0)
                        fail_msg("%s, %d tokens, %d threads: out[%d][%d] = %.9g from packed rows, %.9g from x",
                                 ttype_traits(all_types[ti])->name, n, th + 1, k / N_OUT, k % N_OUT, got[k], want[k]);
            }
        n_tested++;
        mn_free_aligned(scratch);
        mat_free(&m);
    }
    assert_true(n_tested >= 12); /* Q2_K..Q6_K, IQ4_XS; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL */
    mn_free(want);
    mn_free(got);
    for (int k = 0; k < 2; k++) mn_free(packed[k]);
    mn_free(x);
    tpool_free(tp2);
}

/* NULL pool, zero tokens, a one-row matrix. */
static void test_edges(void **state) {
    (void)state;
    TestMat m;
    mat_make(&m, MN_TYPE_Q8_0, 1, 64, 5);
    float *x = acts_make(3, 64, 6);
    float got[3], want[3], sentinel = 12345.0f;
    got[0] = sentinel;
    mm_matmul(NULL, got, &m.w, x, 0);
    assert_true(got[0] == sentinel);
    mm_matmul(NULL, got, &m.w, x, 3);
    mm_matmul_ref(want, &m.w, x, 3);
    for (int t = 0; t < 3; t++) assert_true(fabsf(got[t] - want[t]) <= 1e-4f * (1.0f + fabsf(want[t])));
    assert_non_null(mm_simd_name());
    mn_free(x);
    mat_free(&m);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_exact_single_term),
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_quantize_accuracy),
        cmocka_unit_test(test_quant_equals_float),
        cmocka_unit_test(test_i8_quantize_exact),
        cmocka_unit_test(test_kq_equals_reference),
        cmocka_unit_test(test_kq_random_blocks),
        cmocka_unit_test(test_packed_equals_matmul),
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_float_odd_n_in),
        cmocka_unit_test(test_matches_reference_large),
        cmocka_unit_test(test_batch_invariance),
    };
    fprintf(stderr, "matmul path: %s\n", mm_simd_name());
    return cmocka_run_group_tests(tests, NULL, NULL);
}
