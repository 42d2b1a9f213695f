/* Kernel interfaces outside the namespaces: keyrings, bpf, perf, io_uring,
 * userfaultfd. bpf and perf_event_open get a bad pointer, which the kernel
 * answers with EFAULT, so EPERM can only come from the filter. */
#include "probe.h"
#include <fcntl.h>
#include <linux/keyctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    report("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
    report("add_key", syscall(SYS_add_key, "user", "confine", "x", 1, KEY_SPEC_SESSION_KEYRING));
    report("bpf", syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, (void *)1, 64));
    report("perf_event_open", syscall(SYS_perf_event_open, (void *)1, 0, -1, -1, 0));
    char params[120] = {0};
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, params));
    /* UFFD_USER_MODE_ONLY: allowed unprivileged even with vm.unprivileged_userfaultfd=0 */
    report("userfaultfd", syscall(SYS_userfaultfd, O_CLOEXEC | 1));
    return 0;
}
