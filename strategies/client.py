"""The client half of every method, for a user's own ClientApp and a plain PyTorch step.

A ClientApp trained by a ``strategies`` server replaces its own training loop by one call:

    return method_train(msg, context, model, trainloader, epochs=2)

The server names the method and its parameters in the message (``strategies/wire.py``), so
the same line serves FedInit, SCAFFOLD, FedDyn and the others. ``step(model, batch)``, the
user's train step, returns the batch loss (default: cross-entropy of ``model(x)`` on ``y``
for ``(x, y)`` batches); the loop around it is the project's: the batch gradient -> the
method's correction (SCAFFOLD's c - c_i, FedDyn's alpha (w - s_i) + alpha h_i, ...) ->
gradient clipping -> the optimizer's step (SGD at the round's lr by default).

The state is the project client's, in the same places and under the same names
(``fedinit.store.client_store``): RI's w_prev (the last local model; before the first
participation the run's w_0: ``initial()``, else the w_0 a ``strategies`` server sends),
SCAFFOLD's c_i, FedDyn's h_i and Ditto's v_i, kept in ``context.state`` and, with
``state_dir``, also in versioned files that survive a node restart. The accounted-round
rule holds: c_i and h_i start from the version of the client's last reply the server
aggregated, which the server names in each message.

The rules themselves are ``fedinit/methods/`` (``ClientRule.train``, ``ri.relaxed_start``,
``ri.upload_vector``); ``participate`` is one participation around them, free of Flower's
message and of the user's data, so any client (the project's too) can call it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from torch import nn

from fedinit.methods import wire as rk
from fedinit.methods.method import (
    ClientRule,
    GradientFn,
    GradientHook,
    LocalJob,
    LossesFn,
    SgdPass,
    TrainedPass,
)
from fedinit.methods.packed_arrays import shapes, unpack
from fedinit.methods.registry import METHODS
from fedinit.methods.ri import relaxed_start, upload_vector
from fedinit.methods.upload_codec import OFF, encode_reply, residual_keys
from fedinit.methods.weights import Weights
from fedinit.secure_aggregation.wire import RECORD as SECAGG
from fedinit.store.client_store import W_PREV, ClientStore
from fedinit.store.path_names import PathError
from fedinit.store.state_dir import StateDir
from fedinit.task.models import get_weights, set_weights
from fedinit.task.sgd_step import sgd_step
from strategies.device_privacy import (
    DeviceFloor,
    DeviceRelease,
    account_release,
    device_floor_mod,
    ledger_for,
    local_dp,
    train_metrics,
    under_floor,
)
from strategies.wire import INITIAL, asked_release, client_rule, release_of

TASK = "train message"
"""How a refusal names the task (``strategies.device_privacy.refusal``)."""

Step = Callable[[nn.Module, Any], torch.Tensor]
"""The user's train step: step(model, batch) -> the batch's scalar loss (not yet backward)."""
Optimizer = Callable[[list[nn.Parameter], float], torch.optim.Optimizer]
"""optimizer(parameters, lr) -> a torch optimizer; plain SGD at the round's lr by default."""
Release = Callable[[Weights, dict[str, Weights]], tuple[Weights, dict[str, Weights]]]
"""What the uploads pass through before they leave (``Mechanism.release``: under
``privacy=DistributedDP(...)`` clipped, this client's noise share added)."""


def cross_entropy_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """The default step: cross-entropy of ``model(x)`` on ``y`` for an ``(x, y)`` batch."""
    x, y = batch[0], batch[1]
    device = next(model.parameters()).device
    return nn.functional.cross_entropy(model(x.to(device)), y.to(device))


