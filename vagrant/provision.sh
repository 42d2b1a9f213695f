#!/usr/bin/env bash
# Provision a confine test VM (see Vagrantfile). Usage: provision.sh v1|v2
# Runs as root inside the guest. Safe to run again: every step checks first.
set -euo pipefail
layout="${1:?usage: provision.sh v1|v2}"
export DEBIAN_FRONTEND=noninteractive

apt-get update -qq
apt-get install -y -qq curl ca-certificates build-essential >/dev/null

# The cgroup layout this VM exists to test.
fs_type="$(stat -fc %T /sys/fs/cgroup)"
case "$layout" in
  v1)
    if ! grep -q 'systemd.unified_cgroup_hierarchy=0' /etc/default/grub; then
      sed -i 's/^GRUB_CMDLINE_LINUX="\(.*\)"/GRUB_CMDLINE_LINUX="\1 systemd.unified_cgroup_hierarchy=0"/' /etc/default/grub
      update-grub
    fi
    if [ "$fs_type" = "cgroup2fs" ]; then
      echo "provision: cgroup v1 is set for the next boot; run: vagrant reload cgroup-v1 --provision" >&2
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
  *)
    echo "usage: provision.sh v1|v2" >&2
    exit 2
    ;;
esac

# Build dependencies and Rust for the vagrant user, by the repository's own script.
sudo -u vagrant -H bash -c 'cd /confine && source scripts/setup.sh'
sudo -u vagrant -H bash -c 'cd /confine && export PATH="$HOME/.cargo/bin:$PATH" && cargo build --release --quiet'
/confine/target/"$(sudo -u vagrant -H bash -c 'export PATH="$HOME/.cargo/bin:$PATH" && rustc -vV' | sed -n 's/^host: //p')"/release/confine doctor || true
echo "provision: ready ($layout, /sys/fs/cgroup is $fs_type); run the suite with: cd /confine && sudo env \"PATH=\$HOME/.cargo/bin:\$PATH\" \"HOME=\$HOME\" bash .ci/run"
