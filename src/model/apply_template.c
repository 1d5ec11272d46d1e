/* apply_template.c — `mnemo apply-template` (apply_template.h).
 *
 * Reads the request on stdin with jansson, gathers the template and the
 * special tokens from a file or a GGUF, renders with model/jinja and writes
 * the text to stdout with one fwrite, so the bytes are exactly the
 * renderer's (NUL bytes included).
 */
#include "model/apply_template.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/cli.h"
#include "base/mem.h"
#include "model/chat_format.h"
#include "model/jinja.h"

#define STDIN_MAX_BYTES (64u << 20)

static char *read_stream(FILE *f, size_t max, size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = mn_malloc(cap);
    while (buf != NULL) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            if (cap >= max) {
                mn_free(buf);
                return NULL;
            }
            char *b = mn_realloc(buf, cap * 2);
            if (b == NULL) mn_free(buf);
            buf = b;
            cap *= 2;
        }
    }
    if (buf == NULL || ferror(f)) {
        mn_free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The variables of the render: chat_format_vars of the request's messages
 * and tools, with each --var NAME=JSON as an extra variable. */
static int build_vars(json_t *req, const char *bos, const char *eos, bool gen_prompt, const CliStrList *vars,
                      json_t **out, MnErr *err) {
    *out = NULL;
    if (!json_is_object(req)) return mn_err_set(err, MN_EINVAL, "stdin must hold a JSON object {\"messages\": [...]}");
    const char *key;
    json_t *val;
    json_object_foreach(req, key, val) {
        if (strcmp(key, "messages") != 0 && strcmp(key, "tools") != 0)
            return mn_err_set(err, MN_EINVAL, "unknown member '%s' on stdin (pass other variables with --var)", key);
    }
    json_t *extra = json_object();
    if (extra == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    int rc = MN_OK;
    for (int i = 0; rc == MN_OK && i < vars->n; i++) {
        const char *arg = vars->items[i];
        const char *eq = strchr(arg, '=');
        if (eq == NULL || eq == arg) {
            rc = mn_err_set(err, MN_EINVAL, "--var %s: expected NAME=JSON", arg);
            break;
        }
        json_error_t je;
        json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, &je);
        if (value == NULL) {
            rc = mn_err_set(err, MN_EINVAL, "--var %.*s: the value is not JSON: %s", (int)(eq - arg), arg, je.text);
            break;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
        if (json_object_set_new(extra, name, value)) rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    ChatInput in = {json_object_get(req, "messages"), json_object_get(req, "tools"), extra, gen_prompt};
    if (rc == MN_OK) rc = chat_format_vars(&in, bos, eos, out, err);
    json_decref(extra);
    return rc;
}

int apply_template_main(int argc, char **argv) {
    static const char *const synopsis =
        "mnemo apply-template (--chat-template-file FILE | -m MODEL) [--bos-token S] [--eos-token S]\n"
        "                     [--no-generation-prompt] [--var NAME=JSON]... [--template-date YYYY-MM-DD]\n"
        "  reads {\"messages\": [...], \"tools\": [...]} on stdin, writes the prompt to stdout";
    const char *file = NULL, *model = NULL, *bos_opt = NULL, *eos_opt = NULL, *date_opt = NULL;
    bool no_gen = false;
    CliStrList vars = {0};
    CliOpt opts[] = {
        {"chat-template-file", 0, CLI_STR, &file, "FILE", "the Jinja template to render"},
        {"model", 'm', CLI_STR, &model, "FILE", "a GGUF: its chat template and BOS/EOS token texts"},
        {"bos-token", 0, CLI_STR, &bos_opt, "S", "bos_token (default: the model's, or \"\")"},
        {"eos-token", 0, CLI_STR, &eos_opt, "S", "eos_token (default: the model's, or \"\")"},
        {"no-generation-prompt", 0, CLI_FLAG, &no_gen, NULL, "add_generation_prompt = false"},
        {"var", 0, CLI_STR_LIST, &vars, "NAME=JSON", "one more variable (repeatable)"},
        {"template-date", 0, CLI_STR, &date_opt, "YYYY-MM-DD", "the day strftime_now gives (default: today)"},
    };
    int n_opts = (int)(sizeof opts / sizeof opts[0]);
    MnErr err = {0};
    int n_pos = 0;
    const char *pos[1];
    int rc = cli_parse(argc, argv, opts, n_opts, pos, 1, &n_pos, &err);
    if (rc == MN_ECANCELED) {
        cli_usage(stdout, synopsis, opts, n_opts);
        cli_free(opts, n_opts);
        return 0;
    }
    int status = 2;
    Gguf *g = NULL;
    char *tmpl = NULL, *bos = NULL, *eos = NULL, *input = NULL, *text = NULL;
    json_t *req = NULL, *jvars = NULL;
    JinjaTemplate *t = NULL;
    JinjaDate date;
    /* bad options: one line naming what is wrong, as the other commands do */
    if (rc) {
        cli_error(stderr, synopsis, err.msg);
        goto done;
    }
    if (file == NULL && model == NULL) {
        fprintf(stderr, "mnemo apply-template: needs a template: --chat-template-file FILE or -m MODEL\n");
        goto done;
    }
    if (n_pos > 0) {
        fprintf(stderr, "mnemo apply-template: takes no arguments ('%s'): the request comes on stdin\n", pos[0]);
        goto done;
    }
    if (date_opt) {
        if (jinja_date_parse(date_opt, &date, &err)) {
            fprintf(stderr, "mnemo apply-template: --template-date: %s\n", err.msg);
            goto done;
        }
    } else {
        jinja_date_now(&date);
    }
    status = 1;
    if (model) {
        if (gguf_open_metadata(model, &g, &err)) { /* the message names the file */
            fprintf(stderr, "mnemo apply-template: %s\n", err.msg);
            goto done;
        }
        if (chat_format_gguf_texts(g, &tmpl, &bos, &eos, &err)) {
            fprintf(stderr, "mnemo apply-template: %s: %s\n", model, err.msg);
            goto done;
        }
        if (tmpl == NULL && file == NULL) {
            fprintf(stderr, "mnemo apply-template: %s has no tokenizer.chat_template (use --chat-template-file)\n", model);
            goto done;
        }
    }
    size_t tmpl_len = tmpl ? strlen(tmpl) : 0;
    if (file) {
        mn_free(tmpl);
        FILE *f = fopen(file, "rb");
        tmpl = f ? read_stream(f, STDIN_MAX_BYTES, &tmpl_len) : NULL;
        if (f) fclose(f);
        if (tmpl == NULL) {
            fprintf(stderr, "mnemo apply-template: cannot read %s\n", file);
            goto done;
        }
    }
    size_t input_len = 0;
    input = read_stream(stdin, STDIN_MAX_BYTES, &input_len);
    if (input == NULL) {
        fprintf(stderr, "mnemo apply-template: cannot read stdin (at most %u MiB)\n", STDIN_MAX_BYTES >> 20);
        status = 2;
        goto done;
    }
    json_error_t je;
    req = json_loadb(input, input_len, JSON_ALLOW_NUL, &je);
    if (req == NULL) {
        fprintf(stderr, "mnemo apply-template: stdin is not JSON: %s (line %d, column %d)\n", je.text, je.line, je.column);
        status = 2;
        goto done;
    }
    if (build_vars(req, bos_opt ? bos_opt : bos ? bos : "", eos_opt ? eos_opt : eos ? eos : "", !no_gen, &vars, &jvars,
                   &err)) {
        fprintf(stderr, "mnemo apply-template: %s\n", err.msg);
        status = 2;
        goto done;
    }
    size_t text_len = 0;
    if (jinja_parse(tmpl, tmpl_len, NULL, &t, &err) || jinja_render(t, jvars, &date, NULL, &text, &text_len, &err)) {
        fprintf(stderr, "mnemo apply-template: %s\n", err.msg);
        goto done;
    }
    if (fwrite(text, 1, text_len, stdout) != text_len || fflush(stdout) != 0) {
        fprintf(stderr, "mnemo apply-template: writing stdout failed\n");
        goto done;
    }
    status = 0;
done:
    mn_free(text);
    jinja_free(t);
    json_decref(jvars);
    json_decref(req);
    mn_free(input);
    mn_free(tmpl);
    mn_free(bos);
    mn_free(eos);
    gguf_close(g);
    cli_free(opts, n_opts);
    return status;
}
