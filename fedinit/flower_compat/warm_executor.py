"""The guard of the warm ClientApp executor (``fedinit.node.warm_executor`` +
``fedinit.node.task_runner``).

Flower 1.39's SuperExec starts a new ``flwr-clientapp`` process for every message
(``flwr.supernode.runtime.run_clientapp.run_clientapp``); the warm executor forks a worker
that runs the same steps (pull the task input, install the FAB, load and call the ClientApp,
push the reply and the context) with Flower's own wire functions, without the process start.
It mirrors those functions, so it runs only while they read as checked (table entry
``warm-executor``); declined, ``fedinit.node.launch`` starts Flower's ``flower-superexec``.
"""

from __future__ import annotations

from fedinit.flower_compat.guard import allowed

NAME = "warm-executor"


def usable() -> bool:
    """Whether the warm executor may take SuperExec's place here (one warning if not)."""
    return allowed(NAME)
