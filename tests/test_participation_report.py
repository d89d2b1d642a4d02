"""fedinit/scripts/participation_report.py on a run directory written by hand: each client's
participations and the accuracy means by participation count, computed here independently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedinit.scripts.participation_report import by_participation, main

TRAINED = {1: [0, 1], 2: [1, 2], 3: [1], 4: [0, 3]}
"""Round -> clients-trained; round 4 comes after the last personalized evaluation (round 3)."""
OWN = {0: 0.5, 1: 0.8, 2: 0.4, 3: 0.2}


def write_run(run_dir: Path) -> None:
    run_dir.mkdir()
    rows = [{"round": r, "clients-trained": c} for r, c in TRAINED.items()]
    (run_dir / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["round,partition-id,num-test,acc-global,acc-finetuned,acc-own"]
    lines += [f"1,{cid},10,0.1,0.1,0.1" for cid in OWN]  # an earlier evaluation: ignored
    lines += [f"3,{cid},10,{0.9 - own},0.6,{own}" for cid, own in OWN.items()]
    (run_dir / "personal_clients.csv").write_text("\n".join(lines) + "\n")


def test_participations_and_the_own_accuracy_by_count(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    write_run(run)
    counts, means = by_participation(run)
    # rounds 1-3 only: client 0 once, 1 three times, 2 once, 3 never (round 4 is later)
    assert dict(counts) == {0: 1, 1: 3, 2: 1, 3: 0}
    assert means[1]["own"] == pytest.approx(100 * (0.5 + 0.4) / 2)
    assert means[3]["own"] == pytest.approx(80.0)
    assert means[0]["own"] == pytest.approx(20.0)
    assert means[1]["global"] == pytest.approx(100 * (0.4 + 0.5) / 2)
    assert means[0]["finetuned"] == pytest.approx(60.0)
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "4 clients trained 0 / 1.2 / 3 times" in out
    assert "  1 | 2 | 45.0 | 60.0 | 45.0" in out


def test_a_run_without_a_personalized_evaluation_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ValueError, match="no personal_clients.csv"):
        by_participation(run)
