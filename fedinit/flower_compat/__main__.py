"""``python -m fedinit.flower_compat``: print the patch table (docs/flower_compat.md holds it) and
whether each guard passes against the installed flwr."""

from __future__ import annotations

import sys

from fedinit.flower_compat.guard import why_not
from fedinit.flower_compat.registry import PATCHES, table_markdown

if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        verdicts = {p.name: why_not(p.name) for p in PATCHES}
        for name, reason in verdicts.items():
            print(f"{name}: {'ok' if reason is None else reason}")
        sys.exit(1 if any(verdicts.values()) else 0)
    print(table_markdown(), end="")
