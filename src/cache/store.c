/* store.c — the cache's SQLite database, DIR/mnemo.db (see store.h).
 *
 * One connection per cache directory, opened by the main thread at start-
 * up and then used by the mover thread; SQLite is the only lock. The
 * database is in WAL mode with synchronous=FULL, so each of the one-
 * statement transactions below is durable when it returns, and a process
 * killed at any moment leaves the last committed transaction (the WAL's
 * commit frames are checksummed; a torn tail is ignored on recovery).
 * locking_mode=EXCLUSIVE keeps the WAL index in process memory (no -shm
 * file) and holds the file lock from the first write to close, so a
 * second process on the same directory is refused rather than let loose
 * on the same slab files; `mnemo cache purge` relies on that lock too.
 *
 * Data at rest: the directory is checked and made private first
 * (tier_dir.h), the database file is created 0600 before SQLite opens it
 * (SQLite gives the WAL the same mode), temporary tables and sorts stay in
 * memory (temp_store=MEMORY), and deleted content is overwritten with
 * zeros (secure_delete=ON, whatever the build's default). store_purge
 * then rewrites the whole file (VACUUM) and truncates the WAL, so no byte
 * of a purged row survives in a free page or an old WAL frame.
 *
 * SCHEMA, version 3 (PRAGMA user_version = 3; version 1 is upgraded in
 * place by adding the ns_id columns, NULL in its old rows, and version 2
 * by adding the two response tables; any other value is refused, and so
 * is a database with tables but user_version 0 — not ours).
 * Unsigned 64-bit ids are stored as the SQLite INTEGER with the same bits
 * (two's complement); times are unix seconds as REAL.
 *
 *   identity          exactly one row (id = 1): what the cached bytes are
 *                     valid for; checked at every open
 *     id                 INTEGER PRIMARY KEY, 1
 *     model_fingerprint  BLOB, 16 bytes (Hash128 canonical bytes)
 *     kv_format          INTEGER, index_kv_format()
 *     n_layer            INTEGER
 *     block_bytes        INTEGER, bytes of one block in one layer
 *     created            REAL, when the database was made
 *
 *   runs              the disk tier's run records (tier_disk.c)
 *     run_id             INTEGER PRIMARY KEY, the run id R
 *     record             BLOB, the run record exactly as tier_disk.c's
 *                        ON-DISK FORMAT specifies (validated there)
 *     last_used          REAL, when the run was written or last read
 *     ns_id              BLOB, 16 bytes: index_namespace_id of the
 *                        namespace its blocks belong to; NULL when not
 *                        known (rows of version 1): a purge of any
 *                        namespace takes those
 *
 *   replies           the reply memory (reply_mem.h)
 *     seq                INTEGER PRIMARY KEY, insertion order (larger =
 *                        newer; a replaced row gets a new one)
 *     entry              BLOB UNIQUE, XXH3-128 of (key bytes, text): the
 *                        identity of a (key, text) pair
 *     key                BLOB, 16 bytes: replymem_prefix_key
 *     text               BLOB, the reply text (its bytes, no NUL)
 *     ids                BLOB, the generated token ids, int32 little-endian
 *     used               REAL, when it was written
 *     ns_id              BLOB, 16 bytes: the namespace of the reply (NULL
 *                        in rows of version 1, purged with any namespace)
 *
 *   conversations     one row per conversation id (0 = none, never stored)
 *     conv               INTEGER PRIMARY KEY, the conversation id
 *     ns_id              BLOB, 16 bytes: index_namespace_id
 *     last_active        REAL
 *     n_tokens           INTEGER, tokens cached at its last turn
 *     (index conversations_by_active on last_active)
 *
 *   responses         the stored responses of the Responses API (store.h)
 *     id                 TEXT PRIMARY KEY, "resp_..." as the server made it
 *     ns_id              BLOB, 16 bytes: index_namespace_id; never NULL
 *     previous_id        TEXT, the response it continues; NULL at a start
 *     created            REAL, when it was made
 *     used               REAL, when it was made or last continued (expiry)
 *     body               BLOB, the response object as the server answered
 *                        it (JSON text; opaque here)
 *     output             BLOB, the reply's text, its bytes as generated
 *     (index responses_by_used on used)
 *
 *   response_inputs   the input items of each response, in order
 *     response_id        TEXT, a responses.id
 *     seq                INTEGER, 0.. in input order
 *     item_id            TEXT, "msg_..."
 *     role               TEXT, "user", "assistant", "system" or "developer"
 *     content            BLOB, the item's text
 *     (PRIMARY KEY (response_id, seq))
 *
 * Errors at run time are converted and logged in one place (sql_fail);
 * open fills an MnErr instead. Prepared statements live as long as the
 * store; each is reset after use, so none holds a read transaction open.
 *
 * Threads: the mover writes runs, replies and conversations while HTTP
 * threads read and write responses, so every public function holds the
 * store's mutex for its whole call (STORE_GUARD): the connection and its
 * statements are used by one thread at a time.
 *
 * In memory (store_open_memory): the same schema in a private ":memory:"
 * database, for a server without a disk tier; no WAL, no file, gone when
 * closed.
 */
#include "cache/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/log.h"
#include "base/mem.h"
#include "cache/tier_dir.h"

/* ---- types --------------------------------------------------------------- */

enum {
    ST_RUN_PUT,
    ST_RUN_TOUCH,
    ST_RUN_DELETE,
    ST_RUN_ALL,
    ST_RUN_COUNT,
    ST_REPLY_PUT,
    ST_REPLY_LOAD,
    ST_REPLY_TRIM,
    ST_REPLY_COUNT,
    ST_CONV_PUT,
    ST_CONV_COUNT,
    ST_CONV_ALL,
    ST_CONV_EXPIRE,
    ST_RESP_PUT,
    ST_RESP_INPUT_PUT,
    ST_RESP_GET,
    ST_RESP_INPUTS,
    ST_RESP_DELETE,
    ST_RESP_INPUT_DELETE,
    ST_RESP_TOUCH,
    ST_RESP_EXPIRE_INPUTS,
    ST_RESP_EXPIRE,
    ST_RESP_COUNT,
    ST__COUNT
};

