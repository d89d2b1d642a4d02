#!/usr/bin/env bash
# The whole test suite: lint, fast tests, then the slow end-to-end tests (flwr run, deployment).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
.venv/bin/python -m pytest -m slow "$@"
