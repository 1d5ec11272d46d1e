/* diskprobe_cmd.h — the `mnemo disk-probe` command: options, the probes of
 * tools/ (diskprobe, tierprobe, memload) run in order, and their figures
 * printed for people and for scripts (scripts/bench parses the key=value
 * lines). README's "mnemo disk-probe" section is the user's contract. */
#ifndef MN_TOOLS_DISKPROBE_CMD_H
#define MN_TOOLS_DISKPROBE_CMD_H

/* argv[0] is the first argument after "disk-probe". Prints
 *   disk-probe DIR: write W MB/s, read R MB/s (N MiB, BACKEND)
 *   read_mbps=R write_mbps=W
 * and with --restore also
 *   disk-probe DIR: the disk tier restores at T MB/s, X of the raw read
 *     (K restores of 2 runs x 5 blocks, M MB)
 *   restore_mbps=T
 * with --memory-load N also
 *   memory_load_threads=N memory_load_gbps=G
 * or with --sample-ms a sample_read_mbps=R line per read and a summary
 *   samples=N median_read_mbps=M q1_read_mbps=A q3_read_mbps=B
 * and returns 0; 1 when a probe failed (a message on stderr), 2 for bad
 * options. */
int diskprobe_cmd(int argc, char **argv);

#endif
