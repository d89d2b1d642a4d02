"""The run config, validated once into a typed object.

Defaults live only in ``pyproject.toml`` ``[tool.flwr.app.config]``; Flower hands them (merged
with ``--run-config`` overrides) to both apps as ``context.run_config``. ``RunConfig.parse``
turns that mapping into a frozen dataclass or raises ``ConfigError`` with one line naming the
bad key, its value and what is allowed. Nothing else in the project reads raw config keys.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from methods.dp import CLIP_SIGMAS, min_secagg_clip
from methods.dp import MODES as DP_MODES
from methods.dp import refusal as dp_refusal
from methods.method import MethodSpec, ParamError, Params
from methods.registry import (
    AGGREGATIONS,
    METHOD_NAMES,
    METHODS,
    RI_AGGREGATIONS,
    WEIGHTINGS,
    method_param_keys,
)
from methods.robust_choices import min_replies
from task.choices import (
    ASYNC_METHODS,
    ASYNC_REFUSALS,
    MAX_ROTATIONS,
    MODEL_NAMES,
    PARTITION_NAMES,
    REGIME_KINDS,
    ROUNDS,
    SECAGG_MAX_BITS,
    SECAGG_REFUSALS,
    SECURE_AGGREGATIONS,
    STALENESS_KINDS,
    TRACKINGS,
    check_model_input,
)
from task.config_checks import ConfigError, bad_value, did_you_mean
from task.data_sets import DATASET_NAMES, default_data_dir, spec_of, split_floats, split_names
from task.data_sets.device import NAME as DEVICE
from task.device_speeds import parse_speeds

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
__all__ = ["ConfigError", "RunConfig", "check_examples", "check_writable", "load_defaults"]


@functools.lru_cache(maxsize=1)
def load_defaults() -> dict[str, Any]:
    """The run-config defaults as written in pyproject.toml (the single source)."""
    with PYPROJECT.open("rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one experiment, typed. Field names are the keys with '-' -> '_'."""

    method: str
    beta: float
    ri_aggregation: str
    weighting: str
    server_lr: float
    num_server_rounds: int
    num_clients: int
    fraction_train: float
    local_epochs: int
    batch_size: int
    lr: float
    lr_decay: float
    weight_decay: float
    clip_norm: float
    dataset: str
    data_dir: str
    device_classes: str
    device_image_size: int
    device_channels: int
    device_mean: str
    device_std: str
    partition: str
    dirichlet_alpha: float
    num_regimes: int
    regime_kind: str
    channel_noise: float
    brightness_noise: float
    train_limit: int
    local_test_fraction: float
    model: str
    seed: int
    eval_every: int
    evaluation: str
    federated_eval_clients: int
    divergence_every: int
    divergence_clients: int
    personal_eval_every: int
    personal_eval_clients: int
    finetune_epochs: int
    output_dir: str
    tracking: str
    round_timeout: float
    node_wait_timeout: float
    task_deadline: float
    min_clients: int
    min_replies: int
    over_select: float
    max_failed_rounds: int
    aggregation: str
    trim_fraction: float
    byzantine_f: int
    max_update_norm_ratio: float
    max_examples_per_client: int
    dp: str
    dp_clip: float
    dp_clip_extra: float
    dp_noise_multiplier: float
    dp_delta: float
    dp_target_epsilon: float
    secure_aggregation: str
    secagg_num_shares: int
    secagg_threshold: int
    secagg_clip: float
    secagg_bits: int
    resume_dir: str
    client_state_dir: str
    simulation_client_state: str
    node_registry: str
    rounds: str
    concurrency: int
    buffer_size: int
    staleness: str
    staleness_a: float
    staleness_b: float
    max_staleness: int
    device_speeds: str
    params: Params = field(default_factory=Params)
    """The chosen method's own keys, checked by the method (``methods.<method>``)."""
    method_values: tuple[tuple[str, Any], ...] = ()
    """Every method's keys as given (all are checked, whichever method runs), for
    ``to_dict``: a summary or checkpoint records the whole config."""

    # ------------------------------------------------------------------ derived values
    @property
    def clients_per_round(self) -> int:
        """m = max(1, round(fraction * N)): the number of clients sampled each round."""
        return max(1, round(self.fraction_train * self.num_clients))

    @property
    def sampled_per_round(self) -> int:
        """Clients messaged each sync round: ceil(m (1 + over-select)), m when it is 0."""
        if self.over_select == 0.0:
            return self.clients_per_round
        return math.ceil(self.clients_per_round * (1.0 + self.over_select) - 1e-9)

    def lr_at(self, server_round: int) -> float:
        """Local learning rate of round t (1-based): lr * lr_decay^(t-1)."""
        return self.lr * self.lr_decay ** (server_round - 1)

    @property
    def async_concurrency(self) -> int:
        """Clients training at once under ``rounds=async`` (``concurrency``; 0: m)."""
        return self.concurrency or self.clients_per_round

    @property
    def async_buffer_size(self) -> int:
        """K, accepted replies per aggregation under ``rounds=async`` (0: concurrency)."""
        return self.buffer_size or self.async_concurrency

    @property
    def resolved_data_dir(self) -> str:
        """The data location: the configured one or the dataset's first default that holds it."""
        return self.data_dir or str(default_data_dir(self.dataset))

    @property
    def on_devices(self) -> bool:
        """Whether every node brings its own data (``dataset=device``): no central copy."""
        return self.dataset == DEVICE

    @property
    def eval_source(self) -> str:
        """Where the global model's accuracy curve comes from: ``central`` (the data set's
        test split, on the server) or ``federated`` (the clients' local test splits)."""
        if self.evaluation == "auto":
            return "federated" if self.on_devices else "central"
        return self.evaluation

    @property
    def spec(self) -> MethodSpec:
        """The method's registry entry: its halves, labels and defaults."""
        return METHODS[self.method]

    def to_dict(self) -> dict[str, Any]:
        """The config with its original (dashed) key names, for summaries."""
        general = {f.name.replace("_", "-"): getattr(self, f.name)
                   for f in dataclasses.fields(self) if f.name not in _DERIVED}
        return {**general, **dict(self.method_values)}

    # ------------------------------------------------------------------ parsing
    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RunConfig:
        """Validate ``raw`` (defaults filled in from pyproject) or raise ConfigError."""
        defaults = load_defaults()
        unknown = sorted(set(raw) - set(defaults))
        if unknown:
            raise ConfigError(f"run config: unknown key {unknown[0]!r}"
                              f"{did_you_mean(unknown[0], defaults)}; known keys: "
                              f"{', '.join(sorted(defaults))}")
        merged = {**defaults, **raw}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in _DERIVED:
                key = f.name.replace("_", "-")
                values[f.name] = _coerce(key, merged[key], type(defaults[key]))
        method_values = {key: _coerce(key, merged[key], type(defaults[key]))
                         for key in sorted(method_param_keys())}
        cfg = cls(**values, method_values=tuple(method_values.items()))
        _check_finite(cfg)
        _check_ranges(cfg)
        check_examples(cfg)
        # every method checks its keys (a typo in another method's key still fails fast)
        try:
            chosen = {name: spec.params.from_config(method_values)
                      for name, spec in METHODS.items()}
            chosen[cfg.method].check_with_lr(cfg.lr)  # the other methods' keys go unused
        except ParamError as err:
            raise ConfigError(str(err)) from None
        spec = METHODS[cfg.method]
        # ``auto`` and 0 are resolved here, so the rest sees model | update and the method's
        # eta_g; under DP ``auto`` is ``update`` for every method (RI inside the clipped move)
        auto = "update" if cfg.dp != "off" else spec.ri_aggregation
        return dataclasses.replace(
            cfg, params=chosen[cfg.method],
            ri_aggregation=auto if cfg.ri_aggregation == "auto" else cfg.ri_aggregation,
            server_lr=cfg.server_lr or spec.server_lr)


