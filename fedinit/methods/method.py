"""The shape every method has: parameters, a typed server state, a pure server update, a client
rule, and the spec that names them. Pure numpy: no Flower, no torch at import time.

A method module (``fedavg.py``, ``scaffold.py``, ...) declares one ``MethodSpec``; the registry
collects them; the run config is built from the registry. The Flower shell
(``strategies/method_strategy.py``) decodes every reply once into a ``ClientUpdate`` and calls the
method's ``ServerRule`` with the round's ``RoundInput``; the client app hands the
``ClientRule`` a ``LocalJob`` (the start point, its state, and the run's SGD pass) and sends up
what its ``train`` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from fedinit.methods.ri import weighted_mean
from fedinit.methods.weights import Weights

if TYPE_CHECKING:
    import torch
    from torch import nn

Combine = Callable[[Sequence[Weights], Sequence[float]], Weights]
"""The round's combination rule: one vector per reply and the weights -> one vector."""
GradientHook = Callable[[list["torch.Tensor"]], None]
"""Called after ``backward`` and before clipping with the model's parameters (grads set)."""
LossFn = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""loss_fn(model output, targets) -> scalar loss; cross-entropy for the image tasks."""
GradientFn = Callable[["nn.Module", list["torch.Tensor"], "torch.Tensor", "torch.Tensor",
                       LossFn], "torch.Tensor"]
"""gradient(model, params, xb, yb, loss_fn): set the grads of ``params`` for one batch and
return the loss the step reports. The default is ``loss_fn(model(xb), yb).backward()``;
FedSAM's takes the gradient at a perturbed point, a MOON-like method would add a term."""
LossesFn = Callable[[Sequence[Weights]], list[float]]
"""losses(models) -> each model's mean training loss on the client's own training data: no
gradient, no step, the same batches in the same order for every model (clustered FL's
loss-based assignment picks the cluster model that fits the client best)."""
Scalar = int | float
MOVES_SUM = "arrays"
"""``RoundInput.upload_sums``' key of the moves' sum: the model upload's record name
(``fedinit.methods.wire.ARRAYS``), under which the masked move travels."""


class ParamError(ValueError):
    """A method parameter the method cannot use: one line naming the key (the run config
    reports it as its own ``ConfigError``)."""


# ====================================================================== parameters
@dataclass(frozen=True)
class Params:
    """A method's own run-config keys. Subclasses add fields (name = key with '-' -> '_') and
    ``check``; their defaults live in pyproject.toml with every other default."""

    @classmethod
    def config_keys(cls) -> tuple[str, ...]:
        """The run-config keys this method reads."""
        return tuple(f.name.replace("_", "-") for f in dataclasses.fields(cls))

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> Params:
        """Build from already type-checked run-config values, then ``check``."""
        params = cls(**{f.name: values[f.name.replace("_", "-")]
                        for f in dataclasses.fields(cls)})
        params.check()
        return params

    def check(self) -> None:
        """Raise ParamError (one line naming the key) for a value the method cannot use."""

    def check_with_lr(self, lr: float) -> None:
        """Raise ParamError for a value the method cannot use at local learning rate ``lr``
        (round 1's, the largest: it only decays)."""


# ====================================================================== what a round hands in
@dataclass(frozen=True)
class ClientUpdate:
    """One accepted reply, decoded once: what a client uploaded and reported."""

    partition_id: int
    upload: Weights
    """The final model w_iK (``model`` variant) or the update Delta_i (``update``)."""
    extras: Mapping[str, Weights]
    """The method's extra uploads by record name (e.g. SCAFFOLD's Delta_c_i)."""
    num_examples: int
    train_loss: float
    num_steps: int
    metrics: Mapping[str, Any] = field(default_factory=dict)
    """The reply's metrics as sent, unchecked: a method's own (clustered FL's cluster choice)
    are checked by its ``ServerRule.reply_problem``."""
    upload_bytes: int = 0
    """The upload's encoded payload bytes as received (its wire arrays before decoding,
    compressed or not); 0 where the decoder did not measure it (a masked upload)."""


