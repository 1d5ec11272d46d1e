/* tier_redis.c — the shared tier: runs in a Redis server or a Redis
 * Cluster, through the client of redis_cluster.h (hiredis underneath).
 *
 * The tier below disk (--redis-tier URL), or below RAM or the pool without
 * one. Several mnemo instances on one Redis share it: a conversation that
 * returns on another instance finds its history there by the same chain
 * hashes, since a block's hash already names its model (fingerprint), its
 * KV format and its tenant (namespace id) besides its tokens (index.h).
 * The core (tier.c) keeps what this instance knows of the store — the runs
 * it put and the runs tier_redis_probe found others put — and this file
 * moves bytes: a put writes a run's values, a restore reads them back,
 * layer by layer, pipelined, and each value proves itself on arrival
 * (header and checksum) before one byte of it reaches the pool.
 *
 * Redis decides what it keeps (its maxmemory policy, or --redis-ttl): the
 * core's budget only bounds what this instance remembers, and forgetting a
 * run (eviction, expiry, reset) never deletes it from the store. A value
 * that is gone when read is a miss (MN_ENOTFOUND: the core drops the run,
 * the engine recomputes); a value that fails its check is deleted from the
 * store, so no instance reads it again, and counted (MN_ECHECKSUM).
 *
 * Owner: the mover thread, through the core; nothing locks. The client
 * (its connections), the value buffer and the scratch arrays are used by
 * one call at a time. hiredis (0.14) allocates replies through its own
 * malloc, not mn_malloc, and aborts when that fails.
 *
 * KEYS AND VALUES, format versions 1 (a run stored as K/V in every layer)
 * and 2 (a run with layers stored as hidden states: docs/DESIGN.md,
 * "Hidden-state restore"). All integers little-endian; hashes in their
 * canonical 16 bytes, written in keys as 32 lower-case hex digits.
 *
 * A run of n blocks (consecutive blocks of one sequence) has the tag T =
 * XXH3-128 of its n block hashes in order (16n bytes); a version 2 run,
 * of those and its hidden-layer mask M (8 bytes: bit l set when layer l <
 * 64 is stored as hidden states; later layers are always K/V). Equal runs
 * put by two instances get equal keys and overwrite each other with equal
 * bytes; the same blocks stored with another layer plan get other keys.
 * A run is stored as one value per layer (one key per layer extent:
 * restores read faster that way than a run's single value, see
 * docs/OPERATIONS.md, "The Redis tier's key layout"):
 *     mnemo:kv1:F:N:{T}:L    layer L (decimal) of the run, as K/V or as
 *                            hidden states ("kv1" names the key scheme)
 * where F is the first 16 hex digits of the model fingerprint and N those
 * of the namespace id (index_namespace_id; zeros when not known). The
 * block hashes already bind every value to its model and tenant; F and N
 * let an operator find (SCAN MATCH) a model's or a tenant's keys. All keys
 * of a run share the hash tag {T}, so a Redis Cluster keeps a run on one
 * node. Each block of the run also has a pointer, by which any instance
 * finds the run from the block's hash (and its request's namespace):
 *     mnemo:blk1:F:N:H       the block with hash H
 *
 * Layer value (80 + 16n + n*B bytes, B the layer's block size below):
 *     offset size  field
 *          0    8  magic "MNEMOKVL"
 *          8    4  format version: 1, or 2 for every layer of a run with
 *                  hidden layers
 *         12    4  n, blocks in the run (1 <= n <= 65536)
 *         16    4  L, this value's layer
 *         20    4  n_layer
 *         24    8  B, bytes of one block in this layer: block_bytes (K
 *                  then V), or hidden_bytes (the block's hidden rows)
 *         32    4  KV format id (index_kv_format)
 *         36    4  representation: 0 K/V, 1 hidden states (0 in version 1)
 *         40   16  model fingerprint
 *         56   16  T, the run's tag
 *         72 16*n  the block hashes in run order
 *     72+16n  n*B  block i: the bytes of layer L of its pool slot
 *                  verbatim (kvpool_k, or kvpool_h for hidden states), at
 *                  72 + 16n + i*B
 *        end    8  XXH3-64, seed 0, of every earlier byte of the value
 * Pointer value (64 bytes in version 1, 72 in version 2):
 *          0    8  magic "MNEMOBLK"
 *          8    4  format version, 1 or 2
 *         12    4  n, blocks in the run
 *         16    4  i, this block's index in the run (< n)
 *         20    4  zero
 *         24   16  H, the block's hash (the key's)
 *         40   16  T, the run's tag
 *   (version 2 only)
 *         56    8  M, the run's hidden-layer mask (not 0)
 *        end    8  XXH3-64, seed 0, of every earlier byte
 * A run stored as K/V is written in version 1 exactly as before version 2
 * existed, so instances of either version share such runs; an instance
 * that knows only version 1 takes a version 2 pointer for damage (and
 * deletes it: a miss for the others until the run is put again).
 *
 * Reply-memory entries (reply_mem.h) are shared too, keyed by their text:
 *     mnemo:reply1:F:N:X     X = XXH3-128 of the reply's text
 * Reply value (48 + text_len + 4*n_ids bytes):
 *          0    8  magic "MNEMORPL"
 *          8    4  format version, 1
 *         12    4  text_len (<= 16 MiB)
 *         16    4  n_ids (<= 4 Mi)
 *         20    4  zero
 *         24   16  the entry's prefix key (replymem_prefix_key)
 *         40  text_len  the text
 *           4*n_ids  the generated ids, int32 each
 *        end    8  XXH3-64, seed 0, of every earlier byte of the value
 * The latest entry for a text wins; it is used only where its prefix key
 * matches, as any reply-memory entry.
 *
 * Validity. A layer value is used only when its length is that of n
 * blocks, its magic, version, checksum, n, L, representation, n_layer, B,
 * KV format, fingerprint and tag are the ones expected (the pointer's M
 * says which layers are hidden, so a reader never takes hidden rows for
 * K/V or the reverse), and its block hashes begin with the hashes this
 * instance knows the run by. A pointer is used
 * only when its length, magic, version and checksum hold, H is its key's
 * hash and i < n. Anything else is never used; a value is deleted only
 * when damaged (its magic or checksum fails), not when intact but not
 * the one expected (another format, run or plan). With --redis-ttl S every key is written with
 * EX S, and each use of a run (a restore, a turn's end) renews its keys.
 * A put writes the layer values before the pointers, on one connection, so
 * a pointer never names a run whose values were not written first.
 *
 * Finding runs others put (tier_redis_probe): a request's blocks that this
 * instance does not hold are looked up by their pointers (pipelined GETs);
 * the runs they name are checked for all their layer values (one EXISTS
 * per run: its keys share a slot) and adopted into the core as the part of
 * the run the request names, with the layer plan they were stored with (a
 * reader restores a run by its stored plan, whatever its own; one that
 * keeps no hidden states — no hidden_bytes — does not adopt a run with
 * hidden layers: a miss, recomputed). That part is always the run's first blocks:
 * a block's hash names every token before it, so a sequence that holds
 * block i of a run holds blocks 0..i-1 of it at the positions before.
 *
 * A Redis Cluster (--redis-cluster) stores the same keys and values: the
 * client (redis_cluster.c) sends each command to the node of its key's
 * slot, follows MOVED and ASK, and pipelines per node. A run's keys share
 * the hash tag {T}, so a restore's GETs of one run go to one node; the
 * pointers spread over the nodes. A value in a slot being migrated is
 * read wherever the slot's owner sends the client (ASK); an EXISTS over a
 * run's keys split by a migration answers TRYAGAIN, and the run is then
 * not adopted (a miss, recomputed).
 *
 * Errors. A connection that fails or times out (connect, each read and
 * write: timeout_ms; in a cluster, any node's) is closed, the call returns
 * MN_EIO and the core enters its error state; the mover resets the tier
 * (reconnects: a cluster's slot map is read again) with a back-off
 * (ops.is_retried), and the reset forgets every run known (the store may
 * have restarted empty). A Redis error reply to a put: "OOM" (maxmemory
 * reached under noeviction) is MN_EFULL, the tier keeps working; any other
 * (CLUSTERDOWN too) is MN_EIO. AUTH and SELECT run on every (re)connection.
 * The URL's credentials appear in no log line and no message: `shown` is
 * the URL without them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/mem.h"
#include "cache/redis_cluster.h"
#include "cache/tier_impl.h"

/* ---- types --------------------------------------------------------------- */

