/* chat_input.h — the lines a person types into `mnemo chat`.
 *
 * When both the input and the output are terminals, the line is edited
 * with libedit (emacs keys: arrows, Ctrl-A/E, Ctrl-W, ...; ~/.editrc is
 * read) and every non-empty line goes into a history kept in memory for
 * the session (Up/Down or Ctrl-P/N, Ctrl-R to search). Otherwise (a pipe,
 * a file, or an output that would not show libedit's echo) lines are read
 * as they come, with no history.
 * One ChatInput per input stream; not thread-safe.
 */
#ifndef MN_CHAT_INPUT_H
#define MN_CHAT_INPUT_H

#include <stdbool.h>
#include <stdio.h>

#include "base/err.h"

typedef struct ChatInput ChatInput;

/* Read from in; prompts and the edited line's echo go to out. Both must
 * outlive the ChatInput. MN_OK or MN_ENOMEM (also when libedit cannot set
 * up the terminal). */
int chat_input_new(FILE *in, FILE *out, ChatInput **ci);
void chat_input_free(ChatInput *ci);

/* Print prompt and read one line, without its newline, into *line: valid
 * until the next call or chat_input_free. MN_OK; MN_ENOTFOUND at the end
 * of the input with nothing read; MN_ENOMEM. */
int chat_input_read(ChatInput *ci, const char *prompt, const char **line);

/* Whether lines are edited (input and output are terminals). */
bool chat_input_is_editing(const ChatInput *ci);

/* Lines in the history (0 when not editing). */
int chat_input_history_len(const ChatInput *ci);

#endif
