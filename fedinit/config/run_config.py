"""The run config, validated once into a typed object of typed groups.

Defaults live only in ``pyproject.toml`` ``[tool.flwr.app.config]``; Flower hands them (merged
with ``--run-config`` overrides) to both apps as ``context.run_config``. ``RunConfig.parse``
turns that mapping into a frozen dataclass or raises ``ConfigError`` with one line naming the
bad key, its value and what is allowed. Nothing else in the project reads raw config keys.

A key's field sits in one group (``cfg.train.lr``, ``cfg.privacy.dp``, ...; the field name is
the key with '-' -> '_'); the method, its parameters, the seed and num-clients, which nearly
every part reads, sit on ``RunConfig`` itself, with the values derived from more than one group.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedinit.config.checks import check_all
from fedinit.config.data import DataConfig
from fedinit.config.defaults import load_defaults
from fedinit.config.errors import ConfigError, did_you_mean
from fedinit.config.evaluation import EvalConfig
from fedinit.config.fleet import FleetConfig
from fedinit.config.privacy import PrivacyConfig
from fedinit.config.robust import RobustConfig
from fedinit.config.schedule import ScheduleConfig
from fedinit.config.train import TrainConfig
from fedinit.methods.compression import Compression
from fedinit.methods.method import MethodSpec, ParamError, Params
from fedinit.methods.registry import METHODS

GROUPS: dict[str, type] = {
    "train": TrainConfig, "data": DataConfig, "eval": EvalConfig, "privacy": PrivacyConfig,
    "robust": RobustConfig, "fleet": FleetConfig, "schedule": ScheduleConfig,
}
"""``RunConfig``'s attribute -> the group's type."""
TOP: tuple[str, ...] = ("method", "num_clients", "seed")
"""Keys on ``RunConfig`` itself."""


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one experiment, typed, in groups; see the module's docstring."""

    method: str
    num_clients: int
    seed: int
    train: TrainConfig
    data: DataConfig
    eval: EvalConfig
    privacy: PrivacyConfig
    robust: RobustConfig
    fleet: FleetConfig
    schedule: ScheduleConfig
    params: Params = field(default_factory=Params)
    """The chosen method's own keys, checked by the method (``methods.<method>``)."""
    method_values: tuple[tuple[str, Any], ...] = ()
    """Every method's keys as given or defaulted (one given is checked by its method,
    whichever runs), for ``to_dict``: a summary or checkpoint records the whole config."""

    # ------------------------------------------------- derived from more than one group
    @property
    def clients_per_round(self) -> int:
        """m = max(1, round(fraction * N)): the number of clients sampled each round."""
        return max(1, round(self.train.fraction_train * self.num_clients))

    @property
    def sampled_per_round(self) -> int:
        """Clients messaged each sync round: ceil(m (1 + over-select)), m when it is 0."""
        if self.fleet.over_select == 0.0:
            return self.clients_per_round
        return math.ceil(self.clients_per_round * (1.0 + self.fleet.over_select) - 1e-9)

    @property
    def secagg_bits(self) -> int:
        """The bits SecAgg+ quantises each coordinate to: B under ``compression=qB`` (the
        field's quantisation is the codec, ``check_compression``), else ``secagg-bits``."""
        codec = Compression.parse(self.train.compression)
        if codec is not None and codec.quantiser is not None:
            return codec.quantiser.bits
        return self.privacy.secagg_bits

    @property
    def async_concurrency(self) -> int:
        """Clients training at once under ``rounds=async`` (``concurrency``; 0: m)."""
        return self.schedule.concurrency or self.clients_per_round

    @property
    def async_buffer_size(self) -> int:
        """K, accepted replies per aggregation under ``rounds=async`` (0: concurrency)."""
        return self.schedule.buffer_size or self.async_concurrency

    @property
    def eval_source(self) -> str:
        """Where the global model's accuracy curve comes from: ``central`` (the data set's
        test split, on the server) or ``federated`` (the clients' local test splits)."""
        if self.eval.evaluation == "auto":
            return "federated" if self.data.on_devices else "central"
        return self.eval.evaluation

    @property
    def spec(self) -> MethodSpec:
        """The method's registry entry: its halves, labels and defaults."""
        return METHODS[self.method]

    def to_dict(self) -> dict[str, Any]:
        """The config with its original (dashed) key names, for summaries."""
        general = {name.replace("_", "-"): getattr(_holder(self, name), name) for name in ORDER}
        return {**general, **dict(self.method_values)}

    # ------------------------------------------------------------------ parsing
    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, sized: bool = True) -> RunConfig:
        """Validate ``raw`` (defaults filled in from pyproject) or raise ConfigError. Not
        ``sized``: its ``num-clients`` is a stand-in (a strategy's constructor, before the
        federation is known), and the checks that read the client count or the round size
        are left to the parse that has them (``checks.check_all``)."""
        defaults = load_defaults()
        unknown = sorted(set(raw) - set(defaults))
        if unknown:
            raise ConfigError(f"run config: unknown key {unknown[0]!r}"
                              f"{did_you_mean(unknown[0], defaults)}; known keys: "
                              f"{', '.join(sorted(defaults))}")
        merged = {**defaults, **raw}
        values: dict[str, Any] = {}
        for name in ORDER:
            key = name.replace("_", "-")
            values[name] = _coerce(key, merged[key], type(defaults[key]))
        # the methods' keys: every default that is no general key (the registry's list too,
        # tests/test_config_methods.py), so no method module loads to name them
        method_values = {key: _coerce(key, merged[key], type(defaults[key]))
                         for key in sorted(set(defaults) - GENERAL_KEYS)}
        groups = {attr: kind(**{f.name: values[f.name] for f in dataclasses.fields(kind)})
                  for attr, kind in GROUPS.items()}
        cfg = cls(**{name: values[name] for name in TOP}, **groups,
                  method_values=tuple(method_values.items()))
        check_all(cfg, sized=sized)
        # the chosen method checks its keys; another method's key given here (not left at
        # its default) is checked by its method too, so a bad value fails fast though unused
        spec = METHODS[cfg.method]
        others = set(raw) - GENERAL_KEYS - set(spec.params.config_keys())
        try:
            chosen = {name: other.params.from_config(method_values)
                      for name, other in (METHODS.items() if others else [(cfg.method, spec)])}
            chosen[cfg.method].check_with_lr(cfg.train.lr)  # the others' keys go unused
        except ParamError as err:
            raise ConfigError(str(err)) from None
        # ``auto`` and 0 are resolved here, so the rest sees model | update and the method's
        # eta_g; under DP ``auto`` is ``update`` for every method (RI inside the clipped move)
        t = cfg.train
        auto = "update" if cfg.privacy.dp != "off" else spec.ri_aggregation
        train = dataclasses.replace(
            t, ri_aggregation=auto if t.ri_aggregation == "auto" else t.ri_aggregation,
            server_lr=t.server_lr or spec.server_lr)
        return dataclasses.replace(cfg, params=chosen[cfg.method], train=train)


