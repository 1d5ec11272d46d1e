/* tier_dir.h — the disk tier's directory is private to the user running mnemo.
 *
 * The directory (--disk-tier DIR) holds the KV bytes of cached
 * conversations (slab files, tier_disk.c) and the texts of replies
 * (mnemo.db, store.c): it is the server's own, readable by nobody else.
 * Whoever opens it first — store_open, or tier_disk_new without a store —
 * calls tierdir_prepare, which enforces:
 *
 *   - a missing DIR is created (one level) with mode 0700, whatever the
 *     umask;
 *   - DIR must be a directory (a symlink to one is fine) owned by the
 *     effective user and writable by no one else: a DIR owned by another
 *     user, or with group or other write permission, is refused — another
 *     user may have put or replaced files there, and tightening it would
 *     hide that (MN_EINVAL, a message naming DIR and the fix);
 *   - read or search permission for group and others (a DIR made by hand,
 *     or by a mnemo before this rule, with mode 0755) is removed: DIR
 *     becomes 0700 (LOG_WARN);
 *   - the cache's own files in DIR (mnemo.db and its -wal, -shm and
 *     -journal files, slab-NNNNN.dat) must be regular files — not symlinks
 *     — owned by the user; one of another mode becomes 0600 (LOG_WARN).
 *     Other names are left alone (lost+found on a dedicated filesystem).
 *
 * Files made later are 0600 at birth: the database through
 * tierdir_create_private, slab files by an fchmod after their creation,
 * and SQLite gives its -wal, -shm and journal files the database's mode.
 * The database keeps temporary tables and sorts in memory
 * (temp_store=MEMORY), so no temporary file goes elsewhere.
 */
#ifndef MN_TIER_DIR_H
#define MN_TIER_DIR_H

#include <stdbool.h>

#include "base/err.h"

/* Make DIR safe to use as above (creating it when may_create). MN_OK;
 * MN_ENOTFOUND (missing, or its parent is), MN_EINVAL (refused: not a
 * directory, another owner, writable by others, a foreign or non-regular
 * cache file), MN_EIO (a system call failed); err says which and how to
 * fix it. */
int tierdir_prepare(const char *dir, bool may_create, MnErr *err);

/* Create path, unless it exists, as an empty regular file of mode 0600
 * (whatever the umask); an existing path must be a regular file (not a
 * symlink). MN_OK, MN_EINVAL, MN_EIO, with a message in err. */
int tierdir_create_private(const char *path, MnErr *err);

#endif
