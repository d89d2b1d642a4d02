"""Rounds and wall seconds to a target accuracy (the paper's Table 8), from a run's rows.

The accuracy is smoothed as the grid's metric is (a trailing ``window``-point moving average
of the evaluated rounds' test accuracy, as ``server_app.results.smoothed_peak`` smooths it),
so one lucky round does not count as reaching the target; ``window: 1`` gives the raw curve.
The wall seconds are the reaching row's ``elapsed-seconds``: from the start of the run's
first round (the Recorder's start) to the end of that round, evaluation included.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NOT_REACHED = "not reached"


@dataclass(frozen=True)
class TargetHit:
    """The first round whose smoothed accuracy reached the target, and its elapsed seconds."""

    round: int
    seconds: float | None


def first_reaching(rows: Sequence[Mapping[str, Any]], target: float,
                   window: int) -> TargetHit | None:
    """The first round whose ``window``-point moving average of test-acc is >= ``target`` (%).

    The average at an evaluated round is over it and the window - 1 evaluated rounds before
    it (fewer only when the run has fewer evaluations than the window, as smoothed_peak
    does). None: not reached.
    """
    if window < 1:
        raise ValueError(f"window={window}: expected an integer >= 1")
    evaluated = [r for r in rows if r.get("test-acc") is not None]
    if not evaluated:
        return None
    w = min(window, len(evaluated))
    for i in range(w - 1, len(evaluated)):
        mean = statistics.fmean(float(r["test-acc"]) for r in evaluated[i - w + 1:i + 1])
        if 100.0 * mean >= target:
            row = evaluated[i]
            seconds = row.get("elapsed-seconds")
            return TargetHit(int(row["round"]), None if seconds is None else float(seconds))
    return None


def summarize(hits: Sequence[TargetHit | None]) -> str:
    """'12.3 r / 45 s' (means over the runs that reached it), '(2/3 reached)' when some did
    not, 'not reached (0/3)' when none did; '' for no runs."""
    if not hits:
        return ""
    reached = [h for h in hits if h is not None]
    if not reached:
        return f"{NOT_REACHED} (0/{len(hits)})"
    rounds = statistics.fmean(h.round for h in reached)
    secs = [h.seconds for h in reached if h.seconds is not None]
    text = f"{rounds:.1f} r" + (f" / {statistics.fmean(secs):.0f} s" if secs else "")
    return text if len(reached) == len(hits) else f"{text} ({len(reached)}/{len(hits)} reached)"
