/* workload.c — conversations and schedules for `mnemo bench` (see workload.h).
 *
 * Everything random comes from base/rng (xoshiro256**) seeded
 * from (--seed, stream): stream 0 draws the arrival times,
 * stream 1 the shared system prompt, stream 2 the shuffle of a --sharegpt
 * file, stream 1000 + i conversation i (its turn count, lengths, think
 * times, texts and sampling seeds, in that order per turn). The probe text
 * that measures tokens per word uses a fixed seed, so the sizing ratio does
 * not depend on --seed. Nothing here does I/O except reading --sharegpt and
 * calling the caller's token counter; a plan is a pure function of the
 * config and the counter's answers.
 *
 * Distributions (chosen to match the published ShareGPT means):
 *   turns per conversation   geometric on {1, 2, ...}, mean 5.56
 *   user turn tokens         lognormal, sigma 1.0, mean --question-tokens
 *                            (37.8 x scale), clipped to [1, 10 x mean]
 *   reply tokens             lognormal, sigma 0.8, mean --output-tokens
 *                            (204.6 x scale), clipped to [1, 10 x mean]
 *   conversation arrivals    Poisson process of --rate per second, the first
 *                            at 0 (multiround-qa: evenly, one per 1/rate s)
 *   think time               exponential, mean --think-mean (multiround-qa:
 *                            fixed users / rate unless --think-mean is given)
 * Synthetic text is sentences of common English words; a target of T tokens
 * becomes round(T / tokens_per_word) words, tokens_per_word measured once on
 * a probe text with the caller's counter (else 1.3, a typical BPE figure).
 */
#include "bench/workload.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "base/mem.h"
#include "base/rng.h"

/* ---- streams and estimates ------------------------------------------------------- */

enum { STREAM_ARRIVALS = 0, STREAM_SYSTEM = 1, STREAM_SHUFFLE = 2, STREAM_CONV = 1000 };
#define PROBE_SEED 0x6d6e656d6f /* fixed: the probe text never changes */
#define PROBE_WORDS 600
#define EST_TOKENS_PER_WORD 1.3
#define EST_TOKENS_PER_CHAR 0.25
#define TEMPLATE_TOKENS 8 /* per message, for --max-context estimates */

static int clip_round(double x, int lo, int hi) {
    long v = lround(x);
    return v < lo ? lo : v > hi ? hi : (int)v;
}

/* ---- text ------------------------------------------------------------------------ */

typedef struct Str {
    char *p;
    size_t n, cap;
    bool is_oom;
} Str;

static void str_add(Str *s, const char *t, size_t len) {
    if (s->is_oom) return;
    if (s->n + len + 1 > s->cap) {
        size_t c = s->cap ? s->cap : 256;
        while (c < s->n + len + 1) c *= 2;
        char *p = mn_realloc(s->p, c);
        if (p == NULL) {
            s->is_oom = true;
            return;
        }
        s->p = p;
        s->cap = c;
    }
    memcpy(s->p + s->n, t, len);
    s->n += len;
    s->p[s->n] = '\0';
}