static const char *const STMT_SQL[ST__COUNT] = {
    [ST_RUN_PUT] = "INSERT OR REPLACE INTO runs(run_id, record, last_used, ns_id) VALUES (?1, ?2, ?3, ?4)",
    [ST_RUN_TOUCH] = "UPDATE runs SET last_used = ?2 WHERE run_id = ?1",
    [ST_RUN_DELETE] = "DELETE FROM runs WHERE run_id = ?1",
    [ST_RUN_ALL] = "SELECT run_id, record, last_used, ns_id FROM runs ORDER BY run_id",
    [ST_RUN_COUNT] = "SELECT count(*) FROM runs",
    [ST_REPLY_PUT] = "INSERT OR REPLACE INTO replies(entry, key, text, ids, used, ns_id) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [ST_REPLY_LOAD] = "SELECT key, text, ids FROM "
                      "(SELECT seq, key, text, ids FROM replies ORDER BY seq DESC LIMIT ?1) ORDER BY seq",
    [ST_REPLY_TRIM] = "DELETE FROM replies WHERE seq <= (SELECT seq FROM replies ORDER BY seq DESC LIMIT 1 OFFSET ?1)",
    [ST_REPLY_COUNT] = "SELECT count(*) FROM replies",
    [ST_CONV_PUT] = "INSERT OR REPLACE INTO conversations(conv, ns_id, last_active, n_tokens) VALUES (?1, ?2, ?3, ?4)",
    [ST_CONV_COUNT] = "SELECT count(*) FROM conversations",
    [ST_CONV_ALL] = "SELECT conv, ns_id, last_active, n_tokens FROM conversations ORDER BY last_active, conv",
    [ST_CONV_EXPIRE] = "DELETE FROM conversations WHERE last_active < ?1",
    [ST_RESP_PUT] = "INSERT INTO responses(id, ns_id, previous_id, created, used, body, output) "
                    "VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)",
    [ST_RESP_INPUT_PUT] = "INSERT INTO response_inputs(response_id, seq, item_id, role, content) "
                          "VALUES (?1, ?2, ?3, ?4, ?5)",
    [ST_RESP_GET] = "SELECT previous_id, created, used, body, output FROM responses "
                    "WHERE id = ?1 AND ns_id = ?2 AND used >= ?3",
    [ST_RESP_INPUTS] = "SELECT item_id, role, content FROM response_inputs WHERE response_id = ?1 ORDER BY seq",
    [ST_RESP_DELETE] = "DELETE FROM responses WHERE id = ?1 AND ns_id = ?2",
    [ST_RESP_INPUT_DELETE] = "DELETE FROM response_inputs WHERE response_id = ?1",
    [ST_RESP_TOUCH] = "UPDATE responses SET used = max(used, ?3) WHERE id = ?1 AND ns_id = ?2",
    [ST_RESP_EXPIRE_INPUTS] = "DELETE FROM response_inputs WHERE response_id IN "
                              "(SELECT id FROM responses WHERE used < ?1)",
    [ST_RESP_EXPIRE] = "DELETE FROM responses WHERE used < ?1",
    [ST_RESP_COUNT] = "SELECT count(*) FROM responses",
};

/* The response tables (version 3), in both the schema and the upgrade. */
#define RESPONSES_SQL                                                                                                  \
    "CREATE TABLE responses("                                                                                          \
    " id TEXT PRIMARY KEY,"                                                                                            \
    " ns_id BLOB NOT NULL,"                                                                                            \
    " previous_id TEXT,"                                                                                               \
    " created REAL NOT NULL,"                                                                                          \
    " used REAL NOT NULL,"                                                                                             \
    " body BLOB NOT NULL,"                                                                                             \
    " output BLOB NOT NULL);"                                                                                          \
    "CREATE INDEX responses_by_used ON responses(used);"                                                               \
    "CREATE TABLE response_inputs("                                                                                    \
    " response_id TEXT NOT NULL,"                                                                                      \
    " seq INTEGER NOT NULL,"                                                                                           \
    " item_id TEXT NOT NULL,"                                                                                          \
    " role TEXT NOT NULL,"                                                                                             \
    " content BLOB NOT NULL,"                                                                                          \
    " PRIMARY KEY (response_id, seq));"

static const char SCHEMA_SQL[] =
    "CREATE TABLE identity("
    " id INTEGER PRIMARY KEY CHECK (id = 1),"
    " model_fingerprint BLOB NOT NULL,"
    " kv_format INTEGER NOT NULL,"
    " n_layer INTEGER NOT NULL,"
    " block_bytes INTEGER NOT NULL,"
    " created REAL NOT NULL);"
    "CREATE TABLE runs("
    " run_id INTEGER PRIMARY KEY,"
    " record BLOB NOT NULL,"
    " last_used REAL NOT NULL,"
    " ns_id BLOB);"
    "CREATE TABLE replies("
    " seq INTEGER PRIMARY KEY,"
    " entry BLOB NOT NULL UNIQUE,"
    " key BLOB NOT NULL,"
    " text BLOB NOT NULL,"
    " ids BLOB NOT NULL,"
    " used REAL NOT NULL,"
    " ns_id BLOB);"
    "CREATE TABLE conversations("
    " conv INTEGER PRIMARY KEY,"
    " ns_id BLOB NOT NULL,"
    " last_active REAL NOT NULL,"
    " n_tokens INTEGER NOT NULL);"
    "CREATE INDEX conversations_by_active ON conversations(last_active);"
    RESPONSES_SQL;

/* From version 1: the namespace columns (NULL in the rows already there). */
static const char UPGRADE_1_SQL[] = "ALTER TABLE runs ADD COLUMN ns_id BLOB;"
                                    "ALTER TABLE replies ADD COLUMN ns_id BLOB;"
                                    "PRAGMA user_version = 2;";
/* From version 2: the response tables. */
static const char UPGRADE_2_SQL[] = RESPONSES_SQL "PRAGMA user_version = 3;";

struct CacheStore {
    pthread_mutex_t lock;        /* held through every public call (STORE_GUARD) */
    sqlite3 *db;
    char *path;                  /* DIR/mnemo.db, or ":memory:" */
    StoreIdentity id;
    sqlite3_stmt *stmt[ST__COUNT];
    uint8_t *buf;                /* (buf_cap) scratch for token id blobs */
    size_t buf_cap;
    int fault_skip, fault_n, fault_code; /* store_fault_set */
};

/* ---- helpers: errors ----------------------------------------------------- */

/* A SQLite result code, narrowed to ours (run time). */
static int sql_code(int rc) {
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW: return MN_OK;
    case SQLITE_FULL: return MN_EFULL;
    case SQLITE_NOMEM: return MN_ENOMEM;
    default: return MN_EIO;
    }
}

/* The same at open, where the kinds of failure tell the operator more. */
static int sql_open_code(int rc) {
    switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT: return MN_EFORMAT;
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return MN_EBUSY;
    default: return sql_code(rc);
    }
}

/* Log a failed statement and convert its code. Call before resetting the
 * statement (the message belongs to the connection). */
