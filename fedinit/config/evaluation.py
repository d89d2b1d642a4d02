"""Evaluation: how often and where the global model is evaluated, the all-client divergence
and personalized evaluation."""

from __future__ import annotations

from dataclasses import dataclass

from fedinit.config.errors import bad_value

EVALUATIONS: tuple[str, ...] = ("auto", "central", "federated")


@dataclass(frozen=True)
class EvalConfig:
    """``eval-every`` .. ``finetune-epochs``, typed (names: keys with '-' -> '_')."""

    eval_every: int
    evaluation: str
    federated_eval_clients: int
    divergence_every: int
    divergence_clients: int
    personal_eval_every: int
    personal_eval_clients: int
    finetune_epochs: int


def check_counts(e: EvalConfig) -> None:
    """Divergence and personalized evaluation: how often (0: off) and how many clients."""
    for key, value in (("divergence-every", e.divergence_every),
                       ("divergence-clients", e.divergence_clients)):
        if value < 0:
            raise bad_value(key, value, "an integer >= 0 (0 = off / all clients)")
    if e.personal_eval_every < 0:
        raise bad_value("personal-eval-every", e.personal_eval_every,
                        "an integer >= 0 (0 = off)")
    if e.personal_eval_clients < 0:
        raise bad_value("personal-eval-clients", e.personal_eval_clients,
                        "an integer >= 0 (0, or num-clients or more: all clients)")
    if e.finetune_epochs < 1:
        raise bad_value("finetune-epochs", e.finetune_epochs, "an integer >= 1")


def check_federated_clients(e: EvalConfig) -> None:
    """``federated-eval-clients``: 0 or more (0: all)."""
    if e.federated_eval_clients < 0:
        raise bad_value("federated-eval-clients", e.federated_eval_clients,
                        "an integer >= 0 (0, or num-clients or more: all clients)")