#define REDIS_FORMAT_VERSION 1u /* runs stored as K/V in every layer */
#define REDIS_FORMAT_HIDDEN 2u  /* runs with layers stored as hidden states */
#define REDIS_VALUE_HEAD 72u   /* layer value bytes before the hashes */
#define REDIS_PTR_BYTES 64u    /* a version 1 pointer */
#define REDIS_PTR2_BYTES 72u   /* a version 2 pointer (with the run's hidden layers) */
#define REDIS_MAX_RUN 65536    /* blocks in one stored run, at most */
#define REDIS_DEFAULT_TIMEOUT_MS 1000
/* A restore asks for this many bytes of layer values ahead (whole layers,
 * at least one): Redis copies every reply of a pipeline into its output
 * buffer before it sends the first, so a deep pipeline delays the first
 * layer and no deeper one moved more (docs/OPERATIONS.md, "The Redis
 * tier's key layout") */
#define REDIS_DEFAULT_WINDOW (512ull << 10)
#define REDIS_DEFAULT_CATALOG (1ull << 40)
#define REDIS_KEY_MAX 128      /* "mnemo:kv1:" + 16 + ":" + 16 + ":{" + 32 + "}:" + layer digits */
#define REDIS_SCOPE_LEN 34     /* "FFFFFFFFFFFFFFFF:NNNNNNNNNNNNNNNN" + NUL */

/* run->data: which stored run a core run is (part of). */
typedef struct RedisRun {
    char scope[REDIS_SCOPE_LEN]; /* its keys' model and namespace part, F:N */
    Hash128 tag;   /* T */
    int n_stored;  /* n of the stored run; the core's run names its first
                      run->n_blocks blocks (<= n_stored) */
    uint64_t hidden; /* its layers stored as hidden states (the core
                        run's TierRunInfo.hidden); 0: format version 1 */
} RedisRun;

/* A stored run a probe found, and the part of it the sequence names:
 * sequence blocks [start, end) are its blocks [0, end - start). */
typedef struct ProbeCand {
    RedisRun run;
    int start, end;
} ProbeCand;

typedef struct RedisTier {
    RedisCluster *cl;     /* the server or the cluster: its connections */
    int n_layer;
    size_t block_bytes;
    size_t hidden_bytes;  /* a block of a layer stored as hidden states; 0:
                             runs are stored as K/V, and stored runs with
                             hidden layers are not adopted */
    Hash128 fingerprint;
    uint32_t kv_format;
    int ttl_s;
    int timeout_ms;
    uint64_t window_bytes;
    int max_run_blocks;   /* TierRedisConfig.value_bytes in whole blocks */
    uint8_t *buf;         /* (buf_cap) a value being built */
    size_t buf_cap;
    ProbeCand *cands;     /* (cands_cap) a probe's runs */
    int cands_cap;
    bool has_warned_ptr;  /* logged once that a pointer was damaged */
} RedisTier;

static const TierKindOps redis_ops;

/* ---- helpers: bytes, keys, values ---------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* Bytes of one block in layer l of a run whose layers `hidden` are stored
 * as hidden states. */
static size_t layer_block_bytes(const RedisTier *r, uint64_t hidden, int l) {
    return tier_layer_bytes(r->block_bytes, r->hidden_bytes, hidden, l);
}

/* Bytes of a layer value of a run of n blocks besides the blocks': its
 * header, the block hashes and the checksum. */
static uint64_t value_frame_len(int n) { return REDIS_VALUE_HEAD + 16 * (uint64_t)n + 8; }

/* Bytes of layer l's value of a run of n blocks stored so (n <=
 * REDIS_MAX_RUN and block sizes a pool's: no overflow in 64 bits). */
static uint64_t value_len(const RedisTier *r, int n, uint64_t hidden, int l) {
    return value_frame_len(n) + (uint64_t)n * layer_block_bytes(r, hidden, l);
}

static uint32_t run_version(uint64_t hidden) { return hidden != 0 ? REDIS_FORMAT_HIDDEN : REDIS_FORMAT_VERSION; }
static uint32_t ptr_len(uint64_t hidden) { return hidden != 0 ? REDIS_PTR2_BYTES : REDIS_PTR_BYTES; }

/* T: of a run stored as K/V, XXH3-128 of its block hashes; of a run with
 * hidden layers, of those and the mask (8 bytes), so that the same blocks
 * stored with another layer plan get keys of their own. */
