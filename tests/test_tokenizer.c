/* test_tokenizer.c — the tokenizer against llama.cpp's test vectors and the
 * reference tokenizations, plus round trips, streaming detokenization,
 * special-token parsing, BOS handling, malformed input and bad metadata. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "base/mem.h"
#include "base/rng.h"
#include "model/gguf.h"
#include "model/pretok.h"
#include "model/tokenizer.h"
#include "base/utf8.h"

/* ---- helpers ------------------------------------------------------------- */

typedef struct Loaded {
    Gguf *g;
    Tokenizer *tok;
} Loaded;

/* Open a shared-data GGUF and load its tokenizer; skips when missing. */
static int load_tok(const char *rel, Loaded *l) {
    char path[512];
    test_data_path(path, sizeof path, rel);
    if (!test_require_file(path)) return 0;
    MnErr err = {0};
    int rc = gguf_open(path, &l->g, &err);
    if (rc != MN_OK) fail_msg("gguf_open %s: %s", path, err.msg);
    rc = tok_load(l->g, &l->tok, &err);
    if (rc != MN_OK) fail_msg("tok_load %s: %s", path, err.msg);
    return 1;
}

static void unload_tok(Loaded *l) {
    tok_free(l->tok);
    gguf_close(l->g);
}

static void encode_or_fail(const Tokenizer *tok, const char *s, size_t n, bool bos, bool special,
                           TokIds *out) {
    out->n = 0;
    int rc = tok_encode(tok, s, n, bos, special, out);
    assert_int_equal(rc, MN_OK);
}

