/* cli.h — command-line options for the mnemo subcommands.
 *
 * A command describes its options in a table of CliOpt. cli_parse first
 * applies environment variables (MNEMO_ + the long name in upper snake case:
 * --pool-mb -> MNEMO_POOL_MB), then the command line, which wins. Options
 * may be given as "--name value", "--name=value" or "-x value"; boolean
 * flags take no value ("--no-bos"). Repeatable string options collect every
 * value. Arguments that are not options are returned in order.
 *
 * Other spellings (llama.cpp's, so its users' command lines work): an entry
 * whose help is NULL is an alias of the entry with help that writes the
 * same out. It parses alike, is listed on that entry's help line and is not
 * read from the environment. An alias of at most three letters is written
 * with one dash ("-np", "-ngl"); a longer one with two ("--ctx-size").
 */
#ifndef MN_CLI_H
#define MN_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

/* CLI_STR_OPTVAL: a string whose value may be left out ("-fa" or "-fa on"):
 * it takes "=value", else the next argument unless that begins with '-',
 * else "". */
typedef enum CliKind { CLI_STR, CLI_INT, CLI_FLOAT, CLI_U64, CLI_FLAG, CLI_STR_LIST, CLI_STR_OPTVAL } CliKind;

typedef struct CliStrList {
    const char **items; /* owned array (strings borrowed from argv/environ) */
    int n;
} CliStrList;

typedef struct CliOpt {
    const char *name;   /* long name without "--" */
    char short_name;    /* 0 for none */
    CliKind kind;
    void *out;          /* const char ** (STR, STR_OPTVAL), int *, float *, uint64_t *, bool *, CliStrList * */
    const char *arg;    /* placeholder shown in help, e.g. "N" */
    const char *help;   /* NULL: an alias (above) */
} CliOpt;

/* Parse argv[0..argc) (argv[0] is the first argument, not the program).
 * positional receives up to max_pos non-option arguments, *n_pos their
 * count. Returns MN_OK, or MN_EINVAL with err naming the bad option/value
 * in one line (an unknown option with the closest known spelling, when one
 * is close). "--help"/"-h" returns MN_ECANCELED so the caller prints usage. */
int cli_parse(int argc, char **argv, const CliOpt *opts, int n_opts, const char **positional, int max_pos,
              int *n_pos, MnErr *err);

void cli_usage(FILE *f, const char *synopsis, const CliOpt *opts, int n_opts);

/* Print one line "mnemo CMD: msg", CMD taken from the synopsis's first two
 * words ("mnemo serve -m MODEL ..." -> "mnemo serve"). */
void cli_error(FILE *f, const char *synopsis, const char *msg);

/* Of names[0..n), the one closest to typed (edit distance: insertions,
 * deletions, substitutions and swaps of neighbours), or NULL when none is
 * close enough to be a likely typo. */
const char *cli_closest(const char *typed, const char *const *names, int n);

/* Free the arrays of CLI_STR_LIST options. */
void cli_free(const CliOpt *opts, int n_opts);

/* ---- what every command does with them ---------------------------------------- */

/* cli_parse, then: -1 to go on; 0 after printing the usage on stdout for
 * --help; 2 after printing the error (cli_error) on stderr. */
int cli_parse_or_usage(int argc, char **argv, const char *synopsis, const CliOpt *opts, int n_opts,
                       const char **positional, int max_pos, int *n_pos);

/* One requirement on a command's options: when ok is false, print
 * "mnemo CMD: " and the message on stderr and return false. Chained with
 * ||, the first requirement that fails is the one named. */
bool cli_require(bool ok, const char *cmd, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Print "mnemo: " and err's message (or its code's text) on stderr;
 * returns 1, a command's exit status for a failure. */
int cli_fail(const MnErr *err);

#endif
