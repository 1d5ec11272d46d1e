/* main.c — the mnemo command: one entry point, a subcommand per job.
 *
 *   generate    run a prompt through a model and stream new tokens
 *   tokenize    text -> token ids        detokenize  token ids -> text
 *   inspect     print a GGUF's metadata and tensors
 *   gen-model   write a random-weight model of a given shape
 *   speed       prefill and decode throughput, like llama-bench
 *   shift-ppl   perplexity cost of moving cached KV to new positions (context overflow)
 *   serve       the OpenAI HTTP server      chat   a terminal chat client
 *   route       a front for several servers: each conversation to the one holding its cache
 *   bench       multi-turn load generator and report
 *   disk-probe  raw sequential bandwidth of a directory, as the disk tier moves data
 *   cache       cache purge: erase a namespace's data from a disk tier directory
 *   apply-template  render a chat template (Jinja) without a server
 *
 * Each cmd_* here parses its options (base/cli), does its job with the
 * library and returns the process exit status; the commands that are a
 * program of their own live beside their layer: bench (bench/bench.c), the
 * chat's conversation loop (bench/chat.c), disk-probe, gen-model, speed and
 * shift-ppl (tools/). This file only wires things together: it picks the command,
 * and for serve and chat builds the model, engine and server and joins
 * them to the outside.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/cli.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/ttype.h"
#include "base/user_cache.h"
#include "base/version.h"
#include "bench/bench.h"
#include "bench/chat.h"
#include "bench/client.h"
#include "cache/kv_pool.h"
#include "cache/purge.h"
#include "engine/engine.h"
#include "engine/profile.h"
#include "engine/mref.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "model/apply_template.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "route/router.h"
#include "server/responses.h"
#include "server/server.h"
#include "tools/diskprobe_cmd.h"
#include "tools/gen_model.h"
#include "tools/shift_ppl.h"
#include "tools/speed.h"

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Load only the tokenizer of a GGUF (any architecture, vocab-only files). */
static int load_tokenizer(const char *path, Gguf **g, Tokenizer **tok, MnErr *err) {
    int rc = gguf_open(path, g, err); /* its messages name the file */
    if (rc) return rc;
    rc = tok_load(*g, tok, err);
    if (rc) {
        mn_err_prefix(err, "%s", path);
        gguf_close(*g);
        *g = NULL;
    }
    return rc;
}

/* ---- tokenize / detokenize ---------------------------------------------------- */

static int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    bool no_bos = false, parse_special = false;
    CliOpt opts[] = {
        {"model", 'm', CLI_STR, &model, "FILE", "GGUF file with a vocabulary (tensors optional)"},
        {"no-bos", 0, CLI_FLAG, &no_bos, NULL, "do not add the BOS token"},
        {"parse-special", 0, CLI_FLAG, &parse_special, NULL, "turn special-token text into special tokens"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo tokenize -m MODEL [--no-bos] [--parse-special] TEXT", opts,
                            N_OPTS(opts), pos, 1, &n_pos);
    if (rc >= 0) return rc;
    if (!cli_require(model != NULL, "tokenize", "needs a model: -m FILE") ||
        !cli_require(n_pos == 1, "tokenize", "needs the TEXT to tokenize as its one argument"))
        return 2;
    MnErr err = {0};
    Gguf *g = NULL;
    Tokenizer *tok = NULL;
    if (load_tokenizer(model, &g, &tok, &err)) return cli_fail(&err);
    TokIds ids = {0};
    rc = tok_encode(tok, pos[0], strlen(pos[0]), !no_bos && tok_add_bos(tok), parse_special, &ids);
    if (rc == MN_OK) {
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        printf("\n");
    } else {
        fprintf(stderr, "mnemo: tokenize: %s\n", mn_strerror(rc));
    }
    tok_ids_free(&ids);
    tok_free(tok);
    gguf_close(g);
    return rc ? 1 : 0;
}

static int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    CliOpt opts[] = {{"model", 'm', CLI_STR, &model, "FILE", "GGUF file with a vocabulary"}};
    enum { MAX_IDS = 1 << 16 };
    const char **pos = mn_calloc(MAX_IDS, sizeof *pos);
    int32_t *ids = mn_calloc(MAX_IDS, sizeof *ids);
    if (pos == NULL || ids == NULL) {
        mn_free(pos);
        mn_free(ids);
        return 1;
    }
    int n_pos, status = 1;
    int rc = cli_parse_or_usage(argc, argv, "mnemo detokenize -m MODEL ID...", opts, N_OPTS(opts), pos, MAX_IDS, &n_pos);
    Gguf *g = NULL;
    Tokenizer *tok = NULL;
    MnErr err = {0};
    char *text = NULL;
    size_t len = 0;
    if (rc >= 0) {
        status = rc;
        goto done;
    }
    if (!cli_require(model != NULL, "detokenize", "needs a model: -m FILE")) {
        status = 2;
        goto done;
    }
    if (load_tokenizer(model, &g, &tok, &err)) {
        status = cli_fail(&err);
        goto done;
    }
    for (int i = 0; i < n_pos; i++) {
        char *end;
        long v = strtol(pos[i], &end, 10);
        if (*end || end == pos[i] || v < 0 || v >= tok_n_vocab(tok)) {
            fprintf(stderr, "mnemo detokenize: '%s' is not a token id of this vocabulary (0..%d)\n", pos[i],
                    tok_n_vocab(tok) - 1);
            status = 2;
            goto done;
        }
        ids[i] = (int32_t)v;
    }
    if (tok_decode(tok, ids, (size_t)n_pos, false, &text, &len) != MN_OK) goto done;
    fwrite(text, 1, len, stdout);
    printf("\n");
    status = 0;
done:
    mn_free(text);
    tok_free(tok);
    gguf_close(g);
    mn_free(pos);
    mn_free(ids);
    return status;
}

/* ---- inspect -------------------------------------------------------------------- */

static int cmd_inspect(int argc, char **argv) {
    CliOpt opts[1] = {{"help", 'h', CLI_FLAG, NULL, NULL, "show this help"}};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo inspect MODEL", opts, 0, pos, 1, &n_pos);
    if (rc >= 0) return rc;
    if (n_pos != 1) {
        fprintf(stderr, "mnemo inspect: needs one GGUF file\n");
        return 2;
    }
    MnErr err = {0};
    Gguf *g = NULL;
    if (gguf_open(pos[0], &g, &err)) return cli_fail(&err);
    gguf_dump(g, stdout);
    gguf_close(g);
    return 0;
}

/* ---- generate ------------------------------------------------------------------- */

