/* bench_matmul.c — micro-benchmark of mm_matmul on the matrices of one layer
 * of a 1.1B llama (dim 2048, 4 KV heads of 64, FFN 5632, 22 layers, vocab
 * 32000), random weights. Not part of the test suite (the Makefile only
 * builds tests/test_*.c). Build and run:
 *
 *   gcc -std=c17 -D_GNU_SOURCE -Isrc -O3 -march=native -pthread \
 *       tests/bench_matmul.c src/compute/[a-z]*.c \
 *       src/base/[a-z]*.c -lm \
 *       -o /tmp/bench_matmul
 *   /tmp/bench_matmul [n_threads] [types: q8_0,q4_0,f16,...] [reps] [all|pp|tg|batch]
 *
 * For each weight type it times n_tok = 512 (prefill) and n_tok = 1
 * (decode) per matrix, prints GFLOP/s, and projects model tokens/s as
 * 22 x layer time + the output head. Decode cycles over several copies of
 * the layer so that weights come from DRAM, as in a real forward pass.
 * Mode "batch" times decode steps of 1..64 tokens (several sequences per
 * weight read). The figures vary by +-15% from run to run on a shared VM
 * (memory bandwidth especially): compare types within one run. With
 * MNEMO_BENCH_CPU=1 the times are the process's CPU time per thread, which
 * other processes on the machine disturb far less than wall time (but
 * which hides time spent waiting on memory no more than wall time does).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"
#include "base/threadpool.h"
#include "base/ttype.h"
#include "compute/matmul.h"

enum { DIM = 2048, KV = 256, FFN = 5632, VOCAB = 32000, LAYERS = 22, PREFILL = 512, DECODE_COPIES = 4 };

typedef struct Shape {
    const char *name;
    int64_t n_out, n_in;
} Shape;

static const Shape layer_shapes[] = {
    {"wq", DIM, DIM}, {"wk", KV, DIM}, {"wv", KV, DIM}, {"wo", DIM, DIM},
    {"w_gate", FFN, DIM}, {"w_up", FFN, DIM}, {"w_down", DIM, FFN},
};
enum { N_SHAPES = sizeof layer_shapes / sizeof layer_shapes[0] };
static const Shape head_shape = {"output", VOCAB, DIM};

/* Wall time, or with MNEMO_BENCH_CPU=1 the CPU time of the whole process
 * divided by the thread count: on a machine shared with other work, that
 * counts the cycles the kernels spent, not the ones others took (idle
 * pool workers sleep, so they add nothing). */
static int cpu_clock_threads;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(cpu_clock_threads > 0 ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return cpu_clock_threads > 0 ? t / cpu_clock_threads : t;
}

