/* gguf.c — the GGUF reader (validate, then serve metadata and tensors out of
 * a read-only image of the file: read into huge pages, or mapped) and the
 * GGUF writer (build a file from key/values and tensors, byte-compatible
 * with llama.cpp's writer).
 *
 * Everything else in mnemo reaches model files through this module: the
 * model loader takes tensor pointers, the tokenizer reads tokenizer.*
 * metadata, the quantize tool copies key/values into a writer. The reader
 * validates the whole header region once in gguf_open; after that every
 * getter only reads bytes already proven to lie inside the image, so no
 * later call can run off the end of the file. A Gguf is immutable after
 * open and may be shared by threads; a GgufWriter belongs to one thread.
 *
 * File format (all integers little-endian; "str" = u64 byte length followed
 * by that many bytes, no terminator):
 *
 *   offset 0   char[4]  magic "GGUF" (0x47 0x47 0x55 0x46)
 *          4   u32      version: 2 or 3 (1 used u32 counts; rejected)
 *          8   u64      n_tensors
 *         16   u64      n_kv
 *         24   n_kv key/values, each:
 *                str  key (unique in the file)
 *                u32  value type (GgufType 0..12)
 *                value: scalars of 1, 2, 4 or 8 bytes by type (bool is one
 *                byte); a string is a str; an array is u32 element type,
 *                u64 count, then count elements of that type (strings and
 *                arrays allowed as elements; we accept GGUF_MAX_NESTING
 *                levels of arrays)
 *              n_tensors tensor infos, each:
 *                str  name (unique in the file)
 *                u32  n_dims (1..4)
 *                u64  ne[n_dims] (ne[0] = elements per row)
 *                u32  GGML type id
 *                u64  offset of the data, relative to the data section,
 *                     a multiple of the alignment
 *              zero padding up to a multiple of the alignment (only when
 *              the file has tensors)
 *   data       the data section: each tensor's bytes at its offset, followed
 *              by zeros up to the alignment. Tensors must not overlap and
 *              must end inside the file.
 *
 * The alignment is the u32 key general.alignment when present (a power of
 * two), else 32. A tensor's size is the bytes of one row (ttype_row_bytes;
 * quantized rows are whole blocks) times ne[1] * ne[2] * ne[3].
 *
 * Validation invariants: every length, count and offset read from the file
 * is compared with the bytes that remain before it is used, by division so
 * that nothing overflows (a count is at most remaining / minimal element
 * size). Memory grows only with what has actually been parsed, so a lying
 * count cannot cause a huge allocation. Nesting is limited so recursion is
 * bounded.
 */
#include "model/gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mem.h"
#include "base/ttype.h"

/* ---- types --------------------------------------------------------------- */

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24
#define GGUF_MAX_NESTING 8          /* levels of arrays inside one value */
#define GGUF_N_TYPES 13
#define GGUF_MIN_KV_BYTES 13        /* key length 8 + type 4 + smallest value 1 */
#define GGUF_MIN_TENSOR_BYTES 32    /* name length 8 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define GGUF_MIN_STR_BYTES 8        /* a string element: its length */
#define GGUF_MIN_ARR_BYTES 12       /* an array element: type + count */

/* Bytes of a scalar of each type; 0 for the variable-size string and array. */
static const uint8_t type_bytes[GGUF_N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const type_names[GGUF_N_TYPES] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
};

typedef struct GgufKv {
    char *key;            /* NUL-terminated copy, owned */
    uint64_t key_len;
    uint32_t type;        /* GgufType */
    uint32_t elem_type;   /* arrays: element type */
    uint64_t n_elems;     /* arrays: element count */
    uint64_t value_off;   /* file offset of the value (just after the type) */
    uint64_t value_bytes; /* encoded size of the value */
    uint64_t *str_offs;   /* string arrays: file offset of each element's length; owned */
} GgufKv;

/* Open-addressing hash of names (keys or tensor names) -> index. */
typedef struct NameSlot {
    const char *name;     /* borrowed from the owner of the entry; NULL = empty */
    uint64_t len;
    uint64_t hash;
    int64_t idx;
} NameSlot;

typedef struct NameIndex {
    NameSlot *slots;      /* cap slots, cap a power of two, at most half full */
    uint64_t cap;
    uint64_t n;
} NameIndex;

struct Gguf {
    const uint8_t *base;  /* the file image */
    uint64_t n_bytes;
    void *map;            /* our image (mapping or read copy), or NULL for a borrowed one */
    size_t map_bytes;
    GgufHold hold;        /* how map was made, and so how it is freed */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    GgufKv *kvs;          /* (n_kv) in file order */
    int64_t n_kv;
    uint64_t cap_kv;
    GgufTensor *tensors;  /* (n_tensors) in file order; names owned */
    int64_t n_tensors;
    uint64_t cap_tensors;
    NameIndex kv_index;
    NameIndex tensor_index;
};

/* A position in an image being validated, and where we are for messages. */
typedef struct Parser {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    MnErr *err;
    char where[160];      /* "header", "key 'general.name'", "tensor 'x'" */
} Parser;

/* ---- small helpers ------------------------------------------------------- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (unsigned)p[1] << 8); }

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double bits_to_f64(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static const char *type_name(uint32_t t) { return t < GGUF_N_TYPES ? type_names[t] : "?"; }

static bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Up to 96 bytes of a name from the file, unprintable bytes as '?', for
 * messages. Returns dst. */