typedef struct GenCtx {
    MrefWriter *mref;
    float *last;     /* (n_vocab) logits of the latest row */
    int n_vocab;
    MnErr *err;
} GenCtx;

static int gen_row(void *ctx_, int idx, const float *logits) {
    GenCtx *ctx = ctx_;
    memcpy(ctx->last, logits, (size_t)ctx->n_vocab * sizeof(float));
    if (ctx->mref) return mref_add_row(ctx->mref, logits, ctx->err);
    return MN_OK;
}

static int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = "", *kv_type_name = "f16", *dump = NULL;
    int n_gen = 128, n_threads = 2, block_tokens = 32, batch = 512, ctx_len = 0;
    bool ignore_eos = false, use_mmap = false;
    uint64_t seed = (uint64_t)time(NULL);
    SamplerParams sp;
    sampler_params_default(&sp);
    CliOpt opts[] = {
        {"model", 'm', CLI_STR, &model_path, "FILE", "GGUF model"},
        {"prompt", 'p', CLI_STR, &prompt, "TEXT", "prompt text (default empty)"},
        {"n-predict", 'n', CLI_INT, &n_gen, "N", "tokens to generate (default 128)"},
        {"temp", 0, CLI_FLOAT, &sp.temperature, "T", "temperature; 0 = greedy (default 0.8)"},
        {"top-k", 0, CLI_INT, &sp.top_k, "K", "top-k, <= 0 off (default 40)"},
        {"top-p", 0, CLI_FLOAT, &sp.top_p, "P", "top-p, 1 = off (default 0.95)"},
        {"min-p", 0, CLI_FLOAT, &sp.min_p, "P", "min-p, 0 = off (default 0.05)"},
        {"repeat-penalty", 0, CLI_FLOAT, &sp.repeat_penalty, "R", "repetition penalty (default 1 = off)"},
        {"repeat-last-n", 0, CLI_INT, &sp.repeat_last_n, "N", "window of the penalties (default 64)"},
        {"presence-penalty", 0, CLI_FLOAT, &sp.presence_penalty, "P", "presence penalty (default 0)"},
        {"frequency-penalty", 0, CLI_FLOAT, &sp.frequency_penalty, "F", "frequency penalty (default 0)"},
        {"seed", 's', CLI_U64, &seed, "S", "sampling seed (default: time)"},
        {"threads", 't', CLI_INT, &n_threads, "N", "compute threads (default 2)"},
        {"kv-type", 0, CLI_STR, &kv_type_name, "f16|f32", "KV cache and attention precision (default f16)"},
        {"block-tokens", 0, CLI_INT, &block_tokens, "N", "tokens per KV block (default 32)"},
        {"batch", 'b', CLI_INT, &batch, "N", "prompt tokens per forward pass (default 512)"},
        {"ctx", 'c', CLI_INT, &ctx_len, "N", "context length (default: the model's)"},
        {"ignore-eos", 0, CLI_FLAG, &ignore_eos, NULL, "keep generating after end-of-generation tokens"},
        {"dump-logits", 0, CLI_STR, &dump, "FILE", "write the prompt's logits as an MREF file"},
        {"mmap", 0, CLI_FLAG, &use_mmap, NULL, "map the model file instead of reading it into huge pages"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo generate -m MODEL -p PROMPT -n N [options]", opts, N_OPTS(opts), pos,
                            0, &n_pos);
    if (rc >= 0) return rc;
    MnType kv_type;
    if (!cli_require(model_path != NULL, "generate", "needs a model: -m FILE") ||
        !cli_require(n_gen >= 0, "generate", "-n must be at least 0, got %d", n_gen) ||
        !cli_require(kvpool_type_parse(kv_type_name, &kv_type) == MN_OK, "generate",
                     "--kv-type must be f16 or f32, got '%s'", kv_type_name))
        return 2;
    sp.seed = seed;
    MnErr err = {0};
    Model *m = NULL;
    Runner r;
    memset(&r, 0, sizeof r);
    Sampler *smp = NULL;
    TokIds ids = {0};
    GenCtx gc = {0};
    MrefWriter mw = {0};
    int status = 1;
    bool is_line_open = false; /* text printed that a newline must end */
    if (model_load_with(model_path, use_mmap ? GGUF_MAP : GGUF_READ, &m, &err)) return cli_fail(&err);
    rc = tok_encode(m->tok, prompt, strlen(prompt), tok_add_bos(m->tok), true, &ids);
    if (rc) {
        mn_err_set(&err, rc, "tokenize: %s", mn_strerror(rc));
        goto done;
    }
    if (ids.n == 0) {
        mn_err_set(&err, MN_EINVAL, "the prompt is empty and the vocabulary has no BOS token");
        goto done;
    }
    RunnerOptions ro;
    runner_options_default(&ro);
    ro.n_ctx = ctx_len > 0 ? ctx_len : m->cfg.n_ctx;
    ro.max_batch = batch;
    ro.block_tokens = block_tokens;
    ro.n_threads = n_threads;
    ro.kv_type = kv_type;
    ro.all_logits = dump != NULL;
    if ((int)ids.n + n_gen > ro.n_ctx) {
        mn_err_set(&err, MN_ERANGE, "prompt (%zu tokens) + %d new tokens exceed the context of %d", ids.n, n_gen,
                   ro.n_ctx);
        goto done;
    }
    if (runner_init(&r, m, &ro, &err)) goto done;
    if ((rc = sampler_new(&sp, m->cfg.n_vocab, &smp))) {
        mn_err_set(&err, rc, "invalid sampling parameters");
        goto done;
    }
    gc.n_vocab = m->cfg.n_vocab;
    gc.err = &err;
    gc.last = mn_malloc((size_t)gc.n_vocab * sizeof(float));
    if (gc.last == NULL) goto done;
    if (dump) {
        if (mref_begin(&mw, dump, ids.ids, (int)ids.n, gc.n_vocab, &err)) goto done;
        gc.mref = &mw;
    }
    fputs(prompt, stdout);
    fflush(stdout);
    is_line_open = true;
    for (size_t i = 0; i < ids.n; i++) sampler_accept(smp, ids.ids[i]);
    double t0 = mn_now();
    if (runner_eval(&r, ids.ids, (int)ids.n, dump != NULL, gen_row, &gc, &err)) goto done;
    if (dump) {
        gc.mref = NULL;
        if (mref_finish(&mw, gc.last, &err)) goto done;
    }
    double t_prompt = mn_now() - t0;
    TokStream ts;
    tok_stream_init(&ts, m->tok, false);
    if (prompt[0] != '\0') ts.at_start = false;
    size_t cap = tok_max_piece_bytes(m->tok) + 16;
    char *piece = mn_malloc(cap);
    if (piece == NULL) goto done;
    int n_done = 0;
    double t1 = mn_now();
    for (; n_done < n_gen; n_done++) {
        int32_t next = sampler_sample(smp, gc.last);
        if (!ignore_eos && tok_is_eog(m->tok, next)) break;
        sampler_accept(smp, next);
        size_t n_out = 0;
        tok_stream_push(&ts, next, piece, cap, &n_out);
        fwrite(piece, 1, n_out, stdout);
        fflush(stdout);
        if (n_done + 1 < n_gen && runner_eval(&r, &next, 1, false, gen_row, &gc, &err)) {
            mn_free(piece);
            goto done;
        }
    }
    size_t n_out = 0;
    tok_stream_flush(&ts, piece, cap, &n_out);
    fwrite(piece, 1, n_out, stdout);
    /* the text ends its line before the statistics go to stderr */
    printf("\n");
    fflush(stdout);
    is_line_open = false;
    mn_free(piece);
    double t_gen = mn_now() - t1;
    fprintf(stderr, "mnemo: prompt %zu tokens in %.3f s (%.1f t/s), generated %d tokens in %.3f s (%.1f t/s), seed %" PRIu64 "\n",
            ids.n, t_prompt, (double)ids.n / t_prompt, n_done, t_gen, n_done / (t_gen > 0 ? t_gen : 1), seed);
    status = 0;
done:
    if (mw.f) fclose(mw.f);
    if (is_line_open) {
        printf("\n");
        fflush(stdout);
    }
    if (status) cli_fail(&err);
    mn_free(gc.last);
    sampler_free(smp);
    tok_ids_free(&ids);
    runner_deinit(&r);
    model_free(m);
    return status;
}

