/* chat_format.c — the chat format a server renders prompts with (see
 * chat_format.h).
 *
 * A ChatFormat is one of two kinds behind one render function: a parsed
 * Jinja template with the token texts and date it is rendered with, or a
 * built-in family (model/chat_template.c), for which the JSON messages are
 * turned into (role, content) pairs first. Everything is fixed when the
 * format is made and read-only afterwards, so renders on any number of
 * threads share it without locks (model/jinja renders a parsed template
 * concurrently, each render in its own memory).
 */
#include "model/chat_format.h"

#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* ------------------------------------------------------------------ types */

struct ChatFormat {
    JinjaTemplate *tmpl;  /* the Jinja template, or NULL for a built-in family */
    ChatTemplate builtin; /* the family when tmpl is NULL */
    char *bos, *eos;      /* the token texts the template sees ("" for none) */
    bool is_date_fixed;   /* strftime_now formats date, else the time of the render */
    JinjaDate date;
    char describe[600];   /* chat_format_describe's text */
};

/* The built-in default family with the family's usual tokens: what an
 * engine given no format renders with. Read-only, like every format. */
static const ChatFormat DEFAULT_FORMAT = {
    .builtin = CHAT_TMPL_DEFAULT, .bos = (char *)"", .eos = (char *)"", .describe = "built-in default"};

/* ----------------------------------------------------------------- making */

const ChatFormat *chat_format_default(void) { return &DEFAULT_FORMAT; }

static ChatFormat *format_alloc(const char *bos, const char *eos, const JinjaDate *date) {
    ChatFormat *f = mn_calloc(1, sizeof *f);
    if (f == NULL) return NULL;
    f->bos = mn_strdup(bos ? bos : "");
    f->eos = mn_strdup(eos ? eos : "");
    if (date) {
        f->is_date_fixed = true;
        f->date = *date;
    }
    if (f->bos == NULL || f->eos == NULL) {
        chat_format_free(f);
        return NULL;
    }
    return f;
}

