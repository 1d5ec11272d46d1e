/* speed.h — `mnemo speed`: prefill and decode throughput of a model on
 * this machine (like llama-bench's pp and tg rows) and the peak RSS, one
 * line or one JSON object (scripts/bench reads prefill_tps, decode_tps and
 * peak_rss_mb). README's "mnemo speed" is the user's contract. */
#ifndef MN_TOOLS_SPEED_H
#define MN_TOOLS_SPEED_H

/* argv[0] is the first argument after "speed". Returns 0 after printing
 * the figures, 1 when the model cannot be loaded or run, 2 for bad
 * options. */
int speed_main(int argc, char **argv);

#endif
