/* ptrace and process_vm_* against another process of the sandbox, and
 * PTRACE_TRACEME followed by a peek at the parent. */
#include "probe.h"
#include <signal.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static long secret = 42;

int main(void) {
    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    report("ptrace_attach", ptrace(PTRACE_ATTACH, child, 0, 0));
    errno = 0;
    long word = ptrace(PTRACE_PEEKDATA, child, &secret, 0);
    report("ptrace_peek", errno ? -1 : word);

    long copy = 0;
    struct iovec local = {&copy, sizeof copy}, remote = {&secret, sizeof secret};
    report("process_vm_readv", process_vm_readv(child, &local, 1, &remote, 1, 0));
    report("process_vm_writev", process_vm_writev(child, &local, 1, &remote, 1, 0));
    kill(child, SIGKILL);
    waitpid(child, 0, 0);

    pid_t parent = getpid();
    pid_t tracee = fork();
    if (tracee == 0) {
        report("ptrace_traceme", ptrace(PTRACE_TRACEME, 0, 0, 0));
        errno = 0;
        word = ptrace(PTRACE_PEEKDATA, parent, &secret, 0);
        report("ptrace_traceme_peek", errno ? -1 : word);
        _exit(0);
    }
    waitpid(tracee, 0, 0);
    return 0;
}