def sgd(parameters: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The default optimizer: plain SGD, the update SCAFFOLD's c_i formula assumes."""
    return torch.optim.SGD(parameters, lr=lr)


def check_model(model: nn.Module) -> None:
    """The methods' state vectors are the parameter list (``fedinit.task.models.get_weights``): a
    model whose state dict holds more (BatchNorm's running statistics) is refused."""
    extra = len(model.state_dict()) - len(list(model.parameters()))
    if extra:
        raise ValueError(f"the model's state dict holds {extra} entries besides its "
                         "parameters (buffers such as BatchNorm statistics, or shared "
                         "weights); the methods keep parameter-shaped state: use GroupNorm "
                         "or LayerNorm")


class _StepModule(nn.Module):
    """The user's step as a module whose output is the loss, so a method's own batch
    gradient (FedSAM's ``GradientFn``: ``loss_fn(model(xb), yb)``) runs on any batch."""

    def __init__(self, model: nn.Module, step: Step) -> None:
        super().__init__()
        self.model = model
        self.step = step

    def forward(self, batch: Any) -> torch.Tensor:
        return self.step(self.model, batch)


def _the_loss(output: torch.Tensor, _: Any) -> torch.Tensor:
    return output


def _backward(step: Step, model: nn.Module, batch: Any) -> torch.Tensor:
    """The plain batch gradient of the user's step: backward of its loss."""
    loss = step(model, batch)
    loss.backward()
    return loss


def user_pass(model: nn.Module, trainloader: Iterable[Any], *, epochs: int, lr: float,
              step: Step = cross_entropy_step, optimizer: Optimizer = sgd,
              clip_norm: float = 0.0, num_examples: int) -> SgdPass:
    """The ``SgdPass`` a method's client rule trains with, over the user's batches: each
    call trains ``model`` from ``start`` for ``epochs`` passes over ``trainloader``."""
    wrapped = _StepModule(model, step)

    def run(start: Weights, hook: GradientHook | None = None, *,
            gradient: GradientFn | None = None, stream: int = 0) -> TrainedPass:
        del stream  # the user's loader shuffles as it does
        set_weights(model, list(start))
        model.train()
        params = list(model.parameters())
        opt = optimizer(params, lr)
        loss_sum, steps = 0.0, 0
        for _ in range(epochs):
            for batch in trainloader:
                batch_gradient = (partial(_backward, step, model, batch) if gradient is None
                                  else partial(gradient, wrapped, params, batch, None, _the_loss))
                loss_sum += sgd_step(opt, params, batch_gradient, hook, clip_norm)
                steps += 1
        if steps == 0:
            raise ValueError("the train loader gave no batch: a participation needs at least "
                             "one local step")
        return TrainedPass(get_weights(model), loss_sum / steps, steps, num_examples)

    return run


def user_losses(model: nn.Module, trainloader: Iterable[Any],
                step: Step = cross_entropy_step) -> LossesFn:
    """The ``LossesFn`` over the user's batches: each model's mean batch loss (``step``, in
    evaluation mode, no gradients) over one pass of ``trainloader``. The pass is shared (each
    batch is scored by every model), so all models see the same batches even when the loader
    shuffles."""

    def run(models: Sequence[Weights]) -> list[float]:
        copies = []
        for w in models:
            m = copy.deepcopy(model)
            set_weights(m, list(w))
            m.eval()
            copies.append(m)
        sums, batches = [0.0] * len(copies), 0
        with torch.no_grad():
            for batch in trainloader:
                for i, m in enumerate(copies):
                    sums[i] += float(step(m, batch))
                batches += 1
        if batches == 0:
            raise ValueError("the train loader gave no batch: no training loss to compare")
        return [s / batches for s in sums]

    return run


def participate(rule: ClientRule[Any], received: RecordDict, store: ClientStore,
                make_sgd: Callable[[int, float], SgdPass], device: torch.device, *,
                initial: Callable[[], Sequence[np.ndarray]] | None = None,
                release: Release | None = None, losses: LossesFn | None = None,
                seed: int = 0, client_id: int | None = None,
                timed: Callable[[float], None] | None = None) -> RecordDict:
    """One participation on a restored ``store``: the RI start from w_prev, the method's
    ``rule.train`` with ``make_sgd(round, lr)``, the new state put into ``store`` (the caller
    saves it), and the reply's content. The project's ClientApp runs this too
    (``client_app/round.py``). ``initial`` gives w_0 for a client without w_prev (None: the
    received model, so RI starts at its second participation); ``release`` clips (and under
    local DP noises) the upload before it is compressed; ``losses`` scores models on the
    client's training data (clustered FL's loss-based assignment needs it); ``seed`` and
    ``client_id`` (default: the id the message names) seed the compression's stochastic
    rounding; ``timed`` is handed the local training's seconds, also sent as
    ``compute-seconds``."""
    conf = received.config_records[rk.CONFIG]
    server_round, lr, beta = int(conf[rk.ROUND]), float(conf[rk.LR]), float(conf[rk.BETA])  # type: ignore[arg-type]
    delta = bool(conf[rk.UPLOAD_DELTA])
    w_t = unpack(received.array_records[rk.ARRAYS])
    w_prev = store.get(W_PREV)
    if w_prev is None:
        w_prev = [a.copy() for a in w_t] if initial is None else list(initial())
        if server_round == 1 and beta != 0.0 and not _same(w_prev, w_t):
            log(WARNING, "client: initial() is not the server's round-1 model; RI's w_prev "
                "before a first participation should be the run's w_0")
    start = relaxed_start(w_t, w_prev, beta)
    method_state = {k: store.get(k) or rule.initial_state(k, w_t) for k in rule.state_keys}
    down = {k: unpack(received.array_records[k]) for k in rule.down_keys}
    t0 = time.perf_counter()
    outcome = rule.train(LocalJob(w_t=w_t, start=start, down=down, state=method_state, lr=lr,
                                  device=device, sgd=make_sgd(server_round, lr),
                                  losses=losses))
    seconds = time.perf_counter() - t0
    if timed is not None:
        timed(seconds)
    trained = outcome.trained
    store.put(W_PREV, trained.final)
    for key, arrays in outcome.state.items():
        store.put(key, arrays)
    upload = upload_vector(trained.final, start, "update" if delta else "model")
    extras = outcome.extras
    if release is not None:
        upload, extras = release(upload, extras)
    metrics = MetricRecord({rk.NUM_EXAMPLES: trained.num_examples,
                            rk.TRAIN_LOSS: trained.mean_loss, rk.NUM_STEPS: trained.num_steps,
                            rk.COMPUTE_SECONDS: seconds,
                            **outcome.metrics})  # the method's own (clustered FL's choice)
    records, said = encode_reply(  # compressed as the message asks (fedinit.methods.upload_codec)
        str(conf.get(rk.COMPRESSION, OFF)), upload, extras, w_t=w_t, delta=delta, state=store,
        seed=seed, server_round=server_round,
        client_id=int(conf.get(rk.CLIENT_ID, 0) if client_id is None else client_id),  # type: ignore[arg-type]
        changes={up: (key, method_state[key]) for up, key in rule.uploaded_changes.items()})
    return RecordDict({**records, rk.METRICS: metrics, rk.CONFIG: said})


def _same(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y)
                                    for x, y in zip(a, b, strict=True))