static Hash128 run_tag(const Hash128 *hashes, int n, uint64_t hidden) {
    if (hidden == 0) return hash128(hashes, (size_t)n * sizeof *hashes);
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, hashes, (size_t)n * sizeof *hashes);
    uint8_t m[8];
    put_u64(m, hidden);
    hasher_update(&h, m, sizeof m);
    return hasher_final(&h);
}

/* F:N, the keys' model and namespace part: the first 8 bytes of the
 * fingerprint and of the namespace id (zeros when not known), in hex. */
static void key_scope(char *out, const Hash128 *fingerprint, const Hash128 *ns_id) {
    char f[33], n[33];
    hash128_hex(fingerprint, f);
    if (ns_id) hash128_hex(ns_id, n);
    else memset(n, '0', 16);
    snprintf(out, REDIS_SCOPE_LEN, "%.16s:%.16s", f, n);
}

static int layer_key(char *out, const RedisRun *rr, int layer) {
    char hex[33];
    hash128_hex(&rr->tag, hex);
    return snprintf(out, REDIS_KEY_MAX, "mnemo:kv1:%s:{%s}:%d", rr->scope, hex, layer);
}

static int ptr_key(char *out, const char *scope, const Hash128 *h) {
    char hex[33];
    hash128_hex(h, hex);
    return snprintf(out, REDIS_KEY_MAX, "mnemo:blk1:%s:%s", scope, hex);
}

static int buf_reserve(RedisTier *r, uint64_t n) {
    if (n <= r->buf_cap) return MN_OK;
    if (n > SIZE_MAX / 2) return MN_ENOMEM;
    uint8_t *b = mn_realloc(r->buf, (size_t)n);
    if (b == NULL) return MN_ENOMEM;
    r->buf = b;
    r->buf_cap = (size_t)n;
    return MN_OK;
}

/* The start every value shares: head_len bytes zeroed, then the magic,
 * the format version and its first two fields (offsets 12 and 16). */
static void head_begin(uint8_t *p, size_t head_len, const char *magic, uint32_t a, uint32_t b) {
    memset(p, 0, head_len);
    memcpy(p, magic, 8);
    put_u32(p + 8, REDIS_FORMAT_VERSION);
    put_u32(p + 12, a);
    put_u32(p + 16, b);
}

/* Build layer `layer` of run (blocks from pool slots[]: their K/V, or
 * their hidden rows when the run stores the layer so) in r->buf. */
static uint64_t value_build(RedisTier *r, const TierRun *run, const RedisRun *rr, int layer, const KvPool *pool,
                            const int32_t *slots) {
    uint8_t *p = r->buf;
    int n = run->n_blocks;
    size_t bb = layer_block_bytes(r, rr->hidden, layer);
    head_begin(p, REDIS_VALUE_HEAD, "MNEMOKVL", (uint32_t)n, (uint32_t)layer);
    put_u32(p + 8, run_version(rr->hidden));
    put_u32(p + 20, (uint32_t)r->n_layer);
    put_u64(p + 24, (uint64_t)bb);
    put_u32(p + 32, r->kv_format);
    put_u32(p + 36, kvpool_layer_in(rr->hidden, layer) ? 1u : 0u);
    memcpy(p + 40, r->fingerprint.b, 16);
    memcpy(p + 56, rr->tag.b, 16);
    memcpy(p + REDIS_VALUE_HEAD, run->hashes, (size_t)n * 16);
    uint8_t *blocks = p + REDIS_VALUE_HEAD + 16 * (size_t)n;
    for (int i = 0; i < n; i++) memcpy(blocks + (size_t)i * bb, tier_pool_layer(pool, rr->hidden, layer, slots[i]), bb);
    uint64_t len = value_len(r, n, rr->hidden, layer);
    put_u64(p + len - 8, XXH3_64bits(p, (size_t)(len - 8)));
    return len;
}

/* Why a layer value is not the one expected; NULL when it is. The view's
 * hashes (the core run's, its first blocks) must begin its list. Damage
 * is what fails the magic or the checksum; an intact value of another
 * length is another run's or another plan's (a pointer that names the
 * run with another mask leads here), kept for whoever it belongs to. */
static const char *value_check(const RedisTier *r, const TierRun *run, const RedisRun *rr, int layer,
                               const uint8_t *v, size_t len, bool *is_damaged) {
    *is_damaged = true;
    int n = rr->n_stored;
    if (len < value_frame_len(0) || memcmp(v, "MNEMOKVL", 8) != 0) return "too short or bad magic";
    if (get_u64(v + len - 8) != XXH3_64bits(v, len - 8)) return "checksum mismatch";
    *is_damaged = false; /* intact: another format or another run's, not damage */
    if (len != value_len(r, n, rr->hidden, layer)) return "another length";
    if (get_u32(v + 8) != run_version(rr->hidden)) return "another format version";
    if (get_u32(v + 12) != (uint32_t)n || get_u32(v + 16) != (uint32_t)layer) return "another run or layer";
    if (get_u32(v + 36) != (kvpool_layer_in(rr->hidden, layer) ? 1u : 0u))
        return "another representation (K/V or hidden states)";
    if (get_u32(v + 20) != (uint32_t)r->n_layer || get_u64(v + 24) != (uint64_t)layer_block_bytes(r, rr->hidden, layer) ||
        get_u32(v + 32) != r->kv_format || memcmp(v + 40, r->fingerprint.b, 16) != 0)
        return "another model or KV layout";
    if (memcmp(v + 56, rr->tag.b, 16) != 0 || memcmp(v + REDIS_VALUE_HEAD, run->hashes, (size_t)run->n_blocks * 16) != 0)
        return "another run's blocks";
    return NULL;
}

/* The pointer of block h, index i of a run of n stored with layers
 * `hidden` as hidden states, into p (ptr_len(hidden) bytes). */
static void ptr_build(uint8_t *p, const Hash128 *h, const Hash128 *tag, int n, int i, uint64_t hidden) {
    uint32_t len = ptr_len(hidden);
    head_begin(p, len, "MNEMOBLK", (uint32_t)n, (uint32_t)i);
    put_u32(p + 8, run_version(hidden));
    memcpy(p + 24, h->b, 16);
    memcpy(p + 40, tag->b, 16);
    if (hidden != 0) put_u64(p + 56, hidden);
    put_u64(p + len - 8, XXH3_64bits(p, len - 8));
}

/* Parse the pointer value of block h: MN_OK with the run's tag, n, the
 * block's index and the run's hidden layers; MN_EFORMAT when it is damaged
 * or of another version. */
