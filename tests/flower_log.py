"""Flower's log lines of a test: its ``flwr`` logger does not propagate to pytest's, so
``caplog`` misses them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def flower_lines(level: int = logging.INFO) -> Iterator[list[str]]:
    """The messages Flower's logger emits at ``level`` or above while inside."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(level=level)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