static const char *printable(char *dst, size_t cap, const char *s, uint64_t len) {
    size_t n = 0;
    uint64_t max = len > 96 ? 96 : len;
    for (uint64_t i = 0; i < max && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        dst[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (max < len && n + 4 < cap) {
        memcpy(dst + n, "...", 3);
        n += 3;
    }
    dst[n] = '\0';
    return dst;
}

/* Grow *arr (of elem_bytes items, *cap of them) to hold at least need. */
static int grow(void **arr, uint64_t *cap, uint64_t need, size_t elem_bytes) {
    if (need <= *cap) return MN_OK;
    uint64_t new_cap = *cap ? *cap * 2 : 16;
    if (new_cap < need) new_cap = need;
    size_t n_bytes;
    if (new_cap > SIZE_MAX || mn_mul_size((size_t)new_cap, elem_bytes, &n_bytes) != 0) return MN_ENOMEM;
    void *p = mn_realloc(*arr, n_bytes);
    if (p == NULL) return MN_ENOMEM;
    *arr = p;
    *cap = new_cap;
    return MN_OK;
}

/* ---- name index ---------------------------------------------------------- */

static uint64_t name_hash(const char *s, uint64_t len) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static int64_t gguf_index_find(const NameIndex *ix, const char *s, uint64_t len, uint64_t h) {
    if (ix->cap == 0) return -1;
    for (uint64_t i = h & (ix->cap - 1);; i = (i + 1) & (ix->cap - 1)) {
        const NameSlot *sl = &ix->slots[i];
        if (sl->name == NULL) return -1;
        if (sl->hash == h && sl->len == len && memcmp(sl->name, s, len) == 0) return sl->idx;
    }
}

static void gguf_index_place(NameSlot *slots, uint64_t cap, NameSlot sl) {
    uint64_t i = sl.hash & (cap - 1);
    while (slots[i].name != NULL) i = (i + 1) & (cap - 1);
    slots[i] = sl;
}

/* Insert a name known to be absent. The name must stay valid. */
static int gguf_index_insert(NameIndex *ix, const char *s, uint64_t len, uint64_t h, int64_t idx) {
    if ((ix->n + 1) * 2 > ix->cap) {
        uint64_t new_cap = ix->cap ? ix->cap * 2 : 64;
        NameSlot *slots = mn_calloc((size_t)new_cap, sizeof *slots);
        if (slots == NULL) return MN_ENOMEM;
        for (uint64_t i = 0; i < ix->cap; i++)
            if (ix->slots[i].name != NULL) gguf_index_place(slots, new_cap, ix->slots[i]);
        mn_free(ix->slots);
        ix->slots = slots;
        ix->cap = new_cap;
    }
    gguf_index_place(ix->slots, ix->cap, (NameSlot){s, len, h, idx});
    ix->n++;
    return MN_OK;
}

/* ---- parser primitives --------------------------------------------------- */

static uint64_t p_left(const Parser *p) { return p->size - p->pos; }

static int p_need(Parser *p, uint64_t n, const char *what) {
    if (n <= p_left(p)) return MN_OK;
    return mn_err_set(p->err, MN_EFORMAT,
                      "%s: file truncated: %s at offset %" PRIu64 " needs %" PRIu64
                      " bytes but only %" PRIu64 " remain",
                      p->where, what, p->pos, n, p_left(p));
}

static int p_u32(Parser *p, const char *what, uint32_t *out) {
    int rc = p_need(p, 4, what);
    if (rc != MN_OK) return rc;
    *out = le32(p->base + p->pos);
    p->pos += 4;
    return MN_OK;
}

static int p_u64(Parser *p, const char *what, uint64_t *out) {
    int rc = p_need(p, 8, what);
    if (rc != MN_OK) return rc;
    *out = le64(p->base + p->pos);
    p->pos += 8;
    return MN_OK;
}

static int p_str(Parser *p, const char *what, GgufStr *out) {
    uint64_t len;
    int rc = p_u64(p, what, &len);
    if (rc != MN_OK) return rc;
    if ((rc = p_need(p, len, what)) != MN_OK) return rc;
    out->len = len;
    out->data = (const char *)p->base + p->pos;
    p->pos += len;
    return MN_OK;
}

/* Check that count elements of at least min_bytes each can fit in what is
 * left (division, so no overflow). */
static int p_count(Parser *p, uint64_t count, uint64_t min_bytes, const char *what) {
    if (count <= p_left(p) / min_bytes) return MN_OK;
    return mn_err_set(p->err, MN_EFORMAT,
                      "%s: %s %" PRIu64 " is impossible: the %" PRIu64
                      " bytes left at offset %" PRIu64 " hold at most %" PRIu64
                      " (file truncated or corrupt)",
                      p->where, what, count, p_left(p), p->pos, p_left(p) / min_bytes);
}

/* Validate and skip one value of type; depth = arrays already entered. */
static int p_skip_value(Parser *p, uint32_t type, int depth) {
    int rc;
    if (type >= GGUF_N_TYPES)
        return mn_err_set(p->err, MN_EFORMAT, "%s: unknown value type %" PRIu32, p->where, type);
    if (type == GGUF_TYPE_STRING) {
        GgufStr s;
        return p_str(p, "string", &s);
    }
    if (type != GGUF_TYPE_ARRAY) {
        if ((rc = p_need(p, type_bytes[type], type_names[type])) != MN_OK) return rc;
        p->pos += type_bytes[type];
        return MN_OK;
    }
    if (depth >= GGUF_MAX_NESTING)
        return mn_err_set(p->err, MN_EFORMAT, "%s: arrays nested more than %d deep", p->where,
                          GGUF_MAX_NESTING);
    uint32_t et;
    uint64_t n;
    if ((rc = p_u32(p, "array element type", &et)) != MN_OK) return rc;
    if (et >= GGUF_N_TYPES)
        return mn_err_set(p->err, MN_EFORMAT, "%s: unknown array element type %" PRIu32, p->where, et);
    if ((rc = p_u64(p, "array count", &n)) != MN_OK) return rc;
    if (et == GGUF_TYPE_STRING) {
        if ((rc = p_count(p, n, GGUF_MIN_STR_BYTES, "string array count")) != MN_OK) return rc;
        for (uint64_t i = 0; i < n; i++) {
            GgufStr s;
            if ((rc = p_str(p, "string array element", &s)) != MN_OK) return rc;
        }
    } else if (et == GGUF_TYPE_ARRAY) {
        if ((rc = p_count(p, n, GGUF_MIN_ARR_BYTES, "nested array count")) != MN_OK) return rc;
        for (uint64_t i = 0; i < n; i++)
            if ((rc = p_skip_value(p, GGUF_TYPE_ARRAY, depth + 1)) != MN_OK) return rc;
    } else {
        if ((rc = p_count(p, n, type_bytes[et], "array count")) != MN_OK) return rc;
        p->pos += n * type_bytes[et]; /* fits: checked against what is left */
    }
    return MN_OK;
}

/* Size of an already validated value at p (for walking nested arrays). */
static uint64_t value_bytes_at(const uint8_t *p, uint32_t type) {
    if (type == GGUF_TYPE_STRING) return 8 + le64(p);
    if (type != GGUF_TYPE_ARRAY) return type_bytes[type];
    uint32_t et = le32(p);
    uint64_t n = le64(p + 4), off = 12;
    if (et != GGUF_TYPE_STRING && et != GGUF_TYPE_ARRAY) return off + n * type_bytes[et];
    for (uint64_t i = 0; i < n; i++) off += value_bytes_at(p + off, et);
    return off;
}

/* ---- tensor shape -------------------------------------------------------- */

/* Bytes of a tensor of type and shape, with messages naming the tensor.
 * Shared by the reader and the writer. */
static int tensor_size(const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                       uint64_t *out_bytes, MnErr *err) {
    const char *gname = ttype_ggml_name(type);
    const TypeTraits *tr = ttype_traits(type);
    if (gname == NULL)
        return mn_err_set(err, MN_EFORMAT, "tensor '%s': unknown tensor type %" PRIu32, name, type);
    if (tr == NULL)
        return mn_err_set(err, MN_EUNSUPPORTED, "tensor '%s': tensor type %s is not supported (supported: %s)", name,
                          gname, ttype_supported_names());
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return mn_err_set(err, MN_EFORMAT, "tensor '%s': %" PRIu32 " dimensions (must be 1 to %d)",
                          name, n_dims, GGUF_MAX_DIMS);
    bool is_empty = false;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] > (uint64_t)INT64_MAX)
            return mn_err_set(err, MN_EFORMAT, "tensor '%s': dimension %" PRIu32 " is too large (%" PRIu64 ")",
                              name, d, ne[d]);
        if (ne[d] == 0) is_empty = true;
    }
    if (ne[0] % tr->block_elems != 0)
        return mn_err_set(err, MN_EFORMAT,
                          "tensor '%s': row length %" PRIu64 " is not a multiple of the %s block size %zu "
                          "(rows must be whole blocks)",
                          name, ne[0], tr->name, tr->block_elems);
    if (is_empty) {
        *out_bytes = 0;
        return MN_OK;
    }
    /* element count must fit int64 (what the kernels index with) */
    uint64_t n_elems = ne[0], n_rows = 1;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (n_elems > (uint64_t)INT64_MAX / ne[d])
            return mn_err_set(err, MN_EFORMAT, "tensor '%s': element count overflows", name);
        n_elems *= ne[d];
        n_rows *= ne[d];
    }
    uint64_t row_bytes;
    if (ttype_row_bytes(type, ne[0], &row_bytes) != MN_OK || n_rows > UINT64_MAX / row_bytes)
        return mn_err_set(err, MN_EFORMAT, "tensor '%s': byte size overflows", name);
    *out_bytes = row_bytes * n_rows;
    return MN_OK;
}

