"""The SuperNode refuses a run whose FAB is not on the device's approved list, before it
stores the FAB: no executor (the warm one or Flower's ``flwr-clientapp``) ever gets its task.

Flower 1.39's SuperNode pulls a new run's info and FAB in ``_pull_and_store_message`` and
stores both; an executor then installs and imports it. Flower's own check there
(``--trusted-entities``) accepts only FABs that carry the SuperLink's licence verification,
which an open-source SuperLink never adds. We give the module a ``_pull_and_store_message``
that calls Flower's with ``get_run`` and ``get_fab`` wrapped: a run whose FAB hash is not
approved is refused before its FAB is even downloaded; a FAB whose bytes do not hash to an
approved hash (or not to the hash it was sent as) before it is stored. A refusal logs one
line and inserts an error reply (``ErrorCode.INVALID_FAB``, the line as its reason), as
Flower's own check does, and nothing of the run is stored, so each of its messages is
refused the same way and the run goes on without this node.

Guard (table entry ``app-allowlist``): ``_pull_and_store_message`` (what is wrapped: it
must still call ``get_run`` and ``get_fab`` before storing), its caller
``start_client_internal`` (calls it by its module global) and ``_insert_message`` (how the
reply is stored), as checked. Declined: nothing is refused by the SuperNode; ``fedinit.node.launch``
then starts no ``flower-superexec`` (the warm executor checks on its own).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any

from fedinit.flower_compat.guard import allowed

NAME = "app-allowlist"
MODULE = "flwr.supernode.start_client_internal"


class Refused(Exception):
    """A run this device does not run; its one line is the reply's reason."""


def apply(allowlist: Any) -> bool:
    """Make the SuperNode refuse runs ``allowlist`` (a ``fedinit.node.app_allowlist.Allowlist``)
    does not approve; True when installed."""
    import importlib

    from flwr.supercore import log

    module = importlib.import_module(MODULE)
    current = module._pull_and_store_message
    if getattr(current, "app_allowlist", None) is not None:
        current.app_allowlist = allowlist  # type: ignore[attr-defined]
        return True
    if not allowed(NAME):
        return False
    module._pull_and_store_message = checked(current, allowlist, module._insert_message)
    log(INFO, "app allowlist: the SuperNode runs only the apps in %s", allowlist.path)
    return True


def checked(original: Callable[..., int | None], allowlist: Any,
            insert: Callable[..., None]) -> Callable[..., int | None]:
    """``original`` (Flower's ``_pull_and_store_message``) refusing unapproved runs."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode
    from flwr.supercore import log

    @functools.wraps(original)
    def pull_and_store(**kw: Any) -> int | None:
        rules = pull_and_store.app_allowlist  # type: ignore[attr-defined]
        received: list[Message] = []
        receive, get_run, get_fab = kw["receive"], kw["get_run"], kw["get_fab"]

        def receive_checked() -> Any:
            got = receive()
            if got is not None:
                received.append(got[0])
            return got

        def get_run_checked(run_id: int) -> Any:
            run = get_run(run_id)
            if reason := rules.refusal(run.fab_hash, run_id):
                raise Refused(reason)
            return run

        def get_fab_checked(fab_hash: str, run_id: int) -> Any:
            fab = get_fab(fab_hash, run_id)
            if reason := rules.refusal(fab_hash, run_id, fab.content):
                raise Refused(reason)
            return fab

        try:
            return original(**{**kw, "receive": receive_checked, "get_run": get_run_checked,
                               "get_fab": get_fab_checked})
        except Refused as refused:
            message = received[-1]
            log(WARNING, "%s", refused)
            insert(Message(Error(ErrorCode.INVALID_FAB, str(refused)), reply_to=message),
                   kw["state"], kw["object_store"])
            return message.metadata.run_id

    pull_and_store.app_allowlist = allowlist  # type: ignore[attr-defined]
    return pull_and_store
