"""The deployment fast paths without a deployment: reply pulls, the SuperNode poll patch,
the launcher's checks and the executor's fork-safety."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator

import pytest
from flwr.app import Message, RecordDict

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.flower_compat import guard
from fedinit.flower_compat import supernode_waits as fast_poll
from fedinit.flower_compat.reply_poll import FastPollGrid
from fedinit.node.launch import runtime_address


@pytest.fixture(autouse=True)
def fresh_verdicts() -> Iterator[None]:
    guard.forget()
    yield
    guard.forget()


class SlowRepliesGrid:
    """Answers message i after ``delays[i]`` seconds; counts pulls."""

    def __init__(self, delays: list[float]) -> None:
        self.delays, self.pulls, self.t0 = delays, 0, 0.0
        self.ids: list[str] = []
        self.messages: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self.t0 = time.monotonic()
        self.messages = list(messages)
        self.ids = [f"m{i}" for i in range(len(self.messages))]
        return list(self.ids)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        now = time.monotonic() - self.t0
        out = []
        for mid, msg, delay in zip(self.ids, self.messages, self.delays, strict=True):
            if mid in set(message_ids) and now >= delay:
                reply = Message(RecordDict(), reply_to=msg)
                reply.metadata.__dict__["_reply_to_message_id"] = mid
                out.append(reply)
        return out


def _messages(n: int) -> list[Message]:
    set_task_identity()
    return [Message(RecordDict(), dst_node_id=i + 1, message_type="train") for i in range(n)]


def test_replies_are_collected_as_they_arrive_not_in_3s_steps() -> None:
    inner = SlowRepliesGrid([0.0, 0.25, 0.5])
    grid = FastPollGrid(inner, poll=0.05)  # type: ignore[arg-type]
    t0 = time.monotonic()
    replies = list(grid.send_and_receive(_messages(3), timeout=10))
    wall = time.monotonic() - t0
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert 0.5 <= wall < 0.9, wall  # Flower's HttpGrid would take 3 s here
    assert inner.pulls >= 5


def test_collection_stops_at_the_timeout_with_what_arrived() -> None:
    inner = SlowRepliesGrid([0.0, 60.0])
    t0 = time.monotonic()
    replies = list(FastPollGrid(inner, poll=0.05).send_and_receive(  # type: ignore[arg-type]
        _messages(2), timeout=0.4))
    assert 0.35 <= time.monotonic() - t0 < 0.8
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]


def _sleep_from(module: object, line: int, function: str, seconds: float) -> None:
    """Call ``module.time.sleep(seconds)`` from a function called ``function`` of
    ``module`` (its globals) at ``line``: how the patched ``time`` sees its caller. Nothing
    is added to the module."""
    import types

    source = "\n" * (line - 2) + f"def {function}():\n    time.sleep({seconds!r})\n"
    code = next(c for c in compile(source, "<site>", "exec").co_consts
                if isinstance(c, types.CodeType))
    types.FunctionType(code, vars(module))()


def test_supernode_waits_are_replaced_at_their_call_sites_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The installed flwr's loop reads as checked and holds each site once: if an upgrade
    # changes it, this fails and the patch (which then declines) must be re-checked.
    assert guard.why_not(fast_poll.NAME) is None
    import inspect

    from flwr.supernode import start_client_internal as loop

    sites = fast_poll.call_sites(inspect.getsource(loop))
    assert isinstance(sites, dict)
    assert sorted((s.function, s.seconds) for s in sites.values()) == [
        ("_push_messages", 0.5), ("start_client_internal", 3), ("yield_object_contents", 0.5)]
    line = {s.function: n for n, s in sites.items()}
    monkeypatch.setattr(loop, "time", loop.time)  # restored after the test
    assert fast_poll.apply(fast_poll.AdaptivePoll(fast=0.2, idle=2.0, window=30, reply=0.01))
    slept: list[float] = []
    monkeypatch.setattr(fast_poll.time, "sleep", slept.append)
    _sleep_from(loop, line["start_client_internal"], "start_client_internal", 3)
    _sleep_from(loop, line["_push_messages"], "_push_messages", 0.5)
    _sleep_from(loop, line["start_client_internal"], "start_client_internal", 3)
    _sleep_from(loop, line["yield_object_contents"], "yield_object_contents", 0.5)
    assert slept == [2.0, 0.01, 0.2, 0.01]  # idle, reply check, active after it, arrays wait
    slept.clear()
    loop.time.sleep(0.5)  # Flower's values from anywhere else pass through
    loop.time.sleep(3)
    _sleep_from(loop, line["_push_messages"] + 1, "_push_messages", 0.5)  # another line
    _sleep_from(loop, line["_push_messages"], "yield_object_contents", 0.5)  # other function
    _sleep_from(loop, line["_push_messages"], "_push_messages", 7)  # another value
    assert slept == [0.5, 3, 0.5, 0.5, 7]
    assert loop.time.monotonic is fast_poll.time.monotonic  # everything else passes through


def test_the_reply_wait_of_flowers_own_push_loop_is_ours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's real ``_push_messages`` waits for the ClientApp's reply at our pace."""
    from flwr.supernode import start_client_internal as loop

    monkeypatch.setattr(loop, "time", loop.time)
    woken: list[int] = []
    assert fast_poll.apply(fast_poll.AdaptivePoll(fast=0.2, idle=2.0, window=30, reply=0.01,
                                                  wake=lambda: woken.append(1)))
    slept: list[float] = []
    monkeypatch.setattr(fast_poll.time, "sleep", slept.append)

    class NoReplyYet:
        asks = 0

        def get_messages(self, is_reply: bool) -> list[Message]:
            self.asks += 1
            if self.asks == 3:
                raise StopIteration  # stop Flower's loop after two waits
            return []

    with pytest.raises(StopIteration):
        loop._push_messages(NoReplyYet(), None, None, None)  # type: ignore[arg-type]
    assert slept == [0.01, 0.01] and woken == [1]  # Flower's 0.5 s, and one wake


