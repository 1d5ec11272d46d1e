/* mref.h — the MREF reference-logits file (../shared/data/README.md), which
 * lets any model be compared with a reference engine.
 *
 * Layout, little-endian:
 *   char  magic[4] = "MREF"
 *   int32 n_tokens, n_vocab, k            (k = 16)
 *   int32 tokens[n_tokens]
 *   per position: int32 ids[k] (largest logits, descending), float vals[k]
 *   float last[n_vocab]                   full logits of the last position
 */
#ifndef MN_MREF_H
#define MN_MREF_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

#define MREF_K 16

typedef struct MrefWriter {
    FILE *f;
    int n_tokens, n_vocab, n_rows;
} MrefWriter;

/* Open path and write the header and tokens. */
int mref_begin(MrefWriter *w, const char *path, const int32_t *tokens, int n_tokens, int n_vocab, MnErr *err);
/* Add the logits of the next position (the top k are written). */
int mref_add_row(MrefWriter *w, const float *logits, MnErr *err);
/* Write the last position's full logits and close. Closes on failure too. */
int mref_finish(MrefWriter *w, const float *last, MnErr *err);

typedef struct Mref {
    int n_tokens, n_vocab, k;
    int32_t *tokens; /* (n_tokens) */
    int32_t *ids;    /* (n_tokens, k) */
    float *vals;     /* (n_tokens, k) */
    float *last;     /* (n_vocab) */
} Mref;

int mref_read(const char *path, Mref *out, MnErr *err);
void mref_free(Mref *r);

/* The k largest entries of logits (descending; ties by lower id). */
void mref_top_k(const float *logits, int n_vocab, int k, int32_t *ids, float *vals);

#endif