static int sql_fail(CacheStore *s, int rc, const char *what) {
    LOG_WARN("cache store %s: %s failed: %s (SQLite %d)", s->path, what, sqlite3_errmsg(s->db), rc);
    return sql_code(rc);
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- helpers: the lock ----------------------------------------------------- */

static void guard_release(CacheStore **sp) { pthread_mutex_unlock(&(*sp)->lock); }

/* Hold s's mutex until the enclosing block ends, whichever way it ends. */
#define STORE_GUARD(s)                                                                                                 \
    CacheStore *store_guard_ __attribute__((cleanup(guard_release))) = (s);                                            \
    pthread_mutex_lock(&store_guard_->lock)

/* ---- helpers: statements ------------------------------------------------- */

/* Step a statement that returns no rows (every write goes through here);
 * reset it either way. */
static int run_done(CacheStore *s, int k, const char *what) {
    sqlite3_stmt *st = s->stmt[k];
    int rc;
    if (s->fault_n > 0 && s->fault_skip-- <= 0) {
        s->fault_n--;
        rc = s->fault_code;
        LOG_WARN("cache store %s: %s failed: injected %s (SQLite %d)", s->path, what, sqlite3_errstr(rc), rc);
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        return sql_code(rc);
    }
    rc = sqlite3_step(st);
    int out = rc == SQLITE_DONE ? MN_OK : sql_fail(s, rc, what);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return out;
}

/* A bind failed (SQLITE_NOMEM, SQLITE_TOOBIG): log, convert, reset. */
static int bind_fail(CacheStore *s, int k, int rc, const char *what) {
    int out = sql_fail(s, rc, what);
    sqlite3_reset(s->stmt[k]);
    sqlite3_clear_bindings(s->stmt[k]);
    return out;
}

/* One transaction around several statements: begin, then end with the
 * outcome (COMMIT when out is MN_OK, else ROLLBACK); returns out, or the
 * commit's failure. */
static int tx_begin(CacheStore *s, const char *what) {
    int rc = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    return rc == SQLITE_OK ? MN_OK : sql_fail(s, rc, what);
}

static int tx_end(CacheStore *s, int out, const char *what) {
    int rc = sqlite3_exec(s->db, out == MN_OK ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    return out == MN_OK && rc != SQLITE_OK ? sql_fail(s, rc, what) : out;
}

static int count_rows(CacheStore *s, int k, int64_t *out, const char *what) {
    sqlite3_stmt *st = s->stmt[k];
    int rc = sqlite3_step(st);
    int code = MN_OK;
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
    else code = sql_fail(s, rc, what);
    sqlite3_reset(st);
    return code;
}

static int buf_reserve(CacheStore *s, size_t n) {
    if (n <= s->buf_cap) return MN_OK;
    size_t cap = s->buf_cap ? s->buf_cap : 256;
    while (cap < n) {
        if (cap > SIZE_MAX / 2) return MN_ENOMEM;
        cap *= 2;
    }
    uint8_t *b = mn_realloc(s->buf, cap);
    if (b == NULL) return MN_ENOMEM;
    s->buf = b;
    s->buf_cap = cap;
    return MN_OK;
}

/* ---- helpers: open --------------------------------------------------------- */

/* Run one statement of SQL text at open; on failure fill err. */
static int open_exec(CacheStore *s, const char *sql, MnErr *err) {
    char *msg = NULL;
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, &msg);
    if (rc == SQLITE_OK) return MN_OK;
    int code = sql_open_code(rc);
    if (code == MN_EFORMAT)
        mn_err_set(err, code, "cache store %s is not a SQLite database or is corrupt (%s): move it away or use "
                   "another directory", s->path, msg ? msg : sqlite3_errstr(rc));
    else if (code == MN_EBUSY)
        mn_err_set(err, code, "cache store %s is in use by another process (%s)", s->path, msg ? msg : sqlite3_errstr(rc));
    else
        mn_err_set(err, code, "cache store %s: %s: %s", s->path, sql, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return code;
}

/* Step a one-row query at open into *out (integer or text column 0). */
static int open_query(CacheStore *s, const char *sql, int64_t *out_int, char *out_text, size_t cap, MnErr *err) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            if (out_int) *out_int = sqlite3_column_int64(st, 0);
            if (out_text) {
                const unsigned char *t = sqlite3_column_text(st, 0);
                snprintf(out_text, cap, "%s", t ? (const char *)t : "");
            }
            rc = SQLITE_OK;
        }
    }
    if (rc == SQLITE_OK) {
        sqlite3_finalize(st);
        return MN_OK;
    }
    int code = sql_open_code(rc);
    const char *msg = sqlite3_errmsg(s->db);
    if (code == MN_EFORMAT)
        mn_err_set(err, code, "cache store %s is not a SQLite database or is corrupt (%s): move it away or use "
                   "another directory", s->path, msg);
    else if (code == MN_EBUSY)
        mn_err_set(err, code, "cache store %s is in use by another process (%s)", s->path, msg);
    else
        mn_err_set(err, code, "cache store %s: %s: %s", s->path, sql, msg);
    sqlite3_finalize(st);
    return code;
}

static int create_schema(CacheStore *s, const StoreIdentity *id, MnErr *err) {
    int rc = open_exec(s, SCHEMA_SQL, err);
    if (rc != MN_OK) return rc;
    sqlite3_stmt *st = NULL;
    int src = sqlite3_prepare_v2(s->db,
                                 "INSERT INTO identity(id, model_fingerprint, kv_format, n_layer, block_bytes, created) "
                                 "VALUES (1, ?1, ?2, ?3, ?4, ?5)",
                                 -1, &st, NULL);
    if (src == SQLITE_OK) src = sqlite3_bind_blob(st, 1, id->model_fingerprint.b, 16, SQLITE_STATIC);
    if (src == SQLITE_OK) src = sqlite3_bind_int64(st, 2, (sqlite3_int64)id->kv_format);
    if (src == SQLITE_OK) src = sqlite3_bind_int64(st, 3, (sqlite3_int64)id->n_layer);
    if (src == SQLITE_OK) src = sqlite3_bind_int64(st, 4, (sqlite3_int64)id->block_bytes);
    if (src == SQLITE_OK) src = sqlite3_bind_double(st, 5, wall_now());
    if (src == SQLITE_OK) src = sqlite3_step(st);
    if (src != SQLITE_DONE) {
        rc = mn_err_set(err, sql_open_code(src), "cache store %s: cannot record its identity: %s", s->path,
                        sqlite3_errmsg(s->db));
        sqlite3_finalize(st);
        return rc;
    }
    sqlite3_finalize(st);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", STORE_SCHEMA_VERSION);
    return open_exec(s, sql, err);
}