_DERIVED = frozenset({"params", "method_values"})
"""RunConfig fields that are not run-config keys of their own."""


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Coerce one value to the type of its default (int accepted where float is expected)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(
            f"run config: {key}={value!r} has type {type(value).__name__}; expected {kind.__name__}"
        )
    return value


_bad = bad_value
EVALUATIONS: tuple[str, ...] = ("auto", "central", "federated")


def _refuse_any(values: Mapping[str, float], bad: Callable[[float], bool], allowed: str) -> None:
    """The first of ``values`` (key -> value) that is ``bad``, refused as ``allowed`` says:
    one bound shared by a group of keys, checked in their order."""
    for key, value in values.items():
        if bad(value):
            raise _bad(key, value, allowed)


def _check_finite(c: RunConfig) -> None:
    """NaN and infinities pass every range test below (NaN compares False), so refuse them
    first, for every float key at once; a NaN left in the run config would also break
    Flower's simulation engine, which compares run configs with ``==``."""
    for key, value in c.to_dict().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise _bad(key, value, "a finite number")


def check_examples(c: RunConfig, available: int | None = None) -> None:
    """Every client needs at least one training example; ``available`` is the data set's
    training-set size once it is loaded (None before), since a partition cannot be smaller."""
    if 0 < c.train_limit < c.num_clients:
        raise _bad("train-limit", c.train_limit,
                   f"0 (all) or at least num-clients={c.num_clients} examples")
    if available is not None and available < c.num_clients:
        raise _bad("num-clients", c.num_clients,
                   f"at most the {available} training examples of dataset={c.dataset!r}")


