"""The app's model, data and plain local training, written as Flower's quickstarts are.

Data: a synthetic 4-class tabular task (12 features, Gaussian classes around fixed centres),
generated in code. Each node draws its own partition with a label skew (class shares from a
Dirichlet(0.5) seeded by its partition id), so the clients' data differ, as in federated
practice; the test set is balanced: chance accuracy is 1/4.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_FEATURES = 12
NUM_CLASSES = 4
EXAMPLES_PER_NODE = 256
TEST_EXAMPLES = 2000
CENTRES = np.random.default_rng(1234).normal(scale=0.4, size=(NUM_CLASSES, NUM_FEATURES))


class MLP(nn.Module):
    """12 -> 32 -> 4, no buffers (the methods keep parameter-shaped state)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.ReLU(),
                                 nn.Linear(32, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def initial_model() -> MLP:
    """The run's w_0: seeded, so the server and every client build the same one."""
    torch.manual_seed(0)
    return MLP()


def initial_weights() -> list[np.ndarray]:
    """w_0 as arrays (what the server sends a client under RI until its first reply is
    aggregated: the client's w_prev before its first participation)."""
    return [p.detach().numpy().copy() for p in initial_model().parameters()]


def _draw(rng: np.random.Generator, labels: np.ndarray) -> TensorDataset:
    x = CENTRES[labels] + rng.normal(size=(len(labels), NUM_FEATURES))
    return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(labels))


def load_partition(partition_id: int) -> TensorDataset:
    """Node ``partition_id``'s own data, label-skewed."""
    rng = np.random.default_rng([7, partition_id])
    shares = rng.dirichlet(np.full(NUM_CLASSES, 0.5))
    return _draw(rng, rng.choice(NUM_CLASSES, size=EXAMPLES_PER_NODE, p=shares))


def load_test() -> TensorDataset:
    """The balanced test set the server scores the global model on."""
    rng = np.random.default_rng([7, 10**6])
    return _draw(rng, np.arange(TEST_EXAMPLES) % NUM_CLASSES)


def trainloader(context: Context) -> DataLoader:
    """This node's training batches."""
    data = load_partition(int(context.node_config["partition-id"]))
    return DataLoader(data, batch_size=int(context.run_config["batch-size"]), shuffle=True)


def keep_state(context: Context) -> dict[str, Any]:
    """Where the method's client half keeps its state between rounds: ``context.state``,
    and files too when the run config names a ``state-dir``. (RI's w_prev before a first
    participation is the run's w_0, which the server sends: no copy of it here.)"""
    return {"state_dir": str(context.run_config["state-dir"]) or None}


def plain_train(msg: Message, net: nn.Module, loader: DataLoader, epochs: int) -> Message:
    """Plain local SGD (Flower's FedAvg client): load, train, reply the new weights."""
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    optimizer = torch.optim.SGD(net.parameters(), lr=float(msg.content["config"]["lr"]))
    net.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
    metrics = MetricRecord({"train-loss": total / steps, "num-examples": len(loader.dataset)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


def test(net: nn.Module, data: TensorDataset) -> tuple[float, float]:
    """(loss, accuracy) of ``net`` on ``data``."""
    net.eval()
    x, y = data.tensors
    with torch.no_grad():
        out = net(x)
    loss = nn.functional.cross_entropy(out, y).item()
    return loss, (out.argmax(1) == y).float().mean().item()
