/* cost.c — the recompute cost model (see cost.h): interpolation, the
 * machine key, and the profile file that caches a model across restarts.
 *
 * A CostModel is a value type: nothing here allocates except the temporary
 * path of cost_save, and nothing keeps state between calls. Invariants
 * (cost_validate): tok_sec finite and > 0; 0 <= n_knots <= COST_MAX_KNOTS;
 * knot_ctx strictly increasing and > 0; knot_attn_sec finite and >= 0;
 * key.block_tokens in [1, COST_MAX_BLOCK_TOKENS]; key.cpu and key.build
 * printable ASCII, NUL-terminated.
 *
 * Profile file format, version 2. ASCII text, lines ending in LF (0x0A),
 * fields separated by one space, in exactly this order:
 *
 *     mnemo-cost-profile 2              magic and format version
 *     model <32 lower-case hex>         CostKey.model, hash128_hex order
 *     cpu <text>                        CostKey.cpu: printable ASCII, < 128 bytes
 *     n_cpus <int>
 *     n_threads <int>
 *     block_tokens <int>
 *     kv_type <int>                     MnType value
 *     build <text>                      CostKey.build: printable ASCII, < 64 bytes
 *     tok_sec <double>                  printed with %.17g, so it reads back exactly
 *     knots <n>
 *     knot <ctx> <attn_sec>             n lines, ctx increasing
 *     checksum <32 lower-case hex>      XXH3-128 of every byte before this line
 *
 * A file is valid when it is at most COST_FILE_MAX bytes, contains no NUL,
 * ends with the checksum line and its LF, the checksum matches, every line
 * parses completely, and the resulting model passes cost_validate. A file
 * cut short loses its checksum line and is rejected as truncated; any other
 * damage fails the checksum. The file is written to a temporary name in
 * the same directory and renamed over the old one, so readers never see a
 * half-written profile.
 */
#include "cache/cost.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "base/mem.h"
#include "base/utf8.h"
#include "base/version.h"

#define COST_MAGIC "mnemo-cost-profile"
#define COST_VERSION 2 /* 1 had no build line */
#define COST_FILE_MAX 65536
#define COST_MAX_BLOCK_TOKENS 65536

/* ---- machine key ---------------------------------------------------------- */

/* Copy src (up to n bytes or NUL) into dst as trimmed printable ASCII. */
static void copy_printable(char *dst, size_t cap, const char *src, size_t n) {
    while (n > 0 && (*src == ' ' || *src == '\t' || *src == ':')) src++, n--;
    size_t len = 0;
    for (size_t i = 0; i < n && src[i] != '\0' && src[i] != '\n' && len + 1 < cap; i++) {
        unsigned char ch = (unsigned char)src[i];
        dst[len++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    while (len > 0 && dst[len - 1] == ' ') len--;
    dst[len] = '\0';
}

/* Value of a "key<spaces>: value" line of /proc/cpuinfo, or NULL. */
static const char *cpuinfo_value(const char *line, const char *key) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) != 0) return NULL;
    const char *p = line + n;
    while (*p == ' ' || *p == '\t') p++;
    return *p == ':' ? p + 1 : NULL;
}

static void read_cpu_model(char *out, size_t cap) {
    out[0] = '\0';
    char impl[32] = "", part[32] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (out[0] == '\0' && fgets(line, sizeof line, f)) {
            const char *v;
            if ((v = cpuinfo_value(line, "model name")) || (v = cpuinfo_value(line, "cpu model")) ||
                (v = cpuinfo_value(line, "uarch")))
                copy_printable(out, cap, v, strlen(v));
            else if (impl[0] == '\0' && (v = cpuinfo_value(line, "CPU implementer")))
                copy_printable(impl, sizeof impl, v, strlen(v));
            else if (part[0] == '\0' && (v = cpuinfo_value(line, "CPU part")))
                copy_printable(part, sizeof part, v, strlen(v));
        }
        fclose(f);
    }
    if (out[0] == '\0' && (impl[0] || part[0])) snprintf(out, cap, "implementer %s part %s", impl, part);
    if (out[0] == '\0') {
        struct utsname u;
        if (uname(&u) == 0) copy_printable(out, cap, u.machine, sizeof u.machine);
    }
    if (out[0] == '\0') snprintf(out, cap, "unknown");
}

