#!/usr/bin/env bash
# ./dev field: a real project's own test suite, run bare, under bwrap and
# under confine, in that order, on the same checkout; the counts must match.
#
# The project is requests (its sdist ships its tests, which start local
# HTTP servers on 127.0.0.1 through pytest-httpbin). Its test
# dependencies are pinned in scripts/field/requests-requirements.txt and
# installed with pip --target into the checkout, for the system python
# (/usr/bin/python3, which every sandbox sees), run with -S so that the
# system's own site-packages cannot shadow them. The few tests that need
# the internet fail in all three: the counts, not a clean pass, are the
# measure. Prints one line per run and a markdown row for docs/field.md;
# exits 1 when the counts differ.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS_VERSION=2.32.3
work="${FIELD_DIR:-$PWD/target/field}"
ws="$work/requests-$REQUESTS_VERSION"
confine="${CONFINE:-}"
if [ -z "$confine" ]; then
  echo "field: building confine (release)" >&2
  cargo build --release --quiet --bin confine
  confine="$PWD/target/$(rustc -vV | sed -n 's/^host: //p')/release/confine"
fi
command -v bwrap >/dev/null || { echo "field: bwrap is missing (apt-get install bubblewrap)" >&2; exit 1; }
mkdir -p "$work"
if [ ! -f "$ws/.field-ready" ]; then
  echo "field: fetching requests $REQUESTS_VERSION and its test dependencies from PyPI" >&2
  rm -rf "$ws" "$work/sdist"
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "requests==$REQUESTS_VERSION" -d "$work/sdist"
  tar xzf "$work/sdist/requests-$REQUESTS_VERSION.tar.gz" -C "$work"
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$ws/site" -r scripts/field/requests-requirements.txt
  cat >"$ws/field_run.py" <<'PY'
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "site"), os.path.join(here, "src")]
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", os.path.join(here, "tests")]))
PY
  touch "$ws/.field-ready"
fi

# The summary line pytest ends with, reduced to its counts.
counts() { grep -E '^[0-9]+ (passed|failed)|^=* ?[0-9]+ (passed|failed)' | tail -n 1 | sed -E 's/ in [0-9.]+s.*//; s/^=+ //'; }

run_one() {
  local name="$1"; shift
  local log="$work/$name.log" start end
  start=$(date +%s)
  (cd "$ws" && "$@") >"$log" 2>&1 || true
  end=$(date +%s)
  local got
  got=$(counts <"$log")
  printf '%s\t%s\t%ss\n' "$name" "${got:-no summary (see $log)}" "$((end - start))" >&2
  printf '%s' "$got"
}

echo "field: requests $REQUESTS_VERSION's suite, three ways (about 80 s each)" >&2
bare=$(run_one bare /usr/bin/python3 -S field_run.py)
bwrap=$(run_one bwrap bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc \
  --tmpfs /tmp --bind "$ws" "$ws" --chdir "$ws" /usr/bin/python3 -S field_run.py)
confined=$(run_one confine "$confine" run --workspace "$ws" --rw --timeout 15m -- /usr/bin/python3 -S field_run.py)
echo "| $(date -u +%F) | requests $REQUESTS_VERSION | $bare | $bwrap | $confined |"
if [ -z "$bare" ] || [ "$bare" != "$bwrap" ] || [ "$bare" != "$confined" ]; then
  echo "field: the counts differ (logs in $work)" >&2
  exit 1
fi
echo "field: the same counts bare, under bwrap and under confine" >&2
