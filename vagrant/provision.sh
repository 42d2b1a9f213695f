#!/usr/bin/env bash
# Provision a confine test VM (see Vagrantfile). Usage: provision.sh ENTRY
# Runs as root inside the guest, with the repository at /confine. Safe to
# run again: every step checks first. The packages and the cgroup layout
# of each entry are those of the qemu images (scripts/vm-matrix.sh).
set -euo pipefail
entry="${1:?usage: provision.sh debian12|debian11|debian13|debian12-v1|ubuntu24}"
export DEBIAN_FRONTEND=noninteractive
source /confine/scripts/vm-matrix.sh

layout=v2
case "$entry" in
  ubuntu24) ;;
  *)
    vm_suite_of "$entry" >/dev/null || { echo "provision: unknown entry '$entry' (${vm_entries[*]} ubuntu24)" >&2; exit 2; }
    layout="$(vm_cgroup_of "$entry")"
    ;;
esac

apt-get update -qq
apt-get install -y -qq "${vm_packages[@]}" curl ca-certificates build-essential >/dev/null

# The cgroup layout this VM exists to test.
fs_type="$(stat -fc %T /sys/fs/cgroup)"
case "$layout" in
  v1)
    # systemd 256 and later refuse cgroup v1: this entry is Debian 12's.
    if ! grep -q 'systemd.unified_cgroup_hierarchy=0' /etc/default/grub; then
      sed -i 's/^GRUB_CMDLINE_LINUX="\(.*\)"/GRUB_CMDLINE_LINUX="\1 systemd.unified_cgroup_hierarchy=0"/' /etc/default/grub
      update-grub
    fi
    if [ "$fs_type" = "cgroup2fs" ]; then
      echo "provision: cgroup v1 is set for the next boot; run: vagrant reload $entry --provision" >&2
      exit 0
    fi
    ;;
  v2)
    if [ "$fs_type" != "cgroup2fs" ]; then
      echo "provision: expected cgroup v2 at /sys/fs/cgroup, found $fs_type" >&2
      exit 1
    fi
    # Left on deliberately: rootless confine must detect and report it.
    echo "provision: kernel.apparmor_restrict_unprivileged_userns=$(sysctl -n kernel.apparmor_restrict_unprivileged_userns 2>/dev/null || echo absent)"
    ;;
esac

# Build dependencies and Rust for the vagrant user, by the repository's own script.
sudo -u vagrant -H bash -c 'cd /confine && source scripts/setup.sh'
sudo -u vagrant -H bash -c 'cd /confine && export PATH="$HOME/.cargo/bin:$PATH" && cargo build --quiet'
host="$(sudo -u vagrant -H bash -c 'export PATH="$HOME/.cargo/bin:$PATH" && rustc -vV' | sed -n 's/^host: //p')"
/confine/target/"$host"/debug/confine doctor || true
echo "provision: ready ($entry, /sys/fs/cgroup is $fs_type). The root suites, as ./dev vm-test runs them:"
# Every suite is a module of the one test binary (tests/all.rs).
filters=()
for s in "${vm_suites[@]}"; do vm_entry_runs "$s" "$entry" && filters+=("suite::$s::"); done
echo "  vagrant ssh $entry -c 'cd /confine && sudo env CONFINE_REQUIRE_ISOLATION=1 \"PATH=\$HOME/.cargo/bin:\$PATH\" \"HOME=\$HOME\" cargo test --test all -- ${filters[*]}'"
