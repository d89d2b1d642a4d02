#!/usr/bin/env bash
# Set up, idempotently: the Fashion-MNIST Debian package, the Python environment in .venv
# (reinstalled only when pyproject.toml or setup.py changed) and Flower's offline settings for plain
# `flwr run .` (.venv/bin/activate, .flwr/config.toml). A second run changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
[ -x .venv/bin/python ] || python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
stamp=.venv/.fedinit-installed
want="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
.venv/bin/python -m fedinit.scripts.flower_setup
echo "setup done: .venv ready, Fashion-MNIST in /usr/share/datasets/fashion-mnist;" \
  "for plain \`flwr run .\`: source .venv/bin/activate"