@dataclass(frozen=True)
class RoundInput:
    """Everything a server update may use about one round, besides its state and w_t."""

    server_round: int
    aggregate: Weights
    """D: the round's aggregate update (``ri.aggregate_update`` under the RI variant)."""
    updates: Sequence[ClientUpdate]
    weights: Sequence[float]
    """Each update's weight in D's mean (examples, or 1 under ``weighting=uniform``)."""
    variant: str
    """The RI aggregation variant: ``model`` or ``update``."""
    num_clients: int
    """N, all clients of the federation (SCAFFOLD and FedDyn average over all of them)."""
    lr: float
    """The round's local learning rate eta_t."""
    server_lr: float
    combine: Combine = weighted_mean
    """The round's rule (``aggregation``): one vector per reply of ``updates`` -> one, with
    ``weights``. The rule D was built by; a method combines its extra uploads with it."""
    aggregation: str = "mean"
    """The ``aggregation`` choice ``combine`` implements (``mean``: the weighted mean)."""
    upload_sums: Mapping[str, Weights] | None = None
    """Under secure aggregation, where ``updates`` carry no arrays: the exact sums over
    ``updates`` of the moves (key ``MOVES_SUM``) and of each extra upload (by name); None
    where the uploads are seen. Read them through ``upload_sum`` and ``extra_sum``."""

    def extra_sum(self, key: str) -> Weights:
        """The sum over ``updates`` of extra upload ``key`` (float64): the secure sum when
        there is one, else ``sum_of`` the uploads (the rule's sum under a robust rule)."""
        if self.upload_sums is not None:
            return [a.astype(np.float64) for a in self.upload_sums[key]]
        return self.sum_of([up.extras[key] for up in self.updates])

    def upload_sum(self, w_t: Weights) -> Weights:
        """The exact float64 sum over ``updates`` of each client's move as the server sees it
        (``moves``): the secure sum of the masked moves when there is one."""
        if self.upload_sums is not None:
            return [a.astype(np.float64) for a in self.upload_sums[MOVES_SUM]]
        total = [np.zeros(w.shape, dtype=np.float64) for w in w_t]
        for move in self.moves(w_t):
            for acc, d in zip(total, move, strict=True):
                acc += d
        return total

    def sum_of(self, vectors: Sequence[Weights]) -> Weights:
        """What replaces a method's sum over the replies: the exact float64 sum under ``mean``
        (as before robust rules existed); otherwise m * combine(vectors, uniform weights)
        with m = len(vectors), the sum's scale with the rule's robustness (under Krum and
        Multi-Krum, m * the uniform mean of the selected replies is again their sum). No
        vectors (a robust selection screened every extra upload): zeros shaped like D."""
        if not vectors:
            return [np.zeros(np.shape(a), dtype=np.float64) for a in self.aggregate]
        if self.aggregation == "mean":
            total = [np.zeros(a.shape, dtype=np.float64) for a in vectors[0]]
            for vec in vectors:
                for acc, d in zip(total, vec, strict=True):
                    acc += d
            return total
        m = float(len(vectors))
        return [m * a.astype(np.float64) for a in self.combine(vectors, [1.0] * len(vectors))]

    def combine_scalars(self, values: Sequence[float]) -> float:
        """One number per reply (e.g. FedCM's step counts) combined by the rule and weights
        D was built with: np.average with ``weights`` under ``mean``, else ``combine``."""
        if self.aggregation == "mean":
            return float(np.average(np.asarray(values, dtype=np.float64),
                                    weights=list(self.weights)))
        out = self.combine([[np.asarray([v], dtype=np.float64)] for v in values],
                           list(self.weights))
        return float(out[0][0])

    def moves(self, w_t: Weights) -> list[Weights]:
        """Each client's move as the server sees it: Delta_i (``update``) or w_iK - w_t."""
        if self.variant == "update":
            return [list(u.upload) for u in self.updates]
        return [[u.astype(np.float64) - w for u, w in zip(up.upload, w_t, strict=True)]
                for up in self.updates]


