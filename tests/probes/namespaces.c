/* New namespaces by every door: unshare, clone with CLONE_NEWUSER, clone3,
 * setns. Without the filter, unprivileged user namespaces succeed here. */
#include "probe.h"
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static long raw_clone(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, 0, 0);
    return pid;
}

static long raw_clone3(uint64_t flags) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = flags;
    args.exit_signal = SIGCHLD;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, 0, 0);
    return pid;
}

/* Each attempt in a child of its own, so that one that succeeds (without
 * the filter) does not change what the next one can do. */
#define ATTEMPT(name, call)                                                    \
    do {                                                                       \
        pid_t p = fork();                                                      \
        if (p == 0) {                                                          \
            report(name, call);                                                \
            _exit(0);                                                          \
        }                                                                      \
        waitpid(p, 0, 0);                                                      \
    } while (0)

int main(void) {
    ATTEMPT("unshare_user", unshare(CLONE_NEWUSER));
    ATTEMPT("unshare_net", unshare(CLONE_NEWNET));
    ATTEMPT("clone_newuser", raw_clone(CLONE_NEWUSER));
    ATTEMPT("clone_newns", raw_clone(CLONE_NEWNS));
    ATTEMPT("clone_plain", raw_clone(0));
    ATTEMPT("clone3_newuser", raw_clone3(CLONE_NEWUSER));
    ATTEMPT("clone3_plain", raw_clone3(0));
    ATTEMPT("setns", setns(0, CLONE_NEWNET));
    return 0;
}
