"""The run-config defaults, read from the one place they are written (pyproject.toml)."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@functools.lru_cache(maxsize=1)
def load_defaults() -> dict[str, Any]:
    """The run-config defaults as written in pyproject.toml (the single source)."""
    with PYPROJECT.open("rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])