void cost_key_init(CostKey *k, const Hash128 *model, int n_threads, int block_tokens, MnType kv_type) {
    memset(k, 0, sizeof *k);
    if (model) k->model = *model;
    read_cpu_model(k->cpu, sizeof k->cpu);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    k->n_cpus = n > 0 && n < 1000000 ? (int)n : 0;
    k->n_threads = n_threads;
    k->block_tokens = block_tokens;
    k->kv_type = (int)kv_type;
    snprintf(k->build, sizeof k->build, "%s+%s", MNEMO_VERSION, mn_build_commit());
}

bool cost_key_eq(const CostKey *a, const CostKey *b) {
    return hash128_eq(&a->model, &b->model) && strncmp(a->cpu, b->cpu, COST_CPU_LEN) == 0 &&
           a->n_cpus == b->n_cpus && a->n_threads == b->n_threads && a->block_tokens == b->block_tokens &&
           a->kv_type == b->kv_type && strncmp(a->build, b->build, COST_BUILD_LEN) == 0;
}

void cost_key_file_name(const CostKey *k, char *buf, size_t cap) {
    char model[33], machine[33];
    hash128_hex(&k->model, model);
    Hasher h;
    hasher_init(&h);
    hasher_update(&h, k->cpu, strnlen(k->cpu, COST_CPU_LEN));
    hasher_u32(&h, (uint32_t)k->n_cpus);
    Hash128 m = hasher_final(&h);
    hash128_hex(&m, machine);
    const char *kv = ttype_ggml_name((uint32_t)k->kv_type);
    snprintf(buf, cap, "cost-%s-t%d-b%d-%s-%.8s.txt", model, k->n_threads, k->block_tokens, kv ? kv : "kv", machine);
}

/* ---- building and checking ------------------------------------------------ */

/* Whether s (cap bytes) is NUL-terminated printable ASCII. */
static bool is_printable(const char *s, size_t cap) {
    const char *nul = memchr(s, '\0', cap);
    if (nul == NULL) return false;
    for (const char *c = s; c < nul; c++)
        if (*c < 0x20 || *c > 0x7e) return false;
    return true;
}

int cost_validate(const CostModel *cm, MnErr *err) {
    if (!is_printable(cm->key.cpu, COST_CPU_LEN))
        return mn_err_set(err, MN_EINVAL, "cost model: CPU string not terminated printable ASCII");
    if (!is_printable(cm->key.build, COST_BUILD_LEN))
        return mn_err_set(err, MN_EINVAL, "cost model: build string not terminated printable ASCII");
    if (cm->key.block_tokens < 1 || cm->key.block_tokens > COST_MAX_BLOCK_TOKENS)
        return mn_err_set(err, MN_EINVAL, "cost model: block size %d out of range", cm->key.block_tokens);
    if (!isfinite(cm->tok_sec) || cm->tok_sec <= 0)
        return mn_err_set(err, MN_EINVAL, "cost model: per-token cost %g is not a positive number", cm->tok_sec);
    if (cm->n_knots < 0 || cm->n_knots > COST_MAX_KNOTS)
        return mn_err_set(err, MN_EINVAL, "cost model: %d knots (limit %d)", cm->n_knots, COST_MAX_KNOTS);
    for (int i = 0; i < cm->n_knots; i++) {
        if (cm->knot_ctx[i] <= (i ? cm->knot_ctx[i - 1] : 0))
            return mn_err_set(err, MN_EINVAL, "cost model: knot %d context %d is not above the previous one", i,
                              (int)cm->knot_ctx[i]);
        if (!isfinite(cm->knot_attn_sec[i]) || cm->knot_attn_sec[i] < 0)
            return mn_err_set(err, MN_EINVAL, "cost model: knot %d attention cost %g is not a number >= 0", i,
                              cm->knot_attn_sec[i]);
    }
    return MN_OK;
}

int cost_init(CostModel *cm, const CostKey *key, double tok_sec, const int32_t *ctx, const double *attn_sec,
              int n_knots, MnErr *err) {
    if (n_knots < 0 || n_knots > COST_MAX_KNOTS)
        return mn_err_set(err, MN_EINVAL, "cost model: %d knots (limit %d)", n_knots, COST_MAX_KNOTS);
    CostModel m;
    memset(&m, 0, sizeof m);
    if (key) m.key = *key;
    m.tok_sec = tok_sec;
    m.n_knots = n_knots;
    for (int i = 0; i < n_knots; i++) {
        m.knot_ctx[i] = ctx[i];
        m.knot_attn_sec[i] = attn_sec[i];
    }
    int rc = cost_validate(&m, err);
    if (rc == MN_OK) *cm = m;
    return rc;
}

