/* profile.h — measure this machine's recompute cost for a model (the
 * CostModel of cache/cost.h that Pensieve's retention value divides).
 *
 * profile_measure builds its own small KV pool and Forward, times one block
 * of tokens at position 0 (the per-token constant) and one block at
 * power-of-two context lengths up to a cap (the attention increment), and
 * returns a CostModel. It is bounded in time (budget_sec, plus a warm-up
 * pass that pages in the weights) and in memory (the pool holds at most
 * max_ctx tokens). Timings are noisy; the result is made monotonic in
 * context by construction. profile_load_or_measure adds the cache file.
 *
 * Call at start-up, before the engine runs: the profile uses its own thread
 * pool, and other work on the machine distorts it.
 */
#ifndef MN_PROFILE_H
#define MN_PROFILE_H

#include <stdbool.h>

#include "base/err.h"
#include "base/ttype.h"
#include "cache/cost.h"
#include "model/model.h"

typedef struct ProfileOptions {
    int n_threads;     /* compute threads, as the engine will use (default 2) */
    int block_tokens;  /* default 32 */
    MnType kv_type;    /* default f16 */
    int max_ctx;       /* largest context measured (default 4096; capped by the model's n_ctx) */
    double budget_sec; /* time for the measurements after warm-up (default 1.0); the
                          profile is cached, so a server may afford more */
    int reps;          /* timings per point, the fastest kept (default 3; fewer when runs are slow) */
} ProfileOptions;

void profile_options_default(ProfileOptions *o);

/* Measure into *out (key: the model's fingerprint and this machine).
 * Contexts are measured smallest first while the budget lasts (at least one).
 * MN_EINVAL (with err) for bad options or a model context shorter than one
 * block, MN_ENOMEM, or a forward-pass error. *out is written only on success. */
int profile_measure(const Model *m, const ProfileOptions *o, CostModel *out, MnErr *err);

/* The file name (no directory) under which a profile for this model and
 * these options is cached: cost_key_file_name of the key that
 * profile_load_or_measure checks. */
void profile_file_name(const Model *m, const ProfileOptions *o, char *buf, size_t cap);

/* The file a profile for this model and these options is cached in when
 * the caller names none: ~/.cache/mnemo/ + profile_file_name (base/
 * user_cache, the directories made). MN_OK and buf; MN_ENOTFOUND (no
 * $HOME) or MN_ERANGE (buf too small): there is no such file. */
int profile_default_path(const Model *m, const ProfileOptions *o, char *buf, size_t cap);

/* Load the profile cached at path when it was made for this model and
 * machine; otherwise measure and save it there (a failed save is logged,
 * not returned). *was_loaded (may be NULL) tells which happened. path NULL:
 * just measure. Errors as profile_measure. */
int profile_load_or_measure(const Model *m, const ProfileOptions *o, const char *path, CostModel *out,
                            bool *was_loaded, MnErr *err);

#endif
