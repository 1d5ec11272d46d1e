/* cli.c — option parsing for the mnemo subcommands (see cli.h). */
#include "base/cli.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

/* Names this short are written with one dash (llama.cpp's "-np", "-ngl"). */
#define CLI_ONE_DASH_MAX 3

static bool is_alias(const CliOpt *o) { return o->help == NULL; }

/* How an option is written on the command line: "--ctx", or "-np" for a
 * short alias. */
static const char *spelling(const CliOpt *o, char *buf, size_t cap) {
    bool one_dash = is_alias(o) && strlen(o->name) <= CLI_ONE_DASH_MAX;
    snprintf(buf, cap, "%s%s", one_dash ? "-" : "--", o->name);
    return buf;
}

static int set_value(const CliOpt *o, const char *val, MnErr *err) {
    char *end = NULL, sp[80];
    spelling(o, sp, sizeof sp);
    errno = 0;
    switch (o->kind) {
    case CLI_STR:
    case CLI_STR_OPTVAL: *(const char **)o->out = val; return MN_OK;
    case CLI_INT: {
        long v = strtol(val, &end, 10);
        if (end == val || *end) return mn_err_set(err, MN_EINVAL, "%s expects an integer, got '%s'", sp, val);
        if (errno || v < -2147483647L || v > 2147483647L)
            return mn_err_set(err, MN_EINVAL, "%s expects an integer from -2147483647 to 2147483647, got '%s'", sp, val);
        *(int *)o->out = (int)v;
        return MN_OK;
    }
    case CLI_U64: {
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || end == val || *end || val[0] == '-')
            return mn_err_set(err, MN_EINVAL, "%s expects a non-negative integer, got '%s'", sp, val);
        *(uint64_t *)o->out = (uint64_t)v;
        return MN_OK;
    }
    case CLI_FLOAT: {
        float v = strtof(val, &end);
        /* strtof also reads hexadecimal ("0x10" is 16): a typo, not a number */
        if (errno || end == val || *end || !isfinite(v) || strpbrk(val, "xX"))
            return mn_err_set(err, MN_EINVAL, "%s expects a decimal number, got '%s'", sp, val);
        *(float *)o->out = v;
        return MN_OK;
    }
    case CLI_FLAG:
        if (strcmp(val, "1") == 0 || strcmp(val, "true") == 0 || strcmp(val, "yes") == 0) {
            *(bool *)o->out = true;
            return MN_OK;
        }
        if (strcmp(val, "0") == 0 || strcmp(val, "false") == 0 || strcmp(val, "no") == 0) {
            *(bool *)o->out = false;
            return MN_OK;
        }
        return mn_err_set(err, MN_EINVAL, "%s expects true or false, got '%s'", sp, val);
    case CLI_STR_LIST: {
        CliStrList *l = o->out;
        const char **items = mn_realloc(l->items, (size_t)(l->n + 1) * sizeof *items);
        if (items == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
        items[l->n++] = val;
        l->items = items;
        return MN_OK;
    }
    }
    return MN_EINVAL;
}

static void env_name(const char *name, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "MNEMO_");
    for (const char *p = name; *p && n + 1 < cap; p++) buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[n] = '\0';
}

/* ---- suggestions ---------------------------------------------------------------- */

#define CLI_MAX_WORD 64

/* Optimal string alignment distance of a[0..na) and b[0..nb) (each at most
 * CLI_MAX_WORD bytes). */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    int d[CLI_MAX_WORD + 1][CLI_MAX_WORD + 1];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[na][nb];
}

typedef struct Closest {
    const char *typed;
    size_t typed_len;
    char best[CLI_MAX_WORD + 1];
    int best_d;
} Closest;

/* Keep name when it is closer to the typed word than the best so far. A
 * name counts as close within two edits and within half the typed word's
 * letters (so "-x" suggests nothing); a name that the typed word begins,
 * with three letters or more ("--conc"), counts as one edit away. */
