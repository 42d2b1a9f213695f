/* Mount a tmpfs, and the rest of the mount family. The bad-pointer mount
 * tells the filter from the kernel: the kernel answers EFAULT before it
 * checks privileges, the filter answers EPERM before the kernel runs. */
#include "probe.h"
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    report("mount_tmpfs", mount("tmpfs", "/tmp", "tmpfs", 0, "size=1m"));
    report("mount_badptr", mount("tmpfs", (const char *)1, "tmpfs", 0, 0));
    report("umount2", umount2((const char *)1, 0));
    report("pivot_root", syscall(SYS_pivot_root, (const char *)1, (const char *)1));
    report("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
    report("open_tree", syscall(SYS_open_tree, -100, "/tmp", 1 /* OPEN_TREE_CLONE */));
    return 0;
}