/* ---- serve --------------------------------------------------------------------- */

/* The chat format of m as the options choose it (model/chat_format.h),
 * named in the log; a template that does not parse is an error that says
 * how to choose another. */
static int pick_chat_format(const Model *m, const ChatFormatOptions *co, ChatFormat **out, MnErr *err) {
    int rc = chat_format_new(m->gguf, m->tok, co, out, err);
    if (rc == MN_OK) LOG_INFO("chat template: %s", chat_format_describe(*out));
    return rc;
}

/* The connection flags serve and route share (HttpLimits; the idle timeout
 * parsed into a float first). */
#define HTTP_LIMIT_OPTS(lim, idle)                                                                             \
    {"max-connections", 0, CLI_INT, &(lim).max_connections, "N",                                               \
     "open client connections at most; one more is closed at once (serve: default 512, at most 900; "         \
     "route: 256, at most 450)"},                                                                              \
        {"max-per-ip", 0, CLI_INT, &(lim).max_per_ip, "N",                                                     \
         "open connections from one client address at most (serve: default 256, route: 128; 0: no limit)"},   \
        {"idle-timeout", 0, CLI_FLOAT, &(idle), "S",                                                           \
         "close a connection that has nothing in or out for S seconds, e.g. one that never sends its request " \
         "(default 30; streams send a ping every second)"}

/* Take the parsed idle timeout into *lim and check the limits against the
 * command's ceiling of connections: false (and a message naming the flag)
 * when they are out of range. */
static bool limits_ok(HttpLimits *lim, float idle, int max_connections, const char *cmd) {
    lim->idle_timeout_s = idle;
    MnErr err = {0};
    return cli_require(http_limits_check(lim, max_connections, &err) == MN_OK, cmd, "%s", err.msg);
}

/* The longest time a flag may give (a day): past it, seconds in a double
 * turned into libcurl's milliseconds or a timespec would overflow. */
#define MAX_FLAG_S 86400.0

/* A time flag's value is in range: more than 0 (or 0 itself when
 * may_be_zero) and at most MAX_FLAG_S; else false and a message. */
static bool seconds_ok(const char *cmd, const char *flag, float v, bool may_be_zero) {
    return cli_require((may_be_zero ? v >= 0 : v > 0) && v <= MAX_FLAG_S, cmd,
                       "--%s must be %s 0 and at most %g (seconds), got %g", flag,
                       may_be_zero ? "at least" : "more than", MAX_FLAG_S, (double)v);
}

/* The index of val among names[0..n), or -1. */
static int choice(const char *val, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(val, names[i]) == 0) return i;
    return -1;
}

