/* Shared by the seccomp probes: print one line per attempt, either
 * "NAME ok" or "NAME errno=N", so the test can assert the exact errno. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>

static inline void report(const char *name, long ret) {
    if (ret < 0)
        printf("%s errno=%d\n", name, errno);
    else
        printf("%s ok\n", name);
    fflush(stdout);
}
