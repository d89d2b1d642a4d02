"""Finding run directories under a folder and reading their rows as they are written: what
the fleet page (``fedinit.cli.dashboard``) and its Prometheus export
(``fedinit.cli.dashboard_metrics``)
both read, in a module of its own so neither imports the other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedinit.cli.run_files import json_objects
from server_app.status import STATUS_FILE

ROWS_FILE = "rounds.jsonl"
"""The rows a run appends as each round ends (``server_app.results``)."""
MARKERS = (STATUS_FILE, ROWS_FILE, "config.json")
"""A directory holding one of these is a run directory."""
MAX_DEPTH = 3
"""How deep under the given directory runs are looked for (a sweep: OUT/cells/<cell>/<run>)."""


def find_runs(root: Path) -> dict[str, Path]:
    """{key: run directory} under ``root`` ('' when root itself is a run)."""
    if any((root / m).is_file() for m in MARKERS):
        return {"": root}
    runs: dict[str, Path] = {}
    level = [root]
    for _ in range(MAX_DEPTH):
        nxt = []
        for d in level:
            try:
                subs = sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink()
                              and not p.name.startswith("."))
            except OSError:
                continue
            for p in subs:
                if any((p / m).is_file() for m in MARKERS):
                    runs[p.relative_to(root).as_posix()] = p
                else:
                    nxt.append(p)
        level = nxt
    return runs


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows written so far; a line being written (no newline yet) is skipped."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return json_objects(text.splitlines())
