/* chat_template.c — see chat_template.h.
 *
 * The OpenAI-compatible server receives a conversation as (role, content)
 * messages; the model was trained on one particular text layout of such
 * conversations, described by the Jinja program in its GGUF
 * (tokenizer.chat_template). Rather than run Jinja, this module does what
 * llama.cpp's built-in formatter does: chat_template_detect looks for
 * substrings that identify a family (the rules and their order are in
 * DETECT_RULES and detect_markers below; the facts come from llama.cpp's
 * src/llama-chat.cpp), and chat_template_apply writes that family's layout.
 *
 * Most families are a fixed prefix and suffix around each message, chosen
 * by role, plus an optional preamble and generation prompt: those are data
 * (a TurnFormat) rendered by one function, render_turns. The families whose
 * layout depends on history — the [INST] families, which open and close
 * turns across messages, and those that merge a system prompt into the next
 * user turn or treat the first message specially — have their own renderer.
 * Where a family's expected text in ../shared/data/chat-templates.json and
 * the newest llama.cpp differ (chatglm4's generation prompt: "<|assistant|>"
 * here), the data set wins.
 *
 * Everything here is pure: no globals but const tables, no locks, safe from
 * any thread. The output is built in a StrBuf whose allocation failure is
 * sticky (later appends are no-ops), so renderers append freely and the one
 * check happens in chat_template_apply. Invariants of a StrBuf: is_oom, or
 * data != NULL with len < cap and data[len] == '\0' after every append.
 * Roles are validated for the whole conversation before anything is
 * rendered, so a renderer only ever sees roles its family can express.
 */
#include "model/chat_template.h"

#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "base/mem.h"

/* ------------------------------------------------------------------ types */

typedef enum ChatRole { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL, ROLE__COUNT } ChatRole;

static const char *const ROLE_NAMES[ROLE__COUNT] = {"system", "user", "assistant", "tool"};

#define ROLE_BIT(r) (1u << (r))
#define ROLES_SUA (ROLE_BIT(ROLE_SYSTEM) | ROLE_BIT(ROLE_USER) | ROLE_BIT(ROLE_ASSISTANT))

/* A growable NUL-terminated string; see the invariants above. */
typedef struct StrBuf {
    char *data;
    size_t len; /* bytes written, excluding the NUL */
    size_t cap; /* bytes allocated */
    bool is_oom;
} StrBuf;

/* How one role's message is wrapped: prefix, content, suffix, then the EOS
 * text when is_eos_after. prefix NULL: the family cannot express the role. */
typedef struct RoleFmt {
    const char *prefix;
    const char *suffix;
    bool is_eos_after;
} RoleFmt;

/* A family that is only "wrap each message by its role". */
typedef struct TurnFormat {
    const char *preamble;      /* written once, before the first message */
    RoleFmt role[ROLE__COUNT];
    bool is_trim;              /* contents lose leading/trailing ASCII space */
    const char *gen_prompt;    /* opens the assistant's turn */
} TurnFormat;

/* Everything a renderer needs; bos/eos are already resolved (never NULL). */
typedef struct Render {
    StrBuf *sb;
    ChatTemplate t;
    const ChatMsg *msgs;
    const TurnFormat *turns; /* render_turns only */
    size_t n_msgs;
    bool is_gen_prompt;
    const char *bos;
    const char *eos;
} Render;

typedef void (*RenderFn)(const Render *r);

typedef struct FamilyDef {
    const char *name;
    RenderFn render_fn;
    const TurnFormat *turns;  /* render_turns' format; NULL for own renderers */
    unsigned role_mask;       /* own renderers: ROLE_BITs accepted */
    bool is_system_first_only; /* a system message is accepted only at index 0 */
    const char *default_eos;  /* NULL: "</s>" */
} FamilyDef;

/* ------------------------------------------------------ string buffer */

static void sb_init(StrBuf *sb) {
    sb->data = NULL;
    sb->len = 0;
    sb->cap = 0;
    sb->is_oom = false;
}

/* Make room for extra more bytes plus the NUL. */
static void sb_reserve(StrBuf *sb, size_t extra) {
    if (sb->is_oom) return;
    if (extra > SIZE_MAX - 1 - sb->len) { /* overflow: cannot be represented */
        sb->is_oom = true;
        return;
    }
    size_t need = sb->len + extra + 1;
    if (need <= sb->cap) return;
    size_t new_cap = sb->cap < 64 ? 64 : sb->cap;
    while (new_cap < need) new_cap = new_cap > SIZE_MAX / 2 ? need : new_cap * 2;
    char *p = mn_realloc(sb->data, new_cap);
    if (p == NULL) {
        sb->is_oom = true;
        return;
    }
    sb->data = p;
    sb->cap = new_cap;
}

