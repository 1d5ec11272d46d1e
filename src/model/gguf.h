/* gguf.h — reading and writing GGUF files (versions 2 and 3).
 *
 * Reader: gguf_open reads the file into memory (or maps it, GgufHold) and
 * validates everything before returning: header, every metadata key/value (all value types, arrays
 * included, nested arrays too), every tensor descriptor (name, dims, type,
 * offset), general.alignment, and that each tensor's bytes lie inside the
 * file, do not overlap and are aligned. Any problem — truncation, version 1
 * or unknown version, an unknown or unsupported tensor type, quantized rows
 * that are not a whole number of blocks, sizes that overflow — is rejected
 * with MN_EFORMAT/MN_EUNSUPPORTED and a message in err naming the problem
 * (and the key or tensor). Nothing that a file contains can crash the reader.
 *
 * All pointers handed out (strings, array data, tensor data) point into the
 * file's image or into memory owned by the Gguf; they stay valid until
 * gguf_close. Strings are not NUL-terminated (GgufStr has a length); keys
 * and tensor names are also available NUL-terminated.
 *
 * Writer: builds a file from key/values and tensors added in order and writes
 * it in GGUF v3 (or the version set) with the data section aligned to
 * general.alignment (default 32), each tensor's data padded with zeros to the
 * alignment. Reading a file and writing every KV and tensor back in order
 * gives a byte-identical file.
 */
#ifndef MN_GGUF_H
#define MN_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

typedef enum GgufType {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
} GgufType;

typedef struct GgufStr {
    uint64_t len;
    const char *data; /* not NUL-terminated */
} GgufStr;

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct GgufTensor {
    const char *name;          /* NUL-terminated, owned by the Gguf */
    uint32_t type;             /* GGML type id (MnType for supported ones) */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] = elements per row; unused dims = 1 */
    uint64_t offset;           /* relative to the start of the data section */
    uint64_t n_bytes;
    const void *data;          /* into the image; NULL when opened with no data */
} GgufTensor;

typedef struct Gguf Gguf;

/* ---- reader ---------------------------------------------------------------- */

/* How an opened file's bytes are held. Reading costs a copy at open and
 * memory of the process's own, but the weights then sit in 2 MiB pages
 * where the kernel grants them: a decode streams every weight once a
 * token, and with 4 KiB pages of the page cache that is a TLB miss every
 * 4 KiB, and pages a memory-reclaiming kernel thread (a VM's DAMON) may
 * scan and stall. Mapping shares the page cache with other processes and
 * costs nothing up front. */
typedef enum GgufHold {
    GGUF_READ, /* read into mn_huge_alloc memory, read-only once filled */
    GGUF_MAP,  /* mapped read-only from the file */
} GgufHold;

/* Read and validate path (GGUF_READ). On success *out owns the image.
 * Every error message names the file (callers need not add it): a file
 * that shrinks while it is read is MN_EIO, no memory for it MN_ENOMEM. */
int gguf_open(const char *path, Gguf **out, MnErr *err);
/* The same, holding the bytes as hold says. */
int gguf_open_with(const char *path, GgufHold hold, Gguf **out, MnErr *err);
/* The same for the header and metadata alone, mapped: the tensor infos are not
 * read (the handle has no tensors), so a file whose tensors mnemo cannot
 * load (a weight type it does not know) still gives its metadata. */
int gguf_open_metadata(const char *path, Gguf **out, MnErr *err);
/* Validate a file image held in memory (borrowed: must outlive the Gguf). */
int gguf_open_memory(const void *data, size_t n_bytes, Gguf **out, MnErr *err);
void gguf_close(Gguf *g);

uint32_t gguf_version(const Gguf *g);
uint64_t gguf_alignment(const Gguf *g);
uint64_t gguf_data_offset(const Gguf *g); /* file offset of the data section (past EOF when no tensors) */
uint64_t gguf_file_bytes(const Gguf *g);
const void *gguf_file_data(const Gguf *g); /* the whole image */

/* Metadata: index of key or -1. */
int64_t gguf_n_kv(const Gguf *g);
int64_t gguf_find_key(const Gguf *g, const char *key);
const char *gguf_kv_key(const Gguf *g, int64_t i);
GgufType gguf_kv_type(const Gguf *g, int64_t i);

