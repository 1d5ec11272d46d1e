/* chat_template.h — turn a list of chat messages into a model's prompt text.
 *
 * A model's GGUF may carry tokenizer.chat_template, a Jinja program. This
 * module does not run it: like llama.cpp's built-in formatter it recognizes
 * the template's family by characteristic substrings and renders the
 * family's format in C (model/jinja.h renders the template itself; the
 * server uses a family when asked to, or for a model without a template:
 * model/chat_format.h). The output of chat_template_apply is plain text for the tokenizer; the
 * tokenizer adds the leading BOS itself, so the text never starts with one
 * (a family that needs BOS *inside* the history, like llama2-sys-bos or
 * monarch, writes it there).
 *
 * Security note for callers: the output mixes the template's control markers
 * with message text, and nothing here escapes marker-like text inside a
 * message. Tokenize message text without special-token parsing if clients
 * must not be able to inject markers.
 */
#ifndef MN_CHAT_TEMPLATE_H
#define MN_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"

/* One message. Both strings are borrowed for the duration of the call.
 * role: "system", "user" or "assistant"; also "tool" for the families whose
 * format writes the role name verbatim (chatml, phi3, phi4, falcon3, zephyr,
 * monarch, llama3, llama4, chatglm3, chatglm4, glmedge, granite, megrez,
 * bailing, exaone4). Anything else is rejected with MN_EINVAL. */
typedef struct ChatMsg {
    const char *role;
    const char *content;
} ChatMsg;

/* The families, named as llama.cpp names them (chat_template_name). */
typedef enum ChatTemplate {
    CHAT_TMPL_CHATML,            /* "chatml" — <|im_start|>role\n...<|im_end|>\n */
    CHAT_TMPL_LLAMA2,            /* "llama2" — [INST] ... [/INST], system as a plain line */
    CHAT_TMPL_LLAMA2_SYS,        /* "llama2-sys" — with <<SYS>> block */
    CHAT_TMPL_LLAMA2_SYS_BOS,    /* "llama2-sys-bos" — BOS before every later [INST] */
    CHAT_TMPL_LLAMA2_SYS_STRIP,  /* "llama2-sys-strip" — contents whitespace-trimmed */
    CHAT_TMPL_MISTRAL_V1,        /* "mistral-v1" — " [INST] ... [/INST]" */
    CHAT_TMPL_MISTRAL_V3,        /* "mistral-v3" — "[INST] ...[/INST]", trimmed answers */
    CHAT_TMPL_MISTRAL_V3_TEKKEN, /* "mistral-v3-tekken" — "[INST]...[/INST]" */
    CHAT_TMPL_MISTRAL_V7,        /* "mistral-v7" — [SYSTEM_PROMPT] ... */
    CHAT_TMPL_MISTRAL_V7_TEKKEN, /* "mistral-v7-tekken" — v7 without the spaces */
    CHAT_TMPL_PHI3,              /* "phi3" — <|role|>\n...<|end|>\n */
    CHAT_TMPL_PHI4,              /* "phi4" — <|im_start|>role<|im_sep|>...<|im_end|> */
    CHAT_TMPL_FALCON3,           /* "falcon3" — <|role|>\n...\n */
    CHAT_TMPL_ZEPHYR,            /* "zephyr" — <|role|>\n...<|endoftext|>\n */
    CHAT_TMPL_MONARCH,           /* "monarch" — role\n...EOS\n, BOS between messages */
    CHAT_TMPL_GEMMA,             /* "gemma" — <start_of_turn>user|model, system merged */
    CHAT_TMPL_ORION,             /* "orion" — Human: ... Assistant: EOS */
    CHAT_TMPL_OPENCHAT,          /* "openchat" — GPT4 Correct User: ... */
    CHAT_TMPL_VICUNA,            /* "vicuna" — USER: ... ASSISTANT: ... */
    CHAT_TMPL_VICUNA_ORCA,       /* "vicuna-orca" — vicuna with SYSTEM: */
    CHAT_TMPL_DEEPSEEK,          /* "deepseek" — ### Instruction: / ### Response: */
    CHAT_TMPL_DEEPSEEK2,         /* "deepseek2" — User: ... Assistant: ...EOS */
    CHAT_TMPL_DEEPSEEK3,         /* "deepseek3" — <｜User｜>...<｜Assistant｜>... */
    CHAT_TMPL_COMMAND_R,         /* "command-r" — <|START_OF_TURN_TOKEN|>... */
    CHAT_TMPL_LLAMA3,            /* "llama3" — <|start_header_id|>role<|end_header_id|> */
    CHAT_TMPL_CHATGLM3,          /* "chatglm3" — [gMASK]sop<|role|>\n ... */
    CHAT_TMPL_CHATGLM4,          /* "chatglm4" — [gMASK]<sop><|role|>\n... */
    CHAT_TMPL_GLMEDGE,           /* "glmedge" — <|role|>\n... */
    CHAT_TMPL_MINICPM,           /* "minicpm" — <用户>...<AI>... */
    CHAT_TMPL_EXAONE3,           /* "exaone3" — [|role|]...[|endofturn|] */
    CHAT_TMPL_EXAONE4,           /* "exaone4" — exaone3 plus a tool role */
    CHAT_TMPL_RWKV_WORLD,        /* "rwkv-world" — User: ...\n\nAssistant: ... */
    CHAT_TMPL_GRANITE,           /* "granite" — <|start_of_role|>role<|end_of_role|> */
    CHAT_TMPL_GIGACHAT,          /* "gigachat" — role<|role_sep|>...<|message_sep|> */
    CHAT_TMPL_MEGREZ,            /* "megrez" — <|role_start|>role<|role_end|> */
    CHAT_TMPL_BAILING,           /* "bailing" — <role>HUMAN</role>... */
    CHAT_TMPL_LLAMA4,            /* "llama4" — <|header_start|>role<|header_end|> */
    CHAT_TMPL_SMOLVLM,           /* "smolvlm" — User: ...<end_of_utterance> */
    CHAT_TMPL_DOTS1,             /* "dots1" — <|userprompt|>...<|endofuserprompt|> */
    CHAT_TMPL__COUNT
} ChatTemplate;

