"""The compute floor: the same federated training as a plain single-process PyTorch loop.

Same clients sampled per round, same partitions, same RI start points, same local SGD with
the same seeds, the same method core (``methods``: the server rule's update, RI's start
point and aggregate, the client rule's ``train`` with the same SGD pass), same central
evaluation -- but no Flower, no Ray, no messages, no client store on disk. What a `flwr run`
simulation spends beyond this is the framework's overhead. Works for every registered method.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from client_app.trainer import SgdSettings, sgd_pass, train_losses
from fedinit.config import RunConfig
from fedinit.methods.method import ClientUpdate, LocalJob, RoundInput
from fedinit.methods.ri import aggregate_update, relaxed_start, upload_vector
from fedinit.methods.robust import combine
from fedinit.methods.sampling import sample_clients
from fedinit.store.server_models import ServerModels
from fedinit.task.datasets import to_tensor
from fedinit.task.evaluation import evaluate
from fedinit.task.federated_data import client_examples, dataset_of
from fedinit.task.models import get_weights, initial_model, set_weights


def plain_fedinit(cfg: RunConfig) -> dict[str, float]:
    """Timings and final accuracy of ``plain_run``."""
    return plain_run(cfg)[0]


def plain_run(cfg: RunConfig) -> tuple[dict[str, float], list[np.ndarray]]:
    """Run cfg's rounds with any registered method; return timings and accuracy, and the final
    global model. Every client is honest here: no reply checks, no norm filter."""
    t0 = time.monotonic()
    data = dataset_of(cfg)
    model = initial_model(cfg, data)
    w = get_weights(model)
    w0 = [a.copy() for a in w]
    rule = cfg.spec.server(cfg.params)
    client = cfg.spec.client(cfg.params)
    state = rule.init(w0)
    rule.bind(ServerModels(None), None)  # FedRelax's per-client models: a temporary folder
    w_prev: dict[int, list[np.ndarray]] = {}
    client_state: dict[int, dict[str, list[np.ndarray]]] = {}
    tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    x_test = to_tensor(data.test_x, data.mean, data.std)
    y_test = torch.from_numpy(data.test_y.copy()).long()
    setup = time.monotonic() - t0
    acc = 0.0
    round_times = []
    for rnd in range(1, cfg.train.num_server_rounds + 1):
        t_r = time.monotonic()
        lr = cfg.train.lr_at(rnd)
        down = rule.down(state)
        updates: list[ClientUpdate] = []
        for cid in sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round):
            if cid not in tensors:
                x, y = client_examples(cfg, cid)
                tensors[cid] = (to_tensor(x, data.mean, data.std),
                                torch.from_numpy(y.copy()).long())
            own = rule.down_to(state, cid, w)  # a method with per-client messages
            w_i, down_i = (w, down) if own is None else (own.model, dict(own.extras))
            start = relaxed_start(w_i, w_prev.get(cid, w0), cfg.train.beta)
            kept = client_state.get(cid, {})
            job = LocalJob(
                w_t=w_i, start=start, down=down_i,
                state={k: kept.get(k) or client.initial_state(k, w_i)
                       for k in client.state_keys},
                lr=lr, device=torch.device("cpu"),
                sgd=sgd_pass(model, *tensors[cid], SgdSettings(
                    epochs=cfg.train.local_epochs, batch_size=cfg.train.batch_size, lr=lr,
                    weight_decay=cfg.train.weight_decay, clip_norm=cfg.train.clip_norm,
                    seed=cfg.seed,
                    server_round=rnd, partition_id=cid)),
                losses=train_losses(model, *tensors[cid], cfg.train.batch_size))
            outcome = client.train(job)
            run = outcome.trained
            w_prev[cid], client_state[cid] = run.final, outcome.state
            upload = upload_vector(run.final, start, cfg.train.ri_aggregation)
            updates.append(ClientUpdate(cid, upload,
                                        outcome.extras, run.num_examples, run.mean_loss,
                                        run.num_steps, outcome.metrics))
        weights = [float(u.num_examples) if cfg.train.weighting == "examples" else 1.0
                   for u in updates]
        aggregate, _ = aggregate_update(
            w, [u.upload for u in updates], weights, cfg.train.ri_aggregation,
            mean=lambda v, wt: combine(v, wt, cfg.robust.aggregation, cfg.robust.trim_fraction))
        w, state = rule.update(state, w, RoundInput(
            server_round=rnd, aggregate=aggregate, updates=updates, weights=weights,
            variant=cfg.train.ri_aggregation, num_clients=cfg.num_clients, lr=lr,
            server_lr=cfg.train.server_lr))
        if rnd % cfg.eval.eval_every == 0 or rnd == cfg.train.num_server_rounds:
            set_weights(model, w)
            _, acc = evaluate(model, x_test, y_test)
        round_times.append(time.monotonic() - t_r)
    return {"wall-seconds": time.monotonic() - t0, "setup-seconds": setup,
            "rounds-seconds": float(sum(round_times)),
            "mean-round-seconds": float(np.mean(round_times)), "final-test-acc": acc}, w