/* ---- reader: parse ------------------------------------------------------- */

static int parse_header(Gguf *g, Parser *p, uint64_t *n_tensors, uint64_t *n_kv) {
    int rc;
    snprintf(p->where, sizeof p->where, "header");
    if ((rc = p_need(p, 4, "magic")) != MN_OK) return rc;
    if (memcmp(p->base, GGUF_MAGIC, 4) != 0) {
        const uint8_t *m = p->base;
        return mn_err_set(p->err, MN_EFORMAT,
                          "not a GGUF file: magic bytes %02x %02x %02x %02x, expected 47 47 55 46 (\"GGUF\")",
                          m[0], m[1], m[2], m[3]);
    }
    p->pos = 4;
    if ((rc = p_u32(p, "version", &g->version)) != MN_OK) return rc;
    if (g->version == 1)
        return mn_err_set(p->err, MN_EUNSUPPORTED,
                          "GGUF version 1 is not supported (only versions 2 and 3); "
                          "convert the file with a current llama.cpp");
    if (g->version != 2 && g->version != 3)
        return mn_err_set(p->err, MN_EUNSUPPORTED,
                          "GGUF version %" PRIu32 " is not supported (only versions 2 and 3)%s",
                          g->version, (g->version & 0xffff) == 0 ? "; big-endian file?" : "");
    if ((rc = p_u64(p, "tensor count", n_tensors)) != MN_OK) return rc;
    if ((rc = p_u64(p, "key/value count", n_kv)) != MN_OK) return rc;
    if ((rc = p_count(p, *n_kv, GGUF_MIN_KV_BYTES, "key/value count")) != MN_OK) return rc;
    /* the tensor infos come after the key/values: a loose bound now, exact later */
    return p_count(p, *n_tensors, GGUF_MIN_TENSOR_BYTES, "tensor count");
}

static int parse_kv(Gguf *g, Parser *p, int64_t i) {
    int rc;
    char buf[112];
    GgufStr key;
    snprintf(p->where, sizeof p->where, "key/value #%" PRId64, i);
    if ((rc = p_str(p, "key", &key)) != MN_OK) return rc;
    printable(buf, sizeof buf, key.data, key.len);
    snprintf(p->where, sizeof p->where, "key '%s'", buf);
    if (memchr(key.data, '\0', key.len) != NULL)
        return mn_err_set(p->err, MN_EFORMAT, "%s: key contains a NUL byte", p->where);
    uint64_t h = name_hash(key.data, key.len);
    if (gguf_index_find(&g->kv_index, key.data, key.len, h) >= 0)
        return mn_err_set(p->err, MN_EFORMAT, "%s: duplicate key", p->where);

    if ((rc = grow((void **)&g->kvs, &g->cap_kv, (uint64_t)i + 1, sizeof *g->kvs)) != MN_OK) return rc;
    GgufKv *kv = &g->kvs[i];
    memset(kv, 0, sizeof *kv);
    if ((kv->key = mn_strndup(key.data, (size_t)key.len)) == NULL) return MN_ENOMEM;
    kv->key_len = key.len;
    g->n_kv = i + 1; /* kv is now owned by g (freed on failure) */
    if ((rc = gguf_index_insert(&g->kv_index, kv->key, kv->key_len, h, i)) != MN_OK) return rc;

    if ((rc = p_u32(p, "value type", &kv->type)) != MN_OK) return rc;
    kv->value_off = p->pos;
    if ((rc = p_skip_value(p, kv->type, 0)) != MN_OK) return rc;
    kv->value_bytes = p->pos - kv->value_off;
    if (kv->type != GGUF_TYPE_ARRAY) return MN_OK;

    const uint8_t *v = p->base + kv->value_off;
    kv->elem_type = le32(v);
    kv->n_elems = le64(v + 4);
    if (kv->elem_type == GGUF_TYPE_STRING) {
        /* index for O(1) element access; n_elems * 8 <= value_bytes, so small */
        kv->str_offs = mn_malloc((size_t)kv->n_elems * sizeof *kv->str_offs);
        if (kv->str_offs == NULL) return MN_ENOMEM;
        uint64_t off = kv->value_off + 12;
        for (uint64_t j = 0; j < kv->n_elems; j++) {
            kv->str_offs[j] = off;
            off += 8 + le64(p->base + off);
        }
    }
    return MN_OK;
}

static int parse_alignment(Gguf *g, MnErr *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(g, "general.alignment");
    if (i < 0) return MN_OK;
    const GgufKv *kv = &g->kvs[i];
    if (kv->type != GGUF_TYPE_UINT32)
        return mn_err_set(err, MN_EFORMAT, "key 'general.alignment': type %s, expected u32",
                          type_name(kv->type));
    uint32_t a = le32(g->base + kv->value_off);
    if (!is_pow2(a))
        return mn_err_set(err, MN_EFORMAT, "key 'general.alignment': %" PRIu32 " is not a power of two", a);
    g->alignment = a;
    return MN_OK;
}

