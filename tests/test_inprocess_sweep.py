"""``sweep --in-process``: a cell runs through cli/inprocess_run.py, which refuses a bad
config in one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import inprocess_run
from cli.sweep import command_for
from cli.sweep_plan import load_plan


def test_in_process_cells_run_inprocess_run_with_the_cells_overrides(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("name: g\nbase:\n  num-clients: 10\ngrid:\n  method: [ditto]\n")
    cell = load_plan(path).cells[0]
    cmd = command_for(cell, tmp_path / "c", None, {}, in_process=True)
    assert cmd[1:3] == ["-m", "cli.inprocess_run"]
    assert 'method="ditto"' in cmd and f'output-dir="{(tmp_path / "c").resolve()}"' in cmd


def test_inprocess_run_refuses_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert inprocess_run.main(["ditto-lambda=-1"]) == 2
    err = capsys.readouterr().err
    assert "ditto-lambda=-1.0" in err and err.count("\n") == 1