static char *decode_or_fail(const Tokenizer *tok, const TokIds *ids, bool special, size_t *len) {
    char *s = NULL;
    int rc = tok_decode(tok, ids->ids, ids->n, special, &s, len);
    assert_int_equal(rc, MN_OK);
    return s;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

static bool ids_equal(const TokIds *a, const int32_t *b, size_t n) {
    return a->n == n && (n == 0 || memcmp(a->ids, b, n * sizeof *b) == 0);
}

/* ---- the vocab test vectors ---------------------------------------------- */

#define SEP "\n__ggml_vocab_test__\n"

/* NAME.gguf.inp holds cases each followed by "\n__ggml_vocab_test__\n";
 * NAME.gguf.out one line of ids per case. */
static void run_vocab(const char *name, bool spm) {
    char rel[256], path[512];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    Loaded l;
    if (!load_tok(rel, &l)) return;
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.inp", name);
    size_t inp_len = 0, out_len = 0;
    char *inp = test_read_file(test_data_path(path, sizeof path, rel), &inp_len);
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.out", name);
    char *outs = test_read_file(test_data_path(path, sizeof path, rel), &out_len);
    assert_non_null(inp);
    assert_non_null(outs);

    int n_cases = 0, n_pass = 0, n_round = 0;
    TokIds ids = {0};
    char *p = inp, *line = outs;
    int32_t *want = malloc(4096 * sizeof *want);
    for (;;) {
        char *sep = strstr(p, SEP);
        if (sep == NULL) break;
        size_t n = (size_t)(sep - p);
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = '\0';
        size_t n_want = 0;
        for (char *q = line; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[n_want++] = (int32_t)v;
            q = end;
        }
        line = eol + 1;
        n_cases++;

        encode_or_fail(l.tok, p, n, false, false, &ids);
        if (ids_equal(&ids, want, n_want)) {
            n_pass++;
        } else {
            fprintf(stderr, "  %s case %d mismatch: '%.*s'\n", name, n_cases, (int)(n > 80 ? 80 : n), p);
            print_ids("want", want, n_want);
            print_ids("got ", ids.ids, ids.n);
        }
        /* Round trip: byte-level BPE is exact; SPM loses nothing either
         * once the stream drops the space prefix. */
        size_t dn;
        char *d = decode_or_fail(l.tok, &ids, false, &dn);
        if (dn == n && memcmp(d, p, n) == 0)
            n_round++;
        else
            fprintf(stderr, "  %s case %d round trip: '%.*s' -> '%s'\n", name, n_cases, (int)n, p, d);
        mn_free(d);
        p = sep + strlen(SEP);
    }
    fprintf(stderr, "[ vocab    ] %-15s %s: %d/%d vectors pass, %d/%d round trips\n", name,
            spm ? "spm" : "bpe", n_pass, n_cases, n_round, n_cases);
    free(want);
    tok_ids_free(&ids);
    free(inp);
    free(outs);
    unload_tok(&l);
    assert_int_equal(n_cases, 46);
    if (n_pass != n_cases) fail_msg("%s: %d/%d vectors pass", name, n_pass, n_cases);
    if (n_round != n_cases) fail_msg("%s: %d/%d round trips", name, n_round, n_cases);
}

static void test_vocab_llama_spm(void **state) {
    (void)state;
    run_vocab("llama-spm", true);
}
static void test_vocab_phi_3(void **state) {
    (void)state;
    run_vocab("phi-3", true);
}
static void test_vocab_gpt_2(void **state) {
    (void)state;
    run_vocab("gpt-2", false);
}
static void test_vocab_starcoder(void **state) {
    (void)state;
    run_vocab("starcoder", false);
}
static void test_vocab_falcon(void **state) {
    (void)state;
    run_vocab("falcon", false);
}
static void test_vocab_mpt(void **state) {
    (void)state;
    run_vocab("mpt", false);
}
static void test_vocab_refact(void **state) {
    (void)state;
    run_vocab("refact", false);
}
static void test_vocab_deepseek_llm(void **state) {
    (void)state;
    run_vocab("deepseek-llm", false);
}
static void test_vocab_deepseek_coder(void **state) {
    (void)state;
    run_vocab("deepseek-coder", false);
}

/* ---- reference tokenizations of the model prompts ------------------------ */

/* reference/exact/MODEL.pN.ref starts "MREF", n_tokens, n_vocab, k, tokens. */
static void check_ref_prompts(const char *model) {
    char rel[256], path[512];
    snprintf(rel, sizeof rel, "models/%s.gguf", model);
    Loaded l;
    if (!load_tok(rel, &l)) return;
    char *prompts = test_read_file(test_data_path(path, sizeof path, "reference/prompts.txt"), NULL);
    assert_non_null(prompts);
    TokIds ids = {0};
    char *p = prompts;
    for (int k = 1; k <= 3; k++) {
        char *eol = strchr(p, '\n');
        assert_non_null(eol);
        snprintf(rel, sizeof rel, "reference/exact/%s.p%d.ref", model, k);
        size_t n_ref = 0;
        char *ref = test_read_file(test_data_path(path, sizeof path, rel), &n_ref);
        assert_non_null(ref);
        int32_t hdr[4];
        memcpy(hdr, ref + 4, sizeof hdr - 4);
        int32_t n_tok = hdr[0];
        assert_true(n_tok > 0 && (size_t)(16 + 4 * n_tok) <= n_ref);
        encode_or_fail(l.tok, p, (size_t)(eol - p), tok_add_bos(l.tok), true, &ids);
        if (!ids_equal(&ids, (const int32_t *)(ref + 16), (size_t)n_tok)) {
            print_ids("want", (const int32_t *)(ref + 16), (size_t)n_tok);
            print_ids("got ", ids.ids, ids.n);
            fail_msg("%s prompt %d: tokens differ from the reference", model, k);
        }
        free(ref);
        p = eol + 1;
    }
    tok_ids_free(&ids);
    free(prompts);
    unload_tok(&l);
}

static void test_ref_prompts(void **state) {
    (void)state;
    check_ref_prompts("stories260K");
    check_ref_prompts("tiny-llama-spm-f32");
    check_ref_prompts("tiny-qwen2-gpt2-f32");
}

/* ---- BOS and metadata ---------------------------------------------------- */

static void test_bos_stories(void **state) {
    (void)state;
    Loaded l;
    if (!load_tok("models/stories260K.gguf", &l)) return;
    assert_int_equal(tok_n_vocab(l.tok), 512);
    assert_int_equal(tok_bos(l.tok), 1);
    assert_int_equal(tok_eos(l.tok), 2);
    assert_true(tok_add_bos(l.tok)); /* no add_bos_token key: SPM default */
    assert_true(tok_is_eog(l.tok, 2));
    assert_false(tok_is_eog(l.tok, 1));
    assert_true(tok_is_control(l.tok, 1));
    assert_false(tok_is_control(l.tok, 403));

    TokIds ids = {0};
    const char *s = "Once upon a time";
    encode_or_fail(l.tok, s, strlen(s), true, false, &ids);
    const int32_t want[] = {1, 403, 407, 261, 378};
    if (!ids_equal(&ids, want, 5)) {
        print_ids("got", ids.ids, ids.n);
        fail_msg("stories260K 'Once upon a time' with BOS");
    }
    /* Without BOS, and appending to a non-empty buffer. */
    ids.n = 0;
    assert_int_equal(tok_ids_push(&ids, 77), MN_OK);
    assert_int_equal(tok_encode(l.tok, s, strlen(s), false, false, &ids), MN_OK);
    assert_int_equal(ids.n, 5);
    assert_int_equal(ids.ids[0], 77);
    assert_int_equal(ids.ids[1], 403);
    /* Empty text: BOS only, or nothing. */
    ids.n = 0;
    encode_or_fail(l.tok, "", 0, true, false, &ids);
    assert_int_equal(ids.n, 1);
    encode_or_fail(l.tok, "", 0, false, false, &ids);
    assert_int_equal(ids.n, 0);

    /* Decoding with BOS in front strips the space prefix all the same. */
    encode_or_fail(l.tok, s, strlen(s), true, false, &ids);
    size_t n;
    char *d = decode_or_fail(l.tok, &ids, false, &n);
    assert_string_equal(d, s);
    mn_free(d);
    d = decode_or_fail(l.tok, &ids, true, &n);
    assert_string_equal(d, "<s> Once upon a time");
    mn_free(d);
    tok_ids_free(&ids);
    unload_tok(&l);
}

static void test_special_ids(void **state) {
    (void)state;
    Loaded l;
    if (!load_tok("vocab/ggml-vocab-gpt-2.gguf", &l)) return;
    assert_int_equal(tok_bos(l.tok), 50256);
    assert_int_equal(tok_eos(l.tok), 50256);
    assert_false(tok_add_bos(l.tok)); /* gpt2 family default */
    assert_true(tok_is_eog(l.tok, 50256));
    assert_string_equal(tok_text(l.tok, 50256), "<|endoftext|>");
    assert_string_equal(tok_text(l.tok, -1), "");
    size_t n;
    char buf[8];
    tok_piece(l.tok, 50256, false, buf, &n);
    assert_int_equal(n, 0);
    const char *pc = tok_piece(l.tok, 50256, true, buf, &n);
    assert_int_equal(n, 13);
    assert_memory_equal(pc, "<|endoftext|>", 13);
    pc = tok_piece(l.tok, 995, false, buf, &n); /* "Ġworld" */
    assert_int_equal(n, 6);
    assert_memory_equal(pc, " world", 6);
    tok_dump(l.tok, stderr);
    unload_tok(&l);

    if (!load_tok("vocab/ggml-vocab-phi-3.gguf", &l)) return;
    assert_int_equal(tok_eos(l.tok), 32000);
    assert_true(tok_is_eog(l.tok, 32000));
    assert_true(tok_is_eog(l.tok, 32007)); /* <|end|> */
    assert_int_equal(tok_eot(l.tok), 32007);
    unload_tok(&l);

    /* DeepSeek's end-of-sentence token is found by its text. */
    if (!load_tok("vocab/ggml-vocab-deepseek-llm.gguf", &l)) return;
    assert_int_equal(tok_eot(l.tok), 100001);
    assert_true(tok_add_bos(l.tok));
    assert_int_equal(tok_bos(l.tok), 100000);
    unload_tok(&l);
}

/* ---- special-token parsing ----------------------------------------------- */

static bool contains(const TokIds *v, int32_t id) {
    for (size_t i = 0; i < v->n; i++)
        if (v->ids[i] == id) return true;
    return false;
}

static void test_parse_special(void **state) {
    (void)state;
    Loaded l;
    TokIds a = {0}, b = {0};
    if (!load_tok("vocab/ggml-vocab-llama-spm.gguf", &l)) return;
    const char *s = "Hello</s>world";
    encode_or_fail(l.tok, s, strlen(s), false, true, &a);
    /* "</s>" splits the text; the fragment after a special token gets the
     * space prefix again (llama.cpp: is_prev_special). */
    const int32_t want_on[] = {15043, 2, 3186};
    if (!ids_equal(&a, want_on, 3)) {
        print_ids("got", a.ids, a.n);
        fail_msg("llama-spm parse_special on");
    }
    encode_or_fail(l.tok, s, strlen(s), false, false, &b);
    assert_false(contains(&b, 2));
    size_t n;
    char *d = decode_or_fail(l.tok, &b, false, &n);
    assert_string_equal(d, s); /* literal text survives */
    mn_free(d);
    d = decode_or_fail(l.tok, &a, false, &n);
    assert_string_equal(d, "Hello world"); /* control piece hidden... */
    mn_free(d);
    d = decode_or_fail(l.tok, &a, true, &n);
    assert_string_equal(d, "Hello</s> world"); /* ...or shown */
    mn_free(d);
    unload_tok(&l);

    if (!load_tok("vocab/ggml-vocab-gpt-2.gguf", &l)) return;
    s = "a<|endoftext|>b <|endoftext|>";
    encode_or_fail(l.tok, s, strlen(s), false, true, &a);
    const int32_t want_gpt2[] = {64, 50256, 65, 220, 50256};
    if (!ids_equal(&a, want_gpt2, 5)) {
        print_ids("got", a.ids, a.n);
        fail_msg("gpt-2 parse_special on");
    }
    encode_or_fail(l.tok, s, strlen(s), false, false, &b);
    assert_false(contains(&b, 50256));
    d = decode_or_fail(l.tok, &b, false, &n);
    assert_string_equal(d, s);
    mn_free(d);
    unload_tok(&l);

    /* phi-3: "</s>" is user-defined (split even without parse_special) and
     * special tokens strip the white space after them. */
    if (!load_tok("vocab/ggml-vocab-phi-3.gguf", &l)) return;
    s = "Hi</s>  there";
    encode_or_fail(l.tok, s, strlen(s), false, false, &a);
    assert_true(contains(&a, 2));
    s = "<|user|>\nHi<|end|>";
    encode_or_fail(l.tok, s, strlen(s), false, true, &a);
    assert_int_equal(a.ids[0], 32010);
    assert_int_equal(a.ids[a.n - 1], 32007);
    assert_false(contains(&a, 13)); /* the newline after <|user|> was stripped */
    encode_or_fail(l.tok, s, strlen(s), false, false, &b);
    assert_false(contains(&b, 32010));
    unload_tok(&l);

    tok_ids_free(&a);
    tok_ids_free(&b);
}

/* ---- streaming detokenization -------------------------------------------- */

static void test_stream_utf8(void **state) {
    (void)state;
    Loaded l;
    if (!load_tok("vocab/ggml-vocab-llama-spm.gguf", &l)) return;
    const char *s = "日本語 🙂 ok";
    TokIds ids = {0};
    encode_or_fail(l.tok, s, strlen(s), true, false, &ids);
    int n_bytes = 0;
    for (size_t i = 0; i < ids.n; i++) n_bytes += ids.ids[i] >= 3 && ids.ids[i] < 259;
    assert_true(n_bytes >= 4); /* 🙂 at least goes through byte fallback */

    size_t full_len;
    char *full = decode_or_fail(l.tok, &ids, false, &full_len);
    assert_string_equal(full, s);

    char acc[256], out[256];
    size_t acc_len = 0, k;
    TokStream st;
    tok_stream_init(&st, l.tok, false);
    size_t cap = tok_max_piece_bytes(l.tok) + 16;
    assert_true(cap <= sizeof out);
    int held = 0;
    for (size_t i = 0; i < ids.n; i++) {
        assert_int_equal(tok_stream_push(&st, ids.ids[i], out, cap, &k), MN_OK);
        assert_true(utf8_is_valid(out, k)); /* never a partial character */
        if (st.n_pending > 0) held++;
        memcpy(acc + acc_len, out, k);
        acc_len += k;
    }
    assert_int_equal(tok_stream_flush(&st, out, cap, &k), MN_OK);
    assert_int_equal(k, 0);
    assert_true(held > 0);
    assert_int_equal(acc_len, full_len);
    assert_memory_equal(acc, full, full_len);
    mn_free(full);

    /* An incomplete character at the end comes out as U+FFFD on flush; a
     * broken one as soon as it is clear. 0xF0 0x9F = start of a 4-byte
     * character, then 'A'. */
    int32_t f0 = 3 + 0xF0, x9f = 3 + 0x9F, bA = 3 + 'A';
    tok_stream_init(&st, l.tok, false);
    assert_int_equal(tok_stream_push(&st, f0, out, cap, &k), MN_OK);
    assert_int_equal(k, 0);
    assert_int_equal(tok_stream_push(&st, x9f, out, cap, &k), MN_OK);
    assert_int_equal(k, 0);
    assert_int_equal(tok_stream_flush(&st, out, cap, &k), MN_OK);
    assert_int_equal(k, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    tok_stream_init(&st, l.tok, false);
    tok_stream_push(&st, f0, out, cap, &k);
    tok_stream_push(&st, x9f, out, cap, &k);
    assert_int_equal(tok_stream_push(&st, bA, out, cap, &k), MN_OK);
    assert_int_equal(k, 4);
    assert_memory_equal(out,
                        "\xef\xbf\xbd"
                        "A",
                        4);
    /* A lone continuation byte, and a too-small buffer. */
    tok_stream_init(&st, l.tok, false);
    assert_int_equal(tok_stream_push(&st, x9f, out, cap, &k), MN_OK);
    assert_int_equal(k, 3);
    assert_int_equal(tok_stream_push(&st, 15043 /* "▁Hello" */, out, 3, &k), MN_EFULL);
    assert_int_equal(tok_stream_push(&st, 15043, out, cap, &k), MN_OK);
    assert_int_equal(k, 6);
    assert_memory_equal(out, " Hello", 6); /* not at the start any more */

    tok_ids_free(&ids);
    unload_tok(&l);
}

/* ---- malformed input ----------------------------------------------------- */

/* exact: the vocabulary has a token for every byte, so valid UTF-8 must
 * round-trip (falcon lacks some control bytes, which llama.cpp drops too). */
static void fuzz_one(const char *rel, bool exact) {
    Loaded l;
    if (!load_tok(rel, &l)) return;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    TokIds ids = {0};
    char buf[64];
    static const char alphabet[] = " \n\ta'sЖ日🙂<|endoftext|></s>\xff\xc3\xe2\x80";
    for (int it = 0; it < 300; it++) {
        size_t n = rng_splitmix64(&seed) % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_splitmix64(&seed);
            buf[i] = (r & 1) ? (char)(r >> 8) : alphabet[(r >> 8) % (sizeof alphabet - 1)];
        }
        encode_or_fail(l.tok, buf, n, (it & 1) != 0, (it & 2) != 0, &ids);
        for (size_t i = 0; i < ids.n; i++) assert_true(ids.ids[i] >= 0 && ids.ids[i] < tok_n_vocab(l.tok));
        size_t dn;
        char *d = decode_or_fail(l.tok, &ids, (it & 4) != 0, &dn);
        assert_true(utf8_is_valid(d, dn));
        /* Valid UTF-8 input round-trips exactly (no BOS, nothing special). */
        if (exact && utf8_is_valid(buf, n)) {
            encode_or_fail(l.tok, buf, n, false, false, &ids);
            mn_free(d);
            d = decode_or_fail(l.tok, &ids, false, &dn);
            if (dn != n || memcmp(d, buf, n) != 0) {
                fprintf(stderr, "    in :");
                for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)buf[i]);
                fprintf(stderr, "\n    out:");
                for (size_t i = 0; i < dn; i++) fprintf(stderr, " %02x", (unsigned char)d[i]);
                fprintf(stderr, "\n");
                print_ids("ids", ids.ids, ids.n);
                fail_msg("%s: round trip of fuzz case %d", rel, it);
            }
        }
        mn_free(d);
    }
    tok_ids_free(&ids);
    unload_tok(&l);
}