static int parse_tensor_info(Gguf *g, Parser *p, int64_t i) {
    int rc;
    GgufStr name;
    snprintf(p->where, sizeof p->where, "tensor #%" PRId64, i);
    if ((rc = p_str(p, "tensor name", &name)) != MN_OK) return rc;
    char buf[112];
    printable(buf, sizeof buf, name.data, name.len);
    snprintf(p->where, sizeof p->where, "tensor '%s'", buf);
    if (memchr(name.data, '\0', name.len) != NULL)
        return mn_err_set(p->err, MN_EFORMAT, "%s: name contains a NUL byte", p->where);
    uint64_t h = name_hash(name.data, name.len);
    if (gguf_index_find(&g->tensor_index, name.data, name.len, h) >= 0)
        return mn_err_set(p->err, MN_EFORMAT, "%s: duplicate tensor name", p->where);

    if ((rc = grow((void **)&g->tensors, &g->cap_tensors, (uint64_t)i + 1, sizeof *g->tensors)) != MN_OK)
        return rc;
    GgufTensor *t = &g->tensors[i];
    memset(t, 0, sizeof *t);
    char *owned = mn_strndup(name.data, (size_t)name.len);
    if (owned == NULL) return MN_ENOMEM;
    t->name = owned;
    g->n_tensors = i + 1;
    if ((rc = gguf_index_insert(&g->tensor_index, owned, name.len, h, i)) != MN_OK) return rc;

    if ((rc = p_u32(p, "n_dims", &t->n_dims)) != MN_OK) return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return mn_err_set(p->err, MN_EFORMAT, "%s: %" PRIu32 " dimensions (must be 1 to %d)", p->where,
                          t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((rc = p_u64(p, "dimension", &t->ne[d])) != MN_OK) return rc;
    if ((rc = p_u32(p, "tensor type", &t->type)) != MN_OK) return rc;
    if ((rc = p_u64(p, "tensor offset", &t->offset)) != MN_OK) return rc;
    if ((rc = tensor_size(buf, t->type, t->n_dims, t->ne, &t->n_bytes, p->err)) != MN_OK) return rc;
    if (t->offset % g->alignment != 0)
        return mn_err_set(p->err, MN_EFORMAT,
                          "%s: data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                          p->where, t->offset, g->alignment);
    return MN_OK;
}

typedef struct Extent {
    uint64_t start, end;
    int64_t idx;
} Extent;

static int extent_cmp(const void *a, const void *b) {
    const Extent *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Data bounds, pointers and overlaps, once the data section is known. */
static int check_tensor_data(Gguf *g, MnErr *err) {
    if (g->n_tensors == 0) return MN_OK;
    if (g->data_offset > g->n_bytes)
        return mn_err_set(err, MN_EFORMAT,
                          "file truncated: data section starts at %" PRIu64 " but the file has %" PRIu64
                          " bytes",
                          g->data_offset, g->n_bytes);
    uint64_t data_bytes = g->n_bytes - g->data_offset;
    Extent *ext = mn_calloc((size_t)g->n_tensors, sizeof *ext);
    if (ext == NULL) return MN_ENOMEM;
    int rc = MN_OK;
    int64_t n_ext = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        GgufTensor *t = &g->tensors[i];
        if (t->offset > data_bytes || t->n_bytes > data_bytes - t->offset) {
            rc = mn_err_set(err, MN_EFORMAT,
                            "tensor '%s': data [%" PRIu64 ", +%" PRIu64 ") extends past the end of the "
                            "file (data section holds %" PRIu64 " bytes): file truncated?",
                            t->name, t->offset, t->n_bytes, data_bytes);
            goto out;
        }
        t->data = g->base + g->data_offset + t->offset;
        if (t->n_bytes > 0) ext[n_ext++] = (Extent){t->offset, t->offset + t->n_bytes, i};
    }
    qsort(ext, (size_t)n_ext, sizeof *ext, extent_cmp);
    for (int64_t k = 1; k < n_ext; k++) {
        if (ext[k].start < ext[k - 1].end) {
            rc = mn_err_set(err, MN_EFORMAT, "tensor '%s': data overlaps tensor '%s'",
                            g->tensors[ext[k].idx].name, g->tensors[ext[k - 1].idx].name);
            goto out;
        }
    }
out:
    mn_free(ext);
    return rc;
}

/* Parse the header and metadata, and unless is_metadata_only the tensor
 * infos with every check of their types and layout. */
static int gguf_parse(Gguf *g, bool is_metadata_only, MnErr *err) {
    Parser p = {.base = g->base, .size = g->n_bytes, .pos = 0, .err = err};
    uint64_t n_tensors, n_kv;
    int rc = parse_header(g, &p, &n_tensors, &n_kv);
    if (rc != MN_OK) return rc;
    for (uint64_t i = 0; i < n_kv; i++)
        if ((rc = parse_kv(g, &p, (int64_t)i)) != MN_OK) return rc;
    if ((rc = parse_alignment(g, err)) != MN_OK) return rc;
    if (is_metadata_only) return MN_OK;
    snprintf(p.where, sizeof p.where, "tensor infos");
    if ((rc = p_count(&p, n_tensors, GGUF_MIN_TENSOR_BYTES, "tensor count")) != MN_OK) return rc;
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((rc = parse_tensor_info(g, &p, (int64_t)i)) != MN_OK) return rc;
    /* p.pos <= file size < 2^63 and alignment <= 2^31: no overflow */
    g->data_offset = (p.pos + g->alignment - 1) / g->alignment * g->alignment;
    return check_tensor_data(g, err);
}

/* ---- reader: API --------------------------------------------------------- */

/* Release an image open_path made. */
static void image_free(void *map, size_t map_bytes, GgufHold hold) {
    if (map == NULL) return;
    if (hold == GGUF_READ) mn_huge_free(map, map_bytes);
    else munmap(map, map_bytes);
}

/* Make the Gguf over data and validate it; it owns map (freed on failure
 * too). */
static int open_image(const void *data, size_t n_bytes, void *map, size_t map_bytes, GgufHold hold,
                      bool is_metadata_only, Gguf **out, MnErr *err) {
    Gguf *g = mn_calloc(1, sizeof *g);
    if (g == NULL) {
        image_free(map, map_bytes, hold);
        return mn_err_set(err, MN_ENOMEM, "out of memory opening GGUF");
    }
    g->base = data;
    g->n_bytes = n_bytes;
    g->map = map;
    g->map_bytes = map_bytes;
    g->hold = hold;
    int rc = gguf_parse(g, is_metadata_only, err);
    if (rc != MN_OK) {
        if (rc == MN_ENOMEM) mn_err_set(err, MN_ENOMEM, "out of memory reading GGUF metadata");
        gguf_close(g);
        return rc;
    }
    *out = g;
    return MN_OK;
}

int gguf_open_memory(const void *data, size_t n_bytes, Gguf **out, MnErr *err) {
    assert(out != NULL);
    *out = NULL;
    if (data == NULL && n_bytes != 0) return mn_err_set(err, MN_EINVAL, "gguf_open_memory: NULL data");
    static const uint8_t empty[1];
    return open_image(data ? data : empty, n_bytes, NULL, 0, GGUF_MAP, false, out, err);
}

/* The n_bytes of fd read into huge-page memory, read-only once filled:
 * *out and *cap (for mn_huge_free), or an error naming path. */
static int read_whole(int fd, const char *path, size_t n_bytes, void **out, size_t *cap, MnErr *err) {
    uint8_t *buf = mn_huge_alloc(n_bytes, cap);
    if (buf == NULL)
        return mn_err_set(err, MN_ENOMEM, "%s: no memory for its %zu MiB (--mmap maps the file instead)", path,
                          n_bytes >> 20);
    size_t done = 0;
    while (done < n_bytes) {
        size_t want = n_bytes - done < ((size_t)1 << 30) ? n_bytes - done : (size_t)1 << 30;
        ssize_t got = pread(fd, buf + done, want, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            int e = got < 0 ? errno : 0;
            mn_huge_free(buf, *cap);
            if (got == 0)
                return mn_err_set(err, MN_EIO, "%s: the file ended at byte %zu of %zu while it was read", path, done,
                                  n_bytes);
            return mn_err_set(err, MN_EIO, "%s: read failed at byte %zu: %s", path, done, strerror(e));
        }
        done += (size_t)got;
    }
    if (mprotect(buf, *cap, PROT_READ) != 0) { /* weights are never written: make that a fault */
        int e = errno;
        mn_huge_free(buf, *cap);
        return mn_err_set(err, MN_EIO, "%s: mprotect failed: %s", path, strerror(e));
    }
    *out = buf;
    return MN_OK;
}

static int open_path(const char *path, GgufHold hold, bool is_metadata_only, Gguf **out, MnErr *err) {
    assert(path != NULL && out != NULL);
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return mn_err_set(err, e == ENOENT ? MN_ENOTFOUND : MN_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mn_err_set(err, MN_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mn_err_set(err, MN_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return mn_err_set(err, MN_EFORMAT, "%s: empty file, not a GGUF file", path);
    }
    size_t n_bytes = (size_t)st.st_size, map_bytes = n_bytes;
    void *map = NULL;
    if (hold == GGUF_READ) {
        int rc = read_whole(fd, path, n_bytes, &map, &map_bytes, err);
        close(fd);
        if (rc != MN_OK) return rc;
    } else {
        map = mmap(NULL, n_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        close(fd); /* the mapping keeps the file */
        if (map == MAP_FAILED) return mn_err_set(err, MN_EIO, "%s: mmap failed: %s", path, strerror(e));
    }
    int rc = open_image(map, n_bytes, map, map_bytes, hold, is_metadata_only, out, err);
    if (rc != MN_OK) mn_err_prefix(err, "%s", path);
    return rc;
}

int gguf_open(const char *path, Gguf **out, MnErr *err) { return open_path(path, GGUF_READ, false, out, err); }

int gguf_open_with(const char *path, GgufHold hold, Gguf **out, MnErr *err) {
    return open_path(path, hold, false, out, err);
}

int gguf_open_metadata(const char *path, Gguf **out, MnErr *err) {
    return open_path(path, GGUF_MAP, true, out, err);
}

void gguf_close(Gguf *g) {
    if (g == NULL) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        mn_free(g->kvs[i].key);
        mn_free(g->kvs[i].str_offs);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) mn_free((char *)g->tensors[i].name);
    mn_free(g->kvs);
    mn_free(g->tensors);
    mn_free(g->kv_index.slots);
    mn_free(g->tensor_index.slots);
    image_free(g->map, g->map_bytes, g->hold);
    mn_free(g);
}

uint32_t gguf_version(const Gguf *g) { return g->version; }
uint64_t gguf_alignment(const Gguf *g) { return g->alignment; }
uint64_t gguf_data_offset(const Gguf *g) { return g->data_offset; }
uint64_t gguf_file_bytes(const Gguf *g) { return g->n_bytes; }
const void *gguf_file_data(const Gguf *g) { return g->base; }
int64_t gguf_n_kv(const Gguf *g) { return g->n_kv; }

int64_t gguf_find_key(const Gguf *g, const char *key) {
    uint64_t len = strlen(key);
    return gguf_index_find(&g->kv_index, key, len, name_hash(key, len));
}

const char *gguf_kv_key(const Gguf *g, int64_t i) {
    assert(i >= 0 && i < g->n_kv);
    if (i < 0 || i >= g->n_kv) return NULL;
    return g->kvs[i].key;
}

GgufType gguf_kv_type(const Gguf *g, int64_t i) {
    assert(i >= 0 && i < g->n_kv);
    if (i < 0 || i >= g->n_kv) return GGUF_TYPE_UINT8; /* caller bug; keep release builds in bounds */
    return (GgufType)g->kvs[i].type;
}

/* ---- reader: typed getters ----------------------------------------------- */

static const GgufKv *kv_get(const Gguf *g, const char *key) {
    int64_t i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

/* An integer scalar of type t at p: signed types fill *s, unsigned *u. */
typedef struct IntVal {
    bool is_signed;
    int64_t s;
    uint64_t u;
} IntVal;

static bool decode_int(const uint8_t *p, uint32_t t, IntVal *v) {
    v->is_signed = true;
    switch (t) {
    case GGUF_TYPE_UINT8: v->is_signed = false; v->u = p[0]; return true;
    case GGUF_TYPE_UINT16: v->is_signed = false; v->u = le16(p); return true;
    case GGUF_TYPE_UINT32: v->is_signed = false; v->u = le32(p); return true;
    case GGUF_TYPE_UINT64: v->is_signed = false; v->u = le64(p); return true;
    case GGUF_TYPE_INT8: v->s = (int8_t)p[0]; return true;
    case GGUF_TYPE_INT16: v->s = (int16_t)le16(p); return true;
    case GGUF_TYPE_INT32: v->s = (int32_t)le32(p); return true;
    case GGUF_TYPE_INT64: v->s = (int64_t)le64(p); return true;
    default: return false;
    }
}

static int int_to_i64(const IntVal *v, int64_t *out) {
    if (v->is_signed) {
        *out = v->s;
        return MN_OK;
    }
    if (v->u > (uint64_t)INT64_MAX) return MN_EFORMAT;
    *out = (int64_t)v->u;
    return MN_OK;
}

/* Any numeric scalar (integers and floats) at p as float. */
static bool decode_f32(const uint8_t *p, uint32_t t, float *out) {
    IntVal v;
    if (t == GGUF_TYPE_FLOAT32) *out = bits_to_f32(le32(p));
    else if (t == GGUF_TYPE_FLOAT64) *out = (float)bits_to_f64(le64(p));
    else if (decode_int(p, t, &v)) *out = v.is_signed ? (float)v.s : (float)v.u;
    else return false;
    return true;
}

int gguf_get_u32(const Gguf *g, const char *key, uint32_t *out) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    IntVal v;
    if (!decode_int(g->base + kv->value_off, kv->type, &v)) return MN_EFORMAT;
    if (v.is_signed ? (v.s < 0 || v.s > (int64_t)UINT32_MAX) : v.u > UINT32_MAX) return MN_EFORMAT;
    *out = v.is_signed ? (uint32_t)v.s : (uint32_t)v.u;
    return MN_OK;
}

int gguf_get_i64(const Gguf *g, const char *key, int64_t *out) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    IntVal v;
    if (!decode_int(g->base + kv->value_off, kv->type, &v)) return MN_EFORMAT;
    return int_to_i64(&v, out);
}

int gguf_get_f32(const Gguf *g, const char *key, float *out) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64) return MN_EFORMAT;
    decode_f32(g->base + kv->value_off, kv->type, out);
    return MN_OK;
}

int gguf_get_bool(const Gguf *g, const char *key, bool *out) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    if (kv->type != GGUF_TYPE_BOOL) return MN_EFORMAT;
    *out = g->base[kv->value_off] != 0;
    return MN_OK;
}