def check_writable(key: str, path: Path) -> None:
    """Create ``path`` and write a probe file in it, so that a run whose results cannot be
    saved fails before any work, naming the key, not with a traceback after round 1."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigError(f"run config: {key}={str(path)!r} is not a writable directory: "
                          f"{err.strerror or err}") from None


def _check_robust(c: RunConfig) -> None:
    """``byzantine-f`` against the round size (under ``rounds=async`` the buffer's,
    ``_check_async``), and methods whose state a robust rule breaks."""
    if c.byzantine_f < 0:
        raise _bad("byzantine-f", c.byzantine_f, "an integer >= 0")
    need = min_replies(c.aggregation, c.byzantine_f)
    if c.rounds == "sync" and c.clients_per_round < need:  # async: the buffer (_check_async)
        rule = "n >= 4f + 3" if c.aggregation == "bulyan" else "n > 2f + 2"
        raise _bad("byzantine-f", c.byzantine_f,
                   f"at most what aggregation={c.aggregation!r} tolerates in "
                   f"{c.clients_per_round} clients per round ({rule}, n = clients per round)")
    refusal = METHODS[c.method].server.robust_refusal
    if c.aggregation != "mean" and refusal:
        raise _bad("aggregation", c.aggregation, f"mean with method={c.method!r} ({refusal})")


def _check_per_client(c: RunConfig) -> None:
    """RI and DP with a method whose clients each get their own model (FedRelax, clustered
    FL: ``ServerRule.per_client_refusal``) are refused with the method's reason."""
    refusal = METHODS[c.method].server.per_client_refusal
    if not refusal:
        return
    for key, value, ok, allowed in (("beta", c.beta, c.beta == 0.0, "0"),
                                    ("ri-aggregation", c.ri_aggregation,
                                     c.ri_aggregation != "update", "auto or model"),
                                    ("dp", c.dp, c.dp == "off", "off")):
        if not ok:
            raise _bad(key, value, f"{allowed} with method={c.method!r} ({refusal})")


def _check_regimes(c: RunConfig) -> None:
    """``num-regimes``: 0 (off) or 1..num-clients; rotations by 90 degrees give at most 4."""
    if not 0 <= c.num_regimes <= c.num_clients:
        raise _bad("num-regimes", c.num_regimes,
                   f"0 (off) to num-clients={c.num_clients} regimes")
    if c.regime_kind == "rotate" and c.num_regimes > MAX_ROTATIONS:
        raise _bad("num-regimes", c.num_regimes,
                   f"0 (off) to {MAX_ROTATIONS} with regime-kind='rotate' (0/90/180/270 degrees)")


