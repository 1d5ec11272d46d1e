/* test_cli.c — the mnemo command end to end: generate (golden text and
 * --dump-logits against the reference), tokenize / detokenize on models and
 * vocabulary-only files, inspect, gen-model (what it writes loads and runs,
 * in every weight type, and reads back as written), chat (its cache
 * statistics, log file, stops with a hint, line editing, and through a
 * recording proxy what it sends: only the new line after the previous
 * response through the Responses API, a new chain when the server lost the
 * old one), and clear failures for bad files and bad options. Runs
 * $MNEMO_BIN. */
#include "test_util.h"
#include "test_serve_util.h"
#include "test_tty.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/err.h"
#include "base/ttype.h"
#include "base/version.h"
#include "engine/mref.h"
#include "model/model.h"

/* Run a shell command; capture stdout (and stderr when merge) into a malloc'd
 * string; return the exit status. */
static int run(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 1024) buf = realloc(buf, cap *= 2);
    }
    buf[n] = '\0';
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void) {
    const char *b = getenv("MNEMO_BIN");
    return b ? b : "./build/release/mnemo";
}

static void chomp(char *s) {
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '\n') s[--n] = '\0';
}

/* The golden text, with the weights read (the default) and mapped. */
static void test_generate_golden(void **s) {
    char model[512], gold_path[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    test_data_path(gold_path, sizeof gold_path, "golden/stories260K_run_t0_n64_once.txt");
    if (!test_require_file(model)) return;
    char *gold = test_read_file(gold_path, NULL);
    chomp(gold);
    for (int is_mapped = 0; is_mapped <= 1; is_mapped++) {
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once upon a time' -n 60 --temp 0%s 2>/dev/null", bin(),
                 model, is_mapped ? " --mmap" : "");
        char *out;
        assert_int_equal(run(cmd, &out), 0);
        chomp(out);
        assert_string_equal(out, gold);
        free(out);
    }
    free(gold);
}

static void test_dump_logits(void **s) {
    char model[512], ref_path[512], cmd[2048], tmp[] = "/tmp/mnemo-mref-XXXXXX";
    test_data_path(model, sizeof model, "models/tiny-llama-spm-f32.gguf");
    test_data_path(ref_path, sizeof ref_path, "reference/exact/tiny-llama-spm-f32.p1.ref");
    if (!test_require_file(model)) return;
    int fd = mkstemp(tmp);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Hello world, this is a test.' -n 0 --kv-type f32 --dump-logits %s 2>/dev/null >/dev/null",
             bin(), model, tmp);
    assert_int_equal(run(cmd, NULL), 0);
    Mref got, want;
    MnErr err = {0};
    assert_int_equal(mref_read(tmp, &got, &err), MN_OK);
    assert_int_equal(mref_read(ref_path, &want, &err), MN_OK);
    assert_int_equal(got.n_tokens, want.n_tokens);
    assert_memory_equal(got.tokens, want.tokens, sizeof(int32_t) * got.n_tokens);
    double max_err = 0;
    for (int v = 0; v < got.n_vocab; v++) max_err = fmax(max_err, fabs(got.last[v] - want.last[v]));
    for (int i = 0; i < got.n_tokens; i++)
        for (int j = 0; j < 4; j++) /* the top entries agree (no near-ties at the top here) */
            max_err = fmax(max_err, fabs(got.vals[i * 16 + j] - want.vals[i * 16 + j]));
    assert_true(max_err < 2e-3);
    mref_free(&got);
    mref_free(&want);
    unlink(tmp);
}