static int cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *host = "127.0.0.1", *alias = NULL, *tmpl_name = NULL, *kv_type_name = "f16",
               *schedule = "fcfs", *evict = NULL, *profile_file = NULL, *overflow = "shift", *restore_plan = "auto",
               *tmpl_file = NULL, *tmpl_date = NULL;
    int port = 8080, max_body_kb = 1024, n_predict = -1;
    const char *gpu_layers = NULL, *flash_attn = NULL; /* llama.cpp's, ignored */
    uint64_t pool_mb = 0;
    float drain_timeout = 30.0f, cache_ttl = 0.0f, response_ttl = (float)RESP_TTL_DEFAULT_S;
    bool no_prefix_cache = false, no_layer_split = false, no_tier_measure = false, use_mmap = false;
    CliStrList keys = {0}, cors = {0}, redis_urls = {0};
    EngineOptions eo;
    engine_options_default(&eo);
    float step_ms = (float)eo.step_ms, decode_step_ratio = (float)eo.decode_step_ratio;
    ServerOptions so;
    server_options_default(&so);
    float idle_timeout = (float)so.limits.idle_timeout_s;
    CliOpt opts[] = {
        {"model", 'm', CLI_STR, &model_path, "FILE", "GGUF model"},
        {"mmap", 0, CLI_FLAG, &use_mmap, NULL, "map the model file instead of reading it into huge pages"},
        {"host", 0, CLI_STR, &host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"},
        {"port", 0, CLI_INT, &port, "N", "port (default 8080; 0 = any free port)"},
        {"alias", 'a', CLI_STR, &alias, "NAME", "model name in /v1/models (default: the file name)"},
        {"api-key", 0, CLI_STR_LIST, &keys, "KEY", "require this API key (repeatable; each key is a cache namespace)"},
        {"cors-origin", 0, CLI_STR_LIST, &cors, "ORIGIN", "let pages of this origin call the API (repeatable; '*': any)"},
        {"chat-template", 0, CLI_STR, &tmpl_name, "NAME",
         "a built-in chat format instead of the model's template, or 'list'"},
        {"chat-template-file", 0, CLI_STR, &tmpl_file, "FILE", "render this Jinja chat template instead of the model's"},
        {"template-date", 0, CLI_STR, &tmpl_date, "YYYY-MM-DD", "the day the template's strftime_now gives (default: today)"},
        {"threads", 't', CLI_INT, &eo.n_threads, "N", "compute threads (default 2)"},
        {"compute-nice", 0, CLI_INT, &eo.compute_nice, "N",
         "compute threads run N nice levels below the mover and HTTP threads (0-19, default 5)"},
        {"parallel", 'P', CLI_INT, &eo.parallel, "N", "running sequences at most (default 8)"},
        {"np", 0, CLI_INT, &eo.parallel, "N", NULL},
        {"batch-tokens", 'b', CLI_INT, &eo.batch_tokens, "N", "tokens in one step at most (default 512)"},
        {"batch-size", 0, CLI_INT, &eo.batch_tokens, "N", NULL},
        {"step-ms", 0, CLI_FLOAT, &step_ms, "MS",
         "time target of one step: prefill chunks are sized to it from the steps measured (0: each step takes up "
         "to --batch-tokens; default 500)"},
        {"decode-step-ratio", 0, CLI_FLOAT, &decode_step_ratio, "R",
         "hold a step beside answering conversations to R times their tokens' own pass (1-100, default 3; 0: "
         "off, each step takes up to --step-ms): the inter-token gap beside a prompt stays within about R gaps"},
        {"no-layer-split", 0, CLI_FLAG, &no_layer_split, NULL,
         "run each prompt chunk's layers in one step (beside answering conversations a chunk is then only as long "
         "as the step holds, and short chunks compute fewer tokens a second)"},
        {"block-tokens", 0, CLI_INT, &eo.block_tokens, "N", "tokens per KV block (default 32)"},
        {"ctx", 'c', CLI_INT, &eo.n_ctx, "N",
         "positions one sequence may use (default: the model's); not, as llama-server's -c, the KV of all"},
        {"ctx-size", 0, CLI_INT, &eo.n_ctx, "N", NULL},
        {"context-overflow", 0, CLI_STR, &overflow, "shift|recompute|error",
         "a chat longer than the context: drop its oldest turns and move the rest's cached KV to its new positions "
         "(shift, the default: approximate), or recompute the rest (exact), or refuse it"},
        {"n-predict", 'n', CLI_INT, &n_predict, "N",
         "max_tokens of a request that gives none (default -1: until the context or the pool is full)"},
        {"predict", 0, CLI_INT, &n_predict, "N", NULL},
        {"n-gpu-layers", 0, CLI_STR, &gpu_layers, "N", "accepted for llama.cpp command lines; does nothing (CPU only)"},
        {"ngl", 0, CLI_STR, &gpu_layers, "N", NULL},
        {"gpu-layers", 0, CLI_STR, &gpu_layers, "N", NULL},
        {"flash-attn", 0, CLI_STR_OPTVAL, &flash_attn, "[on|off|auto]",
         "accepted for llama.cpp command lines; does nothing (mnemo has one attention kernel)"},
        {"fa", 0, CLI_STR_OPTVAL, &flash_attn, NULL, NULL},
        {"pool-mb", 0, CLI_U64, &pool_mb, "N", "KV pool size in MiB (default: a quarter of free RAM, at most 4 GiB)"},
        {"pool-blocks", 0, CLI_INT, &eo.pool_blocks, "N", "KV pool size in blocks (overrides --pool-mb)"},
        {"decode-reserve", 0, CLI_FLOAT, &eo.decode_reserve, "F", "pool fraction kept for running sequences (0.1)"},
        {"schedule", 0, CLI_STR, &schedule, "fcfs|fpf|relaxed-fpf", "admission order (default fcfs)"},
        {"max-queue", 0, CLI_INT, &eo.max_queue, "N", "waiting requests at most, then 503 (default 64)"},
        {"max-body", 0, CLI_INT, &max_body_kb, "KB", "largest request body in KiB, then 413 (default 1024)"},
        HTTP_LIMIT_OPTS(so.limits, idle_timeout),
        {"kv-type", 0, CLI_STR, &kv_type_name, "f16|f32", "KV cache and attention precision (default f16)"},
        {"restore-plan", 0, CLI_STR, &restore_plan, "kv|hidden|auto",
         "how the cache tiers store a conversation's layers: as KV, as the hidden states KV is projected from "
         "where those are smaller (restored by projecting them: the same KV, bit for bit), or (auto, the "
         "default) with a disk or Redis tier each run split between the two by the measured projection time "
         "and read bandwidth, KV with a RAM tier alone"},
        {"no-tier-measure", 0, CLI_FLAG, &no_tier_measure, NULL,
         "do not measure the cache tiers' read rates at start (32 MiB written and read back through each); the "
         "restore planner then guesses until each tier's first restore"},
        {"no-prefix-cache", 0, CLI_FLAG, &no_prefix_cache, NULL, "compute every prompt from scratch"},
        {"drain-timeout", 0, CLI_FLOAT, &drain_timeout, "S", "on SIGTERM, let running requests finish this long (30)"},
        {"cache-ttl", 0, CLI_FLOAT, &cache_ttl, "S", "drop cached blocks idle longer than S seconds (0: never)"},
        {"response-ttl", 0, CLI_FLOAT, &response_ttl, "S",
         "delete stored responses (/v1/responses) unused for S seconds (0: never; default 2592000, 30 days)"},
        {"evict", 0, CLI_STR, &evict, "POLICY", "lru|fifo|pensieve|lookahead|pensieve+lookahead (default the last)"},
        {"profile-file", 0, CLI_STR, &profile_file, "FILE", "where the machine's cost profile is cached (default ~/.cache/mnemo/cost-MODEL-tN-bN-KV-CPU.txt)"},
        {"ram-tier-mb", 0, CLI_U64, &eo.ram_tier_mb, "N", "host RAM tier below the pool, in MiB (default 0: none)"},
        {"disk-tier", 0, CLI_STR, &eo.disk_tier_dir, "DIR", "disk tier directory, kept across restarts (default: none)"},
        {"disk-tier-mb", 0, CLI_U64, &eo.disk_tier_mb, "N", "disk tier budget in MiB (default 4096)"},
        {"swap-watermark", 0, CLI_FLOAT, &eo.swap_watermark, "F", "copy cold blocks down when free pool blocks fall under F (0.25)"},
        {"redis-tier", 0, CLI_STR_LIST, &redis_urls, "URL",
         "shared tier in Redis, below the others: redis://[user:password@]host[:port][/db] or "
         "unix:///path.sock[?db=N] (default: none; credentials are never logged); with --redis-cluster, "
         "repeatable: the cluster's seeds"},
        {"redis-cluster", 0, CLI_FLAG, &eo.redis_cluster, NULL,
         "the --redis-tier URLs are seeds of a Redis Cluster (each key goes to its slot's node)"},
        {"redis-ttl", 0, CLI_INT, &eo.redis_ttl_s, "S",
         "the shared tier's keys expire S seconds after their last use (default 0: Redis's maxmemory policy decides)"},
        {"redis-timeout-ms", 0, CLI_INT, &eo.redis_timeout_ms, "MS",
         "give up on Redis after MS ms without progress and recompute (default 1000)"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo serve -m MODEL [options]", opts, N_OPTS(opts), pos, 0, &n_pos);
    if (rc >= 0) {
        cli_free(opts, N_OPTS(opts));
        return rc;
    }
    int status = 2;
    if (tmpl_name && strcmp(tmpl_name, "list") == 0) {
        for (int t = 0; t < CHAT_TMPL__COUNT; t++) printf("%s\n", chat_template_name((ChatTemplate)t));
        cli_free(opts, N_OPTS(opts));
        return 0;
    }
    /* the spellings in their enums' order */
    static const char *const SCHEDULES[] = {"fcfs", "fpf", "relaxed-fpf"};
    static const char *const PLANS[] = {"kv", "hidden", "auto"};
    static const char *const OVERFLOWS[] = {"shift", "recompute", "error"};
    int sched = choice(schedule, SCHEDULES, N_OPTS(SCHEDULES)), plan = choice(restore_plan, PLANS, N_OPTS(PLANS)),
        overflow_mode = choice(overflow, OVERFLOWS, N_OPTS(OVERFLOWS));
    if (!cli_require(step_ms >= 0, "serve", "--step-ms must be 0 or more, got %g", (double)step_ms) ||
        !cli_require(decode_step_ratio == 0 || (decode_step_ratio >= 1 && decode_step_ratio <= 100), "serve",
                     "--decode-step-ratio must be 0 or 1..100, got %g", (double)decode_step_ratio) ||
        !cli_require(sched >= 0, "serve", "--schedule must be fcfs, fpf or relaxed-fpf, got '%s'", schedule) ||
        !cli_require(plan >= 0, "serve", "--restore-plan must be kv, hidden or auto, got '%s'", restore_plan) ||
        !cli_require(overflow_mode >= 0, "serve", "--context-overflow must be shift, recompute or error, got '%s'",
                     overflow))
        goto out;
    eo.step_ms = step_ms;
    eo.decode_step_ratio = decode_step_ratio;
    eo.layer_split = !no_layer_split;
    eo.schedule = (SchedPolicy)sched;
    eo.restore_plan = (RestorePlan)plan;
    eo.measure_tiers = !no_tier_measure;
    eo.context_overflow = (ContextOverflow)overflow_mode;
    MnErr perr = {0};
    if (evict && policy_parse(evict, &eo.evict, &perr) != MN_OK) {
        fprintf(stderr, "mnemo serve: %s\n", perr.msg);
        goto out;
    }
    JinjaDate date;
    if (tmpl_date && jinja_date_parse(tmpl_date, &date, &perr) != MN_OK) {
        fprintf(stderr, "mnemo serve: --template-date: %s\n", perr.msg);
        goto out;
    }
    ChatFormatOptions co = {tmpl_file, tmpl_name, tmpl_date ? &date : NULL};
    if (!cli_require(model_path != NULL, "serve", "needs a model: -m FILE") ||
        !cli_require(kvpool_type_parse(kv_type_name, &eo.kv_type) == MN_OK, "serve",
                     "--kv-type must be f16 or f32, got '%s'", kv_type_name) ||
        !cli_require(port >= 0 && port <= 65535, "serve", "--port must be in 0..65535, got %d", port) ||
        !cli_require(max_body_kb >= 1, "serve", "--max-body must be at least 1 (KiB), got %d", max_body_kb) ||
        !limits_ok(&so.limits, idle_timeout, HTTP_MAX_CONNECTIONS, "serve") ||
        !seconds_ok("serve", "drain-timeout", drain_timeout, true) ||
        !cli_require(response_ttl >= 0, "serve", "--response-ttl must be >= 0, got %g", response_ttl) ||
        !cli_require(eo.disk_tier_mb >= 1, "serve", "--disk-tier-mb must be at least 1 (MiB), got 0") ||
        !cli_require(eo.disk_tier_mb <= (1ull << 40), "serve", "--disk-tier-mb must be at most %llu (1 EiB), got %llu",
                     1ull << 40, (unsigned long long)eo.disk_tier_mb) ||
        !cli_require(eo.redis_ttl_s >= 0, "serve", "--redis-ttl must be >= 0, got %d", eo.redis_ttl_s) ||
        !cli_require(redis_urls.n <= 1 || eo.redis_cluster, "serve",
                     "--redis-tier is given %d times: several URLs are a cluster's seeds (--redis-cluster)",
                     redis_urls.n) ||
        !cli_require(!eo.redis_cluster || redis_urls.n >= 1, "serve", "--redis-cluster needs --redis-tier URL (a seed)") ||
        !cli_require(eo.redis_timeout_ms >= 0, "serve", "--redis-timeout-ms must be >= 0, got %d",
                     eo.redis_timeout_ms) ||
        !cli_require(n_predict == -1 || n_predict >= 1, "serve", "-n must be -1 (no limit) or at least 1, got %d",
                     n_predict))
        goto out;
    if (gpu_layers || flash_attn)
        fprintf(stderr, "mnemo serve: warning: %s%s%s do%s nothing: mnemo computes on the CPU\n",
                gpu_layers ? "-ngl (--n-gpu-layers)" : "", gpu_layers && flash_attn ? " and " : "",
                flash_attn ? "-fa (--flash-attn)" : "", gpu_layers && flash_attn ? "" : "es");
    eo.pool_mb = pool_mb;
    eo.prefix_cache = !no_prefix_cache;
    eo.cache_ttl_s = cache_ttl;
    MnErr err = {0};
    Model *m = NULL;
    Engine *e = NULL;
    Server *srv = NULL;
    ChatFormat *fmt = NULL;
    status = 1;
    if (model_load_with(model_path, use_mmap ? GGUF_MAP : GGUF_READ, &m, &err)) {
        cli_fail(&err);
        goto out;
    }
    so.host = host;
    so.port = port;
    so.api_keys = keys.items;
    so.n_api_keys = keys.n;
    so.cors_origins = cors.items;
    so.n_cors_origins = cors.n;
    /* an empty URL (MNEMO_REDIS_TIER=) is none */
    eo.redis_urls = redis_urls.items;
    eo.n_redis_urls = redis_urls.n == 1 && redis_urls.items[0][0] == '\0' ? 0 : redis_urls.n;
    so.max_body = (size_t)max_body_kb * 1024;
    so.response_ttl_s = response_ttl;
    eo.default_max_tokens = n_predict;
    const char *base = strrchr(model_path, '/');
    so.model_name = alias ? alias : base ? base + 1 : model_path;
    if (pick_chat_format(m, &co, &fmt, &err)) {
        cli_fail(&err);
        goto out_model;
    }
    eo.chat_format = fmt;
    /* the pensieve policy's recompute cost: a profile of this machine, taken
     * once and cached (a cache that cannot be written only costs time) */
    CostModel cost;
    if (!no_prefix_cache && policy_uses_cost(eo.evict)) {
        ProfileOptions po;
        profile_options_default(&po);
        po.n_threads = eo.n_threads;
        po.block_tokens = eo.block_tokens;
        po.kv_type = eo.kv_type;
        char path[1024];
        if (profile_file == NULL && profile_default_path(m, &po, path, sizeof path) == MN_OK) profile_file = path;
        bool was_loaded = false;
        if (profile_load_or_measure(m, &po, profile_file, &cost, &was_loaded, &err) == MN_OK) {
            eo.cost = &cost;
            LOG_INFO("cost profile %s %s", was_loaded ? "loaded from" : "measured, cached in",
                     profile_file ? profile_file : "(nowhere)");
        } else {
            LOG_WARN("no cost profile (%s): pensieve ranks blocks by position", err.msg);
        }
    }
    /* signals are taken by sigwait below; every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (engine_new(m, &eo, &e, &err) || server_new(e, &so, &srv, &err)) {
        cli_fail(&err);
        goto out_engine;
    }
    EngineStats st;
    engine_stats(e, &st);
    LOG_INFO("KV pool: %d blocks of %d tokens, %.1f MiB (%s), prefix cache %s, eviction %s", st.pool_blocks,
             st.block_tokens, (double)st.pool_bytes / 1048576.0, kv_type_name, eo.prefix_cache ? "on" : "off",
             policy_name(eo.evict));
    for (int i = 0; i < st.n_tiers; i++) {
        const TierStats *ts = &st.tiers[i].tier;
        if (strcmp(ts->name, "redis") == 0) /* Redis decides what it keeps: no budget of ours */
            LOG_INFO("cache tier %d: redis, shared%s", i + 1, ts->is_failed ? ", not answering yet (retried)" : "");
        else
            LOG_INFO("cache tier %d: %s, %.1f MiB, %llu blocks held", i + 1, ts->name,
                     (double)ts->capacity_bytes / 1048576.0, (unsigned long long)ts->n_blocks);
    }
    LOG_INFO("version %s (commit %s) serving %s on http://%s:%d (context %d, %d parallel, batch %d tokens, "
             "steps of %g ms)",
             MNEMO_VERSION, mn_build_commit(), so.model_name, host, server_port(srv), st.n_ctx, eo.parallel,
             eo.batch_tokens, eo.step_ms);
    int sig = 0;
    sigwait(&sigs, &sig);
    LOG_INFO("signal %d: draining (at most %.1f s), then shutting down", sig, (double)drain_timeout);
    server_quiesce(srv);
    if (!engine_drain(e, drain_timeout)) LOG_WARN("drain timeout: cancelling the requests still running");
    status = 0;
out_engine:
    if (e) engine_shutdown(e); /* running requests end, so connection threads finish */
    server_free(srv);
    engine_free(e);
out_model:
    chat_format_free(fmt);
    model_free(m);
out:
    cli_free(opts, N_OPTS(opts));
    return status;
}


/* ---- route ------------------------------------------------------------------------ */

static int cmd_route(int argc, char **argv) {
    RouterOptions ro;
    router_options_default(&ro);
    const char *policy = "hash";
    int max_body_kb = (int)(ro.max_body / 1024);
    uint64_t n_ids = ro.max_response_ids;
    float load_factor = (float)ro.load_factor, connect_timeout = (float)ro.connect_timeout_s,
          probe_min = (float)ro.probe_min_s, probe_max = (float)ro.probe_max_s, drain_timeout = 30.0f,
          idle_timeout = (float)ro.limits.idle_timeout_s, upstream_timeout = (float)ro.upstream_timeout_s;
    CliStrList backends = {0};
    CliOpt opts[] = {
        {"backend", 0, CLI_STR_LIST, &backends, "URL", "a mnemo server, http://HOST:PORT (repeatable; at least one)"},
        {"host", 0, CLI_STR, &ro.host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"},
        {"port", 0, CLI_INT, &ro.port, "N", "port (default 8090; 0 = any free port)"},
        {"policy", 0, CLI_STR, &policy, "hash|round-robin",
         "hash: each conversation to the backend of its key on the ring (default); round-robin: in turn"},
        {"load-factor", 0, CLI_FLOAT, &load_factor, "C",
         "a backend takes at most C x the mean requests in flight before the next on the ring does (1.25; 0: off)"},
        {"max-body", 0, CLI_INT, &max_body_kb, "KB", "largest request body in KiB, then 413 (default 1024)"},
        {"response-ids", 0, CLI_U64, &n_ids, "N", "response ids remembered with their backend (default 65536)"},
        HTTP_LIMIT_OPTS(ro.limits, idle_timeout),
        {"connect-timeout", 0, CLI_FLOAT, &connect_timeout, "S", "give up connecting to a backend after S seconds (2)"},
        {"upstream-timeout", 0, CLI_FLOAT, &upstream_timeout, "S",
         "a backend that sends nothing for S seconds, before its answer or within it, has failed: the next one is "
         "tried, or 504 (default 600; a non-streamed answer comes whole, so S must cover the longest generation)"},
        {"probe-min", 0, CLI_FLOAT, &probe_min, "S", "probe a failed backend's /health first after S seconds (0.25)"},
        {"probe-max", 0, CLI_FLOAT, &probe_max, "S", "then twice as long each time, up to S seconds (5)"},
        {"drain-timeout", 0, CLI_FLOAT, &drain_timeout, "S", "on SIGTERM, let requests in progress finish this long (30)"},
    };
    const char *synopsis = "mnemo route --backend URL [--backend URL]... [--port N] [--host H] [options]";
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, synopsis, opts, N_OPTS(opts), pos, 0, &n_pos);
    if (rc >= 0) {
        cli_free(opts, N_OPTS(opts));
        return rc;
    }
    int status = 2;
    if (!cli_require(backends.n >= 1, "route", "needs at least one --backend URL") ||
        !cli_require(router_policy_parse(policy, &ro.policy) == MN_OK, "route",
                     "--policy must be hash or round-robin, got '%s'", policy) ||
        !cli_require(ro.port >= 0 && ro.port <= 65535, "route", "--port must be in 0..65535, got %d", ro.port) ||
        !cli_require(max_body_kb >= 1, "route", "--max-body must be at least 1 (KiB), got %d", max_body_kb) ||
        !seconds_ok("route", "connect-timeout", connect_timeout, false) ||
        !seconds_ok("route", "upstream-timeout", upstream_timeout, false) ||
        !seconds_ok("route", "probe-min", probe_min, false) || !seconds_ok("route", "probe-max", probe_max, false) ||
        !seconds_ok("route", "drain-timeout", drain_timeout, true) ||
        !limits_ok(&ro.limits, idle_timeout, ROUTER_MAX_CONNECTIONS, "route"))
        goto out;
    ro.backends = backends.items;
    ro.n_backends = backends.n;
    ro.max_body = (size_t)max_body_kb * 1024;
    ro.max_response_ids = (size_t)n_ids;
    ro.load_factor = load_factor;
    ro.connect_timeout_s = connect_timeout;
    ro.upstream_timeout_s = upstream_timeout;
    ro.probe_min_s = probe_min;
    ro.probe_max_s = probe_max;
    sigset_t sigs; /* taken by sigwait below; every thread inherits the mask */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    MnErr err = {0};
    Router *r = NULL;
    if (router_new(&ro, &r, &err) != MN_OK) {
        fprintf(stderr, "mnemo route: %s\n", err.msg);
        goto out;
    }
    LOG_INFO("version %s (commit %s) routing on http://%s:%d to %d backend%s (policy %s, load factor %g)",
             MNEMO_VERSION, mn_build_commit(), ro.host, router_port(r), ro.n_backends, ro.n_backends == 1 ? "" : "s",
             router_policy_name(ro.policy), ro.load_factor);
    for (int i = 0; i < ro.n_backends; i++) LOG_INFO("backend %d: %s", i + 1, ro.backends[i]);
    int sig = 0;
    sigwait(&sigs, &sig);
    LOG_INFO("signal %d: draining (at most %.1f s), then shutting down", sig, (double)drain_timeout);
    router_quiesce(r);
    if (!router_drain(r, drain_timeout)) LOG_WARN("drain timeout: cutting the requests still in progress");
    router_free(r);
    status = 0;
out:
    cli_free(opts, N_OPTS(opts));
    return status;
}

/* ---- chat ---------------------------------------------------------------------- */

/* The in-process server's log goes to a file: on the terminal its lines
 * would land inside the replies. fd 2 is pointed at path (default
 * ~/.cache/mnemo/chat.log, truncated), so every thread's log follows; the
 * chat keeps the terminal in *term, a copy of the old stderr, until
 * chat_log_end puts it back. */
static int chat_log_begin(const char *path, FILE **term) {
    char def[1024];
    if (path == NULL) path = user_cache_path("chat.log", def, sizeof def) == MN_OK ? def : "/dev/null";
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "mnemo chat: cannot write the server's log %s: %s\n", path, strerror(errno));
        return MN_EIO;
    }
    int saved = dup(STDERR_FILENO);
    FILE *t = saved >= 0 ? fdopen(saved, "w") : NULL;
    if (t == NULL) {
        fprintf(stderr, "mnemo chat: cannot keep the terminal: %s\n", strerror(errno));
        if (saved >= 0) close(saved);
        close(fd);
        return MN_EIO;
    }
    setvbuf(t, NULL, _IONBF, 0);
    fflush(stderr);
    dup2(fd, STDERR_FILENO);
    close(fd);
    fprintf(t, "mnemo chat: the in-process server logs to %s\n", path);
    *term = t;
    return MN_OK;
}