int gguf_get_str(const Gguf *g, const char *key, GgufStr *out) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    if (kv->type != GGUF_TYPE_STRING) return MN_EFORMAT;
    out->len = le64(g->base + kv->value_off);
    out->data = (const char *)g->base + kv->value_off + 8;
    return MN_OK;
}

int gguf_get_arr(const Gguf *g, const char *key, GgufType *elem_type, uint64_t *n) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    if (kv->type != GGUF_TYPE_ARRAY) return MN_EFORMAT;
    *elem_type = (GgufType)kv->elem_type;
    *n = kv->n_elems;
    return MN_OK;
}

/* The array kv for key, with i checked: MN_OK, MN_ENOTFOUND, MN_EFORMAT
 * (not an array) or MN_ERANGE (i out of range). */
static int arr_elem(const Gguf *g, const char *key, uint64_t i, const GgufKv **out) {
    const GgufKv *kv = kv_get(g, key);
    if (kv == NULL) return MN_ENOTFOUND;
    if (kv->type != GGUF_TYPE_ARRAY) return MN_EFORMAT;
    if (i >= kv->n_elems) return MN_ERANGE;
    *out = kv;
    return MN_OK;
}

int gguf_arr_str(const Gguf *g, const char *key, uint64_t i, GgufStr *out) {
    const GgufKv *kv;
    int rc = arr_elem(g, key, i, &kv);
    if (rc != MN_OK) return rc;
    if (kv->elem_type != GGUF_TYPE_STRING) return MN_EFORMAT;
    const uint8_t *p = g->base + kv->str_offs[i];
    out->len = le64(p);
    out->data = (const char *)p + 8;
    return MN_OK;
}

