#!/usr/bin/env bash
# ./dev vm-test [ENTRY...]: run confine's root integration suites on the
# kernels users run, each in a Debian guest booted with qemu.
#
# Entries: debian12 (kernel 6.1, pure cgroup v2, landlock ABI 2),
# debian11 (5.10: no landlock, no cgroup.kill), debian13 (6.12), and
# debian12-v1 (6.1 booted with the cgroup v1 hierarchies only). No entry
# named: all of them.
#
# Each guest image is built once from Debian's packages (debootstrap) and
# cached in ~/.cache/confine/vm (CONFINE_VM_CACHE), which clean clones
# share; a run boots it with -snapshot, so the image stays as built. The
# checkout is shared in read-only at its own path (9p), and the guest runs
# its own links to the static binaries built here: the integration test
# binary (`cargo test --no-run --test all`) and confine. Results come back in
# target/vm/results/<entry>/: the console log, each suite's output, the
# guest's doctor and the outcome of a job there (status.json), and
# summary.json (each test's outcome). A guest that does not finish within
# CONFINE_VM_LIMIT seconds (default 1800) is killed; its console log is
# kept. Running every entry writes docs/vm-matrix.md (scripts/vm-report.py).
#
# `--images-only` builds the images and boots nothing.
# CONFINE_VM_SUITES: the integration suites to run (tests/suite/<name>),
# default "sandbox limits security warm" (warm not on debian11: see
# scripts/vm-matrix.sh). CONFINE_VM_FILTER: instead of the
# suites, run only the tests whose name contains it (the test runner's
# filter, over every suite), to chase one failure.
# CONFINE_VM_SCRIPT: a script of the checkout to run in the guest as root
# before the suites; its output lands in results/<entry>/script.txt.
# CONFINE_VM_PROFILE: confine's build, release (default) or debug.
# CONFINE_VM_JOBS: guests at once (default: the host's cores). KVM is tried first and TCG used when /dev/kvm is
# missing or the guest does not come up within CONFINE_VM_KVM_WAIT seconds
# (default 60); CONFINE_VM_TCG_THREAD: single (default) or multi.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
cache="${CONFINE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/confine/vm}"
limit="${CONFINE_VM_LIMIT:-1800}"
kvm_wait="${CONFINE_VM_KVM_WAIT:-60}"
profile="${CONFINE_VM_PROFILE:-release}"
jobs="${CONFINE_VM_JOBS:-$(nproc)}"
tcg_thread="${CONFINE_VM_TCG_THREAD:-single}"
source scripts/vm-matrix.sh
read -r -a suites <<<"${CONFINE_VM_SUITES:-${vm_suites[*]}}"
all=("${vm_entries[@]}")
images_only=0
if [ "${1:-}" = --images-only ]; then
  images_only=1
  shift
