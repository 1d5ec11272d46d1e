/* pretok.c — regex pre-tokenization for byte-level BPE, on PCRE2.
 *
 * The pattern lists are those llama.cpp uses for each tokenizer.ggml.pre
 * name (facts from its llama-vocab.cpp), rewritten where PCRE2 and
 * llama.cpp's regex machinery would otherwise disagree:
 *   - llama.cpp runs patterns without \p{..} through std::wregex after
 *     replacing every non-ASCII white-space character with U+000B. Such a
 *     character then matches \s but none of the explicit code point ranges
 *     of the deepseek patterns, so those ranges exclude white space here
 *     ((?!\s) before the CJK class, U+3000 dropped from the punctuation
 *     class);
 *   - "$" means the end of the piece only (PCRE2_DOLLAR_ENDONLY);
 *   - case-insensitive contractions are spelled out ([sS]) so that PCRE2's
 *     Unicode case folding (K/KELVIN SIGN, s/LONG S) cannot widen them;
 *   - non-ASCII characters are written as \x{...} so that no editor's
 *     Unicode normalization can silently change a range bound.
 * With PCRE2_UCP, \s, \p{L}, \p{N}, \p{P} follow Unicode properties, which
 * is what llama.cpp's own category tables and custom splitters implement.
 *
 * Splitting semantics (as llama.cpp's unicode_regex_split): each regex is
 * run over every piece the previous one produced, searching left to right;
 * every match becomes a piece and so does every non-empty gap between
 * matches. Matching never looks outside the piece.
 *
 * Ownership: a Pretok (compiled codes, JIT code, PCRE2 general context) is
 * immutable after pretok_new and may be shared by threads. Match data and
 * span buffers live in the caller's PretokScratch.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <assert.h>
#include <string.h>

#include "base/mem.h"
#include "model/pretok.h"
#include "base/utf8.h"

/* ---- pattern sets -------------------------------------------------------- */

#define RX_GPT2         "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                            \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"              \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                             \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"                   \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs, U+0800..U+4E00 and Hangul, white space excluded. */
#define RX_CJK "(?:(?!\\s)[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])+"
/* deepseek-llm's cased-letter class. */
#define RX_DEEPSEEK_LETTERS                                                                                  \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"                      \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"                   \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"                            \
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"              \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"                           \
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"                           \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"                   \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"                  \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"                           \
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"                   \
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"                   \
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"                             \
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"                            \
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"                           \
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"                           \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"                       \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"                   \
    "\\x{1E900}-\\x{1E943}]+"
#define RX_DEEPSEEK_PUNCT                                                                                    \
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+"
#define RX_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
#define RX_TEKKEN                                                                                            \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"                                   \
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"                                  \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_GPT4O                                                                                             \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RX_CONTRACTIONS "?"               \
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RX_CONTRACTIONS "?"              \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_SEED_CODER                                                                                        \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"                   \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_BAILING                                                                                           \
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"                        \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"

#define PRETOK_MAX_PATTERNS 6

typedef struct PretokDef {
    const char *kind;
    bool ignore_merges;
    bool add_bos;
    int n_patterns;
    const char *patterns[PRETOK_MAX_PATTERNS];
} PretokDef;

enum {
    DEF_DEFAULT,
    DEF_LLAMA3,
    DEF_LLAMA3_PLAIN, /* the llama3 regex without llama3's merge/BOS habits */
    DEF_DEEPSEEK_LLM,
    DEF_DEEPSEEK_CODER,
    DEF_FALCON,
    DEF_STARCODER,
    DEF_GPT2,
    DEF_QWEN2,
    DEF_PORO,
    DEF_VIKING,
    DEF_TEKKEN,
    DEF_GPT4O,
    DEF_SEED_CODER,
    DEF_BAILING,
};

