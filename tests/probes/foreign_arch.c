/* Syscalls of the foreign ABIs of x86_64, each from a child: i386 through
 * int 0x80 (getpid is 20 there) and x32 (the native number with bit 30).
 * The filter kills the caller, so the parent reports how each child ended. */
#include "probe.h"
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void child_result(const char *name, pid_t pid) {
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        printf("%s signal=%d\n", name, WTERMSIG(status));
    else
        printf("%s exit=%d\n", name, WEXITSTATUS(status));
    fflush(stdout);
}

int main(void) {
    pid_t pid = fork();
    if (pid == 0) {
        long ret = 20;
        __asm__ volatile("int $0x80" : "+a"(ret) : : "memory");
        /* exit 0: the call ran; 1: it failed with an errno */
        _exit(ret > 0 ? 0 : 1);
    }
    child_result("int80_getpid", pid);

    pid = fork();
    if (pid == 0) {
        long ret = syscall(0x40000000L | SYS_getpid);
        _exit(ret > 0 ? 0 : (errno == ENOSYS ? 2 : 1));
    }
    child_result("x32_getpid", pid);
    return 0;
}
