"""A run's results as the commands read them: from the files, never from log text.

The ServerApp (``server_app/results.py``) makes one directory per run under ``output-dir``,
writes ``config.json`` when the run starts, appends a line to ``rounds.jsonl`` as each round
ends and writes ``summary.json`` when the run finishes. A script that passes ``output-dir``
finds its run as the directory there whose file was written after the run was started: the
directory name (method, beta, data, seed and a time stamp) need not be predicted, and a log
line's wording or colouring cannot break it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

CLOCK_SLACK = 1.0
"""Seconds a file's mtime may trail ``time.time()`` (coarse file-system clocks)."""


def run_dirs_since(out_dir: Path, since: float, name: str = "config.json") -> list[Path]:
    """Run directories under ``out_dir`` whose ``name`` was written at or after ``since``."""
    if not out_dir.is_dir():
        return []
    found = []
    for d in out_dir.iterdir():
        try:
            fresh = d.is_dir() and (d / name).stat().st_mtime >= since - CLOCK_SLACK
        except OSError:
            continue
        if fresh and not d.name.startswith("."):
            found.append(d)
    return sorted(found)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, torn or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def json_objects(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The JSON objects among ``lines`` (a rows file's); a line that is not one (torn by a
    writer, or not an object) is skipped."""
    found = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def run_of(config: Mapping[str, Any], since: float) -> tuple[Path | None, list[Path]]:
    """(the directory of the run of ``config`` started after ``since``, all candidates).

    ``config`` is the run's full config (``RunConfig.to_dict()``), as the server writes it to
    config.json. A resumed run writes into its resume-dir; any other into a new directory
    under output-dir, found by its config.json written after ``since`` and equal to
    ``config`` (so another run writing there at the same time is not taken for it). The
    directory is None unless exactly one candidate is found.
    """
    if config.get("resume-dir"):
        dirs = [Path(str(config["resume-dir"])).resolve()]
    else:
        dirs = run_dirs_since(Path(str(config["output-dir"])).resolve(), since)
    found = [d for d in dirs if read_json(d / "config.json") == dict(config)]
    return (found[0] if len(found) == 1 else None), found


class RoundsTail:
    """New rows of a run's ``rounds.jsonl`` as the server appends them.

    The run directory is the one under ``out_dir`` started after ``since``; until it exists
    ``poll`` returns nothing. Only complete lines are read, each round once, in order.
    """

    def __init__(self, out_dir: Path, since: float) -> None:
        self.out_dir, self.since = out_dir, since
        self.run_dir: Path | None = None
        self._offset = 0
        self._last_round = 0

    def poll(self) -> list[dict[str, Any]]:
        if self.run_dir is None:
            dirs = run_dirs_since(self.out_dir, self.since)
            if len(dirs) != 1:
                return []
            self.run_dir = dirs[0]
        try:
            with (self.run_dir / "rounds.jsonl").open("rb") as f:
                if f.seek(0, 2) < self._offset:  # rewritten (a resumed run starts it anew)
                    self._offset = 0
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        rows = []
        for row in json_objects(complete.splitlines()):
            if isinstance(row.get("round"), int) and row["round"] > self._last_round:
                self._last_round = row["round"]
                rows.append(row)
        return rows


class RoundsFollower:
    """Calls ``on_row`` for each new row of a ``RoundsTail`` from a thread, until ``stop``."""

    def __init__(self, tail: RoundsTail, on_row: Callable[[dict[str, Any]], None],
                 interval: float = 0.5) -> None:
        self.tail, self.on_row, self.interval = tail, on_row, interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RoundsFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._done.wait(self.interval):
            self._emit()

    def _emit(self) -> None:
        for row in self.tail.poll():
            self.on_row(row)

    def stop(self) -> None:
        """Stop polling, then report what the last poll had not seen yet."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self._emit()