/* The identity row into *have (*fp_ok: its fingerprint is 16 bytes). */
static int read_identity(CacheStore *s, StoreIdentity *have, bool *fp_ok, MnErr *err) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, "SELECT model_fingerprint, kv_format, n_layer, block_bytes FROM identity "
                                       "WHERE id = 1", -1, &st, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        int code = rc == SQLITE_DONE ? MN_EFORMAT : sql_open_code(rc);
        mn_err_set(err, code, "cache store %s: no identity row (%s): move it away or use another directory", s->path,
                   rc == SQLITE_DONE ? "the table is empty" : sqlite3_errmsg(s->db));
        sqlite3_finalize(st);
        return code;
    }
    *have = (StoreIdentity){0};
    const void *fp = sqlite3_column_blob(st, 0);
    *fp_ok = fp != NULL && sqlite3_column_bytes(st, 0) == 16;
    if (*fp_ok) memcpy(have->model_fingerprint.b, fp, 16);
    have->kv_format = (uint32_t)sqlite3_column_int64(st, 1);
    have->n_layer = (int)sqlite3_column_int64(st, 2);
    have->block_bytes = (uint64_t)sqlite3_column_int64(st, 3);
    sqlite3_finalize(st);
    return MN_OK;
}

/* The identity row against *want: MN_OK, or MN_EINVAL naming what differs. */
static int check_identity(CacheStore *s, const StoreIdentity *want, MnErr *err) {
    StoreIdentity have;
    bool fp_ok;
    int rc = read_identity(s, &have, &fp_ok, err);
    if (rc != MN_OK) return rc;
    char what[400] = "";
    size_t at = 0;
    if (!fp_ok || !hash128_eq(&have.model_fingerprint, &want->model_fingerprint)) {
        char a[33], b[33];
        hash128_hex(&have.model_fingerprint, a);
        hash128_hex(&want->model_fingerprint, b);
        at += (size_t)snprintf(what + at, sizeof what - at, "model fingerprint %s, this model %s; ", a, b);
    }
    if (at < sizeof what && have.kv_format != want->kv_format)
        at += (size_t)snprintf(what + at, sizeof what - at, "KV format %#x, now %#x; ", have.kv_format, want->kv_format);
    if (at < sizeof what && have.n_layer != want->n_layer)
        at += (size_t)snprintf(what + at, sizeof what - at, "%d layers, now %d; ", have.n_layer, want->n_layer);
    if (at < sizeof what && have.block_bytes != want->block_bytes)
        at += (size_t)snprintf(what + at, sizeof what - at, "%llu bytes per block, now %llu; ",
                               (unsigned long long)have.block_bytes, (unsigned long long)want->block_bytes);
    if (at == 0) return MN_OK;
    if (at >= 2 && at < sizeof what) what[at - 2] = '\0';
    return mn_err_set(err, MN_EINVAL,
                      "cache store %s was made for another model or cache layout (%s): use another directory, or move "
                      "the directory's contents away to start an empty cache",
                      s->path, what);
}

/* Version (upgrading version 1), schema and identity, inside one write
 * transaction. want NULL: a database that exists already, whose identity
 * is taken as it is. */
static int open_schema(CacheStore *s, const StoreIdentity *want, MnErr *err) {
    int rc = open_exec(s, "BEGIN IMMEDIATE", err);
    if (rc != MN_OK) return rc;
    int64_t version = 0, n_objects = 0;
    rc = open_query(s, "PRAGMA user_version", &version, NULL, 0, err);
    if (rc == MN_OK && version == 0)
        rc = open_query(s, "SELECT count(*) FROM sqlite_schema", &n_objects, NULL, 0, err);
    if (rc == MN_OK && version == 1) {
        rc = open_exec(s, UPGRADE_1_SQL, err);
        if (rc == MN_OK) version = 2;
    }
    if (rc == MN_OK && version == 2) {
        rc = open_exec(s, UPGRADE_2_SQL, err);
        if (rc == MN_OK) version = 3;
    }
    if (rc == MN_OK && version == 0 && n_objects == 0 && want == NULL) {
        rc = mn_err_set(err, MN_ENOTFOUND, "cache store %s is empty: no cache was ever stored there", s->path);
    } else if (rc == MN_OK && version == 0 && n_objects == 0) {
        rc = create_schema(s, want, err);
    } else if (rc == MN_OK && version != STORE_SCHEMA_VERSION) {
        if (version == 0)
            rc = mn_err_set(err, MN_EUNSUPPORTED,
                            "%s is a SQLite database but not a mnemo cache store (schema version 0, this build "
                            "uses %d): move it away or use another directory",
                            s->path, STORE_SCHEMA_VERSION);
        else
            rc = mn_err_set(err, MN_EUNSUPPORTED,
                            "cache store %s has schema version %lld, this build uses %d: move the file away (the "
                            "cache starts empty) or use another directory",
                            s->path, (long long)version, STORE_SCHEMA_VERSION);
    } else if (rc == MN_OK && want != NULL) {
        rc = check_identity(s, want, err);
    } else if (rc == MN_OK) {
        bool fp_ok;
        rc = read_identity(s, &s->id, &fp_ok, err);
    }
    if (rc != MN_OK) {
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return rc;
    }
    return open_exec(s, "COMMIT", err);
}

/* ---- open, close ------------------------------------------------------------ */

/* The file's settings: exclusive lock, WAL, full sync, zeroed deletes,
 * and a quick integrity check. */
static int open_file_pragmas(CacheStore *s, MnErr *err) {
    /* exclusive first, so the WAL index never goes to a -shm file */
    int rc = open_exec(s, "PRAGMA locking_mode = EXCLUSIVE", err);
    if (rc != MN_OK) return rc;
    char mode[32];
    rc = open_query(s, "PRAGMA journal_mode = WAL", NULL, mode, sizeof mode, err); /* reads the file: NOTADB here */
    if (rc != MN_OK) return rc;
    if (strcmp(mode, "wal") != 0)
        return mn_err_set(err, MN_EIO, "cache store %s: cannot use WAL mode (journal mode stays %s)", s->path, mode);
    rc = open_exec(s, "PRAGMA synchronous = FULL", err);
    if (rc == MN_OK) rc = open_exec(s, "PRAGMA secure_delete = ON", err);
    if (rc == MN_OK) rc = open_exec(s, "PRAGMA temp_store = MEMORY", err);
    if (rc != MN_OK) return rc;
    char check[128];
    rc = open_query(s, "PRAGMA quick_check(1)", NULL, check, sizeof check, err);
    if (rc != MN_OK) return rc;
    if (strcmp(check, "ok") != 0)
        return mn_err_set(err, MN_EFORMAT, "cache store %s is corrupt (%s): move it away or use another directory",
                          s->path, check);
    return MN_OK;
}

/* An in-memory database has no file to lock, sync or check. */
static int open_memory_pragmas(CacheStore *s, MnErr *err) {
    int rc = open_exec(s, "PRAGMA secure_delete = ON", err);
    if (rc == MN_OK) rc = open_exec(s, "PRAGMA temp_store = MEMORY", err);
    return rc;
}

