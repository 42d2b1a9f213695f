#!/usr/bin/env bash
# `confine run -- /bin/true` through a running `confine serve` (its warm
# sandboxes; the command's streams passed to the job), against the same
# run in-process (`--no-server`), and `confine exec` of shell `true`
# through that server against the same exec in-process (on a store of its
# own, which no server holds), with bwrap (the flags of benches/warm.py)
# and plain /bin/true: interleaved, round by round, on fresh copies of the
# release binary. Prints p50 and p90 in ms of each, and how many of the
# server's runs were warm.
# Usage: benches/run_server.sh [ROUNDS]   (as root: warm sandboxes need it)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-200}"
command -v bwrap >/dev/null || { echo "bwrap is not installed (apt-get install bubblewrap)" >&2; exit 2; }
cargo build --release --quiet
bin="target/$(rustc -vV | sed -n 's/^host: //p')/release/confine"
dir=$(mktemp -d)
trap 'kill "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || true; sleep 1; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo"
cp "$bin" "$dir/confine-serve"
cp "$bin" "$dir/confine"
for name in confine alone; do
  cat > "$dir/$name.toml" <<TOML
[runtime]
enabled = true

[store]
path = "$dir/store-$name"

[[repos]]
id = "bench"
root = "$dir/repo"
TOML
done
CONFINE_LOG=warn "$dir/confine-serve" --config "$dir/confine.toml" serve --http 127.0.0.1:0 >"$dir/serve.log" 2>&1 &
echo $! >"$dir/pid"
for _ in $(seq 100); do [ -S "$dir/store-confine/serve.sock" ] && break; sleep 0.1; done
[ -S "$dir/store-confine/serve.sock" ] || { echo "the server did not start: $(cat "$dir/serve.log")" >&2; exit 1; }
python3 - "$rounds" "$dir" <<'PY'
import json, statistics, subprocess, sys, time
rounds, d = int(sys.argv[1]), sys.argv[2]
conf = [f"{d}/confine", "--config", f"{d}/confine.toml", "run"]
bwrap = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
         "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
         "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true"]
exe = lambda c: [f"{d}/confine", "--config", f"{d}/{c}.toml", "exec", "--repo-id", "bench", "--runtime", "shell", "--code", "true"]
cases = {
    "server": conf + ["--json-status", f"{d}/status.json", "--", "/bin/true"],
    "in-process": conf + ["--no-server", "--", "/bin/true"],
    "exec-server": exe("confine"),
    "exec-in-process": exe("alone"),
    "bwrap": bwrap,
    "plain": ["/bin/true"],
}
lat = {k: [] for k in cases}
warm = 0
for _ in range(10):  # the pool learns the run's shape
    subprocess.run(cases["server"], check=True)
for r in range(rounds):
    for k, argv in cases.items():
        t = time.perf_counter()
        subprocess.run(argv, check=True, stderr=subprocess.DEVNULL if k.startswith("exec") else None)
        lat[k].append((time.perf_counter() - t) * 1000)
        if k == "server":
            warm += json.load(open(f"{d}/status.json"))["layers"].get("warm", False)
q = lambda v, p: statistics.quantiles(v, n=100)[p - 1]
out = {k: {"p50": round(q(v, 50), 2), "p90": round(q(v, 90), 2)} for k, v in lat.items()}
out["server_warm"] = f"{warm}/{rounds}"
out["server_over_bwrap_p50"] = round(out["server"]["p50"] / out["bwrap"]["p50"], 2)
out["in_process_over_bwrap_p50"] = round(out["in-process"]["p50"] / out["bwrap"]["p50"], 2)
out["exec_server_over_in_process_p50"] = round(out["exec-server"]["p50"] / out["exec-in-process"]["p50"], 2)
print(json.dumps(out))
PY