def _check_personal_eval(c: RunConfig) -> None:
    """Personalized evaluation needs local test splits and at most every client."""
    for key, value in (("divergence-every", c.divergence_every),
                       ("divergence-clients", c.divergence_clients)):
        if value < 0:
            raise _bad(key, value, "an integer >= 0 (0 = off / all clients)")
    if c.personal_eval_every < 0:
        raise _bad("personal-eval-every", c.personal_eval_every, "an integer >= 0 (0 = off)")
    if c.personal_eval_clients < 0:
        raise _bad("personal-eval-clients", c.personal_eval_clients,
                   "an integer >= 0 (0, or num-clients or more: all clients)")
    if c.finetune_epochs < 1:
        raise _bad("finetune-epochs", c.finetune_epochs, "an integer >= 1")
    if c.personal_eval_every > 0 and c.local_test_fraction == 0.0:
        raise _bad("personal-eval-every", c.personal_eval_every,
                   "0 while local-test-fraction=0 (clients have no local test split)")


def _check_device(c: RunConfig) -> None:
    """The schema every device must meet, and what a server without the data needs."""
    names = split_names(c.device_classes)
    if len(names) < 2 or any(not n or "/" in n or n.startswith(".") for n in names):
        raise _bad("device-classes", c.device_classes,
                   "at least 2 comma-separated class names (folder names: no '/', no leading "
                   "'.') when dataset='device'")
    if len(set(names)) != len(names):
        raise _bad("device-classes", c.device_classes, "class names that are all different")
    if c.device_channels not in (1, 3):
        raise _bad("device-channels", c.device_channels, "1 (grayscale) or 3 (RGB)")
    if c.device_image_size < 1:
        raise _bad("device-image-size", c.device_image_size, "an integer >= 1")
    for key, text, low in (("device-mean", c.device_mean, -math.inf),
                           ("device-std", c.device_std, 0.0)):
        try:
            values = split_floats(text)
        except ValueError:
            values = ()
        if (len(values) != c.device_channels
                or not all(math.isfinite(v) and v > low for v in values)):
            raise _bad(key, text, f"{c.device_channels} comma-separated finite number(s) "
                       f"(one per device-channels){', each > 0' if low == 0.0 else ''}")
    if c.max_examples_per_client == 0:
        raise _bad("max-examples-per-client", 0,
                   "a cap > 0 when dataset='device' (the server cannot count the examples a "
                   "device holds, so it caps each reply's claimed weight)")


def _check_evaluation(c: RunConfig) -> None:
    """Central evaluation needs the data set on the server; federated needs local tests."""
    if c.federated_eval_clients < 0:
        raise _bad("federated-eval-clients", c.federated_eval_clients,
                   "an integer >= 0 (0, or num-clients or more: all clients)")
    if c.evaluation == "central" and c.on_devices:
        raise _bad("evaluation", c.evaluation, "federated or auto when dataset='device' (the "
                   "server holds no test set)")
    if c.eval_source == "federated" and c.local_test_fraction == 0.0:
        raise _bad("local-test-fraction", c.local_test_fraction,
                   "> 0 with federated evaluation (the clients evaluate on their local test "
                   "splits)")


def _check_dp(c: RunConfig) -> None:
    """Differential privacy's keys, and the settings it cannot run with (the method's
    ``ServerRule.dp_refusal``, then ``methods.dp.refusal``)."""
    if c.dp not in DP_MODES:
        raise ConfigError(f"run config: dp={c.dp!r} is not allowed{did_you_mean(c.dp, DP_MODES)}"
                          f"; allowed: {' | '.join(DP_MODES)}")
    for key, value in (("dp-clip", c.dp_clip), ("dp-clip-extra", c.dp_clip_extra),
                       ("dp-noise-multiplier", c.dp_noise_multiplier),
                       ("dp-target-epsilon", c.dp_target_epsilon)):
        if value < 0.0:
            raise _bad(key, value, "a number >= 0")
    if not 0.0 < c.dp_delta < 1.0:
        raise _bad("dp-delta", c.dp_delta, "0 < dp-delta < 1 (typically below 1 / num-clients)")
    if c.dp == "off":
        return
    for key, value in (("dp-clip", c.dp_clip), ("dp-noise-multiplier", c.dp_noise_multiplier)):
        if value == 0.0:
            raise _bad(key, value, f"a number > 0 with dp={c.dp!r}")
    why = METHODS[c.method].server.dp_refusal
    if why:
        raise _bad("dp", c.dp, f"off with method={c.method!r} ({why})")
    refused = dp_refusal(c.dp, c.ri_aggregation, c.weighting, c.aggregation)
    if refused is not None:
        raise _bad(*refused)
    if c.dp == "distributed" and c.secure_aggregation == "off":
        raise _bad("dp", c.dp, "off | central | local with secure-aggregation='off' "
                   "(distributed: each upload carries only 1/min-replies of the noise's "
                   "variance, safe only inside the secure sum; set secure-aggregation='secagg+')")