/* store_open (want: its identity; the directory and the file are made
 * when missing), store_open_existing (want NULL: both must exist) and
 * store_open_memory (dir NULL: no file at all). */
static int open_at(const char *dir, const StoreIdentity *want, CacheStore **out, MnErr *err) {
    *out = NULL;
    bool is_memory = dir == NULL;
    int rc = MN_OK;
    if (!is_memory && dir[0] == '\0') return mn_err_set(err, MN_EINVAL, "cache store: no directory");
    if (!is_memory && (rc = tierdir_prepare(dir, want != NULL, err)) != MN_OK) return rc;

    CacheStore *s = mn_calloc(1, sizeof *s);
    size_t path_len = is_memory ? sizeof ":memory:" : strlen(dir) + sizeof "/mnemo.db";
    char *path = mn_malloc(path_len);
    if (s == NULL || path == NULL) {
        mn_free(s);
        mn_free(path);
        return mn_err_set(err, MN_ENOMEM, "cache store: out of memory");
    }
    if (is_memory) snprintf(path, path_len, ":memory:");
    else snprintf(path, path_len, "%s/mnemo.db", dir);
    s->path = path;
    pthread_mutex_init(&s->lock, NULL);
    if (want != NULL) s->id = *want;

    struct stat st;
    if (is_memory) {
        /* nothing on disk */
    } else if (want != NULL) {
        rc = tierdir_create_private(path, err); /* 0600 before SQLite makes it with the umask's mode */
        if (rc != MN_OK) goto fail;
    } else if (stat(path, &st) != 0) {
        rc = mn_err_set(err, errno == ENOENT ? MN_ENOTFOUND : MN_EIO, "cache store %s: %s%s", path, strerror(errno),
                        errno == ENOENT ? " (no cache was ever stored in that directory)" : "");
        goto fail;
    }
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (is_memory ? SQLITE_OPEN_CREATE : 0);
    int src = sqlite3_open_v2(path, &s->db, flags, NULL);
    if (src != SQLITE_OK) {
        rc = mn_err_set(err, sql_open_code(src), "cache store: cannot open %s: %s", path,
                        s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(src));
        goto fail;
    }
    sqlite3_extended_result_codes(s->db, 1);
    rc = is_memory ? open_memory_pragmas(s, err) : open_file_pragmas(s, err);
    if (rc != MN_OK) goto fail;
    rc = open_schema(s, want, err);
    if (rc != MN_OK) goto fail;
    for (int k = 0; k < ST__COUNT; k++) {
        src = sqlite3_prepare_v3(s->db, STMT_SQL[k], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[k], NULL);
        if (src != SQLITE_OK) {
            rc = mn_err_set(err, sql_open_code(src), "cache store %s: cannot prepare \"%s\": %s", path, STMT_SQL[k],
                            sqlite3_errmsg(s->db));
            goto fail;
        }
    }
    *out = s;
    return MN_OK;

fail:
    for (int k = 0; k < ST__COUNT; k++) sqlite3_finalize(s->stmt[k]);
    sqlite3_close_v2(s->db);
    mn_free(s->path);
    pthread_mutex_destroy(&s->lock);
    mn_free(s);
    return rc;
}

int store_open(const char *dir, const StoreIdentity *id, CacheStore **out, MnErr *err) {
    if (id == NULL || dir == NULL) {
        *out = NULL;
        return mn_err_set(err, MN_EINVAL, "cache store: no identity or no directory");
    }
    return open_at(dir, id, out, err);
}

int store_open_existing(const char *dir, CacheStore **out, MnErr *err) {
    if (dir == NULL) {
        *out = NULL;
        return mn_err_set(err, MN_EINVAL, "cache store: no directory");
    }
    return open_at(dir, NULL, out, err);
}

int store_open_memory(CacheStore **out, MnErr *err) {
    StoreIdentity none = {0};
    return open_at(NULL, &none, out, err);
}

/* A checkpoint of an in-memory database does nothing (and needs nothing). */
static int checkpoint(CacheStore *s) {
    int rc = sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
    return rc == SQLITE_OK ? MN_OK : sql_fail(s, rc, "checkpoint");
}

int store_checkpoint(CacheStore *s) {
    STORE_GUARD(s);
    return checkpoint(s);
}

void store_close(CacheStore *s) {
    if (s == NULL) return;
    for (int k = 0; k < ST__COUNT; k++) sqlite3_finalize(s->stmt[k]);
    checkpoint(s); /* logged when it fails; closing checkpoints again anyway */
    int rc = sqlite3_close_v2(s->db);
    if (rc != SQLITE_OK) LOG_WARN("cache store %s: close failed: %s", s->path, sqlite3_errstr(rc));
    mn_free(s->buf);
    mn_free(s->path);
    pthread_mutex_destroy(&s->lock);
    mn_free(s);
}

const StoreIdentity *store_identity(const CacheStore *s) { return &s->id; }
const char *store_path(const CacheStore *s) { return s->path; }

/* ---- runs ------------------------------------------------------------------ */

/* A namespace id as a 16-byte blob, or NULL. */
static int bind_ns(sqlite3_stmt *st, int i, const Hash128 *ns_id) {
    return ns_id != NULL ? sqlite3_bind_blob(st, i, ns_id->b, 16, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

int store_run_put(CacheStore *s, uint64_t run_id, const void *record, size_t len, double last_used,
                  const Hash128 *ns_id) {
    STORE_GUARD(s);
    if (len > INT32_MAX) return MN_EINVAL;
    sqlite3_stmt *st = s->stmt[ST_RUN_PUT];
    int rc = sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_blob(st, 2, record, (int)len, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 3, last_used);
    if (rc == SQLITE_OK) rc = bind_ns(st, 4, ns_id);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RUN_PUT, rc, "storing a run record");
    return run_done(s, ST_RUN_PUT, "storing a run record");
}

/* A touch is worth no fsync: it commits with synchronous=NORMAL (atomic,
 * synced with the next FULL commit or checkpoint). PRAGMA synchronous
 * takes effect when the pragma is compiled, so it is exec'd each time. */
int store_run_touch(CacheStore *s, uint64_t run_id, double last_used) {
    STORE_GUARD(s);
    sqlite3_stmt *st = s->stmt[ST_RUN_TOUCH];
    int rc = sqlite3_bind_int64(st, 1, (sqlite3_int64)run_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 2, last_used);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RUN_TOUCH, rc, "touching a run record");
    rc = sqlite3_exec(s->db, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RUN_TOUCH, rc, "touching a run record");
    int out = run_done(s, ST_RUN_TOUCH, "touching a run record");
    rc = sqlite3_exec(s->db, "PRAGMA synchronous = FULL", NULL, NULL, NULL);
    if (rc != SQLITE_OK && out == MN_OK) out = sql_fail(s, rc, "restoring synchronous=FULL");
    return out;
}

