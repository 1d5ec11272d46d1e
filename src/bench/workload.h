/* workload.h — what `mnemo bench` sends: conversations and their schedule.
 *
 * A BenchConfig holds the flags (unset fields are negative and take the
 * workload's defaults in bench_config_resolve). bench_plan_new turns a
 * resolved config into a BenchPlan: every conversation's arrival time, its
 * turns (user text, output length, think time before the turn, sampling
 * seed) — all drawn up front from a seeded generator, so the same config
 * and the same tokenizer give the same plan. Conversation i draws from its
 * own stream, so it does not change when --conversations grows.
 */
#ifndef MN_BENCH_WORKLOAD_H
#define MN_BENCH_WORKLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

typedef enum BenchWorkload {
    BENCH_SHAREGPT_SYNTH, /* ShareGPT-like turn counts and lengths */
    BENCH_MULTIROUND_QA,  /* users x rounds over a shared system prompt and a per-user history */
    BENCH_MULTITURN,      /* clients x rounds, each round a new question */
    BENCH_WORKLOAD__COUNT
} BenchWorkload;

/* Flags. Negative (or NULL) means "the workload's default". Sizes are in
 * tokens; for sharegpt-synth question/output sizes are the means of the
 * length distributions. */
typedef struct BenchConfig {
    BenchWorkload workload;
    const char *sharegpt_path; /* borrowed; replay user turns from this file */
    int n_conversations;
    int n_turns;          /* turns per conversation; sharegpt: a cap (0 = none) */
    float system_tokens;  /* shared system prompt */
    float history_tokens; /* per-conversation context before the first question */
    float question_tokens;
    float output_tokens;  /* max_tokens, sent with ignore_eos */
    float rate;           /* conversations started per second (Poisson); 0: all at once */
    float think_mean_s;   /* mean pause between a reply and the next turn */
    float scale;          /* multiplies the workload's default sizes */
    int max_context;      /* end a conversation before its prompt would pass this (0 = no limit) */
    int past_context;     /* ... or rather this many turns after that (with max_context: conversations
                             that run past the server's context, which drops their oldest turns) */
    uint64_t seed;
    float duration_s;     /* stop starting conversations after this (0 = no limit) */
    int concurrency;      /* requests in flight at most */
    /* set by bench_config_resolve */
    bool is_output_fixed; /* --output-tokens given: every turn generates exactly that */
    bool is_think_fixed;  /* multiround-qa without --think-mean: users/rate, not random */
} BenchConfig;

typedef struct BenchTurn {
    char *user;        /* the user message (turn 0 starts with the history) */
    int user_tokens;   /* its target size (an estimate for replayed turns) */
    int output_tokens; /* max_tokens of this request */
    double think_s;    /* pause after the previous reply (0 for turn 0) */
    uint64_t seed;     /* sampling seed sent with the request */
} BenchTurn;

typedef struct BenchConv {
    double start_s;    /* planned arrival, seconds after the run starts */
    char *system;      /* NULL: no system message */
    int n_turns;
    BenchTurn *turns;  /* (n_turns) */
} BenchConv;

typedef struct BenchPlan {
    int n_convs;
    BenchConv *convs;  /* (n_convs) in arrival order */
    long n_requests;   /* sum of n_turns */
    double tokens_per_word; /* used to size synthetic text */
    bool is_measured;  /* tokens_per_word came from the server's tokenizer */
} BenchPlan;

/* Counts the tokens of text (e.g. the server's /tokenize); MN_OK or any
 * error, after which the plan falls back to an estimate. */
typedef int (*BenchCountFn)(void *ctx, const char *text, long *n_tokens);

/* All fields unset, seed 1. */
void bench_config_init(BenchConfig *c);

/* Fill unset fields with the workload's defaults and check ranges.
 * MN_EINVAL with err naming the bad flag. */
int bench_config_resolve(BenchConfig *c, MnErr *err);

/* "sharegpt-synth" ... ; NULL for an out-of-range value. */
const char *bench_workload_name(BenchWorkload w);
/* MN_OK and *w, or MN_EINVAL. */
int bench_workload_parse(const char *name, BenchWorkload *w);

/* Draw the plan of a resolved config. count_fn may be NULL (sizes are then
 * estimated). MN_EFORMAT/MN_EIO for a bad --sharegpt file (err says why),
 * MN_ENOMEM. *out is freed with bench_plan_free. */
int bench_plan_new(const BenchConfig *c, BenchCountFn count_fn, void *count_ctx, BenchPlan **out, MnErr *err);
void bench_plan_free(BenchPlan *p);

/* True when the two plans are identical (texts, lengths, times, seeds). */
bool bench_plan_equal(const BenchPlan *a, const BenchPlan *b);

#endif
