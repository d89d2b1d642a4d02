"""``device-speeds``: each client's slowdown and its tasks' simulated durations, seeded.

Why: a simulation's clients all run on one machine, so who finishes first depends on the
machine's load, not on the federation. With ``device-speeds`` set, each client i gets a fixed
slowdown s_i and every task a simulated duration

    d_i = s_i x local-epochs x ceil(n_i / batch-size) x ``STEP_SECONDS``

(n_i: its training examples; ceil(n_i / B) local steps per epoch, the last partial batch kept
as ``client_app.trainer.local_sgd`` keeps it). The virtual clock (``strategies/virtual_clock.py``)
orders completions by it, so a run's result is the same on any machine.

Specs: ``off`` | ``slow:FRACTION:FACTOR`` (round(FRACTION N) clients, a seeded choice, are
FACTOR times slower; the others 1) | ``lognormal:SIGMA`` (s_i = exp(SIGMA z_i), z_i standard
normal: median 1) | ``file:PATH`` (num-clients lines in partition id order, each
``SLOWDOWN [START-END ...]``: a positive slowdown, then optional availability windows in
simulated seconds; ``#`` starts a comment). Numpy only: the run config checks the spec's
syntax with it.

Availability windows: a line ``2.5 0-600 1800-inf`` is a client 2.5 times slower, available
for simulated t in [0, 600) and from 1800 on; a line without windows is always available.
Windows are half-open [START, END), 0 <= START < END (END may be ``inf``), in increasing
order without overlap (touching is refused too: write one window). A task started at t must
also finish by its window's END, or it is lost (``strategies/virtual_clock.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedinit.config.choices import TASK_TIMES
from fedinit.config.errors import ConfigError, bad_value

KEY = "device-speeds"
ALLOWED = "off | slow:FRACTION:FACTOR (0 < FRACTION <= 1, FACTOR > 0) | lognormal:SIGMA " \
          "(SIGMA > 0) | file:PATH (num-clients lines, each SLOWDOWN [START-END ...])"
STEP_SECONDS = 0.05
"""Simulated seconds of one local step (one batch) at slowdown 1: a small CNN's batch on a
phone-class CPU; only ratios matter, the unit makes ``sim-time`` read as seconds."""
WINDOW_RULE = ("SLOWDOWN [START-END ...]: a number > 0, then windows START-END in simulated "
               "seconds, 0 <= START < END (END may be inf), increasing, not touching")
"""What a line of a ``file:`` spec may hold (named in its one-line refusals)."""
STREAM = 45
"""The seed stream of the slowdown draw (``[seed, STREAM]``), apart from every other draw."""


@dataclass(frozen=True)
class Speeds:
    """A parsed spec: its kind and numbers (``file``: the path)."""

    kind: str
    fraction: float = 0.0
    factor: float = 1.0
    sigma: float = 0.0
    path: str = ""


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise bad_value(KEY, spec, ALLOWED) from None
    if not math.isfinite(value):
        raise bad_value(KEY, spec, ALLOWED)
    return value


def parse_speeds(spec: str) -> Speeds:
    """The spec's syntax and ranges, or ConfigError in one line (a file is read later,
    on the server: a client never needs it)."""
    kind, _, rest = spec.partition(":")
    if kind == "off" and not rest:
        return Speeds("off")
    if kind == "slow":
        parts = rest.split(":")
        if len(parts) != 2:
            raise bad_value(KEY, spec, ALLOWED)
        fraction, factor = _number(parts[0], spec), _number(parts[1], spec)
        if not (0.0 < fraction <= 1.0 and factor > 0.0):
            raise bad_value(KEY, spec, ALLOWED)
        return Speeds("slow", fraction=fraction, factor=factor)
    if kind == "lognormal":
        sigma = _number(rest, spec)
        if not sigma > 0.0:
            raise bad_value(KEY, spec, ALLOWED)
        return Speeds("lognormal", sigma=sigma)
    if kind == "file" and rest:
        return Speeds("file", path=rest)
    raise bad_value(KEY, spec, ALLOWED)


Window = tuple[float, float]
"""[start, end) in simulated seconds."""
Windows = tuple[tuple[Window, ...] | None, ...]
"""Per client (partition id order): its windows, or None (always available)."""


def _bad_line(spec: str, number: int, text: str, why: str) -> ConfigError:
    return ConfigError(f"run config: {KEY}={spec!r} line {number}: {text!r} {why}; "
                       f"allowed: {WINDOW_RULE}")


def _window(token: str, spec: str, number: int, text: str) -> Window:
    start_s, dash, end_s = token.partition("-")
    try:
        start, end = float(start_s), float(end_s)
    except ValueError:
        raise _bad_line(spec, number, text, f"has {token!r}, not a window START-END") from None
    if not dash or not (math.isfinite(start) and 0.0 <= start < end):  # nan end: refused
        raise _bad_line(spec, number, text, f"has {token!r}, not a window START-END")
    return start, end


def _line(text: str, spec: str, number: int) -> tuple[float, tuple[Window, ...] | None]:
    """One client's line: its slowdown and windows (None: none given)."""
    first, *rest = text.split()
    try:
        slow = float(first)
    except ValueError:
        raise _bad_line(spec, number, text, "does not start with a slowdown") from None
    if not (math.isfinite(slow) and slow > 0.0):
        raise _bad_line(spec, number, text, "does not start with a slowdown > 0")
    if not rest:
        return slow, None
    spans = tuple(_window(token, spec, number, text) for token in rest)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        if start <= end:
            raise _bad_line(spec, number, text, "has windows out of order, overlapping or "
                            "touching")
    return slow, spans


