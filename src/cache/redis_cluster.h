/* redis_cluster.h — the shared tier's Redis client: one server, or a Redis
 * Cluster, behind one pipelined interface (hiredis 0.14 has no cluster
 * support; this is its cluster side, after the Redis Cluster
 * specification).
 *
 * The caller appends commands, flushes them, and takes their replies in
 * the order it appended them, as on one hiredis connection. Each command's
 * key (argv[1]) says where it goes: a standalone server takes every
 * command; in a cluster the key's hash slot (CRC16 of the key, or of its
 * hash tag, mod 16384) names the node that serves it, from the slot map
 * that CLUSTER SLOTS gave. A node's commands are pipelined on its own
 * connection. A node that answers MOVED (the slot has moved for good)
 * updates the map and the command is sent again where it points; ASK (the
 * slot is being migrated and this key is already at the target) sends
 * ASKING and the command again to the target, leaving the map as it is.
 * So a cluster command is kept (formatted) until its final reply is read;
 * the client reads replies early when the commands kept exceed a bound,
 * so a long pipeline of large writes keeps at most that much twice.
 *
 * Errors: a connection that fails or times out (connecting, and each read
 * and write: timeout_ms) closes every connection of the client and drops
 * every reply owed: the call returns MN_EIO, and the caller opens the
 * client again (rcluster_connect) when it wants to. A redirection loop
 * (more than a few hops for one command) gives the caller the last
 * redirecting error reply. The URLs' credentials are used for AUTH on
 * every connection and appear in no log line: `shown` strings leave them
 * out.
 *
 * Owner: one thread at a time (the mover's); nothing locks. hiredis
 * allocates through its own malloc, not mn_malloc, and aborts when that
 * fails.
 */
#ifndef MN_REDIS_CLUSTER_H
#define MN_REDIS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis.h>

#include "base/err.h"

#define RCLUSTER_SLOTS 16384

typedef struct RedisCluster RedisCluster;

typedef struct RedisClusterConfig {
    /* redis://[user[:password]@]host[:port][/db] or
     * unix://[user[:password]@]/path.sock[?db=N]: the server; in a
     * cluster the seeds, TCP and database 0 only, asked in order for the
     * slot map (every node is authenticated with the first seed's
     * credentials) */
    const char *const *urls;
    int n_urls;
    bool is_cluster;
    int timeout_ms; /* connecting, and each read or write; > 0 */
    /* a cluster's commands kept for a redirection, in bytes, beyond which
     * replies are read early; 0 = 8 MiB */
    uint64_t max_kept_bytes;
} RedisClusterConfig;

/* Counters since the client was made. */
typedef struct RedisClusterStats {
    uint64_t n_moved;      /* MOVED replies followed */
    uint64_t n_ask;        /* ASK replies followed */
    uint64_t n_map_loads;  /* slot maps read (CLUSTER SLOTS) */
    int n_nodes;           /* nodes known */
} RedisClusterStats;

/* A client for cfg (the URLs are parsed and checked here, not connected:
 * rcluster_connect). MN_EINVAL (a message that names no credential),
 * MN_EUNSUPPORTED (rediss://: hiredis 0.14 has no TLS), MN_ENOMEM; *out
 * NULL on failure. */
int rcluster_new(const RedisClusterConfig *cfg, RedisCluster **out, MnErr *err);
void rcluster_free(RedisCluster *c);

/* (Re)connect: close whatever is open, then open the server (AUTH, SELECT,
 * PING), or ask the seeds in order for the cluster's slot map until one
 * answers and connect to every node it names (a node named later by a
 * MOVED or ASK is connected when a command reaches it). MN_OK, MN_EIO
 * (logged: no seed answers, a node does not answer, or a server refuses),
 * MN_ENOMEM. */
int rcluster_connect(RedisCluster *c);
/* Close every connection and drop every reply owed. */
void rcluster_close(RedisCluster *c);
bool rcluster_is_connected(const RedisCluster *c);

/* Append one command (arguments binary-safe, argv[1] its key: a command
 * with more keys must keep them in one slot, as a cluster wants anyway).
 * Its reply is owed until rcluster_take returns it. A deferred command's
 * reply is read and dropped by the client (an error reply logged) before
 * the reply of any command appended after it is returned. MN_OK, MN_EIO
 * (closed). */
int rcluster_append(RedisCluster *c, int argc, const char **argv, const size_t *lens);
int rcluster_append_deferred(RedisCluster *c, int argc, const char **argv, const size_t *lens);
/* Send what was appended, without waiting for replies. MN_OK, MN_EIO
 * (closed; `what` names the exchange in the log line). */
int rcluster_flush(RedisCluster *c, const char *what);
/* The final reply of the oldest command owed (the caller frees it with
 * freeReplyObject), redirections followed. MN_OK; MN_EIO (closed; also
 * when nothing is owed). */
int rcluster_take(RedisCluster *c, redisReply **out, const char *what);
/* Replies owed (deferred ones included). */
int rcluster_n_owed(const RedisCluster *c);

/* The server's URL, or the cluster's seeds, as logs show them (no
 * credentials). Valid until rcluster_free. */
const char *rcluster_shown(const RedisCluster *c);
void rcluster_stats(const RedisCluster *c, RedisClusterStats *out);
/* Print the connections, the owed replies and the slot map's ranges to
 * stderr (gdb, failing tests). */
void rcluster_dump(const RedisCluster *c);

/* ---- the cluster specification's pure parts ---------------------------------- */

/* CRC16-CCITT (XModem: polynomial 0x1021, initial value 0) of p[0..n). */
uint16_t rcluster_crc16(const void *p, size_t n);
/* The hash slot of a key: CRC16 of the key mod 16384, or of its hash tag
 * (what lies between its first '{' and the first '}' after it, when that
 * is not empty). */
int rcluster_key_slot(const char *key, size_t len);

typedef enum RedisRedirectKind { RCLUSTER_MOVED = 1, RCLUSTER_ASK } RedisRedirectKind;

/* A MOVED or ASK error reply: "MOVED 3999 127.0.0.1:6381". */
typedef struct RedisRedirect {
    RedisRedirectKind kind;
    int slot;
    char host[256]; /* "" when the node did not say (the one that answered) */
    int port;
} RedisRedirect;

/* Parse an error reply's text s[0..len). MN_OK with *out; MN_ENOTFOUND
 * when it is no redirection; MN_EFORMAT when it says MOVED or ASK but not
 * as the specification writes it (a slot out of range, no port). */
int rcluster_parse_redirect(const char *s, size_t len, RedisRedirect *out);

#endif
