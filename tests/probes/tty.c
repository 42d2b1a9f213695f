/* TIOCSTI and TIOCLINUX on the controlling tty (stdin, a pty the test made):
 * plain, and with high bits set in the command, which the kernel ignores
 * (CVE-2019-10063). Other terminal ioctls must keep working. */
#include "probe.h"
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

int main(void) {
    report("setsid", setsid());
    report("tiocsctty", ioctl(0, TIOCSCTTY, 0));
    struct termios t;
    report("tcgetattr", tcgetattr(0, &t));
    struct winsize ws;
    report("tiocgwinsz", ioctl(0, TIOCGWINSZ, &ws));
    char c = '#';
    report("tiocsti", ioctl(0, TIOCSTI, &c));
    report("tiocsti_high", ioctl(0, 0x100000000UL | TIOCSTI, &c));
    char sub = 2; /* TIOCL_SETSEL */
    report("tioclinux", ioctl(0, TIOCLINUX, &sub));
    report("tioclinux_high", ioctl(0, 0xffffffff00000000UL | TIOCLINUX, &sub));
    return 0;
}