static void chat_log_end(FILE *term) {
    fflush(stderr);
    dup2(fileno(term), STDERR_FILENO);
    fclose(term);
}

static int cmd_chat(int argc, char **argv) {
    const char *url = NULL, *model_path = NULL, *api_key = NULL, *name = "mnemo", *system = NULL, *log_path = NULL;
    const char *api_name = "responses";
    int max_tokens = 256, n_threads = 2;
    float temp = 0.8f;
    bool ignore_eos = false, use_mmap = false;
    CliOpt opts[] = {
        {"url", 0, CLI_STR, &url, "URL", "server to talk to, e.g. http://127.0.0.1:8080"},
        {"ignore-eos", 0, CLI_FLAG, &ignore_eos, NULL, "always generate --max-tokens tokens"},
        {"model", 'm', CLI_STR, &model_path, "FILE", "or: serve this model in-process"},
        {"log", 0, CLI_STR, &log_path, "FILE", "with -m: the server's log (default ~/.cache/mnemo/chat.log)"},
        {"api-key", 0, CLI_STR, &api_key, "KEY", "API key for --url"},
        {"name", 0, CLI_STR, &name, "NAME", "model name sent to the server"},
        {"system", 0, CLI_STR, &system, "TEXT", "system message"},
        {"api", 0, CLI_STR, &api_name, "API",
         "responses (default: send only the new message, the server keeps the conversation) or chat (resend it all)"},
        {"max-tokens", 'n', CLI_INT, &max_tokens, "N", "reply length limit (default 256)"},
        {"temp", 0, CLI_FLOAT, &temp, "T", "temperature (default 0.8)"},
        {"threads", 't', CLI_INT, &n_threads, "N", "compute threads in-process (default 2)"},
        {"mmap", 0, CLI_FLAG, &use_mmap, NULL, "with -m: map the model file instead of reading it into huge pages"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo chat --url URL | -m MODEL [options]", opts, N_OPTS(opts), pos, 0, &n_pos);
    if (rc >= 0) return rc;
    if (!cli_require((url == NULL) != (model_path == NULL), "chat", "give either --url URL or -m MODEL")) return 2;
    ClientApi api;
    if (!cli_require(client_api_parse(api_name, &api) == MN_OK, "chat", "--api must be responses or chat")) return 2;
    FILE *term = stderr; /* the chat's prompts, statistics and errors */
    if (model_path && chat_log_begin(log_path, &term) != MN_OK) return 1;
    MnErr err = {0};
    Model *m = NULL;
    Engine *e = NULL;
    Server *srv = NULL;
    ChatFormat *fmt = NULL;
    char local[64];
    int status = 1;
    if (model_path) {
        EngineOptions eo;
        engine_options_default(&eo);
        eo.n_threads = n_threads;
        ServerOptions so;
        server_options_default(&so);
        so.port = 0;
        ChatFormatOptions co = {NULL, NULL, NULL};
        if (model_load_with(model_path, use_mmap ? GGUF_MAP : GGUF_READ, &m, &err) || pick_chat_format(m, &co, &fmt, &err) ||
            (eo.chat_format = fmt, engine_new(m, &eo, &e, &err)) || server_new(e, &so, &srv, &err)) {
            fprintf(term, "mnemo chat: %s\n", err.msg[0] ? err.msg : mn_strerror(err.code));
            goto done;
        }
        snprintf(local, sizeof local, "http://127.0.0.1:%d", server_port(srv));
        url = local;
    }
    ChatOpts co = {url, api_key, name, system, api, max_tokens, temp, ignore_eos};
    status = chat_run(&co, stdin, term);
done:
    if (e) engine_shutdown(e);
    server_free(srv);
    engine_free(e);
    chat_format_free(fmt);
    model_free(m);
    if (term != stderr) chat_log_end(term);
    return status;
}

/* ---- cache purge ------------------------------------------------------------------ */

static int cmd_cache(int argc, char **argv) {
    static const char synopsis[] =
        "mnemo cache purge --disk-tier DIR (--namespace KEY | --default-namespace | --all)";
    const char *dir = NULL, *ns = NULL;
    bool is_default = false, is_all = false;
    CliOpt opts[] = {
        {"disk-tier", 0, CLI_STR, &dir, "DIR", "the disk tier's directory (no server may be running on it)"},
        {"namespace", 0, CLI_STR, &ns, "KEY",
         "erase this namespace: the API key its requests used (on a server without keys, their "
         "X-Cache-Namespace header); MNEMO_NAMESPACE keeps it off the command line"},
        {"default-namespace", 0, CLI_FLAG, &is_default, NULL, "erase the namespace of requests with neither"},
        {"all", 0, CLI_FLAG, &is_all, NULL, "erase every namespace"},
    };
    if (argc < 1 || strcmp(argv[0], "purge") != 0) {
        bool is_help = argc >= 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0);
        if (!is_help) fprintf(stderr, "mnemo cache: needs the subcommand purge\n");
        cli_usage(is_help ? stdout : stderr, synopsis, opts, N_OPTS(opts));
        return is_help ? 0 : 2;
    }
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc - 1, argv + 1, synopsis, opts, N_OPTS(opts), pos, 1, &n_pos);
    if (rc >= 0) return rc;
    if (!cli_require(dir != NULL, "cache purge", "needs the disk tier's directory: --disk-tier DIR") ||
        !cli_require(n_pos == 0, "cache purge", "unexpected argument '%s'", n_pos ? pos[0] : "") ||
        !cli_require((ns != NULL) + is_default + is_all == 1, "cache purge",
                     "needs one of --namespace KEY, --default-namespace, --all"))
        return 2;
    MnErr err = {0};
    PurgeReport r;
    if (purge_disk_tier(dir, is_all ? NULL : is_default ? "" : ns, &r, &err) != MN_OK) return cli_fail(&err);
    printf("purged %s from %s: %d runs (%d blocks), %" PRId64 " replies, %" PRId64 " conversations, %" PRId64
           " responses; %" PRIu64 " bytes of slab space overwritten with zeros\n",
           is_all ? "every namespace" : is_default ? "the default namespace" : "the namespace", dir, r.n_runs,
           r.n_blocks, r.n_replies, r.n_convs, r.n_responses, r.n_zeroed_bytes);
    return 0;
}