int store_run_delete(CacheStore *s, uint64_t run_id) {
    STORE_GUARD(s);
    int rc = sqlite3_bind_int64(s->stmt[ST_RUN_DELETE], 1, (sqlite3_int64)run_id);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RUN_DELETE, rc, "deleting a run record");
    return run_done(s, ST_RUN_DELETE, "deleting a run record");
}

int store_run_foreach(CacheStore *s, StoreRunFn fn, void *ctx) {
    STORE_GUARD(s);
    sqlite3_stmt *st = s->stmt[ST_RUN_ALL];
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        uint64_t run_id = (uint64_t)sqlite3_column_int64(st, 0);
        const void *rec = sqlite3_column_blob(st, 1);
        int len = sqlite3_column_bytes(st, 1);
        double last_used = sqlite3_column_double(st, 2);
        const void *ns = sqlite3_column_blob(st, 3);
        Hash128 ns_id;
        bool has_ns = ns != NULL && sqlite3_column_bytes(st, 3) == 16;
        if (has_ns) memcpy(ns_id.b, ns, 16);
        int r = fn(ctx, run_id, rec != NULL ? rec : (const void *)"", (size_t)len, last_used, has_ns ? &ns_id : NULL);
        if (r != 0) {
            sqlite3_reset(st);
            return r;
        }
    }
    int out = rc == SQLITE_DONE ? MN_OK : sql_fail(s, rc, "reading the run records");
    sqlite3_reset(st);
    return out;
}

int store_run_count(CacheStore *s, int64_t *out) {
    STORE_GUARD(s);
    return count_rows(s, ST_RUN_COUNT, out, "counting run records");
}

/* ---- replies ----------------------------------------------------------------- */

static Hash128 reply_entry(const Hash128 *key, const char *text, size_t len) {
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, key->b, 16);
    hasher_update(&h, text, len);
    return hasher_final(&h);
}

int store_reply_put(CacheStore *s, const Hash128 *ns_id, const Hash128 *key, const char *text, size_t len,
                    const int32_t *ids, size_t n, double when) {
    STORE_GUARD(s);
    if (len > INT32_MAX || n > INT32_MAX / 4) return MN_EINVAL;
    int code = buf_reserve(s, 4 * n + 1);
    if (code != MN_OK) return code;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) s->buf[4 * i + (size_t)b] = (uint8_t)(v >> (8 * b));
    }
    Hash128 entry = reply_entry(key, text, len);
    sqlite3_stmt *st = s->stmt[ST_REPLY_PUT];
    int rc = sqlite3_bind_blob(st, 1, entry.b, 16, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_blob(st, 2, key->b, 16, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_blob(st, 3, len ? text : "", (int)len, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_blob(st, 4, s->buf, (int)(4 * n), SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 5, when);
    if (rc == SQLITE_OK) rc = bind_ns(st, 6, ns_id);
    if (rc != SQLITE_OK) return bind_fail(s, ST_REPLY_PUT, rc, "storing a reply");
    return run_done(s, ST_REPLY_PUT, "storing a reply");
}

int store_reply_load(CacheStore *s, ReplyMemory *rm, int max_entries) {
    STORE_GUARD(s);
    if (max_entries <= 0) return MN_OK;
    sqlite3_stmt *st = s->stmt[ST_REPLY_LOAD];
    int rc = sqlite3_bind_int64(st, 1, max_entries);
    if (rc != SQLITE_OK) return bind_fail(s, ST_REPLY_LOAD, rc, "loading replies");
    int out = MN_OK;
    while (out == MN_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const void *key = sqlite3_column_blob(st, 0);
        int key_len = sqlite3_column_bytes(st, 0);
        const void *text = sqlite3_column_blob(st, 1);
        int text_len = sqlite3_column_bytes(st, 1);
        const uint8_t *raw = sqlite3_column_blob(st, 2);
        int raw_len = sqlite3_column_bytes(st, 2);
        if (key == NULL || key_len != 16 || raw_len % 4 != 0) {
            LOG_WARN("cache store %s: skipping a malformed reply row (key %d bytes, ids %d bytes)", s->path, key_len,
                     raw_len);
            continue;
        }
        size_t n = (size_t)raw_len / 4;
        out = buf_reserve(s, (n ? n : 1) * sizeof(int32_t));
        if (out != MN_OK) break;
        int32_t *ids = (int32_t *)(void *)s->buf; /* buf comes from malloc: aligned for int32 */
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = raw + 4 * i;
            ids[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        }
        Hash128 k;
        memcpy(k.b, key, 16);
        out = replymem_put(rm, &k, text != NULL ? text : "", (size_t)text_len, ids, n);
    }
    if (out == MN_OK && rc != SQLITE_DONE) out = sql_fail(s, rc, "loading replies");
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return out;
}

int store_reply_trim(CacheStore *s, int max_entries) {
    STORE_GUARD(s);
    if (max_entries < 0) return MN_EINVAL;
    int rc = sqlite3_bind_int64(s->stmt[ST_REPLY_TRIM], 1, max_entries);
    if (rc != SQLITE_OK) return bind_fail(s, ST_REPLY_TRIM, rc, "trimming replies");
    return run_done(s, ST_REPLY_TRIM, "trimming replies");
}

int store_reply_count(CacheStore *s, int64_t *out) {
    STORE_GUARD(s);
    return count_rows(s, ST_REPLY_COUNT, out, "counting replies");
}

/* ---- conversations ------------------------------------------------------------- */

int store_conv_put(CacheStore *s, uint64_t conv, const Hash128 *ns_id, double last_active, int64_t n_tokens) {
    STORE_GUARD(s);
    if (conv == 0) return MN_OK;
    sqlite3_stmt *st = s->stmt[ST_CONV_PUT];
    int rc = sqlite3_bind_int64(st, 1, (sqlite3_int64)conv);
    if (rc == SQLITE_OK) rc = sqlite3_bind_blob(st, 2, ns_id->b, 16, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 3, last_active);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 4, n_tokens);
    if (rc != SQLITE_OK) return bind_fail(s, ST_CONV_PUT, rc, "storing a conversation");
    return run_done(s, ST_CONV_PUT, "storing a conversation");
}

int store_conv_count(CacheStore *s, int64_t *out) {
    STORE_GUARD(s);
    return count_rows(s, ST_CONV_COUNT, out, "counting conversations");
}

int store_conv_foreach(CacheStore *s, StoreConvFn fn, void *ctx) {
    STORE_GUARD(s);
    sqlite3_stmt *st = s->stmt[ST_CONV_ALL];
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        uint64_t conv = (uint64_t)sqlite3_column_int64(st, 0);
        Hash128 ns = {0};
        const void *b = sqlite3_column_blob(st, 1);
        if (b != NULL && sqlite3_column_bytes(st, 1) == 16) memcpy(ns.b, b, 16);
        double last_active = sqlite3_column_double(st, 2);
        int64_t n_tokens = sqlite3_column_int64(st, 3);
        int r = fn(ctx, conv, &ns, last_active, n_tokens);
        if (r != 0) {
            sqlite3_reset(st);
            return r;
        }
    }
    int out = rc == SQLITE_DONE ? MN_OK : sql_fail(s, rc, "reading the conversations");
    sqlite3_reset(st);
    return out;
}

