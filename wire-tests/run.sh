#!/usr/bin/env bash
# Runs every stock-client suite against Sluice: pymongo (pytest), the Node.js driver
# (node --test) and mongosh scripts. Installs what they need first (a Python venv with
# wire-tests/requirements.txt, npm packages from wire-tests/package-lock.json) and fails loudly
# if a client cannot be installed. Expects the sluice binary at target/debug/sluice (or
# $SLUICE_BIN); `make test` builds it first.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
export SLUICE_BIN=${SLUICE_BIN:-$root/target/debug/sluice}
cd "$here"

if [ ! -x "$SLUICE_BIN" ]; then
  echo "wire-tests: $SLUICE_BIN is missing; run 'cargo build' first" >&2
  exit 1
fi

echo "== installing stock clients"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
if [ ! -f node_modules/.package-lock.json ] || ! cmp -s package-lock.json node_modules/.package-lock.json 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
fi
.venv/bin/python -c 'import pymongo, snappy, pytest, beanie; from pymongo.compression_support import _have_zstd; assert _have_zstd(), "zstd support missing"' \
  || { echo "wire-tests: pymongo (with snappy and zstd support) or beanie is not installed" >&2; exit 1; }
node -e 'require("mongodb"); require("snappy")' \
  || { echo "wire-tests: the Node.js driver is not installed" >&2; exit 1; }
MONGOSH="$here/node_modules/.bin/mongosh"
"$MONGOSH" --version >/dev/null \
  || { echo "wire-tests: mongosh is not installed" >&2; exit 1; }

failed=0

echo "== pymongo"
.venv/bin/python -m pytest -q python || failed=1

echo "== Node.js driver"
node --test node/ || failed=1

echo "== mongosh"
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
demo_log=$(mktemp)
"$SLUICE_BIN" demo --port "$port" >"$demo_log" 2>&1 &
demo_pid=$!
trap 'kill "$demo_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do
  if grep -q "Connection string" "$demo_log"; then break; fi
  if ! kill -0 "$demo_pid" 2>/dev/null; then cat "$demo_log"; echo "sluice demo exited" >&2; exit 1; fi
  sleep 0.05
done
uri="mongodb://127.0.0.1:$port/"
grep -q "mongodb://127.0.0.1:$port/" "$demo_log" || { cat "$demo_log"; echo "demo did not print its connection string" >&2; failed=1; }

for script in mongosh/*.js; do
  echo "-- $script"
  timeout 120 "$MONGOSH" --quiet "$uri" --file "$script" || failed=1
done

echo "-- interactive session: prompt and start-up banners"
session=$(echo 'db.runCommand({ping: 1}).ok' | timeout 120 "$MONGOSH" "$uri" 2>&1) || failed=1
if grep -q "\[direct: mongos\] test> 1" <<<"$session" \
  && ! grep -qiE "startup warnings|MongoServerError|MongoNetworkError|error:" <<<"$session"; then
  echo "ok - prompt shows a mongos and start-up printed no error banner"
  echo "mongosh prompt: 1 passed, 0 failed"
else
  echo "$session"
  echo "mongosh prompt: 0 passed, 1 failed"
  failed=1
fi

kill -TERM "$demo_pid"
wait "$demo_pid" || true
trap - EXIT

if [ "$failed" -ne 0 ]; then
  echo "wire-tests: FAILED" >&2
  exit 1
fi
echo "wire-tests: all suites passed"