int gguf_arr_f32(const Gguf *g, const char *key, uint64_t i, float *out) {
    const GgufKv *kv;
    int rc = arr_elem(g, key, i, &kv);
    if (rc != MN_OK) return rc;
    if (kv->elem_type == GGUF_TYPE_STRING || kv->elem_type == GGUF_TYPE_ARRAY || kv->elem_type == GGUF_TYPE_BOOL)
        return MN_EFORMAT;
    decode_f32(g->base + kv->value_off + 12 + i * type_bytes[kv->elem_type], kv->elem_type, out);
    return MN_OK;
}

int gguf_arr_i64(const Gguf *g, const char *key, uint64_t i, int64_t *out) {
    const GgufKv *kv;
    int rc = arr_elem(g, key, i, &kv);
    if (rc != MN_OK) return rc;
    IntVal v;
    if (kv->elem_type >= GGUF_N_TYPES || type_bytes[kv->elem_type] == 0) return MN_EFORMAT;
    if (!decode_int(g->base + kv->value_off + 12 + i * type_bytes[kv->elem_type], kv->elem_type, &v))
        return MN_EFORMAT;
    return int_to_i64(&v, out);
}

int64_t gguf_n_tensors(const Gguf *g) { return g->n_tensors; }

const GgufTensor *gguf_tensor(const Gguf *g, int64_t i) {
    assert(i >= 0 && i < g->n_tensors);
    if (i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const GgufTensor *gguf_find_tensor(const Gguf *g, const char *name) {
    uint64_t len = strlen(name);
    int64_t i = gguf_index_find(&g->tensor_index, name, len, name_hash(name, len));
    return i < 0 ? NULL : &g->tensors[i];
}

/* ---- reader: dump -------------------------------------------------------- */

static void dump_str(FILE *f, const uint8_t *p) {
    uint64_t len = le64(p);
    const uint8_t *s = p + 8;
    fputc('"', f);
    for (uint64_t i = 0; i < len && i < 64; i++) {
        if (s[i] == '"' || s[i] == '\\') fprintf(f, "\\%c", s[i]);
        else if (s[i] >= 0x20 && s[i] < 0x7f) fputc(s[i], f);
        else fprintf(f, "\\x%02x", s[i]);
    }
    fputs(len > 64 ? "\"..." : "\"", f);
}

/* One validated value at p; arrays show their first few elements. */
static void dump_value(FILE *f, const uint8_t *p, uint32_t type, int depth) {
    IntVal v;
    switch (type) {
    case GGUF_TYPE_FLOAT32: fprintf(f, "%.9g", (double)bits_to_f32(le32(p))); return;
    case GGUF_TYPE_FLOAT64: fprintf(f, "%.17g", bits_to_f64(le64(p))); return;
    case GGUF_TYPE_BOOL: fputs(p[0] ? "true" : "false", f); return;
    case GGUF_TYPE_STRING: dump_str(f, p); return;
    case GGUF_TYPE_ARRAY: break;
    default:
        decode_int(p, type, &v);
        if (v.is_signed) fprintf(f, "%" PRId64, v.s);
        else fprintf(f, "%" PRIu64, v.u);
        return;
    }
    uint32_t et = le32(p);
    uint64_t n = le64(p + 4), off = 12;
    fprintf(f, "arr[%s, %" PRIu64 "]", type_name(et), n);
    if (depth > 1) return;
    fputs(" [", f);
    for (uint64_t i = 0; i < n && i < 5; i++) {
        if (i > 0) fputs(", ", f);
        dump_value(f, p + off, et, depth + 1);
        off += value_bytes_at(p + off, et);
    }
    fputs(n > 5 ? ", ...]" : "]", f);
}

void gguf_dump(const Gguf *g, FILE *f) {
    fprintf(f, "GGUF v%" PRIu32 ": %" PRIu64 " bytes, alignment %" PRIu64 ", data at %" PRIu64
               ", %" PRId64 " key/values, %" PRId64 " tensors\n",
            g->version, g->n_bytes, g->alignment, g->data_offset, g->n_kv, g->n_tensors);
    char buf[112];
    for (int64_t i = 0; i < g->n_kv; i++) {
        const GgufKv *kv = &g->kvs[i];
        fprintf(f, "  kv %3" PRId64 " %-40s %-4s = ", i, printable(buf, sizeof buf, kv->key, kv->key_len),
                type_name(kv->type));
        dump_value(f, g->base + kv->value_off, kv->type, 0);
        fputc('\n', f);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const GgufTensor *t = &g->tensors[i];
        const char *tn = ttype_ggml_name(t->type);
        fprintf(f, "  tensor %3" PRId64 " %-32s %-5s [", i, printable(buf, sizeof buf, t->name, strlen(t->name)),
                tn ? tn : "?");
        for (uint32_t d = 0; d < t->n_dims; d++) fprintf(f, d ? ", %" PRIu64 : "%" PRIu64, t->ne[d]);
        fprintf(f, "] offset %" PRIu64 " bytes %" PRIu64 "\n", t->offset, t->n_bytes);
    }
}

/* ---- writer -------------------------------------------------------------- */

typedef struct WriterKv {
    char *key;            /* owned */
    uint32_t type;
    uint8_t *value;       /* encoded value, owned */
    uint64_t value_bytes;
} WriterKv;

typedef struct WriterTensor {
    char *name;           /* owned */
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    const void *data;     /* borrowed until gguf_writer_write returns */
    uint64_t n_bytes;
    uint64_t offset;      /* assigned by gguf_writer_write */
} WriterTensor;

struct GgufWriter {
    uint32_t version;
    WriterKv *kvs;
    uint64_t n_kv, cap_kv;
    WriterTensor *tensors;
    uint64_t n_tensors, cap_tensors;
    int failed;           /* first error of an add (sticky), MN_OK if none */
    MnErr err;            /* its message */
};

GgufWriter *gguf_writer_new(void) {
    GgufWriter *w = mn_calloc(1, sizeof *w);
    if (w != NULL) w->version = 3;
    return w;
}

void gguf_writer_free(GgufWriter *w) {
    if (w == NULL) return;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        mn_free(w->kvs[i].key);
        mn_free(w->kvs[i].value);
    }
    for (uint64_t i = 0; i < w->n_tensors; i++) mn_free(w->tensors[i].name);
    mn_free(w->kvs);
    mn_free(w->tensors);
    mn_free(w);
}

/* Remember the first failure so gguf_writer_write reports it. */
__attribute__((format(printf, 3, 4)))
static int writer_fail(GgufWriter *w, int code, const char *fmt, ...) {
    if (w->failed == MN_OK) {
        w->failed = code;
        w->err.code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err.msg, sizeof w->err.msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void gguf_writer_set_version(GgufWriter *w, uint32_t version) {
    if (version != 2 && version != 3) {
        writer_fail(w, MN_EINVAL, "gguf writer: version %" PRIu32 " is not 2 or 3", version);
        return;
    }
    w->version = version;
}

/* Take ownership of value (value_bytes encoded bytes) under key. */
static int writer_add_owned(GgufWriter *w, const char *key, uint32_t type, uint8_t *value,
                            uint64_t value_bytes) {
    int rc = MN_OK;
    if (key == NULL) {
        rc = writer_fail(w, MN_EINVAL, "gguf writer: NULL key");
        goto fail;
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            rc = writer_fail(w, MN_EINVAL, "gguf writer: duplicate key '%s'", key);
            goto fail;
        }
    }
    if (grow((void **)&w->kvs, &w->cap_kv, w->n_kv + 1, sizeof *w->kvs) != MN_OK) goto nomem;
    char *k = mn_strdup(key);
    if (k == NULL) goto nomem;
    w->kvs[w->n_kv++] = (WriterKv){k, type, value, value_bytes};
    return MN_OK;
nomem:
    rc = writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding '%s'", key);
fail:
    mn_free(value);
    return rc;
}

static int writer_add_copy(GgufWriter *w, const char *key, uint32_t type, const void *value,
                           uint64_t value_bytes) {
    if (value_bytes > SIZE_MAX) return writer_fail(w, MN_ENOMEM, "gguf writer: '%s' is too large", key);
    uint8_t *v = mn_malloc((size_t)value_bytes);
    if (v == NULL) return writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding '%s'", key);
    memcpy(v, value, (size_t)value_bytes);
    return writer_add_owned(w, key, type, v, value_bytes);
}

int gguf_writer_add_u32(GgufWriter *w, const char *key, uint32_t v) {
    uint8_t b[4];
    put32(b, v);
    return writer_add_copy(w, key, GGUF_TYPE_UINT32, b, 4);
}

int gguf_writer_add_i32(GgufWriter *w, const char *key, int32_t v) {
    uint8_t b[4];
    put32(b, (uint32_t)v);
    return writer_add_copy(w, key, GGUF_TYPE_INT32, b, 4);
}

int gguf_writer_add_f32(GgufWriter *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t b[4];
    put32(b, u);
    return writer_add_copy(w, key, GGUF_TYPE_FLOAT32, b, 4);
}

int gguf_writer_add_bool(GgufWriter *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return writer_add_copy(w, key, GGUF_TYPE_BOOL, &b, 1);
}

int gguf_writer_add_str(GgufWriter *w, const char *key, const char *v) {
    if (v == NULL) return writer_fail(w, MN_EINVAL, "gguf writer: NULL string for '%s'", key ? key : "?");
    size_t len = strlen(v);
    uint8_t *b = mn_malloc(8 + len);
    if (b == NULL) return writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding '%s'", key ? key : "?");
    put64(b, len);
    memcpy(b + 8, v, len);
    return writer_add_owned(w, key, GGUF_TYPE_STRING, b, 8 + len);
}

/* An array of n fixed-size elements taken from src (host floats/ints). */
static int writer_add_arr_fixed(GgufWriter *w, const char *key, uint32_t et, const void *src, uint64_t n) {
    uint64_t eb = type_bytes[et];
    if (n > (SIZE_MAX - 12) / eb) return writer_fail(w, MN_ENOMEM, "gguf writer: array '%s' is too large", key ? key : "?");
    uint8_t *b = mn_malloc((size_t)(12 + n * eb));
    if (b == NULL) return writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding '%s'", key ? key : "?");
    put32(b, et);
    put64(b + 4, n);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u; /* f32 and i32 are both 4 bytes */
        memcpy(&u, (const uint8_t *)src + i * 4, 4);
        put32(b + 12 + i * 4, u);
    }
    return writer_add_owned(w, key, GGUF_TYPE_ARRAY, b, 12 + n * eb);
}

int gguf_writer_add_arr_f32(GgufWriter *w, const char *key, const float *v, uint64_t n) {
    return writer_add_arr_fixed(w, key, GGUF_TYPE_FLOAT32, v, n);
}

int gguf_writer_add_arr_i32(GgufWriter *w, const char *key, const int32_t *v, uint64_t n) {
    return writer_add_arr_fixed(w, key, GGUF_TYPE_INT32, v, n);
}

int gguf_writer_add_arr_str(GgufWriter *w, const char *key, const char *const *v, uint64_t n) {
    const char *k = key ? key : "?";
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (v[i] == NULL) return writer_fail(w, MN_EINVAL, "gguf writer: NULL string in array '%s'", k);
        total += 8 + strlen(v[i]); /* no overflow: the strings are in memory */
    }
    if (total > SIZE_MAX) return writer_fail(w, MN_ENOMEM, "gguf writer: array '%s' is too large", k);
    uint8_t *b = mn_malloc((size_t)total);
    if (b == NULL) return writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding '%s'", k);
    put32(b, GGUF_TYPE_STRING);
    put64(b + 4, n);
    uint64_t off = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]);
        put64(b + off, len);
        memcpy(b + off + 8, v[i], len);
        off += 8 + len;
    }
    return writer_add_owned(w, key, GGUF_TYPE_ARRAY, b, total);
}