static void sb_putn(StrBuf *sb, const char *s, size_t n) {
    sb_reserve(sb, n);
    if (sb->is_oom) return;
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

static void sb_put(StrBuf *sb, const char *s) { sb_putn(sb, s, strlen(s)); }

/* ------------------------------------------------------------ helpers */

static bool is_ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Narrow [*s, *s + *n) to exclude leading and trailing ASCII whitespace:
 * the set of isspace in the "C" locale, which is what llama.cpp trims.
 * Non-ASCII spaces (U+00A0, ...) count as content. */
static void span_trim(const char **s, size_t *n) {
    const char *p = *s;
    size_t len = *n;
    while (len > 0 && is_ascii_space(p[0])) p++, len--;
    while (len > 0 && is_ascii_space(p[len - 1])) len--;
    *s = p;
    *n = len;
}

static void put_content(StrBuf *sb, const char *content, bool is_trim) {
    size_t n = strlen(content);
    if (is_trim) span_trim(&content, &n);
    sb_putn(sb, content, n);
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int role_parse(const char *name, ChatRole *out) {
    for (int r = 0; r < ROLE__COUNT; r++) {
        if (strcmp(name, ROLE_NAMES[r]) == 0) {
            *out = (ChatRole)r;
            return MN_OK;
        }
    }
    return MN_EINVAL;
}

/* The role of message i; chat_template_apply has validated every role. */
static ChatRole msg_role(const Render *r, size_t i) {
    ChatRole role = ROLE_USER;
    int rc = role_parse(r->msgs[i].role, &role);
    assert(rc == MN_OK);
    (void)rc;
    return role;
}

/* -------------------------------------------- table-driven families */

/* The simple families as data: prefix / suffix per role. */
#define RF(p, s) {(p), (s), false}
#define RF_EOS(p, s) {(p), (s), true}
#define NO_ROLE {NULL, NULL, false}

static const TurnFormat TURNS_CHATML = {
    "", {RF("<|im_start|>system\n", "<|im_end|>\n"), RF("<|im_start|>user\n", "<|im_end|>\n"),
         RF("<|im_start|>assistant\n", "<|im_end|>\n"), RF("<|im_start|>tool\n", "<|im_end|>\n")},
    false, "<|im_start|>assistant\n"};

static const TurnFormat TURNS_MISTRAL_V7 = {
    "", {RF("[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]"), RF("[INST] ", "[/INST]"), RF_EOS(" ", ""), NO_ROLE},
    false, ""};

static const TurnFormat TURNS_MISTRAL_V7_TEKKEN = {
    "", {RF("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"), RF("[INST]", "[/INST]"), RF_EOS("", ""), NO_ROLE},
    false, ""};

static const TurnFormat TURNS_PHI3 = {
    "", {RF("<|system|>\n", "<|end|>\n"), RF("<|user|>\n", "<|end|>\n"),
         RF("<|assistant|>\n", "<|end|>\n"), RF("<|tool|>\n", "<|end|>\n")},
    false, "<|assistant|>\n"};

static const TurnFormat TURNS_PHI4 = {
    "", {RF("<|im_start|>system<|im_sep|>", "<|im_end|>"), RF("<|im_start|>user<|im_sep|>", "<|im_end|>"),
         RF("<|im_start|>assistant<|im_sep|>", "<|im_end|>"), RF("<|im_start|>tool<|im_sep|>", "<|im_end|>")},
    false, "<|im_start|>assistant<|im_sep|>"};

static const TurnFormat TURNS_FALCON3 = {
    "", {RF("<|system|>\n", "\n"), RF("<|user|>\n", "\n"), RF("<|assistant|>\n", "\n"), RF("<|tool|>\n", "\n")},
    false, "<|assistant|>\n"};

static const TurnFormat TURNS_ZEPHYR = {
    "", {RF("<|system|>\n", "<|endoftext|>\n"), RF("<|user|>\n", "<|endoftext|>\n"),
         RF("<|assistant|>\n", "<|endoftext|>\n"), RF("<|tool|>\n", "<|endoftext|>\n")},
    false, "<|assistant|>\n"};

static const TurnFormat TURNS_OPENCHAT = {
    "", {RF("", "<|end_of_turn|>"), RF("GPT4 Correct User: ", "<|end_of_turn|>"),
         RF("GPT4 Correct Assistant: ", "<|end_of_turn|>"), NO_ROLE},
    false, "GPT4 Correct Assistant:"};

static const TurnFormat TURNS_VICUNA = {
    "", {RF("", "\n\n"), RF("USER: ", "\n"), RF("ASSISTANT: ", "</s>\n"), NO_ROLE}, false, "ASSISTANT:"};

static const TurnFormat TURNS_VICUNA_ORCA = {
    "", {RF("SYSTEM: ", "\n"), RF("USER: ", "\n"), RF("ASSISTANT: ", "</s>\n"), NO_ROLE}, false, "ASSISTANT:"};

static const TurnFormat TURNS_DEEPSEEK = {
    "", {RF("", ""), RF("### Instruction:\n", "\n"), RF("### Response:\n", "\n<|EOT|>\n"), NO_ROLE},
    false, "### Response:\n"};

static const TurnFormat TURNS_DEEPSEEK2 = {
    "", {RF("", "\n\n"), RF("User: ", "\n\n"), RF_EOS("Assistant: ", ""), NO_ROLE}, false, "Assistant:"};

static const TurnFormat TURNS_DEEPSEEK3 = {
    "", {RF("", "\n\n"), RF("<｜User｜>", ""), RF("<｜Assistant｜>", "<｜end▁of▁sentence｜>"), NO_ROLE},
    false, "<｜Assistant｜>"};

static const TurnFormat TURNS_COMMAND_R = {
    "", {RF("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
         RF("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
         RF("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"), NO_ROLE},
    true, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"};

static const TurnFormat TURNS_LLAMA3 = {
    "", {RF("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>"),
         RF("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
         RF("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
         RF("<|start_header_id|>tool<|end_header_id|>\n\n", "<|eot_id|>")},
    true, "<|start_header_id|>assistant<|end_header_id|>\n\n"};

static const TurnFormat TURNS_CHATGLM3 = {
    "[gMASK]sop", {RF("<|system|>\n ", ""), RF("<|user|>\n ", ""), RF("<|assistant|>\n ", ""), RF("<|tool|>\n ", "")},
    false, "<|assistant|>"};

static const TurnFormat TURNS_CHATGLM4 = {
    "[gMASK]<sop>", {RF("<|system|>\n", ""), RF("<|user|>\n", ""), RF("<|assistant|>\n", ""), RF("<|tool|>\n", "")},
    false, "<|assistant|>"};

static const TurnFormat TURNS_GLMEDGE = {
    "", {RF("<|system|>\n", ""), RF("<|user|>\n", ""), RF("<|assistant|>\n", ""), RF("<|tool|>\n", "")},
    false, "<|assistant|>"};

static const TurnFormat TURNS_MINICPM = {
    "", {RF("", ""), RF("<用户>", "<AI>"), RF("", ""), NO_ROLE}, true, ""};

static const TurnFormat TURNS_EXAONE3 = {
    "", {RF("[|system|]", "[|endofturn|]\n"), RF("[|user|]", "\n"), RF("[|assistant|]", "[|endofturn|]\n"), NO_ROLE},
    true, "[|assistant|]"};

static const TurnFormat TURNS_EXAONE4 = {
    "", {RF("[|system|]", "[|endofturn|]\n"), RF("[|user|]", "\n"), RF("[|assistant|]", "[|endofturn|]\n"),
         RF("[|tool|]", "[|endofturn|]\n")},
    true, "[|assistant|]"};

/* llama.cpp writes "Assistant:" after a final user message whatever
 * add_generation_prompt says; here the flag decides, as for every family. */
static const TurnFormat TURNS_RWKV_WORLD = {
    "", {RF("System: ", "\n\n"), RF("User: ", "\n\n"), RF("Assistant: ", "\n\n"), NO_ROLE}, true, "Assistant:"};

static const TurnFormat TURNS_GRANITE = {
    "", {RF("<|start_of_role|>system<|end_of_role|>", "<|end_of_text|>\n"),
         RF("<|start_of_role|>user<|end_of_role|>", "<|end_of_text|>\n"),
         RF("<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>\n"),
         RF("<|start_of_role|>tool<|end_of_role|>", "<|end_of_text|>\n")},
    false, "<|start_of_role|>assistant<|end_of_role|>\n"};

static const TurnFormat TURNS_MEGREZ = {
    "", {RF("<|role_start|>system<|role_end|>", "<|turn_end|>"), RF("<|role_start|>user<|role_end|>", "<|turn_end|>"),
         RF("<|role_start|>assistant<|role_end|>", "<|turn_end|>"), RF("<|role_start|>tool<|role_end|>", "<|turn_end|>")},
    false, "<|role_start|>assistant<|role_end|>"};

static const TurnFormat TURNS_BAILING = {
    "", {RF("<role>SYSTEM</role>", ""), RF("<role>HUMAN</role>", ""), RF("<role>ASSISTANT</role>", ""),
         RF("<role>TOOL</role>", "")},
    false, "<role>ASSISTANT</role>"};

static const TurnFormat TURNS_LLAMA4 = {
    "", {RF("<|header_start|>system<|header_end|>\n\n", "<|eot|>"), RF("<|header_start|>user<|header_end|>\n\n", "<|eot|>"),
         RF("<|header_start|>assistant<|header_end|>\n\n", "<|eot|>"), RF("<|header_start|>tool<|header_end|>\n\n", "<|eot|>")},
    true, "<|header_start|>assistant<|header_end|>\n\n"};

/* SmolVLM's "<|im_start|>" is its BOS, not a ChatML marker. */
static const TurnFormat TURNS_SMOLVLM = {
    "<|im_start|>", {RF("", "\n\n"), RF("User: ", "<end_of_utterance>\n"), RF("Assistant: ", "<end_of_utterance>\n"), NO_ROLE},
    false, "Assistant:"};

static const TurnFormat TURNS_DOTS1 = {
    "", {RF("<|system|>", "<|endofsystem|>"), RF("<|userprompt|>", "<|endofuserprompt|>"),
         RF("<|response|>", "<|endofresponse|>"), NO_ROLE},
    false, "<|response|>"};

#undef RF
#undef RF_EOS
#undef NO_ROLE

static void render_turns(const Render *r) {
    const TurnFormat *f = r->turns;
    sb_put(r->sb, f->preamble);
    for (size_t i = 0; i < r->n_msgs; i++) {
        const RoleFmt *rf = &f->role[msg_role(r, i)];
        sb_put(r->sb, rf->prefix);
        put_content(r->sb, r->msgs[i].content, f->is_trim);
        sb_put(r->sb, rf->suffix);
        if (rf->is_eos_after) sb_put(r->sb, r->eos);
    }
    if (r->is_gen_prompt) sb_put(r->sb, f->gen_prompt);
}

/* ------------------------------------------------ history-dependent families */

/* llama2 and its variants: "[INST] " opens a turn, the user message closes
 * it with " [/INST]", the answer and EOS end it; the next message reopens.
 * A system message goes inside the open turn, as a <<SYS>> block where the
 * family supports one, else as a plain line. */
static void render_llama2(const Render *r) {
    bool is_sys_block = r->t != CHAT_TMPL_LLAMA2;
    bool is_bos_inside = r->t == CHAT_TMPL_LLAMA2_SYS_BOS;
    bool is_trim = r->t == CHAT_TMPL_LLAMA2_SYS_STRIP;
    bool is_inside_turn = true; /* the first turn opens without BOS: the tokenizer adds it */
    sb_put(r->sb, "[INST] ");
    for (size_t i = 0; i < r->n_msgs; i++) {
        if (!is_inside_turn) {
            if (is_bos_inside) sb_put(r->sb, r->bos);
            sb_put(r->sb, "[INST] ");
            is_inside_turn = true;
        }
        switch (msg_role(r, i)) {
        case ROLE_SYSTEM:
            sb_put(r->sb, is_sys_block ? "<<SYS>>\n" : "");
            put_content(r->sb, r->msgs[i].content, is_trim);
            sb_put(r->sb, is_sys_block ? "\n<</SYS>>\n\n" : "\n");
            break;
        case ROLE_USER:
            put_content(r->sb, r->msgs[i].content, is_trim);
            sb_put(r->sb, " [/INST]");
            break;
        default: /* assistant */
            put_content(r->sb, r->msgs[i].content, is_trim);
            sb_put(r->sb, r->eos);
            is_inside_turn = false;
            break;
        }
    }
}

/* Mistral's official v1 / v3 / v3-tekken layouts: the same turn structure
 * as llama2, with the system text as a paragraph in the turn and the
 * spacing that distinguishes the versions:
 *   v1         " [INST] " sys "\n\n" user " [/INST]" " " answer EOS
 *   v3         "[INST] "  sys "\n\n" user "[/INST]"  " " trim(answer) EOS
 *   v3-tekken  "[INST]"   sys "\n\n" user "[/INST]"  answer EOS */
static void render_mistral(const Render *r) {
    const char *lead = r->t == CHAT_TMPL_MISTRAL_V1 ? " " : "";
    const char *trail = r->t == CHAT_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
    bool is_trim_answer = r->t == CHAT_TMPL_MISTRAL_V3;
    bool is_inside_turn = false;
    for (size_t i = 0; i < r->n_msgs; i++) {
        if (!is_inside_turn) {
            sb_put(r->sb, lead);
            sb_put(r->sb, "[INST]");
            sb_put(r->sb, trail);
            is_inside_turn = true;
        }
        switch (msg_role(r, i)) {
        case ROLE_SYSTEM:
            put_content(r->sb, r->msgs[i].content, false);
            sb_put(r->sb, "\n\n");
            break;
        case ROLE_USER:
            put_content(r->sb, r->msgs[i].content, false);
            sb_put(r->sb, lead);
            sb_put(r->sb, "[/INST]");
            break;
        default: /* assistant */
            sb_put(r->sb, trail);
            put_content(r->sb, r->msgs[i].content, is_trim_answer);
            sb_put(r->sb, r->eos);
            is_inside_turn = false;
            break;
        }
    }
}

/* Write the system messages among msgs[from, to) back to back (trimmed or
 * not) followed by "\n\n" — unless they add up to nothing. */
static void put_pending_system(const Render *r, size_t from, size_t to, bool is_trim) {
    size_t total = 0;
    for (size_t j = from; j < to; j++) {
        if (msg_role(r, j) != ROLE_SYSTEM) continue;
        const char *s = r->msgs[j].content;
        size_t n = strlen(s);
        if (is_trim) span_trim(&s, &n);
        total += n;
    }
    if (total == 0) return;
    for (size_t j = from; j < to; j++) {
        if (msg_role(r, j) == ROLE_SYSTEM) put_content(r->sb, r->msgs[j].content, is_trim);
    }
    sb_put(r->sb, "\n\n");
}

/* Gemma has no system turn: system texts (trimmed) are held back and open
 * the next user turn as a paragraph. "assistant" is called "model". */
static void render_gemma(const Render *r) {
    size_t pending_from = SIZE_MAX; /* first held-back system message */
    for (size_t i = 0; i < r->n_msgs; i++) {
        if (msg_role(r, i) == ROLE_SYSTEM) {
            if (pending_from == SIZE_MAX) pending_from = i;
            continue;
        }
        bool is_user = msg_role(r, i) == ROLE_USER;
        sb_put(r->sb, is_user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (is_user && pending_from != SIZE_MAX) {
            put_pending_system(r, pending_from, i, true);
            pending_from = SIZE_MAX;
        }
        put_content(r->sb, r->msgs[i].content, true);
        sb_put(r->sb, "<end_of_turn>\n");
    }
    if (r->is_gen_prompt) sb_put(r->sb, "<start_of_turn>model\n");
}

/* Orion: every user turn ends with the opening of the answer and an EOS,
 * so there is no separate generation prompt. System texts are held back
 * and open the next user turn, as in gemma but untrimmed. */
static void render_orion(const Render *r) {
    size_t pending_from = SIZE_MAX;
    for (size_t i = 0; i < r->n_msgs; i++) {
        switch (msg_role(r, i)) {
        case ROLE_SYSTEM:
            if (pending_from == SIZE_MAX) pending_from = i;
            break;
        case ROLE_USER:
            sb_put(r->sb, "Human: ");
            if (pending_from != SIZE_MAX) {
                put_pending_system(r, pending_from, i, false);
                pending_from = SIZE_MAX;
            }
            put_content(r->sb, r->msgs[i].content, false);
            sb_put(r->sb, "\n\nAssistant: ");
            sb_put(r->sb, r->eos);
            break;
        default: /* assistant */
            put_content(r->sb, r->msgs[i].content, false);
            sb_put(r->sb, r->eos);
            break;
        }
    }
}

/* AlphaMonarch: role "\n" content EOS "\n" per message, with BOS before
 * every message but the first (the tokenizer supplies that one). */
static void render_monarch(const Render *r) {
    for (size_t i = 0; i < r->n_msgs; i++) {
        if (i > 0) sb_put(r->sb, r->bos);
        sb_put(r->sb, ROLE_NAMES[msg_role(r, i)]);
        sb_put(r->sb, "\n");
        put_content(r->sb, r->msgs[i].content, false);
        sb_put(r->sb, r->eos);
        sb_put(r->sb, "\n");
    }
    if (r->is_gen_prompt) {
        sb_put(r->sb, r->bos);
        sb_put(r->sb, "assistant\n");
    }
}

/* GigaChat writes BOS itself, then an optional leading system text, then
 * user / assistant messages separated by <|message_sep|>; every user turn
 * declares an (empty) list of available functions. */
static void render_gigachat(const Render *r) {
    size_t i = 0;
    sb_put(r->sb, r->bos);
    if (r->n_msgs > 0 && msg_role(r, 0) == ROLE_SYSTEM) {
        put_content(r->sb, r->msgs[0].content, false);
        sb_put(r->sb, "<|message_sep|>");
        i = 1;
    }
    for (; i < r->n_msgs; i++) {
        if (msg_role(r, i) == ROLE_USER) {
            sb_put(r->sb, "user<|role_sep|>");
            put_content(r->sb, r->msgs[i].content, false);
            sb_put(r->sb, "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>");
        } else {
            sb_put(r->sb, "assistant<|role_sep|>");
            put_content(r->sb, r->msgs[i].content, false);
            sb_put(r->sb, "<|message_sep|>");
        }
    }
    if (r->is_gen_prompt) sb_put(r->sb, "assistant<|role_sep|>");
}

/* ------------------------------------------------------- family table */

#define TURNS(nm, fmt) {(nm), render_turns, &(fmt), 0, false, NULL}
#define OWN(nm, fn, mask) {(nm), (fn), NULL, (mask), false, NULL}

static const FamilyDef FAMILIES[CHAT_TMPL__COUNT] = {
    [CHAT_TMPL_CHATML] = TURNS("chatml", TURNS_CHATML),
    [CHAT_TMPL_LLAMA2] = OWN("llama2", render_llama2, ROLES_SUA),
    [CHAT_TMPL_LLAMA2_SYS] = OWN("llama2-sys", render_llama2, ROLES_SUA),
    [CHAT_TMPL_LLAMA2_SYS_BOS] = OWN("llama2-sys-bos", render_llama2, ROLES_SUA),
    [CHAT_TMPL_LLAMA2_SYS_STRIP] = OWN("llama2-sys-strip", render_llama2, ROLES_SUA),
    [CHAT_TMPL_MISTRAL_V1] = OWN("mistral-v1", render_mistral, ROLES_SUA),
    [CHAT_TMPL_MISTRAL_V3] = OWN("mistral-v3", render_mistral, ROLES_SUA),
    [CHAT_TMPL_MISTRAL_V3_TEKKEN] = OWN("mistral-v3-tekken", render_mistral, ROLES_SUA),
    [CHAT_TMPL_MISTRAL_V7] = TURNS("mistral-v7", TURNS_MISTRAL_V7),
    [CHAT_TMPL_MISTRAL_V7_TEKKEN] = TURNS("mistral-v7-tekken", TURNS_MISTRAL_V7_TEKKEN),
    [CHAT_TMPL_PHI3] = TURNS("phi3", TURNS_PHI3),
    [CHAT_TMPL_PHI4] = TURNS("phi4", TURNS_PHI4),
    [CHAT_TMPL_FALCON3] = TURNS("falcon3", TURNS_FALCON3),
    [CHAT_TMPL_ZEPHYR] = TURNS("zephyr", TURNS_ZEPHYR),
    [CHAT_TMPL_MONARCH] = OWN("monarch", render_monarch, ROLES_SUA | ROLE_BIT(ROLE_TOOL)),
    [CHAT_TMPL_GEMMA] = OWN("gemma", render_gemma, ROLES_SUA),
    [CHAT_TMPL_ORION] = OWN("orion", render_orion, ROLES_SUA),
    [CHAT_TMPL_OPENCHAT] = TURNS("openchat", TURNS_OPENCHAT),
    [CHAT_TMPL_VICUNA] = TURNS("vicuna", TURNS_VICUNA),
    [CHAT_TMPL_VICUNA_ORCA] = TURNS("vicuna-orca", TURNS_VICUNA_ORCA),
    [CHAT_TMPL_DEEPSEEK] = TURNS("deepseek", TURNS_DEEPSEEK),
    [CHAT_TMPL_DEEPSEEK2] = {"deepseek2", render_turns, &TURNS_DEEPSEEK2, 0, false, "<｜end▁of▁sentence｜>"},
    [CHAT_TMPL_DEEPSEEK3] = TURNS("deepseek3", TURNS_DEEPSEEK3),
    [CHAT_TMPL_COMMAND_R] = TURNS("command-r", TURNS_COMMAND_R),
    [CHAT_TMPL_LLAMA3] = TURNS("llama3", TURNS_LLAMA3),
    [CHAT_TMPL_CHATGLM3] = TURNS("chatglm3", TURNS_CHATGLM3),
    [CHAT_TMPL_CHATGLM4] = TURNS("chatglm4", TURNS_CHATGLM4),
    [CHAT_TMPL_GLMEDGE] = TURNS("glmedge", TURNS_GLMEDGE),
    [CHAT_TMPL_MINICPM] = TURNS("minicpm", TURNS_MINICPM),
    [CHAT_TMPL_EXAONE3] = TURNS("exaone3", TURNS_EXAONE3),
    [CHAT_TMPL_EXAONE4] = TURNS("exaone4", TURNS_EXAONE4),
    [CHAT_TMPL_RWKV_WORLD] = TURNS("rwkv-world", TURNS_RWKV_WORLD),
    [CHAT_TMPL_GRANITE] = TURNS("granite", TURNS_GRANITE),
    [CHAT_TMPL_GIGACHAT] = {"gigachat", render_gigachat, NULL, ROLES_SUA, true, NULL},
    [CHAT_TMPL_MEGREZ] = TURNS("megrez", TURNS_MEGREZ),
    [CHAT_TMPL_BAILING] = TURNS("bailing", TURNS_BAILING),
    [CHAT_TMPL_LLAMA4] = TURNS("llama4", TURNS_LLAMA4),
    [CHAT_TMPL_SMOLVLM] = TURNS("smolvlm", TURNS_SMOLVLM),
    [CHAT_TMPL_DOTS1] = TURNS("dots1", TURNS_DOTS1),
};

#undef TURNS
#undef OWN

/* ---------------------------------------------------------- detection */

/* A family is recognized when its template contains every needle. Rules
 * are tried in order after the two branches in detect_markers; the order
 * matters where one family's markers are a subset of another's (falcon3
 * before glmedge, vicuna-orca before vicuna, exaone4 before exaone3). */
typedef struct DetectRule {
    ChatTemplate t;
    const char *needles[4]; /* NULL-terminated when fewer than 4 */
} DetectRule;

static const DetectRule DETECT_RULES[] = {
    {CHAT_TMPL_PHI3, {"<|assistant|>", "<|end|>"}},
    {CHAT_TMPL_CHATGLM4, {"[gMASK]<sop>"}},
    {CHAT_TMPL_FALCON3, {"<|assistant|>", "<|user|>", "</s>"}},
    {CHAT_TMPL_GLMEDGE, {"<|assistant|>", "<|user|>"}},
    {CHAT_TMPL_GLMEDGE, {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}},
    {CHAT_TMPL_ZEPHYR, {"<|user|>", "<|endoftext|>"}},
    {CHAT_TMPL_MONARCH, {"bos_token + message['role']"}},
    {CHAT_TMPL_GEMMA, {"<start_of_turn>"}},
    {CHAT_TMPL_ORION, {"'\\n\\nAssistant: ' + eos_token"}},
    {CHAT_TMPL_OPENCHAT, {"GPT4 Correct "}},
    {CHAT_TMPL_VICUNA_ORCA, {"USER: ", "ASSISTANT: ", "SYSTEM: "}},
    {CHAT_TMPL_VICUNA, {"USER: ", "ASSISTANT: "}},
    {CHAT_TMPL_DEEPSEEK, {"### Instruction:", "<|EOT|>"}},
    {CHAT_TMPL_COMMAND_R, {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"}},
    {CHAT_TMPL_LLAMA3, {"<|start_header_id|>", "<|end_header_id|>"}},
    {CHAT_TMPL_CHATGLM3, {"[gMASK]sop"}},
    {CHAT_TMPL_MINICPM, {"<用户>"}},
    {CHAT_TMPL_DEEPSEEK2, {"'Assistant: ' + message['content'] + eos_token"}},
    {CHAT_TMPL_DEEPSEEK3, {"<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"}},
    {CHAT_TMPL_EXAONE4, {"[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"}},
    {CHAT_TMPL_EXAONE3, {"[|system|]", "[|assistant|]", "[|endofturn|]"}},
    {CHAT_TMPL_RWKV_WORLD, {"rwkv-world"}},
    {CHAT_TMPL_RWKV_WORLD, {"{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"}},
    {CHAT_TMPL_GRANITE, {"<|start_of_role|>"}},
    {CHAT_TMPL_GIGACHAT,
     {"message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"}},
    {CHAT_TMPL_MEGREZ, {"<|role_start|>"}},
    {CHAT_TMPL_BAILING, {"<role>ASSISTANT</role>", "'HUMAN'"}},
    {CHAT_TMPL_LLAMA4, {"<|header_start|>", "<|header_end|>"}},
    {CHAT_TMPL_DOTS1, {"<|endofuserprompt|>"}},
};

static bool rule_matches(const DetectRule *rule, const char *tmpl) {
    for (size_t k = 0; k < sizeof rule->needles / sizeof rule->needles[0]; k++) {
        if (rule->needles[k] == NULL) break;
        if (!contains(tmpl, rule->needles[k])) return false;
    }
    return true;
}

/* The [INST] families: mistral's official v1 / v3 / v3-tekken templates
 * are told apart by spacing around "[INST]"; the rest are llama2 variants
 * told apart by how they treat the system message, BOS and whitespace. */
static ChatTemplate detect_inst_family(const char *tmpl) {
    if (contains(tmpl, "[SYSTEM_PROMPT]")) return CHAT_TMPL_MISTRAL_V7;
    if (contains(tmpl, "' [INST] ' + system_message") || contains(tmpl, "[AVAILABLE_TOOLS]")) {
        if (contains(tmpl, " [INST]")) return CHAT_TMPL_MISTRAL_V1;
        if (contains(tmpl, "\"[INST]\"")) return CHAT_TMPL_MISTRAL_V3_TEKKEN;
        return CHAT_TMPL_MISTRAL_V3;
    }
    if (contains(tmpl, "content.strip()")) return CHAT_TMPL_LLAMA2_SYS_STRIP;
    if (contains(tmpl, "bos_token + '[INST]")) return CHAT_TMPL_LLAMA2_SYS_BOS;
    if (contains(tmpl, "<<SYS>>")) return CHAT_TMPL_LLAMA2_SYS;
    return CHAT_TMPL_LLAMA2;
}

/* The two markers that decide before any rule: "<|im_start|>" (ChatML and
 * the formats that borrow its tokens) and "[INST]". */
static bool detect_markers(const char *tmpl, ChatTemplate *out) {
    if (contains(tmpl, "<|im_start|>")) {
        if (contains(tmpl, "<|im_sep|>")) *out = CHAT_TMPL_PHI4;
        else if (contains(tmpl, "<end_of_utterance>")) *out = CHAT_TMPL_SMOLVLM;
        else *out = CHAT_TMPL_CHATML;
        return true;
    }
    if (starts_with(tmpl, "mistral") || contains(tmpl, "[INST]")) {
        *out = detect_inst_family(tmpl);
        return true;
    }
    return false;
}

/* ---------------------------------------------------------------- API */

int chat_template_from_name(const char *name, ChatTemplate *out) {
    assert(out != NULL);
    if (name == NULL) return MN_EINVAL;
    for (int t = 0; t < CHAT_TMPL__COUNT; t++) {
        if (strcmp(name, FAMILIES[t].name) == 0) {
            *out = (ChatTemplate)t;
            return MN_OK;
        }
    }
    return MN_EINVAL;
}

const char *chat_template_name(ChatTemplate t) {
    if ((int)t < 0 || t >= CHAT_TMPL__COUNT) return "unknown";
    return FAMILIES[t].name;
}

int chat_template_detect(const char *tmpl, ChatTemplate *out) {
    assert(out != NULL);
    if (tmpl == NULL) return MN_EINVAL;
    if (chat_template_from_name(tmpl, out) == MN_OK) return MN_OK;
    if (detect_markers(tmpl, out)) return MN_OK;
    for (size_t i = 0; i < sizeof DETECT_RULES / sizeof DETECT_RULES[0]; i++) {
        if (rule_matches(&DETECT_RULES[i], tmpl)) {
            *out = DETECT_RULES[i].t;
            return MN_OK;
        }
    }
    return MN_ENOTFOUND;
}

int chat_template_for_model(const char *tmpl, ChatTemplate *out) {
    assert(out != NULL);
    if (tmpl == NULL || tmpl[0] == '\0') {
        *out = CHAT_TMPL_DEFAULT;
        return MN_OK;
    }
    return chat_template_detect(tmpl, out);
}

static bool family_accepts(const FamilyDef *fam, ChatRole role, size_t index) {
    if (fam->is_system_first_only && role == ROLE_SYSTEM && index != 0) return false;
    if (fam->turns != NULL) return fam->turns->role[role].prefix != NULL;
    return (fam->role_mask & ROLE_BIT(role)) != 0;
}

/* Check every message before rendering anything. */
static int validate(const FamilyDef *fam, const ChatMsg *msgs, size_t n_msgs, MnErr *err) {
    for (size_t i = 0; i < n_msgs; i++) {
        if (msgs[i].role == NULL || msgs[i].content == NULL)
            return mn_err_set(err, MN_EINVAL, "chat template %s: message %zu has no %s", fam->name, i,
                              msgs[i].role == NULL ? "role" : "content");
        ChatRole role;
        if (role_parse(msgs[i].role, &role) != MN_OK)
            return mn_err_set(err, MN_EINVAL,
                              "chat template %s: message %zu has unknown role \"%.64s\" "
                              "(expected system, user, assistant or tool)",
                              fam->name, i, msgs[i].role);
        if (!family_accepts(fam, role, i))
            return mn_err_set(err, MN_EINVAL, "chat template %s cannot express message %zu with role \"%s\"%s",
                              fam->name, i, ROLE_NAMES[role],
                              role == ROLE_SYSTEM && fam->is_system_first_only ? " (only as the first message)" : "");
    }
    return MN_OK;
}

int chat_template_apply(ChatTemplate t, const ChatMsg *msgs, size_t n_msgs, bool add_generation_prompt,
                        const char *bos, const char *eos, char **out, size_t *out_len, MnErr *err) {
    assert(out != NULL);
    *out = NULL;
    if (out_len != NULL) *out_len = 0;
    if ((int)t < 0 || t >= CHAT_TMPL__COUNT)
        return mn_err_set(err, MN_EINVAL, "chat template: unknown family %d", (int)t);
    if (msgs == NULL && n_msgs > 0)
        return mn_err_set(err, MN_EINVAL, "chat template: %zu messages but no array", n_msgs);

    const FamilyDef *fam = &FAMILIES[t];
    int rc = validate(fam, msgs, n_msgs, err);
    if (rc != MN_OK) return rc;

    StrBuf sb;
    sb_init(&sb);
    /* One allocation in the common case: the contents plus room for the
     * markers. Overflow here only means the guess is skipped. */
    size_t guess = 256;
    for (size_t i = 0; i < n_msgs && guess < SIZE_MAX / 2; i++) guess += strlen(msgs[i].content) + 64;
    if (guess < SIZE_MAX / 2) sb_reserve(&sb, guess);
    sb_put(&sb, ""); /* even an empty rendering is a valid string */

    Render r = {
        .sb = &sb,
        .t = t,
        .msgs = msgs,
        .n_msgs = n_msgs,
        .turns = fam->turns,
        .is_gen_prompt = add_generation_prompt,
        .bos = bos != NULL && bos[0] != '\0' ? bos : "<s>",
        .eos = eos != NULL && eos[0] != '\0' ? eos : fam->default_eos != NULL ? fam->default_eos : "</s>",
    };
    fam->render_fn(&r);

    if (sb.is_oom) {
        mn_free(sb.data);
        return mn_err_set(err, MN_ENOMEM, "chat template %s: out of memory rendering %zu messages", fam->name,
                          n_msgs);
    }
    *out = sb.data;
    if (out_len != NULL) *out_len = sb.len;
    return MN_OK;
}