static int ptr_parse(const uint8_t *p, size_t len, const Hash128 *h, Hash128 *tag, int *n, int *i,
                     uint64_t *hidden) {
    if ((len != REDIS_PTR_BYTES && len != REDIS_PTR2_BYTES) || memcmp(p, "MNEMOBLK", 8) != 0 ||
        get_u64(p + len - 8) != XXH3_64bits(p, len - 8) || memcmp(p + 24, h->b, 16) != 0)
        return MN_EFORMAT;
    uint64_t mask = len == REDIS_PTR2_BYTES ? get_u64(p + 56) : 0;
    if (get_u32(p + 8) != run_version(mask) || ptr_len(mask) != len) return MN_EFORMAT;
    uint32_t nn = get_u32(p + 12), ii = get_u32(p + 16);
    if (nn < 1 || nn > REDIS_MAX_RUN || ii >= nn) return MN_EFORMAT;
    memcpy(tag->b, p + 40, 16);
    *n = (int)nn;
    *i = (int)ii;
    *hidden = mask;
    return MN_OK;
}

/* ---- helpers: the connection (cache/redis_cluster.c) ------------------------- */

/* The next reply (the caller frees it), or MN_EIO with the connection
 * closed (logged). */
static int reply_take(RedisTier *r, redisReply **out, const char *what) { return rcluster_take(r->cl, out, what); }

/* Send what was appended, without waiting for replies. */
static int flush_out(RedisTier *r, const char *what) { return rcluster_flush(r->cl, what); }

/* Append one command (arguments binary-safe, argv[1] its key). */
static int cmd_append(RedisTier *r, int argc, const char **argv, const size_t *lens) {
    return rcluster_append(r->cl, argc, argv, lens);
}

/* A command whose reply matters only as an error (EXPIRE, DEL): the
 * client reads its reply before the next one taken. */
static void cmd_defer(RedisTier *r, int argc, const char **argv, const size_t *lens) {
    rcluster_append_deferred(r->cl, argc, argv, lens); /* a failure shows at the next exchange */
}

/* Connected: ready for an exchange. */
static int conn_ready(RedisTier *r) { return rcluster_is_connected(r->cl) ? MN_OK : MN_EIO; }

/* ---- kind operations: put ------------------------------------------------------- */

/* Bytes of a stored run of n blocks (n <= REDIS_MAX_RUN) whose layers
 * `hidden` are hidden states: its layer values and its pointers. */
static uint64_t stored_bytes(const RedisTier *r, int n_blocks, uint64_t hidden) {
    uint64_t n = (uint64_t)n_blocks;
    return ptr_len(hidden) * n + (uint64_t)r->n_layer * value_frame_len(n_blocks) +
           tier_layer_at(n * r->block_bytes, n * r->hidden_bytes, hidden, r->n_layer);
}

/* (hidden is 0 unless the tier was given hidden_bytes: the core asks
 * for hidden layers only then) */
static uint64_t redis_run_bytes(void *kind, int n_blocks, uint64_t hidden) {
    return n_blocks > REDIS_MAX_RUN ? UINT64_MAX : stored_bytes(kind, n_blocks, hidden);
}

static int redis_max_run_blocks(void *kind) { return ((const RedisTier *)kind)->max_run_blocks; }

static int redis_reserve(void *kind, TierRun *run) {
    const RedisTier *r = kind;
    RedisRun *rr = mn_malloc(sizeof *rr);
    if (rr == NULL) return MN_ENOMEM;
    key_scope(rr->scope, &r->fingerprint, run->has_ns ? &run->ns_id : NULL);
    rr->tag = run_tag(run->hashes, run->n_blocks, run->hidden);
    rr->n_stored = run->n_blocks;
    rr->hidden = run->hidden;
    run->data = rr;
    return MN_OK;
}

/* SET key value [EX ttl], appended and sent (so the connection's output
 * buffer never holds more than one value). */
static int set_send(RedisTier *r, const char *key, const uint8_t *v, size_t len) {
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%d", r->ttl_s);
    const char *argv[] = {"SET", key, (const char *)v, "EX", ttl};
    size_t lens[] = {3, strlen(key), len, 2, strlen(ttl)};
    int rc = cmd_append(r, r->ttl_s > 0 ? 5 : 3, argv, lens);
    return rc == MN_OK ? flush_out(r, "writing to") : rc;
}

/* The n replies of a put: MN_OK when all are +OK; MN_EFULL when the store
 * is out of memory (maxmemory under noeviction); else MN_EIO. Every reply
 * is read either way, so the connection stays in step. */
static int put_replies(RedisTier *r, int n) {
    int rc = MN_OK;
    for (int i = 0; i < n; i++) {
        redisReply *rep;
        if (reply_take(r, &rep, "writing to") != MN_OK) return MN_EIO;
        if (rep->type == REDIS_REPLY_ERROR && rc == MN_OK) {
            bool is_oom = strncmp(rep->str, "OOM", 3) == 0;
            if (!is_oom) LOG_WARN("redis tier: %s refused a write: %s", rcluster_shown(r->cl), rep->str);
            rc = is_oom ? MN_EFULL : MN_EIO;
        }
        freeReplyObject(rep);
    }
    return rc;
}

static int redis_write(void *kind, TierRun *run, const KvPool *pool, const int32_t *slots, uint64_t *io_bytes) {
    RedisTier *r = kind;
    const RedisRun *rr = run->data;
    int rc = conn_ready(r);
    char key[REDIS_KEY_MAX];
    int n_sent = 0;
    for (int l = 0; l < r->n_layer && rc == MN_OK; l++) {
        if ((rc = buf_reserve(r, value_len(r, run->n_blocks, rr->hidden, l))) != MN_OK) break;
        uint64_t len = value_build(r, run, rr, l, pool, slots);
        layer_key(key, rr, l);
        if ((rc = set_send(r, key, r->buf, (size_t)len)) == MN_OK) n_sent++;
        *io_bytes += len;
    }
    /* the pointers after the values: a pointer never names a run not written */
    for (int i = 0; i < run->n_blocks && rc == MN_OK; i++) {
        uint8_t p[REDIS_PTR2_BYTES];
        ptr_build(p, &run->hashes[i], &rr->tag, run->n_blocks, i, rr->hidden);
        ptr_key(key, rr->scope, &run->hashes[i]);
        if ((rc = set_send(r, key, p, ptr_len(rr->hidden))) == MN_OK) n_sent++;
        *io_bytes += ptr_len(rr->hidden);
    }
    if (conn_ready(r) != MN_OK) return MN_EIO;
    int replies = put_replies(r, n_sent); /* (also after a failure: in step) */
    return rc != MN_OK ? rc : replies;
}