static bool closest_consider(Closest *c, const char *name, size_t len) {
    if (len > CLI_MAX_WORD || c->typed_len > CLI_MAX_WORD) return false;
    size_t dashes = strspn(c->typed, "-");
    size_t letters = c->typed_len > dashes ? c->typed_len - dashes : 0;
    bool is_prefix = letters >= 3 && c->typed_len < len && strncmp(name, c->typed, c->typed_len) == 0;
    int d = is_prefix ? 1 : edit_distance(c->typed, c->typed_len, name, len);
    if (d > 2 || (size_t)d * 2 > letters || d >= c->best_d) return false;
    memcpy(c->best, name, len);
    c->best[len] = '\0';
    c->best_d = d;
    return true;
}

const char *cli_closest(const char *typed, const char *const *names, int n) {
    Closest c = {typed, strlen(typed), "", INT_MAX};
    const char *best = NULL;
    for (int i = 0; i < n; i++)
        if (closest_consider(&c, names[i], strlen(names[i]))) best = names[i];
    return best;
}

/* The error for an unknown option typed[0..len): with the closest spelling
 * of a known option when one is close. */
static int unknown_option(const CliOpt *opts, int n_opts, const char *typed, size_t len, MnErr *err) {
    Closest c = {typed, len, "", INT_MAX};
    char name[CLI_MAX_WORD + 3];
    for (int i = 0; i < n_opts; i++) {
        spelling(&opts[i], name, sizeof name);
        closest_consider(&c, name, strlen(name));
        if (opts[i].short_name) {
            snprintf(name, sizeof name, "-%c", opts[i].short_name);
            closest_consider(&c, name, 2);
        }
    }
    if (c.best_d == INT_MAX)
        return mn_err_set(err, MN_EINVAL, "unknown option '%.*s' (--help lists the options)", (int)len, typed);
    return mn_err_set(err, MN_EINVAL, "unknown option '%.*s'; did you mean %s?", (int)len, typed, c.best);
}

/* ---- parsing --------------------------------------------------------------------- */

/* The option named name[0..len) (no dashes), at most max_len long. */
static const CliOpt *find_long(const CliOpt *opts, int n_opts, const char *name, size_t len, size_t max_len) {
    for (int i = 0; i < n_opts; i++)
        if (len <= max_len && strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) return &opts[i];
    return NULL;
}

/* The option of a word that begins with a dash: "--name[=value]", "-x", or a
 * short alias "-np[=value]". *val is the value after '=', or NULL. */
static const CliOpt *find_option(const CliOpt *opts, int n_opts, const char *a, const char **val, MnErr *err) {
    bool two = a[1] == '-';
    const char *name = a + (two ? 2 : 1);
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    *val = eq ? eq + 1 : NULL;
    const CliOpt *o = NULL;
    if (!two && len == 1 && eq == NULL)
        for (int k = 0; k < n_opts && o == NULL; k++)
            if (opts[k].short_name == name[0]) o = &opts[k];
    if (o == NULL) o = find_long(opts, n_opts, name, len, two ? SIZE_MAX : CLI_ONE_DASH_MAX);
    if (o == NULL) unknown_option(opts, n_opts, a, (size_t)(name - a) + len, err);
    return o;
}

