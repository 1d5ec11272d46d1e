/* fuzz_jinja.c — libFuzzer target for the Jinja renderer (model/jinja.h).
 *
 * The input is a template. It is parsed and, when it parses, rendered with
 * a conversation of the kind chat templates see (system/user/assistant
 * messages, list contents, a tool call with arguments, a tool result,
 * tools), under small limits so that every input finishes quickly. When
 * the input's first line is a JSON object, its members are variables too
 * (replacing those of the same name) and the template is the rest: the
 * variables are as untrusted as the template. The
 * renderer must never crash, leak, or read out of bounds (ASan, UBSan),
 * and must keep its contract: a failure carries a message, a success a
 * NUL-terminated text and no error. Seeds: fuzz/corpus/jinja; `make fuzz`
 * adds the shared chat templates (fuzz/seeds-jinja). The variables are
 * made once, in LLVMFuzzerInitialize (the harness's main).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/mem.h"
#include "model/jinja.h"

static json_t *fuzz_vars;

static const char VARS[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are <b>helpful</b> & \\\"kind\\\".\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \\u00e9\\u4e16 {{x}}\\n\\t\"},"
    " {\"type\": \"image\"}]},"
    "{\"role\": \"assistant\", \"content\": \"<think>plan</think>ok\", \"reasoning_content\": \"plan\","
    " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\", \"days\": 3, \"units\": [\"c\", \"f\"], \"x\": null}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"name\": \"get_weather\", \"content\": \"{\\\"t\\\": 21.5}\"},"
    "{\"role\": \"user\", \"content\": \"Thanks!\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"a\", \"b\"]},"
    " \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}}],"
    "\"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    "\"n\": 3, \"f\": -2.5, \"big\": 9007199254740993, \"flag\": false}";

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_vars = json_loads(VARS, 0, NULL);
    if (fuzz_vars == NULL) abort();
    return 0;
}

/* The variables for this input: the standard ones, with the members of a
 * JSON object on the input's first line over them (*tmpl then starts
 * after that line). A new reference. */
static json_t *input_vars(const uint8_t **tmpl, size_t *size) {
    const uint8_t *nl = *size > 1 && (*tmpl)[0] == '{' ? memchr(*tmpl, '\n', *size) : NULL;
    json_t *over = nl ? json_loadb((const char *)*tmpl, (size_t)(nl - *tmpl), JSON_ALLOW_NUL, NULL) : NULL;
    if (!json_is_object(over)) {
        json_decref(over);
        return json_incref(fuzz_vars);
    }
    json_t *vars = json_copy(fuzz_vars);
    if (vars == NULL || json_object_update(vars, over) != 0) abort();
    json_decref(over);
    *size -= (size_t)(nl + 1 - *tmpl);
    *tmpl = nl + 1;
    return vars;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *vars = input_vars(&data, &size);
    JinjaLimits lim;
    jinja_limits_default(&lim);
    lim.max_source_bytes = 64u << 10;
    lim.max_output_bytes = 1u << 20;
    lim.max_memory_bytes = 16u << 20;
    lim.max_steps = 300000;
    lim.max_loop_iterations = 20000;
    JinjaTemplate *t = NULL;
    MnErr err = {0};
    int rc = jinja_parse((const char *)data, size, &lim, &t, &err);
    if (rc != MN_OK) {
        if (t != NULL || err.msg[0] == '\0' || err.code != rc) abort();
        json_decref(vars);
        return 0;
    }
    static const JinjaDate date = {2026, 1, 15, 0, 0, 0};
    char *out = NULL;
    size_t len = 0;
    err = (MnErr){0};
    rc = jinja_render(t, vars, &date, &lim, &out, &len, &err);
    if (rc == MN_OK) {
        if (out == NULL || out[len] != '\0' || len > lim.max_output_bytes) abort();
    } else if (out != NULL || err.msg[0] == '\0' || err.code != rc) {
        abort();
    }
    mn_free(out);
    jinja_free(t);
    json_decref(vars);
    return 0;
}
