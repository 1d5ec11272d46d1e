/* tier_dir.c — the disk tier's directory is private (see tier_dir.h).
 *
 * Checked once per open, before anything in the directory is read or
 * written: creating it, checking its owner and mode, then the cache's own
 * files in it. The rules refuse what another user may have tampered with
 * (their directory, a directory they can write, files they own, a symlink
 * where a cache file belongs) and tighten what only the owner controls
 * (read permissions left by an earlier mnemo or a umask). No state: every
 * call looks again.
 */
#include "cache/tier_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

#define TIERDIR_DIR_MODE 0700
#define TIERDIR_FILE_MODE 0600

/* ---- helpers --------------------------------------------------------------- */

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Whether a name in the directory is one of the cache's files: the
 * database and SQLite's files beside it, or a slab. */
static bool is_cache_file(const char *name) {
    return strncmp(name, "mnemo.db", 8) == 0 || (strncmp(name, "slab-", 5) == 0 && has_suffix(name, ".dat"));
}

static int owner_refused(const char *path, uid_t owner, MnErr *err) {
    return mn_err_set(err, MN_EINVAL,
                      "disk tier: %s belongs to uid %u, not to the user running mnemo (uid %u): the cache's files "
                      "must be its own; run mnemo as that user, hand it over (chown -R %u %s), or use another "
                      "directory",
                      path, (unsigned)owner, (unsigned)geteuid(), (unsigned)geteuid(), path);
}

/* A cache file in the directory: a regular file of ours, made 0600. */
static int check_file(const char *path, MnErr *err) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return MN_OK; /* gone meanwhile (SQLite's journal) */
        return mn_err_set(err, MN_EIO, "disk tier: cannot stat %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return mn_err_set(err, MN_EINVAL,
                          "disk tier: %s is not a regular file (a symlink or a directory?): the cache keeps only "
                          "its own files there; remove it",
                          path);
    if (st.st_uid != geteuid()) return owner_refused(path, st.st_uid, err);
    if ((st.st_mode & 07777) == TIERDIR_FILE_MODE) return MN_OK;
    if (chmod(path, TIERDIR_FILE_MODE) != 0)
        return mn_err_set(err, MN_EIO, "disk tier: cannot make %s private (chmod 600): %s", path, strerror(errno));
    LOG_WARN("disk tier: %s had mode %04o: now 0600 (readable by its owner only)", path,
             (unsigned)(st.st_mode & 07777));
    return MN_OK;
}

static int check_files(const char *dir, MnErr *err) {
    DIR *d = opendir(dir);
    if (d == NULL) return mn_err_set(err, MN_EIO, "disk tier: cannot list %s: %s", dir, strerror(errno));
    int rc = MN_OK;
    struct dirent *e;
    while (rc == MN_OK && (e = readdir(d)) != NULL) {
        if (!is_cache_file(e->d_name)) continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            rc = mn_err_set(err, MN_EINVAL, "disk tier: path too long in %s", dir);
        else
            rc = check_file(path, err);
    }
    closedir(d);
    return rc;
}

/* ---- API ------------------------------------------------------------------------ */

int tierdir_prepare(const char *dir, bool may_create, MnErr *err) {
    if (dir == NULL || dir[0] == '\0') return mn_err_set(err, MN_EINVAL, "disk tier: no directory");
    /* the umask may take bits from a new directory: the mode is set below */
    if (may_create && mkdir(dir, TIERDIR_DIR_MODE) != 0 && errno != EEXIST)
        return mn_err_set(err, errno == ENOENT ? MN_ENOTFOUND : MN_EIO, "disk tier: cannot create %s: %s", dir,
                          strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0)
        return mn_err_set(err, errno == ENOENT ? MN_ENOTFOUND : MN_EIO, "disk tier: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return mn_err_set(err, MN_EINVAL, "disk tier: %s is not a directory", dir);
    if (st.st_uid != geteuid()) return owner_refused(dir, st.st_uid, err);
    mode_t mode = st.st_mode & 07777;
    if (mode & (S_IWGRP | S_IWOTH))
        return mn_err_set(err, MN_EINVAL,
                          "disk tier: %s is writable by other users (mode %04o), who could replace the cache's "
                          "files: check what it holds, then make it private (chmod 700 %s), or use another "
                          "directory",
                          dir, (unsigned)mode, dir);
    if (mode != TIERDIR_DIR_MODE) {
        if (chmod(dir, TIERDIR_DIR_MODE) != 0)
            return mn_err_set(err, MN_EIO, "disk tier: cannot make %s private (chmod 700): %s", dir,
                              strerror(errno));
        if (mode & 077)
            LOG_WARN("disk tier: %s had mode %04o: now 0700 (its owner only)", dir, (unsigned)mode);
    }
    return check_files(dir, err);
}

int tierdir_create_private(const char *path, MnErr *err) {
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, TIERDIR_FILE_MODE);
    if (fd < 0)
        return mn_err_set(err, errno == ELOOP ? MN_EINVAL : MN_EIO, "disk tier: cannot open %s: %s%s", path,
                          strerror(errno), errno == ELOOP ? " (a symlink: remove it)" : "");
    struct stat st;
    int rc = MN_OK;
    if (fstat(fd, &st) != 0)
        rc = mn_err_set(err, MN_EIO, "disk tier: cannot stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = mn_err_set(err, MN_EINVAL, "disk tier: %s is not a regular file: remove it", path);
    else if ((st.st_mode & 07777) != TIERDIR_FILE_MODE && fchmod(fd, TIERDIR_FILE_MODE) != 0)
        rc = mn_err_set(err, MN_EIO, "disk tier: cannot make %s private (chmod 600): %s", path, strerror(errno));
    close(fd);
    return rc;
}
