/* version.h — which mnemo this is: the release number, kept here, and the
 * git commit the binary was built from.
 *
 * MNEMO_VERSION is the one place the version number lives (bump it with a
 * release). The commit is compiled into base/version.c alone: the Makefile
 * passes -DMNEMO_COMMIT="<abbreviated hash>" in a git checkout and the
 * object is rebuilt when HEAD moves, so a new commit recompiles one file.
 */
#ifndef MN_VERSION_H
#define MN_VERSION_H

#define MNEMO_VERSION "0.18.0"

/* The abbreviated commit hash of the build, or "unknown" when it was not
 * built from a git checkout. A static string. */
const char *mn_build_commit(void);

#endif
