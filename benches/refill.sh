#!/usr/bin/env bash
# Does a warm pool's refill slow the jobs that run meanwhile?
# Two CPU-bound jobs at once (one per core of a 2-core host), each timing a
# fixed shell loop inside its sandbox, run in-process (`--no-server`),
# while a stream of short requests (`confine run -- /bin/true`, one after
# the other) goes to a `confine serve`: with its warm pool (warm = 2) each
# request takes a waiting sandbox and the pool builds the next one in the
# background; without (warm = 0) each request builds its own, on its own
# path. The same requests, the same sandboxes built: what differs is when
# and at what priority. Also each server with no stream ("quiet").
# Interleaved round by round; fresh copies of the release binary. Prints
# the in-job loop time's p50 and p90 (ms) per case, and the stream's
# requests per second.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
if [ -z "${CONFINE_BIN:-}" ]; then
  cargo build --release --quiet
fi
bin="${CONFINE_BIN:-target/$(rustc -vV | sed -n 's/^host: //p')/release/confine}"
dir=$(mktemp -d)
trap 'kill "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || true; kill "$(cat "$dir/churn.pid" 2>/dev/null)" 2>/dev/null || true; sleep 1; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo"
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
def stream_start(warm):
    argv = [f"{d}/confine", "--config", f"{d}/warm{warm}.toml", "run", "--", "/bin/true"]
    sh = 'n=0; trap \'echo $n > ' + f"{d}/stream.count" + '; exit\' TERM; while :; do "$@" || exit 1; n=$((n+1)); done'
    p = subprocess.Popen(["bash", "-c", sh, "stream"] + argv, stdout=subprocess.DEVNULL)
    open(f"{d}/churn.pid", "w").write(str(p.pid))
    time.sleep(0.3)
    return p
def jobs():
    ps = [subprocess.Popen([f"{d}/confine", "run", "--no-server", "--", "sh", "-c", LOOP], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    return [int(p.communicate()[0]) for p in ps]
out = {}
for warm in (2, 0):
    srv = serve(warm)
    res = {"stream": [], "quiet": []}
    rate = []
    for r in range(rounds):
        for cond in ("stream", "quiet"):
            c = stream_start(warm) if cond == "stream" else None
            t = time.monotonic()
            res[cond] += jobs()
            if c:
                c.terminate(); c.wait()
                rate.append(int(open(f"{d}/stream.count").read()) / (time.monotonic() - t))
    srv.terminate(); srv.wait()
    q = lambda v, p: round(statistics.quantiles(v, n=100)[p - 1], 1)
    for cond, v in res.items():
        out[f"warm{warm}_{cond}"] = {"p50": q(v, 50), "p90": q(v, 90), "n": len(v)}
    out[f"warm{warm}_requests_per_s"] = round(statistics.median(rate), 1)
print(json.dumps(out))
PY
