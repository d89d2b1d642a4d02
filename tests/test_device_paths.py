"""A hostile server against a device's disk: no value it sends names a place on the device.

Each attack goes through the real ClientApp handlers (``train_fn``, ``evaluate_fn``) of a
device with a local-DP floor and its own ``state-dir``, as a SuperNode runs them. The server
chooses the ``experiment-id`` (an absolute path, ``..``, ``../escaped``, a name with a
separator), sends a simulation's ``client-state-root`` or a run config ``client-state-dir``,
or finds a symbolic link inside the state directory that points out. Each is refused with
one line naming the value and what is allowed, and every byte outside the state directory
is as it was, no state file outside it is read, and none is deleted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

import fedinit.store.state_dir as state_dir_module
from client_app.app import evaluate_fn, train_fn
from client_app.model_cache import initial_weights
from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.store.path_names import ALLOWED, PathError, path_name
from fedinit.store.privacy_ledger import LEDGER_NAME
from fedinit.store.simulated_state import STATE_ROOT
from fedinit.store.state_dir import StateDir
from strategies.device_privacy import REFUSED

pytestmark = pytest.mark.usefixtures("quick_runs")

NODE = 7
PID = 1
RUN: dict[str, Any] = {"num-clients": 4, "train-limit": 400, "batch-size": 50,
                       "local-epochs": 1, "weighting": "uniform", "dp": "local",
                       "dp-clip": 0.5, "dp-noise-multiplier": 1.2, "output-dir": "/tmp/unused"}
FLOOR = {"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0}


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """(the device's state-dir, a directory beside it holding a file the device must
    never touch)."""
    state, outside = tmp_path / "device" / "state", tmp_path / "outside"
    state.mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("the device must leave this alone\n")
    return state, outside


def device(state: Path | None, run: dict[str, Any] = RUN, **node: Any) -> Context:
    nc: dict[str, Any] = {"partition-id": PID, "num-partitions": 4, **FLOOR, **node}
    if state is not None:
        nc["state-dir"] = str(state)
    return Context(run_id=1, node_id=NODE, node_config=nc, state=RecordDict(),
                   run_config=dict(run))


def message(experiment: object, kind: str = MessageType.TRAIN, server_round: int = 2,
            **extra: Any) -> Message:
    set_task_identity()
    conf = {rk.ROUND: server_round, rk.LR: 0.05, rk.BETA: 0.0, rk.UPLOAD_DELTA: True,
            rk.EXPERIMENT: experiment, rk.CLIENT_ID: PID, **extra}
    w0 = list(initial_weights(RunConfig.parse(RUN)))
    msg = Message(content=RecordDict({rk.ARRAYS: ArrayRecord(w0),
                                      rk.CONFIG: ConfigRecord(conf)}),
                  dst_node_id=NODE, message_type=kind)
    msg.metadata.__dict__["_message_id"] = f"{kind}-{server_round}"
    return msg


def tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry under ``root`` (not following links; ``skip``'s subtree left out): a
    link's target, a file's digest, or 'dir'."""
    out: dict[str, str] = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base) / name
            if skip is not None and path.is_relative_to(skip):
                continue
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[key] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                out[key] = "dir"
            else:
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every state file the device reads, resolved."""
    seen: list[Path] = []
    real = state_dir_module.read_record

    def recording(path: Path) -> Any:
        seen.append(Path(path).resolve())
        return real(path)

    monkeypatch.setattr(state_dir_module, "read_record", recording)
    return seen


def assert_refused(reply: Message, *words: str) -> str:
    assert reply.has_error(), "the task was not refused"
    assert reply.error.code == REFUSED
    reason = reply.error.reason
    assert "\n" not in reason and reason.startswith("device privacy: refused the ")
    for word in words:
        assert word in reason, reason
    return reason


# ---------------------------------------------------------------- the experiment id
@pytest.mark.parametrize("experiment", ["ABSOLUTE", "..", "../escaped", "exp/sub", "exp\\sub",
                                        ".", "x" * 129, "exp\x00"])
def test_a_server_chosen_experiment_id_is_refused_and_nothing_outside_is_touched(
        experiment: str, places: tuple[Path, Path], tmp_path: Path,
        reads: list[Path]) -> None:
    state, outside = places
    if experiment == "ABSOLUTE":
        experiment = str(outside / "abs")
    before = tree(tmp_path, skip=state)
    reply = train_fn(message(experiment), device(state))
    assert_refused(reply, f"experiment-id={experiment!r} is not allowed", f"allowed: {ALLOWED}")
    assert tree(tmp_path, skip=state) == before  # nothing written or deleted outside
    assert not (tmp_path / "device" / "escaped").exists()
    assert reads == []
    assert list(state.rglob("*.npz")) == []  # and the task did no work at all


def test_the_same_experiment_id_is_refused_for_an_evaluation_that_reads_state(
        places: tuple[Path, Path], tmp_path: Path) -> None:
    """Without a floor (under local DP every evaluation is refused anyway) the divergence
    query reads the client's state: from the device's own directory only."""
    state, outside = places
    StateDir(outside, "abs", PID).save(1, {"w_prev": [np.ones(3)]})  # bait to read
    run = {**RUN, "dp": "off"}
    ctx = Context(run_id=1, node_id=NODE, node_config={"partition-id": PID,
                                                       "num-partitions": 4,
                                                       "state-dir": str(state)},
                  state=RecordDict(), run_config=run)
    before = tree(tmp_path)
    reply = evaluate_fn(message(str(outside / "abs"), MessageType.EVALUATE,
                                **{rk.DIVERGENCE_EVAL: True}), ctx)
    assert_refused(reply, "evaluate message (divergence)", "experiment-id=")
    assert tree(tmp_path) == before


def test_an_empty_experiment_id_keeps_no_state_on_disk(
        places: tuple[Path, Path], tmp_path: Path) -> None:
    """'' is the documented "no disk state": the task runs, writes no state file and
    nothing outside the state directory; only the device's ledger is in it."""
    state, _ = places
    before = tree(tmp_path, skip=state)
    reply = train_fn(message(""), device(state))
    assert not reply.has_error()
    assert tree(tmp_path, skip=state) == before
    assert sorted(p.name for p in state.rglob("*")) == [LEDGER_NAME]