def client_store(context: Context, config: ConfigRecord,
                 state_dir: str | Path | None = None) -> tuple[ClientStore, str]:
    """(this node's store, the experiment id): memory is ``context.state``; with
    ``state_dir`` the versions are also files under ``<state_dir>/<experiment>/client-<id>/``
    (``fedinit.store.state_dir``), the id being the client id the server names. The experiment is
    the server's ``experiment-id`` when it sends one, else the run's id."""
    experiment = str(config.get(rk.EXPERIMENT) or f"run-{context.run_id}")
    disk = None
    if state_dir:
        cid = config.get(rk.CLIENT_ID)
        disk = StateDir(Path(state_dir), experiment,
                        int(context.node_id if cid is None else cid))  # type: ignore[arg-type]
    return ClientStore(memory=context.state, disk=disk), experiment


def method_train(msg: Message, context: Context, model: nn.Module,
                 trainloader: Iterable[Any], *, epochs: int = 1, step: Step = cross_entropy_step,
                 optimizer: Optimizer = sgd, clip_norm: float = 0.0,
                 initial: Callable[[], Sequence[np.ndarray]] | None = None,
                 state_dir: str | Path | None = None,
                 num_examples: int | None = None) -> Message:
    """Train ``model`` on ``trainloader`` as the method the server names, and reply.

    ``num_examples`` (the reply's weight) defaults to ``len(trainloader.dataset)``;
    ``initial`` gives the run's w_0 (module docstring); None takes the w_0 a ``strategies``
    server sends a client before its first aggregated reply (``strategies.wire.INITIAL``),
    else the received model; ``state_dir`` adds the files. In a SecAgg+ round
    (``secure_aggregation=SecAgg()``) the reply carries only the masked upload, as the
    project's ClientApp's does (``strategies.secure_upload``): the app's
    ``@app.query()`` must return ``method_query(msg, context)`` for the protocol's stages.

    The device's privacy is the device's, as in the project's ClientApp
    (``strategies.device_privacy``): a floor in the node config (``dp-floor="local"``,
    ``dp-max-clip``, ``dp-min-noise``, ...) refuses a task that asks for less in one log line
    and an error reply, before anything is read. Under local DP (``privacy=LocalDP(...)``,
    or a floor) the upload is clipped and noised here, the release is counted in the
    device's ledger (``dp-ledger`` or ``state-dir`` of the node config, else ``state_dir``,
    else ``context.state``) before the reply leaves, the reply carries no train loss, step
    or example count, and a task that fails replies only that it failed.
    """
    if initial is not None and not callable(initial):
        raise ValueError(f"initial= a {type(initial).__name__} is not allowed; allowed: None "
                         "(a strategies server sends w_0) or a function () -> the run's w_0 "
                         "arrays")
    sent = msg.content.array_records.get(INITIAL)
    if initial is None and sent is not None:  # decoded only for a client without w_prev
        initial = partial(unpack, sent)
    conf = msg.content.config_records[rk.CONFIG]
    name, rule = client_rule(conf)
    asked = DeviceRelease(asked_release(conf), 1 + len(METHODS[name].server.up_keys))
    check_model(model)
    return under_floor(
        msg, context, asked, TASK, lambda floor: _train(
            msg, context, conf, name, rule, model, trainloader, epochs, step, optimizer,
            clip_norm, initial, state_dir, num_examples,
            (floor, asked) if local_dp(asked, floor) else None),
        refused=(PathError,))


