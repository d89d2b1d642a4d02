"""The device's approved-apps list (fedinit.node.app_allowlist): its file, where the device finds
it, the check (the FAB's own bytes, not the hash it is sent as), the SuperNode's refusal through
Flower's own ``_pull_and_store_message`` (fedinit.flower_compat.app_allowlist), the warm executor's
refusal before any worker is forked, fedinit.node.launch's start checks, and
fedinit.node.approve_app."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message, Metadata, RecordDict
from flwr.app.message.message import make_message
from flwr.common.constant import ErrorCode
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_object import get_object_tree
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supernode import start_client_internal as loop
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

from fedinit.flower_compat import app_allowlist as patch
from fedinit.flower_compat import guard
from fedinit.node import launch
from fedinit.node.app_allowlist import Allowlist, AllowlistError, parse, path_from_node_config, read
from fedinit.node.approve_app import fab_of
from fedinit.node.approve_app import main as approve_main

GOOD = hashlib.sha256(b"the approved FAB").hexdigest()
OTHER = hashlib.sha256(b"another FAB").hexdigest()


def allowlist(tmp_path: Path, *lines: str) -> Allowlist:
    path = tmp_path / "approved-apps.txt"
    path.write_text("\n".join(lines) + "\n")
    return Allowlist.load(path)


# ------------------------------------------------------------------ the file
def test_the_file_lists_hashes_with_comments_and_blank_lines(tmp_path: Path) -> None:
    al = allowlist(tmp_path, "# approved apps", "", f"{GOOD}  # fedinit 1.0", f"  {OTHER}")
    assert read(al.path) == {GOOD, OTHER}


@pytest.mark.parametrize("bad", [GOOD.upper(), GOOD[:-1], f"{GOOD} extra", "sha256:" + GOOD])
def test_a_bad_line_is_one_line_naming_file_line_and_value(bad: str) -> None:
    with pytest.raises(AllowlistError) as err:
        parse(f"# ok\n{GOOD}\n{bad}\n", "/dev/apps.txt")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"/dev/apps.txt:3: {bad.split('#')[0].strip()!r} is not an app hash")
    assert "allowed: 64 lowercase hex digits" in text


def test_where_the_device_reads_its_list(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    assert path_from_node_config({}) is None
    assert path_from_node_config({"state-dir": str(state)}) is None  # no list: all run
    (state / "approved-apps.txt").write_text(GOOD + "\n")
    assert path_from_node_config({"state-dir": str(state)}) == state / "approved-apps.txt"
    named = tmp_path / "mine.txt"
    named.write_text(OTHER + "\n")
    assert path_from_node_config({"state-dir": str(state), "approved-apps": str(named)}) \
        == named  # the node config's key wins
    with pytest.raises(AllowlistError, match=r"approved-apps='/nope' is not a file; allowed"):
        path_from_node_config({"approved-apps": "/nope"})
    with pytest.raises(AllowlistError, match=r"approved-apps=3 is not allowed; allowed"):
        path_from_node_config({"approved-apps": 3})


# ------------------------------------------------------------------ the check
def test_only_an_approved_hash_passes(tmp_path: Path) -> None:
    al = allowlist(tmp_path, GOOD)
    assert al.refusal(GOOD, 5) is None
    assert al.refusal(OTHER, 5) == (
        f"app allowlist: refused run 5: FAB {OTHER} is not in {al.path} (this device's "
        "approved apps; approve a new version with python -m fedinit.node.approve_app)")
    assert al.refusal("", 5) is not None


def test_the_fab_bytes_are_checked_not_the_hash_they_are_sent_as(tmp_path: Path) -> None:
    al = allowlist(tmp_path, GOOD)
    assert al.refusal(GOOD, 1, b"the approved FAB") is None
    why = al.refusal(GOOD, 1, b"other code")  # a SuperLink naming an approved hash
    assert why is not None and "its FAB's SHA-256 is" in why
    assert hashlib.sha256(b"other code").hexdigest() in why


def test_the_file_is_read_at_each_check(tmp_path: Path) -> None:
    al = allowlist(tmp_path, GOOD)
    assert al.refusal(OTHER, 2) is not None
    al.path.write_text(f"{GOOD}\n{OTHER}  # approved later\n")
    assert al.refusal(OTHER, 2) is None  # an approval needs no restart
    al.path.write_text("not a hash\n")
    why = al.refusal(GOOD, 2)  # a file broken later refuses everything (fail closed)
    assert why is not None and "every app is refused until it is fixed" in why
    assert f"{al.path}:1:" in why
    al.path.unlink()
    assert al.refusal(GOOD, 2) is not None


def test_a_bad_file_stops_the_node_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "apps.txt"
    bad.write_text("deadbeef\n")
    with pytest.raises(SystemExit) as err:
        launch.device_allowlist(["--superlink", "x:1", "--node-config",
                                 f'partition-id=0 approved-apps="{bad}"'])
    assert str(err.value).startswith(f"fedinit.node.launch: {bad}:1: 'deadbeef' is not an app hash")
    assert launch.device_allowlist(["--node-config", "partition-id=0"]) is None
    bad.write_text(GOOD + "\n")
    got = launch.device_allowlist([f'--node-config=approved-apps="{bad}"'])
    assert got is not None and got.path == bad


def test_flowers_executor_is_refused_where_the_supernode_check_declines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    al = allowlist(tmp_path, GOOD)
    guard.forget()
    try:
        launch.allowlist_executor(al, "flower")  # the check is there: Flower's path is fine
        guard.forget()
        read_source = guard.source_of
        monkeypatch.setattr(guard, "source_of", lambda t: read_source(t) + "# changed\n")
        launch.allowlist_executor(al, "warm")  # the warm executor checks on its own
        launch.allowlist_executor(None, "flower")  # no list: nothing to refuse
        with pytest.raises(SystemExit, match="allowed: --executor warm"):
            launch.allowlist_executor(al, "flower")
    finally:
        guard.forget()


# ------------------------------------------------------------------ the SuperNode
def _message(run_id: int) -> Message:
    meta = Metadata(run_id=run_id, message_id="", src_node_id=1, dst_node_id=7,
                    reply_to_message_id="", group_id="1", created_at=time.time(), ttl=600.0,
                    message_type="train")
    msg = make_message(meta, RecordDict())
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


def _pull_once(al: Allowlist, fab_hash: str, content: bytes) -> tuple[Any, ...]:
    """Flower's ``_pull_and_store_message``, wrapped, for one message of a new run 9."""
    store = ObjectStoreFactory().store()
    state = InMemoryNodeState(store)
    state.set_node_id(7)
    msg = _message(9)
    asked: list[str] = []

    def get_run(run_id: int) -> Run:
        asked.append("run")
        run = Run.create_empty(run_id)
        run.fab_hash = fab_hash
        return run

    def get_fab(h: str, run_id: int) -> Fab:
        asked.append("fab")
        return Fab(h, content, {})

    def unexpected(*_: object) -> None:
        raise AssertionError("a refused message's objects were pulled")

    pull = patch.checked(loop._pull_and_store_message, al, loop._insert_message)
    got = pull(state=state, object_store=store, node_config={}, receive=lambda: (
        msg, get_object_tree(msg)), get_run=get_run, get_fab=get_fab, pull_object=unexpected,
        confirm_message_received=unexpected, trusted_entities=None)
    return got, state, msg, asked


