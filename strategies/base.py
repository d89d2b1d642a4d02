"""``MethodAdapter``: one of the project's methods as a Flower ``Strategy`` a user constructs
like Flower's own, ``FedInit(beta=0.1, fraction_train=0.1)``, and runs with ``start()``.

It holds no rule of its own. Its settings become the project's run-config keys, checked by
``RunConfig.parse`` (the one source of the checks and of their one-line errors, reworded to
name the constructor's arguments); training is ``strategies.method_strategy.MethodStrategy``, built
in ``start()`` once the federation is known; federated evaluation of the global model is
Flower's own ``FedAvg.configure_evaluate``/``aggregate_evaluate`` on the user's
``@app.evaluate()``.

Client ids. A user's nodes have no partition ids, so at ``start()`` the adapter waits for
``min_available_nodes`` nodes and numbers the connected nodes by ascending node id:
client id i is the i-th smallest node id, N is their count. Sampling, the seeded draw by
client id, the accounted rounds and FedRelax's or clustered FL's per-client models all use
these ids; each train message names its client id (``fedinit.methods.wire.CLIENT_ID``). Nodes that
connect later are not sampled; one that is gone is replaced in the draw by an available one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from logging import INFO
from typing import TYPE_CHECKING, Any, ClassVar

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fedinit.config import ConfigError, RunConfig
from fedinit.config.errors import bad_value
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.registry import METHODS
from strategies.client_half_check import ClientHalfCheck
from strategies.components import (
    Aggregation,
    BufferedAsync,
    Component,
    ComponentError,
    LocalDP,
    OverSelect,
    Privacy,
    Rounds,
    SecAgg,
    SyncRounds,
    aggregation_named,
    taken,
)
from strategies.flower_args import FlowerArgError, FlowerArgs, MetricsAggr
from strategies.wire import INITIAL, method_config, release_config

if TYPE_CHECKING:
    from fedinit.methods.dp_budget import Budget
    from strategies.method_strategy import MethodStrategy

ANY_FEDERATION = 1_000_000
"""The stand-in ``num-clients`` of the constructor's parse, before the federation is known:
that parse is not ``sized`` (``RunConfig.parse(..., sized=False)``), so no check reads it;
the checks that need the client count or the round size (Krum's n > 2f + 2, ``min_replies``,
SecAgg's threshold and quantised sum, ``concurrency``) run at ``start()`` with the nodes
found."""
BUFFER_NAMES = frozenset({"running_mean", "running_var", "num_batches_tracked"})
"""The last name component of torch's normalisation buffers in a state dict."""
ANY_LR = 1e-9
"""The learning rate the constructor checks with when ``lr`` comes from ``train_config``
at ``start()``: lr-dependent checks (lr x alpha < 2) pass here and run there."""

COMMON_ARGS: dict[str, str] = {
    "fraction_train": "fraction-train",
    "lr": "lr",
    "lr_decay": "lr-decay",
    "weighting": "weighting",
    "server_lr": "server-lr",
    "min_replies": "min-replies",
    "max_update_norm_ratio": "max-update-norm-ratio",
    "max_examples_per_client": "max-examples-per-client",
    "seed": "seed",
    "compression": "compression",
}
"""Constructor argument -> run-config key, for the settings every method shares; the
capabilities (``privacy=``, ``secure_aggregation=``, ``aggregation=``, ``rounds=``) are
components that map themselves (``strategies/components.py``)."""
SYNC_ROUNDS = SyncRounds()
"""``rounds=``'s default: rounds that wait for their sampled clients."""
LEGACY_AGGREGATION: dict[str, str] = {"aggregation": "aggregation",
                                      "trim-fraction": "trim_fraction",
                                      "byzantine-f": "byzantine_f"}
"""How errors name the keys of the string form ``aggregation="krum", byzantine_f=1``."""


class MethodAdapter(Strategy):
    """A project method as a Flower strategy; subclasses name the method and its arguments."""

    method: ClassVar[str]
    """The registry name (``fedinit.methods.registry``) of the method the subclass runs."""

    def __init__(self, own: Mapping[str, tuple[str, Any]], *, fraction_train: float = 1.0,
                 fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2,
                 lr: float | None = None, lr_decay: float = 1.0, weighting: str = "examples",
                 server_lr: float = 0.0, aggregation: Aggregation | str = "mean",
                 trim_fraction: float | None = None, byzantine_f: int | None = None,
                 privacy: Privacy | None = None, secure_aggregation: SecAgg | None = None,
                 rounds: Rounds = SYNC_ROUNDS, min_replies: int = 1,
                 max_update_norm_ratio: float = 20.0,
                 max_examples_per_client: int = 0, seed: int = 0, compression: str = "off",
                 stop_after_foreign_rounds: int = 2,
                 weighted_by_key: str = "num-examples", arrayrecord_key: str = "arrays",
                 configrecord_key: str = "config",
                 train_metrics_aggr_fn: MetricsAggr | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggr | None = None) -> None:
        """``own``: the method's arguments, {argument: (run-config key, value)}.

        ``lr`` is the local learning rate the server sends each round (``config["lr"]``,
        decayed by ``lr_decay`` per round); None takes ``train_config["lr"]`` given to
        ``start()``, as Flower's quickstarts pass it. ``max_examples_per_client`` > 0 caps
        the example count a reply may claim (its weight); 0: no cap (the server cannot see
        a user's data). ``stop_after_foreign_rounds``: the run stops, naming
        ``strategies.client.method_train``, after this many rounds in a row whose replies
        all came from a ClientApp without the client half (``strategies/client_half_check.py``).
        ``weighted_by_key``, ``arrayrecord_key``, ``configrecord_key``,
        ``train_metrics_aggr_fn``, ``evaluate_metrics_aggr_fn``: Flower's ``FedAvg``
        arguments, with their meaning there (``strategies/flower_args.py``). The other
        shared settings are the run config's keys of the same names (docs/configuration.md).

        The capabilities, components of ``strategies.components``: ``privacy`` (None,
        ``CentralDP(...)``, ``DistributedDP(...)`` with SecAgg), ``secure_aggregation``
        (None or ``SecAgg(...)``), ``aggregation`` (``Mean()``, ``Median()``,
        ``TrimmedMean(...)``, ``Krum(...)``, ``MultiKrum(...)``, ``Bulyan(...)``; the older
        string form ``"krum"`` with ``trim_fraction``/``byzantine_f`` still works and maps
        to the same component), ``rounds`` (``SyncRounds()``, ``OverSelect(...)``,
        ``BufferedAsync(...)``). What the method cannot run is refused here by its own spec
        (``MethodSpec.async_refusal``, ``secagg_refusal``).
        """
        given = {"fraction_train": fraction_train, "lr": lr, "lr_decay": lr_decay,
                 "weighting": weighting, "server_lr": server_lr,
                 "min_replies": min_replies, "max_update_norm_ratio": max_update_norm_ratio,
                 "max_examples_per_client": max_examples_per_client, "seed": seed,
                 "compression": compression}
        self.arg_of: dict[str, str] = {key: arg for arg, key in COMMON_ARGS.items()}
        self.arg_of.update({key: arg for arg, (key, _) in own.items()})
        self.keys: dict[str, Any] = {COMMON_ARGS[a]: v for a, v in given.items() if v is not None}
        self.keys.update({key: value for key, value in own.values()})
        self.keys.update({"method": self.method, "personal-eval-every": 0})
        self.components: dict[str, Component] = self._components(
            privacy, secure_aggregation, aggregation, trim_fraction, byzantine_f, rounds)
        """The capabilities by argument (None ones left out), mapped into ``keys``."""
        for component in self.components.values():
            self.keys.update(component.keys())
            self.arg_of.update(component.names())
        if isinstance(aggregation, str):
            self.arg_of.update(LEGACY_AGGREGATION)
        try:
            self.flower = FlowerArgs(weighted_by_key, arrayrecord_key, configrecord_key,
                                     train_metrics_aggr_fn, evaluate_metrics_aggr_fn)
        except FlowerArgError as err:
            raise ConfigError(f"{type(self).__name__}: {err}") from None
        """Flower's own FedAvg arguments."""
        self.min_train_nodes = self._count("min_train_nodes", min_train_nodes)
        self.min_available_nodes = self._count("min_available_nodes", min_available_nodes)
        if (isinstance(fraction_evaluate, bool) or not isinstance(fraction_evaluate, int | float)
                or not 0.0 <= fraction_evaluate <= 1.0):
            raise self._error(bad_value("fraction_evaluate", fraction_evaluate,
                                        "0 <= fraction_evaluate <= 1 (0 skips evaluation)"))
        self.evaluation = FedAvg(fraction_train=1.0, fraction_evaluate=fraction_evaluate,
                                 min_evaluate_nodes=self._count("min_evaluate_nodes",
                                                                min_evaluate_nodes),
                                 min_available_nodes=min_available_nodes,
                                 weighted_by_key=weighted_by_key,
                                 evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        """Flower's own federated evaluation of the global model (the user's evaluate)."""
        self._check_over_select(fraction_train)
        self.checked = self.parse(ANY_FEDERATION, ANY_LR if lr is None else lr,
                                  fraction_train, sized=False)
        """The settings as the run config holds them, checked before any work."""
        if isinstance(self.components.get("privacy"), LocalDP) and fraction_evaluate > 0.0:
            raise self._error(bad_value("fraction_evaluate", fraction_evaluate,
                                        "0 with privacy=LocalDP(...) (under local DP a device "
                                        "answers no exact query about its data; the project's "
                                        "ClientApp refuses every evaluate message)"))
        if self.buffered and fraction_evaluate > 0.0:
            raise self._error(bad_value("fraction_evaluate", fraction_evaluate,
                                        "0 with rounds=BufferedAsync(...) (federated "
                                        "evaluation beside in-flight training is not built "
                                        "yet; evaluate_fn in start() runs after each flush)"))
        self.inner: MethodStrategy | None = None
        """The project's strategy, built by ``start()`` for the federation it finds."""
        self.client_of: dict[int, int] = {}
        """Node id -> client id, from ``start()`` on."""
        self.budget: Budget | None = None
        """``privacy=``: the run's accountant (``fedinit.methods.dp_budget``), from
        ``start()`` on."""
        self._keys_of_arrays: list[str] = []
        self._initial = ArrayRecord()
        try:
            self.client_half = ClientHalfCheck(type(self).__name__, stop_after_foreign_rounds)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        """Stops a run whose nodes do not run ``method_train``."""

    # ---------------------------------------------------------------- checks
    def _components(self, privacy: Any, secure_aggregation: Any, aggregation: Any,
                    trim_fraction: float | None, byzantine_f: int | None,
                    rounds: Any) -> dict[str, Component]:
        """The capability arguments as components, or a one-line ConfigError naming the
        argument: a wrong type, a component no client half can honour yet
        (``Component.MISSING``), or one the method's own spec refuses."""
        name = type(self).__name__
        try:
            if isinstance(aggregation, str):
                aggregation = aggregation_named(
                    aggregation, 0.1 if trim_fraction is None else trim_fraction,
                    1 if byzantine_f is None else byzantine_f)
            else:
                for arg, value in (("trim_fraction", trim_fraction),
                                   ("byzantine_f", byzantine_f)):
                    if value is not None:
                        raise ComponentError(name, f"{arg}={value!r} is not allowed with "
                                             f"aggregation={aggregation!r}; allowed: the "
                                             "component's own field (e.g. Krum(byzantine_f=1))")
            given = {"privacy": taken("privacy", privacy, optional=True),
                     "secure_aggregation": taken("secure_aggregation", secure_aggregation,
                                                 optional=True),
                     "aggregation": taken("aggregation", aggregation),
                     "rounds": taken("rounds", rounds)}
        except ComponentError as err:
            raise ConfigError(f"{name}: {err.detail}") from None
        out = {arg: c for arg, c in given.items() if c is not None}
        spec = METHODS[self.method]
        for arg, component in out.items():
            why = component.MISSING
            if why is None and isinstance(component, BufferedAsync):
                why = spec.async_refusal
            if why is None and isinstance(component, SecAgg):
                why = spec.secagg_refusal
            if why is not None:
                raise ConfigError(f"{name}: {arg}={component.shown()} is not allowed "
                                  f"({why})")
        if "privacy" in out and isinstance(out["rounds"], BufferedAsync):
            raise ConfigError(f"{name}: privacy={out['privacy'].shown()} is not allowed with "
                              "rounds=BufferedAsync(...); allowed: None (the per-flush DP "
                              "release and its accounting run in the project's experiment "
                              "only, rounds=async with dp=central; not built for strategies "
                              "yet)")
        return out

    def _check_over_select(self, fraction_train: float) -> None:
        """``OverSelect``: ceil(m (1 + o)) clients must exist, so fraction_train x (1 + o)
        must not pass 1 (the exact count is checked at ``start()`` with the nodes found)."""
        rounds = self.components["rounds"]
        if (isinstance(rounds, OverSelect) and isinstance(fraction_train, int | float)
                and fraction_train * (1.0 + rounds.fraction) > 1.0):
            raise self._error(bad_value(
                "fraction_train", fraction_train, f"at most {1.0 / (1.0 + rounds.fraction):.4g} "
                f"with rounds={rounds.shown()} (ceil(m (1 + fraction)) of the N nodes are "
                "sampled, m = fraction_train x N)"))

    @property
    def buffered(self) -> bool:
        """Whether ``rounds=BufferedAsync(...)``: ``start()`` runs FedBuff's loop."""
        return isinstance(self.components.get("rounds"), BufferedAsync)

    def parse(self, num_clients: int, lr: float, fraction_train: float, *,
              sized: bool = True) -> RunConfig:
        """``RunConfig.parse`` of these settings; its ConfigError reworded to name the
        constructor's arguments (``FedDyn: alpha=0.0 is not allowed; ...``). Not ``sized``
        (the constructor, before the federation is known): ``num_clients`` is a stand-in
        and no check that reads it or the round size runs."""
        raw = {**self.keys, "num-clients": num_clients, "lr": lr,
               "fraction-train": fraction_train}
        try:
            return RunConfig.parse(raw, sized=sized)
        except ConfigError as err:
            raise self._error(err) from None

    def _error(self, err: ConfigError) -> ConfigError:
        """``err`` with this class's name for "run config" and argument names for keys."""
        text = str(err).removeprefix("run config: ")
        for key, arg in sorted(self.arg_of.items(), key=lambda item: -len(item[0])):
            text = re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", arg, text)
        legacy = self.arg_of.get("byzantine-f") == "byzantine_f"  # aggregation="krum"
        for arg, component in getattr(self, "components", {}).items():
            if arg == "aggregation" and legacy:
                continue  # given by the run config's name: named so
            shown = f"{arg}={type(component).__name__}(...)"
            for key, value in component.FIXED.items():  # privacy='central' -> CentralDP(...)
                if component.names()[key] == arg:
                    text = text.replace(f"{arg}={value!r}", shown)
        return ConfigError(f"{type(self).__name__}: {text}")

    def _count(self, arg: str, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._error(bad_value(arg, value, "an integer >= 0"))
        return value

    # ---------------------------------------------------------------- the federation
    def prepare(self, grid: Grid, initial_arrays: ArrayRecord,
                train_config: ConfigRecord | None) -> MethodStrategy:
        """Wait for ``min_available_nodes`` nodes, number them (module docstring), check the
        settings for their count and build the project's strategy for them."""
        from strategies.method_strategy import MethodStrategy  # the rounds: loaded by start()

        cfg, node_of, available = self.federation(grid, initial_arrays, train_config)
        self.inner = MethodStrategy(cfg, node_of, unpack(initial_arrays), examples=None,
                                    available=available)
        if cfg.privacy.dp != "off":  # the accountant only under DP (it loads dp-accounting)
            from fedinit.methods.dp_budget import Budget

            self.budget = Budget.for_run(cfg, channels=1 + len(self.inner.rule.up_keys))
        return self.inner

    def federation(self, grid: Grid, initial_arrays: ArrayRecord,
                   train_config: ConfigRecord | None,
                   ) -> tuple[RunConfig, dict[int, int], Callable[[], list[int]]]:
        """(the settings checked for the nodes found, client id -> node id, the client ids
        connected now), after ``min_available_nodes`` nodes connected (module docstring)."""
        self.check_initial(initial_arrays)
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        node_ids = sorted(int(n) for n in nodes)
        n = len(node_ids)
        if self.min_train_nodes > n:
            raise self._error(bad_value("min_train_nodes", self.min_train_nodes,
                                        f"at most the {n} connected nodes"))
        cfg = self.parse(n, self._lr(train_config), self._fraction(n))
        node_of = dict(enumerate(node_ids))
        self.client_of = {node: cid for cid, node in node_of.items()}

        def available() -> list[int]:
            online = set(grid.get_node_ids())
            return [cid for cid, node in node_of.items() if node in online]

        self._keys_of_arrays = list(initial_arrays.keys())
        self._initial = ArrayRecord([a.copy() for a in unpack(initial_arrays)])
        log(INFO, "%s: %d nodes as clients 0..%d (by ascending node id), %d per round",
            type(self).__name__, n, n - 1, cfg.clients_per_round)
        return cfg, node_of, available

    def check_initial(self, initial_arrays: ArrayRecord) -> None:
        """Refuse a model with running buffers before any node is asked: the methods keep
        parameter-shaped state (w_prev_i, c_i, h_i), so BatchNorm's statistics would be
        averaged as if they were weights. Recognised by the state dict's names, as
        ``ArrayRecord(model.state_dict())`` keeps them."""
        buffers = [k for k in initial_arrays if k.rsplit(".", 1)[-1] in BUFFER_NAMES]
        if buffers:
            shown = ", ".join(repr(k) for k in buffers[:3]) + (" ..." if len(buffers) > 3 else "")
            raise ConfigError(f"{type(self).__name__}: initial_arrays holds {len(buffers)} "
                              f"running buffers ({shown}); allowed: parameters only (the "
                              "methods keep parameter-shaped state): use GroupNorm or "
                              "LayerNorm in place of BatchNorm")

    def _lr(self, train_config: ConfigRecord | None) -> float:
        """The constructor's ``lr``, else ``train_config["lr"]``; one of them, or both equal."""
        own = self.keys.get("lr")
        sent = None if train_config is None else train_config.get(rk.LR)
        if own is not None and sent is not None and float(sent) != float(own):  # type: ignore[arg-type]
            raise self._error(ConfigError(f"lr={own!r} and train_config['lr']={sent!r} "
                                          "differ; give the learning rate once"))
        lr = own if own is not None else sent
        if lr is None:
            raise self._error(ConfigError("lr is not given; allowed: lr=<a number > 0> or "
                                          "train_config=ConfigRecord({'lr': ...}) in start()"))
        if isinstance(lr, bool) or not isinstance(lr, int | float):
            raise self._error(bad_value("lr", lr, "a number > 0"))
        return float(lr)

    def _fraction(self, n: int) -> float:
        """fraction_train, raised so that the round's m = max(1, round(fraction * N)) is at
        least ``min_train_nodes``, as Flower's sample size max(int(fraction * N),
        min_train_nodes)."""
        fraction = float(self.keys["fraction-train"])
        if max(1, round(fraction * n)) < self.min_train_nodes:
            return self.min_train_nodes / n
        return fraction

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              ) -> Result:
        """Flower's ``Strategy.start`` contract, on the engine the project's experiment
        runs: once the project's strategy is built for the nodes found, ``num_rounds``
        rounds of its synchronous schedule (``OverSelect``: each closes at its first m
        accepted replies), each followed by Flower's federated evaluation and
        ``evaluate_fn``; under ``BufferedAsync`` FedBuff's loop instead, ``num_rounds``
        flushes (``evaluate_fn`` after each). ``Result.arrays`` keeps the keys of
        ``initial_arrays``."""
        from strategies.schedules import run_sync  # the engine: loaded by start() only

        if isinstance(self.components["rounds"], BufferedAsync):
            return self.start_buffered(grid, initial_arrays, num_rounds, timeout, train_config,
                                       evaluate_fn)
        inner = self.prepare(grid, initial_arrays, train_config)
        return run_sync(self, inner, grid, initial_arrays, num_rounds, timeout, train_config,
                        evaluate_config, evaluate_fn)

    def start_buffered(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int,
                       timeout: float, train_config: ConfigRecord | None,
                       evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
                       ) -> Result:
        """``rounds=BufferedAsync(...)``: the experiment's FedBuff loop on this grid
        (``strategies/schedules.py``); its train messages name the method as sync ones do."""
        from strategies.schedules import (
            CheckedReplies,
            WithInitial,
            async_config,
            run_buffered,
        )

        cfg, node_of, available = self.federation(grid, initial_arrays, train_config)
        grid = CheckedReplies(grid, self.client_half.check)
        if cfg.train.beta != 0.0:
            grid = WithInitial(grid, self.add_initial)
        cfg = async_config(cfg, num_rounds, timeout)
        config = ConfigRecord({**dict(train_config or {}),
                               **method_config(cfg.method, cfg.params)})
        log(INFO, "%s: rounds=async, concurrency %d, buffer-size %d, staleness %s",
            type(self).__name__, cfg.async_concurrency, cfg.async_buffer_size,
            cfg.schedule.staleness)
        result, self.inner = run_buffered(grid, cfg, node_of, unpack(initial_arrays),
                                          available, config, evaluate_fn, self.user_record)
        return result

    def _built(self) -> MethodStrategy:
        if self.inner is None:
            name = type(self).__name__
            raise RuntimeError(
                f"{name}: a round ran before {name}.start() (or prepare()) numbered the "
                "nodes as clients; allowed: run it by its own start(), not inside a wrapper "
                "such as Flower's DifferentialPrivacy*FixedClipping (those clip each reply's "
                "arrays as a model, which a method's Delta_i or Delta_c_i is not): central DP "
                f"is the privacy= argument, {name}(privacy=CentralDP(noise_multiplier=..., "
                "clipping_norm=...)) from strategies.components (the run config's "
                "dp=central)")
        return self.inner

    # ---------------------------------------------------------------- Flower Strategy API
    def summary(self) -> None:
        if self.inner is not None:
            self.inner.summary()
            return
        settings = {self.arg_of.get(k, k): v for k, v in self.keys.items()
                    if k in self.arg_of}
        log(INFO, "%s (%s): %s", type(self).__name__, self.checked.spec.label_with(
            self.checked.train.beta), settings)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The project's train messages, naming the method, its parameters and the
        client's release (``privacy=``) for the user's client half (``strategies.client``)."""
        inner = self._built()
        named = ConfigRecord({**dict(config),
                              **method_config(inner.cfg.method, inner.cfg.params),
                              **release_config(Mechanism.from_config(inner.cfg))})
        messages = list(inner.configure_train(server_round, arrays, named, grid))
        if inner.cfg.train.beta != 0.0:
            for msg in messages:
                self.add_initial(msg)
        return messages

    def add_initial(self, msg: Message) -> None:
        """w_0 (``strategies.wire.INITIAL``) into a train message whose client has no
        aggregated round yet: RI's w_prev before a first participation is the run's w_0,
        which the client half then needs no copy of (one extra model download per client,
        until its first reply is aggregated)."""
        conf = msg.content.config_records.get(rk.CONFIG)
        if conf is not None and int(conf.get(rk.ACCOUNTED_ROUND, 0)) == 0:  # type: ignore[arg-type]
            msg.content.array_records[INITIAL] = self._initial

    def aggregate_train(self, server_round: int, replies: Iterable[Message],
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The project's checks and update; the model comes back under the user's keys.
        Replies that did not come from the client half are named (and stop the run after
        ``stop_after_foreign_rounds`` rounds of nothing else). The metrics: the user's, by
        ``train_metrics_aggr_fn`` over the accepted replies, then the project's round
        figures (counts, ``train-loss``, ``divergence``), which win a name both use."""
        replies = list(replies)
        self.client_half.check(server_round, replies)
        inner = self._built()
        arrays, metrics = inner.aggregate_train(server_round, replies)
        user = self.flower.train_metrics(replies, inner.last_rejections)
        spent = {} if self.budget is None else {  # each round is one release, as counted
            "dp-epsilon": self.budget.epsilon(server_round),  # by the project's experiment
            "dp-epsilon-add-remove": self.budget.epsilon_add_remove(server_round)}
        merged = MetricRecord({**dict(user), **dict(metrics or {}), **spent})
        if arrays is None:
            return None, merged
        return self.user_record(unpack(arrays)), merged

    def user_record(self, weights: list[Any]) -> ArrayRecord:
        """``weights`` as an ArrayRecord with the keys of the initial one (a state dict's
        names stay, so ``Result.arrays.to_torch_state_dict()`` loads into the model)."""
        if len(self._keys_of_arrays) != len(weights):
            return ArrayRecord(weights)
        return ArrayRecord({k: Array(w) for k, w in zip(self._keys_of_arrays, weights,
                                                         strict=True)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Flower's own FedAvg evaluation: the global model to ``fraction_evaluate`` nodes."""
        return self.evaluation.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        return self.evaluation.aggregate_evaluate(server_round, replies)


__all__ = ["ANY_FEDERATION", "ANY_LR", "BUFFER_NAMES", "COMMON_ARGS", "MethodAdapter"]