def _check_async(c: RunConfig) -> None:
    """FedBuff's keys (checked whichever ``rounds``), then what ``rounds=async`` cannot run
    yet, each refused with its reason (``task.choices.ASYNC_REFUSALS``)."""
    if not 0 <= c.concurrency <= c.num_clients:
        raise _bad("concurrency", c.concurrency,
                   f"0 (the clients per round) to num-clients={c.num_clients}")
    for key, value, zero in (("buffer-size", c.buffer_size, "concurrency"),
                             ("max-staleness", c.max_staleness, "no limit")):
        if value < 0:
            raise _bad(key, value, f"an integer >= 0 (0 = {zero})")
    for key, fvalue in (("staleness-a", c.staleness_a), ("staleness-b", c.staleness_b)):
        if fvalue < 0.0:
            raise _bad(key, fvalue, "a number >= 0")
    if c.rounds == "sync":
        return
    if c.method not in ASYNC_METHODS:
        why = ASYNC_REFUSALS.get(c.method, "not built for buffers yet")
        raise _bad("method", c.method, f"{' | '.join(ASYNC_METHODS)} with rounds='async' "
                   f"({c.method}: {why})")
    refusals = (
        ("dp", c.dp, c.dp != "local", "off | central",
         "each upload is a release when the device sends it, also one dropped as stale or "
         "never flushed, and a client may upload more than once between flushes: the "
         "server's per-flush count would understate it"),
        ("dp", c.dp, c.dp != "distributed", "off | central",
         "distributed DP needs secure aggregation, which is sync only"),
        ("buffer-size", c.buffer_size, c.dp == "off" or c.async_buffer_size <= c.num_clients,
         f"at most num-clients={c.num_clients} with dp={c.dp!r}",
         "a client contributes at most once per flush"),
        ("aggregation", c.aggregation, c.aggregation == "mean" or not
         METHODS[c.method].server.up_keys, f"mean with method={c.method!r}",
         "its clients' state is accounted when a reply is buffered, before a robust rule "
         "decides whether it is kept; not built"),
        ("buffer-size", c.buffer_size,
         c.async_buffer_size >= min_replies(c.aggregation, c.byzantine_f),
         f"at least {min_replies(c.aggregation, c.byzantine_f)} (0: concurrency="
         f"{c.async_concurrency}) with aggregation={c.aggregation!r} and byzantine-f="
         f"{c.byzantine_f}",
         "the rule runs over the K buffered replies: "
         + ("n >= 4f + 3" if c.aggregation == "bulyan" else "n > 2f + 2")),
        ("evaluation", c.evaluation, c.eval_source == "central", "auto or central",
         "federated evaluation beside in-flight training is not built yet"),
        ("personal-eval-every", c.personal_eval_every, c.personal_eval_every == 0, "0",
         "personalized evaluation is not run between flushes yet"),
        ("divergence-every", c.divergence_every, c.divergence_every == 0, "0",
         "the all-client divergence is not run between flushes yet"),
    )
    for key, value, ok, allowed, why in refusals:
        if not ok:
            raise _bad(key, value, f"{allowed} with rounds='async' ({why})")


