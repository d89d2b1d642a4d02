"""The ServerApp. FedAvg is Flower's own; the marked line switches the method, e.g.

    strategy = FedInit(beta=0.1, **settings)
    strategy = Scaffold(**settings)
    strategy = FedDyn(alpha=0.1, **settings)

(with the ClientApp's training line, client_app.py)."""

from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from strategies import FedDyn, FedInit, Scaffold  # noqa: F401  (the methods)
from tabular_quickstart.task import MLP, initial_model, load_test, test

app = ServerApp()


def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """The global model on the server's balanced test set."""
    net = MLP()
    net.load_state_dict(arrays.to_torch_state_dict())
    loss, acc = test(net, load_test())
    return MetricRecord({"loss": loss, "accuracy": acc})


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = context.run_config
    num_rounds = int(run["num-server-rounds"])
    settings = {"fraction_train": float(run["fraction-train"]),
                "fraction_evaluate": float(run["fraction-evaluate"]),
                "min_available_nodes": int(run["min-nodes"])}
    strategy = FedAvg(**settings)  # the strategy line
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(initial_model().state_dict()),
                            num_rounds=num_rounds, train_config=ConfigRecord({"lr": run["lr"]}),
                            evaluate_fn=central_evaluate)
    accuracy = result.evaluate_metrics_serverapp[num_rounds]["accuracy"]
    log(INFO, "%s: final accuracy %.4f", type(strategy).__name__, accuracy)
