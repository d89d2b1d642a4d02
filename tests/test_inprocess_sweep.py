"""``sweep --in-process``: a cell runs through fedinit/cli/inprocess_run.py, which refuses a bad
config in one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedinit.cli import inprocess_run
from fedinit.cli.sweep import command_for
from fedinit.cli.sweep_plan import load_plan


def test_in_process_cells_run_inprocess_run_with_the_cells_overrides(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("name: g\nbase:\n  num-clients: 10\ngrid:\n  method: [ditto]\n")
    cell = load_plan(path).cells[0]
    cmd = command_for(cell, tmp_path / "c", None, {}, in_process=True)
    assert cmd[1:3] == ["-m", "fedinit.cli.inprocess_run"]
    assert 'method="ditto"' in cmd and f'output-dir="{(tmp_path / "c").resolve()}"' in cmd


def test_inprocess_run_refuses_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert inprocess_run.main(["ditto-lambda=-1"]) == 2
    err = capsys.readouterr().err
    assert "ditto-lambda=-1.0" in err and err.count("\n") == 1


def test_inprocess_runs_log_without_colour_codes_off_a_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep captures each cell's output into its sweep.log (a file): Flower's console
    handler must not write ANSI colour codes there."""
    import logging
    import sys

    from flwr.supercore.logger import FLOWER_LOGGER, ConsoleHandler

    handlers = [h for h in FLOWER_LOGGER.handlers if isinstance(h, ConsoleHandler)]
    assert handlers
    for h in handlers:  # restored after the test: the handler is process-wide
        monkeypatch.setattr(h, "colored", True)
        monkeypatch.setattr(h, "timestamps", False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    lines: list[str] = []

    def fake_run(grid: object, cfg: object) -> None:
        record = logging.LogRecord("flwr", logging.INFO, __file__, 1, "round 1", None, None)
        lines.extend(h.format(record) for h in handlers)

    monkeypatch.setattr(inprocess_run, "run_experiment", fake_run)
    monkeypatch.setattr(inprocess_run, "InProcessGrid", lambda n, raw: None)
    assert inprocess_run.main(["num-clients=2"]) == 0
    assert lines and all("\033[" not in line and "round 1" in line for line in lines), lines
