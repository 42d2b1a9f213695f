#!/usr/bin/env bash
# Does a warm pool's refill slow the jobs that run meanwhile?
# Two CPU-bound jobs at once (one per core of a 2-core host), each timing a
# fixed shell loop inside its sandbox, run in-process (`--no-server`) while
# a `confine serve` keeps a warm pool, with and without "churn": a tmpfs
# mounted and unmounted on the host every 5 ms, each change of the host's
# mount table making the pool replace its sandboxes. Interleaved round by
# round; then the same with a server whose pool is off (warm = 0), to
# tell the churn's own cost from the refills'. Fresh copies of the
# release binary. Prints the in-job loop time's p50 and p90 (ms) per case.
# Usage: benches/refill.sh [ROUNDS]   (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
cargo build --release --quiet
bin="target/$(rustc -vV | sed -n 's/^host: //p')/release/confine"
dir=$(mktemp -d)
trap 'kill "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || true; kill "$(cat "$dir/churn.pid" 2>/dev/null)" 2>/dev/null || true; sleep 1; umount "$dir/churn" 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo" "$dir/churn"
cp "$bin" "$dir/confine-serve"
cp "$bin" "$dir/confine"
python3 - "$rounds" "$dir" <<'PY'
import json, os, statistics, subprocess, sys, time
rounds, d = int(sys.argv[1]), sys.argv[2]
LOOP = 'i=0; s=$(date +%s%N); while [ $i -lt 400000 ]; do i=$((i+1)); done; e=$(date +%s%N); echo $(( (e-s)/1000000 ))'
def serve(warm):
    conf = f"{d}/warm{warm}.toml"
    open(conf, "w").write(f'[runtime]\nenabled = true\n\n[store]\npath = "{d}/store{warm}"\n\n[sandbox]\nwarm = {warm}\n\n[[repos]]\nid = "b"\nroot = "{d}/repo"\n')
    p = subprocess.Popen([f"{d}/confine-serve", "--config", conf, "serve", "--http", "127.0.0.1:0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "CONFINE_LOG": "warn"})
    open(f"{d}/pid", "w").write(str(p.pid))
    while not os.path.exists(f"{d}/store{warm}/serve.sock"):
        time.sleep(0.05)
    time.sleep(2)  # the pool's first builds
    return p
def churn_start():
    sh = f'while :; do mount -t tmpfs none {d}/churn; sleep 0.005; umount {d}/churn; sleep 0.005; done'
    p = subprocess.Popen(["bash", "-c", sh])
    open(f"{d}/churn.pid", "w").write(str(p.pid))
    time.sleep(0.3)
    return p
def jobs():
    ps = [subprocess.Popen([f"{d}/confine", "run", "--no-server", "--", "sh", "-c", LOOP], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    return [int(p.communicate()[0]) for p in ps]
out = {}
for warm in (2, 0):
    srv = serve(warm)
    res = {"churn": [], "quiet": []}
    for r in range(rounds):
        for cond in ("churn", "quiet"):
            c = churn_start() if cond == "churn" else None
            res[cond] += jobs()
            if c:
                c.terminate(); c.wait()
                subprocess.run(["umount", f"{d}/churn"], stderr=subprocess.DEVNULL)
    srv.terminate(); srv.wait()
    q = lambda v, p: round(statistics.quantiles(v, n=100)[p - 1], 1)
    for cond, v in res.items():
        out[f"warm{warm}_{cond}"] = {"p50": q(v, 50), "p90": q(v, 90), "n": len(v)}
print(json.dumps(out))
PY
