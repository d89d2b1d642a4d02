#!/usr/bin/env bash
# One-time setup: the Fashion-MNIST Debian package and the Python environment in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
[ -x .venv/bin/python ] || python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[dev]"
echo "setup done: .venv ready, Fashion-MNIST in /usr/share/datasets/fashion-mnist"