def gradient_hook(device: torch.device, *, scale: float = 1.0, anchor: Weights | None = None,
                  pull: float = 0.0, shift: Weights | None = None) -> GradientHook | None:
    """Each step's gradient g (before clipping) becomes scale * g + pull * (w - anchor) + shift,
    in that order: FedCM's alpha * g + (1 - alpha) * d, FedDyn's g + alpha * (w - s_i) +
    alpha * h_i, SCAFFOLD's g + (c - c_i), the proximal pull (``proximal_hook``). None where
    it changes nothing (scale 1, pull 0, no shift)."""
    import torch

    centre = None if anchor is None or pull == 0.0 else [
        torch.from_numpy(a).to(device) for a in anchor]
    offset = None if shift is None else [torch.from_numpy(s).to(device) for s in shift]
    if scale == 1.0 and centre is None and offset is None:
        return None

    def hook(params: list[torch.Tensor]) -> None:
        grads: list[torch.Tensor] = []
        for p in params:
            assert p.grad is not None
            grads.append(p.grad)
        if scale != 1.0:
            for g in grads:
                g.mul_(scale)
        if centre is not None:
            for p, g, c in zip(params, grads, centre, strict=True):
                g.add_(p.detach() - c, alpha=pull)
        if offset is not None:
            for g, k in zip(grads, offset, strict=True):
                g.add_(k)

    return hook


def proximal_hook(anchor: Weights, strength: float,
                  device: torch.device) -> GradientHook | None:
    """The gradient of (strength / 2) ||w - anchor||^2 added to each step's gradient (before
    clipping): FedProx's pull to its start point, Ditto's pull of v_i to w_t. None at 0."""
    return gradient_hook(device, anchor=anchor, pull=strength)


def apply_step(w_t: Weights, update: Weights, eta: float) -> Weights:
    """w_t + eta * D in float64, returned as float32: FedAvg's server rule."""
    return [(w.astype(np.float64) + eta * d.astype(np.float64)).astype(np.float32)
            for w, d in zip(w_t, update, strict=True)]


def zeros_like(w: Weights, dtype: type = np.float32) -> Weights:
    return [np.zeros(a.shape, dtype=dtype) for a in w]


# ====================================================================== server half
class ModelFiles(Protocol):
    """The server's copy of each client's model, by version (``fedinit/store/server_models.py``)."""

    def read(self, partition_id: int, version: int) -> Weights:
        """The model client ``partition_id`` uploaded in round ``version``."""
        ...

    def write(self, partition_id: int, version: int, model: Weights, current: int) -> None:
        """Store version ``version``, keep version ``current`` (what the last checkpoint
        names), drop any other."""
        ...


class ReportFiles(Protocol):
    """Where a method writes what it reports into the run directory
    (``strategies/run_reports.py``: ``RunReports``), atomically and without knowing the store."""

    def replace_text(self, name: str, text: str) -> None:
        """Write file ``name`` whole; readers see the old or the new content, never half."""
        ...

    def append_line(self, name: str, line: str) -> None:
        """Append one line (a newline is added) to file ``name``."""
        ...

    def draw_graph(self, name: str, graph: list[np.ndarray], num_clients: int,
                   title: str) -> None:
        """Draw ``graph`` (``fedinit.methods.graph``'s edge list) over ``num_clients`` as PNG
        ``name``."""
        ...