static uint64_t rng_state = 88172645463325252ULL;
static float rng_f(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

/* Random weights of a type; quantized types via the reference quantizer on
 * a few distinct random rows, cycled (fast to build, realistic to read). */
static void *make_weights(MnType type, int64_t n_out, int64_t n_in) {
    uint64_t row_bytes;
    if (ttype_row_bytes(type, (uint64_t)n_in, &row_bytes) != 0) abort();
    uint8_t *data = mn_alloc_aligned((size_t)row_bytes * (size_t)n_out, 64);
    if (data == NULL) abort();
    enum { DISTINCT = 64 };
    float *src = malloc((size_t)n_in * sizeof(float));
    uint8_t *rows = malloc((size_t)row_bytes * DISTINCT);
    for (int i = 0; i < DISTINCT; i++) {
        for (int64_t k = 0; k < n_in; k++) src[k] = rng_f() * 0.05f;
        ttype_quantize_row(type, src, rows + (size_t)i * row_bytes, n_in);
    }
    for (int64_t r = 0; r < n_out; r++)
        memcpy(data + (size_t)r * row_bytes, rows + (size_t)(r % DISTINCT) * row_bytes, row_bytes);
    free(rows);
    free(src);
    return data;
}

/* Seconds per call, best of reps (after one warm-up). */
static double time_matmul(ThreadPool *tp, const MatW *w, int n_copies, const float *x, int n_tok, float *out,
                          int reps) {
    double best = 1e30;
    mm_matmul(tp, out, &w[0], x, n_tok);
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        mm_matmul(tp, out, &w[i % n_copies], x, n_tok);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

/* Memory read bandwidth with every thread of the pool summing its share of
 * a buffer much larger than the caches: the decode roofline. */
typedef struct BwJob {
    const uint64_t *buf;
    long n;
    uint64_t sums[64];
} BwJob;

static void bw_worker(void *ctx, int ith, int nth) {
    BwJob *job = ctx;
    long lo, hi;
    tpool_split(job->n, 1024, ith, nth, &lo, &hi);
    uint64_t s = 0; /* xor: associative, so the compiler vectorizes it */
    for (long i = lo; i < hi; i++) s ^= job->buf[i];
    job->sums[ith] = s;
}

static double measure_bandwidth(ThreadPool *tp) {
    long n = 64L << 20; /* 512 MB */
    uint64_t *buf = mn_alloc_aligned((size_t)n * sizeof *buf, 64);
    if (buf == NULL) return 0;
    for (long i = 0; i < n; i++) buf[i] = (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    BwJob job = {.buf = buf, .n = n};
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        tpool_run(tp, bw_worker, &job);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    mn_free_aligned(buf);
    return (double)n * sizeof *buf / best / 1e9;
}

/* Mean seconds per matrix (t[N_SHAPES] = head) for n_tok tokens, running
 * whole layers in rotation over the copies so weights come from DRAM. */
static void layers_time(ThreadPool *tp, MatW layer[DECODE_COPIES][N_SHAPES], const MatW *head, const float *x,
                        int n_tok, float *out, int rounds, double t[N_SHAPES + 1]) {
    for (int s = 0; s <= N_SHAPES; s++) t[s] = 0;
    for (int i = -DECODE_COPIES; i < rounds; i++) {
        const MatW *lw = layer[(i + DECODE_COPIES) % DECODE_COPIES];
        for (int s = 0; s < N_SHAPES; s++) {
            double t0 = now_s();
            mm_matmul(tp, out, &lw[s], x, n_tok);
            if (i >= 0) t[s] += now_s() - t0;
        }
    }
    int head_rounds = rounds / 4 + 1;
    for (int i = -1; i < head_rounds; i++) {
        double t0 = now_s();
        mm_matmul(tp, out, head, x, n_tok);
        if (i >= 0) t[N_SHAPES] += now_s() - t0;
        /* evict the head from L3 between calls by reading a layer copy */
        for (int s = 0; s < N_SHAPES; s++) mm_matmul(tp, out, &layer[(i + 4) % DECODE_COPIES][s], x, n_tok);
    }
    for (int s = 0; s < N_SHAPES; s++) t[s] /= rounds;
    t[N_SHAPES] /= head_rounds;
}

static void bench_type(ThreadPool *tp, MnType type, int reps, bool do_pp, bool do_tg, bool do_batch) {
    const char *tname = ttype_traits(type)->name;
    MatW layer[DECODE_COPIES][N_SHAPES], head;
    size_t layer_bytes = 0;
    for (int c = 0; c < DECODE_COPIES; c++)
        for (int s = 0; s < N_SHAPES; s++) {
            const Shape *sh = &layer_shapes[s];
            layer[c][s] = (MatW){type, sh->n_in, sh->n_out, make_weights(type, sh->n_out, sh->n_in)};
            if (c == 0) {
                uint64_t rb;
                ttype_row_bytes(type, (uint64_t)sh->n_in, &rb);
                layer_bytes += rb * (uint64_t)sh->n_out;
            }
        }
    head = (MatW){type, head_shape.n_in, head_shape.n_out, make_weights(type, head_shape.n_out, head_shape.n_in)};
    uint64_t head_rb;
    ttype_row_bytes(type, DIM, &head_rb);
    size_t head_bytes = head_rb * VOCAB, model_bytes = layer_bytes * LAYERS + head_bytes;

    float *x = mn_alloc_aligned((size_t)PREFILL * FFN * sizeof(float), 64);
    float *out = mn_alloc_aligned((size_t)PREFILL * VOCAB * sizeof(float), 64);
    for (size_t i = 0; i < (size_t)PREFILL * FFN; i++) x[i] = rng_f();

    /* prefill: best of reps per matrix (compute-bound, cache state matters little) */
    double t_pp[N_SHAPES + 1], t_tg[N_SHAPES + 1];
    for (int s = 0; s <= N_SHAPES; s++) {
        const MatW *w = s < N_SHAPES ? &layer[0][s] : &head;
        t_pp[s] = do_pp ? time_matmul(tp, w, 1, x, PREFILL, out, reps) : 1e30;
    }
    /* decode: whole layers in rotation over the copies (> L3), as a forward
     * pass reads them */
    if (do_tg) {
        layers_time(tp, layer, &head, x, 1, out, reps * 8, t_tg);
    } else {
        for (int s = 0; s <= N_SHAPES; s++) t_tg[s] = 1e30;
    }
    printf("\n== %s weights (model %.2f GB), %d threads, path %s\n", tname, (double)model_bytes / 1e9,
           tpool_size(tp), mm_simd_name());
    if (do_pp || do_tg) {
        printf("%-8s %6s %6s | %10s %8s | %10s %8s %7s\n", "matrix", "n_out", "n_in", "pp512 ms", "GFLOP/s",
               "tg1 us", "GFLOP/s", "GB/s");
        double layer_pp = 0, layer_tg = 0, flop_tok = 0;
        for (int s = 0; s <= N_SHAPES; s++) {
            const Shape *sh = s < N_SHAPES ? &layer_shapes[s] : &head_shape;
            double flop1 = 2.0 * (double)sh->n_out * (double)sh->n_in;
            uint64_t rb;
            ttype_row_bytes(type, (uint64_t)sh->n_in, &rb);
            printf("%-8s %6lld %6lld | %10.2f %8.1f | %10.1f %8.1f %7.1f\n", sh->name, (long long)sh->n_out,
                   (long long)sh->n_in, t_pp[s] * 1e3, flop1 * PREFILL / t_pp[s] / 1e9, t_tg[s] * 1e6,
                   flop1 / t_tg[s] / 1e9, (double)rb * (double)sh->n_out / t_tg[s] / 1e9);
            flop_tok += flop1 * (s < N_SHAPES ? LAYERS : 1);
            if (s < N_SHAPES) {
                layer_pp += t_pp[s];
                layer_tg += t_tg[s];
            }
        }
        double pp_all = layer_pp * LAYERS + t_pp[N_SHAPES];  /* logits for every token */
        double pp_last = layer_pp * LAYERS + t_tg[N_SHAPES]; /* logits for the last token only */
        double tg = layer_tg * LAYERS + t_tg[N_SHAPES];
        printf("projected %s, matmuls only:\n"
               "  prefill n_tok=512: %.1f tok/s (head on the last token; %.1f tok/s with head on all 512, "
               "%.1f GFLOP/s)\n"
               "  decode  n_tok=1:   %.1f tok/s (%.1f GB/s of weights)\n",
               tname, PREFILL / pp_last, PREFILL / pp_all, flop_tok * PREFILL / pp_all / 1e9, 1.0 / tg,
               (double)model_bytes / tg / 1e9);
    }
    if (do_batch) {
        /* several sequences decoding together: tokens per weight read */
        printf("  batched decode (whole model, weights from DRAM):\n");
        static const int batch_toks[] = {1, 2, 4, 8, 16, 32, 64};
        for (size_t b = 0; b < sizeof batch_toks / sizeof batch_toks[0]; b++) {
            double tb[N_SHAPES + 1], step = 0;
            layers_time(tp, layer, &head, x, batch_toks[b], out, reps * 2, tb);
            for (int s = 0; s < N_SHAPES; s++) step += tb[s] * LAYERS;
            step += tb[N_SHAPES];
            printf("    n_tok %3d: step %7.1f ms, %7.1f tok/s   GFLOP/s per matrix:", batch_toks[b], step * 1e3,
                   batch_toks[b] / step);
            for (int s = 0; s <= N_SHAPES; s++) {
                const Shape *sh = s < N_SHAPES ? &layer_shapes[s] : &head_shape;
                printf(" %.0f", 2.0 * (double)sh->n_out * (double)sh->n_in * batch_toks[b] / tb[s] / 1e9);
            }
            printf("\n");
        }
    }
    mn_free_aligned(out);
    mn_free_aligned(x);
    for (int c = 0; c < DECODE_COPIES; c++)
        for (int s = 0; s < N_SHAPES; s++) mn_free_aligned((void *)layer[c][s].data);
    mn_free_aligned((void *)head.data);
}

int main(int argc, char **argv) {
    int n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *types = argc > 2 ? argv[2] : "q8_0,q4_0,f16";
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    const char *mode = argc > 4 ? argv[4] : "all"; /* all | pp | tg | batch */
    bool do_pp = strcmp(mode, "all") == 0 || strcmp(mode, "pp") == 0;
    bool do_tg = strcmp(mode, "all") == 0 || strcmp(mode, "tg") == 0;
    bool do_batch = strcmp(mode, "batch") == 0;
    ThreadPool *tp = tpool_new(n_threads);
    if (tp == NULL) return 1;
    const char *cpu = getenv("MNEMO_BENCH_CPU");
    if (cpu != NULL && strcmp(cpu, "1") == 0) {
        cpu_clock_threads = n_threads;
        printf("times: process CPU time / %d threads (MNEMO_BENCH_CPU=1)\n", n_threads);
    }
    if (do_tg) printf("memory read bandwidth, %d threads: %.1f GB/s\n", n_threads, measure_bandwidth(tp));
    char buf[128];
    snprintf(buf, sizeof buf, "%s", types);
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        MnType type;
        if (ttype_from_name(tok, &type) != 0) {
            fprintf(stderr, "unknown type %s\n", tok);
            continue;
        }
        bench_type(tp, type, reps, do_pp, do_tg, do_batch);
    }
    tpool_free(tp);
    return 0;
}
