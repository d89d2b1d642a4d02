"""The capabilities a strategy takes as constructor arguments, each a small frozen object:
``privacy=`` (``CentralDP``, ``DistributedDP``, ``LocalDP``), ``secure_aggregation=``
(``SecAgg``), ``aggregation=`` (``Mean``, ``Median``, ``TrimmedMean``, ``Krum``,
``MultiKrum``, ``Bulyan``) and ``rounds=`` (``SyncRounds``, ``OverSelect``,
``BufferedAsync``).

Why objects and not keys: a user composes ``FedInit(privacy=CentralDP(noise_multiplier=1.0),
aggregation=Krum(byzantine_f=1))`` and a typo fails where it is written. Each component maps
itself to the project's run-config keys (``keys()``: the one mapping) and names its fields for
the errors (``names()``); at construction it checks its own values with the run config's own
checks of those keys (``fedinit/config``: the one source of the rules and their one-line
errors,
reworded to name the component's fields). What depends on the rest of the strategy (the
method, the federation's size) is checked by the strategy: at construction against the run
config, at ``start()`` against the nodes found.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedinit.config import ConfigError, load_defaults
from fedinit.config.choices import REFILLS, STALE_CORRECTIONS, STALENESS_KINDS
from fedinit.config.errors import did_you_mean
from fedinit.config.fleet import FleetConfig, check_over_select_value
from fedinit.config.privacy import PrivacyConfig, check_dp_keys, check_secagg_keys
from fedinit.config.robust import RobustConfig, check_byzantine_f, check_trim_fraction
from fedinit.config.schedule import ScheduleConfig, check_async_keys

_KINDS: dict[str, tuple[type, ...]] = {"float": (int, float), "int": (int,), "str": (str,)}
_ALLOWED: dict[str, str] = {"float": "a number", "int": "an integer", "str": "a string"}


class ComponentError(ConfigError):
    """A component's value that cannot be used: one line, ``Owner: field=value ...``;
    ``detail`` is the line without the owner (a strategy prefixes its own name)."""

    def __init__(self, owner: str, detail: str) -> None:
        super().__init__(f"{owner}: {detail}")
        self.detail = detail


@dataclass(frozen=True)
class Component:
    """One capability: its fields map to run-config keys (``FIELDS``), plus what the class
    itself fixes (``FIXED``, e.g. ``dp='central'``); ``ARG`` is the strategy argument it is
    given as."""

    ARG: ClassVar[str] = ""
    FIELDS: ClassVar[Mapping[str, str]] = {}
    """Field -> run-config key."""
    FIXED: ClassVar[Mapping[str, Any]] = {}
    """Run-config key -> the value this class sets (its mode)."""
    MISSING: ClassVar[str | None] = None
    """Why no strategy can take it yet (one line), or None."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = str(f.type)
            if isinstance(value, bool) or not isinstance(value, _KINDS[kind]):
                raise self.error(f"{f.name}={value!r} is not allowed; allowed: {_ALLOWED[kind]}")
            if kind == "float" and not math.isfinite(value):
                raise self.error(f"{f.name}={value!r} is not allowed; allowed: a finite number")
        try:
            self.check()
        except ComponentError:
            raise
        except ConfigError as err:
            raise self.error(self.reworded(str(err))) from None

    def check(self) -> None:
        """The run config's own checks of these keys (``ConfigError``, reworded)."""

    def keys(self) -> dict[str, Any]:
        """The run-config keys this component sets: the one mapping."""
        return {**self.FIXED, **{key: getattr(self, name) for name, key in self.FIELDS.items()}}

    def names(self) -> dict[str, str]:
        """Run-config key -> how a strategy's error names it (``privacy.clipping_norm``)."""
        return {**{key: self.ARG for key in self.FIXED},
                **{key: f"{self.ARG}.{name}" for name, key in self.FIELDS.items()}}

    def error(self, detail: str) -> ComponentError:
        return ComponentError(type(self).__name__, detail)

    def reworded(self, text: str) -> str:
        """A run-config error's text with this component's field names for its keys."""
        text = text.removeprefix("run config: ")
        for key, value in self.FIXED.items():  # "with dp='central'" -> "with CentralDP"
            text = text.replace(f"{key}={value!r}", type(self).__name__)
        for name, key in sorted(self.FIELDS.items(), key=lambda item: -len(item[1])):
            text = _replace_key(text, key, name)
        return text

    def shown(self) -> str:
        """``Krum(byzantine_f=1)``: how the component reads in a strategy's error."""
        values = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({values})"