/* The family used for a model whose GGUF has no chat template. */
#define CHAT_TMPL_DEFAULT CHAT_TMPL_CHATML

/* Recognize a family from a tokenizer.chat_template string (or from a family
 * name, which is tried first, as llama.cpp does; a string starting with
 * "mistral" also means the llama2 family). Returns MN_OK and sets *out,
 * MN_ENOTFOUND when no family matches (*out untouched), MN_EINVAL for NULL. */
int chat_template_detect(const char *tmpl, ChatTemplate *out);

/* The family for a model: CHAT_TMPL_DEFAULT when tmpl is NULL or empty (the
 * model has no template), otherwise chat_template_detect(tmpl, out). */
int chat_template_for_model(const char *tmpl, ChatTemplate *out);

/* Family by exact name ("chatml", "llama2", "llama3", "mistral-v7", "gemma",
 * "phi3", "zephyr", ...; see ChatTemplate). MN_OK, or MN_EINVAL for an
 * unknown name or NULL (*out untouched). */
int chat_template_from_name(const char *name, ChatTemplate *out);

/* The family's name; a static string, never NULL ("unknown" out of range). */
const char *chat_template_name(ChatTemplate t);

/* Render msgs[0..n_msgs) in family t. add_generation_prompt appends the
 * opening of the assistant's turn where the family has one (some, like the
 * [INST] families, end every user turn ready for the answer and have none).
 * bos/eos are the token texts the template sees (tokenizer.ggml.bos/eos
 * token text); NULL or "" means the family's usual one ("<s>", "</s>" and
 * for deepseek2 "<｜end▁of▁sentence｜>"). Families whose Jinja source
 * writes a marker literally (e.g. vicuna's "</s>") write it literally here.
 *
 * On MN_OK, *out is a NUL-terminated string the caller frees with mn_free
 * and *out_len (if out_len is not NULL) its length. On failure *out is NULL,
 * *out_len is 0 and err (if not NULL) says why:
 *   MN_EINVAL  t out of range, msgs NULL with n_msgs > 0, a NULL role or
 *              content, or a role the family cannot express (the message
 *              is named by index and role);
 *   MN_ENOMEM  allocation failed. */
int chat_template_apply(ChatTemplate t, const ChatMsg *msgs, size_t n_msgs,
                        bool add_generation_prompt, const char *bos, const char *eos,
                        char **out, size_t *out_len, MnErr *err);

#endif
