#!/usr/bin/env bash
# Install what confine's build and tests need, and only what is missing.
# Debian/Ubuntu. Safe to run again: every step checks first.
set -euo pipefail

need_apt=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# libc6-dev and libseccomp-dev hold the archives the static binary links.
for pkg in libseccomp-dev libc6-dev pkg-config gcc g++ make bubblewrap git perl; do
  have_pkg "$pkg" || need_apt+=("$pkg")
done
# Runtimes the tests exercise: take the ones on PATH, install the rest.
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
# npm installs the MCP Inspector below (Debian's nodejs comes without it).
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
# A venv needs ensurepip; Debian's system python has it in python3-venv.
if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then need_apt+=(python3-venv); fi
# The network allowlist's tests run curl and the system python's pip
# through the proxy (tests/suite/network.rs).
have_pkg curl || need_apt+=(curl)
if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then need_apt+=(python3-pip); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: no Rust toolchain; installing rustup (stable)" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
# .cargo/config.toml builds for `host-tuple`, which cargo knows since 1.92
# (Cargo.toml's rust-version).
cargo_minor=$(cargo --version | sed -n 's/^cargo 1\.\([0-9]*\).*/\1/p')
if [ -n "$cargo_minor" ] && [ "$cargo_minor" -lt 92 ]; then
  if command -v rustup >/dev/null 2>&1; then
    echo "setup: cargo 1.$cargo_minor is older than 1.92; updating the stable toolchain" >&2
    rustup update stable --no-self-update >/dev/null
  else
    echo "setup: cargo 1.$cargo_minor is older than 1.92, which confine needs; install Rust 1.92+ (https://rustup.rs)" >&2
    exit 1
  fi
fi

# The official MCP Python SDK, for the end-to-end tests, in a venv of our own.
MCP_VERSION=2.3.0
venv="$(dirname "${BASH_SOURCE[0]}")/../target/mcp-venv"
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('mcp') == '$MCP_VERSION'" >/dev/null 2>&1; then
  echo "setup: installing the MCP Python SDK ($MCP_VERSION) in target/mcp-venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "mcp==$MCP_VERSION"
fi

# The MCP Inspector's CLI (npm), for the end-to-end tests, pinned, in a
# prefix of our own.
INSPECTOR_VERSION=0.15.0
inspector="$(dirname "${BASH_SOURCE[0]}")/../target/mcp-inspector"
if ! grep -q "\"version\": \"$INSPECTOR_VERSION\"" "$inspector/node_modules/@modelcontextprotocol/inspector/package.json" 2>/dev/null; then
  echo "setup: installing the MCP Inspector ($INSPECTOR_VERSION) in target/mcp-inspector" >&2
  npm install --prefix "$inspector" --no-audit --no-fund --loglevel=error "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" >/dev/null
fi
