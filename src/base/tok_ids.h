/* tok_ids.h — a growable vector of token ids, owned by the caller.
 *
 * The one container a token sequence travels in between the tokenizer
 * (model/), the reply memory (cache/) and prompt building (engine/); it
 * sits in base/ so that a layer can hold ids without depending on the
 * tokenizer that makes them. A zeroed TokIds is empty and valid.
 */
#ifndef MN_TOK_IDS_H
#define MN_TOK_IDS_H

#include <stddef.h>
#include <stdint.h>

typedef struct TokIds {
    int32_t *ids; /* (cap) the first n are valid; owned, freed by tok_ids_free */
    size_t n, cap;
} TokIds;

/* Free ids and zero the struct (a zeroed or NULL v is fine). */
void tok_ids_free(TokIds *v);

/* Append id, growing the buffer: MN_OK, or MN_ENOMEM with v unchanged. */
int tok_ids_push(TokIds *v, int32_t id);

/* Append ids[0..n): MN_OK, or MN_ENOMEM with v unchanged. */
int tok_ids_append(TokIds *v, const int32_t *ids, size_t n);

#endif
