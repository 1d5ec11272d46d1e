/* shift_ppl.c — `mnemo shift-ppl` (see shift_ppl.h).
 *
 * One KV pool and one Forward serve every trial; each trial takes three
 * block tables from the pool and gives them back: the whole text's, the
 * recomputed context's and the shifted context's (whose leading full
 * blocks are the whole text's own slots). Logits of the held-out tokens
 * come from passes of at most PPL_BATCH tokens, every row asked for.
 */
#include "tools/shift_ppl.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/cli.h"
#include "base/mem.h"
#include "base/rng.h"
#include "cache/kv_pool.h"
#include "engine/forward.h"
#include "engine/kv_shift.h"

#define PPL_BATCH 128 /* tokens (and logit rows) per forward pass */
#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

void shiftppl_config_default(ShiftPplConfig *c) {
    *c = (ShiftPplConfig){.keep = 32, .drop = 128, .kept = 256, .eval = 64, .trials = 4, .block_tokens = 32,
                          .n_threads = 2, .seed = 1};
}

/* What a measurement holds while it runs. */
typedef struct Ppl {
    const Model *m;
    const ShiftPplConfig *c;
    KvPool pool;
    Forward *fwd;
    KvShifter *shifter;
    int32_t *tok, *seq, *pos, *logit_idx; /* (PPL_BATCH) a pass's batch */
    int32_t *text;       /* (n_total) the trial's text */
    float *ref;          /* (eval, n_vocab) the recomputed context's held-out logits */
    double nll_shift, nll_recompute, max_diff;
    long n_scored;
} Ppl;

/* Called with each logits row of a pass: row, its logits (n_vocab). */
typedef void (*RowFn)(Ppl *p, int row, const float *logits, void *ctx);

/* Compute tokens[0..n) at positions pos0.. of the sequence whose block
 * table is table (n_blocks), in passes of PPL_BATCH; with fn, every row's
 * logits go to it (row numbers count from 0 over the whole call). */
static int run(Ppl *p, const int32_t *tokens, int n, int pos0, const int32_t *table, int n_blocks, RowFn fn,
               void *ctx, MnErr *err) {
    AttnSeq view = {table, n_blocks};
    for (int at = 0; at < n; at += PPL_BATCH) {
        int k = n - at < PPL_BATCH ? n - at : PPL_BATCH;
        for (int i = 0; i < k; i++) {
            p->tok[i] = tokens[at + i];
            p->seq[i] = 0;
            p->pos[i] = pos0 + at + i;
            p->logit_idx[i] = i;
        }
        FwdBatch b = {.n_tok = k, .tokens = p->tok, .seq = p->seq, .pos = p->pos, .seqs = &view, .n_seqs = 1,
                      .logit_idx = p->logit_idx, .n_logits = fn ? k : 0};
        const float *logits;
        int rc = fwd_run(p->fwd, &b, &logits, err);
        if (rc) return rc;
        for (int i = 0; fn && i < k; i++) fn(p, at + i, logits + (size_t)i * (size_t)p->m->cfg.n_vocab, ctx);
    }
    return MN_OK;
}

/* -log softmax(logits)[id], in double. */
static double nll(const float *logits, int n, int32_t id) {
    double mx = logits[0], sum = 0;
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum) - (double)logits[id];
}