def test_supernode_waits_decline_on_another_flower(monkeypatch: pytest.MonkeyPatch) -> None:
    import flwr
    from flwr.supernode import start_client_internal as loop

    monkeypatch.setattr(loop, "time", loop.time)
    before = loop.time
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    assert "not the checked" in (guard.why_not(fast_poll.NAME) or "")
    assert not fast_poll.apply(fast_poll.AdaptivePoll(fast=0.2, idle=2, window=30, reply=0.01))
    assert loop.time is before


def test_node_polls_fast_only_within_the_window_after_a_message_and_wakes_once() -> None:
    now = [1000.0]
    woken: list[float] = []
    poll = fast_poll.AdaptivePoll(fast=0.2, idle=3.0, window=30.0, reply=0.05,
                                  wake=lambda: woken.append(now[0]), clock=lambda: now[0])
    assert poll.idle_wait() == 3.0  # never had a message: idle
    assert [poll.reply_wait() for _ in range(3)] == [0.05] * 3  # one message, three checks
    assert woken == [1000.0]  # the executor is woken once per message, not per check
    now[0] += 29.0
    assert poll.idle_wait() == 0.2  # inside the window: a run is active
    now[0] += 1.5
    assert poll.idle_wait() == 3.0  # 30.5 s after the last reply check: idle again
    poll.reply_wait()
    assert woken == [1000.0, 1030.5]  # the next message wakes it again
    assert poll.idle_wait() == 0.2


def test_executor_waits_for_the_nodes_wake_instead_of_polling() -> None:
    from fedinit.node.warm_executor import WarmExecutor

    wake = fast_poll.PipeWaker()
    read = wake.read_fd
    ex = WarmExecutor("127.0.0.1:1", True, None, poll=5.0, status_file=None, wake_fd=read)
    for _ in range(3):
        wake()  # several wakes before the executor looks: one short pause drains them all
    t0 = time.monotonic()
    ex.pause()
    assert time.monotonic() - t0 < 0.5
    ex.poll = 0.3
    t0 = time.monotonic()
    ex.pause()  # nothing written: waits its poll
    assert 0.25 <= time.monotonic() - t0 < 2.0
    import threading

    threading.Timer(0.2, wake).start()
    ex.poll = 10.0
    t0 = time.monotonic()
    ex.pause()  # woken mid-wait
    assert 0.15 <= time.monotonic() - t0 < 2.0
    assert ex.wake_fd == read
    import multiprocessing as mp
    from types import SimpleNamespace

    from fedinit.node.warm_executor import InFlight

    ours, theirs = mp.Pipe()
    never, _keep = os.pipe()
    busy = SimpleNamespace(task=InFlight(7, "tok", deadline=0.3), conn=ours,
                           process=SimpleNamespace(sentinel=never))
    ex.workers = [busy]  # type: ignore[list-item]
    t0 = time.monotonic()
    ex.pause()  # a busy worker's task deadline ends the wait (poll is 10 s)
    assert 0.2 <= time.monotonic() - t0 < 2.0
    busy.task = InFlight(7, "tok")
    theirs.send(("done", 7))
    t0 = time.monotonic()
    ex.pause()  # a busy worker's report ends it too
    assert time.monotonic() - t0 < 0.5
    ex.workers = []
    wake.close()  # the node is gone: the executor notices and polls from now on
    ex.poll = 0.05
    ex.pause()
    assert ex.wake_fd is None
    ex.pause()  # plain sleep, no busy loop on a closed pipe