int gguf_writer_add_raw(GgufWriter *w, const char *key, GgufType type, const void *value,
                        uint64_t value_bytes) {
    const char *k = key ? key : "?";
    MnErr perr = {0};
    Parser p = {.base = value, .size = value_bytes, .pos = 0, .err = &perr};
    snprintf(p.where, sizeof p.where, "gguf writer: key '%.100s'", k);
    if (value == NULL && value_bytes != 0) return writer_fail(w, MN_EINVAL, "gguf writer: NULL value for '%s'", k);
    static const uint8_t empty[1];
    if (value == NULL) p.base = empty;
    int rc = p_skip_value(&p, (uint32_t)type, 0);
    if (rc == MN_OK && p.pos != value_bytes) {
        rc = MN_EINVAL;
        snprintf(perr.msg, sizeof perr.msg, "gguf writer: key '%.100s': %" PRIu64 " trailing bytes after the value",
                 k, value_bytes - p.pos);
    }
    if (rc != MN_OK) return writer_fail(w, MN_EINVAL, "%s", perr.msg);
    return writer_add_copy(w, key, (uint32_t)type, value, value_bytes);
}

int gguf_writer_copy_kv(GgufWriter *w, const Gguf *src, int64_t i) {
    if (i < 0 || i >= src->n_kv) return writer_fail(w, MN_EINVAL, "gguf writer: copy of key/value %" PRId64 " out of range", i);
    const GgufKv *kv = &src->kvs[i];
    return writer_add_copy(w, kv->key, kv->type, src->base + kv->value_off, kv->value_bytes);
}