/* Typed getters by key. Return MN_OK, MN_ENOTFOUND when the key is absent,
 * MN_EFORMAT when its type does not fit. Integer getters accept any integer
 * type whose value fits the output. */
int gguf_get_u32(const Gguf *g, const char *key, uint32_t *out);
int gguf_get_i64(const Gguf *g, const char *key, int64_t *out);
int gguf_get_f32(const Gguf *g, const char *key, float *out); /* f32 or f64 */
int gguf_get_bool(const Gguf *g, const char *key, bool *out);
int gguf_get_str(const Gguf *g, const char *key, GgufStr *out);

/* Arrays: element type and count. */
int gguf_get_arr(const Gguf *g, const char *key, GgufType *elem_type, uint64_t *n);
/* Element i of an array of strings / of numbers (converted; arr_i64 takes
 * integer arrays only). MN_ERANGE when i >= the count, MN_EFORMAT when the
 * element type does not fit. */
int gguf_arr_str(const Gguf *g, const char *key, uint64_t i, GgufStr *out);
int gguf_arr_f32(const Gguf *g, const char *key, uint64_t i, float *out);
int gguf_arr_i64(const Gguf *g, const char *key, uint64_t i, int64_t *out);

/* Tensors. */
int64_t gguf_n_tensors(const Gguf *g);
const GgufTensor *gguf_tensor(const Gguf *g, int64_t i);
const GgufTensor *gguf_find_tensor(const Gguf *g, const char *name); /* NULL if absent */

/* Human-readable listing of all metadata (arrays abbreviated) and tensors. */
void gguf_dump(const Gguf *g, FILE *f);

/* ---- writer ---------------------------------------------------------------- */

typedef struct GgufWriter GgufWriter;

GgufWriter *gguf_writer_new(void); /* NULL on allocation failure */
void gguf_writer_free(GgufWriter *w);
void gguf_writer_set_version(GgufWriter *w, uint32_t version); /* 2 or 3; default 3 */

/* Add key/values in file order. Strings and arrays are copied. Each add
 * returns MN_OK, MN_ENOMEM, MN_EINVAL (NULL or duplicate key/name, bad
 * shape or size) or MN_EUNSUPPORTED (tensor type); the first failure is also
 * remembered and makes gguf_writer_write fail with its message. */
int gguf_writer_add_u32(GgufWriter *w, const char *key, uint32_t v);
int gguf_writer_add_i32(GgufWriter *w, const char *key, int32_t v);
int gguf_writer_add_f32(GgufWriter *w, const char *key, float v);
int gguf_writer_add_bool(GgufWriter *w, const char *key, bool v);
int gguf_writer_add_str(GgufWriter *w, const char *key, const char *v);
int gguf_writer_add_arr_str(GgufWriter *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_add_arr_f32(GgufWriter *w, const char *key, const float *v, uint64_t n);
int gguf_writer_add_arr_i32(GgufWriter *w, const char *key, const int32_t *v, uint64_t n);
/* Add a value already in GGUF encoding (what follows the type field in a
 * file: a scalar, a str, or an array with its element type and count), for
 * the types the helpers above do not cover (u8, i64, f64, nested arrays...).
 * The encoding is validated: MN_EINVAL if it is malformed or has trailing
 * bytes. */
int gguf_writer_add_raw(GgufWriter *w, const char *key, GgufType type, const void *value,
                        uint64_t value_bytes);
/* Copy key/value i of src exactly (any type, nested arrays included). */
int gguf_writer_copy_kv(GgufWriter *w, const Gguf *src, int64_t i);

/* Add a tensor; data (n_bytes, must match type and shape) is borrowed until
 * gguf_writer_write returns. */
int gguf_writer_add_tensor(GgufWriter *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, const void *data, uint64_t n_bytes);

/* Write the file (to path.tmp, then renamed into place): header, KVs in
 * order, tensor infos with offsets assigned in order, then, when there are
 * tensors, zeros to the alignment and each tensor's data followed by zeros
 * to the alignment. MN_EIO with a message on any I/O failure (the temporary
 * file is removed). */
int gguf_writer_write(GgufWriter *w, const char *path, MnErr *err);

#endif
