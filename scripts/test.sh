#!/usr/bin/env bash
# The whole test suite: lint, fast tests, then the slow end-to-end tests (flwr run, deployment).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
# The fast suite on two workers (pytest-xdist): its tests share no ports or files.
.venv/bin/python -m pytest -n "${FAST_TEST_WORKERS:-2}" "$@"
# The slow tests listen on fixed 127.0.0.1 ports, many inside Linux's ephemeral range
# (32768-60999), where any outgoing connection may take one as its local port: a deployment
# then fails its start with "ports [...] are in use". As root, reserve the tests' block
# (39000-44999, docs/faults.md) from the ephemeral range, keeping what was reserved before.
reserved=/proc/sys/net/ipv4/ip_local_reserved_ports
if [ "$(id -u)" -eq 0 ] && [ -w "$reserved" ]; then
  now="$(cat "$reserved")"
  case ",$now," in *",39000-44999,"*) ;; *) echo "${now:+$now,}39000-44999" > "$reserved" || true ;; esac
fi
# The slow suite on SLOW_TEST_WORKERS workers (default 3; 0 or 1: serially): it is mostly
# waiting (process starts, round timeouts, Docker: 21 min of CPU in 28 min of wall time on two
# workers), so three workers on two cores overlap the waits (docs/testing.md). Each
# module's tests join its xdist group (tests/slow_groups.py: modules sharing ports share a
# group, which loadgroup runs on one worker, one test at a time).
slow_workers="${SLOW_TEST_WORKERS:-3}"
most="$(.venv/bin/python -c 'from tests.slow_groups import MAX_WORKERS; print(MAX_WORKERS - 1)')"
case "$slow_workers" in
  ''|*[!0-9]*) echo "test.sh: SLOW_TEST_WORKERS=$slow_workers is not allowed: a whole number (0 or 1: serially)" >&2; exit 2 ;;
esac
if [ "$slow_workers" -gt "$most" ]; then
  echo "test.sh: SLOW_TEST_WORKERS=$slow_workers is not allowed: at most $most (the last local SuperLink port slot is the alone run's)" >&2; exit 2
fi
# The modules marked `alone` (wall-clock bounds that a busy neighbour breaks) run at the same
# time, in a pytest of their own at normal priority, while the slow workers and everything
# they start run at the lowest (nice 19): a CPU the alone tests want is theirs at once, and
# their waits (heartbeats, round timeouts) no longer add 7 minutes after the slow run.
# Docker's containers sit in Docker's own cgroup, which weighs as one normal process however
# many run. The alone run's log follows the slow run's.
alone_log="$(mktemp)"
FEDINIT_TEST_ALONE_RUN=1 .venv/bin/python -m pytest -m "slow and alone" --durations=10 "$@" \
  > "$alone_log" 2>&1 &
alone_pid=$!
trap 'kill "$alone_pid" 2>/dev/null || true; rm -f "$alone_log"' EXIT
# Each slow run ends with its ten longest tests (where CI's time goes, in its log).
slow_rc=0
if [ "$slow_workers" -gt 1 ]; then
  nice -n 19 .venv/bin/python -m pytest -m "slow and not alone" -n "$slow_workers" --dist loadgroup --durations=10 "$@" || slow_rc=$?
else
  nice -n 19 .venv/bin/python -m pytest -m "slow and not alone" --durations=10 "$@" || slow_rc=$?
fi
alone_rc=0
wait "$alone_pid" || alone_rc=$?
echo "---- the alone tests (run beside the slow ones) ----"
cat "$alone_log"
if [ "$slow_rc" -ne 0 ] || [ "$alone_rc" -ne 0 ]; then
  echo "test.sh: slow run exit $slow_rc, alone run exit $alone_rc" >&2
  exit 1
fi