/* ---- kind operations: restore ----------------------------------------------------- */

/* Append a GET of layer `layer` of each group's run. */
static int get_layer_append(RedisTier *r, const TierReadGroup *groups, int n_groups, int layer) {
    char key[REDIS_KEY_MAX];
    int rc = MN_OK;
    for (int g = 0; g < n_groups && rc == MN_OK; g++) {
        const RedisRun *rr = groups[g].run->data;
        layer_key(key, rr, layer);
        const char *argv[] = {"GET", key};
        size_t lens[] = {3, strlen(key)};
        rc = cmd_append(r, 2, argv, lens);
    }
    return rc;
}

/* Delete a damaged value (deferred: its reply is read later). */
static void value_delete(RedisTier *r, const RedisRun *rr, int layer) {
    char key[REDIS_KEY_MAX];
    layer_key(key, rr, layer);
    const char *argv[] = {"DEL", key};
    size_t lens[] = {3, strlen(key)};
    cmd_defer(r, 2, argv, lens);
}

/* Check a GET's reply for layer `layer` of group gr's run and copy its
 * blocks into the pool: MN_OK; MN_ENOTFOUND (no such key: the store let it
 * go); MN_ECHECKSUM (not the value expected; a damaged one is deleted);
 * MN_EIO (an error reply). */
static int reply_place(RedisTier *r, const redisReply *rep, const TierReadGroup *gr, int layer, KvPool *pool,
                       uint64_t *io_bytes) {
    const RedisRun *rr = gr->run->data;
    if (rep->type == REDIS_REPLY_NIL) return MN_ENOTFOUND;
    if (rep->type == REDIS_REPLY_ERROR) {
        LOG_WARN("redis tier: %s refused a read: %s", rcluster_shown(r->cl), rep->str);
        return MN_EIO;
    }
    if (rep->type != REDIS_REPLY_STRING) return MN_ECHECKSUM;
    const uint8_t *v = (const uint8_t *)rep->str;
    *io_bytes += rep->len;
    bool is_damaged;
    const char *why = value_check(r, gr->run, rr, layer, v, rep->len, &is_damaged);
    if (why != NULL) {
        char hex[33];
        hash128_hex(&rr->tag, hex);
        LOG_WARN("redis tier: layer %d of run {%s}: %s%s", layer, hex, why, is_damaged ? "; deleting it" : "");
        if (is_damaged) value_delete(r, rr, layer);
        return MN_ECHECKSUM;
    }
    const uint8_t *blocks = v + REDIS_VALUE_HEAD + 16 * (size_t)rr->n_stored;
    size_t bb = layer_block_bytes(r, rr->hidden, layer);
    for (int k = 0; k < gr->n; k++)
        memcpy(tier_pool_layer(pool, rr->hidden, layer, gr->slots[k]), blocks + (size_t)gr->idx[k] * bb, bb);
    return MN_OK;
}

/* Layers whose GETs go out ahead: the window's worth, at least one. */
static int window_layers(const RedisTier *r, const TierReadGroup *groups, int n_groups) {
    uint64_t layer_bytes = 0; /* a layer's values, on average over the layers */
    for (int g = 0; g < n_groups; g++) {
        const RedisRun *rr = groups[g].run->data;
        layer_bytes += stored_bytes(r, rr->n_stored, rr->hidden) / (uint64_t)r->n_layer;
    }
    uint64_t w = layer_bytes > 0 ? r->window_bytes / layer_bytes : 1;
    return w < 1 ? 1 : w > (uint64_t)r->n_layer ? r->n_layer : (int)w;
}

static int redis_read_layers(void *kind, const TierReadGroup *groups, int n_groups, KvPool *pool,
                             TierLayerFn layer_fn, void *ctx, uint64_t *io_bytes, TierReadFailure *bad) {
    RedisTier *r = kind;
    int rc = conn_ready(r);
    if (rc != MN_OK) return rc;
    int n_ahead = window_layers(r, groups, n_groups), n_sent = 0, result = MN_OK, l = 0;
    for (; n_sent < n_ahead && rc == MN_OK; n_sent++) rc = get_layer_append(r, groups, n_groups, n_sent);
    if (rc == MN_OK) rc = flush_out(r, "reading from");
    for (; l < r->n_layer && rc == MN_OK && result == MN_OK; l++) {
        for (int g = 0; g < n_groups && rc == MN_OK; g++) {
            redisReply *rep;
            if ((rc = reply_take(r, &rep, "reading from")) != MN_OK) break;
            if (result == MN_OK && (result = reply_place(r, rep, &groups[g], l, pool, io_bytes)) != MN_OK)
                *bad = (TierReadFailure){g, l};
            freeReplyObject(rep);
        }
        if (rc != MN_OK || result != MN_OK) break;
        if (layer_fn) layer_fn(ctx, l);
        /* the next layer is asked for after the callback: a test that holds
         * the restore in it (MoverTestHooks.layer_gate) holds the next
         * request too */
        if (n_sent < r->n_layer) {
            rc = get_layer_append(r, groups, n_groups, n_sent++);
            if (rc == MN_OK) rc = flush_out(r, "reading from");
        }
    }
    /* a failed layer: read (and drop) the replies already asked for, so the
     * connection stays in step */
    int owed = rc == MN_OK && result != MN_OK ? (n_sent - (l + 1)) * n_groups : 0;
    for (int i = 0; i < owed && rc == MN_OK; i++) {
        redisReply *rep;
        if ((rc = reply_take(r, &rep, "reading from")) == MN_OK) freeReplyObject(rep);
    }
    if (rc == MN_OK) rc = flush_out(r, "writing to"); /* a damaged value's DEL */
    return rc != MN_OK ? MN_EIO : result;
}

static int redis_read_layer(void *kind, TierRun *run, int layer, const int32_t *idx, const int32_t *slots, int n,
                            KvPool *pool, uint64_t *io_bytes) {
    RedisTier *r = kind;
    TierReadGroup g = {.run = run, .idx = idx, .slots = slots, .n = n};
    int rc = conn_ready(r);
    if (rc == MN_OK) rc = get_layer_append(r, &g, 1, layer);
    if (rc == MN_OK) rc = flush_out(r, "reading from");
    redisReply *rep;
    if (rc == MN_OK) rc = reply_take(r, &rep, "reading from");
    if (rc != MN_OK) return MN_EIO;
    int result = reply_place(r, rep, &g, layer, pool, io_bytes);
    freeReplyObject(rep);
    if (flush_out(r, "writing to") != MN_OK) return MN_EIO; /* a damaged value's DEL */
    return result;
}