/* ---- main ------------------------------------------------------------------------ */

typedef struct Command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"serve", cmd_serve, "serve the OpenAI HTTP API"},
    {"route", cmd_route, "route requests to several servers, each conversation to its cache"},
    {"chat", cmd_chat, "chat in the terminal with a server (or a model in-process)"},
    {"bench", bench_main, "load-test a server with multi-turn conversations"},
    {"disk-probe", diskprobe_cmd, "sequential O_DIRECT bandwidth of a directory, as the disk tier"},
    {"cache", cmd_cache, "cache purge: erase a namespace's data from a disk tier directory"},
    {"generate", cmd_generate, "run a prompt and stream new tokens"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensors"},
    {"apply-template", apply_template_main, "render a chat template for messages on stdin"},
    {"gen-model", gen_model_main, "write a random-weight model of a given shape"},
    {"speed", speed_main, "measure prefill and decode throughput"},
    {"shift-ppl", shiftppl_main, "perplexity of shifted against recomputed KV after a context cut"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: mnemo COMMAND [options]   (mnemo COMMAND --help for its options)\n"
               "       mnemo --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mnemo %s (commit %s)\n", MNEMO_VERSION, mn_build_commit());
        return 0;
    }
    /* Freed memory stays mapped, for reuse: blocks up to 32 MiB (a tier's
     * run, a restore's buffers, a Redis reply) come from the heap, and the
     * heap is not trimmed. On the virtual machines this runs on (PVM), the
     * first user write to a newly mapped page costs ~6 us, and by default
     * glibc maps large blocks afresh and trims its heaps (docs/DESIGN.md,
     * "A restore from below RAM is copied up behind it"). An allocator
     * that refuses (a sanitizer's) keeps its ways: only speed differs. */
    if (mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1) (void)mallopt(M_TRIM_THRESHOLD, INT_MAX);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        /* before any thread exists: libcurl's global state, and jansson's
         * allocations through the project's allocator */
        json_set_alloc_funcs(mn_malloc, mn_free);
        if (client_global_init() != MN_OK) {
            fprintf(stderr, "mnemo: cannot initialize the HTTP client library\n");
            return 1;
        }
        int status = commands[i].fn(argc - 2, argv + 2);
        client_global_deinit();
        return status;
    }
    const char *names[sizeof commands / sizeof commands[0]];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) names[i] = commands[i].name;
    const char *near = cli_closest(argv[1], names, (int)(sizeof commands / sizeof commands[0]));
    if (near) fprintf(stderr, "mnemo: unknown command '%s'; did you mean %s?\n", argv[1], near);
    else fprintf(stderr, "mnemo: unknown command '%s' (mnemo --help lists the commands)\n", argv[1]);
    return 2;
}
