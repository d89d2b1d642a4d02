"""The compute floor: the same federated training as a plain single-process PyTorch loop.

Same clients sampled per round, same partitions, same RI start points, same local SGD with
the same seeds, the same method core (``strategies``: the server rule's update, RI's start
point and aggregate), same central evaluation -- but no Flower, no Ray, no messages. What a
`flwr run` simulation spends beyond this is the framework's overhead.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from client_app.trainer import local_sgd
from strategies.method import ClientUpdate, RoundInput
from strategies.ri import aggregate_update, relaxed_start
from strategies.sampling import sample_clients
from task.config import RunConfig
from task.datasets import to_tensor
from task.evaluation import evaluate
from task.federated_data import client_examples, dataset_of
from task.models import get_weights, initial_model, set_weights


def plain_fedinit(cfg: RunConfig) -> dict[str, float]:
    """Timings and final accuracy of ``plain_run``."""
    return plain_run(cfg)[0]


def plain_run(cfg: RunConfig) -> tuple[dict[str, float], list[np.ndarray]]:
    """Run cfg's rounds (a method without extra uploads: FedAvg/FedInit, FedAdam, FedProx,
    FedSAM); return timings and accuracy."""
    t0 = time.monotonic()
    data = dataset_of(cfg)
    model = initial_model(cfg, data)
    w = get_weights(model)
    w0 = [a.copy() for a in w]
    rule = cfg.spec.server(cfg.params)
    state = rule.init(w0)
    if rule.up_keys:
        raise ValueError(f"plain loop: method {cfg.method!r} uploads {rule.up_keys}; "
                         "only methods without extra uploads are supported")
    w_prev: dict[int, list[np.ndarray]] = {}
    tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    x_test = to_tensor(data.test_x, data.mean, data.std)
    y_test = torch.from_numpy(data.test_y.copy()).long()
    setup = time.monotonic() - t0
    acc = 0.0
    round_times = []
    for rnd in range(1, cfg.num_server_rounds + 1):
        t_r = time.monotonic()
        updates: list[ClientUpdate] = []
        for pid in sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round):
            if pid not in tensors:
                x, y = client_examples(cfg, pid)
                tensors[pid] = (to_tensor(x, data.mean, data.std),
                                torch.from_numpy(y.copy()).long())
            x_t, y_t = tensors[pid]
            set_weights(model, relaxed_start(w, w_prev.get(pid, w0), cfg.beta))
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence(
                [cfg.seed, rnd, pid]).generate_state(1)[0]))
            start = get_weights(model)
            client = cfg.spec.client(cfg.params)
            hook = client.begin(start, {}, {}, cfg.lr_at(rnd), torch.device("cpu"))
            res = local_sgd(model, x_t, y_t, epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                            lr=cfg.lr_at(rnd), weight_decay=cfg.weight_decay,
                            clip_norm=cfg.clip_norm, generator=gen, hook=hook,
                            sam_rho=client.sam_rho)
            w_prev[pid] = get_weights(model)
            upload = (w_prev[pid] if cfg.ri_aggregation == "model"
                      else [f - s for f, s in zip(w_prev[pid], start, strict=True)])
            updates.append(ClientUpdate(pid, upload, {}, res.num_examples, res.mean_loss,
                                        res.num_steps))
        weights = [float(u.num_examples) if cfg.weighting == "examples" else 1.0
                   for u in updates]
        aggregate, _ = aggregate_update(w, [u.upload for u in updates], weights,
                                        cfg.ri_aggregation)
        w, state = rule.update(state, w, RoundInput(
            server_round=rnd, aggregate=aggregate, updates=updates, weights=weights,
            variant=cfg.ri_aggregation, num_clients=cfg.num_clients, lr=cfg.lr_at(rnd),
            server_lr=cfg.server_lr))
        if rnd % cfg.eval_every == 0 or rnd == cfg.num_server_rounds:
            set_weights(model, w)
            _, acc = evaluate(model, x_test, y_test)
        round_times.append(time.monotonic() - t_r)
    return {"wall-seconds": time.monotonic() - t0, "setup-seconds": setup,
            "rounds-seconds": float(sum(round_times)),
            "mean-round-seconds": float(np.mean(round_times)), "final-test-acc": acc}, w
