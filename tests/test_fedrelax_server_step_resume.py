"""FedRelax's server steps (``relax-server-step``) across a kill: the stepped clients' models
are written to ``server-models/`` like uploads, so a server killed after round 3's training (or
after round 3 wrote its copies but before its checkpoint) and resumed ends as the uninterrupted
run, model, state and every server copy bit for bit (the checks of
``tests/test_resume_and_faults.py``, run on this key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import test_resume_and_faults as faults

pytestmark = [pytest.mark.usefixtures("quick_runs"), pytest.mark.slow]

STEP = {"beta": 0.0, "graph-refresh-every": 2, "graph-k": 1, "relax-server-step": 0.5}
"""2 of 4 clients a round: after round 1 the other 2 are stepped on the knn graph."""


@pytest.mark.parametrize("rule", ["mean", "moves"])
def test_killed_after_training_resumes_bit_identical(tmp_path: Path, rule: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(faults.PER_CLIENT, "fedrelax-step", {**STEP, "relax-server-rule": rule})
    faults.test_killed_and_resumed_run_ends_bit_identical(tmp_path, "fedrelax-step")


@pytest.mark.parametrize("rule", ["mean", "moves"])
def test_killed_before_the_checkpoint_resumes_bit_identical(
        tmp_path: Path, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(faults.PER_CLIENT, "fedrelax-step", {**STEP, "relax-server-rule": rule})
    faults.test_fedrelax_killed_after_writing_its_client_models_resumes_bit_identical(
        tmp_path, monkeypatch, "fedrelax-step")