def test_launcher_keeps_the_runtime_api_on_loopback_in_process_isolation() -> None:
    args, address = runtime_address(["--superlink", "x:1", "--port", "9100"])
    assert address == "127.0.0.1:9100"
    assert args[-2:] == ["--isolation", "process"]
    args, _ = runtime_address(["--isolation", "process", "--host", "::1"])
    assert args.count("--isolation") == 1
    with pytest.raises(SystemExit, match="--host 0.0.0.0 is not allowed"):
        runtime_address(["--host", "0.0.0.0"])
    with pytest.raises(SystemExit, match="--isolation subprocess is not allowed"):
        runtime_address(["--isolation=subprocess"])


@pytest.mark.slow
def test_executor_preload_imports_torch_but_never_starts_cuda() -> None:
    """Workers are forked from the supervisor: it must not have initialised CUDA."""
    code = ("import sys; from fedinit.node.warm_executor import WarmExecutor as W;"
            "e = W('127.0.0.1:1', True, None, 0.1, None); e.preload();"
            "import torch; print('torch' in sys.modules, torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split()[-2:] == ["True", "False"], out.stdout + out.stderr


class FakeWorker:
    """Stands in for a forked worker: records what it was sent."""

    started: list[FakeWorker] = []

    def __init__(self, fab_hash: str, *_: object) -> None:
        self.fab_hash, self.task, self.tasks_done, self.stopped = fab_hash, None, 0, False
        self.sent: list[object] = []
        self.conn = self
        self.process = self
        self.pid = len(FakeWorker.started)
        FakeWorker.started.append(self)

    def send(self, item: object) -> None:
        self.sent.append(item)

    def stop(self) -> None:
        self.stopped = True

    def kill(self) -> None:
        self.killed = True


def test_a_stuck_task_does_not_hold_up_the_next_and_idle_extras_are_retired(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedinit.node import warm_executor as we

    FakeWorker.started = []
    monkeypatch.setattr(we, "Worker", FakeWorker)
    ex = we.WarmExecutor("127.0.0.1:1", True, None, 0.1, None)
    ex.dispatch("t1", 1, "fabA")  # e.g. a task left by a stopped run: it never finishes
    ex.dispatch("t2", 2, "fabA")  # the next task gets a second worker, not a queue
    first, second = FakeWorker.started
    assert [w.sent for w in (first, second)] == [[(1, "t1")], [(2, "t2")]]
    ex.on_report(second, ("done", 2, True, 0.01, 0.5, 100.0, {}))  # type: ignore[arg-type]
    ex.dispatch("t3", 3, "fabA")  # the idle warm worker is reused
    assert len(FakeWorker.started) == 2 and second.sent[-1] == (3, "t3")
    ex.on_report(second, ("done", 3, True, 0.01, 0.5, 100.0, {}))  # type: ignore[arg-type]
    # The stuck one finally ends: two idle workers, the warmer one stays.
    ex.on_report(first, ("done", 1, False, 0.0, 0.0, 100.0, {}))  # type: ignore[arg-type]
    assert first.stopped and not second.stopped and ex.workers == [second]
    ex.dispatch("t4", 4, "fabB")  # another FAB: the idle worker of the old one is retired
    assert second.stopped and len(ex.workers) == 1 and ex.workers[0].fab_hash == "fabB"


def test_object_pull_retry_patch_applies_to_the_checked_flower_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Both callers still call Flower's pull_objects, which still takes initial_backoff: if an
    # upgrade changes that, this fails and the patch (which then refuses) must be re-checked.
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    from fedinit.flower_compat import object_pulls

    assert guard.why_not(object_pulls.NAME) is None
    from flwr.superlink.grid import http_grid

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored after
    assert object_pulls.apply(object_pulls.SERVERAPP)
    calls: list[float] = []

    def arrives_late(object_id: str) -> bytes:  # not there on the first ask, as on the wire
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise ObjectUnavailableError(object_id)
        return b"content"

    t0 = time.monotonic()
    assert http_grid.pull_objects(["a"], arrives_late) == {"a": b"content"}
    assert time.monotonic() - t0 < 0.5  # Flower's first retry comes after 0.8-1.2 s
    assert len(calls) == 2
    assert object_pulls.apply(object_pulls.SERVERAPP)  # a second install changes nothing
    assert http_grid.pull_objects is object_pulls.pull_objects

    monkeypatch.setattr(http_grid, "pull_objects", inflatable_utils.pull_objects)
    import flwr
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    guard.forget()
    assert not object_pulls.apply(object_pulls.SERVERAPP)
    assert http_grid.pull_objects is inflatable_utils.pull_objects


def test_a_reply_whose_arrays_never_come_fails_at_the_callers_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node killed mid-upload leaves its reply with arrays missing for good: inside
    ``pulls_until`` the pull gives up at the deadline (Flower: after 500 tries, ~1.5 h);
    outside it Flower's limits stay."""
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError

    from fedinit.flower_compat import object_pulls

    def never(object_id: str) -> bytes:
        raise ObjectUnavailableError(object_id)

    t0 = time.monotonic()
    with object_pulls.pulls_until(t0 + 0.4), pytest.raises(ObjectPullError):
        object_pulls.pull_objects(["a"], never)
    assert 0.3 < time.monotonic() - t0 < 2.0
    # an object already there is fetched even once the deadline has passed
    with object_pulls.pulls_until(time.monotonic() - 1.0):
        assert object_pulls.pull_objects(["b"], lambda _i: b"x") == {"b": b"x"}
    seen: list[dict[str, object]] = []
    monkeypatch.setattr(inflatable_utils, "pull_objects",
                        lambda ids, fn, **kw: seen.append(kw) or {})
    object_pulls.pull_objects(["c"], never)
    assert seen[-1] == {"initial_backoff": object_pulls.INITIAL_BACKOFF}  # Flower's limits


def test_the_round_pulls_its_replies_with_the_rounds_deadline() -> None:
    """FastPollGrid sets the deadline its ``timeout`` gives around every pull of replies."""
    from fedinit.flower_compat import object_pulls
    from fedinit.flower_compat.reply_poll import FastPollGrid

    class Inner:
        deadlines: list[float | None] = []

        def push_messages(self, messages: object) -> list[str]:
            return ["m1"]

        def pull_messages(self, ids: object) -> list[object]:
            self.deadlines.append(object_pulls._DEADLINE.get())
            return []

    inner = Inner()
    t0 = time.monotonic()
    assert list(FastPollGrid(inner, poll=0.05).send_and_receive([], timeout=0.3)) == []  # type: ignore[arg-type]
    assert len(inner.deadlines) >= 2
    assert all(d is not None and abs(d - (t0 + 0.3)) < 0.1 for d in inner.deadlines)
    assert object_pulls._DEADLINE.get() is None  # reset after the round


def test_a_worker_whose_message_never_came_is_killed_when_the_node_moves_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedinit.node import warm_executor as we

    FakeWorker.started = []
    monkeypatch.setattr(we, "Worker", FakeWorker)
    ex = we.WarmExecutor("127.0.0.1:1", True, None, 0.1, None)
    ex.dispatch("t1", 1, "fabA")  # its message never arrives (the SuperLink died)
    ex.dispatch("t2", 2, "fabA")  # a long task whose message did arrive
    orphan, training = FakeWorker.started
    ex.on_report(training, ("pulled", 2, _Pulled()))  # type: ignore[arg-type]
    for w in (orphan, training):
        assert w.task is not None
        w.task.started -= we.ORPHAN_SECONDS + 1
    ex.dispatch("t3", 3, "fabA")
    assert getattr(orphan, "killed", False) and orphan not in ex.workers
    assert not getattr(training, "killed", False) and training in ex.workers
    assert ex.stats.orphans_killed == 1
    assert FakeWorker.started[-1].sent == [(3, "t3")]


class _Pulled:
    deadline = 0.0
