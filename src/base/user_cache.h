/* user_cache.h — the per-user cache directory, $HOME/.cache/mnemo.
 *
 * Where mnemo keeps what it can always make again: the machine's cost
 * profiles (engine/profile) and the in-process chat server's log. Losing
 * it costs time, never correctness, so a caller that gets no path goes on
 * without the file.
 */
#ifndef MN_USER_CACHE_H
#define MN_USER_CACHE_H

#include <stddef.h>

/* "$HOME/.cache/mnemo/NAME" in buf, making the two directories when they
 * are missing (mode 0755). MN_OK; MN_ENOTFOUND without $HOME; MN_ERANGE
 * when buf is too small. */
int user_cache_path(const char *name, char *buf, size_t cap);

#endif