/* clang-format off */
static const PretokDef pretok_defs[] = {
    /*                    kind          ignore_merges add_bos  patterns */
    [DEF_DEFAULT]        = {"default",        false, false, 4, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+",
                                                               "[0-9][0-9][0-9]"}},
    [DEF_LLAMA3]         = {"llama3",         true,  true,  1, {RX_LLAMA3}},
    [DEF_LLAMA3_PLAIN]   = {"llama3-regex",   false, false, 1, {RX_LLAMA3}},
    [DEF_DEEPSEEK_LLM]   = {"deepseek-llm",   false, false, 6, {"[\\r\\n]", RX_DEEPSEEK_LETTERS, RX_DEEPSEEK_PUNCT,
                                                               "\\s+$", RX_CJK, "\\p{N}+"}},
    [DEF_DEEPSEEK_CODER] = {"deepseek-coder", false, false, 5, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK,
                                                               "\\p{N}"}},
    [DEF_FALCON]         = {"falcon",         false, false, 3, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2,
                                                               "[0-9][0-9][0-9]"}},
    [DEF_STARCODER]      = {"starcoder",      false, false, 2, {"\\p{N}", RX_GPT2}},
    [DEF_GPT2]           = {"gpt2",           false, false, 1, {RX_GPT2}},
    [DEF_QWEN2]          = {"qwen2",          false, false, 1, {RX_QWEN2}},
    [DEF_PORO]           = {"poro",           false, false, 1, {RX_PORO}},
    [DEF_VIKING]         = {"viking",         false, false, 2, {RX_PORO, "\\p{N}"}},
    [DEF_TEKKEN]         = {"tekken",         true,  true,  1, {RX_TEKKEN}},
    [DEF_GPT4O]          = {"gpt-4o",         false, false, 1, {RX_GPT4O}},
    [DEF_SEED_CODER]     = {"seed-coder",     false, false, 1, {RX_SEED_CODER}},
    [DEF_BAILING]        = {"bailingmoe",     false, false, 1, {RX_BAILING}},
};
/* clang-format on */

/* tokenizer.ggml.pre values and the pattern set each selects. */
static const struct {
    const char *name;
    int def;
} pretok_names[] = {
    {"default", DEF_DEFAULT},
    {"llama3", DEF_LLAMA3},
    {"llama-v3", DEF_LLAMA3},
    {"llama-bpe", DEF_LLAMA3},
    {"falcon3", DEF_LLAMA3},
    {"falcon-h1", DEF_LLAMA3},
    {"pixtral", DEF_LLAMA3},
    {"midm-2.0", DEF_LLAMA3},
    {"lfm2", DEF_LLAMA3},
    {"dbrx", DEF_LLAMA3_PLAIN},
    {"smaug-bpe", DEF_LLAMA3_PLAIN},
    {"deepseek-llm", DEF_DEEPSEEK_LLM},
    {"deepseek-coder", DEF_DEEPSEEK_CODER},
    {"falcon", DEF_FALCON},
    {"mpt", DEF_GPT2},
    {"gpt-2", DEF_GPT2},
    {"phi-2", DEF_GPT2},
    {"jina-es", DEF_GPT2},
    {"jina-de", DEF_GPT2},
    {"jina-v2-es", DEF_GPT2},
    {"jina-v2-de", DEF_GPT2},
    {"gigachat", DEF_GPT2},
    {"a.x-4.0", DEF_GPT2},
    {"mellum", DEF_GPT2},
    {"olmo", DEF_GPT2},
    {"jais", DEF_GPT2},
    {"trillion", DEF_GPT2},
    {"granite-docling", DEF_GPT2},
    {"exaone4", DEF_GPT2},
    {"starcoder", DEF_STARCODER},
    {"refact", DEF_STARCODER},
    {"command-r", DEF_STARCODER},
    {"smollm", DEF_STARCODER},
    {"codeshell", DEF_STARCODER},
    {"exaone", DEF_STARCODER},
    {"minerva-7b", DEF_STARCODER},
    {"qwen2", DEF_QWEN2},
    {"deepseek-r1-qwen", DEF_QWEN2},
    {"kormo", DEF_QWEN2},
    {"megrez", DEF_QWEN2},
    {"stablelm2", DEF_QWEN2},
    {"hunyuan", DEF_QWEN2},
    {"grok-2", DEF_QWEN2},
    {"poro-chat", DEF_PORO},
    {"bloom", DEF_PORO},
    {"gpt3-finnish", DEF_PORO},
    {"viking", DEF_VIKING},
    {"tekken", DEF_TEKKEN},
    {"gpt-4o", DEF_GPT4O},
    {"llama4", DEF_GPT4O},
    {"seed-coder", DEF_SEED_CODER},
    {"bailingmoe", DEF_BAILING},
    {"bailingmoe2", DEF_BAILING},
    {"llada-moe", DEF_BAILING},
};

/* ---- types --------------------------------------------------------------- */

