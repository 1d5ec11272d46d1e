/* bench.c — the `mnemo bench` command (see bench.h).
 *
 * Parses the flags (base/cli, so MNEMO_* environment variables work), asks
 * the server what it can tell before the run — the model name from
 * /v1/models when --model is not given, and tokens per word of the
 * synthetic text from /tokenize (llama.cpp's and vLLM's request shapes in
 * one body) — then plans, runs and reports. A server that answers none of
 * this is still measured: sizes fall back to an estimate, and a server that
 * does not answer at all gives a report of failed requests.
 */
#include "bench/bench.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/cli.h"
#include "base/mem.h"
#include "bench/client.h"
#include "bench/loadgen.h"
#include "bench/report.h"
#include "bench/workload.h"

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- questions to the server ----------------------------------------------------- */

typedef struct Probe {
    ChatClient *client;
    const char *model;
} Probe;

static int count_tokens(void *ctx, const char *text, long *n_tokens) {
    Probe *p = ctx;
    json_t *req = json_pack("{s:s,s:b,s:s,s:b,s:s}", "content", text, "add_special", 0, "prompt", text,
                            "add_special_tokens", 0, "model", p->model);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (body == NULL) return MN_ENOMEM;
    char *resp = NULL;
    int status = 0, rc = client_post(p->client, "/tokenize", body, &resp, &status);
    mn_free(body); /* json_dumps: the jansson allocator is mn_malloc (main) or malloc */
    json_t *j = rc == MN_OK && status == 200 && resp ? json_loads(resp, 0, NULL) : NULL;
    mn_free(resp);
    json_t *tokens = json_object_get(j, "tokens"), *count = json_object_get(j, "count");
    rc = MN_EUNSUPPORTED;
    if (json_is_array(tokens)) {
        *n_tokens = (long)json_array_size(tokens);
        rc = MN_OK;
    } else if (json_is_integer(count)) {
        *n_tokens = (long)json_integer_value(count);
        rc = MN_OK;
    }
    json_decref(j);
    return rc;
}

/* The first model of /v1/models into buf; false when there is none. */
static bool detect_model(ChatClient *c, char *buf, size_t cap) {
    char *resp = NULL;
    int status = 0;
    bool ok = false;
    if (client_get(c, "/v1/models", &resp, &status) == MN_OK && status == 200) {
        json_t *j = json_loads(resp, 0, NULL);
        const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (id && strlen(id) < cap) {
            snprintf(buf, cap, "%s", id);
            ok = true;
        }
        json_decref(j);
    }
    mn_free(resp);
    return ok;
}

/* ---- --dry-run --------------------------------------------------------------------- */

static void print_plan(FILE *f, const BenchPlan *p) {
    long user = 0, out = 0;
    double last = 0;
    int max_turns = 0;
    for (int i = 0; i < p->n_convs; i++) {
        const BenchConv *c = &p->convs[i];
        for (int t = 0; t < c->n_turns; t++) {
            user += c->turns[t].user_tokens;
            out += c->turns[t].output_tokens;
        }
        if (c->n_turns > max_turns) max_turns = c->n_turns;
        if (c->start_s > last) last = c->start_s;
    }
    double n = p->n_requests > 0 ? (double)p->n_requests : 1;
    fprintf(f, "plan: %d conversations, %ld requests (%.2f turns on average, at most %d)\n", p->n_convs,
            p->n_requests, p->n_convs ? (double)p->n_requests / p->n_convs : 0.0, max_turns);
    fprintf(f, "      user turns %.1f tokens, outputs %.1f tokens on average; last arrival at %.2f s\n",
            (double)user / n, (double)out / n, last);
    fprintf(f, "      text sized at %.3f tokens per word (%s)\n", p->tokens_per_word,
            p->is_measured ? "server tokenizer" : "estimate");
}

/* ---- the command --------------------------------------------------------------------- */