def _train(msg: Message, context: Context, conf: ConfigRecord, name: str,
           rule: ClientRule[Any], model: nn.Module, trainloader: Iterable[Any], epochs: int,
           step: Step, optimizer: Optimizer, clip_norm: float,
           initial: Callable[[], Sequence[np.ndarray]] | None, state_dir: str | Path | None,
           num_examples: int | None, local: tuple[DeviceFloor, DeviceRelease] | None) -> Message:
    """``method_train``'s participation once the device's floor admits it; ``local``: the
    floor and the release under local DP (the ledger read before any data, the release
    counted before the reply leaves, no per-client figure in it)."""
    # clipped, and noised: under DistributedDP this client's share, under LocalDP in full
    mechanism = release_of(conf)
    if num_examples is None:
        dataset = getattr(trainloader, "dataset", None)
        if dataset is None:
            raise ValueError("the train loader has no .dataset to count: pass num_examples= "
                             "(the reply's weight)")
        num_examples = len(dataset)
    n = num_examples
    store, experiment = client_store(context, conf, state_dir)
    ledger = None if local is None else ledger_for(local[0], context, store)
    server_round = int(conf[rk.ROUND])  # type: ignore[arg-type]
    accounted = conf.get(rk.ACCOUNTED_ROUND)
    fell_back = store.restore(experiment, server_round,
                              shapes(msg.content.array_records[rk.ARRAYS]),
                              None if accounted is None else int(accounted),  # type: ignore[arg-type]
                              (*rule.accounted_keys,  # and top-k's residuals
                               *residual_keys(str(conf.get(rk.COMPRESSION, OFF)),
                                              METHODS[name].server.up_keys)))

    def make_sgd(_: int, lr: float) -> SgdPass:
        return user_pass(model, trainloader, epochs=epochs, lr=lr, step=step,
                         optimizer=optimizer, clip_norm=clip_norm, num_examples=n)

    content = participate(rule, msg.content, store, make_sgd,
                          next(model.parameters()).device, initial=initial,
                          release=None if mechanism is None else mechanism.release,
                          losses=user_losses(model, trainloader, step))
    if local is not None:  # each figure depends on the device's data: none leaves
        content.metric_records[rk.METRICS] = train_metrics(True, {})
    if SECAGG in msg.content.config_records:  # only the masked upload leaves, no figure
        from strategies.secure_upload import mask_upload  # the protocol: only under SecAgg+

        content = mask_upload(msg.content, content, context.state, _client_id(conf, context))
    else:
        content.metric_records[rk.METRICS][rk.STATE_FALLBACK] = int(fell_back)
    if ledger is not None and local is not None:  # one noised channel per upload
        account_release(ledger, msg, local[1].multiplier, local[1].channels)
    store.save(experiment, server_round, pin=rk.kept_rounds(conf))
    return Message(content=content, reply_to=msg)


def _client_id(conf: ConfigRecord, context: Context) -> int:
    """The client id the server names in the message (its node id when it names none)."""
    sent = conf.get(rk.CLIENT_ID)
    return int(context.node_id if sent is None else sent)  # type: ignore[arg-type]


def method_query(msg: Message, context: Context) -> Message:
    """The answer to a ``strategies`` server's query: a SecAgg+ protocol stage (setup, share
    keys, consistency check, unmask; ``secure_aggregation=SecAgg()``) is answered by this
    node's protocol client, whose secrets stay in ``context.state``; any other query gets an
    empty reply. Return it from the ClientApp's ``@app.query()`` function. The keys are not
    signed: signed SecAgg+ keys (a device's signing key in its node config) are the project's
    ClientApp's (``client_app/secagg_trust.py``)."""
    if SECAGG not in msg.content.config_records:
        return Message(content=RecordDict(), reply_to=msg)
    from strategies.secure_upload import secagg_step  # the protocol: only under SecAgg+

    conf = msg.content.config_records.get(rk.CONFIG) or ConfigRecord()
    reply = secagg_step(msg.content.config_records[SECAGG], context.state,
                        _client_id(conf, context), None, context.run_id,
                        int(conf.get(rk.ROUND, 0)))  # type: ignore[arg-type]
    return Message(content=RecordDict({SECAGG: reply}), reply_to=msg)


def stored_state(context: Context) -> dict[str, Weights]:
    """The method state this node holds in ``context.state`` (w_prev, c_i, h_i, v_i, ...),
    by the project's names: e.g. to score Ditto's personal model ``ditto-v``."""
    return ClientStore(memory=context.state).entries()


__all__ = ["Optimizer", "Release", "Step", "check_model", "client_store", "cross_entropy_step",
           "device_floor_mod", "method_query", "method_train", "participate", "sgd", "stored_state",
           "user_losses", "user_pass"]
