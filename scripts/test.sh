#!/usr/bin/env bash
# The whole test suite: lint, fast tests, then the slow end-to-end tests (flwr run, deployment).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
# The fast suite on two workers (pytest-xdist): its tests share no ports or files.
.venv/bin/python -m pytest -n "${FAST_TEST_WORKERS:-2}" "$@"
.venv/bin/python -m pytest -m slow "$@"