static void test_malformed_input(void **state) {
    (void)state;
    fuzz_one("vocab/ggml-vocab-llama-spm.gguf", true);
    fuzz_one("vocab/ggml-vocab-gpt-2.gguf", true);
    fuzz_one("vocab/ggml-vocab-deepseek-llm.gguf", true);
    fuzz_one("vocab/ggml-vocab-falcon.gguf", false);
}

/* ---- bad metadata -------------------------------------------------------- */

/* Write a small GGUF with the given tokenizer keys and try to load it. */
typedef enum {
    META_NONE,
    META_BERT,
    META_BAD_PRE,
    META_SHORT_SCORES,
    META_NO_MERGES,
    META_OK_BPE,
    META_LLAMA3,
} MetaCase;

static int try_meta(MetaCase c, MnErr *err) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/mnemo-test-tok-%d-%d.gguf", (int)getpid(), (int)c);
    GgufWriter *w = gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(gguf_writer_add_str(w, "general.architecture", "llama"), MN_OK);
    const char *toks[] = {"a", "b", "ab", "\xc4\xa0"};
    const char *merges[] = {"a b"};
    float scores[] = {0, 0};
    switch (c) {
    case META_NONE:
        break;
    case META_BERT:
        gguf_writer_add_str(w, "tokenizer.ggml.model", "bert");
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        break;
    case META_BAD_PRE:
        gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_writer_add_str(w, "tokenizer.ggml.pre", "no-such-pre");
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, 1);
        break;
    case META_SHORT_SCORES:
        gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, 2);
        break;
    case META_NO_MERGES:
        gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        break;
    case META_OK_BPE:
        gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, 1);
        break;
    case META_LLAMA3: {
        /* "abc" is a token that no merge sequence reaches: llama3 takes
         * whole words as they are. */
        const char *t3[] = {"a", "b", "c", "ab", "abc", "<|begin_of_text|>"};
        int32_t types[] = {1, 1, 1, 1, 1, 3};
        gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_writer_add_str(w, "tokenizer.ggml.pre", "llama-bpe");
        gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", t3, 6);
        gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, 6);
        gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, 1);
        gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 5);
        break;
    }
    }
    assert_int_equal(gguf_writer_write(w, path, err), MN_OK);
    gguf_writer_free(w);
    Gguf *g = NULL;
    assert_int_equal(gguf_open(path, &g, err), MN_OK);
    Tokenizer *tok = NULL;
    memset(err, 0, sizeof *err);
    int rc = tok_load(g, &tok, err);
    if (rc == MN_OK && c == META_LLAMA3) {
        TokIds ids = {0};
        assert_true(tok_add_bos(tok)); /* llama3 default */
        assert_int_equal(tok_encode(tok, "abc", 3, tok_add_bos(tok), false, &ids), MN_OK);
        const int32_t want[] = {5, 4};
        if (!ids_equal(&ids, want, 2)) {
            print_ids("got", ids.ids, ids.n);
            fail_msg("llama3 ignore_merges");
        }
        tok_ids_free(&ids);
        tok_free(tok);
    } else if (rc == MN_OK) {
        /* The tiny BPE vocabulary: "ab" merges, " " has its code point. */
        TokIds ids = {0};
        assert_int_equal(tok_encode(tok, "ab ab", 5, true, false, &ids), MN_OK);
        const int32_t want[] = {2, 3, 2};
        if (!ids_equal(&ids, want, 3)) {
            print_ids("got", ids.ids, ids.n);
            fail_msg("tiny BPE vocabulary");
        }
        assert_int_equal(tok_bos(tok), -1); /* default id 11 is out of range */
        tok_ids_free(&ids);
        tok_free(tok);
    } else {
        assert_null(tok);
    }
    gguf_close(g);
    unlink(path);
    return rc;
}

