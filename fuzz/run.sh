#!/usr/bin/env bash
# fuzz/run.sh SECONDS [TARGET...]: run each fuzz target (all, when none is
# named) for SECONDS with libFuzzer, one after the other.
#
# Each target feeds its input through one of confine's real decoders
# (src/fuzz.rs says which). A target's corpus grows in fuzz/corpus/<target>
# (not in git), seeded from fuzz/seeds/<target>. A crash, an invariant that
# fails, a leak or a hang is a finding: its input lands in
# fuzz/artifacts/<target>/, the run goes on with the next target, and the
# exit status is 1. Copy the input to fuzz/regressions/<target>/ with the
# fix: `cargo test` replays every file there (fuzz::tests).
#
# Needs the nightly toolchain and cargo-fuzz; both are installed when
# missing. The summary (runs, executions per second, coverage, findings
# per target) is printed and written to target/fuzz/summary.json.
# FUZZ_JOBS: targets run at once (default 1).
# FUZZ_BUILD: cargo-fuzz build flags (default `-O`, AddressSanitizer on).
# CI's smoke uses `-O --sanitizer none --codegen-units 16`: a build in a
# fraction of the time, coverage-guided all the same, without ASan's
# checks (confine's decoders are safe Rust; the campaigns keep ASan).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: fuzz/run.sh SECONDS [TARGET...]" >&2; exit 2; }
shift
all=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' Cargo.toml | grep -v '^confine-fuzz$')
targets=("$@")
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<<"$(echo $all)"
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$all" || { echo "fuzz: unknown target '$t' (targets: $(echo $all))" >&2; exit 2; }
done
export PATH="$HOME/.cargo/bin:$PATH"
# Known exit-time leaks of dependencies (lsan.supp says which and why).
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
say() { echo "fuzz: $*" >&2; }
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  say "installing the nightly toolchain (libFuzzer's instrumentation needs it)"
  rustup toolchain install nightly --profile minimal >/dev/null
fi
if ! command -v cargo-fuzz >/dev/null; then
  say "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
read -r -a build <<<"${FUZZ_BUILD:--O}"
say "building the targets (cargo fuzz build ${build[*]}; the first build takes a few minutes)"
cargo +nightly fuzz build "${build[@]}" >/dev/null
out=../target/fuzz
mkdir -p "$out"
run_one() {
  local t="$1" log="$out/$1.log"
  mkdir -p "corpus/$t" "artifacts/$t"
  local before
  before=$(find "artifacts/$t" -type f | wc -l)
  say "$t: ${seconds}s"
  # -timeout: one input may take this long (an MCP session is the slowest);
  # -rss_limit_mb: a target that grows past it is a finding.
  set +e
  cargo +nightly fuzz run "${build[@]}" "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1
  local rc=$?
  set -e
  # The targets' scratch stores (src/fuzz.rs: scratch_root) of fuzzers that ended.
  for d in /dev/shm/confine-fuzz-* "${TMPDIR:-/tmp}"/confine-fuzz-*; do
    [ -d "$d" ] && ! kill -0 "${d##*-}" 2>/dev/null && rm -rf "$d"
  done
  local after
  after=$(find "artifacts/$t" -type f | wc -l)
  python3 - "$t" "$log" "$rc" "$((after - before))" "$seconds" "corpus/$t" >"$out/$t.json" <<'PY'
import json, os, re, sys
t, log, rc, found, seconds, corpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
text = open(log, errors="replace").read()
stat = lambda k: int(m.group(1)) if (m := re.search(r"^stat::%s:\s+(\d+)" % k, text, re.M)) else None
cov = re.findall(r"\bcov: (\d+)", text)
print(json.dumps({"target": t, "seconds": seconds, "runs": stat("number_of_executed_units"),
  "execsPerSecond": stat("average_exec_per_sec"), "peakRssMb": stat("peak_rss_mb"),
  "coverage": int(cov[-1]) if cov else None, "corpus": len(os.listdir(corpus)),
  "findings": found, "exit": rc}))
PY
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("fuzz: %(target)s: %(runs)s runs, %(execsPerSecond)s/s, coverage %(coverage)s, corpus %(corpus)s, findings %(findings)s" % s)' "$out/$t.json" >&2
  if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
    say "$t: FINDING (exit $rc): see $log and fuzz/artifacts/$t/"
    return 1
  fi
}
failed=0
jobs="${FUZZ_JOBS:-1}"
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
python3 - "$out" "${targets[@]}" <<'PY'
import json, sys
out, targets = sys.argv[1], sys.argv[2:]
rows = [json.load(open("%s/%s.json" % (out, t))) for t in targets]
json.dump(rows, open("%s/summary.json" % out, "w"), indent=1)
PY
exit $failed
