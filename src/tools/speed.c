/* speed.c — `mnemo speed` (see speed.h).
 *
 * One Runner (engine/runner) over the model with a pool for prompt +
 * generated tokens. The prompt is fixed pseudo-random ids (base/rng from a
 * constant seed), so runs compare; a warm-up evaluation touches the
 * weights first. Each repetition resets the runner, evaluates `depth`
 * context tokens untimed (llama-bench's -d: the KV cache already holds a
 * conversation), times the prefill of the whole prompt in one batch (none
 * with --prompt-tokens 0), then n_gen single-token decodes, whose next id
 * is an arbitrary valid one (the logits are not read: sampling is not what
 * is measured). Rates are tokens over wall seconds summed over
 * the repetitions; peak RSS comes from getrusage.
 */
#include "tools/speed.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>

#include "base/cli.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/rng.h"
#include "cache/kv_pool.h"
#include "compute/matmul.h"
#include "engine/runner.h"
#include "model/gguf.h"
#include "model/model.h"

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define SPEED_PROMPT_SEED 1 /* fixed: every run measures the same prompt */

/* The next token of a timed decode: any id the vocabulary has. */
typedef struct {
    int32_t id;
    uint32_t n_vocab;
} SpeedNext;

static int speed_next_token(void *ctx, int idx, const float *logits) {
    SpeedNext *next = ctx;
    (void)idx;
    (void)logits;
    next->id = (int32_t)(((uint32_t)next->id * 1103515245u + 12345u) % next->n_vocab);
    return MN_OK;
}

int speed_main(int argc, char **argv) {
    const char *model_path = NULL, *kv_type_name = "f16";
    int n_prompt = 512, n_gen = 128, n_threads = 2, reps = 1, depth = 0;
    bool json = false, use_mmap = false;
    CliOpt opts[] = {
        {"model", 'm', CLI_STR, &model_path, "FILE", "GGUF model"},
        {"prompt-tokens", 'p', CLI_INT, &n_prompt, "N", "prefill length (default 512; 0: decode only)"},
        {"depth", 'd', CLI_INT, &depth, "N", "context tokens evaluated, untimed, before each run (default 0)"},
        {"gen-tokens", 'n', CLI_INT, &n_gen, "N", "decoded tokens (default 128)"},
        {"threads", 't', CLI_INT, &n_threads, "N", "compute threads (default 2)"},
        {"kv-type", 0, CLI_STR, &kv_type_name, "f16|f32", "KV cache and attention precision (default f16)"},
        {"repetitions", 'r', CLI_INT, &reps, "N", "runs to average (default 1)"},
        {"json", 0, CLI_FLAG, &json, NULL, "print one JSON object"},
        {"mmap", 0, CLI_FLAG, &use_mmap, NULL, "map the model file instead of reading it into huge pages"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo speed -m MODEL [--prompt-tokens 512] [--gen-tokens 128] [--depth 0] [--threads N] [--json]",
                            opts, N_OPTS(opts), pos, 0, &n_pos);
    if (rc >= 0) return rc;
    MnType kv_type;
    if (!cli_require(model_path != NULL, "speed", "needs a model: -m FILE") ||
        !cli_require(n_prompt >= 0, "speed", "--prompt-tokens must be at least 0, got %d", n_prompt) ||
        !cli_require(depth >= 0, "speed", "--depth must be at least 0, got %d", depth) ||
        !cli_require(n_gen >= 1, "speed", "--gen-tokens must be at least 1, got %d", n_gen) ||
        !cli_require(reps >= 1, "speed", "--repetitions must be at least 1, got %d", reps) ||
        !cli_require(kvpool_type_parse(kv_type_name, &kv_type) == MN_OK, "speed",
                     "--kv-type must be f16 or f32, got '%s'", kv_type_name))
        return 2;
    MnErr err = {0};
    Model *m = NULL;
    if (model_load_with(model_path, use_mmap ? GGUF_MAP : GGUF_READ, &m, &err)) return cli_fail(&err);
    Runner r;
    RunnerOptions ro;
    runner_options_default(&ro);
    /* the prompt and the depth's tokens come from one array: depth first */
    int n_ids = depth + n_prompt;
    ro.n_ctx = n_ids + n_gen;
    ro.max_batch = n_prompt > 0 ? n_prompt : 512;
    ro.n_threads = n_threads;
    ro.kv_type = kv_type;
    int status = 1;
    int32_t *prompt = mn_calloc((size_t)n_ids + 1, sizeof *prompt);
    if (prompt == NULL || (int64_t)n_ids + n_gen > m->cfg.n_ctx || runner_init(&r, m, &ro, &err)) {
        if (!err.msg[0]) mn_err_set(&err, MN_ERANGE, "%d + %d + %d tokens exceed the model's context of %d", depth,
                                    n_prompt, n_gen, m->cfg.n_ctx);
        mn_free(prompt);
        model_free(m);
        return cli_fail(&err);
    }
    Rng rng;
    rng_seed(&rng, SPEED_PROMPT_SEED, 0);
    for (int i = 0; i < n_ids + 1; i++) prompt[i] = (int32_t)rng_below(&rng, (uint64_t)m->cfg.n_vocab);
    SpeedNext next = {.id = 1, .n_vocab = (uint32_t)m->cfg.n_vocab};
    /* warm-up: touch the weights once */
    if (runner_eval(&r, prompt, n_ids < 16 ? n_ids + 1 : 16, false, NULL, NULL, &err)) goto done;
    double t_pp = 0, t_tg = 0;
    for (int rep = 0; rep < reps; rep++) {
        runner_reset(&r);
        if (depth > 0 && runner_eval(&r, prompt, depth, false, NULL, NULL, &err)) goto done;
        double t0 = mn_now();
        if (n_prompt > 0 && runner_eval(&r, prompt + depth, n_prompt, false, speed_next_token, &next, &err))
            goto done;
        double t1 = mn_now();
        for (int i = 0; i < n_gen; i++)
            if (runner_eval(&r, &next.id, 1, false, speed_next_token, &next, &err)) goto done;
        double t2 = mn_now();
        t_pp += t1 - t0;
        t_tg += t2 - t1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double pp = n_prompt > 0 ? (double)n_prompt * reps / t_pp : 0.0, tg = (double)n_gen * reps / t_tg;
    double rss_mb = (double)ru.ru_maxrss / 1024.0;
    if (json)
        printf("{\"model\": \"%s\", \"threads\": %d, \"depth\": %d, \"prompt_tokens\": %d, \"gen_tokens\": %d, "
               "\"prefill_tps\": %.2f, \"decode_tps\": %.2f, \"peak_rss_mb\": %.1f, \"model_mb\": %.1f, "
               "\"kv_pool_mb\": %.1f, \"simd\": \"%s\"}\n",
               model_path, n_threads, depth, n_prompt, n_gen, pp, tg, rss_mb, (double)gguf_file_bytes(m->gguf) / 1048576.0,
               (double)kvpool_bytes_for(r.pool.n_layer, r.pool.kv_dim, r.pool.block_tokens, r.pool.n_blocks,
                                        r.pool.kv_type) / 1048576.0,
               mm_simd_name());
    else
        printf("%-40s threads %d  depth %d  pp%-5d %8.2f t/s  tg%-5d %8.2f t/s  peak RSS %.1f MB\n", model_path,
               n_threads, depth, n_prompt, pp, n_gen, tg, rss_mb);
    status = 0;
done:
    if (status) cli_fail(&err);
    runner_deinit(&r);
    mn_free(prompt);
    model_free(m);
    return status;
}
