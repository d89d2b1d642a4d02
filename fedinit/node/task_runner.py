"""One ClientApp task, run inside a warm worker with Flower's own task protocol.

This is what ``flwr-clientapp`` does for one message (pull the task input with the task's
token, install the FAB, load the ClientApp, call it, push the reply and the final context),
minus the process start: the worker that calls it already imported Python, flwr and torch,
and keeps the app's module-level caches (data set, partition, w_0) between tasks. Flower's
functions for the wire steps are reused, so the reply and the context travel exactly as they
do from ``flwr-clientapp``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import ERROR, WARNING
from typing import TYPE_CHECKING

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.config import get_project_dir
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
from flwr.supercore import log
from flwr.supercore.fab import Fab
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.run import Run
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedinit.node.deadline import task_deadline, timeout_reason

if TYPE_CHECKING:
    from fedinit.node.app_allowlist import Allowlist

CRASH_REASON = "the ClientApp worker process died while running this task"

OBJECT_BACKOFF = (0.02, 0.2)
"""First and longest pause (s) while the node still fetches the message's arrays from the
SuperLink. A warm task starts that early; Flower's 1 s / 10 s suit a cold process, which
only asks after its imports."""
OBJECT_MAX_SECONDS = 900.0
"""Give up on a message whose arrays never arrive (a run stopped while the node fetched
them leaves such a task behind) after this long, instead of Flower's two hours: each such
task holds a worker."""



class AppRefused(Exception):
    """The task's FAB is not on the device's approved list (its one line)."""


@dataclass(frozen=True)
class Pulled:
    """What the supervisor needs to answer for a task its worker cannot finish: sent by the
    worker once it pulled the task's message (before the ClientApp runs)."""

    crash_reply: Message
    """The error reply if the worker dies mid-task."""
    timeout_reply: Message
    """The error reply if the task runs past its deadline and is killed."""
    deadline: float
    """Seconds the task may run (``fedinit.node.deadline``); 0 = no deadline."""
    run_id: int
    node_id: int


Notify = Callable[[Pulled], None]
"""Called once the task's message is pulled."""


@dataclass(frozen=True)
class TaskOutcome:
    """What the worker reports to the executor after a task."""

    completed: bool
    start_seconds: float
    """From the token reaching the worker to the ClientApp being called: the per-message
    start cost (a cold ``flwr-clientapp`` pays the interpreter, torch and app imports here)."""
    app_seconds: float
    phases: dict[str, float]
    """Seconds of each start step (pull, install, load): where a slow start went."""


def task_client(address: str, token: str, insecure: bool,
                certificates: bytes | None) -> RuntimeHttpClient:
    """A Runtime API client that acts with the task's token, as ``flwr-clientapp`` does."""
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure, root_certificates=certificates,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                      RuntimeTokenHttpInterceptor(token)],
        retry_invoker=make_simple_http_retry_invoker())