int chat_format_new_builtin(ChatTemplate t, const char *bos, const char *eos, ChatFormat **out, MnErr *err) {
    *out = NULL;
    if ((int)t < 0 || t >= CHAT_TMPL__COUNT) return mn_err_set(err, MN_EINVAL, "no built-in chat format %d", (int)t);
    ChatFormat *f = format_alloc(bos, eos, NULL);
    if (f == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    f->builtin = t;
    snprintf(f->describe, sizeof f->describe, "built-in %s", chat_template_name(t));
    *out = f;
    return MN_OK;
}

void chat_format_free(ChatFormat *f) {
    if (f == NULL) return;
    jinja_free(f->tmpl);
    mn_free(f->bos);
    mn_free(f->eos);
    mn_free(f);
}

/* The whole of path into *out (mn_free). A template larger than the
 * renderer takes is refused by jinja_parse; this reads at most one byte
 * more, so the message is the parser's. MN_OK, MN_EIO or MN_ENOMEM. */
static int read_template_file(const char *path, char **out, size_t *len, MnErr *err) {
    *out = NULL;
    JinjaLimits lim;
    jinja_limits_default(&lim);
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) return mn_err_set(err, MN_EIO, "cannot read the chat template file %s", path);
    char *buf = mn_malloc(lim.max_source_bytes + 2);
    size_t n = buf ? fread(buf, 1, lim.max_source_bytes + 1, fp) : 0;
    bool is_bad = ferror(fp);
    fclose(fp);
    if (buf == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    if (is_bad) {
        mn_free(buf);
        return mn_err_set(err, MN_EIO, "cannot read the chat template file %s", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return MN_OK;
}

int chat_format_new_jinja(const char *src, size_t len, const char *bos, const char *eos, const JinjaDate *date,
                          ChatFormat **out, MnErr *err) {
    *out = NULL;
    ChatFormat *f = format_alloc(bos, eos, date);
    if (f == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    int rc = jinja_parse(src, len, NULL, &f->tmpl, err);
    if (rc) {
        chat_format_free(f);
        return rc;
    }
    snprintf(f->describe, sizeof f->describe, "jinja");
    *out = f;
    return MN_OK;
}

/* chat_format_new_jinja, its failure named for the server's operator:
 * which template, what the parser found, and how to choose another. */
static int new_named_jinja(const char *src, size_t len, const char *bos, const char *eos, const JinjaDate *date,
                           const char *what, ChatFormat **out, MnErr *err) {
    MnErr perr = {0};
    int rc = chat_format_new_jinja(src, len, bos, eos, date, out, &perr);
    if (rc == MN_ENOMEM) return mn_err_set(err, rc, "out of memory");
    if (rc)
        return mn_err_set(err, rc,
                          "%s does not parse: %s (render another with --chat-template-file FILE, or use a built-in "
                          "format with --chat-template NAME: mnemo serve --chat-template list)",
                          what, perr.msg);
    return MN_OK;
}

int chat_format_new(const Gguf *g, const Tokenizer *tok, const ChatFormatOptions *o, ChatFormat **out, MnErr *err) {
    *out = NULL;
    if (o->template_file && o->builtin_name)
        return mn_err_set(err, MN_EINVAL, "--chat-template and --chat-template-file exclude each other: give one");
    const char *bos = tok_bos(tok) >= 0 ? tok_text(tok, tok_bos(tok)) : "";
    const char *eos = tok_eos(tok) >= 0 ? tok_text(tok, tok_eos(tok)) : "";
    if (o->builtin_name) {
        ChatTemplate t;
        if (chat_template_from_name(o->builtin_name, &t) != MN_OK)
            return mn_err_set(err, MN_EINVAL, "unknown chat template '%s' (mnemo serve --chat-template list)",
                              o->builtin_name);
        return chat_format_new_builtin(t, bos, eos, out, err);
    }
    int rc;
    if (o->template_file) {
        size_t len = 0;
        char *src = NULL, what[560];
        snprintf(what, sizeof what, "the chat template %.500s", o->template_file);
        rc = read_template_file(o->template_file, &src, &len, err);
        if (rc == MN_OK) rc = new_named_jinja(src, len, bos, eos, o->date, what, out, err);
        mn_free(src);
        if (rc == MN_OK) snprintf((*out)->describe, sizeof (*out)->describe, "file %.500s", o->template_file);
        return rc;
    }
    GgufStr gs;
    if (gguf_get_str(g, "tokenizer.chat_template", &gs) == MN_OK) {
        rc = new_named_jinja(gs.data, (size_t)gs.len, bos, eos, o->date,
                             "the model's chat template (tokenizer.chat_template)", out, err);
        if (rc == MN_OK) snprintf((*out)->describe, sizeof (*out)->describe, "gguf (tokenizer.chat_template)");
        return rc;
    }
    rc = chat_format_new_builtin(CHAT_TMPL_DEFAULT, bos, eos, out, err);
    if (rc == MN_OK)
        snprintf((*out)->describe, sizeof (*out)->describe, "built-in %s (the model has no chat template)",
                 chat_template_name(CHAT_TMPL_DEFAULT));
    return rc;
}

const char *chat_format_describe(const ChatFormat *f) { return f->describe; }

/* -------------------------------------------------------------- rendering */

int chat_format_vars(const ChatInput *in, const char *bos, const char *eos, json_t **out, MnErr *err) {
    *out = NULL;
    json_t *v = json_object();
    if (v == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    int bad = 0;
    if (in->messages) bad |= json_object_set(v, "messages", (json_t *)in->messages);
    bad |= json_object_set_new(v, "tools", in->tools ? json_incref((json_t *)in->tools) : json_null());
    bad |= json_object_set_new(v, "documents", json_null());
    bad |= json_object_set_new(v, "add_generation_prompt", json_boolean(in->add_generation_prompt));
    bad |= json_object_set_new(v, "bos_token", json_string(bos));
    bad |= json_object_set_new(v, "eos_token", json_string(eos));
    if (in->vars) bad |= json_object_update(v, (json_t *)in->vars);
    if (bad) {
        json_decref(v);
        return mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    *out = v;
    return MN_OK;
}

/* The text of message i's content for a built-in family: a string as it
 * is, text parts joined with "\n", null as "". *owned is set when the text
 * was made here (the caller frees it). */
static int builtin_content(const json_t *c, size_t i, const char **text, char **owned, MnErr *err) {
    *owned = NULL;
    if (c == NULL || json_is_null(c)) {
        *text = "";
        return MN_OK;
    }
    if (json_is_string(c)) {
        *text = json_string_value(c);
        return MN_OK;
    }
    if (!json_is_array(c))
        return mn_err_set(err, MN_EINVAL, "messages[%zu].content must be a string or an array of text parts", i);
    size_t total = 0, n = json_array_size(c);
    for (size_t k = 0; k < n; k++) {
        json_t *t = json_object_get(json_array_get(c, k), "text");
        if (!json_is_string(t))
            return mn_err_set(err, MN_EINVAL, "messages[%zu].content[%zu].text must be a string", i, k);
        total += json_string_length(t) + 1;
    }
    char *s = mn_malloc(total + 1);
    if (s == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory");
    size_t at = 0;
    for (size_t k = 0; k < n; k++) {
        json_t *t = json_object_get(json_array_get(c, k), "text");
        if (k > 0) s[at++] = '\n';
        memcpy(s + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    s[at] = '\0';
    *text = *owned = s;
    return MN_OK;
}

static int render_builtin(const ChatFormat *f, const ChatInput *in, char **out, size_t *out_len, MnErr *err) {
    const char *name = chat_template_name(f->builtin);
    if (in->tools && !(json_is_array(in->tools) && json_array_size(in->tools) == 0))
        return mn_err_set(err, MN_EINVAL, "tools: the built-in chat format %s cannot show tools (they need a Jinja "
                          "chat template)", name);
    if (in->vars && json_object_size(in->vars) > 0)
        return mn_err_set(err, MN_EINVAL, "chat_template_kwargs: the built-in chat format %s takes no variables",
                          name);
    size_t n = json_array_size(in->messages);
    ChatMsg *msgs = mn_calloc(n ? n : 1, sizeof *msgs);
    char **owned = mn_calloc(n ? n : 1, sizeof *owned);
    int rc = msgs && owned ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    for (size_t i = 0; rc == MN_OK && i < n; i++) {
        json_t *m = json_array_get(in->messages, i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            rc = mn_err_set(err, MN_EINVAL, "messages[%zu].role must be a string", i);
            break;
        }
        msgs[i].role = json_string_value(role);
        rc = builtin_content(json_object_get(m, "content"), i, &msgs[i].content, &owned[i], err);
    }
    if (rc == MN_OK)
        rc = chat_template_apply(f->builtin, msgs, n, in->add_generation_prompt, f->bos, f->eos, out, out_len, err);
    for (size_t i = 0; owned && i < n; i++) mn_free(owned[i]);
    mn_free(owned);
    mn_free(msgs);
    return rc;
}

int chat_format_render(const ChatFormat *f, const ChatInput *in, char **out, size_t *out_len, MnErr *err) {
    *out = NULL;
    *out_len = 0;
    if (!json_is_array(in->messages)) return mn_err_set(err, MN_EINVAL, "messages must be an array");
    for (size_t i = 0; i < json_array_size(in->messages); i++)
        if (!json_is_object(json_array_get(in->messages, i)))
            return mn_err_set(err, MN_EINVAL, "messages[%zu] must be an object", i);
    if (f->tmpl == NULL) return render_builtin(f, in, out, out_len, err);
    json_t *vars;
    int rc = chat_format_vars(in, f->bos, f->eos, &vars, err);
    if (rc) return rc;
    JinjaDate now;
    if (!f->is_date_fixed) jinja_date_now(&now);
    MnErr rerr = {0};
    rc = jinja_render(f->tmpl, vars, f->is_date_fixed ? &f->date : &now, NULL, out, out_len, &rerr);
    json_decref(vars);
    if (rc == MN_ENOMEM) return mn_err_set(err, rc, "out of memory");
    if (rc) return mn_err_set(err, rc, "chat template: %s", rerr.msg);
    return MN_OK;
}

/* ------------------------------------------------------------ GGUF texts */

static char *dup_gguf_str(GgufStr s) { return mn_strndup(s.data, (size_t)s.len); }

/* The text of the token whose id is at key, or "" when the key is absent. */
static int token_text(const Gguf *g, const char *key, char **out, MnErr *err) {
    *out = NULL;
    int64_t id;
    int rc = gguf_get_i64(g, key, &id);
    if (rc == MN_ENOTFOUND) {
        *out = mn_strdup("");
        return *out ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
    }
    if (rc) return mn_err_set(err, MN_EFORMAT, "%s is not an integer", key);
    GgufStr s;
    if (id < 0 || gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)id, &s) != MN_OK)
        return mn_err_set(err, MN_EFORMAT, "%s is %lld, not a token of tokenizer.ggml.tokens", key, (long long)id);
    *out = dup_gguf_str(s);
    return *out ? MN_OK : mn_err_set(err, MN_ENOMEM, "out of memory");
}

int chat_format_gguf_texts(const Gguf *g, char **tmpl, char **bos, char **eos, MnErr *err) {
    *tmpl = *bos = *eos = NULL;
    GgufStr t;
    int rc = gguf_get_str(g, "tokenizer.chat_template", &t);
    if (rc == MN_OK && (*tmpl = dup_gguf_str(t)) == NULL) rc = mn_err_set(err, MN_ENOMEM, "out of memory");
    else if (rc == MN_ENOTFOUND) rc = MN_OK;
    else if (rc) rc = mn_err_set(err, MN_EFORMAT, "tokenizer.chat_template is not a string");
    if (rc == MN_OK) rc = token_text(g, "tokenizer.ggml.bos_token_id", bos, err);
    if (rc == MN_OK) rc = token_text(g, "tokenizer.ggml.eos_token_id", eos, err);
    if (rc) {
        mn_free(*tmpl);
        mn_free(*bos);
        mn_free(*eos);
        *tmpl = *bos = *eos = NULL;
    }
    return rc;
}
