/* apply_template.h — `mnemo apply-template`: render a chat template without
 * a server, for users debugging a template and for tests.
 *
 *   mnemo apply-template (--chat-template-file FILE | -m MODEL)
 *       [--bos-token S] [--eos-token S] [--no-generation-prompt]
 *       [--var NAME=JSON]... [--template-date YYYY-MM-DD]
 *
 * reads {"messages": [...], "tools": [...]} on stdin and writes the
 * rendered prompt to stdout byte for byte, nothing added. The variables
 * the template sees are those transformers' apply_chat_template passes:
 * messages, tools (None when absent), documents (None),
 * add_generation_prompt, bos_token, eos_token, and each --var. With -m the
 * template is the GGUF's tokenizer.chat_template and the tokens are the
 * texts of tokenizer.ggml.bos_token_id / eos_token_id (the flags override
 * them); without a model they are "" unless given.
 */
#ifndef MN_APPLY_TEMPLATE_H
#define MN_APPLY_TEMPLATE_H

#include "base/err.h"

/* The command: argv[0] is the first argument after "apply-template".
 * Returns 0, 1 when rendering failed (the message on stderr), 2 for bad
 * options or input. */
int apply_template_main(int argc, char **argv);

#endif