int cli_parse(int argc, char **argv, const CliOpt *opts, int n_opts, const char **positional, int max_pos,
              int *n_pos, MnErr *err) {
    *n_pos = 0;
    for (int i = 0; i < n_opts; i++) {
        if (is_alias(&opts[i])) continue;
        char env[128];
        env_name(opts[i].name, env, sizeof env);
        const char *val = getenv(env);
        if (val == NULL) continue;
        int rc = set_value(&opts[i], val, err);
        if (rc) return mn_err_prefix(err, "environment variable %s", env);
    }
    bool only_positional = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const CliOpt *o = NULL;
        const char *val = NULL;
        if (!only_positional && strcmp(a, "--") == 0) {
            only_positional = true;
            continue;
        }
        if (!only_positional && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) return MN_ECANCELED;
        bool is_option = a[0] == '-' && a[1] != '\0' && (a[1] == '-' || !isdigit((unsigned char)a[1]));
        if (only_positional || !is_option) {
            if (*n_pos >= max_pos) return mn_err_set(err, MN_EINVAL, "unexpected argument '%s'", a);
            positional[(*n_pos)++] = a;
            continue;
        }
        if ((o = find_option(opts, n_opts, a, &val, err)) == NULL) return MN_EINVAL;
        if (o->kind == CLI_FLAG && val == NULL) {
            *(bool *)o->out = true;
            continue;
        }
        if (o->kind == CLI_STR_OPTVAL && val == NULL)
            val = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "";
        if (val == NULL) {
            char sp[80];
            if (i + 1 >= argc) return mn_err_set(err, MN_EINVAL, "option %s needs a value", spelling(o, sp, sizeof sp));
            val = argv[++i];
        }
        int rc = set_value(o, val, err);
        if (rc) return rc;
    }
    return MN_OK;
}

void cli_usage(FILE *f, const char *synopsis, const CliOpt *opts, int n_opts) {
    fprintf(f, "usage: %s\n\noptions:\n", synopsis);
    for (int i = 0; i < n_opts; i++) {
        const CliOpt *o = &opts[i];
        if (is_alias(o)) continue;
        char left[64], also[160] = "", sp[80];
        snprintf(left, sizeof left, "%c%c%c --%s%s%s", o->short_name ? '-' : ' ', o->short_name ? o->short_name : ' ',
                 o->short_name ? ',' : ' ', o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        for (int k = 0; k < n_opts; k++) {
            if (!is_alias(&opts[k]) || opts[k].out != o->out) continue;
            size_t n = strlen(also);
            snprintf(also + n, sizeof also - n, "%s%s", n ? ", " : " (also ", spelling(&opts[k], sp, sizeof sp));
        }
        if (also[0]) strncat(also, ")", sizeof also - strlen(also) - 1);
        fprintf(f, "  %-30s %s%s\n", left, o->help, also);
    }
    fprintf(f, "\nEvery long option can also be set with MNEMO_<NAME> (e.g. --kv-type -> MNEMO_KV_TYPE).\n");
}

void cli_error(FILE *f, const char *synopsis, const char *msg) {
    size_t first = strcspn(synopsis, " ");
    size_t n = synopsis[first] ? first + 1 + strcspn(synopsis + first + 1, " ") : first;
    fprintf(f, "%.*s: %s\n", (int)n, synopsis, msg);
}

void cli_free(const CliOpt *opts, int n_opts) {
    for (int i = 0; i < n_opts; i++)
        if (opts[i].kind == CLI_STR_LIST) {
            CliStrList *l = opts[i].out;
            mn_free(l->items);
            l->items = NULL;
            l->n = 0;
        }
}

/* ---- what every command does with them ---------------------------------------- */

int cli_parse_or_usage(int argc, char **argv, const char *synopsis, const CliOpt *opts, int n_opts,
                       const char **positional, int max_pos, int *n_pos) {
    MnErr err = {0};
    int rc = cli_parse(argc, argv, opts, n_opts, positional, max_pos, n_pos, &err);
    if (rc == MN_ECANCELED) {
        cli_usage(stdout, synopsis, opts, n_opts);
        return 0;
    }
    if (rc) {
        cli_error(stderr, synopsis, err.msg);
        return 2;
    }
    return -1;
}

bool cli_require(bool ok, const char *cmd, const char *fmt, ...) {
    if (ok) return true;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mnemo %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return false;
}

int cli_fail(const MnErr *err) {
    fprintf(stderr, "mnemo: %s\n", err->msg[0] ? err->msg : mn_strerror(err->code));
    return 1;
}