ORDER: tuple[str, ...] = (
    "method", "beta", "ri_aggregation", "weighting", "server_lr", "num_server_rounds",
    "num_clients", "fraction_train", "local_epochs", "batch_size", "lr", "lr_decay",
    "weight_decay", "clip_norm", "dataset", "data_dir", "device_classes", "device_image_size",
    "device_channels", "device_mean", "device_std", "partition", "dirichlet_alpha",
    "num_regimes", "regime_kind", "channel_noise", "brightness_noise", "train_limit",
    "local_test_fraction", "model", "seed", "eval_every", "evaluation", "federated_eval_clients",
    "divergence_every", "divergence_clients", "personal_eval_every", "personal_eval_clients",
    "finetune_epochs", "output_dir", "tracking", "round_timeout", "node_wait_timeout",
    "task_deadline", "min_clients", "min_replies", "over_select", "max_failed_rounds",
    "aggregation", "trim_fraction", "byzantine_f", "max_update_norm_ratio",
    "max_examples_per_client", "dp", "dp_clip", "dp_clip_extra", "dp_noise_multiplier",
    "dp_delta", "dp_target_epsilon", "dp_release_client_metrics", "secure_aggregation",
    "secagg_num_shares", "secagg_threshold", "secagg_clip", "secagg_bits", "resume_dir",
    "client_state_dir", "simulation_client_state", "node_registry", "rounds", "concurrency",
    "buffer_size", "staleness", "staleness_a", "staleness_b", "max_staleness",
    "stale_correction", "dc_lambda", "refill", "device_speeds", "task_time", "compression",
    "server_momentum", "async_lr_scale",
)
"""Every run-config key's field, in the order keys are coerced (the first wrong type is the
one reported) and ``to_dict`` lists them (as summaries always have)."""
GENERAL_KEYS: frozenset[str] = frozenset(name.replace("_", "-") for name in ORDER)
"""The run-config keys of the groups, not of a method."""

GROUP_OF: dict[str, str] = {f.name: attr for attr, kind in GROUPS.items()
                            for f in dataclasses.fields(kind)}
"""A field's group attribute (``lr`` -> ``train``); fields in ``TOP`` have none."""


def _holder(cfg: RunConfig, name: str) -> Any:
    """The object that holds field ``name``: its group, or ``cfg`` for ``TOP``."""
    return getattr(cfg, GROUP_OF[name]) if name in GROUP_OF else cfg


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Coerce one value to the type of its default (int accepted where float is expected)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(
            f"run config: {key}={value!r} has type {type(value).__name__}; expected {kind.__name__}"
        )
    return value