static void test_bad_metadata(void **state) {
    (void)state;
    MnErr err;
    assert_int_equal(try_meta(META_NONE, &err), MN_ENOTFOUND);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.model"));
    assert_int_equal(try_meta(META_BERT, &err), MN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "bert"));
    assert_int_equal(try_meta(META_BAD_PRE, &err), MN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "no-such-pre"));
    assert_int_equal(try_meta(META_SHORT_SCORES, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "scores"));
    assert_int_equal(try_meta(META_NO_MERGES, &err), MN_EFORMAT);
    assert_non_null(strstr(err.msg, "merges"));
    assert_int_equal(try_meta(META_OK_BPE, &err), MN_OK);
    assert_int_equal(try_meta(META_LLAMA3, &err), MN_OK);
}

/* ---- pre-tokenizers ------------------------------------------------------ */

static void check_split(const char *pre, const char *text, const char *const *want, size_t n_want) {
    Pretok *p = NULL;
    MnErr err;
    assert_int_equal(pretok_new(pre, strlen(pre), &p, &err), MN_OK);
    PretokScratch sc;
    memset(&sc, 0, sizeof sc);
    const char *t;
    const PretokSpan *w;
    size_t n;
    assert_int_equal(pretok_split(p, text, strlen(text), &sc, &t, &w, &n), MN_OK);
    bool ok = n == n_want;
    for (size_t i = 0; ok && i < n; i++)
        ok = w[i].len == strlen(want[i]) && memcmp(t + w[i].off, want[i], w[i].len) == 0;
    if (!ok) {
        for (size_t i = 0; i < n; i++) fprintf(stderr, "    [%.*s]\n", (int)w[i].len, t + w[i].off);
        fail_msg("pre-tokenizer %s splits '%s' wrongly", pre, text);
    }
    pretok_scratch_free(&sc);
    pretok_free(p);
}

