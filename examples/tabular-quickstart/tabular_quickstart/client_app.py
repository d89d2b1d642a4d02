"""The ClientApp. FedAvg trains with the app's own loop; for FedInit, SCAFFOLD or FedDyn
the one marked line becomes

    return method_train(msg, context, net, loader, epochs=epochs, **keep_state(context))

(``strategies.client``: the method the server names, on this model and these batches)."""

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from strategies.client import method_train  # noqa: F401  (the method line's client half)
from tabular_quickstart.task import (
    MLP,
    keep_state,  # noqa: F401  (the method line's state)
    load_partition,
    plain_train,
    test,
    trainloader,
)

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training on this node's partition."""
    net, loader = MLP(), trainloader(context)
    epochs = int(context.run_config["local-epochs"])
    return plain_train(msg, net, loader, epochs)  # the training line


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received global model on this node's data (Flower's federated evaluation)."""
    net = MLP()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    data = load_partition(int(context.node_config["partition-id"]))
    loss, acc = test(net, data)
    metrics = MetricRecord({"eval-loss": loss, "eval-acc": acc, "num-examples": len(data)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