def pull_input(client: RuntimeHttpClient) -> tuple[Message, Context, Run, Fab]:
    """The task's message, context, run and FAB from the SuperNode (Flower's steps)."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context, run, fab = (context_from_proto(res.context), run_from_proto(res.run),
                         fab_from_proto(res.fab))
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    tree = pulled.message_object_trees[0]
    node = Node(node_id=context.node_id)
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node,
                                                  context.run_id),
        return_type=Message, initial_backoff=OBJECT_BACKOFF[0], backoff_cap=OBJECT_BACKOFF[1],
        max_time=OBJECT_MAX_SECONDS)
    message.metadata.__dict__["_message_id"] = tree.object_id  # not part of the pulled tree
    return message, context, run, fab


def run_task(address: str, token: str, insecure: bool, certificates: bytes | None,
             notify: Notify, deadline_override: float = 0.0,
             approved: Allowlist | None = None) -> TaskOutcome:
    """Pull, run and answer one message; an exception in the app becomes an error reply.

    ``deadline_override`` is the node's ``--task-deadline`` (0: the run config decides);
    with ``approved`` (the device's list) a FAB whose bytes are not approved is refused
    before it is installed."""
    t0 = time.monotonic()
    client = task_client(address, token, insecure, certificates)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message: Message | None = None
    context: Context | None = None
    reply: Message | None = None
    completed, details = False, "ClientApp task failed due to unknown reason"
    start = app_seconds = 0.0
    phases: dict[str, float] = {}
    try:
        message, context, run, fab = pull_input(client)
        phases["pull"] = time.monotonic() - t0
        deadline = task_deadline(context.run_config, deadline_override)
        notify(Pulled(
            Message(Error(ErrorCode.CLIENT_APP_CRASHED, CRASH_REASON), reply_to=message),
            Message(Error(ErrorCode.CLIENT_APP_CRASHED, timeout_reason(deadline)),
                    reply_to=message),
            deadline, context.run_id, context.node_id))
        if approved is not None and (
                why := approved.refusal(fab.hash_str, run.run_id, fab.content)):
            raise AppRefused(why)
        if not get_project_dir(run.fab_id, run.fab_version, fab.hash_str).is_dir():
            install_from_fab(fab.content, skip_prompt=True)
        phases["install"] = time.monotonic() - t0 - phases["pull"]
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        app = load(run.fab_id, run.fab_version, fab.hash_str)
        start = time.monotonic() - t0
        phases["load"] = start - phases["pull"] - phases["install"]
        reply = app(message=message, context=context)
        app_seconds = time.monotonic() - t0 - start
        completed, details = True, ""
    except Exception as ex:  # noqa: BLE001 - every failure becomes an error reply, as in Flower
        code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
        reason = f"{type(ex)}:<'{ex}'>"
        if isinstance(ex, LoadClientAppError):
            code, reason = (ErrorCode.LOAD_CLIENT_APP_EXCEPTION,
                            "An exception was raised when attempting to load `ClientApp`")
        if isinstance(ex, AppRefused):
            code, reason = ErrorCode.INVALID_FAB, str(ex)
            log(WARNING, "%s", ex)
        else:
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
        details = reason
        if message is not None:
            reply = Message(Error(code=code, reason=reason), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
            push_task_output(client, context, SubStatus.COMPLETED if completed
                             else SubStatus.FAILED, details)
        except Exception as ex:  # noqa: BLE001 - the executor goes on with the next task
            log(ERROR, "Failed to push the reply of a task", exc_info=ex)
            completed = False
        heartbeat.stop()
        client.close()
    return TaskOutcome(completed, start, app_seconds, phases)


def report_crash(address: str, token: str, insecure: bool, certificates: bytes | None,
                 reply: Message, run_id: int, node_id: int, details: str) -> None:
    """Answer for a worker that died or was killed mid-task: its prepared error reply, then
    FAILED with ``details``.

    Without this the SuperNode would wait for the task token to expire (Flower's heartbeat
    patience) before it inserts a crash reply; the round would lose that much time. A task
    killed at its deadline would never be answered: its heartbeat kept the token alive.
    """
    client = task_client(address, token, insecure, certificates)
    try:
        context = Context(run_id=run_id, node_id=node_id, node_config={}, state=RecordDict(),
                          run_config={})
        push_message(client, reply, context)
        push_task_output(client, None, SubStatus.FAILED, details)
    finally:
        client.close()


def refuse_task(address: str, token: str, insecure: bool, certificates: bytes | None,
                reason: str) -> None:
    """Answer a task of an unapproved FAB with the refusal ``reason`` (an ``INVALID_FAB``
    error reply, then FAILED): its message is pulled, its FAB is neither installed nor
    imported."""
    client = task_client(address, token, insecure, certificates)
    try:
        message, context, _run, _fab = pull_input(client)
        push_message(client, Message(Error(ErrorCode.INVALID_FAB, reason), reply_to=message),
                     context)
        push_task_output(client, context, SubStatus.FAILED, reason)
    finally:
        client.close()