static void test_pretok(void **state) {
    (void)state;
    static const char *const names[] = {
        "default",      "llama3",         "llama-bpe", "llama-v3",  "falcon3",    "dbrx",       "smaug-bpe",
        "deepseek-llm", "deepseek-coder", "falcon",    "mpt",       "gpt-2",      "phi-2",      "olmo",
        "starcoder",    "refact",         "command-r", "qwen2",     "stablelm2",  "poro-chat",  "bloom",
        "viking",       "tekken",         "gpt-4o",    "llama4",    "seed-coder", "bailingmoe", "smollm",
        "exaone",       "minerva-7b",     "jais",      "codeshell", "megrez",     "grok-2",
    };
    MnErr err;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        Pretok *p = NULL;
        int rc = pretok_new(names[i], strlen(names[i]), &p, &err);
        if (rc != MN_OK) fail_msg("pre-tokenizer %s: %s", names[i], err.msg);
        pretok_free(p);
    }
    Pretok *p = NULL;
    assert_int_equal(pretok_new("nonesuch", 8, &p, &err), MN_EUNSUPPORTED);
    assert_null(p);
    assert_int_equal(pretok_new(NULL, 0, &p, &err), MN_OK); /* absent key: default */
    assert_string_equal(pretok_kind(p), "default");
    pretok_free(p);

    const char *text = "Hello world's 12345 \n\n  x!!\n";
    static const char *const llama3[] = {"Hello", " world", "'s", " ",  "123",
                                         "45",    " \n\n",  " ",  " x", "!!\n"};
    check_split("llama3", text, llama3, 10);
    static const char *const qwen2[] = {"Hello", " world", "'s",    " ", "1",  "2",   "3",
                                        "4",     "5",      " \n\n", " ", " x", "!!\n"};
    check_split("qwen2", text, qwen2, 13);
    static const char *const gpt2[] = {"Hello", " world", "'s", " 12345", " \n\n ", " x", "!!", "\n"};
    check_split("gpt-2", text, gpt2, 8);
    /* Case variants of contractions, and Unicode classes. */
    static const char *const l3b[] = {"I", "'VE", " été", " ", "١٢٣", "\xc2\xa0日本"};
    check_split("llama3", "I'VE été ١٢٣\xc2\xa0日本", l3b, 6);
    /* Malformed UTF-8 becomes U+FFFD before splitting. */
    static const char *const bad[] = {"a", "\xef\xbf\xbd\xef\xbf\xbd", "b"};
    check_split("gpt-2",
                "a\xff\xfe"
                "b",
                bad, 3);
}

