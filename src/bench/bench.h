/* bench.h — `mnemo bench`: a multi-turn conversation load generator.
 *
 * Plays a workload (bench/workload.h) against any OpenAI-compatible server
 * (bench/loadgen.h) and reports TTFT for first and returning turns, time per
 * output token, throughput and cache hits (bench/report.h).
 */
#ifndef MN_BENCH_H
#define MN_BENCH_H

/* The command: argv[0] is the first argument after "bench". Returns the
 * process exit status: 0 when at least one request succeeded (or none was
 * planned), 1 when none did or the report could not be written, 2 for bad
 * options. */
int bench_main(int argc, char **argv);

#endif