/* A token drawn from softmax(logits) (temperature 1). */
static int32_t draw(Rng *r, const float *logits, int n) {
    double mx = logits[0], sum = 0;
    for (int i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    double u = rng_unit(r) * sum;
    for (int i = 0; i < n; i++)
        if ((u -= exp((double)logits[i] - mx)) <= 0) return i;
    return n - 1;
}

typedef struct SampleCtx {
    Rng rng;
    int32_t next;
} SampleCtx;

static void sample_row(Ppl *p, int row, const float *logits, void *ctx) {
    (void)row;
    SampleCtx *s = ctx;
    s->next = draw(&s->rng, logits, p->m->cfg.n_vocab);
}

/* Held-out row `row` (it predicts text[n_x + row], the row-th held-out
 * token) under recompute: kept for the comparison. */
static void score_recompute(Ppl *p, int row, const float *logits, void *ctx) {
    (void)ctx;
    int n_vocab = p->m->cfg.n_vocab, n_x = p->c->keep + p->c->drop + p->c->kept;
    memcpy(p->ref + (size_t)row * (size_t)n_vocab, logits, (size_t)n_vocab * sizeof *logits);
    p->nll_recompute += nll(logits, n_vocab, p->text[n_x + row]);
    p->n_scored++;
}

static void score_shift(Ppl *p, int row, const float *logits, void *ctx) {
    (void)ctx;
    int n_vocab = p->m->cfg.n_vocab, n_x = p->c->keep + p->c->drop + p->c->kept;
    p->nll_shift += nll(logits, n_vocab, p->text[n_x + row]);
    const float *ref = p->ref + (size_t)row * (size_t)n_vocab;
    for (int i = 0; i < n_vocab; i++) {
        double d = fabs((double)logits[i] - ref[i]);
        if (d > p->max_diff) p->max_diff = d;
    }
}

/* Take n fresh blocks into table[at..at+n). */
static int take_blocks(Ppl *p, int32_t *table, int at, int n) {
    for (int i = 0; i < n; i++)
        if (kvpool_alloc(&p->pool, &table[at + i]) != MN_OK) {
            while (i-- > 0) kvpool_release(&p->pool, table[at + i]);
            return MN_ENOMEM;
        }
    return MN_OK;
}

static void give_blocks(Ppl *p, const int32_t *table, int at, int n) {
    for (int i = 0; i < n; i++) kvpool_release(&p->pool, table[at + i]);
}

/* The trial's text into p->text and the whole text's KV (its first keep +
 * drop + kept tokens) into table x: a window of the token file, or tokens
 * sampled one by one (their KV computed on the way). */
static int make_text(Ppl *p, int trial, const int32_t *x, int nb, MnErr *err) {
    const ShiftPplConfig *c = p->c;
    int n_total = c->keep + c->drop + c->kept + c->eval, n_x = c->keep + c->drop + c->kept;
    if (c->text) {
        size_t span = c->n_text - (size_t)n_total, off = c->trials > 1 ? span * (size_t)trial / (size_t)(c->trials - 1) : 0;
        memcpy(p->text, c->text + off, (size_t)n_total * sizeof *p->text);
        return run(p, p->text, n_x, 0, x, nb, NULL, NULL, err);
    }
    SampleCtx s;
    rng_seed(&s.rng, c->seed, (uint64_t)trial);
    int32_t bos = tok_bos(p->m->tok);
    p->text[0] = bos >= 0 ? bos : 0;
    for (int i = 0; i + 1 < n_total; i++) {
        int rc = run(p, &p->text[i], 1, i, x, nb, sample_row, &s, err);
        if (rc) return rc;
        p->text[i + 1] = s.next;
    }
    return MN_OK;
}

/* One trial: the text, then the held-out tokens after the truncated
 * context, recomputed and shifted. */
static int trial(Ppl *p, int t, MnErr *err) {
    const ShiftPplConfig *c = p->c;
    const int bt = c->block_tokens, n_total = c->keep + c->drop + c->kept + c->eval;
    const int n_y = c->keep + c->kept, n_yt = n_y + c->eval, nb_x = (n_total + bt - 1) / bt;
    const int nb_y = (n_yt + bt - 1) / bt, shared = c->keep / bt;
    int32_t *x = mn_malloc((size_t)nb_x * sizeof *x), *yr = mn_malloc((size_t)nb_y * sizeof *yr),
            *ys = mn_malloc((size_t)nb_y * sizeof *ys), *ctx = mn_malloc((size_t)n_yt * sizeof *ctx);
    int rc = x && yr && ys && ctx ? MN_OK : MN_ENOMEM;
    bool has_x = false, has_yr = false, has_ys = false;
    if (rc == MN_OK && (rc = take_blocks(p, x, 0, nb_x)) == MN_OK) has_x = true;
    if (rc == MN_OK && (rc = take_blocks(p, yr, 0, nb_y)) == MN_OK) has_yr = true;
    if (rc == MN_OK && (rc = take_blocks(p, ys, shared, nb_y - shared)) == MN_OK) has_ys = true;
    if (rc == MN_ENOMEM) mn_err_set(err, rc, "out of memory");
    if (rc == MN_OK) rc = make_text(p, t, x, nb_x, err);
    if (rc == MN_OK) { /* the truncated context, then the held-out tokens */
        memcpy(ctx, p->text, (size_t)c->keep * sizeof *ctx);
        memcpy(ctx + c->keep, p->text + c->keep + c->drop, (size_t)(c->kept + c->eval) * sizeof *ctx);
        memcpy(ys, x, (size_t)shared * sizeof *ys); /* the same tokens at the same positions */
    }
    /* recompute: the whole context anew */
    if (rc == MN_OK) rc = run(p, ctx, n_y - 1, 0, yr, nb_y, NULL, NULL, err);
    if (rc == MN_OK) rc = run(p, ctx + n_y - 1, c->eval, n_y - 1, yr, nb_y, score_recompute, NULL, err);
    /* shift: the rest of the last shared block computed, the kept tokens
     * but the last moved from the whole text */
    if (rc == MN_OK) rc = run(p, ctx + shared * bt, c->keep - shared * bt, shared * bt, ys, nb_y, NULL, NULL, err);
    if (rc == MN_OK) {
        KvMove mv = {ys, x, 0, c->keep, n_y - 1, -c->drop};
        for (int il = 0; il < p->m->cfg.n_layer; il++) kvshift_layer(p->shifter, &p->pool, il, &mv);
        rc = run(p, ctx + n_y - 1, c->eval, n_y - 1, ys, nb_y, score_shift, NULL, err);
    }
    if (has_x) give_blocks(p, x, 0, nb_x);
    if (has_yr) give_blocks(p, yr, 0, nb_y);
    if (has_ys) give_blocks(p, ys, shared, nb_y - shared);
    mn_free(x);
    mn_free(yr);
    mn_free(ys);
    mn_free(ctx);
    return rc;
}

static int check_config(const Model *m, const ShiftPplConfig *c, MnErr *err) {
    if (c->keep < 1 || c->drop < 1 || c->kept < 2 || c->eval < 1 || c->trials < 1 || c->block_tokens < 1 ||
        c->n_threads < 1)
        return mn_err_set(err, MN_EINVAL, "shift-ppl: --keep, --drop, --eval, --trials must be >= 1 and --kept >= 2");
    long n_total = (long)c->keep + c->drop + c->kept + c->eval;
    if (n_total > m->cfg.n_ctx)
        return mn_err_set(err, MN_EINVAL, "shift-ppl: a text of %ld tokens passes the model's context of %d", n_total,
                          m->cfg.n_ctx);
    if (c->text && c->n_text < (size_t)n_total)
        return mn_err_set(err, MN_EINVAL, "shift-ppl: the text has %zu tokens; a trial needs %ld", c->n_text, n_total);
    return MN_OK;
}

int shiftppl_measure(const Model *m, const ShiftPplConfig *c, ShiftPplResult *out, MnErr *err) {
    memset(out, 0, sizeof *out);
    int rc = check_config(m, c, err);
    if (rc) return rc;
    const int bt = c->block_tokens, n_total = c->keep + c->drop + c->kept + c->eval;
    const int n_blocks = 3 * ((n_total + bt - 1) / bt + 1);
    Ppl p = {.m = m, .c = c};
    if ((rc = kvpool_init(&p.pool, m->cfg.n_layer, m->cfg.kv_dim, bt, n_blocks, MN_TYPE_F16)))
        return mn_err_set(err, rc, "shift-ppl: cannot make a KV pool of %d blocks", n_blocks);
    FwdOptions fo = {PPL_BATCH, PPL_BATCH, n_total, c->n_threads, 0};
    if ((rc = fwd_new(m, &p.pool, &fo, &p.fwd, err)) == MN_OK) {
        rc = kvshift_new(m, n_total, &p.pool, &p.shifter);
        p.tok = mn_malloc(PPL_BATCH * sizeof *p.tok);
        p.seq = mn_malloc(PPL_BATCH * sizeof *p.seq);
        p.pos = mn_malloc(PPL_BATCH * sizeof *p.pos);
        p.logit_idx = mn_malloc(PPL_BATCH * sizeof *p.logit_idx);
        p.text = mn_malloc((size_t)n_total * sizeof *p.text);
        p.ref = mn_malloc((size_t)c->eval * (size_t)m->cfg.n_vocab * sizeof *p.ref);
        if (rc || !p.tok || !p.seq || !p.pos || !p.logit_idx || !p.text || !p.ref)
            rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    for (int t = 0; rc == MN_OK && t < c->trials; t++) rc = trial(&p, t, err);
    if (rc == MN_OK) {
        out->n_scored = p.n_scored;
        out->ppl_recompute = exp(p.nll_recompute / (double)p.n_scored);
        out->ppl_shift = exp(p.nll_shift / (double)p.n_scored);
        out->max_logit_diff = p.max_diff;
    }
    kvshift_free(p.shifter);
    fwd_free(p.fwd);
    kvpool_deinit(&p.pool);
    mn_free(p.tok);
    mn_free(p.seq);
    mn_free(p.pos);
    mn_free(p.logit_idx);
    mn_free(p.text);
    mn_free(p.ref);
    return rc;
}

/* ---- the command ----------------------------------------------------------------- */

/* The token ids of the file at path, with BOS as the vocabulary asks. */
static int read_text(const Model *m, const char *path, TokIds *out, MnErr *err) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return mn_err_set(err, MN_EIO, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = mn_malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *b = mn_realloc(buf, cap * 2);
            if (b == NULL) {
                mn_free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory reading %s", path);
    int rc = tok_encode(m->tok, buf, n, tok_add_bos(m->tok), false, out);
    mn_free(buf);
    if (rc) mn_err_set(err, rc, "cannot tokenize %s", path);
    return rc;
}

int shiftppl_main(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL;
    bool json = false;
    int seed = 1;
    ShiftPplConfig c;
    shiftppl_config_default(&c);
    CliOpt opts[] = {
        {"model", 'm', CLI_STR, &model_path, "FILE", "GGUF model"},
        {"text", 0, CLI_STR, &text_path, "FILE", "score windows of this text (default: text sampled from the model)"},
        {"keep", 0, CLI_INT, &c.keep, "N", "tokens before the cut, as a system prompt (default 32)"},
        {"drop", 0, CLI_INT, &c.drop, "N", "tokens cut out (default 128)"},
        {"kept", 0, CLI_INT, &c.kept, "N", "tokens after the cut, moved or recomputed (default 256)"},
        {"eval", 0, CLI_INT, &c.eval, "N", "held-out tokens scored after the context (default 64)"},
        {"trials", 0, CLI_INT, &c.trials, "N", "texts measured (default 4)"},
        {"block-tokens", 0, CLI_INT, &c.block_tokens, "N", "tokens per KV block (default 32)"},
        {"threads", 't', CLI_INT, &c.n_threads, "N", "compute threads (default 2)"},
        {"seed", 0, CLI_INT, &seed, "N", "seed of the sampled texts (default 1)"},
        {"json", 0, CLI_FLAG, &json, NULL, "one JSON object"},
    };
    const char *pos[1];
    int n_pos;
    int rc = cli_parse_or_usage(argc, argv, "mnemo shift-ppl -m MODEL [options]", opts, N_OPTS(opts), pos, 0, &n_pos);
    if (rc >= 0) {
        cli_free(opts, N_OPTS(opts));
        return rc;
    }
    int status = 2;
    Model *m = NULL;
    TokIds text = {0};
    MnErr err = {0};
    if (model_path == NULL) {
        fprintf(stderr, "mnemo shift-ppl: -m MODEL is required\n");
        goto out;
    }
    status = 1;
    c.seed = (uint64_t)seed;
    if (model_load(model_path, &m, &err) != MN_OK || (text_path && read_text(m, text_path, &text, &err) != MN_OK)) {
        fprintf(stderr, "mnemo shift-ppl: %s\n", err.msg);
        goto out;
    }
    c.text = text_path ? text.ids : NULL;
    c.n_text = text.n;
    ShiftPplResult r;
    if ((rc = shiftppl_measure(m, &c, &r, &err)) != MN_OK) {
        fprintf(stderr, "mnemo shift-ppl: %s\n", err.msg);
        status = rc == MN_EINVAL ? 2 : 1;
        goto out;
    }
    double d = r.ppl_shift - r.ppl_recompute;
    if (json)
        printf("{\"ppl_shift\": %.6f, \"ppl_recompute\": %.6f, \"ppl_diff\": %.6f, \"ppl_rel_diff\": %.3e, "
               "\"max_logit_diff\": %.6f, \"tokens_scored\": %ld, \"keep\": %d, \"drop\": %d, \"kept\": %d, "
               "\"eval\": %d, \"trials\": %d}\n",
               r.ppl_shift, r.ppl_recompute, d, d / r.ppl_recompute, r.max_logit_diff, r.n_scored, c.keep, c.drop,
               c.kept, c.eval, c.trials);
    else
        printf("perplexity of %ld held-out tokens: shift %.4f, recompute %.4f, difference %+.4f (%+.3f%%); "
               "largest logit difference %.4f\n",
               r.n_scored, r.ppl_shift, r.ppl_recompute, d, 100 * d / r.ppl_recompute, r.max_logit_diff);
    status = 0;
out:
    tok_ids_free(&text);
    model_free(m);
    cli_free(opts, N_OPTS(opts));
    return status;
}
