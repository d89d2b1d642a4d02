"""What of Flower's streamed log reaches the user: colour only on a terminal, and none of the
warnings that are wrong for this project's runs."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

MISLEADING = (
    # flwr/simulation/app.py logs it on every simulation, whatever the federation's size;
    # the next line states the real size.
    "default simulated SuperNodes changed from 10 to 2",
)


def clean_line(line: str, colour: bool) -> str | None:
    """``line`` as it should be shown (ANSI codes removed unless ``colour``), or None to drop."""
    if any(text in line for text in MISLEADING):
        return None
    return line if colour else ANSI.sub("", line)