def test_a_plain_experiment_id_keeps_its_state_inside_the_state_dir(
        places: tuple[Path, Path], tmp_path: Path) -> None:
    """The control: the same device and message with a plain name trains and writes its
    version where the layout says, so the refusals above are of the names alone."""
    state, _ = places
    before = tree(tmp_path, skip=state)
    reply = train_fn(message("fedavg-ri0-fashion_mnist-s0-20261206-174000"), device(state))
    assert not reply.has_error()
    assert tree(tmp_path, skip=state) == before
    assert (state / "fedavg-ri0-fashion_mnist-s0-20261206-174000" / f"client-{PID}"
            / "r000002.npz").is_file()


# ---------------------------------------------------------------- links out of state-dir
def _link_outside(state: Path, outside: Path, where: str) -> Path:
    """A link inside the state directory that points out, at ``where`` of the layout; the
    outside place holds this client's valid state of round 1 (bait for a restore)."""
    StateDir(outside, "exp", PID).save(1, {"w_prev": [np.ones(3)]})
    if where == "experiment":
        (state / "exp").symlink_to(outside / "exp", target_is_directory=True)
        return state / "exp"
    client = state / "exp" / f"client-{PID}"
    if where == "client":
        client.parent.mkdir(parents=True)
        client.symlink_to(outside / "exp" / f"client-{PID}", target_is_directory=True)
        return client
    client.mkdir(parents=True)
    (client / "r000001.npz").symlink_to(outside / "exp" / f"client-{PID}" / "r000001.npz")
    return client / "r000001.npz"


