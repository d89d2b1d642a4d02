"""The run-config defaults, read from the one place they are written (pyproject.toml).

In a checkout (and in a FAB, which carries the checkout's layout) that is the project's own
``pyproject.toml``; an installed wheel has no checkout, so ``setup.py`` copies the same file
into this package when it builds the wheel (package data, not a second source)."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

CHECKOUT_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
WHEEL_PYPROJECT = Path(__file__).resolve().parent / "pyproject.toml"


def defaults_file() -> Path:
    """The checkout's pyproject.toml, else the copy a wheel carries."""
    for path in (CHECKOUT_PYPROJECT, WHEEL_PYPROJECT):
        if path.is_file():
            return path
    raise FileNotFoundError(f"no run-config defaults: neither {CHECKOUT_PYPROJECT} nor "
                            f"{WHEEL_PYPROJECT} exists (a broken install: reinstall the wheel)")


@functools.lru_cache(maxsize=1)
def load_defaults() -> dict[str, Any]:
    """The run-config defaults as written in pyproject.toml (the single source)."""
    with defaults_file().open("rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])