int cost_init_linear(CostModel *cm, const CostKey *key, double tok_sec, double attn_sec_per_ctx, int max_ctx,
                     MnErr *err) {
    int32_t ctx[COST_MAX_KNOTS];
    double attn[COST_MAX_KNOTS];
    int n = 0;
    for (int64_t c = 1; c <= max_ctx && n < COST_MAX_KNOTS; c *= 2) {
        ctx[n] = (int32_t)c;
        attn[n] = attn_sec_per_ctx * (double)c;
        n++;
    }
    return cost_init(cm, key, tok_sec, ctx, attn, n, err);
}

/* ---- evaluation ----------------------------------------------------------- */

double cost_attn_per_token(const CostModel *cm, double ctx) {
    int n = cm->n_knots;
    if (!(ctx > 0) || n == 0) return 0; /* also NaN */
    if (ctx >= cm->knot_ctx[n - 1]) return cm->knot_attn_sec[n - 1] * (ctx / cm->knot_ctx[n - 1]);
    int lo = 0, hi = n - 1; /* first knot with knot_ctx >= ctx */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cm->knot_ctx[mid] >= ctx) hi = mid;
        else lo = mid + 1;
    }
    double x0 = lo ? cm->knot_ctx[lo - 1] : 0, y0 = lo ? cm->knot_attn_sec[lo - 1] : 0;
    double x1 = cm->knot_ctx[lo], y1 = cm->knot_attn_sec[lo];
    return y0 + (y1 - y0) * ((ctx - x0) / (x1 - x0));
}

double cost_block(const CostModel *cm, int32_t pos) {
    return (double)cm->key.block_tokens * (cm->tok_sec + cost_attn_per_token(cm, (double)pos));
}

/* ---- the profile file ----------------------------------------------------- */

/* Append to a fixed buffer; returns false when it does not fit. */
typedef struct OutBuf {
    char *p;
    size_t len, cap;
} OutBuf;

static bool outf(OutBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool outf(OutBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len) return false;
    b->len += (size_t)n;
    return true;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int cost_save(const CostModel *cm, const char *path, MnErr *err) {
    int rc = cost_validate(cm, err);
    if (rc) return rc;
    char text[8192];
    OutBuf b = {text, 0, sizeof text};
    char hex[33];
    hash128_hex(&cm->key.model, hex);
    bool ok = outf(&b, "%s %d\nmodel %s\ncpu %s\nn_cpus %d\nn_threads %d\nblock_tokens %d\nkv_type %d\nbuild %s\n",
                   COST_MAGIC, COST_VERSION, hex, cm->key.cpu, cm->key.n_cpus, cm->key.n_threads, cm->key.block_tokens,
                   cm->key.kv_type, cm->key.build) &&
              outf(&b, "tok_sec %.17g\nknots %d\n", cm->tok_sec, cm->n_knots);
    for (int i = 0; ok && i < cm->n_knots; i++)
        ok = outf(&b, "knot %d %.17g\n", (int)cm->knot_ctx[i], cm->knot_attn_sec[i]);
    Hash128 sum = hash128(text, b.len);
    hash128_hex(&sum, hex);
    ok = ok && outf(&b, "checksum %s\n", hex);
    if (!ok) return mn_err_set(err, MN_EINVAL, "cost profile does not fit its buffer"); /* cannot happen */

    size_t tmp_len = strlen(path) + 32;
    char *tmp = mn_malloc(tmp_len);
    if (tmp == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = mn_err_set(err, MN_EIO, "cannot create %s: %s", tmp, strerror(errno));
        mn_free(tmp);
        return rc;
    }
    if (write_all(fd, text, b.len) != 0 || fsync(fd) != 0) {
        rc = mn_err_set(err, MN_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (close(fd) != 0 && rc == MN_OK) rc = mn_err_set(err, MN_EIO, "cannot write %s: %s", tmp, strerror(errno));
    if (rc == MN_OK && rename(tmp, path) != 0)
        rc = mn_err_set(err, MN_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    mn_free(tmp);
    return rc;
}

/* A cursor over the lines of the file body. */
typedef struct Lines {
    const char *p, *end;
    int line_no;
} Lines;

/* Next line (without its LF) as [*s, *s + *n); false at the end. */
static bool next_line(Lines *ls, const char **s, size_t *n) {
    if (ls->p >= ls->end) return false;
    const char *nl = memchr(ls->p, '\n', (size_t)(ls->end - ls->p));
    if (nl == NULL) return false; /* the body always ends in LF */
    *s = ls->p;
    *n = (size_t)(nl - ls->p);
    ls->p = nl + 1;
    ls->line_no++;
    return true;
}

/* The value after "name " on the next line, NUL-terminated in buf. */
static int field(Lines *ls, const char *name, char *buf, size_t cap, const char *path, MnErr *err) {
    const char *s;
    size_t n, k = strlen(name);
    if (!next_line(ls, &s, &n))
        return mn_err_set(err, MN_EFORMAT, "%s: ends before its '%s' line", path, name);
    if (n <= k || memcmp(s, name, k) != 0 || s[k] != ' ')
        return mn_err_set(err, MN_EFORMAT, "%s line %d: expected '%s'", path, ls->line_no, name);
    if (n - k - 1 >= cap) return mn_err_set(err, MN_EFORMAT, "%s line %d: value too long", path, ls->line_no);
    memcpy(buf, s + k + 1, n - k - 1);
    buf[n - k - 1] = '\0';
    return MN_OK;
}

static bool parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < -2147483647L || v > 2147483647L) return false;
    *out = (int)v;
    return true;
}

static bool parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || (errno == ERANGE && isinf(v))) return false;
    *out = v;
    return true;
}