static const char *const WORDS[] = {
    "the", "of", "and", "to", "a", "in", "that", "it", "for", "on", "with", "as", "at", "by", "from", "this",
    "but", "or", "an", "they", "we", "about", "which", "their", "will", "would", "there", "what", "so", "out",
    "up", "if", "who", "when", "can", "no", "just", "him", "into", "your", "some", "could", "them", "other",
    "than", "then", "now", "only", "its", "over", "also", "after", "two", "how", "our", "well", "even",
    "because", "any", "these", "most", "time", "year", "people", "way", "day", "man", "thing", "woman", "life",
    "child", "world", "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "number", "night", "point",
    "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "right", "study", "book",
    "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father",
    "power", "hour", "game", "line", "end", "member", "law", "car", "city", "name", "team", "minute", "idea",
    "body", "information", "back", "parent", "face", "level", "office", "door", "health", "person", "art",
    "history", "party", "result", "change", "morning", "reason", "research", "moment", "air", "teacher",
    "river", "garden", "market", "bridge", "window", "letter", "music", "winter", "summer", "road", "stone",
    "make", "know", "think", "take", "see", "come", "want", "look", "use", "find", "give", "tell", "call",
    "try", "ask", "need", "feel", "become", "leave", "put", "mean", "keep", "let", "begin", "seem", "help",
    "talk", "turn", "start", "show", "hear", "play", "run", "move", "like", "live", "believe", "hold", "bring",
    "happen", "write", "provide", "sit", "stand", "lose", "pay", "meet", "include", "continue", "set", "learn",
    "lead", "understand", "watch", "follow", "stop", "create", "speak", "read", "allow", "add", "spend",
    "grow", "open", "walk", "win", "offer", "remember", "love", "consider", "appear", "buy", "wait", "serve",
    "send", "expect", "build", "stay", "fall", "cut", "reach", "remain", "good", "new", "first", "last",
    "long", "great", "little", "own", "old", "big", "high", "different", "small", "large", "next", "early",
    "young", "important", "few", "public", "bad", "same", "able", "quiet", "bright", "simple", "careful",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

/* n_words (>= 1) words in sentences of 4-15; a question ends with '?'. */
static void gen_text(Rng *r, long n_words, bool is_question, Str *out) {
    long left = n_words < 1 ? 1 : n_words;
    while (left > 0) {
        long n = 4 + (long)rng_below(r, 12);
        if (n > left) n = left;
        for (long i = 0; i < n; i++) {
            const char *w = WORDS[rng_below(r, N_WORDS)];
            if (out->n > 0) str_add(out, " ", 1);
            if (i == 0) {
                char cap = (char)(w[0] - 'a' + 'A');
                str_add(out, &cap, 1);
                str_add(out, w + 1, strlen(w + 1));
            } else {
                str_add(out, w, strlen(w));
            }
        }
        left -= n;
        str_add(out, left == 0 && is_question ? "?" : ".", 1);
    }
}

static long words_for(double tokens, double tokens_per_word) {
    long w = lround(tokens / tokens_per_word);
    return w < 1 ? 1 : w;
}

/* ---- config ----------------------------------------------------------------------- */

static const char *const WORKLOAD_NAMES[BENCH_WORKLOAD__COUNT] = {"sharegpt-synth", "multiround-qa", "multiturn"};

typedef struct Defaults {
    int n_conversations, n_turns;
    float system_tokens, history_tokens, question_tokens, output_tokens, rate, think_mean_s;
} Defaults;

static const Defaults DEFAULTS[BENCH_WORKLOAD__COUNT] = {
    [BENCH_SHAREGPT_SYNTH] = {32, 0, 0, 0, 37.8f, 204.6f, 1.0f, 1.0f},
    [BENCH_MULTIROUND_QA] = {8, 5, 512, 1024, 64, 128, 1.0f, -1}, /* think: users / rate */
    [BENCH_MULTITURN] = {8, 5, 0, 0, 128, 64, 1.0f, 1.0f},
};

#define SHAREGPT_MEAN_TURNS 5.56
#define USER_SIGMA 1.0
#define REPLY_SIGMA 0.8

void bench_config_init(BenchConfig *c) {
    *c = (BenchConfig){
        .workload = BENCH_SHAREGPT_SYNTH,
        .n_conversations = -1,
        .n_turns = -1,
        .system_tokens = -1,
        .history_tokens = -1,
        .question_tokens = -1,
        .output_tokens = -1,
        .rate = -1,
        .think_mean_s = -1,
        .scale = -1,
        .max_context = 0,
        .past_context = 0,
        .seed = 1,
        .duration_s = 0,
        .concurrency = -1,
    };
}

const char *bench_workload_name(BenchWorkload w) {
    return (unsigned)w < BENCH_WORKLOAD__COUNT ? WORKLOAD_NAMES[w] : NULL;
}

int bench_workload_parse(const char *name, BenchWorkload *w) {
    for (int i = 0; i < BENCH_WORKLOAD__COUNT; i++)
        if (name && strcmp(name, WORKLOAD_NAMES[i]) == 0) {
            *w = (BenchWorkload)i;
            return MN_OK;
        }
    return MN_EINVAL;
}

int bench_config_resolve(BenchConfig *c, MnErr *err) {
    if ((unsigned)c->workload >= BENCH_WORKLOAD__COUNT) return mn_err_set(err, MN_EINVAL, "unknown workload");
    const Defaults *d = &DEFAULTS[c->workload];
    if (c->scale < 0) c->scale = 1.0f;
    if (!(c->scale > 0)) return mn_err_set(err, MN_EINVAL, "--scale must be > 0");
    float k = c->scale;
    c->is_output_fixed = c->output_tokens >= 0;
    c->is_think_fixed = c->workload == BENCH_MULTIROUND_QA && c->think_mean_s < 0;
    if (c->n_conversations < 0) c->n_conversations = c->sharegpt_path ? 0 : d->n_conversations;
    if (c->n_turns < 0) c->n_turns = d->n_turns;
    if (c->system_tokens < 0) c->system_tokens = d->system_tokens * k;
    if (c->history_tokens < 0) c->history_tokens = d->history_tokens * k;
    if (c->question_tokens < 0) c->question_tokens = d->question_tokens * k;
    if (c->output_tokens < 0) c->output_tokens = d->output_tokens * k;
    if (c->rate < 0) c->rate = d->rate;
    if (c->concurrency < 0) c->concurrency = 64;
    if (c->think_mean_s < 0)
        c->think_mean_s = c->is_think_fixed ? (c->rate > 0 ? (float)c->n_conversations / c->rate : 0) : d->think_mean_s;
    bool has_fixed_turns = c->workload != BENCH_SHAREGPT_SYNTH && c->sharegpt_path == NULL;
    if (c->n_conversations < 1 && c->sharegpt_path == NULL)
        return mn_err_set(err, MN_EINVAL, "--conversations must be >= 1");
    if (has_fixed_turns ? c->n_turns < 1 : c->n_turns < 0)
        return mn_err_set(err, MN_EINVAL, "--turns must be >= %d", has_fixed_turns ? 1 : 0);
    if (c->output_tokens < 0.5f) return mn_err_set(err, MN_EINVAL, "--output-tokens must be >= 1");
    if (c->max_context < 0) return mn_err_set(err, MN_EINVAL, "--max-context must be >= 0");
    if (c->past_context < 0) return mn_err_set(err, MN_EINVAL, "--past-context must be >= 0");
    if (c->past_context > 0 && c->max_context == 0)
        return mn_err_set(err, MN_EINVAL, "--past-context needs --max-context (the context it runs past)");
    if (c->duration_s < 0) return mn_err_set(err, MN_EINVAL, "--duration must be >= 0");
    if (c->concurrency < 1) return mn_err_set(err, MN_EINVAL, "--concurrency must be >= 1");
    if (c->system_tokens > 1e7f || c->history_tokens > 1e7f || c->question_tokens > 1e7f || c->output_tokens > 1e7f)
        return mn_err_set(err, MN_EINVAL, "token sizes must be below 10 million");
    if (c->n_conversations > 10000000 || c->n_turns > 100000)
        return mn_err_set(err, MN_EINVAL, "--conversations or --turns is too large");
    return MN_OK;
}

/* ---- plan ------------------------------------------------------------------------- */

typedef struct Builder {
    const BenchConfig *c;
    BenchPlan *plan;
    double tokens_per_char; /* --sharegpt texts */
    MnErr *err;
} Builder;

static char *take_str(Str *s) {
    if (s->is_oom) {
        mn_free(s->p);
        return NULL;
    }
    return s->p ? s->p : mn_strdup("");
}

/* A synthetic text of about `tokens` tokens, prefixed by `prefix` if any. */
static char *make_text(Rng *r, const char *prefix, double tokens, double tpw, bool is_question) {
    Str s = {0};
    if (prefix) {
        str_add(&s, prefix, strlen(prefix));
        str_add(&s, "\n\n", 2);
    }
    Str body = {0};
    gen_text(r, words_for(tokens, tpw), is_question, &body);
    if (body.is_oom) s.is_oom = true;
    else str_add(&s, body.p, body.n);
    mn_free(body.p);
    return take_str(&s);
}

static double measure_tokens_per_word(BenchCountFn fn, void *ctx, bool *is_measured) {
    *is_measured = false;
    if (fn == NULL) return EST_TOKENS_PER_WORD;
    Rng r;
    rng_seed(&r, PROBE_SEED, 0);
    Str s = {0};
    gen_text(&r, PROBE_WORDS, false, &s);
    long n = 0;
    int rc = s.is_oom ? MN_ENOMEM : fn(ctx, s.p, &n);
    mn_free(s.p);
    if (rc != MN_OK || n <= 0) return EST_TOKENS_PER_WORD;
    *is_measured = true;
    return (double)n / PROBE_WORDS;
}

/* Cut a conversation's turns where the prompt would pass --max-context
 * (with --past-context N, N turns later: those N run past it). */
static void apply_max_context(const BenchConfig *c, BenchConv *cv) {
    if (c->max_context <= 0) return;
    double used = (cv->system ? c->system_tokens + TEMPLATE_TOKENS : 0);
    for (int t = 0; t < cv->n_turns; t++) {
        double need = used + cv->turns[t].user_tokens + TEMPLATE_TOKENS + cv->turns[t].output_tokens;
        if (t > 0 && need > c->max_context) {
            int end = cv->n_turns - t > c->past_context ? t + c->past_context : cv->n_turns;
            for (int k = end; k < cv->n_turns; k++) mn_free(cv->turns[k].user);
            cv->n_turns = end;
            return;
        }
        used = need + TEMPLATE_TOKENS;
    }
}

/* Synthetic conversation i of a resolved config. */
static int plan_synthetic(Builder *b, int i, const char *system, BenchConv *cv) {
    const BenchConfig *c = b->c;
    double tpw = b->plan->tokens_per_word;
    Rng r;
    rng_seed(&r, c->seed, STREAM_CONV + (uint64_t)i);
    int n = c->n_turns;
    if (c->workload == BENCH_SHAREGPT_SYNTH) {
        n = rng_geometric(&r, SHAREGPT_MEAN_TURNS);
        if (c->n_turns > 0 && n > c->n_turns) n = c->n_turns;
    }
    cv->turns = mn_calloc((size_t)n, sizeof *cv->turns);
    if (cv->turns == NULL) return MN_ENOMEM;
    cv->n_turns = n;
    char *history = NULL;
    if (c->history_tokens >= 0.5f) {
        Str h = {0};
        gen_text(&r, words_for(c->history_tokens, tpw), false, &h);
        if ((history = take_str(&h)) == NULL) return MN_ENOMEM;
    }
    int rc = MN_OK;
    for (int t = 0; t < n; t++) {
        BenchTurn *u = &cv->turns[t];
        double q = c->question_tokens, o = c->output_tokens;
        if (c->workload == BENCH_SHAREGPT_SYNTH) {
            q = clip_round(rng_lognormal(&r, q > 1 ? q : 1, USER_SIGMA), 1, (int)fmax(1, 10 * q));
            o = clip_round(rng_lognormal(&r, o, REPLY_SIGMA), 1, (int)fmax(1, 10 * o));
        }
        u->user_tokens = clip_round(q + (t == 0 ? c->history_tokens : 0), 1, 1 << 30);
        u->output_tokens = clip_round(o, 1, 1 << 30);
        u->think_s = t == 0 ? 0 : c->is_think_fixed ? c->think_mean_s : rng_exp(&r, c->think_mean_s);
        u->seed = rng_next(&r) >> 33;
        u->user = make_text(&r, t == 0 ? history : NULL, q, tpw, true);
        if (u->user == NULL) {
            rc = MN_ENOMEM;
            break;
        }
    }
    mn_free(history);
    if (rc == MN_OK && system && (cv->system = mn_strdup(system)) == NULL) rc = MN_ENOMEM;
    return rc;
}

/* ---- ShareGPT files ------------------------------------------------------------------ */

typedef struct FileTurn {
    const char *user;   /* borrowed from the JSON document */
    Str merged;         /* when several human messages follow each other */
    const char *reply;  /* NULL when the file has none */
} FileTurn;

static bool is_role(const char *from, const char *const *names) {
    for (; *names; names++)
        if (strcmp(from, *names) == 0) return true;
    return false;
}

static const char *const HUMAN_ROLES[] = {"human", "user", NULL};
static const char *const GPT_ROLES[] = {"gpt", "chatgpt", "assistant", "bard", "bing", "model", NULL};

/* The turns of one ShareGPT record; *n = 0 when it has no human turn. */
static int file_turns(json_t *item, FileTurn **out, int *n, const char **system) {
    json_t *msgs = json_object_get(item, "conversations");
    if (!json_is_array(msgs)) msgs = json_object_get(item, "conversation");
    *out = NULL;
    *n = 0;
    *system = NULL;
    size_t m = json_array_size(msgs);
    if (m == 0) return MN_OK;
    FileTurn *t = mn_calloc(m, sizeof *t);
    if (t == NULL) return MN_ENOMEM;
    int k = 0;
    bool last_user = false;
    for (size_t i = 0; i < m; i++) {
        json_t *msg = json_array_get(msgs, i);
        const char *from = json_string_value(json_object_get(msg, "from"));
        if (from == NULL) from = json_string_value(json_object_get(msg, "role"));
        const char *value = json_string_value(json_object_get(msg, "value"));
        if (value == NULL) value = json_string_value(json_object_get(msg, "content"));
        if (from == NULL || value == NULL || value[0] == '\0') continue;
        if (strcmp(from, "system") == 0) {
            if (k == 0) *system = value;
        } else if (is_role(from, HUMAN_ROLES)) {
            if (last_user) { /* two human messages in a row: one turn */
                FileTurn *u = &t[k - 1];
                if (u->merged.n == 0) str_add(&u->merged, u->user, strlen(u->user));
                str_add(&u->merged, "\n", 1);
                str_add(&u->merged, value, strlen(value));
                if (u->merged.is_oom) {
                    for (int j = 0; j < k; j++) mn_free(t[j].merged.p);
                    mn_free(t);
                    return MN_ENOMEM;
                }
            } else {
                t[k++].user = value;
            }
            last_user = true;
        } else if (is_role(from, GPT_ROLES) && k > 0) {
            if (t[k - 1].reply == NULL) t[k - 1].reply = value;
            last_user = false;
        }
    }
    *out = t;
    *n = k;
    return MN_OK;
}

static void file_turns_free(FileTurn *t, int n) {
    for (int i = 0; i < n; i++) mn_free(t[i].merged.p);
    mn_free(t);
}

static const char *turn_user(const FileTurn *t) { return t->merged.n ? t->merged.p : t->user; }

/* Tokens per character of the file's own text: one count over a sample. */
static double measure_tokens_per_char(json_t *arr, const size_t *order, size_t n_order, BenchCountFn fn,
                                      void *ctx) {
    if (fn == NULL) return EST_TOKENS_PER_CHAR;
    Str s = {0};
    for (size_t i = 0; i < n_order && s.n < 20000; i++) {
        FileTurn *t;
        int n;
        const char *sys;
        if (file_turns(json_array_get(arr, order[i]), &t, &n, &sys)) break;
        for (int k = 0; k < n && s.n < 20000; k++) {
            const char *u = turn_user(&t[k]);
            str_add(&s, u, strlen(u));
            str_add(&s, "\n", 1);
            if (t[k].reply) str_add(&s, t[k].reply, strlen(t[k].reply));
            str_add(&s, "\n", 1);
        }
        file_turns_free(t, n);
    }
    long n_tok = 0;
    double r = EST_TOKENS_PER_CHAR;
    if (!s.is_oom && s.n > 0 && fn(ctx, s.p, &n_tok) == MN_OK && n_tok > 0) r = (double)n_tok / (double)s.n;
    mn_free(s.p);
    return r;
}

static int plan_file(Builder *b, const char *system, BenchCountFn fn, void *ctx) {
    const BenchConfig *c = b->c;
    BenchPlan *p = b->plan;
    json_error_t je;
    json_t *doc = json_load_file(c->sharegpt_path, 0, &je);
    if (doc == NULL)
        return mn_err_set(b->err, MN_EFORMAT, "%s: line %d: %s", c->sharegpt_path, je.line, je.text);
    int rc = MN_OK;
    size_t n_items = json_array_size(doc), n_usable = 0;
    size_t *order = n_items ? mn_calloc(n_items, sizeof *order) : NULL;
    if (!json_is_array(doc)) {
        rc = mn_err_set(b->err, MN_EFORMAT, "%s: expected a JSON array of conversations", c->sharegpt_path);
        goto done;
    }
    if (n_items > 0 && order == NULL) {
        rc = MN_ENOMEM;
        goto done;
    }
    for (size_t i = 0; i < n_items; i++) { /* keep records with a human turn */
        FileTurn *t;
        int n;
        const char *sys;
        if ((rc = file_turns(json_array_get(doc, i), &t, &n, &sys))) goto done;
        file_turns_free(t, n);
        if (n > 0) order[n_usable++] = i;
    }
    if (n_usable == 0) {
        rc = mn_err_set(b->err, MN_EFORMAT, "%s: no conversation has a human turn", c->sharegpt_path);
        goto done;
    }
    Rng r;
    rng_seed(&r, c->seed, STREAM_SHUFFLE);
    for (size_t i = n_usable - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)rng_below(&r, i + 1), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    size_t n_take = c->n_conversations > 0 && (size_t)c->n_conversations < n_usable ? (size_t)c->n_conversations
                                                                                   : n_usable;
    b->tokens_per_char = measure_tokens_per_char(doc, order, n_take, fn, ctx);
    p->convs = mn_calloc(n_take, sizeof *p->convs);
    if (p->convs == NULL) {
        rc = MN_ENOMEM;
        goto done;
    }
    p->n_convs = (int)n_take;
    for (size_t i = 0; i < n_take && rc == MN_OK; i++) {
        BenchConv *cv = &p->convs[i];
        FileTurn *t;
        int n;
        const char *sys;
        if ((rc = file_turns(json_array_get(doc, order[i]), &t, &n, &sys))) break;
        int n_all = n;
        if (c->n_turns > 0 && n > c->n_turns) n = c->n_turns;
        Rng cr;
        rng_seed(&cr, c->seed, STREAM_CONV + i);
        char *history = NULL;
        if (c->history_tokens >= 0.5f) {
            Str h = {0};
            gen_text(&cr, words_for(c->history_tokens, p->tokens_per_word), false, &h);
            if ((history = take_str(&h)) == NULL) rc = MN_ENOMEM;
        }
        cv->turns = mn_calloc((size_t)n, sizeof *cv->turns);
        if (cv->turns == NULL) rc = MN_ENOMEM;
        else cv->n_turns = n;
        for (int k = 0; k < n && rc == MN_OK; k++) {
            BenchTurn *u = &cv->turns[k];
            const char *text = turn_user(&t[k]);
            Str s = {0};
            if (k == 0 && history) {
                str_add(&s, history, strlen(history));
                str_add(&s, "\n\n", 2);
            }
            str_add(&s, text, strlen(text));
            if ((u->user = take_str(&s)) == NULL) rc = MN_ENOMEM;
            u->user_tokens = clip_round((double)strlen(u->user ? u->user : "") * b->tokens_per_char, 1, 1 << 30);
            double o = c->is_output_fixed || t[k].reply == NULL ? c->output_tokens
                                                                 : (double)strlen(t[k].reply) * b->tokens_per_char;
            u->output_tokens = clip_round(o, 1, 1 << 30);
            u->think_s = k == 0 ? 0 : c->is_think_fixed ? c->think_mean_s : rng_exp(&cr, c->think_mean_s);
            u->seed = rng_next(&cr) >> 33;
        }
        const char *sy = sys ? sys : system;
        if (rc == MN_OK && sy && (cv->system = mn_strdup(sy)) == NULL) rc = MN_ENOMEM;
        mn_free(history);
        file_turns_free(t, n_all);
    }
done:
    mn_free(order);
    json_decref(doc);
    return rc;
}

int bench_plan_new(const BenchConfig *c, BenchCountFn count_fn, void *count_ctx, BenchPlan **out, MnErr *err) {
    *out = NULL;
    BenchPlan *p = mn_calloc(1, sizeof *p);
    if (p == NULL) return MN_ENOMEM;
    Builder b = {.c = c, .plan = p, .err = err};
    p->tokens_per_word = measure_tokens_per_word(count_fn, count_ctx, &p->is_measured);
    char *system = NULL;
    int rc = MN_OK;
    if (c->system_tokens >= 0.5f) {
        Rng r;
        rng_seed(&r, c->seed, STREAM_SYSTEM);
        Str s = {0};
        gen_text(&r, words_for(c->system_tokens, p->tokens_per_word), false, &s);
        if ((system = take_str(&s)) == NULL) rc = MN_ENOMEM;
    }
    if (rc == MN_OK && c->sharegpt_path) {
        rc = plan_file(&b, system, count_fn, count_ctx);
    } else if (rc == MN_OK) {
        p->convs = mn_calloc((size_t)c->n_conversations, sizeof *p->convs);
        if (p->convs == NULL) rc = MN_ENOMEM;
        else p->n_convs = c->n_conversations;
        for (int i = 0; i < p->n_convs && rc == MN_OK; i++) rc = plan_synthetic(&b, i, system, &p->convs[i]);
    }
    mn_free(system);
    if (rc == MN_OK) { /* arrivals, then the context cap */
        Rng r;
        rng_seed(&r, c->seed, STREAM_ARRIVALS);
        double t = 0;
        for (int i = 0; i < p->n_convs; i++) {
            if (c->rate > 0 && c->workload == BENCH_MULTIROUND_QA) t = i / (double)c->rate;
            else if (c->rate > 0 && i > 0) t += rng_exp(&r, 1.0 / c->rate);
            p->convs[i].start_s = t;
            apply_max_context(c, &p->convs[i]);
            p->n_requests += p->convs[i].n_turns;
        }
    }
    if (rc != MN_OK) {
        if (rc == MN_ENOMEM) mn_err_set(err, MN_ENOMEM, "out of memory while planning the workload");
        bench_plan_free(p);
        return rc;
    }
    *out = p;
    return MN_OK;
}

void bench_plan_free(BenchPlan *p) {
    if (p == NULL) return;
    for (int i = 0; i < p->n_convs; i++) {
        BenchConv *cv = &p->convs[i];
        for (int t = 0; t < cv->n_turns; t++) mn_free(cv->turns[t].user);
        mn_free(cv->turns);
        mn_free(cv->system);
    }
    mn_free(p->convs);
    mn_free(p);
}

static bool str_eq(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

bool bench_plan_equal(const BenchPlan *a, const BenchPlan *b) {
    if (a->n_convs != b->n_convs || a->n_requests != b->n_requests || a->tokens_per_word != b->tokens_per_word)
        return false;
    for (int i = 0; i < a->n_convs; i++) {
        const BenchConv *x = &a->convs[i], *y = &b->convs[i];
        if (x->start_s != y->start_s || x->n_turns != y->n_turns || !str_eq(x->system, y->system)) return false;
        for (int t = 0; t < x->n_turns; t++) {
            const BenchTurn *u = &x->turns[t], *v = &y->turns[t];
            if (!str_eq(u->user, v->user) || u->user_tokens != v->user_tokens || u->output_tokens != v->output_tokens ||
                u->think_s != v->think_s || u->seed != v->seed)
                return false;
        }
    }
    return true;
}