def _check_over_select(c: RunConfig) -> None:
    """``over-select`` o: a finite o >= 0; with o > 0, ceil(m (1 + o)) clients must exist, and
    what reads who was sampled or needs every sampled reply is refused, each in one line."""
    o = c.over_select
    if not 0.0 <= o < math.inf:
        raise _bad("over-select", o, "a finite number >= 0 (0 turns over-selection off)")
    if o == 0.0:
        return
    k = c.sampled_per_round
    if k > c.num_clients:
        raise _bad("over-select", o, f"at most {c.num_clients / c.clients_per_round - 1:g} "
                   f"(ceil(m (1 + o)) = {k} clients > num-clients={c.num_clients})")
    for key, value, ok, allowed, why in (
        ("dp", c.dp, c.dp == "off", "off",
         "the accountant's amplification by sampling assumes each client is in a round's sum "
         "with rate m/N; which m of m(1+o) are summed depends on their speed, not on a secret "
         "draw"),
        ("rounds", c.rounds, c.rounds == "sync", "sync",
         "asynchronous rounds never wait for a sample; concurrency sets how many train"),
        ("secure-aggregation", c.secure_aggregation, c.secure_aggregation == "off", "off",
         "the key exchange fixes who is in the sum before training; the late ones would be "
         "dropouts to unmask"),
    ):
        if not ok:
            raise _bad(key, value, f"{allowed} with over-select={o:g} ({why})")


def _check_secagg(c: RunConfig) -> None:
    """SecAgg+'s keys (checked whichever ``secure-aggregation``), then what needs one client's
    upload, which the server never sees with it, each refused in one line."""
    k, t = c.secagg_num_shares, c.secagg_threshold
    if k < 3 or k % 2 == 0:
        raise _bad("secagg-num-shares", k, "an odd integer >= 3 (the client plus (k-1)/2 ring "
                   "neighbours on each side)")
    if not k // 2 < t <= k:
        raise _bad("secagg-threshold", t, f"{k // 2 + 1}..{k} (more than half of "
                   f"secagg-num-shares={k}, so no server can rebuild both secrets of a client)")
    if not (math.isfinite(c.secagg_clip) and c.secagg_clip > 0.0):
        raise _bad("secagg-clip", c.secagg_clip, "a finite number > 0 (the per-coordinate bound "
                   "of each upload)")
    if not 1 <= c.secagg_bits <= SECAGG_MAX_BITS:
        raise _bad("secagg-bits", c.secagg_bits, f"1..{SECAGG_MAX_BITS}")
    if c.secure_aggregation == "off":
        return
    with_it = f"with secure-aggregation={c.secure_aggregation!r}"
    if c.method in SECAGG_REFUSALS:
        allowed = " | ".join(m for m in METHOD_NAMES if m not in SECAGG_REFUSALS)
        raise _bad("method", c.method, f"{allowed} {with_it} ({c.method}: "
                   f"{SECAGG_REFUSALS[c.method]})")
    max_clients = (2**32 - 1) // 2**c.secagg_bits
    for key, value, ok, allowed, why in (
        ("weighting", c.weighting, c.weighting == "uniform", "uniform",
         "the sum is divided by the survivors; example weighting would need each count masked"),
        ("max-update-norm-ratio", c.max_update_norm_ratio, c.max_update_norm_ratio == 0.0, "0",
         "the norm filter reads each upload's norm"),
        ("aggregation", c.aggregation, c.aggregation == "mean", "mean",
         "median, trimmed-mean, krum, multi-krum and bulyan read each upload"),
        ("dp", c.dp, c.dp in ("off", "distributed"), "off | distributed",
         "central clips and noises each reply on the server, which never sees one; local "
         "noises each upload in full, the sum then carries m times the noise it needs"),
        ("rounds", c.rounds, c.rounds == "sync", "sync",
         "a buffer of replies from different rounds has no common key exchange"),
        ("secagg-threshold", t, t <= c.clients_per_round,
         f"at most the clients per round ({c.clients_per_round})",
         "fewer clients than the threshold can never unmask a sum"),
        ("secagg-bits", c.secagg_bits, c.clients_per_round <= max_clients,
         f"a value with clients per round <= (2^32 - 1) // 2^bits ({max_clients} now)",
         "the quantised sum would wrap around 2^32"),
        # the evaluations answer per client: under secure aggregation the server learns sums
        ("evaluation", c.evaluation, c.eval_source == "central",
         "central, or auto without dataset='device'",
         "federated evaluation sends each client's loss, accuracy and test-split size, and "
         "the server holds no test set with dataset='device'"),
        ("divergence-every", c.divergence_every, c.divergence_every == 0, "0",
         "each client would send ||w_prev_i - w_t||^2 and whether it has trained"),
        ("personal-eval-every", c.personal_eval_every, c.personal_eval_every == 0, "0",
         "each client would send its global, fine-tuned and own-model accuracies"),
    ):
        if not ok:
            raise _bad(key, value, f"{allowed} {with_it} ({why})")
    if c.method == "fedcm" and (c.on_devices or c.max_examples_per_client > 0):
        raise _bad("method", c.method, f"a method other than fedcm {with_it} when the server "
                   f"cannot derive each client's step count (dataset='device' or "
                   f"max-examples-per-client > 0: a masked reply carries no step count, and "
                   f"FedCM's d = -D / (K eta) needs K)")
    if c.dp == "distributed":
        _check_distributed_dp(c)


