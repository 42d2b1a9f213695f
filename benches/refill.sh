#!/usr/bin/env bash
# Does a warm pool's refill slow the jobs that run meanwhile?
# Two CPU-bound jobs at once (one per core of a 2-core host), each timing a
# fixed shell loop inside its sandbox, run in-process (`--no-server`),
# while a stream of short requests (`confine run -- /bin/true`, one after
# the other) goes to a `confine serve`: with its warm pool (warm = 2) each
# request takes a waiting sandbox and the pool builds the next one in the
# background; without (warm = 0) each request builds its own, on its own
# path. The same requests, the same sandboxes built: what differs is when
# and at what priority. Also each server with no stream ("quiet"), and
# with no stream but the host's mount table changing 4 times a second
# ("churn": each change replaces the waiting sandboxes).
# Interleaved round by round; fresh copies of the release binary. Prints
# the in-job loop time's p50 and p90 (ms) per case, the stream's
# requests per second, and the share of them that ran warm.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
if [ -z "${CONFINE_BIN:-}" ]; then
  cargo build --release --quiet
fi
bin="${CONFINE_BIN:-target/$(rustc -vV | sed -n 's/^host: //p')/release/confine}"
dir=$(mktemp -d)
trap 'kill "$(cat "$dir/pid" 2>/dev/null)" 2>/dev/null || true; kill "$(cat "$dir/churn.pid" 2>/dev/null)" 2>/dev/null || true; kill -- -"$(cat "$dir/mounts.pid" 2>/dev/null)" 2>/dev/null || true; sleep 1; umount "$dir/churn" 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo"
cp "$bin" "$dir/confine-serve"
cp "$bin" "$dir/confine"
python3 - "$rounds" "$dir" <<'PY'
import json, os, signal, statistics, subprocess, sys, time
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
    argv = [f"{d}/confine", "--config", f"{d}/warm{warm}.toml", "run", "--json-status", f"{d}/status.json", "--", "/bin/true"]
    # Counts the requests, and those that ran warm (read with builtins:
    # no process more per request).
    # USR1, when the jobs start: count from there.
    sh = ('n=0; w=0; trap \'n=0; w=0\' USR1; trap \'echo $n $w > ' + f"{d}/stream.count" + '; exit\' TERM; while :; do "$@" || exit 1; n=$((n+1)); '
          'IFS= read -r -d "" s < ' + f"{d}/status.json" + ' || true; [[ $s == *\'"warm": true\'* ]] && w=$((w+1)); done')
    p = subprocess.Popen(["bash", "-c", sh, "stream"] + argv, stdout=subprocess.DEVNULL)
    open(f"{d}/churn.pid", "w").write(str(p.pid))
    time.sleep(0.3)
    return p
def churn_start():
    # The host's mount table changes 4 times a second (a container
    # host's): each change replaces the pool's waiting sandboxes.
    os.makedirs(f"{d}/churn", exist_ok=True)
    sh = f'while :; do mount -t tmpfs churn {d}/churn && umount {d}/churn; sleep 0.25; done'
    p = subprocess.Popen(["bash", "-c", sh], start_new_session=True)
    open(f"{d}/mounts.pid", "w").write(str(p.pid))
    time.sleep(0.3)
    return p
def jobs():
    ps = [subprocess.Popen([f"{d}/confine", "run", "--no-server", "--", "sh", "-c", LOOP], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    return [int(p.communicate()[0]) for p in ps]
out = {}
for warm in (2, 0):
    srv = serve(warm)
    res = {"stream": [], "quiet": [], "churn": []}
    rate, warm_share = [], []
    for r in range(rounds):
        for cond in ("stream", "quiet", "churn"):
            c = stream_start(warm) if cond == "stream" else None
            if c:
                c.send_signal(signal.SIGUSR1)
            m = churn_start() if cond == "churn" else None
            t = time.monotonic()
            res[cond] += jobs()
            if m:
                os.killpg(m.pid, signal.SIGTERM); m.wait()
                os.unlink(f"{d}/mounts.pid")  # the pid may be reused
                subprocess.run(["umount", f"{d}/churn"], stderr=subprocess.DEVNULL)
            if c:
                c.terminate(); c.wait()
                os.unlink(f"{d}/churn.pid")
                n, w = map(int, open(f"{d}/stream.count").read().split())
                rate.append(n / (time.monotonic() - t))
                warm_share.append(w / max(n, 1))
    srv.terminate(); srv.wait()
    q = lambda v, p: round(statistics.quantiles(v, n=100)[p - 1], 1)
    for cond, v in res.items():
        out[f"warm{warm}_{cond}"] = {"p50": q(v, 50), "p90": q(v, 90), "n": len(v)}
    out[f"warm{warm}_requests_per_s"] = round(statistics.median(rate), 1)
    out[f"warm{warm}_ran_warm"] = round(statistics.median(warm_share), 3)
print(json.dumps(out))
PY