int store_conv_expire(CacheStore *s, double cutoff) {
    STORE_GUARD(s);
    int rc = sqlite3_bind_double(s->stmt[ST_CONV_EXPIRE], 1, cutoff);
    if (rc != SQLITE_OK) return bind_fail(s, ST_CONV_EXPIRE, rc, "expiring conversations");
    return run_done(s, ST_CONV_EXPIRE, "expiring conversations");
}

/* ---- responses ------------------------------------------------------------------- */

static int bind_text(sqlite3_stmt *st, int i, const char *text) {
    return text != NULL ? sqlite3_bind_text(st, i, text, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

static int bind_bytes(sqlite3_stmt *st, int i, const char *p, size_t len) {
    if (len > INT32_MAX) return SQLITE_TOOBIG;
    return sqlite3_bind_blob(st, i, len ? p : "", (int)len, SQLITE_STATIC);
}

/* A copy of column i (text or blob) with a NUL after it; NULL when out of
 * memory. *len gets its length (without the NUL). */
static char *column_copy(sqlite3_stmt *st, int i, size_t *len) {
    const void *p = sqlite3_column_blob(st, i);
    size_t n = (size_t)sqlite3_column_bytes(st, i);
    char *c = mn_malloc(n + 1);
    if (c == NULL) return NULL;
    if (n) memcpy(c, p, n);
    c[n] = '\0';
    if (len) *len = n;
    return c;
}

/* Insert r and its inputs; inside the caller's transaction. */
static int resp_insert(CacheStore *s, const Hash128 *ns_id, const StoreResp *r) {
    sqlite3_stmt *st = s->stmt[ST_RESP_PUT];
    int rc = bind_text(st, 1, r->id);
    if (rc == SQLITE_OK) rc = bind_ns(st, 2, ns_id);
    if (rc == SQLITE_OK) rc = bind_text(st, 3, r->previous_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 4, r->created);
    if (rc == SQLITE_OK) rc = bind_bytes(st, 5, r->body, r->body_len);
    if (rc == SQLITE_OK) rc = bind_bytes(st, 6, r->output, r->output_len);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RESP_PUT, rc, "storing a response");
    int out = run_done(s, ST_RESP_PUT, "storing a response");
    st = s->stmt[ST_RESP_INPUT_PUT];
    for (size_t i = 0; out == MN_OK && i < r->n_inputs; i++) {
        const StoreRespItem *it = &r->inputs[i];
        rc = bind_text(st, 1, r->id);
        if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, (sqlite3_int64)i);
        if (rc == SQLITE_OK) rc = bind_text(st, 3, it->item_id);
        if (rc == SQLITE_OK) rc = bind_text(st, 4, it->role);
        if (rc == SQLITE_OK) rc = bind_bytes(st, 5, it->content, it->content_len);
        out = rc != SQLITE_OK ? bind_fail(s, ST_RESP_INPUT_PUT, rc, "storing a response's input")
                              : run_done(s, ST_RESP_INPUT_PUT, "storing a response's input");
    }
    return out;
}

int store_resp_put(CacheStore *s, const Hash128 *ns_id, const StoreResp *r) {
    STORE_GUARD(s);
    int rc = tx_begin(s, "storing a response (begin)");
    if (rc != MN_OK) return rc;
    int out = resp_insert(s, ns_id, r);
    out = tx_end(s, out, "storing a response (commit)");
    return out;
}

void store_resp_deinit(StoreResp *r) {
    if (r == NULL) return;
    for (size_t i = 0; i < r->n_inputs; i++) {
        mn_free((char *)r->inputs[i].item_id);
        mn_free((char *)r->inputs[i].role);
        mn_free((char *)r->inputs[i].content);
    }
    mn_free(r->inputs);
    mn_free((char *)r->id);
    mn_free((char *)r->previous_id);
    mn_free((char *)r->body);
    mn_free((char *)r->output);
    *r = (StoreResp){0};
}

/* The input rows of response id into r (its id already set). */
static int resp_read_inputs(CacheStore *s, StoreResp *r) {
    sqlite3_stmt *st = s->stmt[ST_RESP_INPUTS];
    int rc = bind_text(st, 1, r->id);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RESP_INPUTS, rc, "reading a response's input");
    int out = MN_OK;
    size_t cap = 0;
    while (out == MN_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (r->n_inputs == cap) {
            size_t n = cap ? 2 * cap : 4;
            StoreRespItem *grown = mn_realloc(r->inputs, n * sizeof *grown);
            if (grown == NULL) {
                out = MN_ENOMEM;
                break;
            }
            r->inputs = grown;
            cap = n;
        }
        StoreRespItem *it = &r->inputs[r->n_inputs];
        *it = (StoreRespItem){0};
        r->n_inputs++; /* freed by store_resp_deinit even when half made */
        it->item_id = column_copy(st, 0, NULL);
        it->role = column_copy(st, 1, NULL);
        it->content = column_copy(st, 2, &it->content_len);
        if (it->item_id == NULL || it->role == NULL || it->content == NULL) out = MN_ENOMEM;
    }
    if (out == MN_OK && rc != SQLITE_DONE) out = sql_fail(s, rc, "reading a response's input");
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return out;
}

