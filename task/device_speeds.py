"""``device-speeds``: each client's slowdown and its tasks' simulated durations, seeded.

Why: a simulation's clients all run on one machine, so who finishes first depends on the
machine's load, not on the federation. With ``device-speeds`` set, each client i gets a fixed
slowdown s_i and every task a simulated duration

    d_i = s_i x local-epochs x ceil(n_i / batch-size) x ``STEP_SECONDS``

(n_i: its training examples; ceil(n_i / B) local steps per epoch, the last partial batch kept
as ``client_app.trainer.local_sgd`` keeps it). The virtual clock (``server_app/virtual_clock.py``)
orders completions by it, so a run's result is the same on any machine.

Specs: ``off`` | ``slow:FRACTION:FACTOR`` (round(FRACTION N) clients, a seeded choice, are
FACTOR times slower; the others 1) | ``lognormal:SIGMA`` (s_i = exp(SIGMA z_i), z_i standard
normal: median 1) | ``file:PATH`` (num-clients positive numbers, one per line, partition id
order; ``#`` starts a comment). Numpy only: the run config checks the spec's syntax with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from task.config_checks import ConfigError, bad_value

KEY = "device-speeds"
ALLOWED = "off | slow:FRACTION:FACTOR (0 < FRACTION <= 1, FACTOR > 0) | lognormal:SIGMA " \
          "(SIGMA > 0) | file:PATH (num-clients positive slowdowns, one per line)"
STEP_SECONDS = 0.05
"""Simulated seconds of one local step (one batch) at slowdown 1: a small CNN's batch on a
phone-class CPU; only ratios matter, the unit makes ``sim-time`` read as seconds."""
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


def read_slowdowns(path: str, num_clients: int) -> np.ndarray:
    """A ``file:`` spec's slowdowns, checked: exactly ``num_clients`` finite numbers > 0."""
    spec = f"file:{path}"
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as err:
        raise ConfigError(f"run config: {KEY}={spec!r} cannot be read: "
                          f"{err.strerror or err}") from None
    values = [line.split("#", 1)[0].strip() for line in lines]
    numbers = [_number(v, spec) for v in values if v]
    if len(numbers) != num_clients or min(numbers, default=0.0) <= 0.0:
        raise ConfigError(f"run config: {KEY}={spec!r} holds {len(numbers)} slowdowns; "
                          f"allowed: exactly num-clients={num_clients} numbers > 0, one per line")
    return np.asarray(numbers, dtype=np.float64)


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
              batch_size: int) -> np.ndarray:
    """d_i = s_i x epochs x ceil(n_i / B) x STEP_SECONDS: client i's task, simulated."""
    steps = np.asarray([local_epochs * math.ceil(n / batch_size) for n in examples],
                       dtype=np.float64)
    return np.asarray(slow, dtype=np.float64) * steps * STEP_SECONDS