int bench_main(int argc, char **argv) {
    BenchConfig cfg;
    bench_config_init(&cfg);
    const char *url = "http://127.0.0.1:8080", *model = NULL, *api_key = NULL, *workload = "sharegpt-synth";
    const char *out_dir = NULL, *api_name = "chat";
    float temperature = 0, timeout_s = 300;
    bool quiet = false, dry_run = false;
    CliOpt opts[] = {
        {"url", 0, CLI_STR, &url, "URL", "server base URL (default http://127.0.0.1:8080)"},
        {"model", 'm', CLI_STR, &model, "NAME", "model name sent (default: the first of /v1/models)"},
        {"api-key", 0, CLI_STR, &api_key, "KEY", "sent as Authorization: Bearer KEY"},
        {"workload", 'w', CLI_STR, &workload, "NAME", "sharegpt-synth (default), multiround-qa or multiturn"},
        {"api", 0, CLI_STR, &api_name, "API",
         "chat (default: each turn resends the history) or responses (only the new message, previous_response_id)"},
        {"sharegpt", 0, CLI_STR, &cfg.sharegpt_path, "FILE", "replay the user turns of a ShareGPT JSON file"},
        {"conversations", 0, CLI_INT, &cfg.n_conversations, "N", "conversations (users, clients)"},
        {"turns", 0, CLI_INT, &cfg.n_turns, "R", "turns per conversation (sharegpt: a cap, 0 = none)"},
        {"system-tokens", 0, CLI_FLOAT, &cfg.system_tokens, "S", "shared system prompt size"},
        {"history-tokens", 0, CLI_FLOAT, &cfg.history_tokens, "H", "per-conversation context before turn 1"},
        {"question-tokens", 0, CLI_FLOAT, &cfg.question_tokens, "L", "user turn size (sharegpt-synth: mean)"},
        {"output-tokens", 0, CLI_FLOAT, &cfg.output_tokens, "O", "reply size, max_tokens with ignore_eos"},
        {"rate", 0, CLI_FLOAT, &cfg.rate, "R", "conversations started per second, Poisson; 0: all at once"},
        {"think-mean", 0, CLI_FLOAT, &cfg.think_mean_s, "S", "mean think time between turns, exponential"},
        {"concurrency", 0, CLI_INT, &cfg.concurrency, "N", "requests in flight at most (default 64)"},
        {"seed", 0, CLI_U64, &cfg.seed, "N", "seed of conversations and schedule (default 1)"},
        {"duration", 0, CLI_FLOAT, &cfg.duration_s, "S", "start no conversation after S seconds (0: no limit)"},
        {"scale", 0, CLI_FLOAT, &cfg.scale, "F", "multiply the workload's default sizes (slow machines)"},
        {"max-context", 0, CLI_INT, &cfg.max_context, "N", "end conversations before their prompt passes N tokens"},
        {"past-context", 0, CLI_INT, &cfg.past_context, "N",
         "with --max-context: end them N turns after that instead (turns past the server's context)"},
        {"temperature", 0, CLI_FLOAT, &temperature, "T", "sampling temperature (default 0, greedy; < 0: not sent)"},
        {"timeout", 0, CLI_FLOAT, &timeout_s, "S", "fail a request after S seconds without data (default 300)"},
        {"out", 'o', CLI_STR, &out_dir, "DIR", "write requests.csv, summary.json and report.svg there"},
        {"quiet", 'q', CLI_FLAG, &quiet, NULL, "no progress line"},
        {"dry-run", 0, CLI_FLAG, &dry_run, NULL, "print the plan and exit without sending requests"},
    };
    const char *synopsis =
        "mnemo bench [--url URL] [--workload sharegpt-synth|multiround-qa|multiturn] [--api chat|responses] [options]";
    ClientApi api = CLIENT_API_CHAT;
    const char *pos[1];
    int n_pos;
    MnErr err = {0};
    int rc = cli_parse(argc, argv, opts, N_OPTS(opts), pos, 0, &n_pos, &err);
    if (rc == MN_ECANCELED) {
        cli_usage(stdout, synopsis, opts, N_OPTS(opts));
        return 0;
    }
    if (rc == MN_OK && bench_workload_parse(workload, &cfg.workload) != MN_OK)
        rc = mn_err_set(&err, MN_EINVAL, "unknown workload '%s' (sharegpt-synth, multiround-qa, multiturn)", workload);
    if (rc == MN_OK && client_api_parse(api_name, &api) != MN_OK)
        rc = mn_err_set(&err, MN_EINVAL, "unknown --api '%s' (chat, responses)", api_name);
    if (rc == MN_OK && strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        rc = mn_err_set(&err, MN_EINVAL, "--url must start with http:// or https://, got '%s'", url);
    if (rc == MN_OK && !(timeout_s >= 0)) rc = mn_err_set(&err, MN_EINVAL, "--timeout must be >= 0");
    if (rc == MN_OK) rc = bench_config_resolve(&cfg, &err);
    if (rc) {
        cli_error(stderr, synopsis, err.msg);
        cli_free(opts, N_OPTS(opts));
        return 2;
    }

    int status = 1;
    ChatClient *probe_client = NULL;
    BenchPlan *plan = NULL;
    BenchResults *res = NULL;
    char model_buf[256];
    if (client_new(url, api_key, &probe_client) != MN_OK) goto done;
    client_set_timeouts(probe_client, 10, 30);
    if (model == NULL) {
        model = detect_model(probe_client, model_buf, sizeof model_buf) ? model_buf : "default";
        if (model != model_buf && !quiet)
            fprintf(stderr, "bench: %s/v1/models did not name a model; sending \"default\" (see --model)\n", url);
    }
    Probe probe = {probe_client, model};
    if (bench_plan_new(&cfg, count_tokens, &probe, &plan, &err) != MN_OK) {
        fprintf(stderr, "mnemo bench: %s\n", err.msg);
        goto done;
    }
    char wl[300];
    if (cfg.sharegpt_path) snprintf(wl, sizeof wl, "%s (%s)", bench_workload_name(cfg.workload), cfg.sharegpt_path);
    else snprintf(wl, sizeof wl, "%s", bench_workload_name(cfg.workload));
    if (dry_run) {
        printf("mnemo bench: %s, seed %llu, against %s (model %s)\n", wl, (unsigned long long)cfg.seed, url, model);
        print_plan(stdout, plan);
        status = 0;
        goto done;
    }
    if (!quiet) {
        fprintf(stderr, "bench: %s, %d conversations, %ld requests, against %s (model %s, api %s)\n", wl,
                plan->n_convs, plan->n_requests, url, model, client_api_name(api));
        fprintf(stderr, "bench: text sized at %.3f tokens per word (%s)\n", plan->tokens_per_word,
                plan->is_measured ? "server tokenizer" : "estimate: the server has no /tokenize");
    }
    BenchRunOpts ro = {
        .url = url,
        .api_key = api_key,
        .model = model,
        .api = api,
        .temperature = temperature,
        .concurrency = cfg.concurrency,
        .duration_s = cfg.duration_s,
        .connect_timeout_s = timeout_s > 0 && timeout_s < 30 ? timeout_s : 30,
        .idle_timeout_s = timeout_s,
        .show_progress = !quiet,
        .handle_signals = true,
    };
    if (bench_run(plan, &ro, &res, &err) != MN_OK) {
        fprintf(stderr, "mnemo bench: %s\n", err.msg);
        goto done;
    }
    BenchSummary sum;
    if (bench_summarize(res, &sum) != MN_OK) {
        fprintf(stderr, "mnemo bench: out of memory\n");
        goto done;
    }
    BenchInfo info = {wl, url, model, (unsigned long long)cfg.seed, plan->n_convs, plan->tokens_per_word,
                      plan->is_measured, client_api_name(api)};
    bench_print_summary(stdout, &sum, res, &info);
    fflush(stdout);
    status = sum.requests > sum.failures || plan->n_requests == 0 ? 0 : 1;
    if (out_dir) {
        if (bench_write_report(out_dir, &sum, res, &info, &err) != MN_OK) {
            fprintf(stderr, "mnemo bench: %s\n", err.msg);
            status = 1;
        } else if (!quiet) {
            fprintf(stderr, "bench: wrote %s/requests.csv, summary.json, report.svg\n", out_dir);
        }
    }
done:
    bench_results_free(res);
    bench_plan_free(plan);
    client_free(probe_client);
    cli_free(opts, N_OPTS(opts));
    return status;
}