struct Pretok {
    const PretokDef *def;
    pcre2_general_context *gctx; /* routes PCRE2's allocations to mn_malloc */
    pcre2_code *codes[PRETOK_MAX_PATTERNS];
    int n_codes;
};

/* ---- PCRE2 memory hooks -------------------------------------------------- */

static void *pretok_pcre_malloc(size_t n, void *data) {
    (void)data;
    return mn_malloc(n);
}

static void pretok_pcre_free(void *p, void *data) {
    (void)data;
    mn_free(p);
}

/* ---- API ----------------------------------------------------------------- */

int pretok_new(const char *name, size_t name_len, Pretok **out, MnErr *err) {
    assert(out != NULL);
    *out = NULL;
    int def = -1;
    if (name == NULL || name_len == 0) {
        def = DEF_DEFAULT;
    } else {
        for (size_t i = 0; i < sizeof pretok_names / sizeof pretok_names[0]; i++) {
            if (strlen(pretok_names[i].name) == name_len &&
                memcmp(pretok_names[i].name, name, name_len) == 0) {
                def = pretok_names[i].def;
                break;
            }
        }
    }
    if (def < 0) {
        int shown = name_len > 64 ? 64 : (int)name_len;
        return mn_err_set(err, MN_EUNSUPPORTED, "unknown pre-tokenizer tokenizer.ggml.pre='%.*s'", shown,
                          name);
    }

    Pretok *p = mn_calloc(1, sizeof *p);
    if (p == NULL) return mn_err_set(err, MN_ENOMEM, "out of memory compiling pre-tokenizer");
    p->def = &pretok_defs[def];
    p->gctx = pcre2_general_context_create(pretok_pcre_malloc, pretok_pcre_free, NULL);
    pcre2_compile_context *cctx = p->gctx ? pcre2_compile_context_create(p->gctx) : NULL;
    if (cctx == NULL) {
        pretok_free(p);
        return mn_err_set(err, MN_ENOMEM, "out of memory compiling pre-tokenizer");
    }

    int rc = MN_OK;
    for (int i = 0; i < p->def->n_patterns; i++) {
        int code = 0;
        PCRE2_SIZE erroff = 0;
        const char *pat = p->def->patterns[i];
        p->codes[i] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &erroff, cctx);
        if (p->codes[i] == NULL) {
            if (code == PCRE2_ERROR_NOMEMORY) {
                rc = mn_err_set(err, MN_ENOMEM, "out of memory compiling pre-tokenizer");
            } else {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(code, msg, sizeof msg);
                rc = mn_err_set(err, MN_EFORMAT, "pre-tokenizer '%s' pattern %d: %s at offset %zu",
                                p->def->kind, i, (const char *)msg, (size_t)erroff);
            }
            break;
        }
        p->n_codes = i + 1;
        /* JIT is an optimization: without it (or if it fails) the
         * interpreter gives the same answers. */
        (void)pcre2_jit_compile(p->codes[i], PCRE2_JIT_COMPLETE);
    }
    pcre2_compile_context_free(cctx);
    if (rc != MN_OK) {
        pretok_free(p);
        return rc;
    }
    *out = p;
    return MN_OK;
}

void pretok_free(Pretok *p) {
    if (p == NULL) return;
    for (int i = 0; i < p->n_codes; i++) pcre2_code_free(p->codes[i]);
    pcre2_general_context_free(p->gctx);
    mn_free(p);
}

const char *pretok_kind(const Pretok *p) { return p->def->kind; }
bool pretok_ignore_merges(const Pretok *p) { return p->def->ignore_merges; }
bool pretok_default_add_bos(const Pretok *p) { return p->def->add_bos; }

void pretok_scratch_free(PretokScratch *s) {
    if (s == NULL) return;
    mn_free(s->spans[0]);
    mn_free(s->spans[1]);
    mn_free(s->text);
    pcre2_match_data_free(s->match_data);
    memset(s, 0, sizeof *s);
}

/* ---- helpers ------------------------------------------------------------- */

static int pretok_push(PretokScratch *s, int which, size_t *n, size_t off, size_t len) {
    if (*n == s->cap[which]) {
        size_t cap = s->cap[which] ? s->cap[which] * 2 : 64;
        PretokSpan *v = mn_realloc(s->spans[which], cap * sizeof *v);
        if (v == NULL) return MN_ENOMEM;
        s->spans[which] = v;
        s->cap[which] = cap;
    }
    s->spans[which][(*n)++] = (PretokSpan){off, len};
    return MN_OK;
}