/* ---- kind operations: the rest ------------------------------------------------------ */

/* With a TTL, a used run's keys live on: EXPIRE each (deferred). */
static void redis_touch(void *kind, TierRun *run) {
    RedisTier *r = kind;
    const RedisRun *rr = run->data;
    if (r->ttl_s <= 0 || conn_ready(r) != MN_OK) return;
    char key[REDIS_KEY_MAX], ttl[16];
    snprintf(ttl, sizeof ttl, "%d", r->ttl_s);
    for (int i = 0; i < r->n_layer + run->n_blocks; i++) {
        if (i < r->n_layer) layer_key(key, rr, i);
        else ptr_key(key, rr->scope, &run->hashes[i - r->n_layer]);
        const char *argv[] = {"EXPIRE", key, ttl};
        size_t lens[] = {6, strlen(key), strlen(ttl)};
        cmd_defer(r, 3, argv, lens);
    }
    flush_out(r, "renewing keys in"); /* a failure shows at the next exchange */
}

/* A run that was never to be found (tier_measure_read's): its values and
 * pointers go from the store (deferred DELs). */
static void redis_discard(void *kind, TierRun *run) {
    RedisTier *r = kind;
    const RedisRun *rr = run->data;
    if (conn_ready(r) != MN_OK) return;
    char key[REDIS_KEY_MAX];
    for (int i = 0; i < r->n_layer + run->n_blocks; i++) {
        if (i < r->n_layer) layer_key(key, rr, i);
        else ptr_key(key, rr->scope, &run->hashes[i - r->n_layer]);
        const char *argv[] = {"DEL", key};
        size_t lens[] = {3, strlen(key)};
        cmd_defer(r, 2, argv, lens);
    }
    flush_out(r, "deleting from"); /* a failure shows at the next exchange */
}

/* Forgetting a run leaves it in the store: Redis decides what it keeps. */
static void redis_release(void *kind, TierRun *run) {
    mn_free(run->data);
    run->data = NULL;
}

static int redis_reset(void *kind) { return rcluster_connect(((RedisTier *)kind)->cl); }

static void redis_dump(const void *kind) {
    const RedisTier *r = kind;
    fprintf(stderr, "  redis: ttl %d s, timeout %d ms\n", r->ttl_s, r->timeout_ms);
    rcluster_dump(r->cl);
}

static void redis_free(void *kind) {
    RedisTier *r = kind;
    if (r == NULL) return;
    rcluster_free(r->cl);
    mn_free(r->buf);
    mn_free(r->cands);
    mn_free(r);
}

static const TierKindOps redis_ops = {
    .name = "redis",
    .is_retried = true,
    .run_bytes = redis_run_bytes,
    .max_run_blocks = redis_max_run_blocks,
    .reserve = redis_reserve,
    .write = redis_write,
    .read_layer = redis_read_layer,
    .read_layers = redis_read_layers,
    .discard = redis_discard,
    .touch = redis_touch,
    .release = redis_release,
    .reset = redis_reset,
    .dump = redis_dump,
    .free = redis_free,
};

/* ---- probe ---------------------------------------------------------------------------- */

/* Whether this instance can restore a run stored with layers `hidden` as
 * hidden states: it keeps hidden states of the writer's size (the same
 * model and KV format make the same size; the values say it again), and
 * the mask names layers the model has. A run it cannot restore is a miss,
 * recomputed. */
static bool hidden_usable(const RedisTier *r, uint64_t hidden) {
    if (hidden == 0) return true;
    if (r->hidden_bytes == 0) return false;
    return (hidden & ~kvpool_layers_below(r->n_layer)) == 0;
}

/* Pointer replies -> r->cands: for block i of the sequence found at index
 * idx of a stored run, that run holds sequence blocks [i - idx, i]. */
static int probe_pointers(RedisTier *r, const char *scope, const Hash128 *hashes, const uint8_t *want, int n,
                          int *n_cands) {
    *n_cands = 0;
    char key[REDIS_KEY_MAX];
    int rc = MN_OK, n_asked = 0;
    for (int i = 0; i < n && rc == MN_OK; i++) {
        if (!want[i]) continue;
        ptr_key(key, scope, &hashes[i]);
        const char *argv[] = {"GET", key};
        size_t lens[] = {3, strlen(key)};
        if ((rc = cmd_append(r, 2, argv, lens)) == MN_OK) n_asked++;
    }
    if (rc == MN_OK && n_asked > r->cands_cap) {
        ProbeCand *c = mn_realloc(r->cands, (size_t)n_asked * sizeof *c);
        if (c == NULL) rc = MN_ENOMEM; /* the commands appended are sent and their replies dropped */
        else {
            r->cands = c;
            r->cands_cap = n_asked;
        }
    }
    if (flush_out(r, "looking blocks up in") != MN_OK) return MN_EIO;
    for (int i = 0, k = 0; i < n && k < n_asked; i++) {
        if (!want[i]) continue;
        k++;
        redisReply *rep;
        if (reply_take(r, &rep, "looking blocks up in") != MN_OK) return MN_EIO;
        Hash128 tag;
        int n_stored, idx;
        uint64_t hidden = 0;
        bool is_string = rep->type == REDIS_REPLY_STRING;
        bool is_ptr = is_string && ptr_parse((const uint8_t *)rep->str, rep->len, &hashes[i], &tag, &n_stored, &idx,
                                             &hidden) == MN_OK;
        freeReplyObject(rep);
        if (is_string && !is_ptr) {
            if (!r->has_warned_ptr) LOG_WARN("redis tier: a damaged block pointer in %s; deleting it", rcluster_shown(r->cl));
            r->has_warned_ptr = true;
            ptr_key(key, scope, &hashes[i]);
            const char *argv[] = {"DEL", key};
            size_t lens[] = {3, strlen(key)};
            cmd_defer(r, 2, argv, lens);
        }
        if (rc != MN_OK || !is_ptr || idx > i || !hidden_usable(r, hidden)) continue;
        int c = 0;
        while (c < *n_cands && !(hash128_eq(&r->cands[c].run.tag, &tag) && r->cands[c].start == i - idx)) c++;
        if (c == *n_cands) {
            ProbeCand *pc = &r->cands[(*n_cands)++];
            *pc = (ProbeCand){.run = {.tag = tag, .n_stored = n_stored, .hidden = hidden}, .start = i - idx, .end = i + 1};
            memcpy(pc->run.scope, scope, REDIS_SCOPE_LEN);
        } else if (i + 1 > r->cands[c].end) {
            r->cands[c].end = i + 1;
        }
    }
    if (rc == MN_OK && flush_out(r, "writing to") != MN_OK) return MN_EIO; /* a damaged pointer's DEL */
    return rc;
}