static void test_tokenize_detokenize(void **s) {
    char model[512], vocab[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    test_data_path(vocab, sizeof vocab, "vocab/ggml-vocab-gpt-2.gguf");
    if (!test_require_file(model) || !test_require_file(vocab)) return;
    char *out;
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s 'Once upon a time'", bin(), model);
    assert_int_equal(run(cmd, &out), 0);
    assert_string_equal(out, "1 403 407 261 378\n");
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --no-bos 'Once upon a time'", bin(), model);
    assert_int_equal(run(cmd, &out), 0);
    assert_string_equal(out, "403 407 261 378\n");
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize -m %s 403 407 261 378", bin(), model);
    assert_int_equal(run(cmd, &out), 0);
    assert_string_equal(out, "Once upon a time\n");
    free(out);
    /* a vocabulary-only file of another tokenizer family */
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s 'Hello world'", bin(), vocab);
    assert_int_equal(run(cmd, &out), 0);
    assert_string_equal(out, "15496 995\n");
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize -m %s 15496 995", bin(), vocab);
    assert_int_equal(run(cmd, &out), 0);
    assert_string_equal(out, "Hello world\n");
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize -m %s 99999999 2>&1", bin(), vocab);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "not a token id"));
    free(out);
}

static void test_inspect_and_errors(void **s) {
    char model[512], bad[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    test_data_path(bad, sizeof bad, "models/bad-stories260K-f32-gguf-v1.gguf");
    if (!test_require_file(model)) return;
    char *out;
    snprintf(cmd, sizeof cmd, "%s inspect %s", bin(), model);
    assert_int_equal(run(cmd, &out), 0);
    assert_non_null(strstr(out, "general.architecture"));
    assert_non_null(strstr(out, "blk.4.ffn_down.weight"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p x -n 1 2>&1", bin(), bad);
    assert_int_equal(run(cmd, &out), 1);
    assert_non_null(strstr(out, "version 1"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m /nonexistent.gguf -p x -n 1 2>&1", bin());
    assert_int_equal(run(cmd, &out), 1);
    assert_non_null(strstr(out, "nonexistent"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --kv-type q4_0 -p x 2>&1", bin(), model);
    assert_int_equal(run(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --bogus 2>&1", bin(), model);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "--bogus"));
    free(out);
    snprintf(cmd, sizeof cmd, "MNEMO_THREADS=abc %s generate -m %s -p x 2>&1", bin(), model);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "MNEMO_THREADS"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s frobnicate 2>&1", bin());
    assert_int_equal(run(cmd, &out), 2);
    free(out);
}

/* How many times needle occurs in hay. */
static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Each error is one line naming the one requirement that failed (a file
 * once; an unknown option with its closest spelling, not the usage). */
static void test_errors_one_line(void **s) {
    char model[512], bad[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    test_data_path(bad, sizeof bad, "models/bad-stories260K-f32-gguf-v1.gguf");
    if (!test_require_file(model)) return;
    static const struct {
        const char *args, *want; /* args: %s is the model */
    } cases[] = {
        {"serve", "mnemo serve: needs a model: -m FILE\n"},
        {"serve -m %s --port 99999", "mnemo serve: --port must be in 0..65535, got 99999\n"},
        {"serve -m %s --kv-type q4_0", "mnemo serve: --kv-type must be f16 or f32, got 'q4_0'\n"},
        {"serve -m %s --prot 5", "mnemo serve: unknown option '--prot'; did you mean --port?\n"},
        {"serve -m %s --pool-md 5", "mnemo serve: unknown option '--pool-md'; did you mean --pool-mb?\n"},
        {"serve -m %s --xyzzy", "mnemo serve: unknown option '--xyzzy' (--help lists the options)\n"},
        {"generate -m %s --threds 2", "mnemo generate: unknown option '--threds'; did you mean --threads?\n"},
        {"generate -m %s -n -1", "mnemo generate: -n must be at least 0, got -1\n"},
        {"gen-model -o /nonexistent-dir/out.gguf", "mnemo gen-model: needs the tokenizer's file: --vocab-from VOCAB.gguf\n"},
        {"gen-model --vocab-from %s --dim 62 -o /nonexistent-dir/out.gguf", "mnemo gen-model: --dim 62 is not divisible by --heads 4\n"},
        {"tokenize -m %s", "mnemo tokenize: needs the TEXT to tokenize as its one argument\n"},
        {"speed -m %s --gen-tokens 0", "mnemo speed: --gen-tokens must be at least 1, got 0\n"},
        {"speed -m %s --depth -1", "mnemo speed: --depth must be at least 0, got -1\n"},
        {"bench --concur 3", "mnemo bench: unknown option '--concur'; did you mean --concurrency?\n"},
        {"serv", "mnemo: unknown command 'serv'; did you mean serve?\n"},
        {"cache purge --all", "mnemo cache purge: needs the disk tier's directory: --disk-tier DIR\n"},
        {"cache purge --disk-tier /nonexistent-dir",
         "mnemo cache purge: needs one of --namespace KEY, --default-namespace, --all\n"},
        /* llama.cpp's spellings parse: -fa with a value or without one */
        {"serve -m %s -fa on -np 2 --port 99999", "mnemo serve: --port must be in 0..65535, got 99999\n"},
        {"serve -m %s -fa --ctx-size 64 --port 99999", "mnemo serve: --port must be in 0..65535, got 99999\n"},
        {"serve -m %s -ngll 2", "mnemo serve: unknown option '-ngll'; did you mean -ngl?\n"},
        {"serve -m %s -n 0", "mnemo serve: -n must be -1 (no limit) or at least 1, got 0\n"},
        {"serve -m %s --redis-tier redis://a:1 --redis-tier redis://b:2",
         "mnemo serve: --redis-tier is given 2 times: several URLs are a cluster's seeds (--redis-cluster)\n"},
        {"serve -m %s --redis-cluster", "mnemo serve: --redis-cluster needs --redis-tier URL (a seed)\n"},
        {"serve -m %s --step-ms -5", "mnemo serve: --step-ms must be 0 or more, got -5\n"},
        {"serve -m %s --port 99999999999",
         "mnemo serve: --port expects an integer from -2147483647 to 2147483647, got '99999999999'\n"},
        {"serve -m %s --port 80x", "mnemo serve: --port expects an integer, got '80x'\n"},
        /* (the port keeps a server from starting were it taken) */
        {"serve -m %s --step-ms 0x10 --port 99999", "mnemo serve: --step-ms expects a decimal number, got '0x10'\n"},
        {"serve -m %s --schedule lifo", "mnemo serve: --schedule must be fcfs, fpf or relaxed-fpf, got 'lifo'\n"},
        {"serve -m %s --restore-plan all", "mnemo serve: --restore-plan must be kv, hidden or auto, got 'all'\n"},
        {"route", "mnemo route: needs at least one --backend URL\n"},
        {"route --backend localhost:8080", "mnemo route: --backend must be http://HOST:PORT, got 'localhost:8080'\n"},
        {"route --backend http://127.0.0.1:1 --policy random",
         "mnemo route: --policy must be hash or round-robin, got 'random'\n"},
        {"route --backend http://127.0.0.1:1 --load-factor 0.5",
         "mnemo route: --load-factor must be 0 (off) or at least 1, got 0.5\n"},
        {"route --backend http://127.0.0.1:1 --probe-min 2 --probe-max 1",
         "mnemo route: timeouts must be > 0 and --probe-max >= --probe-min\n"},
        /* every time flag of route is range-checked: 1e30 s once overflowed a long (ms) */
        {"route --backend http://127.0.0.1:1 --connect-timeout 1e30",
         "mnemo route: --connect-timeout must be more than 0 and at most 86400 (seconds), got 1e+30\n"},
        {"route --backend http://127.0.0.1:1 --upstream-timeout 0",
         "mnemo route: --upstream-timeout must be more than 0 and at most 86400 (seconds), got 0\n"},
        {"route --backend http://127.0.0.1:1 --probe-min 1e30",
         "mnemo route: --probe-min must be more than 0 and at most 86400 (seconds), got 1e+30\n"},
        {"route --backend http://127.0.0.1:1 --probe-max 1e30",
         "mnemo route: --probe-max must be more than 0 and at most 86400 (seconds), got 1e+30\n"},
        {"route --backend http://127.0.0.1:1 --drain-timeout -1",
         "mnemo route: --drain-timeout must be at least 0 and at most 86400 (seconds), got -1\n"},
        {"route --backend http://127.0.0.1:1 --idle-timeout 1e30",
         "mnemo route: --idle-timeout must be in 5..86400 seconds, got 1e+30\n"},
        /* route's range is its own (each client may hold a backend connection too) */
        {"route --backend http://127.0.0.1:1 --max-connections 5000",
         "mnemo route: --max-connections must be in 1..450, got 5000\n"},
        {"route --backend http://127.0.0.1:1 --max-connections -1",
         "mnemo route: --max-connections must be in 1..450, got -1\n"},
        {"route --backend http://127.0.0.1:1 --max-connections 500",
         "mnemo route: --max-connections must be in 1..450, got 500\n"},
        /* 0 once meant the default 4096 MiB; the next check fails fast without this one */
        {"serve -m %s --disk-tier-mb 0 --redis-ttl -1",
         "mnemo serve: --disk-tier-mb must be at least 1 (MiB), got 0\n"},
        {"serve -m %s --disk-tier-mb 2000000000000",
         "mnemo serve: --disk-tier-mb must be at most 1099511627776 (1 EiB), got 2000000000000\n"},
        /* serve's --drain-timeout as route's (a negative one was taken: the drain ended at once) */
        {"serve -m %s --drain-timeout -1 --disk-tier-mb 2000000000000",
         "mnemo serve: --drain-timeout must be at least 0 and at most 86400 (seconds), got -1\n"},
        {"serve -m %s --idle-timeout 1", "mnemo serve: --idle-timeout must be in 5..86400 seconds, got 1\n"},
        {"serve -m %s --max-connections 0", "mnemo serve: --max-connections must be in 1..900, got 0\n"},
        {"serve -m %s --max-per-ip -1", "mnemo serve: --max-per-ip must be 0 (no limit) or more, got -1\n"},
        /* a --max-connections below the default --max-per-ip is taken as it is
         * (it was refused for the flag not given): the next check speaks */
        {"serve -m %s --max-connections 100 --disk-tier-mb 2000000000000",
         "mnemo serve: --disk-tier-mb must be at most 1099511627776 (1 EiB), got 2000000000000\n"},
        {"route --backend localhost:8080 --max-connections 100",
         "mnemo route: --backend must be http://HOST:PORT, got 'localhost:8080'\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, model);
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin(), args);
        char *out;
        int rc = run(cmd, &out);
        if (rc != 2 || strcmp(out, cases[i].want) != 0)
            fail_msg("mnemo %s exited %d and said:\n%s\nwanted 2 and:\n%s", args, rc, out, cases[i].want);
        free(out);
    }
    /* a file that cannot be opened or read is named once */
    const char *files[] = {"/nonexistent.gguf", bad};
    const char *cmds[] = {"generate -m %s -p x", "serve -m %s", "tokenize -m %s x", "inspect %s",
                          "gen-model --vocab-from %s -o /nonexistent-dir/out.gguf"};
    for (size_t f = 0; f < 2; f++)
        for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
            char args[1024];
            snprintf(args, sizeof args, cmds[i], files[f]);
            snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin(), args);
            char *out;
            assert_int_equal(run(cmd, &out), 1);
            if (count_of(out, files[f]) != 1 || count_of(out, "\n") != 1)
                fail_msg("mnemo %s did not name the file once, in one line:\n%s", args, out);
            free(out);
        }
}

/* speed runs on a model of any vocabulary size: its decode feeds ids the
 * vocabulary has (stories260K's 512 once stopped it at id 600). */
static void test_speed_small_vocab(void **s) {
    char model[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    for (int is_mapped = 0; is_mapped <= 1; is_mapped++) {
        snprintf(cmd, sizeof cmd, "%s speed -m %s --prompt-tokens 32 --gen-tokens 64 -t 1 --json%s 2>&1", bin(),
                 model, is_mapped ? " --mmap" : "");
        char *out;
        int rc = run(cmd, &out);
        if (rc != 0 || strstr(out, "\"decode_tps\"") == NULL) fail_msg("%s exited %d:\n%s", cmd, rc, out);
        free(out);
    }
}

/* speed --depth D evaluates D tokens before the timed runs (decode only
 * with -p 0) and says so; a depth past the context is refused. */
static void test_speed_depth(void **s) {
    char model[512], cmd[1024];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    snprintf(cmd, sizeof cmd, "%s speed -m %s --depth 300 -p 0 -n 4 --json 2>&1", bin(), model);
    char *out;
    assert_int_equal(run(cmd, &out), 0);
    if (strstr(out, "\"depth\": 300, \"prompt_tokens\": 0, \"gen_tokens\": 4") == NULL ||
        strstr(out, "\"prefill_tps\": 0.00, \"decode_tps\": ") == NULL)
        fail_msg("speed --depth 300 -p 0 said:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s speed -m %s --depth 500 -p 8 -n 8 2>&1", bin(), model);
    assert_int_equal(run(cmd, &out), 1);
    if (strstr(out, "500 + 8 + 8 tokens exceed the model's context of 512") == NULL)
        fail_msg("speed past the context said:\n%s", out);
    free(out);
}

/* gen-model's help marks what it cannot do without. */
static void test_gen_model_help(void **s) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s gen-model --help", bin());
    char *out;
    assert_int_equal(run(cmd, &out), 0);
    const char *line = strstr(out, "--vocab-from FILE");
    assert_non_null(line);
    const char *eol = strchr(line, '\n');
    const char *req = strstr(line, "(required)");
    assert_true(req != NULL && req < eol);
    free(out);
}

/* generate ends its text with a newline before the statistics line, also
 * when both go to one file. */
static void test_generate_ends_line(void **s) {
    char model[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once upon a time' -n 12 --temp 0 --ignore-eos 2>&1", bin(), model);
    char *out;
    assert_int_equal(run(cmd, &out), 0);
    const char *stats = strstr(out, "mnemo: prompt ");
    assert_non_null(stats);
    if (stats == out || stats[-1] != '\n') fail_msg("the statistics do not start a line:\n%s", out);
    assert_int_equal(strncmp(out, "Once upon a time", 16), 0);
    assert_null(strchr(stats, '\n')[1] == '\0' ? NULL : "text after the statistics line");
    free(out);
}

/* gen-model writes models that load and run, for both architectures. */
static void test_gen_model(void **s) {
    char vocab[512], cmd[4096], tmp[] = "/tmp/mnemo-gen-XXXXXX";
    test_data_path(vocab, sizeof vocab, "vocab/ggml-vocab-llama-spm.gguf");
    if (!test_require_file(vocab)) return;
    assert_non_null(mkdtemp(tmp));
    const char *cases[][2] = {{"llama", "q8_0"}, {"qwen2", "f16"}, {"llama", "q4_0"}, {"llama", "bf16"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/m%zu.gguf", tmp, i);
        snprintf(cmd, sizeof cmd,
                 "%s gen-model --arch %s --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --ctx 256 --type %s "
                 "--seed 3 --vocab-from %s -o %s 2>/dev/null",
                 bin(), cases[i][0], cases[i][1], vocab, path);
        assert_int_equal(run(cmd, NULL), 0);
        Model *m = NULL;
        MnErr err = {0};
        if (model_load(path, &m, &err)) fail_msg("%s", err.msg);
        assert_int_equal(m->cfg.n_embd, 64);
        assert_int_equal(m->cfg.n_head_kv, 2);
        assert_int_equal(m->cfg.n_vocab, 32000);
        assert_int_equal(m->cfg.arch, strcmp(cases[i][0], "qwen2") == 0 ? ARCH_QWEN2 : ARCH_LLAMA);
        model_free(m);
        char *out;
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Hello' -n 8 --temp 0 --ignore-eos 2>/dev/null", bin(), path);
        assert_int_equal(run(cmd, &out), 0);
        assert_true(strncmp(out, "Hello", 5) == 0);
        free(out);
        /* same seed, same file */
        char path2[600];
        snprintf(path2, sizeof path2, "%s/again.gguf", tmp);
        snprintf(cmd, sizeof cmd,
                 "%s gen-model --arch %s --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --ctx 256 --type %s "
                 "--seed 3 --vocab-from %s -o %s 2>/dev/null && cmp -s %s %s",
                 bin(), cases[i][0], cases[i][1], vocab, path2, path, path2);
        assert_int_equal(run(cmd, NULL), 0);
        unlink(path2);
        unlink(path);
    }
    rmdir(tmp);
}

/* Every row of q (type `type`) dequantizes to what quantizing f's row
 * (F32, the same random values) and dequantizing gives, bit for bit. */
static void expect_same_dequant(const MatW *f, const MatW *q, MnType type, const char *what) {
    assert_int_equal(f->type, MN_TYPE_F32);
    assert_int_equal(q->type, type);
    assert_int_equal(f->n_in, q->n_in);
    assert_int_equal(f->n_out, q->n_out);
    uint64_t q_row;
    assert_int_equal(ttype_row_bytes(type, (uint64_t)q->n_in, &q_row), MN_OK);
    size_t n = (size_t)q->n_in;
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    void *blocks = malloc(q_row);
    for (int64_t r = 0; r < q->n_out; r++) {
        ttype_dequantize_row(type, (const uint8_t *)q->data + (uint64_t)r * q_row, got, q->n_in);
        ttype_quantize_row(type, (const float *)f->data + (size_t)r * n, blocks, q->n_in);
        ttype_dequantize_row(type, blocks, want, q->n_in);
        if (memcmp(got, want, n * sizeof(float)) != 0)
            fail_msg("%s %s: row %lld does not read back as written", ttype_traits(type)->name, what, (long long)r);
    }
    free(blocks);
    free(want);
    free(got);
}

/* gen-model --type T for every quantized type: the file loads, its
 * matrices have type T and read back as their values were quantized (the
 * F32 model of the same seed has the values before quantization), and it
 * generates. */
static void test_gen_model_types(void **s) {
    char vocab[512], cmd[4096], tmp[] = "/tmp/mnemo-gentypes-XXXXXX";
    test_data_path(vocab, sizeof vocab, "vocab/ggml-vocab-llama-spm.gguf");
    if (!test_require_file(vocab)) return;
    assert_non_null(mkdtemp(tmp));
    static const MnType types[] = {MN_TYPE_Q8_0, MN_TYPE_Q4_0, MN_TYPE_Q4_1, MN_TYPE_Q5_0, MN_TYPE_Q5_1,
                                   MN_TYPE_Q2_K, MN_TYPE_Q3_K, MN_TYPE_Q4_K, MN_TYPE_Q5_K, MN_TYPE_Q6_K,
                                   MN_TYPE_IQ4_NL, MN_TYPE_IQ4_XS};
    const char *shape = "--arch llama --dim 256 --layers 1 --heads 4 --kv-heads 2 --ffn 512 --ctx 128 --seed 5";
    char fpath[600];
    snprintf(fpath, sizeof fpath, "%s/f32.gguf", tmp);
    snprintf(cmd, sizeof cmd, "%s gen-model %s --type f32 --vocab-from %s -o %s 2>/dev/null", bin(), shape, vocab, fpath);
    assert_int_equal(run(cmd, NULL), 0);
    Model *mf = NULL;
    MnErr err = {0};
    if (model_load(fpath, &mf, &err)) fail_msg("%s", err.msg);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const char *name = ttype_traits(types[i])->name;
        char path[600];
        snprintf(path, sizeof path, "%s/%s.gguf", tmp, name);
        snprintf(cmd, sizeof cmd, "%s gen-model %s --type %s --vocab-from %s -o %s 2>/dev/null", bin(), shape, name,
                 vocab, path);
        assert_int_equal(run(cmd, NULL), 0);
        Model *m = NULL;
        if (model_load(path, &m, &err)) fail_msg("%s", err.msg);
        expect_same_dequant(&mf->tok_embd, &m->tok_embd, types[i], "token_embd");
        expect_same_dequant(&mf->output, &m->output, types[i], "output");
        const LayerWeights *lf = &mf->layers[0], *lq = &m->layers[0];
        expect_same_dequant(&lf->wq, &lq->wq, types[i], "attn_q");
        expect_same_dequant(&lf->wk, &lq->wk, types[i], "attn_k");
        expect_same_dequant(&lf->wv, &lq->wv, types[i], "attn_v");
        expect_same_dequant(&lf->wo, &lq->wo, types[i], "attn_output");
        expect_same_dequant(&lf->w_gate, &lq->w_gate, types[i], "ffn_gate");
        expect_same_dequant(&lf->w_up, &lq->w_up, types[i], "ffn_up");
        expect_same_dequant(&lf->w_down, &lq->w_down, types[i], "ffn_down");
        model_free(m);
        char *out;
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Hello' -n 4 --temp 0 --ignore-eos 2>/dev/null", bin(), path);
        assert_int_equal(run(cmd, &out), 0);
        assert_true(strncmp(out, "Hello", 5) == 0);
        free(out);
        unlink(path);
    }
    /* a K-quant needs whole super-blocks */
    snprintf(cmd, sizeof cmd,
             "%s gen-model --dim 64 --heads 4 --type q4_k --vocab-from %s -o %s/bad.gguf 2>&1", bin(), vocab, tmp);
    char *out;
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "multiples of 256 for q4_k"));
    free(out);
    model_free(mf);
    unlink(fpath);
    rmdir(tmp);
}

static void test_sampling_reproducible(void **s) {
    char model[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    char *a, *b, *c;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once' -n 40 --temp 1 --seed 42 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, &a), 0);
    assert_int_equal(run(cmd, &b), 0);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once' -n 40 --temp 1 --seed 43 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, &c), 0);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
}

/* The commit the Makefile compiles in: git's abbreviated HEAD in a git
 * checkout (the tests run from the checkout's top), else "unknown". */
static void expected_commit(char *buf, size_t cap) {
    char *out = NULL;
    snprintf(buf, cap, "unknown");
    if (access(".git", F_OK) == 0 && run("git rev-parse --short=12 HEAD 2>/dev/null", &out) == 0) {
        chomp(out);
        if (out[0]) snprintf(buf, cap, "%s", out);
    }
    free(out);
}

/* mnemo --version names the version of base/version.h and the commit built. */
static void test_version(void **s) {
    char cmd[1024], commit[64], want[128];
    expected_commit(commit, sizeof commit);
    snprintf(want, sizeof want, "mnemo %s (commit %s)\n", MNEMO_VERSION, commit);
    char *out;
    snprintf(cmd, sizeof cmd, "%s --version", bin());
    assert_int_equal(run(cmd, &out), 0);
    assert_string_equal(out, want);
    free(out);
}

/* mnemo chat in-process: the second turn reports its history as cached. */
static void test_chat(void **s) {
    char model[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    char *out;
    snprintf(cmd, sizeof cmd,
             "printf 'Once upon a time\\nTell me more\\n' | %s chat -m %s -n 8 --temp 0 --ignore-eos 2>&1 >/dev/null",
             bin(), model);
    assert_int_equal(run(cmd, &out), 0);
    char *first = strstr(out, "from cache]");
    assert_non_null(first);
    assert_non_null(strstr(out, ", 0 from cache]"));
    char *second = strstr(first + 1, "from cache]");
    assert_non_null(second);
    /* "prompt N tokens, M from cache]" with M > 0 on the second turn */
    char *m = second;
    while (m > first && m[-1] != ',') m--;
    assert_true(atoi(m + 1) > 0);
    free(out);
}

/* ---- chat: its server's log, stopping with a hint, line editing ------------------ */

/* The text of the last line of the output that contains needle, from
 * needle on (up to the newline), in buf. */
static void from_on(const char *out, const char *needle, int nth, char *buf, size_t cap) {
    const char *p = out;
    for (int i = 0; i < nth && p; i++) p = strstr(i ? p + 1 : p, needle);
    assert_non_null(p);
    snprintf(buf, cap, "%.*s", (int)strcspn(p, "\r\n"), p);
}

/* The in-process server's log lines go to ~/.cache/mnemo/chat.log (or
 * --log FILE), not to the terminal among the replies. */
static void test_chat_log_in_file(void **s) {
    char model[512], cmd[4096], home[] = "/tmp/mnemo-chat-home-XXXXXX", path[1024];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    test_make_dir(home);
    for (int explicit_log = 0; explicit_log < 2; explicit_log++) {
        if (explicit_log) snprintf(path, sizeof path, "%s/other.log", home);
        else snprintf(path, sizeof path, "%s/.cache/mnemo/chat.log", home);
        snprintf(cmd, sizeof cmd,
                 "printf 'Once upon a time\\nTell me more\\n' | HOME=%s %s chat -m %s -n 8 --temp 0 --ignore-eos %s%s 2>&1",
                 home, bin(), model, explicit_log ? "--log " : "", explicit_log ? path : "");
        char *out;
        assert_int_equal(run(cmd, &out), 0);
        assert_int_equal(count_of(out, "from cache]"), 2);
        char *log = test_read_file(path, NULL);
        if (log == NULL) fail_msg("no log at %s; the chat said:\n%s", path, out);
        assert_true(count_of(log, "\n") >= 2); /* at least a line per request */
        for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
            if (strstr(out, line)) fail_msg("the server's line '%s' is on the terminal:\n%s", line, out);
        char want[1200];
        snprintf(want, sizeof want, "the in-process server logs to %s\n", path);
        assert_non_null(strstr(out, want));
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        free(log);
        free(out);
        unlink(path);
    }
    test_rm_home(home);
}

/* Nothing listens at the URL: the chat stops at once and asks whether the
 * server runs (a port bound without listen refuses connections). */
static void test_chat_stops_without_server(void **s) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'hi\\nhi again\\n' | %s chat --url http://127.0.0.1:%d 2>&1", bin(),
             ntohs(a.sin_port));
    char *out;
    assert_int_equal(run(cmd, &out), 1);
    if (count_of(out, "mnemo chat:") != 1 || !strstr(out, "is the server running?")) fail_msg("%s", out);
    free(out);
    close(fd);
}

/* A 401 stops the chat with the --api-key hint; the right key chats. */
static void test_chat_stops_on_401(void **s) {
    Srv srv;
    if (srv_start(&srv, "stories260K", "--api-key sesame") != 0) return;
    static const struct {
        const char *flags, *hint;
        int status;
    } cases[] = {
        {"", "wants an API key (HTTP 401): give it with --api-key KEY", 1},
        {"--api-key wrong", "refused the API key (HTTP 401): check --api-key", 1},
        {"--api-key sesame", "from cache]", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd, "printf 'hi\\nhi again\\n' | %s chat --url http://127.0.0.1:%d -n 4 %s 2>&1",
                 bin(), srv.port, cases[i].flags);
        assert_int_equal(run(cmd, &out), cases[i].status);
        if (!strstr(out, cases[i].hint) || count_of(out, "mnemo chat:") != (cases[i].status ? 1 : 0))
            fail_msg("with '%s':\n%s", cases[i].flags, out);
        free(out);
    }
    srv_stop(&srv);
}

/* `mnemo chat` on a terminal (a pseudo-terminal the test drives). */
typedef struct Tty {
    int master;
    pid_t pid;
    char *text; /* all it printed */
    size_t len;
} Tty;

static void tty_start(Tty *t, char *const argv[]) {
    char slave[128];
    tty_open_pair(&t->master, slave, sizeof slave);
    t->text = calloc(1, 1);
    t->len = 0;
    t->pid = fork();
    if (t->pid == 0) {
        setsid();
        int fd = open(slave, O_RDWR); /* the session's controlling terminal */
        if (fd < 0) _exit(127);
        struct winsize ws = {.ws_row = 24, .ws_col = 200};
        ioctl(fd, TIOCSWINSZ, &ws);
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);
        setenv("TERM", "xterm", 1);
        execv(argv[0], argv);
        _exit(127);
    }
}

/* Read what the program prints until `then` has appeared after the nth
 * `after` (NULL: after the start). False when the output ended first. */
static bool tty_wait(Tty *t, const char *after, int nth, const char *then) {
    for (;;) {
        const char *p = t->text;
        for (int i = 0; after && i < nth && p; i++) p = strstr(i ? p + strlen(after) : p, after);
        if (p && strstr(p, then)) return true;
        char buf[4096];
        ssize_t k = read(t->master, buf, sizeof buf);
        if (k <= 0) return false; /* EIO: the program closed the terminal */
        t->text = realloc(t->text, t->len + (size_t)k + 1);
        memcpy(t->text + t->len, buf, (size_t)k);
        t->len += (size_t)k;
        t->text[t->len] = '\0';
    }
}

/* Type keys once the program edits a line. */
static void tty_send(Tty *t, const char *keys) {
    tty_wait_raw(t->master);
    assert_int_equal(write(t->master, keys, strlen(keys)), (ssize_t)strlen(keys));
}

/* Wait for the end; the exit status. The text keeps what was printed with
 * the terminal's \r removed. */
static int tty_finish(Tty *t) {
    while (tty_wait(t, NULL, 0, "\x01never printed\x01")) {}
    int st;
    waitpid(t->pid, &st, 0);
    close(t->master);
    size_t n = 0;
    for (size_t i = 0; i < t->len; i++)
        if (t->text[i] != '\r') t->text[n++] = t->text[i];
    t->text[n] = '\0';
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* On a terminal the chat edits lines with libedit and keeps a history: a
 * line typed as "upon a time", Ctrl-A, "Once " is sent as "Once upon a
 * time", and Ctrl-P then Enter sends it again. Both turns must equal a
 * piped chat that typed "Once upon a time" twice: the same prompt and cache
 * counts, the same replies. */
static void test_chat_line_editing(void **s) {
    char model[512], cmd[2048];
    test_data_path(model, sizeof model, "models/stories260K.gguf");
    if (!test_require_file(model)) return;
    alarm(300); /* a guard against a hang, not a condition of the test */
    const char *common = "-n 12 --temp 0 --ignore-eos --log /tmp/mnemo-test-chat-tty.log";
    char *piped, *replies, *first_only;
    const char *twice = "printf 'Once upon a time\\nOnce upon a time\\n'";
    snprintf(cmd, sizeof cmd, "%s | %s chat -m %s %s 2>&1", twice, bin(), model, common);
    assert_int_equal(run(cmd, &piped), 0);
    snprintf(cmd, sizeof cmd, "%s | %s chat -m %s %s 2>/dev/null", twice, bin(), model, common);
    assert_int_equal(run(cmd, &replies), 0); /* both replies, each with a newline */
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\n' | %s chat -m %s %s 2>/dev/null", bin(), model, common);
    assert_int_equal(run(cmd, &first_only), 0); /* the first reply and its newline */

    char *argv[] = {(char *)bin(), "chat", "-m", model, "-n", "12", "--temp", "0", "--ignore-eos",
                    "--log", "/tmp/mnemo-test-chat-tty.log", NULL};
    Tty t;
    tty_start(&t, argv);
    assert_true(tty_wait(&t, "to quit)", 1, "> "));
    tty_send(&t, "upon a time\x01Once \r");
    assert_true(tty_wait(&t, "from cache]", 1, "> "));
    tty_send(&t, "\x10\r");
    assert_true(tty_wait(&t, "from cache]", 2, "> "));
    tty_send(&t, "\r");
    assert_int_equal(tty_finish(&t), 0);

    for (int turn = 1; turn <= 2; turn++) {
        char want[256], got[256];
        from_on(piped, "prompt ", turn, want, sizeof want);
        from_on(t.text, "prompt ", turn, got, sizeof got);
        if (strcmp(want, got) != 0) fail_msg("turn %d: '%s' on the terminal, '%s' piped:\n%s", turn, got, want, t.text);
    }
    /* the replies: the first as a chat of one turn printed it, the second
     * what the piped chat printed after it */
    size_t n1 = strlen(first_only), n = strlen(replies);
    assert_true(n1 > 1 && n > n1 + 1 && strncmp(replies, first_only, n1) == 0);
    char *second = strndup(replies + n1, n - n1 - 1);
    first_only[n1 - 1] = '\0';
    if (!strstr(t.text, first_only) || !strstr(t.text, second))
        fail_msg("replies '%s' and '%s' not on the terminal:\n%s", first_only, second, t.text);
    alarm(0);
    free(second);
    free(first_only);
    free(replies);
    free(piped);
    free(t.text);
    unlink("/tmp/mnemo-test-chat-tty.log");
}

/* ---- chat through the Responses API: what it sends, seen by a proxy ---------------- */

#define PROXY_MAX 16

/* A recording proxy between the chat and a real server: every request's
 * path and body are kept, passed on, and the whole answer sent back (a
 * stream arrives at once, which the chat reads the same). Before passing
 * on the POST numbered delete_before (1-based; 0: never) it deletes the
 * response that POST continues, as an expiry or a purge would. */
typedef struct Proxy {
    struct MHD_Daemon *d;
    int port;
    Srv up;                        /* the server behind it */
    pthread_mutex_t mu;            /* guards what follows */
    int n;                         /* requests recorded */
    char *path[PROXY_MAX], *body[PROXY_MAX], *answer[PROXY_MAX];
    long status[PROXY_MAX];
    int n_posts, delete_before;
} Proxy;

typedef struct ProxyConn {
    char *body;
    size_t len;
} ProxyConn;

static void proxy_delete_previous(Proxy *px, const char *body) {
    json_t *j = json_loads(body, 0, NULL);
    const char *id = json_string_value(json_object_get(j, "previous_response_id"));
    char path[256];
    if (id) {
        snprintf(path, sizeof path, "/v1/responses/%s", id);
        srv_http(&px->up, "DELETE", path, NULL, NULL, NULL, NULL, 0);
    }
    json_decref(j);
}

static enum MHD_Result proxy_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                     const char *version, const char *upload, size_t *upload_size, void **state) {
    Proxy *px = cls;
    ProxyConn *pc = *state;
    if (pc == NULL) { /* headers only */
        *state = pc = calloc(1, sizeof *pc);
        pc->body = calloc(1, 1);
        return pc ? MHD_YES : MHD_NO;
    }
    if (*upload_size > 0) {
        pc->body = realloc(pc->body, pc->len + *upload_size + 1);
        memcpy(pc->body + pc->len, upload, *upload_size);
        pc->len += *upload_size;
        pc->body[pc->len] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }
    bool is_post = strcmp(method, "POST") == 0;
    pthread_mutex_lock(&px->mu);
    bool is_delete = is_post && ++px->n_posts == px->delete_before;
    pthread_mutex_unlock(&px->mu);
    if (is_delete) proxy_delete_previous(px, pc->body);
    char *answer = NULL;
    long st = srv_http(&px->up, is_post ? NULL : method, url, is_post ? pc->body : NULL, NULL, &answer, NULL, 0);
    pthread_mutex_lock(&px->mu);
    if (px->n < PROXY_MAX) {
        px->path[px->n] = strdup(url);
        px->body[px->n] = strdup(pc->body);
        px->answer[px->n] = strdup(answer ? answer : "");
        px->status[px->n++] = st;
    }
    pthread_mutex_unlock(&px->mu);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(answer), answer, MHD_RESPMEM_MUST_FREE);
    enum MHD_Result ok = MHD_queue_response(c, st > 0 ? (unsigned)st : 502, r);
    MHD_destroy_response(r);
    free(pc->body);
    free(pc);
    *state = NULL;
    return ok;
}

static void proxy_start(Proxy *px, int upstream_port) {
    memset(px, 0, sizeof *px);
    px->up.port = upstream_port;
    pthread_mutex_init(&px->mu, NULL);
    px->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
                             proxy_handler, px, MHD_OPTION_END);
    assert_non_null(px->d);
    px->port = MHD_get_daemon_info(px->d, MHD_DAEMON_INFO_BIND_PORT)->port;
}

/* Forget what was recorded; the next POST is number 1 again. */
static void proxy_reset(Proxy *px, int delete_before) {
    pthread_mutex_lock(&px->mu);
    for (int i = 0; i < px->n; i++) {
        free(px->path[i]);
        free(px->body[i]);
        free(px->answer[i]);
    }
    px->n = px->n_posts = 0;
    px->delete_before = delete_before;
    pthread_mutex_unlock(&px->mu);
}

static void proxy_stop(Proxy *px) {
    MHD_stop_daemon(px->d);
    proxy_reset(px, 0);
    pthread_mutex_destroy(&px->mu);
}

/* Request i's body as JSON (the test fails unless it parses). */
static json_t *proxy_json(const Proxy *px, int i) {
    json_t *j = json_loads(px->body[i], 0, NULL);
    if (j == NULL) fail_msg("request %d is not JSON: %s", i, px->body[i]);
    return j;
}

/* The id of the response answer i streamed (its response.created event). */
static void proxy_answer_id(const Proxy *px, int i, char *id, size_t cap) {
    static const char key[] = "\"id\":\"";
    const char *p = strstr(px->answer[i], key);
    if (p == NULL || strncmp(p + sizeof key - 1, "resp_", 5) != 0)
        fail_msg("answer %d has no response id: %.300s", i, px->answer[i]);
    p += sizeof key - 1;
    size_t n = strcspn(p, "\"");
    snprintf(id, cap, "%.*s", (int)n, p);
}

static const char *jstring(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

/* `mnemo chat --api API` through the proxy with three lines; its replies
 * (stdout) and its terminal (stderr) in malloc'd strings. */
static int chat_via(const Proxy *px, const char *api, char **replies, char **term) {
    char cmd[1024], err_path[] = "/tmp/mnemo-test-chat-err-XXXXXX";
    close(mkstemp(err_path));
    snprintf(cmd, sizeof cmd,
             "printf 'Once upon a time\\nTell me more\\nAnd then\\n' | %s chat --url http://127.0.0.1:%d --api %s "
             "-n 8 --temp 0 --ignore-eos --system 'Tell a story.' 2>%s",
             bin(), px->port, api, err_path);
    int st = run(cmd, replies);
    *term = test_read_file(err_path, NULL);
    unlink(err_path);
    assert_non_null(*term);
    return st;
}

/* Through the Responses API (the default) the chat sends turn 1 with the
 * system prompt as instructions and each later turn as its new line only,
 * with the previous answer's response id; the replies equal those of
 * `--api chat`, which resends the whole history. When the server no longer
 * holds the chain (the proxy deletes it before turn 2) the chat says so in
 * one line, sends the history again as a new chain, and goes on with the
 * same replies. */
typedef struct ProxyFix {
    Srv srv;
    Proxy px;
} ProxyFix;

static int proxy_fix_teardown(void **state) { /* also after a failed assertion */
    ProxyFix *f = *state;
    if (f && f->px.d) proxy_stop(&f->px);
    if (f && f->srv.pid > 0) srv_stop(&f->srv);
    free(f);
    return 0;
}

static void test_chat_responses_sends_new_message(void **state) {
    ProxyFix *f = calloc(1, sizeof *f);
    *state = f;
    if (srv_start(&f->srv, "stories260K", "") != 0) return;
    Proxy *px = &f->px;
    proxy_start(px, f->srv.port);
    char *chat_replies, *chat_term, *replies, *term, id[128];
    assert_int_equal(chat_via(px, "chat", &chat_replies, &chat_term), 0);
    assert_int_equal(px->n, 3);
    for (int i = 0; i < 3; i++) { /* chat completions: the history, growing */
        assert_string_equal(px->path[i], "/v1/chat/completions");
        json_t *j = proxy_json(px, i);
        assert_int_equal(json_array_size(json_object_get(j, "messages")), 2 + 2 * (size_t)i);
        json_decref(j);
    }

    proxy_reset(px, 0);
    assert_int_equal(chat_via(px, "responses", &replies, &term), 0);
    assert_string_equal(replies, chat_replies);
    assert_int_equal(px->n, 3);
    static const char *const lines[] = {"Once upon a time", "Tell me more", "And then"};
    for (int i = 0; i < 3; i++) {
        assert_string_equal(px->path[i], "/v1/responses");
        assert_int_equal(px->status[i], 200);
        json_t *j = proxy_json(px, i);
        assert_string_equal(jstring(j, "input"), lines[i]); /* the new line alone */
        assert_string_equal(jstring(j, "instructions"), "Tell a story.");
        if (i == 0) {
            assert_null(json_object_get(j, "previous_response_id"));
        } else {
            proxy_answer_id(px, i - 1, id, sizeof id);
            assert_string_equal(jstring(j, "previous_response_id"), id);
            assert_null(strstr(px->body[i], lines[0])); /* no history */
        }
        json_decref(j);
    }
    if (count_of(term, "mnemo chat:") != 0) fail_msg("%s", term);
    free(replies);
    free(term);

    proxy_reset(px, 2); /* turn 2 continues a deleted response */
    assert_int_equal(chat_via(px, "responses", &replies, &term), 0);
    assert_string_equal(replies, chat_replies);
    if (count_of(term, "mnemo chat:") != 1 || !strstr(term, "no longer holds this conversation")) fail_msg("%s", term);
    assert_int_equal(px->n, 4);
    assert_int_equal(px->status[1], 400);
    assert_non_null(strstr(px->answer[1], "previous_response_not_found"));
    json_t *j = proxy_json(px, 2); /* the retry: the history as a new chain */
    assert_null(json_object_get(j, "previous_response_id"));
    json_t *input = json_object_get(j, "input");
    assert_int_equal(json_array_size(input), 3);
    assert_string_equal(jstring(json_array_get(input, 0), "content"), lines[0]);
    assert_string_equal(jstring(json_array_get(input, 1), "role"), "assistant");
    assert_string_equal(jstring(json_array_get(input, 2), "content"), lines[1]);
    json_decref(j);
    j = proxy_json(px, 3); /* turn 3 continues the new chain */
    proxy_answer_id(px, 2, id, sizeof id);
    assert_string_equal(jstring(j, "previous_response_id"), id);
    assert_string_equal(jstring(j, "input"), lines[2]);
    json_decref(j);
    free(replies);
    free(term);
    free(chat_replies);
    free(chat_term);
}

int main(void) {
    test_apply_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_golden),
        cmocka_unit_test(test_dump_logits),
        cmocka_unit_test(test_tokenize_detokenize),
        cmocka_unit_test(test_inspect_and_errors),
        cmocka_unit_test(test_gen_model),
        cmocka_unit_test(test_gen_model_types),
        cmocka_unit_test(test_sampling_reproducible),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_errors_one_line),
        cmocka_unit_test(test_speed_depth),
        cmocka_unit_test(test_gen_model_help),
        cmocka_unit_test(test_generate_ends_line),
        cmocka_unit_test(test_speed_small_vocab),
        cmocka_unit_test(test_chat_log_in_file),
        cmocka_unit_test(test_chat_stops_without_server),
        cmocka_unit_test(test_chat_stops_on_401),
        cmocka_unit_test(test_chat_line_editing),
        cmocka_unit_test_teardown(test_chat_responses_sends_new_message, proxy_fix_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