def read_speeds_file(path: str, num_clients: int) -> tuple[np.ndarray, Windows | None]:
    """A ``file:`` spec's slowdowns and windows (None when no line has any), checked:
    exactly ``num_clients`` lines, each ``WINDOW_RULE``."""
    spec = f"file:{path}"
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as err:
        raise ConfigError(f"run config: {KEY}={spec!r} cannot be read: "
                          f"{err.strerror or err}") from None
    parsed = [_line(text, spec, number) for number, text in
              ((i + 1, line.split("#", 1)[0].strip()) for i, line in enumerate(lines)) if text]
    if len(parsed) != num_clients:
        raise ConfigError(f"run config: {KEY}={spec!r} holds {len(parsed)} slowdowns; "
                          f"allowed: exactly num-clients={num_clients} numbers > 0, one per line")
    slow = np.asarray([s for s, _ in parsed], dtype=np.float64)
    windows = tuple(w for _, w in parsed)
    return slow, (windows if any(w is not None for w in windows) else None)


def read_slowdowns(path: str, num_clients: int) -> np.ndarray:
    """A ``file:`` spec's slowdowns, checked (``read_speeds_file``; windows left out)."""
    return read_speeds_file(path, num_clients)[0]


def speeds_and_windows(spec: str, num_clients: int,
                       seed: int) -> tuple[np.ndarray | None, Windows | None]:
    """``slowdowns`` and, for a ``file:`` spec, the file's windows (None: none given)."""
    sp = parse_speeds(spec)
    if sp.kind == "file":
        return read_speeds_file(sp.path, num_clients)
    return slowdowns(spec, num_clients, seed), None


def slowdowns(spec: str, num_clients: int, seed: int) -> np.ndarray | None:
    """Each client's slowdown s_i (None for ``off``), the same for the same spec and seed."""
    sp = parse_speeds(spec)
    rng = np.random.default_rng([seed, STREAM])
    if sp.kind == "off":
        return None
    if sp.kind == "file":
        return read_slowdowns(sp.path, num_clients)
    if sp.kind == "lognormal":
        return np.exp(sp.sigma * rng.standard_normal(num_clients))
    out = np.ones(num_clients)
    slow = rng.permutation(num_clients)[: round(sp.fraction * num_clients)]
    out[slow] = sp.factor
    return out


def durations(slow: Sequence[float] | np.ndarray, examples: Sequence[int], local_epochs: int,
              batch_size: int, task_time: str = "steps") -> np.ndarray:
    """d_i = s_i x epochs x ceil(n_i / B) x STEP_SECONDS: client i's task, simulated
    (``task-time=steps``); under ``task`` the steps are every client's mean, so a task's
    time is its device's alone, not its partition's size."""
    steps = np.asarray([local_epochs * math.ceil(n / batch_size) for n in examples],
                       dtype=np.float64)
    if task_time == "task":
        steps = np.full_like(steps, steps.mean())
    elif task_time != "steps":
        raise ValueError(f"task-time={task_time!r} is not allowed; allowed: "
                         f"{' | '.join(TASK_TIMES)}")
    return np.asarray(slow, dtype=np.float64) * steps * STEP_SECONDS