/* Keep the candidates whose every layer value is in the store (one EXISTS
 * each: a run's keys share a slot). */
static int probe_exists(RedisTier *r, int *n_cands) {
    const char **argv = mn_malloc(((size_t)r->n_layer + 1) * sizeof *argv);
    size_t *lens = mn_malloc(((size_t)r->n_layer + 1) * sizeof *lens);
    char *keys = mn_malloc((size_t)r->n_layer * REDIS_KEY_MAX);
    int rc = argv && lens && keys ? MN_OK : MN_ENOMEM;
    for (int c = 0; c < *n_cands && rc == MN_OK; c++) {
        argv[0] = "EXISTS";
        lens[0] = 6;
        for (int l = 0; l < r->n_layer; l++) {
            char *k = keys + (size_t)l * REDIS_KEY_MAX;
            lens[l + 1] = (size_t)layer_key(k, &r->cands[c].run, l);
            argv[l + 1] = k;
        }
        rc = cmd_append(r, r->n_layer + 1, argv, lens);
    }
    mn_free(argv);
    mn_free(lens);
    mn_free(keys);
    if (rc != MN_OK) return rc;
    if (flush_out(r, "looking runs up in") != MN_OK) return MN_EIO;
    int kept = 0;
    for (int c = 0; c < *n_cands; c++) {
        redisReply *rep;
        if (reply_take(r, &rep, "looking runs up in") != MN_OK) return MN_EIO;
        bool is_whole = rep->type == REDIS_REPLY_INTEGER && rep->integer == r->n_layer;
        freeReplyObject(rep);
        if (is_whole) r->cands[kept++] = r->cands[c];
    }
    *n_cands = kept;
    return MN_OK;
}

int tier_redis_probe(Tier *t, const Hash128 *hashes, const uint8_t *want, int n, int block_tokens,
                     const Hash128 *ns_id) {
    if (tier_kind_ops(t) != &redis_ops) return -MN_EINVAL;
    RedisTier *r = tier_kind(t);
    if (tier_is_failed(t)) return -MN_EIO;
    char scope[REDIS_SCOPE_LEN];
    key_scope(scope, &r->fingerprint, ns_id);
    int n_cands = 0, rc = conn_ready(r);
    if (rc == MN_OK) rc = probe_pointers(r, scope, hashes, want, n, &n_cands);
    if (rc == MN_OK && n_cands > 0) rc = probe_exists(r, &n_cands);
    if (rc == MN_EIO) {
        tier_fail(t, "looking blocks up");
        return -MN_EIO;
    }
    if (rc != MN_OK) return -rc;
    int n_adopted = 0;
    for (int c = 0; c < n_cands; c++) {
        const ProbeCand *pc = &r->cands[c];
        RedisRun *rr = mn_malloc(sizeof *rr);
        if (rr == NULL) return n_adopted; /* what was adopted stays */
        *rr = pc->run;
        TierRunInfo info = {.pos = pc->start * block_tokens, .ns_id = ns_id, .hidden = pc->run.hidden};
        rc = tier_adopt_run(t, tier_new_run_id(t), &hashes[pc->start], pc->end - pc->start, rr,
                            stored_bytes(r, pc->run.n_stored, pc->run.hidden), mn_wall_now(), &info);
        if (rc != MN_OK) mn_free(rr); /* MN_EFULL (bigger than the budget), MN_ENOMEM: not adopted */
        else n_adopted++;
    }
    return n_adopted;
}

/* ---- the shared reply memory ------------------------------------------------------------- */

#define REDIS_REPLY_HEAD 40u
#define REDIS_REPLY_MAX_TEXT (16u << 20)
#define REDIS_REPLY_MAX_IDS (4u << 20)

static int reply_key(char *out, const char *scope, const char *text, size_t len) {
    char hex[33];
    Hash128 h = hash128(text, len);
    hash128_hex(&h, hex);
    return snprintf(out, REDIS_KEY_MAX, "mnemo:reply1:%s:%s", scope, hex);
}

int tier_redis_put_reply(Tier *t, const Hash128 *ns_id, const Hash128 *key, const char *text, size_t len,
                         const int32_t *ids, size_t n_ids) {
    if (tier_kind_ops(t) != &redis_ops || len > REDIS_REPLY_MAX_TEXT || n_ids > REDIS_REPLY_MAX_IDS) return MN_EINVAL;
    RedisTier *r = tier_kind(t);
    if (tier_is_failed(t)) return MN_EIO;
    uint64_t n = REDIS_REPLY_HEAD + (uint64_t)len + 4 * (uint64_t)n_ids + 8;
    if (buf_reserve(r, n) != MN_OK) return MN_ENOMEM;
    uint8_t *p = r->buf;
    head_begin(p, REDIS_REPLY_HEAD, "MNEMORPL", (uint32_t)len, (uint32_t)n_ids);
    memcpy(p + 24, key->b, 16);
    memcpy(p + REDIS_REPLY_HEAD, text, len);
    for (size_t i = 0; i < n_ids; i++) put_u32(p + REDIS_REPLY_HEAD + len + 4 * i, (uint32_t)ids[i]);
    put_u64(p + n - 8, XXH3_64bits(p, (size_t)(n - 8)));
    char scope[REDIS_SCOPE_LEN], k[REDIS_KEY_MAX], ttl[16];
    key_scope(scope, &r->fingerprint, ns_id);
    reply_key(k, scope, text, len);
    snprintf(ttl, sizeof ttl, "%d", r->ttl_s);
    const char *argv[] = {"SET", k, (const char *)p, "EX", ttl};
    size_t lens[] = {3, strlen(k), (size_t)n, 2, strlen(ttl)};
    cmd_defer(r, r->ttl_s > 0 ? 5 : 3, argv, lens);
    if (flush_out(r, "writing to") == MN_OK) return MN_OK;
    tier_fail(t, "writing a reply");
    return MN_EIO;
}

