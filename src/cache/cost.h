/* cost.h — the recompute cost model: seconds it takes this machine to
 * recompute one KV block of this model at a given position.
 *
 * A block of block_tokens tokens whose first token sits at position p costs
 *
 *     cost_block(p) = block_tokens * (tok_sec + attn(p))
 *
 * tok_sec is the constant per-token cost (the matmuls, norms, and the
 * attention of a block over itself), measured as a block at position 0.
 * attn(ctx) is the extra attention seconds per query token for ctx earlier
 * positions; it is known at knots (context lengths, in practice powers of two
 * plus the largest context profiled) and interpolated linearly between them,
 * through (0, 0) below the first knot, and proportionally (the line through
 * the origin and the last knot) above the last one. Linear rather than
 * log-space interpolation: a query token's attention work is one dot product
 * and one axpy per earlier position, so attn is affine in ctx by construction
 * and piecewise-linear interpolation reproduces it exactly, stays monotonic
 * when the knots are, and copes with knots of zero (a tiny model whose
 * attention is lost in timing noise), which log space cannot represent.
 *
 * The model is measured once per (model, machine) by engine/profile.c and
 * cached across restarts in a small text file (format in cost.c) keyed by a
 * CostKey: the model fingerprint, the facts of the machine and set-up that
 * change the timings, and the build (a new mnemo's kernels time otherwise,
 * so it measures again). A file whose key differs is ignored.
 *
 * A CostModel is a plain value (no heap), immutable once built, and may be
 * read by any thread.
 */
#ifndef MN_COST_H
#define MN_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "base/ttype.h"

#define COST_MAX_KNOTS 32
#define COST_CPU_LEN 128
#define COST_BUILD_LEN 64

/* What a profile is valid for. Two keys match only if every field does. */
typedef struct CostKey {
    Hash128 model;          /* Model.fingerprint */
    char cpu[COST_CPU_LEN]; /* CPU model string (printable ASCII, NUL-terminated) */
    int n_cpus;             /* online CPUs */
    int n_threads;          /* compute threads the engine runs with */
    int block_tokens;
    int kv_type;            /* MnType of the pool's KV */
    char build[COST_BUILD_LEN]; /* the mnemo that measured it, "VERSION+COMMIT": its kernels set the timings */
} CostKey;

typedef struct CostModel {
    CostKey key;
    double tok_sec;                        /* seconds per token of a block at position 0 (> 0) */
    int n_knots;                           /* 0 .. COST_MAX_KNOTS */
    int32_t knot_ctx[COST_MAX_KNOTS];      /* (n_knots) strictly increasing, > 0 */
    double knot_attn_sec[COST_MAX_KNOTS];  /* (n_knots) extra seconds per token at knot_ctx, >= 0 */
} CostModel;

/* Fill a key for this machine: reads the CPU model from /proc/cpuinfo
 * ("model name", else other known fields, else the uname machine, else
 * "unknown") and the online CPU count. Never fails. */
void cost_key_init(CostKey *k, const Hash128 *model, int n_threads, int block_tokens, MnType kv_type);
bool cost_key_eq(const CostKey *a, const CostKey *b);

/* The name of the file that caches the profile of key k, in buf (cap >=
 * COST_FILE_NAME_LEN): "cost-MODEL-tTHREADS-bBLOCK-KV-MACHINE.txt", MODEL
 * the fingerprint in hex and MACHINE a hash of the CPU model and count.
 * Keys that differ get different names (short of a hash collision), so
 * servers set up differently keep a profile each instead of overwriting
 * one another's. */
#define COST_FILE_NAME_LEN 96
void cost_key_file_name(const CostKey *k, char *buf, size_t cap);

/* Build a model from measured values. MN_EINVAL (with err) when tok_sec is
 * not finite and > 0, n_knots is out of range, the contexts are not strictly
 * increasing and positive, an attention value is not finite and >= 0, or
 * the key's block_tokens is not positive (a NULL key counts as all zeros).
 * *cm is written only on success. */
int cost_init(CostModel *cm, const CostKey *key, double tok_sec, const int32_t *ctx, const double *attn_sec,
              int n_knots, MnErr *err);

/* A synthetic model whose attention is exactly attn_sec_per_ctx * ctx, with
 * knots at powers of two up to max_ctx: for tests, and as the fallback when
 * profiling is off. tok_sec > 0, attn_sec_per_ctx >= 0. */
int cost_init_linear(CostModel *cm, const CostKey *key, double tok_sec, double attn_sec_per_ctx, int max_ctx,
                     MnErr *err);

/* Check the invariants listed on CostModel; MN_OK or MN_EINVAL with err. */
int cost_validate(const CostModel *cm, MnErr *err);

/* Extra attention seconds of one query token with ctx earlier positions
 * (0 for ctx <= 0). Non-decreasing in ctx when the knots are. */
double cost_attn_per_token(const CostModel *cm, double ctx);

/* Seconds to recompute the block whose first token is at position pos. */
double cost_block(const CostModel *cm, int32_t pos);

/* Write the model to path atomically (a temporary file renamed over it).
 * MN_EINVAL for an invalid model, MN_EIO (with err) on a write failure. */
int cost_save(const CostModel *cm, const char *path, MnErr *err);

/* Read a model saved by cost_save. Returns MN_OK and fills *out only for a
 * complete, intact file whose key equals *want (want NULL: any key).
 * MN_ENOTFOUND when there is no file, or when it was made for another key
 * (re-profile); MN_EFORMAT when it is truncated, corrupt, or of another
 * format version; MN_EIO when it cannot be read. err says which. */
int cost_load(const char *path, const CostKey *want, CostModel *out, MnErr *err);

/* Print the model (key, tok_sec, knots) to stderr, for gdb and failing tests. */
void cost_dump(const CostModel *cm);

#endif
