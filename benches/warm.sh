#!/usr/bin/env bash
# Warm sandboxes at a real MCP client (benches/warm.py): a governed
# runtime_execute on a server with `[sandbox] warm = WARM` (default 2)
# and on one with warm = 0, against bwrap and plain /bin/true, interleaved;
# then 4-way throughput. Both servers run fresh copies of the release
# binary, each with a store of its own; max_concurrent_jobs = 4.
# WARM_BASELINE=<a confine binary>: the second server runs that build
# (copied fresh) with the same pool instead of this one with none, to set
# two builds side by side; its rows are still named "cold".
# WARM_SEED=N: the seed of the rows' order (default: drawn; the output names it).
# Usage: benches/warm.sh [ROUNDS] [WARM]   (needs target/mcp-venv: ./dev test makes it)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-200}"
warm="${2:-2}"
py=target/mcp-venv/bin/python
[ -x "$py" ] || { echo "no $py: run ./dev test once (it sets up the MCP client venv)" >&2; exit 2; }
command -v bwrap >/dev/null || { echo "bwrap is not installed (apt-get install bubblewrap)" >&2; exit 2; }
cargo build --release --quiet
bin="target/$(rustc -vV | sed -n 's/^host: //p')/release/confine"
dir=$(mktemp -d)
# The servers' pids, in a file: `start` runs in a subshell.
trap 'for p in $(cat "$dir/pids" 2>/dev/null); do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo"
chmod 755 "$dir" "$dir/repo"
token=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
start() { # name warm
  cp "$bin" "$dir/confine-$1"
  cat > "$dir/$1.toml" <<TOML
[runtime]
enabled = true
max_concurrent_jobs = 4
max_queued = 64

[store]
path = "$dir/store-$1"

[sandbox]
warm = $2

[[repos]]
id = "bench"
root = "$dir/repo"
TOML
  CONFINE_TOKEN="$token" "$dir/confine-$1" --config "$dir/$1.toml" serve --http 127.0.0.1:0 > /dev/null 2> "$dir/$1.log" &
  echo $! >> "$dir/pids"
  for _ in $(seq 100); do grep -q "streamable HTTP at" "$dir/$1.log" && break; sleep 0.1; done
  grep -o "http://[0-9.:]*/mcp" "$dir/$1.log" | head -1
}
warm_url=$(start warm "$warm")
if [ -n "${WARM_BASELINE:-}" ]; then
  # Another build's server, with the same pool, in the "cold" rows.
  bin="$WARM_BASELINE"
  cold_url=$(start cold "$warm")
  second="baseline $WARM_BASELINE, warm = $warm"
else
  cold_url=$(start cold 0)
  second="cold"
fi
"$py" benches/warm.py "$warm_url" "$cold_url" --token "$token" --rounds "$rounds" --second "$second" ${WARM_SEED:+--seed "$WARM_SEED"}