def test_the_supernode_refuses_an_unapproved_run_before_its_fab_is_fetched(
        tmp_path: Path) -> None:
    al = allowlist(tmp_path, GOOD)
    got, state, msg, asked = _pull_once(al, OTHER, b"another FAB")
    assert got == 9 and asked == ["run"]  # the FAB was never downloaded
    assert state.get_run(9) is None  # nothing of the run is stored: each message is refused
    (reply,) = state.get_messages(is_reply=True)
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    assert reply.error.code == ErrorCode.INVALID_FAB
    assert reply.error.reason == al.refusal(OTHER, 9)


def test_the_supernode_refuses_other_bytes_sent_under_an_approved_hash(
        tmp_path: Path) -> None:
    al = allowlist(tmp_path, GOOD)
    got, state, _msg, asked = _pull_once(al, GOOD, b"other code")
    assert got == 9 and asked == ["run", "fab"]
    assert state.get_run(9) is None and state.get_fab(GOOD) is None
    (reply,) = state.get_messages(is_reply=True)
    assert "its FAB's SHA-256 is" in reply.error.reason


# ------------------------------------------------------------------ the warm executor
def test_the_warm_executor_refuses_before_forking_or_retiring_a_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedinit.node import task_runner
    from fedinit.node.warm_executor import WarmExecutor

    al = allowlist(tmp_path, GOOD)
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(task_runner, "refuse_task",
                        lambda _a, token, _i, _c, reason: sent.append((token, reason)))
    ex = WarmExecutor("127.0.0.1:1", True, None, 0.1, tmp_path / "status.json",
                      approved=al)

    class Idle:  # an idle warm worker of the approved FAB: it must stay
        fab_hash, task, tasks_done = GOOD, None, 3

    keep = Idle()
    ex.workers = [keep]  # type: ignore[list-item]
    ex.dispatch("tok", 11, OTHER, 4)
    assert sent == [("tok", al.refusal(OTHER, 4))]
    assert ex.workers == [keep] and ex.stats.worker_starts == 0
    assert ex.stats.tasks_refused == 1 and ex.stats.tasks_failed == 1


# ------------------------------------------------------------------ approving
def test_approve_app_prints_the_hash_flwr_run_sends_and_appends_it_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flwr.cli.build import build_fab_from_disk

    app = tmp_path / "tinyapp"
    (app / "tinyapp").mkdir(parents=True)
    (app / "pyproject.toml").write_text(
        '[project]\nname = "tinyapp"\nversion = "1.0.0"\n'
        '[tool.flwr.app]\npublisher = "me"\n'
        '[tool.flwr.app.components]\nserverapp = "tinyapp.s:app"\nclientapp = "tinyapp.c:app"\n')
    (app / "tinyapp" / "c.py").write_text("app = None\n")
    expected = hashlib.sha256(build_fab_from_disk(app)).hexdigest()  # as flwr run builds it
    assert hashlib.sha256(fab_of(app)).hexdigest() == expected
    fab = tmp_path / "tiny.fab"
    fab.write_bytes(build_fab_from_disk(app))
    listed = tmp_path / "dev" / "approved-apps.txt"
    approve_main([str(app), "--append", str(listed), "--note", "tiny 1.0"])
    approve_main([str(fab), "--append", str(listed)])
    out = capsys.readouterr().out.splitlines()
    assert out == [expected, f"appended to {listed}", expected, f"already in {listed}"]
    assert read(listed) == {expected}
    assert listed.read_text().splitlines()[-1] == f"{expected}  # tiny 1.0"
    with pytest.raises(SystemExit, match="is not allowed; allowed: a Flower App directory"):
        approve_main([str(tmp_path / "dev")])
