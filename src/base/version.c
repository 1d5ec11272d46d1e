/* version.c — the build's commit (see version.h). This file alone gets
 * -DMNEMO_COMMIT from the Makefile, so only it recompiles when HEAD moves;
 * it is linked beside libmnemo.a rather than inside it for the same reason
 * (a new commit relinks the mnemo binary, not every test). */
#include "base/version.h"

#ifndef MNEMO_COMMIT
#define MNEMO_COMMIT "unknown"
#endif

const char *mn_build_commit(void) { return MNEMO_COMMIT; }
