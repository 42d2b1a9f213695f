#!/usr/bin/env bash
# 200 concurrent runtime_execute calls over streamable HTTP against a
# release `confine serve` with max_concurrent_jobs = 4; reports calls/s,
# latency, the server's peak and settled RSS, and the audit record count.
# Usage: benches/mcp_load.sh [CALLS]   (needs target/mcp-venv: ./dev test makes it)
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-200}"
py=target/mcp-venv/bin/python
[ -x "$py" ] || { echo "no $py: run ./dev test once (it sets up the MCP client venv)" >&2; exit 2; }
cargo build --release --quiet
# .cargo/config.toml builds for the host's target tuple.
bin="target/$(rustc -vV | sed -n 's/^host: //p')/release/confine"
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/repo"
cat > "$dir/confine.toml" <<TOML
[runtime]
enabled = true
max_concurrent_jobs = 4
max_queued = 64

[store]
path = "$dir/store"

[[repos]]
id = "load"
root = "$dir/repo"
TOML
# The server always requires a bearer token: give it one.
token=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
CONFINE_TOKEN="$token" "$bin" --config "$dir/confine.toml" serve --http 127.0.0.1:0 2> "$dir/log" &
pid=$!
for _ in $(seq 100); do grep -q "streamable HTTP at" "$dir/log" && break; sleep 0.1; done
url=$(grep -o "http://[0-9.:]*/mcp" "$dir/log" | head -1)
peak=0
( while kill -0 $pid 2>/dev/null; do
    r=$(awk '/VmRSS/{print $2}' /proc/$pid/status 2>/dev/null || echo 0); echo "$r"; sleep 0.05
  done ) > "$dir/rss" &
sampler=$!
"$py" benches/mcp_load.py "$url" --calls "$calls" --token "$token"
sleep 2
settled=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
kill $sampler 2>/dev/null || true
peak=$(sort -n "$dir/rss" | tail -1)
kill -TERM $pid; wait $pid || true
records=$("$bin" --config "$dir/confine.toml" audit export --jsonl | grep -c . || true)
echo "{\"serverPeakRssMiB\": $((peak / 1024)), \"serverSettledRssMiB\": $((settled / 1024)), \"auditRecords\": $records}"