@pytest.mark.parametrize("where", ["experiment", "client", "version"])
def test_a_link_out_of_the_state_dir_is_never_followed(
        where: str, places: tuple[Path, Path], tmp_path: Path, reads: list[Path]) -> None:
    state, outside = places
    link = _link_outside(state, outside, where)
    before, inside_before = tree(tmp_path, skip=state), tree(state)
    reply = train_fn(message("exp", server_round=4), device(state))
    assert_refused(reply, "resolves outside this device's state directory",
                   f"'{link.relative_to(state).as_posix()}")
    assert str(outside) not in reply.error.reason  # the device's own paths stay on it
    assert tree(tmp_path, skip=state) == before  # nothing written, renamed or deleted out
    assert tree(state) == inside_before  # the link is neither pruned nor set aside
    assert [p for p in reads if not p.is_relative_to(state.resolve())] == []


def test_pruning_never_deletes_through_a_link(places: tuple[Path, Path],
                                              tmp_path: Path) -> None:
    """Two good versions and an old one that is a link out: the save that would prune the
    old one refuses instead (the check runs before any work), its target stays."""
    state, outside = places
    target = outside / "old.npz"
    target.write_bytes(b"not the device's")
    disk = StateDir(state, "exp", PID)
    disk.save(2, {"w_prev": [np.ones(3)]})
    disk.save(3, {"w_prev": [np.ones(3)]})
    (disk.client_dir / "r000001.npz").symlink_to(target)
    with pytest.raises(PathError, match="r000001.npz' resolves outside"):
        disk.save(4, {"w_prev": [np.ones(3)]})
    assert target.read_bytes() == b"not the device's"
    assert (disk.client_dir / "r000001.npz").is_symlink()


# ---------------------------------------------------------------- a root the server names
def test_a_device_without_state_dir_refuses_the_servers_state_root(
        places: tuple[Path, Path], tmp_path: Path) -> None:
    """``client-state-root`` is how a simulation's server tells its own simulated clients
    where their files are; a device (no state-dir, its ledger elsewhere) refuses it."""
    _, outside = places
    ctx = device(None, **{"dp-ledger": str(tmp_path / "ledger.json")})
    before = tree(tmp_path)
    reply = train_fn(message("exp", **{STATE_ROOT: str(outside)}), ctx)
    assert_refused(reply, f"{STATE_ROOT}={str(outside)!r} names a place on this device")
    assert tree(tmp_path) == before


def test_a_device_without_state_dir_refuses_the_run_configs_client_state_dir(
        places: tuple[Path, Path], tmp_path: Path) -> None:
    _, outside = places
    run = {**RUN, "client-state-dir": str(outside)}
    ctx = device(None, run, **{"dp-ledger": str(tmp_path / "ledger.json")})
    before = tree(tmp_path)
    reply = train_fn(message("exp"), ctx)
    assert_refused(reply, f"client-state-dir={str(outside)!r} names a place on this device")
    assert tree(tmp_path) == before


# ---------------------------------------------------------------- the one rule
@pytest.mark.parametrize("value", ["run-1", "a.b_c-D9", "x" * 128])
def test_plain_names_pass(value: str) -> None:
    assert path_name(value, "experiment-id") == value


@pytest.mark.parametrize("value", ["", ".", "..", "/abs", "a/b", "a b", "é", "x" * 129, 3])
def test_everything_else_is_one_line_naming_it(value: object) -> None:
    with pytest.raises(PathError) as err:
        path_name(value, "experiment-id")
    assert str(err.value) == (f"experiment-id={value!r} is not allowed; allowed: {ALLOWED}")


@pytest.mark.parametrize("over", [
    {}, {"dirichlet-alpha": 1e6, "beta": 1e-5, "partition": "dirichlet-equal", "seed": 12345},
    {"num-regimes": 2, "regime-kind": "permute-labels", "method": "scaffold", "beta": 0.0}])
def test_every_run_name_the_server_makes_is_a_plain_name(over: dict[str, Any]) -> None:
    """The experiment id is the run directory's name: the rule must admit every one the
    server makes (``1e+06`` for a Dirichlet alpha of a million)."""
    from server_app.run_basics import run_name

    name = run_name(RunConfig.parse(over))
    assert path_name(name, "experiment-id") == name