def _check_distributed_dp(c: RunConfig) -> None:
    """``dp=distributed``: t_min = ``min-replies`` is the fewest uploads a released sum holds
    (each device adds 1/t_min of the noise's variance); a released SecAgg+ sum already holds
    at least ``secagg-threshold`` uploads, so t_min below it only adds noise. The quantiser's
    bound c must sit ``CLIP_SIGMAS`` device noise stds above C (a clip at c is then a 5.5e-89
    event per coordinate)."""
    t, t_min = c.secagg_threshold, c.min_replies
    if t_min < t:
        raise _bad("min-replies", t_min, f"secagg-threshold ({t}) to the clients per round "
                   f"({c.clients_per_round}) with dp='distributed' (min-replies is t_min: each "
                   f"device adds 1/t_min of the noise's variance, and a released sum already "
                   f"holds at least secagg-threshold uploads)")
    # a method's extra uploads (SCAFFOLD's Delta_c_i) share the quantiser: the larger bound
    extra = METHODS[c.method].server.up_keys and (c.dp_clip_extra or c.dp_clip) > c.dp_clip
    clip, name = ((c.dp_clip_extra, "dp-clip-extra") if extra else (c.dp_clip, "dp-clip"))
    low = min_secagg_clip(clip, c.dp_noise_multiplier, t_min)
    if c.secagg_clip < low:
        raise _bad("secagg-clip", c.secagg_clip, f">= {low:.4g} with dp='distributed' "
                   f"({name} + {CLIP_SIGMAS:g} device noise stds z {name} / sqrt(min-replies), "
                   f"so a noised coordinate is almost never clipped at secagg-clip)")