def _replace_key(text: str, key: str, name: str) -> str:
    """``key`` as a whole word (not part of a longer dashed key) replaced by ``name``."""
    return re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", name, text)


def group(kind: type, keys: Mapping[str, Any]) -> Any:
    """A run-config group (``PrivacyConfig``, ...) of the defaults with ``keys`` set, so a
    group's own checks run on a component's values alone."""
    defaults = load_defaults()
    values = {}
    for f in dataclasses.fields(kind):
        key = f.name.replace("_", "-")
        value = keys.get(key, defaults[key])
        values[f.name] = float(value) if isinstance(defaults[key], float) else value
    return kind(**values)


def _choice(owner: Component, name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise owner.error(f"{name}={value!r} is not allowed{did_you_mean(value, allowed)}; "
                          f"allowed: {' | '.join(allowed)}")


# ------------------------------------------------------------------------ privacy=
@dataclass(frozen=True)
class _DP(Component):
    """Client-level DP: each client's update clipped to ``clipping_norm`` (its extra
    uploads, SCAFFOLD's Delta_c_i, to ``clipping_norm_extra``, 0: the same), Gaussian noise
    of std ``noise_multiplier`` x the bound on the round's sum; each round's train metrics
    carry the epsilon spent so far at ``delta`` (``dp-epsilon``)."""

    noise_multiplier: float = 1.0
    clipping_norm: float = 1.0
    clipping_norm_extra: float = 0.0
    delta: float = 1e-5
    ARG: ClassVar[str] = "privacy"
    FIELDS: ClassVar[Mapping[str, str]] = {"noise_multiplier": "dp-noise-multiplier",
                                           "clipping_norm": "dp-clip",
                                           "clipping_norm_extra": "dp-clip-extra",
                                           "delta": "dp-delta"}

    def check(self) -> None:
        check_dp_keys(group(PrivacyConfig, self.keys()))


@dataclass(frozen=True)
class CentralDP(_DP):
    """``dp=central``: the server re-clips each reply and noises the sum (the mean divides
    by the fixed clients per round); needs ``weighting="uniform"`` and the mean."""

    FIXED: ClassVar[Mapping[str, Any]] = {"dp": "central"}


@dataclass(frozen=True)
class DistributedDP(_DP):
    """``dp=distributed``: each client adds its share of the noise inside SecAgg+'s sum;
    needs ``secure_aggregation=SecAgg(...)`` (with ``min_replies`` >= its threshold)."""

    FIXED: ClassVar[Mapping[str, Any]] = {"dp": "distributed"}


@dataclass(frozen=True)
class LocalDP(_DP):
    """``dp=local``: each client clips and noises its own upload under its device's floor
    and counts it in the device's ledger (``strategies.client.method_train``, as the
    project's ClientApp: ``strategies.device_privacy``); the server aggregates the noised
    uploads and counts each round as one release per client, no amplification."""

    FIXED: ClassVar[Mapping[str, Any]] = {"dp": "local"}


Privacy = CentralDP | DistributedDP | LocalDP


# ------------------------------------------------------------- secure_aggregation=
@dataclass(frozen=True)
class SecAgg(Component):
    """SecAgg+ (``secure-aggregation=secagg+``): the server sees only the round's sum of
    uploads clipped to [-clip, clip] per coordinate and quantised to 2^bits levels; each
    client's secrets are shared with ``num_shares`` ring neighbours, ``threshold`` of whom
    rebuild them. Needs ``weighting="uniform"``, ``max_update_norm_ratio=0``, the mean."""

    num_shares: int = 5
    threshold: int = 3
    clip: float = 1.0
    bits: int = 16
    ARG: ClassVar[str] = "secure_aggregation"
    FIELDS: ClassVar[Mapping[str, str]] = {"num_shares": "secagg-num-shares",
                                           "threshold": "secagg-threshold",
                                           "clip": "secagg-clip", "bits": "secagg-bits"}
    FIXED: ClassVar[Mapping[str, Any]] = {"secure-aggregation": "secagg+"}

    def check(self) -> None:
        check_secagg_keys(group(PrivacyConfig, self.keys()))


# ------------------------------------------------------------------- aggregation=
@dataclass(frozen=True)
class Aggregation(Component):
    """A rule combining the round's accepted replies."""

    ARG: ClassVar[str] = "aggregation"


@dataclass(frozen=True)
class Mean(Aggregation):
    """The weighted mean (``weighting``): the methods' own rule."""

    FIXED: ClassVar[Mapping[str, Any]] = {"aggregation": "mean"}


@dataclass(frozen=True)
class Median(Aggregation):
    """The coordinate-wise median."""

    FIXED: ClassVar[Mapping[str, Any]] = {"aggregation": "median"}


@dataclass(frozen=True)
class TrimmedMean(Aggregation):
    """The coordinate-wise mean after cutting ``trim_fraction`` at each end."""

    trim_fraction: float = 0.1
    FIELDS: ClassVar[Mapping[str, str]] = {"trim_fraction": "trim-fraction"}
    FIXED: ClassVar[Mapping[str, Any]] = {"aggregation": "trimmed-mean"}

    def check(self) -> None:
        check_trim_fraction(group(RobustConfig, self.keys()))


@dataclass(frozen=True)
class _Selection(Aggregation):
    """Selects whole replies, tolerating ``byzantine_f`` attackers per round (the round's
    size is checked by the strategy: n > 2f + 2, Bulyan n >= 4f + 3)."""

    byzantine_f: int = 1
    FIELDS: ClassVar[Mapping[str, str]] = {"byzantine_f": "byzantine-f"}

    def check(self) -> None:
        check_byzantine_f(group(RobustConfig, self.keys()))


@dataclass(frozen=True)
class Krum(_Selection):
    """Krum: the one reply closest to its n - f - 2 nearest."""

    FIXED: ClassVar[Mapping[str, Any]] = {"aggregation": "krum"}


@dataclass(frozen=True)
class MultiKrum(_Selection):
    """Multi-Krum: the mean of the n - f best Krum scores."""

    FIXED: ClassVar[Mapping[str, Any]] = {"aggregation": "multi-krum"}


@dataclass(frozen=True)
class Bulyan(_Selection):
    """Bulyan: Krum's selection, then a coordinate-wise trimmed mean around the median."""

    FIXED: ClassVar[Mapping[str, Any]] = {"aggregation": "bulyan"}


AGGREGATION_CLASSES: tuple[type[Aggregation], ...] = (Mean, Median, TrimmedMean, Krum,
                                                      MultiKrum, Bulyan)


def aggregation_named(name: str, trim_fraction: float = 0.1,
                      byzantine_f: int = 1) -> Aggregation:
    """The component of the run config's ``aggregation`` name (the string form a strategy
    still takes): the same mapping, so the two forms cannot differ."""
    for cls in AGGREGATION_CLASSES:
        if cls.FIXED["aggregation"] == name:
            if issubclass(cls, TrimmedMean):
                return cls(trim_fraction=trim_fraction)
            if issubclass(cls, _Selection):
                return cls(byzantine_f=byzantine_f)
            return cls()
    names = [str(c.FIXED["aggregation"]) for c in AGGREGATION_CLASSES]
    raise ComponentError("aggregation", f"aggregation={name!r} is not allowed"
                         f"{did_you_mean(name, names)}; allowed: {' | '.join(names)}, "
                         "or Mean(), Median(), TrimmedMean(...), Krum(...), MultiKrum(...), "
                         "Bulyan(...)")


# ------------------------------------------------------------------------ rounds=
@dataclass(frozen=True)
class Rounds(Component):
    """How rounds are paced."""

    ARG: ClassVar[str] = "rounds"


@dataclass(frozen=True)
class SyncRounds(Rounds):
    """Each round waits for its sampled clients (the engine's synchronous schedule,
    ``strategies.sync_schedule``, in a loop with Flower's ``Strategy.start`` contract)."""

    FIXED: ClassVar[Mapping[str, Any]] = {"rounds": "sync", "over-select": 0.0}


@dataclass(frozen=True)
class OverSelect(Rounds):
    """Sync rounds that sample ceil(m (1 + fraction)) clients and close at the first m
    accepted replies (later ones are dropped, never aggregated)."""

    fraction: float = 0.3
    FIELDS: ClassVar[Mapping[str, str]] = {"fraction": "over-select"}
    FIXED: ClassVar[Mapping[str, Any]] = {"rounds": "sync"}

    def check(self) -> None:
        check_over_select_value(group(FleetConfig, self.keys()))
        if self.fraction == 0.0:
            raise self.error("fraction=0.0 is not allowed; allowed: a finite number > 0 "
                             "(0 is SyncRounds())")


@dataclass(frozen=True)
class BufferedAsync(Rounds):
    """FedBuff: ``concurrency`` clients train at once (0: the clients per round), every
    ``buffer_size`` accepted replies (0: concurrency) are applied, each weighted by its
    staleness s(tau) (``staleness``: constant | poly (1+tau)^-a | hinge), replies staler than
    ``max_staleness`` versions (0: no limit) dropped; ``stale_correction="dc"`` compensates
    a stale delta by ``dc_lambda``; ``refill``: random | balanced. One flush is one round of
    the strategy's ``num_rounds``."""

    buffer_size: int = 0
    concurrency: int = 0
    staleness: str = "poly"
    staleness_a: float = 0.5
    staleness_b: float = 0.0
    max_staleness: int = 0
    stale_correction: str = "off"
    dc_lambda: float = 0.25
    refill: str = "random"
    FIELDS: ClassVar[Mapping[str, str]] = {
        "buffer_size": "buffer-size", "concurrency": "concurrency", "staleness": "staleness",
        "staleness_a": "staleness-a", "staleness_b": "staleness-b",
        "max_staleness": "max-staleness", "stale_correction": "stale-correction",
        "dc_lambda": "dc-lambda", "refill": "refill"}
    FIXED: ClassVar[Mapping[str, Any]] = {"rounds": "async", "over-select": 0.0}

    def check(self) -> None:
        _choice(self, "staleness", self.staleness, STALENESS_KINDS)
        _choice(self, "stale_correction", self.stale_correction, STALE_CORRECTIONS)
        _choice(self, "refill", self.refill, REFILLS)
        if self.concurrency < 0:  # its upper bound is the federation's size: at start()
            raise self.error(f"concurrency={self.concurrency!r} is not allowed; allowed: an "
                             "integer >= 0 (0: the clients per round), at most the nodes found")
        check_async_keys(group(ScheduleConfig, self.keys()), self.concurrency)


COMPONENTS: dict[str, tuple[type[Component], ...]] = {
    "privacy": (CentralDP, DistributedDP, LocalDP),
    "secure_aggregation": (SecAgg,),
    "aggregation": AGGREGATION_CLASSES,
    "rounds": (SyncRounds, OverSelect, BufferedAsync),
}
"""Each strategy argument and the components it takes."""


def taken(arg: str, value: Any, *, optional: bool = False) -> Component | None:
    """``value`` as the component argument ``arg`` takes, or a one-line ComponentError
    naming the classes allowed."""
    kinds = COMPONENTS[arg]
    if value is None and optional:
        return None
    if isinstance(value, kinds):
        return value
    allowed = " | ".join(f"{k.__name__}(...)" for k in kinds)
    raise ComponentError(arg, f"{arg}={value!r} is not allowed; allowed: "
                              f"{'None | ' if optional else ''}{allowed} "
                              "(from strategies.components)")

__all__ = ["AGGREGATION_CLASSES", "COMPONENTS", "Aggregation", "BufferedAsync", "Bulyan",
           "CentralDP", "Component", "ComponentError", "DistributedDP", "Krum", "LocalDP",
           "Mean", "Median", "MultiKrum", "OverSelect", "Privacy", "Rounds", "SecAgg",
           "SyncRounds", "TrimmedMean", "aggregation_named", "group", "taken"]
