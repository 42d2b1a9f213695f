# The VM test matrix: its entries and what a guest needs. Sourced by
# scripts/vm-test.sh (qemu guests built by debootstrap) and by
# vagrant/provision.sh (the same entries as Vagrant boxes), so both
# provision a guest alike.

# Entries, each: a Debian suite and the cgroup layout it is booted with.
vm_entries=(debian12 debian11 debian13 debian12-v1)

vm_suite_of() {
  case "$1" in
    debian11) echo bullseye ;;
    debian12 | debian12-v1) echo bookworm ;;
    debian13) echo trixie ;;
    *) return 1 ;;
  esac
}

vm_cgroup_of() { case "$1" in *-v1) echo v1 ;; *) echo v2 ;; esac; }

# What the root suites need in a guest besides a kernel: git (the
# workspace protections' tests), iproute2 (loopback up), python3 (the
# tests' probes), procps and util-linux (ps, mount, unshare), kmod (9p).
vm_packages=(kmod procps util-linux iproute2 git python3)

# The v1 hierarchies an entry booted with cgroup v1 mounts (systemd's
# own v1 layout has the same controllers).
vm_v1_controllers=(cpu,cpuacct memory pids freezer devices blkio)

# The integration suites that run as root in a guest.
vm_suites=(sandbox limits security warm)

# Whether suite $1 runs on entry $2. No sandbox is built warm in degraded
# mode, which a kernel without landlock needs (debian11): the warm suite
# would find none. Its test of degraded mode runs on the other entries,
# and that path asks nothing of the kernel.
vm_entry_runs() {
  case "$1:$2" in
    warm:debian11) return 1 ;;
    *) return 0 ;;
  esac
}
