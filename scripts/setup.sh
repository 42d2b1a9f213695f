#!/usr/bin/env bash
# Install what confine's build and tests need, and only what is missing.
# Debian/Ubuntu. Safe to run again: every step checks first.
set -euo pipefail

need_apt=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in libseccomp-dev pkg-config gcc make bubblewrap python3-venv git; do
  have_pkg "$pkg" || need_apt+=("$pkg")
done
# python3-venv is only needed when the python3 on PATH can't make a venv itself.
if python3 -m venv --help >/dev/null 2>&1; then
  need_apt=("${need_apt[@]/python3-venv}")
fi
need_apt=($(printf '%s\n' "${need_apt[@]}" | grep -v '^$' || true))
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
