#!/usr/bin/env bash
# CPU a request costs the host, warm against cold: two servers on fresh
# copies of the release binary, one with `[sandbox] warm = 2` and one with
# warm = 0, each on a store of its own; blocks of PER sequential
# `confine run -- /bin/true` through each, interleaved block by block; the
# host's busy ticks (/proc/stat: all but idle and iowait) over each block,
# a request's share in ms. The client's own Python is in both. Run on an
# otherwise idle host.
# Usage: benches/cpu_per_request.sh [BLOCKS] [PER]   (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
blocks="${1:-6}"
per="${2:-150}"
if [ -z "${CONFINE_BIN:-}" ]; then
  cargo build --release --quiet
fi
bin="${CONFINE_BIN:-target/$(rustc -vV | sed -n 's/^host: //p')/release/confine}"
dir=$(mktemp -d)
trap 'kill $(cat "$dir"/pid.* 2>/dev/null) 2>/dev/null || true; sleep 1; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo"; chmod 755 "$dir" "$dir/repo"
for w in 2 0; do
  cp "$bin" "$dir/confine-serve$w"
  printf '[runtime]\nenabled = true\n[store]\npath = "%s"\n[sandbox]\nwarm = %s\n[[repos]]\nid = "b"\nroot = "%s"\n' "$dir/store$w" "$w" "$dir/repo" > "$dir/w$w.toml"
  CONFINE_LOG=warn "$dir/confine-serve$w" --config "$dir/w$w.toml" serve --http 127.0.0.1:0 >/dev/null 2>&1 &
  echo $! > "$dir/pid.$w"
  for _ in $(seq 100); do [ -S "$dir/store$w/serve.sock" ] && break; sleep 0.1; done
done
cp "$bin" "$dir/confine"
sleep 2
D=$dir BLOCKS=$blocks PER=$per python3 - <<'PY'
import os, subprocess, statistics, time, json
d, blocks, per = os.environ["D"], int(os.environ["BLOCKS"]), int(os.environ["PER"])
hz = os.sysconf("SC_CLK_TCK")
def busy():
    v = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return sum(v) - v[3] - v[4]
res = {2: [], 0: []}
warm_seen = {2: 0, 0: 0}
for b in range(blocks):
    for w in ((2, 0) if b % 2 == 0 else (0, 2)):
        argv = [f"{d}/confine", "--config", f"{d}/w{w}.toml", "run", "--json-status", f"{d}/st.json", "--", "/bin/true"]
        for _ in range(5): subprocess.run(argv, check=True)
        time.sleep(0.5)
        b0, t0 = busy(), time.monotonic()
        for _ in range(per):
            subprocess.run(argv, check=True)
            warm_seen[w] += '"warm": true' in open(f"{d}/st.json").read()
        time.sleep(0.3)  # the last refill
        b1 = busy()
        res[w].append((b1 - b0) / hz * 1000 / per)
print(json.dumps({f"warm{w}_cpu_ms_per_request": [round(x, 2) for x in v] for w, v in res.items()}),
      json.dumps({f"warm{w}_median": round(statistics.median(v), 2) for w, v in res.items()}), warm_seen)
PY