fi
entries=("$@")
[ ${#entries[@]} -gt 0 ] || entries=("${all[@]}")

say() { echo "vm-test: $*" >&2; }
die() { say "$*"; exit 1; }

suite_of() { vm_suite_of "$1" || die "unknown entry '$1' (entries: ${all[*]})"; }
cgroup_of() { vm_cgroup_of "$1"; }

[ "$(id -u)" = 0 ] || die "run as root: building an image (debootstrap) and its ext4 need it"
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v mke2fs >/dev/null || missing+=(e2fsprogs)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The guest's init, in the image: mounts what a shell needs and the
# results share, and hands over to the run's own script there (below), so
# that changing the run never means rebuilding an image.
boot_init() {
  cat <<'INIT'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
modprobe 9pnet_virtio 2>/dev/null; modprobe 9p 2>/dev/null
mkdir -p /results
mount -t 9p -o trans=virtio,version=9p2000.L results /results
exec /bin/sh /results/init.sh
INIT
}

# The run, in the guest: what a booted system has (the cgroup layout of
# the entry, loopback up), the checkout at its own path, the plan's
# suites, then power off.
guest_run() {
  echo "v1_controllers='${vm_v1_controllers[*]}'"
  printf 'filter=%q\nscript=%q\n' "${CONFINE_VM_FILTER:-}" "${CONFINE_VM_SCRIPT:+$(realpath "$CONFINE_VM_SCRIPT")}"
  cat <<'RUN'
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
# /tmp stays on the root file system, as on Debian 12 (tmpfs could not be
# idmapped before 6.3).
chmod 1777 /tmp
arg() { sed -n "s/.*confine\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
hostname confine-vm
# A booted system's loopback is up; the tests' servers listen there.
ip link set lo up
if [ "$(arg cgroup)" = v1 ]; then
  mount -t tmpfs cgroup /sys/fs/cgroup
  for c in $v1_controllers; do
    mkdir -p "/sys/fs/cgroup/$c" && mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"
  done
else
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
fi
repo="$(arg repo)"
mkdir -p "$repo"
mount -t 9p -o trans=virtio,version=9p2000.L,ro repo "$repo"
# The checkout is read-only; the tests' scratch directories
# (CARGO_TARGET_TMPDIR: target/<triple>/tmp) are not.
for d in "$repo"/target/*/tmp "$repo"/target/tmp; do
  [ -d "$d" ] && mount -t tmpfs tmpfs "$d"
done
echo "vm-guest: kernel $(uname -r), cgroup $(stat -fc %T /sys/fs/cgroup)" > /results/guest.txt
cat /sys/kernel/security/lsm >> /results/guest.txt 2>/dev/null
bin="$(cat /results/bin)"
"$bin" doctor > /results/doctor.txt 2>&1
echo "doctor exit $?" >> /results/doctor.txt
"$bin" doctor --json --no-smoke > /results/doctor.json 2>/dev/null
# What a job really gets here (the report's cells): a full run, else the
# degraded one this kernel allows, and which it took.
if "$bin" run --json-status /results/status.json -- /bin/true > /results/run.txt 2>&1; then
  echo '{"degraded": false}' > /results/degraded.json
else
  "$bin" run --allow-degraded --json-status /results/status.json -- /bin/true >> /results/run.txt 2>&1
  echo '{"degraded": true}' > /results/degraded.json
fi
# Emulated (TCG), a guest is about ten times slower than the machine: the
# tests' few bounds on time stretch by as much (tests/common: slow()).
slow=1
grep -q 'confine.accel=tcg' /proc/cmdline && slow=10
if [ -n "$script" ]; then
  echo "vm-guest: script $script" > /dev/console
  ( cd "$repo" && CONFINE_BIN="$(cat /results/bin)" timeout 600 sh "$script" ) > /results/script.txt 2>&1
  echo "exit $?" >> /results/script.txt
fi
while read -r name bin; do
  echo "vm-guest: suite $name" > /dev/console
  ( cd "$repo" && CONFINE_REQUIRE_ISOLATION=1 CONFINE_TEST_BIN="$(cat /results/bin)" CONFINE_TEST_SLOW="$slow" \
      timeout 1500 "$bin" --test-threads=2 "${filter:-suite::$name::}" ) </dev/null > "/results/suite-$name.txt" 2>&1
  echo "exit $?" >> "/results/suite-$name.txt"
done < /results/plan
sync
echo "vm-guest: done" > /dev/console
echo o > /proc/sysrq-trigger
sleep 10
RUN
}

# The guest's kernel and what the suites need (scripts/vm-matrix.sh).
packages="linux-image-amd64,$(IFS=,; echo "${vm_packages[*]}")"
image_dir() { echo "$cache/images/$1-$( (echo "$packages"; boot_init) | cksum | cut -d' ' -f1)"; }

# Build (once) the image of a Debian suite: kernel, initrd, ext4 root.
image() {
  local suite="$1" dir
  dir="$(image_dir "$1")"
  if [ -f "$dir/rootfs.ext4" ] && [ -f "$dir/vmlinuz" ] && [ -f "$dir/initrd" ]; then
    return
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  say "building the $suite image (debootstrap; a few minutes, once)"
  debootstrap --variant=minbase --include="$packages" \
    "$suite" "$dir/tree" http://deb.debian.org/debian >"$dir/debootstrap.log" 2>&1 ||
    die "debootstrap of $suite failed: see $dir/debootstrap.log"
  cp "$(ls "$dir"/tree/boot/vmlinuz-* | head -n 1)" "$dir/vmlinuz"
  cp "$(ls "$dir"/tree/boot/initrd.img-* | head -n 1)" "$dir/initrd"
  boot_init >"$dir/tree/sbin/confine-vm-init"
  chmod 755 "$dir/tree/sbin/confine-vm-init"
  mke2fs -q -t ext4 -d "$dir/tree" "$dir/rootfs.ext4.tmp" 4G
  mv "$dir/rootfs.ext4.tmp" "$dir/rootfs.ext4"
  rm -rf "$dir/tree"
}

if [ "$images_only" = 1 ]; then
  for entry in "${entries[@]}"; do image "$(suite_of "$entry")"; done
  say "images ready in $cache/images"
  exit 0
fi

# The static binaries: each suite's test binary, as `./dev test` builds
# them (debug), and confine, which they run, in the release profile by
# default: a debug confine is several times slower in an emulated guest.
target="$(rustc -vV | sed -n 's/^host: //p')"
case "$profile" in
  debug) profile_flag=() ;;
  release) profile_flag=(--release) ;;
  *) die "CONFINE_VM_PROFILE is debug or release, not '$profile'" ;;
esac
# CONFINE_VM_TARGET_DIR: where confine's own build goes (default: the
# checkout's target/); .ci/run builds it there while the host's suites run.
vm_target_dir="${CONFINE_VM_TARGET_DIR:-$repo/target}"
say "building confine ($profile) and the test binaries (static)"
CARGO_TARGET_DIR="$vm_target_dir" cargo build "${profile_flag[@]}" --quiet --bin confine
# The commit the binaries are built from, for the report.
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
plan="$(mktemp)"
# Every suite is a module of the one test binary (tests/all.rs): the plan
# runs it once per suite, on that suite's tests (or once, filtered).
exe="$(cargo test --no-run --message-format=json --test all 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["executable"])
')"
[ -n "$exe" ] || die "the test binary (tests/all.rs) was not built"
if [ -n "${CONFINE_VM_FILTER:-}" ]; then
  echo "filtered $exe" >"$plan"
else
  for name in "${suites[@]}"; do
    [ -e "tests/suite/$name.rs" ] || [ -e "tests/suite/$name/mod.rs" ] || die "no suite tests/suite/$name"
    echo "$name $exe"
  done >"$plan"
fi

boot() { # entry accel results-dir
  local entry="$1" accel="$2" out="$3" suite dir
  suite="$(suite_of "$entry")"
  dir="$(image_dir "$suite")"
  # TCG runs both vCPUs on one host thread: with a thread each, a vCPU
  # livelocked while the other patched kernel text (the v1 freezer's
  # static key), and the guest hung.
  local accel_args=(-accel "tcg,thread=$tcg_thread" -cpu max)
  [ "$accel" = kvm ] && accel_args=(-accel kvm -cpu host)
  timeout "$4" qemu-system-x86_64 "${accel_args[@]}" -m 4096 -smp 2 -nographic -no-reboot \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd" -snapshot \
    -append "root=/dev/vda rw console=ttyS0 panic=-1 init=/sbin/confine-vm-init confine.cgroup=$(cgroup_of "$entry") confine.accel=$accel confine.repo=$repo" \
    -drive "file=$dir/rootfs.ext4,if=virtio,format=raw" \
    -virtfs "local,path=$repo,mount_tag=repo,security_model=none,readonly=on" \
    -virtfs "local,path=$out,mount_tag=results,security_model=none" \
    >"$out/console.log" 2>&1 </dev/null
}

# One entry: its own links to the binaries, a boot (KVM, else TCG), and
# its summary. The exit status says whether every suite passed.
run_entry() {
  local entry="$1" out started accel qemu
  out="$repo/target/vm/results/$entry"
  rm -rf "$out" && mkdir -p "$out"
  # The guest runs its own links to the binaries: a build here while it
  # runs makes new files and leaves these as they were.
  mkdir -p "$out/bin.d"
  take() { ln -f "$1" "$out/bin.d/$2" 2>/dev/null || cp "$1" "$out/bin.d/$2"; }
  take "$vm_target_dir/$target/$profile/confine" confine
  echo /results/bin.d/confine >"$out/bin"
  while read -r name exe; do
    vm_entry_runs "$name" "$entry" || continue
    take "$exe" "$name"
    echo "$name /results/bin.d/$name"
  done <"$plan" >"$out/plan"
  guest_run >"$out/init.sh"
  started=$(date +%s)
  accel=tcg
  if [ -w /dev/kvm ]; then
    # KVM hangs at boot on some hosts (nested virtualisation): a guest
    # that has not mounted its shares within the wait is retried on TCG.
    boot "$entry" kvm "$out" "$limit" 2>/dev/null &
    qemu=$!
    for _ in $(seq "$kvm_wait"); do
      [ -f "$out/guest.txt" ] && break
      kill -0 "$qemu" 2>/dev/null || break
      sleep 1
    done
    if [ -f "$out/guest.txt" ]; then
      accel=kvm
      wait "$qemu" || true
    else
      kill "$qemu" 2>/dev/null || true
      wait "$qemu" 2>/dev/null || true
      mv "$out/console.log" "$out/console-kvm.log"
      say "$entry: no guest on KVM (console-kvm.log: $(tail -n 1 "$out/console-kvm.log")); TCG instead"
    fi
  fi
  if [ "$accel" = tcg ]; then
    say "$entry: booting on TCG (at most ${limit}s)"
    boot "$entry" tcg "$out" "$limit" || true
  fi
  python3 - "$out" "$entry" "$accel" "$(($(date +%s) - started))" "$commit" <<'PY'
import json, os, re, sys
out, entry, accel, seconds, commit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
summary = {"entry": entry, "accel": accel, "seconds": seconds, "commit": commit, "suites": {}}
guest = os.path.join(out, "guest.txt")
summary["guest"] = open(guest).read().strip() if os.path.exists(guest) else None
degraded = os.path.join(out, "degraded.json")
summary["degraded"] = json.load(open(degraded))["degraded"] if os.path.exists(degraded) else None
for line in open(os.path.join(out, "plan")):
    name = line.split()[0]
    path = os.path.join(out, "suite-%s.txt" % name)
    if not os.path.exists(path):
        summary["suites"][name] = {"ran": False}
        continue
    text = open(path, errors="replace").read()
    # Names as within the suite: the binary's own start with suite::<name>::.
    prefix = "suite::" if name == "filtered" else "suite::%s::" % name
    tests = {t[len(prefix):] if t.startswith(prefix) else t: r
             for t, r in re.findall(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", text, re.M)}
    result = re.findall(r"^test result: .*$", text, re.M)
    exit_code = re.findall(r"^exit (\d+)$", text, re.M)
    summary["suites"][name] = {"ran": True, "result": result[-1] if result else None,
                               "exit": int(exit_code[-1]) if exit_code else None, "tests": tests}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("vm-test: %s (%s, %d s): %s" % (entry, accel, seconds, summary["guest"] or "the guest never came up"))
for name, s in summary["suites"].items():
    print("  %-12s %s" % (name, s.get("result") or ("did not run" if not s["ran"] else "no result (hung or killed)")))
    for t, r in sorted(s.get("tests", {}).items()):
        if r == "FAILED":
            print("    FAILED %s" % t)
PY
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["suites"] and all(v.get("exit")==0 for v in s["suites"].values()) else 1)' "$out/summary.json"
}

# Images first (two entries may share one), then the guests, CONFINE_VM_JOBS
# at a time (default: one per host core, as each TCG guest runs on one).
for entry in "${entries[@]}"; do image "$(suite_of "$entry")"; done
failed=0
running=()
for entry in "${entries[@]}"; do
  if [ ${#running[@]} -ge "$jobs" ]; then
    wait "${running[0]}" || failed=1
    running=("${running[@]:1}")
  fi
  run_entry "$entry" &
  running+=($!)
done
for pid in "${running[@]}"; do wait "$pid" || failed=1; done
rm -f "$plan"
# The whole matrix ran, unfiltered: its report is the one in docs/.
if [ ${#entries[@]} -eq ${#all[@]} ] && [ -z "${CONFINE_VM_FILTER:-}" ]; then
  python3 scripts/vm-report.py "$repo/target/vm/results" docs/vm-matrix.md
else
  python3 scripts/vm-report.py "$repo/target/vm/results" "$repo/target/vm/report.md"
fi
exit "$failed"
