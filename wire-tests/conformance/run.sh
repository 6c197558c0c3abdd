#!/usr/bin/env bash
# Driver conformance: runs the MongoDB drivers' unified-format specification suites, as shipped in
# pymongo's source distribution (downloaded from PyPI at test time, hash-pinned, run unmodified),
# against `sluice demo` (the router in front of embedded shards) and against one `sluice shard`,
# both started with --enable-test-commands as drivers' CI starts mongos and mongod.
#
#   wire-tests/conformance/run.sh [SUITE...]        # or SUITES=crud,retryable
#
# Suites: crud, retryable (retryable writes), sessions, transactions (default: all four).
# Environment: TARGETS=demo,shard (default both), SLUICE_BIN (default target/release/sluice;
# `make conformance` builds it), RESULTS_DIR (default conformance-results/), SUITE_TIMEOUT
# seconds per suite (default 3600), PYTEST_ARGS (extra pytest arguments, e.g. "-k sort"),
# EXPECTED_FAILURES (default wire-tests/conformance/expected-failures.txt; empty for none): the
# tests known to fail, each with its reason.
#
# Each suite runs against a freshly started server. The results directory receives per target
# and suite the junit XML, the pytest log, the server log and the ids of the tests that did not
# pass, plus each target's start-up check and summary.json; a table is printed at the end. The
# exit status is 0 only if the suites' set-up completed on every target and every test that was
# not skipped passed or is in the expected-failure list — and every listed test that ran still
# fails (a fixed test must leave the list).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$root/target/release/sluice}
RESULTS_DIR=${RESULTS_DIR:-$root/conformance-results}
WORK_DIR=${CONFORMANCE_WORK_DIR:-$root/target/conformance}
VENV=${CONFORMANCE_VENV:-$here/.venv}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-3600}
TARGETS=${TARGETS:-demo,shard}
EXPECTED_FAILURES=${EXPECTED_FAILURES-$here/expected-failures.txt}
PYMONGO=pymongo-4.20.1

die() { echo "conformance: $*" >&2; exit 2; }

# --- which suites and targets
requested=${*:-${SUITES:-crud,retryable,sessions,transactions}}
suites=()
for s in ${requested//,/ }; do
  case "$s" in
    crud) suites+=(crud) ;;
    retryable|retryable_writes|retryable-writes) suites+=(retryable_writes) ;;
    sessions) suites+=(sessions) ;;
    transactions) suites+=(transactions) ;;
    *) die "unknown suite '$s' (crud, retryable, sessions, transactions)" ;;
  esac
done
targets=()
for t in ${TARGETS//,/ }; do
  case "$t" in
    demo|shard) targets+=("$t") ;;
    *) die "unknown target '$t' (demo, shard)" ;;
  esac
done
[ ${#suites[@]} -gt 0 ] && [ ${#targets[@]} -gt 0 ] || die "nothing selected"

[ -x "$SLUICE_BIN" ] || die "$SLUICE_BIN is missing; run 'cargo build --release' (make conformance does)"

# --- the test runner's environment and the driver's source distribution
echo "== installing the test runner (venv $VENV) and downloading $PYMONGO's source distribution"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || die "cannot create a Python venv"
fi
py="$VENV/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt" \
  || die "cannot install $here/requirements.txt"
mkdir -p "$WORK_DIR/sdist"
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
  --require-hashes -r "$here/pymongo-sdist.txt" -d "$WORK_DIR/sdist" \
  || die "cannot download $PYMONGO's source distribution"
# Extracted afresh every run: the suites execute exactly the published code.
src="$WORK_DIR/src"
rm -rf "$src" && mkdir -p "$src"
tar -xzf "$WORK_DIR/sdist/$PYMONGO.tar.gz" -C "$src" || die "cannot extract $PYMONGO.tar.gz"
sdist="$src/$PYMONGO"

rm -rf "$RESULTS_DIR" && mkdir -p "$RESULTS_DIR"
# Absolute: pytest runs from the extracted source tree.
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)

# --- servers
server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=""
  fi
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# A free port whose next port is free too: the demo's two routers listen on both, as the
# drivers' own CI runs two mongoses on consecutive ports (pymongo's test set-up looks for a
# second one on the next port, and tests with useMultipleMongoses use both).
free_port_pair() { "$py" -c '
import socket
for _ in range(100):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1))
    except OSError:
        continue
    finally:
        a.close(); b.close()
    print(p); break
'; }

# start_server TARGET LOG: starts the target on a free loopback port, sets server_pid and port.
start_server() {
  local target=$1 log=$2
  case "$target" in
    demo) port=$(free_port_pair)
      "$SLUICE_BIN" demo --routers 2 --port "$port" --metrics-listen "" --enable-test-commands >"$log" 2>&1 & ;;
    shard) port=$(free_port)
      "$SLUICE_BIN" shard --port "$port" --set-name shard0 --metrics-listen "" --enable-test-commands >"$log" 2>&1 & ;;
  esac
  server_pid=$!
  for _ in $(seq 1 300); do
    if grep -q "listening on 127.0.0.1:$port" "$log"; then
      [ "$target" != demo ] || grep -q "listening on 127.0.0.1:$((port + 1))" "$log" && return 0
    fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; server_pid=""; return 1; }
    sleep 0.1
  done
  cat "$log" >&2
  return 1
}

# --- the suites
read -r -a extra_args <<<"${PYTEST_ARGS:-}"
for target in "${targets[@]}"; do
  for i in "${!suites[@]}"; do
    suite=${suites[$i]}
    base="$RESULTS_DIR/$target-$suite"
    if ! start_server "$target" "$base.server.log"; then
      echo "conformance: sluice $target did not start" >&2
      echo '{"exit_code": -1, "seconds": 0, "server_failed": true}' >"$base.run.json"
      continue
    fi
    if [ "$i" -eq 0 ]; then
      echo "== $target: the suites' own set-up against 127.0.0.1:$port"
      (cd "$sdist" && DB_IP=127.0.0.1 DB_PORT=$port PYTHONPATH="$sdist" \
        "$py" "$here/preflight.py") >"$RESULTS_DIR/$target.startup.json" 2>"$RESULTS_DIR/$target.startup.log"
    fi
    echo "== $target: test/test_${suite}_unified.py (log: $base.log)"
    start=$(date +%s)
    (cd "$sdist" && DB_IP=127.0.0.1 DB_PORT=$port timeout -k 30 "$SUITE_TIMEOUT" \
      "$py" -m pytest "test/test_${suite}_unified.py" -p no:cacheprovider -q \
      -o log_cli_level=WARNING --junitxml="$base.xml" "${extra_args[@]}") >"$base.log" 2>&1
    rc=$?
    timed_out=false
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && timed_out=true
    echo "{\"exit_code\": $rc, \"seconds\": $(($(date +%s) - start)), \"timed_out\": $timed_out}" >"$base.run.json"
    tail -n 1 "$base.log"
    stop_server
  done
done

"$py" "$here/report.py" "$RESULTS_DIR" "$(IFS=,; echo "${targets[*]}")" "$(IFS=,; echo "${suites[*]}")" "$EXPECTED_FAILURES"
