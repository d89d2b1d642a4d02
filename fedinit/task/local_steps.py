"""How many SGD steps a client's local pass takes, apart from the data modules: the server
checks a reply's ``num-steps`` (FedCM's K) with it and must not load torch or a data set to
do so."""

from __future__ import annotations


def num_steps(num_examples: int, epochs: int, batch_size: int) -> int:
    """The SGD steps ``local_sgd`` takes: every epoch keeps its last partial batch. The server
    uses it to check a reply's ``num-steps`` (FedCM's K) against the client's true size."""
    return epochs * -(-num_examples // batch_size)