/* ---- threads and speed --------------------------------------------------- */

typedef struct ThreadJob {
    const Tokenizer *tok;
    const char *text;
    size_t len;
    const TokIds *want;
    int ok;
} ThreadJob;

static void *thread_encode(void *arg) {
    ThreadJob *j = arg;
    TokIds ids = {0};
    j->ok = 1;
    for (int it = 0; it < 20; it++) {
        ids.n = 0;
        if (tok_encode(j->tok, j->text, j->len, true, true, &ids) != MN_OK ||
            !ids_equal(&ids, j->want->ids, j->want->n))
            j->ok = 0;
    }
    tok_ids_free(&ids);
    return NULL;
}

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check_threads_and_speed(const char *rel) {
    char path[512];
    Loaded l;
    if (!load_tok(rel, &l)) return;
    size_t plen = 0;
    char *prompts = test_read_file(test_data_path(path, sizeof path, "reference/prompts.txt"), &plen);
    assert_non_null(prompts);
    /* ~16 KB of text. */
    size_t reps = 16384 / plen + 1, len = reps * plen;
    char *text = malloc(len);
    for (size_t i = 0; i < reps; i++) memcpy(text + i * plen, prompts, plen);
    TokIds want = {0};
    double t0 = now_sec();
    encode_or_fail(l.tok, text, len, true, true, &want);
    double dt = now_sec() - t0;
    fprintf(stderr, "[ speed    ] %s: %zu bytes -> %zu tokens in %.2f ms\n", rel, len, want.n, dt * 1e3);

    pthread_t th[4];
    ThreadJob jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (ThreadJob){l.tok, text, len, &want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_encode, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(jobs[i].ok);
    }
    tok_ids_free(&want);
    free(text);
    free(prompts);
    unload_tok(&l);
}

static void test_threads_and_speed(void **state) {
    (void)state;
    check_threads_and_speed("vocab/ggml-vocab-llama-spm.gguf");
    check_threads_and_speed("vocab/ggml-vocab-deepseek-llm.gguf");
    check_threads_and_speed("vocab/ggml-vocab-gpt-2.gguf");
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_vocab_phi_3),
        cmocka_unit_test(test_vocab_gpt_2),
        cmocka_unit_test(test_vocab_starcoder),
        cmocka_unit_test(test_vocab_falcon),
        cmocka_unit_test(test_vocab_mpt),
        cmocka_unit_test(test_vocab_refact),
        cmocka_unit_test(test_vocab_deepseek_llm),
        cmocka_unit_test(test_vocab_deepseek_coder),
        cmocka_unit_test(test_ref_prompts),
        cmocka_unit_test(test_bos_stories),
        cmocka_unit_test(test_special_ids),
        cmocka_unit_test(test_parse_special),
        cmocka_unit_test(test_stream_utf8),
        cmocka_unit_test(test_malformed_input),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_pretok),
        cmocka_unit_test(test_threads_and_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
