#!/usr/bin/env bash
# The whole test suite: lint, fast tests, then the slow end-to-end tests (flwr run, deployment).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
# The fast suite on three workers (pytest-xdist; its tests share no ports or files): on two
# cores a third worker fills the waits of subprocesses and collection (docs/testing.md).
.venv/bin/python -m pytest -rs -n "${FAST_TEST_WORKERS:-3}" "$@"
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
# module's tests join its xdist group (tests/slow_groups.py: modules sharing ports or Docker
# share a group, which loadgroup runs on one worker, one test at a time). Then the modules
# marked `alone` (wall-clock bounds a busy neighbour breaks).
slow_workers="${SLOW_TEST_WORKERS:-3}"
case "$slow_workers" in
  ''|*[!0-9]*) echo "test.sh: SLOW_TEST_WORKERS=$slow_workers is not allowed: a whole number (0 or 1: serially)" >&2; exit 2 ;;
esac
# Each slow run ends with its ten longest tests (where CI's time goes, in its log).
if [ "$slow_workers" -gt 1 ]; then
  .venv/bin/python -m pytest -rs -m "slow and not alone" -n "$slow_workers" --dist loadgroup --durations=10 "$@"
else
  .venv/bin/python -m pytest -rs -m "slow and not alone" --durations=10 "$@"
fi
# The alone modules, two at a time: each mostly waits (heartbeats, round timeouts), so one
# neighbour of its kind leaves its bounds intact; then the solitary ones by themselves.
.venv/bin/python -m pytest -rs -m "slow and alone and not solitary" -n 2 --dist loadgroup --durations=10 "$@"
.venv/bin/python -m pytest -rs -m "slow and solitary" --durations=10 "$@"