static bool parse_hash(const char *s, Hash128 *out) {
    if (strlen(s) != 32) return false;
    for (int i = 0; i < 16; i++) {
        int hi = utf8_hex_digit(s[2 * i]), lo = utf8_hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        out->b[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* Read at most COST_FILE_MAX bytes of path into buf (cap > COST_FILE_MAX). */
static int read_small_file(const char *path, char *buf, size_t cap, size_t *len, MnErr *err) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int code = errno == ENOENT ? MN_ENOTFOUND : MN_EIO;
        return mn_err_set(err, code, "cannot open %s: %s", path, strerror(errno));
    }
    size_t n = fread(buf, 1, cap, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) return mn_err_set(err, MN_EIO, "cannot read %s", path);
    if (n > COST_FILE_MAX) return mn_err_set(err, MN_EFORMAT, "%s: larger than %d bytes", path, COST_FILE_MAX);
    *len = n;
    return MN_OK;
}

/* Parse the checksummed body into *m; the key is not compared here. */
static int parse_body(const char *body, size_t len, const char *path, CostModel *m, MnErr *err) {
    Lines ls = {body, body + len, 0};
    char v[256];
    int iv, rc;
    memset(m, 0, sizeof *m);
    if ((rc = field(&ls, COST_MAGIC, v, sizeof v, path, err))) return rc;
    if (!parse_int(v, &iv) || iv != COST_VERSION)
        return mn_err_set(err, MN_EFORMAT, "%s: format version '%s', this build reads version %d", path, v,
                          COST_VERSION);
    if ((rc = field(&ls, "model", v, sizeof v, path, err))) return rc;
    if (!parse_hash(v, &m->key.model)) return mn_err_set(err, MN_EFORMAT, "%s: bad model fingerprint", path);
    if ((rc = field(&ls, "cpu", v, COST_CPU_LEN, path, err))) return rc;
    memcpy(m->key.cpu, v, strlen(v) + 1);
    struct {
        const char *name;
        int *dst;
    } ints[] = {{"n_cpus", &m->key.n_cpus},
                {"n_threads", &m->key.n_threads},
                {"block_tokens", &m->key.block_tokens},
                {"kv_type", &m->key.kv_type}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if ((rc = field(&ls, ints[i].name, v, sizeof v, path, err))) return rc;
        if (!parse_int(v, ints[i].dst)) return mn_err_set(err, MN_EFORMAT, "%s: bad %s '%s'", path, ints[i].name, v);
    }
    if ((rc = field(&ls, "build", m->key.build, sizeof m->key.build, path, err))) return rc;
    if ((rc = field(&ls, "tok_sec", v, sizeof v, path, err))) return rc;
    if (!parse_double(v, &m->tok_sec)) return mn_err_set(err, MN_EFORMAT, "%s: bad tok_sec '%s'", path, v);
    if ((rc = field(&ls, "knots", v, sizeof v, path, err))) return rc;
    if (!parse_int(v, &m->n_knots) || m->n_knots < 0 || m->n_knots > COST_MAX_KNOTS)
        return mn_err_set(err, MN_EFORMAT, "%s: bad knot count '%s'", path, v);
    for (int i = 0; i < m->n_knots; i++) {
        if ((rc = field(&ls, "knot", v, sizeof v, path, err))) return rc;
        char *sp = strchr(v, ' ');
        int ctx;
        if (sp == NULL) return mn_err_set(err, MN_EFORMAT, "%s line %d: knot needs two values", path, ls.line_no);
        *sp = '\0';
        if (!parse_int(v, &ctx) || !parse_double(sp + 1, &m->knot_attn_sec[i]))
            return mn_err_set(err, MN_EFORMAT, "%s line %d: bad knot", path, ls.line_no);
        m->knot_ctx[i] = ctx;
    }
    if (ls.p != ls.end) return mn_err_set(err, MN_EFORMAT, "%s line %d: unexpected extra line", path, ls.line_no + 1);
    MnErr verr;
    if (cost_validate(m, &verr)) return mn_err_set(err, MN_EFORMAT, "%s: %s", path, verr.msg);
    return MN_OK;
}

int cost_load(const char *path, const CostKey *want, CostModel *out, MnErr *err) {
    char *buf = mn_malloc(COST_FILE_MAX + 2);
    if (buf == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    size_t len = 0;
    int rc = read_small_file(path, buf, COST_FILE_MAX + 1, &len, err);
    if (rc) goto done;
    if (memchr(buf, '\0', len) != NULL) {
        rc = mn_err_set(err, MN_EFORMAT, "%s: not a text file", path);
        goto done;
    }
    /* The last line must be "checksum <32 hex>\n". */
    const size_t sum_len = strlen("checksum ") + 32 + 1;
    if (len < sum_len || buf[len - 1] != '\n' || memcmp(buf + len - sum_len, "checksum ", 9) != 0 ||
        (len > sum_len && buf[len - sum_len - 1] != '\n')) {
        rc = mn_err_set(err, MN_EFORMAT, "%s: truncated (no checksum line at the end)", path);
        goto done;
    }
    buf[len - 1] = '\0';
    Hash128 stored, actual = hash128(buf, len - sum_len);
    if (!parse_hash(buf + len - sum_len + 9, &stored)) {
        rc = mn_err_set(err, MN_EFORMAT, "%s: malformed checksum line", path);
        goto done;
    }
    if (!hash128_eq(&stored, &actual)) {
        rc = mn_err_set(err, MN_EFORMAT, "%s: checksum mismatch (corrupt file)", path);
        goto done;
    }
    CostModel m;
    rc = parse_body(buf, len - sum_len, path, &m, err);
    if (rc) goto done;
    if (want && !cost_key_eq(&m.key, want)) {
        rc = mn_err_set(err, MN_ENOTFOUND, "%s: profile of another model, machine or build (%s, %d threads, mnemo %s)",
                        path, m.key.cpu, m.key.n_threads, m.key.build);
        goto done;
    }
    *out = m;
done:
    mn_free(buf);
    return rc;
}

/* ---- debugging ------------------------------------------------------------ */

void cost_dump(const CostModel *cm) {
    char hex[33];
    hash128_hex(&cm->key.model, hex);
    fprintf(stderr, "CostModel model=%s cpu='%.*s' n_cpus=%d threads=%d block_tokens=%d kv_type=%d build=%.*s\n",
            hex, COST_CPU_LEN - 1, cm->key.cpu, cm->key.n_cpus, cm->key.n_threads, cm->key.block_tokens,
            cm->key.kv_type, COST_BUILD_LEN - 1, cm->key.build);
    fprintf(stderr, "  tok_sec=%.6g block@0=%.6g s, %d knots\n", cm->tok_sec,
            cm->key.block_tokens * cm->tok_sec, cm->n_knots);
    for (int i = 0; i < cm->n_knots && i < COST_MAX_KNOTS; i++)
        fprintf(stderr, "  ctx %7d: attn %.6g s/token  block %.6g s\n", (int)cm->knot_ctx[i], cm->knot_attn_sec[i],
                cost_block(cm, cm->knot_ctx[i]));
}