/* The entry of text[0..len) in a GET's reply, into rm: MN_OK, or
 * MN_EFORMAT when it is damaged, of another version or another text's. */
static int reply_parse_put(const redisReply *rep, const char *text, size_t len, ReplyMemory *rm) {
    if (rep->type != REDIS_REPLY_STRING || rep->len < REDIS_REPLY_HEAD + 8) return MN_EFORMAT;
    const uint8_t *p = (const uint8_t *)rep->str;
    size_t n = rep->len;
    uint64_t n_ids = get_u32(p + 16);
    if (memcmp(p, "MNEMORPL", 8) != 0 || get_u32(p + 8) != REDIS_FORMAT_VERSION || get_u32(p + 12) != len ||
        n != REDIS_REPLY_HEAD + len + 4 * n_ids + 8 || get_u64(p + n - 8) != XXH3_64bits(p, n - 8) ||
        memcmp(p + REDIS_REPLY_HEAD, text, len) != 0)
        return MN_EFORMAT;
    int32_t *ids = mn_malloc((n_ids ? n_ids : 1) * sizeof *ids);
    if (ids == NULL) return MN_ENOMEM;
    for (uint64_t i = 0; i < n_ids; i++) ids[i] = (int32_t)get_u32(p + REDIS_REPLY_HEAD + len + 4 * i);
    Hash128 key;
    memcpy(key.b, p + 24, 16);
    int rc = replymem_put(rm, &key, text, len, ids, (size_t)n_ids);
    mn_free(ids);
    return rc;
}

int tier_redis_get_replies(Tier *t, const Hash128 *ns_id, const char *const *texts, const size_t *lens, int n,
                           ReplyMemory *rm) {
    if (tier_kind_ops(t) != &redis_ops) return -MN_EINVAL;
    RedisTier *r = tier_kind(t);
    if (tier_is_failed(t)) return -MN_EIO;
    char scope[REDIS_SCOPE_LEN], k[REDIS_KEY_MAX];
    key_scope(scope, &r->fingerprint, ns_id);
    int rc = conn_ready(r), n_put = 0;
    for (int i = 0; i < n && rc == MN_OK; i++) {
        reply_key(k, scope, texts[i], lens[i]);
        const char *argv[] = {"GET", k};
        size_t klens[] = {3, strlen(k)};
        rc = cmd_append(r, 2, argv, klens);
    }
    if (rc == MN_OK) rc = flush_out(r, "looking replies up in");
    for (int i = 0; i < n && rc == MN_OK; i++) {
        redisReply *rep;
        if ((rc = reply_take(r, &rep, "looking replies up in")) != MN_OK) break;
        if (rep->type != REDIS_REPLY_NIL && reply_parse_put(rep, texts[i], lens[i], rm) == MN_OK) n_put++;
        freeReplyObject(rep);
    }
    if (rc != MN_OK) {
        tier_fail(t, "looking replies up");
        return -MN_EIO;
    }
    return n_put;
}

/* ---- API -------------------------------------------------------------------------------- */

int tier_redis_new(const TierRedisConfig *cfg, Tier **out, MnErr *err) {
    *out = NULL;
    if (cfg->n_layer < 1 || cfg->n_layer > 65536 || cfg->block_bytes == 0)
        return mn_err_set(err, MN_EINVAL, "redis tier: bad geometry (%d layers, %zu bytes per block)", cfg->n_layer,
                          cfg->block_bytes);
    if (cfg->ttl_s < 0 || cfg->timeout_ms < 0)
        return mn_err_set(err, MN_EINVAL, "redis tier: the TTL and the timeout must be >= 0");
    RedisTier *r = mn_calloc(1, sizeof *r);
    if (r == NULL) return mn_err_set(err, MN_ENOMEM, "redis tier: out of memory");
    r->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : REDIS_DEFAULT_TIMEOUT_MS;
    RedisClusterConfig cc = {.urls = cfg->urls, .n_urls = cfg->n_urls, .is_cluster = cfg->is_cluster,
                             .timeout_ms = r->timeout_ms};
    int rc = rcluster_new(&cc, &r->cl, err); /* its message leaves the credentials out */
    if (rc != MN_OK) {
        mn_free(r);
        return rc;
    }
    r->n_layer = cfg->n_layer;
    r->block_bytes = cfg->block_bytes;
    r->hidden_bytes = cfg->hidden_bytes;
    r->fingerprint = cfg->model_fingerprint;
    r->kv_format = cfg->kv_format;
    r->ttl_s = cfg->ttl_s;
    r->window_bytes = cfg->read_window_bytes > 0 ? cfg->read_window_bytes : REDIS_DEFAULT_WINDOW;
    /* whole blocks of the larger representation, at least one */
    uint64_t value = cfg->value_bytes > 0 ? cfg->value_bytes : TIER_REDIS_VALUE_BYTES;
    size_t block = cfg->hidden_bytes > cfg->block_bytes ? cfg->hidden_bytes : cfg->block_bytes;
    uint64_t max = value / block;
    r->max_run_blocks = max < 1 ? 1 : max > REDIS_MAX_RUN ? REDIS_MAX_RUN : (int)max;
    uint64_t capacity = cfg->capacity_bytes > 0 ? cfg->capacity_bytes : REDIS_DEFAULT_CATALOG;
    Tier *t;
    rc = tier_new_kind(&redis_ops, r, cfg->n_layer, cfg->block_bytes, capacity, NULL, &t);
    if (rc != MN_OK) return mn_err_set(err, rc, "redis tier: %s", mn_strerror(rc));
    tier_set_hidden_bytes(t, cfg->hidden_bytes);
    rc = rcluster_connect(r->cl);
    if (rc == MN_ENOMEM) {
        tier_free(t);
        return mn_err_set(err, rc, "redis tier: out of memory");
    }
    if (rc != MN_OK) tier_fail(t, "connecting (serving without it until it answers)");
    *out = t;
    return MN_OK;
}

const char *tier_redis_url(const Tier *t) {
    if (tier_kind_ops(t) != &redis_ops) return "";
    return rcluster_shown(((const RedisTier *)tier_kind(t))->cl);
}

void tier_redis_client_stats(const Tier *t, RedisClusterStats *out) {
    memset(out, 0, sizeof *out);
    if (tier_kind_ops(t) == &redis_ops) rcluster_stats(((const RedisTier *)tier_kind(t))->cl, out);
}