int gguf_writer_add_tensor(GgufWriter *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, const void *data, uint64_t n_bytes) {
    if (name == NULL) return writer_fail(w, MN_EINVAL, "gguf writer: NULL tensor name");
    MnErr e = {0};
    uint64_t want;
    int rc = tensor_size(name, type, n_dims, ne, &want, &e);
    if (rc != MN_OK) return writer_fail(w, rc == MN_EUNSUPPORTED ? rc : MN_EINVAL, "gguf writer: %s", e.msg);
    if (want != n_bytes) {
        snprintf(e.msg, sizeof e.msg, "tensor '%.100s': %" PRIu64 " bytes given, type and shape need %" PRIu64,
                 name, n_bytes, want);
        return writer_fail(w, MN_EINVAL, "gguf writer: %s", e.msg);
    }
    if (data == NULL && n_bytes != 0) return writer_fail(w, MN_EINVAL, "gguf writer: tensor '%s' has no data", name);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return writer_fail(w, MN_EINVAL, "gguf writer: duplicate tensor name '%s'", name);
    if (grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof *w->tensors) != MN_OK)
        return writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    WriterTensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    if ((t->name = mn_strdup(name)) == NULL)
        return writer_fail(w, MN_ENOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    t->data = data;
    t->n_bytes = n_bytes;
    w->n_tensors++;
    return MN_OK;
}

/* Buffered output with a sticky error and a running position. */
typedef struct Out {
    FILE *f;
    uint64_t pos;
    int err_no;           /* errno of the first failure, 0 if none */
} Out;

static void out_bytes(Out *o, const void *p, uint64_t n) {
    if (o->err_no != 0 || n == 0) return;
    if (fwrite(p, 1, (size_t)n, o->f) != (size_t)n) {
        o->err_no = errno ? errno : EIO;
        return;
    }
    o->pos += n;
}

static void out_u32(Out *o, uint32_t v) {
    uint8_t b[4];
    put32(b, v);
    out_bytes(o, b, 4);
}

static void out_u64(Out *o, uint64_t v) {
    uint8_t b[8];
    put64(b, v);
    out_bytes(o, b, 8);
}

static void out_str(Out *o, const char *s) {
    uint64_t len = strlen(s);
    out_u64(o, len);
    out_bytes(o, s, len);
}

static void out_pad(Out *o, uint64_t alignment) {
    static const uint8_t zeros[4096];
    uint64_t n = (alignment - o->pos % alignment) % alignment;
    while (n > 0) {
        uint64_t k = n < sizeof zeros ? n : sizeof zeros;
        out_bytes(o, zeros, k);
        n -= k;
    }
}

/* general.alignment among the added key/values, else the default. */
static int writer_alignment(const GgufWriter *w, uint64_t *out, MnErr *err) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) continue;
        if (w->kvs[i].type != GGUF_TYPE_UINT32)
            return mn_err_set(err, MN_EINVAL, "gguf writer: general.alignment must be a u32");
        uint32_t a = le32(w->kvs[i].value);
        if (!is_pow2(a))
            return mn_err_set(err, MN_EINVAL, "gguf writer: general.alignment %" PRIu32 " is not a power of two", a);
        *out = a;
    }
    return MN_OK;
}

int gguf_writer_write(GgufWriter *w, const char *path, MnErr *err) {
    if (w->failed != MN_OK) return mn_err_set(err, w->failed, "%s", w->err.msg);
    uint64_t alignment;
    int rc = writer_alignment(w, &alignment, err);
    if (rc != MN_OK) return rc;
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        uint64_t padded = w->tensors[i].n_bytes + (alignment - w->tensors[i].n_bytes % alignment) % alignment;
        if (padded < w->tensors[i].n_bytes || off > UINT64_MAX - padded)
            return mn_err_set(err, MN_EINVAL, "gguf writer: tensor data too large");
        off += padded;
    }

    /* the file is written beside path and renamed over it: never over a
     * device, a directory or anything else that is not a regular file
     * (as root, `-o /dev/null` replaced the device with a file) */
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return mn_err_set(err, MN_EINVAL, "%s: exists and is not a regular file; not replacing it", path);
    size_t path_len = strlen(path);
    char *tmp = mn_malloc(path_len + 5);
    if (tmp == NULL) return mn_err_set(err, MN_ENOMEM, "gguf writer: out of memory");
    memcpy(tmp, path, path_len);
    memcpy(tmp + path_len, ".tmp", 5);
    Out o = {.f = fopen(tmp, "wb")};
    if (o.f == NULL) {
        rc = mn_err_set(err, MN_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        mn_free(tmp);
        return rc;
    }
    setvbuf(o.f, NULL, _IOFBF, 1 << 20);

    out_bytes(&o, GGUF_MAGIC, 4);
    out_u32(&o, w->version);
    out_u64(&o, w->n_tensors);
    out_u64(&o, w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        out_str(&o, w->kvs[i].key);
        out_u32(&o, w->kvs[i].type);
        out_bytes(&o, w->kvs[i].value, w->kvs[i].value_bytes);
    }
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const WriterTensor *t = &w->tensors[i];
        out_str(&o, t->name);
        out_u32(&o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) out_u64(&o, t->ne[d]);
        out_u32(&o, t->type);
        out_u64(&o, t->offset);
    }
    /* llama.cpp and gguf-py pad before the data only when there is data */
    if (w->n_tensors > 0) out_pad(&o, alignment);
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        out_bytes(&o, w->tensors[i].data, w->tensors[i].n_bytes);
        out_pad(&o, alignment);
    }
    if (o.err_no == 0 && fflush(o.f) != 0) o.err_no = errno ? errno : EIO;
    if (o.err_no == 0 && fsync(fileno(o.f)) != 0 && errno != EINVAL) o.err_no = errno;
    if (fclose(o.f) != 0 && o.err_no == 0) o.err_no = errno ? errno : EIO;
    if (o.err_no == 0 && rename(tmp, path) != 0) {
        rc = mn_err_set(err, MN_EIO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        unlink(tmp);
    } else if (o.err_no != 0) {
        rc = mn_err_set(err, MN_EIO, "%s: write failed: %s", tmp, strerror(o.err_no));
        unlink(tmp);
    }
    mn_free(tmp);
    return rc;
}