@dataclass(frozen=True)
class ClientDown:
    """One client's own message content (``ServerRule.down_to``): the model-shaped array sent
    in place of the global model, and the method's extra arrays (its ``down_keys``)."""

    model: Weights
    extras: Mapping[str, Weights] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerState:
    """A method's server state: model-shaped fields only, all checkpointed. Empty for
    methods that keep none (FedAvg, FedProx, FedSAM)."""

    def arrays(self) -> dict[str, Weights]:
        """Field name -> arrays, for a checkpoint."""
        return {f.name: list(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_arrays(cls, saved: Mapping[str, Weights]) -> ServerState:
        """The state a checkpoint holds; ValueError naming what is missing or extra."""
        names = {f.name for f in dataclasses.fields(cls)}
        if set(saved) != names:
            raise ValueError(f"checkpoint holds server state {sorted(saved)}, "
                             f"{cls.__name__} has {sorted(names)}")
        return cls(**{name: list(saved[name]) for name in names})


S = TypeVar("S", bound=ServerState)
P = TypeVar("P", bound=Params)


class ServerRule(Generic[P, S]):
    """A method's server half as pure functions of (params, state, round)."""

    state_type: ClassVar[type[ServerState]] = ServerState
    up_keys: ClassVar[tuple[str, ...]] = ()
    """Extra ArrayRecords each reply must carry (model-shaped)."""
    per_client_refusal: ClassVar[str] = ""
    """Why RI (beta != 0, ``ri-aggregation=update``) and DP cannot run with the method (the
    run config refuses them with this reason); '' where they compose."""
    robust_refusal: ClassVar[str] = ""
    """Why the method's server state cannot be built by a robust ``aggregation`` (the run
    config refuses the combination with this reason); '' where ``RoundInput.combine`` and
    ``sum_of`` cover every uploaded vector."""
    dp_refusal: ClassVar[str] = ""
    """Why client-level DP (``dp`` != off) cannot run with the method: its update uses a
    data-dependent value the clipping and noise do not cover (the run config refuses the
    combination with this reason); '' where DP composes."""
    replaces_models: ClassVar[bool] = False
    """True where the state holds each client's own model and a reply's upload replaces it
    (FedRelax). Under ``rounds=async`` the loop then hands ``update`` the uploads themselves
    (``variant`` ``model``, not deltas against the task's version), s(tau) has nothing to
    weight, and each task keeps the content its message carried (``down_to``'s, built at
    send time) for a resume to re-send as it went out."""

    def __init__(self, params: P) -> None:
        self.params = params

    def init(self, w0: Weights) -> S:
        """The state before round 1."""
        return self.state_type()  # type: ignore[return-value]

    def down(self, state: S) -> dict[str, Weights]:
        """Extra arrays sent to every sampled client with the model (e.g. SCAFFOLD's c)."""
        return {}

    def down_to(self, state: S, partition_id: int, w_t: Weights) -> ClientDown | None:
        """What client ``partition_id`` receives in place of the shared message (w_t and
        ``down(state)``), for a method whose clients each get their own content (FedRelax's
        neighbourhood term, a cluster's model); None (the default): the shared message."""
        return None

    def evaluated_model(self, state: S, partition_id: int, w_t: Weights) -> Weights | None:
        """The model personalized evaluation scores as client ``partition_id``'s (a) where it
        is not the model of its train message (clustered FL's client with no cluster yet);
        None (the default): that model (``down_to``'s, or w_t)."""
        return None

    def evaluation_choices(self, state: S, partition_id: int) -> list[Weights] | None:
        """Models personalized evaluation lets client ``partition_id`` choose its (a) from,
        by the lowest loss on its own training data (IFCA's inference rule: a method with
        group models, asked to serve so); None (the default): it is scored on the model of
        ``evaluated_model`` (or its train message's)."""
        return None

    @classmethod
    def async_refusal(cls, values: Mapping[str, Any]) -> tuple[str, Any, str, str] | None:
        """(key, value, what is allowed, why) for a value of the method's run-config keys
        (``values``, by key, before ``Params.check``) it cannot run under ``rounds=async``
        with (the run config refuses it in one line); None: none."""
        return None

    def bind(self, models: ModelFiles, results: ReportFiles | None) -> None:
        """Where the method may keep per-client models (``models``, on disk) and write what it
        reports (``results``: files of the run directory; None in tests without one); given by
        the server app before round 1 or a resume. Methods that keep none ignore it."""

    def update(self, state: S, w_t: Weights, rnd: RoundInput) -> tuple[Weights, S]:
        """(w_{t+1}, the new state). FedAvg's rule: w_t + eta_g * D, state unchanged."""
        return apply_step(w_t, rnd.aggregate, rnd.server_lr), state

    def reply_problem(self, update: ClientUpdate, expected_steps: int | None) -> str | None:
        """Why a decoded reply cannot be used by this method, or None. ``expected_steps`` is
        the client's true local step count when the server knows its size."""
        return None

    def extra_fallback_limit(self, key: str, state: S, move_limit: float, lr: float) -> float:
        """Norm bound of extra upload ``key`` in a round without reference norms, given the
        model move's bound; the model's own bound unless the method knows better."""
        return move_limit


# ====================================================================== client half
@dataclass(frozen=True)
class TrainedPass:
    """What one pass of local SGD ends with and reports."""

    final: Weights
    mean_loss: float
    """The mean loss of the pass's steps (at the unperturbed point for SAM)."""
    num_steps: int
    num_examples: int


class SgdPass(Protocol):
    """The run's local SGD (epochs, batch size, lr, weight decay, clipping, loss, data), given
    by the client shell (``client_app/trainer.py``): a method changes a pass only through
    these arguments, so every method's loop is the one the trainer tests check."""

    def __call__(self, start: Weights, hook: GradientHook | None = None, *,
                 gradient: GradientFn | None = None, stream: int = 0) -> TrainedPass:
        """Train from ``start``. ``hook`` corrects each gradient (before clipping);
        ``gradient`` replaces the batch gradient itself (default: backward of the loss);
        ``stream`` picks the shuffling order (0: the global pass; 2 is personalized
        evaluation's fine-tuning; a method's own extra passes take 1 or >= 3)."""
        ...


@dataclass(frozen=True)
class LocalJob:
    """One participation as a method's client half sees it."""

    w_t: Weights
    """The global model the server sent."""
    start: Weights
    """The RI start point s_i (w_t itself at beta = 0)."""
    down: Mapping[str, Weights]
    """The method's extra arrays from the server (``ClientRule.down_keys``)."""
    state: Mapping[str, Weights]
    """The client's stored state (``ClientRule.state_keys``; ``initial_state`` before any)."""
    lr: float
    device: torch.device
    sgd: SgdPass
    losses: LossesFn | None = None
    """The models' mean losses on the client's own training data (``LossesFn``); None where
    the client shell gives none (a method that needs it refuses to train without)."""


@dataclass(frozen=True)
class LocalOutcome:
    """What a participation ends with: the pass whose final model is uploaded, the client's
    new method state, and the method's extra uploads."""

    trained: TrainedPass
    state: dict[str, Weights]
    extras: dict[str, Weights]
    metrics: dict[str, Scalar] = field(default_factory=dict)
    """Numbers the method reports beside the usual metrics (clustered FL's cluster choice);
    the reply's MetricRecord carries them under these names."""


class ClientRule(Generic[P]):
    """A method's client half. The base class is FedAvg's: nothing added to local SGD.

    ``train`` is the whole participation; its default is one pass of local SGD with the
    ``begin`` hook, then ``finish``. A method that changes the gradient, the loss or the
    passes (FedSAM, Ditto) overrides ``train``; one that only corrects the gradient or keeps
    state overrides ``begin``/``finish``.
    """

    state_keys: ClassVar[tuple[str, ...]] = ()
    """Per-client arrays kept between participations (besides RI's w_prev)."""
    down_keys: ClassVar[tuple[str, ...]] = ()
    """Extra ArrayRecords the server sends with the model."""
    accounted_keys: ClassVar[tuple[str, ...]] = ()
    """State keys whose changes the server sums into its own state (SCAFFOLD's c_i, FedDyn's
    h_i). A client starts them from the version of its last *aggregated* reply, which the
    server names in each message, so a late, rejected or lost reply cannot make the client's
    state drift from the server's (``fedinit.store.client_store``). The other keys (RI's w_prev,
    Ditto's v_i) the server never sums: they stay the newest."""
    uploaded_changes: ClassVar[Mapping[str, str]] = {}
    """Extra uploads that are the change of an accounted key, {upload: state key} (SCAFFOLD's
    Delta_c_i of c_i): under a lossy upload codec the key moves by what the server decodes,
    so the server's sum of the changes stays the sum of the keys
    (``fedinit.methods.upload_codec``)."""
    personal_key: ClassVar[str] = ""
    """State key of the client's own personal model (Ditto's v_i), which personalized
    evaluation scores as the client's own; one of ``state_keys``. '' for none: RI's w_prev
    is then the client's own model."""

    def __init__(self, params: P) -> None:
        self.params = params

    def initial_state(self, key: str, w_t: Weights) -> Weights:
        """State ``key`` of a client that has none stored yet; zeros unless the method says."""
        return [np.zeros_like(a) for a in w_t]

    def train(self, job: LocalJob) -> LocalOutcome:
        """One participation: local SGD from ``job.start``, the new state and extra uploads."""
        trained = job.sgd(job.start, self.begin(job.start, job.down, job.state, job.lr,
                                                job.device))
        new_state, extras = self.finish(job.start, trained.final, trained.num_steps, job.lr,
                                        job.down, job.state)
        return LocalOutcome(trained, new_state, extras)

    def begin(self, start: Weights, down: Mapping[str, Weights], state: Mapping[str, Weights],
              lr: float, device: torch.device) -> GradientHook | None:
        """A gradient correction for local training from ``start``, if the method has one."""
        return None

    def finish(self, start: Weights, final: Weights, num_steps: int, lr: float,
               down: Mapping[str, Weights], state: Mapping[str, Weights],
               ) -> tuple[dict[str, Weights], dict[str, Weights]]:
        """(the client's new state, its extra uploads) after local training; pure."""
        return dict(state), {}


# ====================================================================== the spec
@dataclass(frozen=True)
class MethodSpec:
    """One method as the registry knows it."""

    name: str
    """The run-config ``method`` value."""
    label: str
    """How tables and plots name it (its +RI variant appends '+RI'; FedAvg's is FedInit)."""
    params: type[Params]
    server: type[ServerRule[Any, Any]]
    client: type[ClientRule[Any]]
    ri_aggregation: str
    """What ``ri-aggregation=auto`` means for it (docs/algorithms.md, section RI)."""
    server_lr: float = 1.0
    """What ``server-lr=0`` (the default) means for it."""
    ri_label: str = field(default="")
    """The name of the method with RI (beta != 0); '' means label + '+RI'."""
    async_refusal: str | None = field(kw_only=True)
    """Why ``rounds=async`` refuses the method, in one line; None where its server rule runs
    on a buffer (docs/algorithms.md, FedBuff). No default, so a new method states it. A value
    of its own keys it cannot run async with is ``ServerRule.async_refusal``'s."""
    secagg_refusal: str | None = field(kw_only=True)
    """Why ``secure-aggregation=secagg+`` refuses the method, in one line: its server needs
    more than the round's sums. None where the sums suffice; no default, as above."""

    def label_with(self, beta: float) -> str:
        """The label of this method at RI coefficient ``beta``."""
        if beta == 0.0:
            return self.label
        return self.ri_label or f"{self.label}+RI"


def check_range(key: str, value: float, ok: bool, allowed: str) -> None:
    """Raise the run config's one-line error when ``ok`` is False."""
    if not ok:
        raise ParamError(f"run config: {key}={value!r} is not allowed; allowed: {allowed}")


def check_pull(key: str, strength: float, lr: float) -> None:
    """A pull ``strength * (w - anchor)`` added to the gradient, taken in plain SGD steps of
    size ``lr``, scales the distance to the anchor by ``1 - lr * strength`` per step: from
    ``lr * strength >= 2`` on it grows every step, whatever the data, and the model diverges."""
    if lr * strength >= 2.0:
        raise ParamError(f"run config: {key}={strength!r} is not allowed; allowed: less than "
                         f"2 / lr = {2.0 / lr:g} at lr={lr!r} (each step of size lr x {key} "
                         f">= 2 moves the model further from its anchor: it diverges)")


__all__ = ["ParamError", "Combine", "GradientHook", "GradientFn", "LossFn", "LossesFn",
           "Scalar", "MOVES_SUM", "Params",
           "ClientUpdate", "RoundInput", "ClientDown", "ModelFiles", "ReportFiles", "ServerState",
           "ServerRule", "TrainedPass", "SgdPass",
           "LocalJob", "LocalOutcome", "ClientRule", "MethodSpec", "apply_step", "gradient_hook",
           "proximal_hook", "zeros_like",
           "check_range", "check_pull"]