/* The response row of (ns_id, id) used at or after cutoff into *out. */
static int resp_read(CacheStore *s, const Hash128 *ns_id, const char *id, double cutoff, StoreResp *out) {
    sqlite3_stmt *st = s->stmt[ST_RESP_GET];
    int rc = bind_text(st, 1, id);
    if (rc == SQLITE_OK) rc = bind_ns(st, 2, ns_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 3, cutoff);
    if (rc != SQLITE_OK) return bind_fail(s, ST_RESP_GET, rc, "reading a response");
    rc = sqlite3_step(st);
    int code = MN_OK;
    if (rc == SQLITE_ROW) {
        out->id = mn_strdup(id);
        if (sqlite3_column_type(st, 0) != SQLITE_NULL) out->previous_id = column_copy(st, 0, NULL);
        out->created = sqlite3_column_double(st, 1);
        out->used = sqlite3_column_double(st, 2);
        out->body = column_copy(st, 3, &out->body_len);
        out->output = column_copy(st, 4, &out->output_len);
        if (out->id == NULL || out->body == NULL || out->output == NULL ||
            (sqlite3_column_type(st, 0) != SQLITE_NULL && out->previous_id == NULL))
            code = MN_ENOMEM;
    } else {
        code = rc == SQLITE_DONE ? MN_ENOTFOUND : sql_fail(s, rc, "reading a response");
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return code;
}

int store_resp_get(CacheStore *s, const Hash128 *ns_id, const char *id, double cutoff, StoreResp *out) {
    STORE_GUARD(s);
    *out = (StoreResp){0};
    int rc = resp_read(s, ns_id, id, cutoff, out);
    if (rc == MN_OK) rc = resp_read_inputs(s, out);
    if (rc != MN_OK) store_resp_deinit(out);
    return rc;
}

int store_resp_delete(CacheStore *s, const Hash128 *ns_id, const char *id) {
    STORE_GUARD(s);
    int rc = tx_begin(s, "deleting a response (begin)");
    if (rc != MN_OK) return rc;
    sqlite3_stmt *st = s->stmt[ST_RESP_DELETE];
    rc = bind_text(st, 1, id);
    if (rc == SQLITE_OK) rc = bind_ns(st, 2, ns_id);
    int out = rc != SQLITE_OK ? bind_fail(s, ST_RESP_DELETE, rc, "deleting a response")
                              : run_done(s, ST_RESP_DELETE, "deleting a response");
    bool found = out == MN_OK && sqlite3_changes64(s->db) > 0;
    if (found) {
        rc = bind_text(s->stmt[ST_RESP_INPUT_DELETE], 1, id);
        out = rc != SQLITE_OK ? bind_fail(s, ST_RESP_INPUT_DELETE, rc, "deleting a response's input")
                              : run_done(s, ST_RESP_INPUT_DELETE, "deleting a response's input");
    }
    out = tx_end(s, out, "deleting a response (commit)");
    return out == MN_OK && !found ? MN_ENOTFOUND : out;
}

int store_resp_touch(CacheStore *s, const Hash128 *ns_id, const char *const *ids, size_t n, double when) {
    STORE_GUARD(s);
    int rc = tx_begin(s, "touching responses (begin)");
    if (rc != MN_OK) return rc;
    int out = MN_OK;
    sqlite3_stmt *st = s->stmt[ST_RESP_TOUCH];
    for (size_t i = 0; out == MN_OK && i < n; i++) {
        rc = bind_text(st, 1, ids[i]);
        if (rc == SQLITE_OK) rc = bind_ns(st, 2, ns_id);
        if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 3, when);
        out = rc != SQLITE_OK ? bind_fail(s, ST_RESP_TOUCH, rc, "touching a response")
                              : run_done(s, ST_RESP_TOUCH, "touching a response");
    }
    out = tx_end(s, out, "touching responses (commit)");
    return out;
}

int store_resp_expire(CacheStore *s, double cutoff, int64_t *n_expired) {
    STORE_GUARD(s);
    *n_expired = 0;
    int rc = tx_begin(s, "expiring responses (begin)");
    if (rc != MN_OK) return rc;
    rc = sqlite3_bind_double(s->stmt[ST_RESP_EXPIRE_INPUTS], 1, cutoff);
    int out = rc != SQLITE_OK ? bind_fail(s, ST_RESP_EXPIRE_INPUTS, rc, "expiring responses' inputs")
                              : run_done(s, ST_RESP_EXPIRE_INPUTS, "expiring responses' inputs");
    if (out == MN_OK) {
        rc = sqlite3_bind_double(s->stmt[ST_RESP_EXPIRE], 1, cutoff);
        out = rc != SQLITE_OK ? bind_fail(s, ST_RESP_EXPIRE, rc, "expiring responses")
                              : run_done(s, ST_RESP_EXPIRE, "expiring responses");
        if (out == MN_OK) *n_expired = sqlite3_changes64(s->db);
    }
    out = tx_end(s, out, "expiring responses (commit)");
    if (out != MN_OK) *n_expired = 0;
    return out;
}

int store_resp_count(CacheStore *s, int64_t *out) {
    STORE_GUARD(s);
    return count_rows(s, ST_RESP_COUNT, out, "counting responses");
}

/* ---- purge ------------------------------------------------------------------------- */

/* Run one DELETE with ?1 bound to the namespace (NULL: every row); *n_out
 * the rows it deleted. Inside the caller's transaction. */
static int purge_table(CacheStore *s, const char *sql, const Hash128 *ns_id, int64_t *n_out) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) rc = bind_ns(st, 1, ns_id);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    int out = rc == SQLITE_DONE ? MN_OK : sql_fail(s, rc, "purging");
    if (out == MN_OK) *n_out = sqlite3_changes64(s->db);
    sqlite3_finalize(st);
    return out;
}

int store_purge(CacheStore *s, const Hash128 *ns_id, StorePurged *out_n) {
    STORE_GUARD(s);
    *out_n = (StorePurged){0};
    int64_t n_inputs = 0;
    int rc = tx_begin(s, "purging (begin)");
    if (rc != MN_OK) return rc;
    int out = purge_table(s, "DELETE FROM replies WHERE ?1 IS NULL OR ns_id = ?1 OR ns_id IS NULL", ns_id,
                          &out_n->n_replies);
    if (out == MN_OK)
        out = purge_table(s, "DELETE FROM conversations WHERE ?1 IS NULL OR ns_id = ?1", ns_id, &out_n->n_convs);
    if (out == MN_OK)
        out = purge_table(s, "DELETE FROM response_inputs WHERE response_id IN "
                             "(SELECT id FROM responses WHERE ?1 IS NULL OR ns_id = ?1)", ns_id, &n_inputs);
    if (out == MN_OK)
        out = purge_table(s, "DELETE FROM responses WHERE ?1 IS NULL OR ns_id = ?1", ns_id, &out_n->n_responses);
    out = tx_end(s, out, "purging (commit)");
    if (out != MN_OK) return out;
    /* secure_delete zeroed what the deletes freed; VACUUM rewrites the file
     * from the live rows only (free pages and old slack included), and the
     * checkpoint moves that into the database and truncates the WAL */
    rc = sqlite3_exec(s->db, "VACUUM", NULL, NULL, NULL);
    if (rc != SQLITE_OK) return sql_fail(s, rc, "compacting after a purge (VACUUM)");
    return checkpoint(s);
}

/* ---- tests ------------------------------------------------------------------------ */

void store_fault_set(CacheStore *s, int n_skip, int n_fail, int sqlite_code) {
    STORE_GUARD(s);
    s->fault_skip = n_skip;
    s->fault_n = n_fail;
    s->fault_code = sqlite_code;
}