def _check_ranges(c: RunConfig) -> None:
    """Range checks, one per key, in the order a reader would look for them."""
    choices = {
        "method": (c.method, METHOD_NAMES),
        "ri-aggregation": (c.ri_aggregation, RI_AGGREGATIONS),
        "weighting": (c.weighting, WEIGHTINGS),
        "aggregation": (c.aggregation, AGGREGATIONS),
        "dataset": (c.dataset, DATASET_NAMES),
        "partition": (c.partition, PARTITION_NAMES),
        "regime-kind": (c.regime_kind, REGIME_KINDS),
        "model": (c.model, MODEL_NAMES),
        "simulation-client-state": (c.simulation_client_state, ("disk", "memory")),
        "evaluation": (c.evaluation, EVALUATIONS),
        "tracking": (c.tracking, TRACKINGS),
        "rounds": (c.rounds, ROUNDS),
        "staleness": (c.staleness, STALENESS_KINDS),
        "secure-aggregation": (c.secure_aggregation, SECURE_AGGREGATIONS),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"run config: {key}={value!r} is not allowed"
                              f"{did_you_mean(value, allowed)}; allowed: {' | '.join(allowed)}")
    if c.on_devices:
        _check_device(c)
    schema = spec_of(c.dataset).schema
    try:
        check_model_input(c.model, c.device_image_size if schema is None else schema.image_size)
    except ValueError as err:
        raise ConfigError(f"run config: model={c.model!r} does not fit dataset={c.dataset!r}: "
                          f"{err}") from None
    if not -1.0 < c.beta < 1.0:
        raise _bad("beta", c.beta, "-1 < beta < 1 (the paper uses 0.01..0.15)")
    if not 0.0 < c.fraction_train <= 1.0:
        raise _bad("fraction-train", c.fraction_train, "0 < fraction-train <= 1")
    positive_ints = {
        "num-server-rounds": c.num_server_rounds,
        "num-clients": c.num_clients,
        "local-epochs": c.local_epochs,
        "batch-size": c.batch_size,
        "eval-every": c.eval_every,
        "min-replies": c.min_replies,
        "max-failed-rounds": c.max_failed_rounds,
    }
    _refuse_any(positive_ints, lambda v: v < 1, "an integer >= 1")
    positive = {
        "lr": c.lr,
        "dirichlet-alpha": c.dirichlet_alpha,
        "round-timeout": c.round_timeout,
        "node-wait-timeout": c.node_wait_timeout,
    }
    _refuse_any(positive, lambda v: not v > 0.0, "a number > 0")
    if c.server_lr < 0.0:
        raise _bad("server-lr", c.server_lr, "a number > 0, or 0 for the method's default "
                   f"({server_lr_defaults()})")
    if not 0.0 < c.lr_decay <= 1.0:
        raise _bad("lr-decay", c.lr_decay, "0 < lr-decay <= 1")
    if not 0.0 <= c.trim_fraction < 0.5:
        raise _bad("trim-fraction", c.trim_fraction, "0 <= trim-fraction < 0.5")
    _check_robust(c)
    _check_per_client(c)
    if not 0 <= c.min_clients <= c.num_clients:
        raise _bad("min-clients", c.min_clients,
                   f"0 (all) to num-clients={c.num_clients} clients to start with")
    if c.min_replies > c.clients_per_round:
        raise _bad("min-replies", c.min_replies,
                   f"at most the clients per round ({c.clients_per_round})")
    non_negative = {
        "max-examples-per-client": c.max_examples_per_client,
        "weight-decay": c.weight_decay,
        "clip-norm": c.clip_norm,
        "channel-noise": c.channel_noise,
        "brightness-noise": c.brightness_noise,
        "train-limit": c.train_limit,
    }
    _refuse_any(non_negative, lambda v: v < 0, "a number >= 0 (0 disables it)")
    if c.task_deadline < 0:
        raise _bad("task-deadline", c.task_deadline,
                   "a number of seconds > 0, or 0 for round-timeout")
    if not 0.0 <= c.max_update_norm_ratio < math.inf:  # NaN would turn the filter off
        raise _bad("max-update-norm-ratio", c.max_update_norm_ratio,
                   "a finite number >= 0 (0 disables the norm filter)")
    if not 0.0 <= c.local_test_fraction < 1.0:
        raise _bad("local-test-fraction", c.local_test_fraction,
                   "0 <= local-test-fraction < 1 (0 turns the local test split off)")
    _check_regimes(c)
    _check_personal_eval(c)
    _check_evaluation(c)
    _check_dp(c)
    _check_async(c)
    _check_secagg(c)
    _check_over_select(c)
    parse_speeds(c.device_speeds)
    if c.on_devices and c.device_speeds != "off":
        raise _bad("device-speeds", c.device_speeds, "off with dataset='device' (the server "
                   "cannot count a device's examples, so a task has no simulated duration)")
    if c.seed < 0:
        raise _bad("seed", c.seed, "an integer >= 0")
    if not c.output_dir:
        raise _bad("output-dir", c.output_dir, "a non-empty directory path")


def server_lr_defaults() -> str:
    """What ``server-lr=0`` means, from the registry: e.g. '0.1 for fedadam, 1 otherwise'."""
    own = [f"{spec.server_lr:g} for {name}" for name, spec in METHODS.items()
           if spec.server_lr != 1.0]
    return ", ".join([*own, "1 otherwise"])