/* Rewrite malformed input as llama.cpp sees it: decode leniently, every
 * bad byte becomes U+FFFD, overlong forms are re-encoded canonically.
 * Surrogates and values above U+10FFFF, which llama.cpp would pass on as
 * invalid UTF-8 (or throw on), also become U+FFFD here. */
static int pretok_sanitize(PretokScratch *s, const char *text, size_t len, size_t *out_len) {
    /* Each input byte yields at most 3 output bytes (a lone byte -> U+FFFD). */
    if (len > SIZE_MAX / 3) return MN_ENOMEM;
    size_t need = len * 3;
    if (need > s->text_cap) {
        char *t = mn_realloc(s->text, need);
        if (t == NULL) return MN_ENOMEM;
        s->text = t;
        s->text_cap = need;
    }
    const unsigned char *in = (const unsigned char *)text;
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        i += utf8_decode_lenient(in + i, len - i, &cp);
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = UTF8_REPLACEMENT;
        o += utf8_encode(cp, s->text + o);
    }
    *out_len = o;
    return MN_OK;
}

/* Next code point boundary after pos (text is valid UTF-8). */
static size_t pretok_next_char(const char *t, size_t n, size_t pos) {
    pos++;
    while (pos < n && ((unsigned char)t[pos] & 0xC0) == 0x80) pos++;
    return pos;
}

/* ---- splitting ----------------------------------------------------------- */

int pretok_split(const Pretok *p, const char *text, size_t len, PretokScratch *s, const char **out_text,
                 const PretokSpan **words, size_t *n_words) {
    assert(p != NULL && s != NULL && out_text != NULL && words != NULL && n_words != NULL);
    *n_words = 0;
    *words = NULL;
    *out_text = text;
    if (len == 0) return MN_OK;

    if (!utf8_is_valid(text, len)) {
        int rc = pretok_sanitize(s, text, len, &len);
        if (rc != MN_OK) return rc;
        text = s->text;
        *out_text = text;
    }
    if (s->match_data == NULL) {
        s->match_data = pcre2_match_data_create(16, p->gctx);
        if (s->match_data == NULL) return MN_ENOMEM;
    }
    pcre2_match_data *md = s->match_data;

    int cur = 0;
    size_t n_cur = 0;
    int rc = pretok_push(s, cur, &n_cur, 0, len);
    if (rc != MN_OK) return rc;

    for (int r = 0; r < p->n_codes; r++) {
        const pcre2_code *code = p->codes[r];
        int nxt = 1 - cur;
        size_t n_nxt = 0;
        for (size_t k = 0; k < n_cur; k++) {
            PretokSpan piece = s->spans[cur][k];
            const char *subj = text + piece.off;
            size_t pos = 0, last = 0;
            while (pos < piece.len) {
                int m = pcre2_match(code, (PCRE2_SPTR)subj, piece.len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                if (m == PCRE2_ERROR_JIT_STACKLIMIT) {
                    /* The interpreter keeps its backtracking state on the
                     * heap and so copes with deeper recursion. */
                    m = pcre2_match(code, (PCRE2_SPTR)subj, piece.len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                                    md, NULL);
                }
                if (m == PCRE2_ERROR_NOMATCH) break;
                if (m == PCRE2_ERROR_NOMEMORY) return MN_ENOMEM;
                if (m < 0) return MN_ERANGE;
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = ov[0], me = ov[1];
                if (me <= ms) { /* empty match: nothing to cut, step on */
                    pos = pretok_next_char(subj, piece.len, ms > pos ? ms : pos);
                    continue;
                }
                if (ms > last) {
                    rc = pretok_push(s, nxt, &n_nxt, piece.off + last, ms - last);
                    if (rc != MN_OK) return rc;
                }
                rc = pretok_push(s, nxt, &n_nxt, piece.off + ms, me - ms);
                if (rc != MN_OK) return rc;
                last = pos = me;
            }
            if (last < piece.len) {
                rc = pretok_push(s, nxt, &n_nxt, piece.off + last, piece.len - last);
                if (rc != MN_OK) return rc;
            }
        }
        cur = nxt;
        n_cur = n_nxt;
    }
    *words = s->spans[cur];
    *n_words = n_cur;
    return MN_OK;
}
