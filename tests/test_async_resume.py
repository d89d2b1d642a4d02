"""``rounds=async`` killed mid-buffer and resumed, through the real loop and ClientApp in
process, on the virtual clock (so the completion order is the same in every run): the final
model, the method's server state, every row and each client's saved state equal the
uninterrupted run's, bit for bit; a reply of the killed run reaching the resumed one is
dropped; a checkpoint of the other ``rounds`` mode or another config is refused in one line.

Schedule (slowdowns 1, 2.4, 6.3; concurrency 3, buffer-size 2; see test_virtual_clock.py):
client 0 answers at simulated times 1, 2, 3, ..., client 1 at 2.4, 4.8, 7.2, client 2 at 6.3.
Version 3 is made at 4.8 with client 0's task sent at 4 (its round 5) and client 2's task sent
at 0 in flight. The kill comes as the 10th task goes out (client 0's round 6, sent at 5, after
its round-5 reply was buffered): mid-buffer, and client 0 has saved rounds 5 and 6 since the
checkpoint, so its state of round 4, which the redone round 5 starts from, is kept only
because the server names it (``keep-round``)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.scaffold import C_LOCAL
from fedinit.store.client_store import W_PREV
from fedinit.store.files import read_record
from fedinit.store.state_dir import StateDir
from server_app.async_resume import loop_state_of
from server_app.async_rounds import run_async_experiment
from server_app.checkpoint import CheckpointError, load_checkpoint
from server_app.experiment import run_experiment
from server_app.run_basics import resume_point
from strategies import async_loop
from strategies.round_stages.quorum import TooFewReplies
from tests.conftest import kill_simulation_at
from tests.sim_engine import InProcessSimulation
from tests.test_resume_and_faults import corrupt, final_model, rows

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")  # no plot read, no real wait

KILL_AT = 10
"""The train message whose push kills the server (see the module docstring)."""


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(async_loop, "POLL_SECONDS", 0.001)


def config(tmp: Path, speeds: tuple[float, ...] = (1.0, 2.4, 6.3), **over: Any) -> RunConfig:
    path = tmp / "speeds.txt"
    path.write_text("".join(f"{x}\n" for x in speeds))
    return RunConfig.parse({
        "train-limit": 150, "local-epochs": 1, "batch-size": 50,
        "personal-eval-every": 0, "tracking": "off", "partition": "iid", "eval-every": 2,
        "rounds": "async", "concurrency": 3, "buffer-size": 2, "num-server-rounds": 6,
        "staleness": "poly", "staleness-a": 0.5, "beta": 0.1,
        "num-clients": len(speeds), "device-speeds": f"file:{path}", "output-dir": str(tmp / "out"),
        "client-state-dir": str(tmp / "state"), **over})


class KilledGrid(InProcessGrid):
    """Dies (like a killed server) once its ``kill_at``-th train message is pushed: the
    clients have trained on it, its reply waits on the link."""

    def __init__(self, kill_at: int, cfg: RunConfig) -> None:
        super().__init__(cfg.num_clients, cfg.to_dict())
        self.kill_at = kill_at

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = list(super().push_messages(messages))
        if sum(m.metadata.message_type == "train" for m in self.sent) >= self.kill_at:
            raise KeyboardInterrupt("server killed")
        return ids


def killed_beside_reference(tmp_path: Path, over: dict[str, Any]) -> tuple[Path, KilledGrid]:
    """``config(tmp_path, **over)`` run uninterrupted (``ref-run``) and killed at ``KILL_AT``
    (``crash-run``): the killed run's directory and grid (its replies still on the link)."""
    ref_cfg = config(tmp_path, **over)
    run_async_experiment(InProcessGrid(3, ref_cfg.to_dict()), ref_cfg, tmp_path / "ref-run")
    run_dir = tmp_path / "crash-run"
    killed = KilledGrid(KILL_AT, ref_cfg)
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(killed, ref_cfg, run_dir)
    return run_dir, killed


class LateRepliesGrid(InProcessGrid):
    """A new link whose first pull for train replies also hands back ``late``: replies of
    the killed run's tasks (a leaky link). Its message ids go on from 1000, not from 1: no
    new task has an id of the killed run."""

    def __init__(self, cfg: RunConfig, late: list[Message]) -> None:
        super().__init__(cfg.num_clients, cfg.to_dict())
        self._pushed, self.late = 1000, late

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        ids = set(message_ids)
        if not any(m.metadata.message_type == "train" and m.metadata.message_id in ids
                   for m in self.sent):
            return super().pull_messages(ids)  # identity queries: not the loop's pull
        out = [*self.late, *super().pull_messages(ids)]
        self.late = []
        return out


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


SIMULATED = ("round", "num-replies", "num-rejected", "num-missing", "train-loss", "lr",
             "staleness-mean", "staleness-max", "dropped-stale", "in-flight", "dispatched",
             "buffered", "state-fallbacks", "clients-trained", "sim-time", "test-acc",
             "test-loss")
"""Row fields that do not measure wall time: equal in the resumed and uninterrupted runs."""


def saved_rounds(state_root: Path, experiment: str, cid: int) -> list[int]:
    return sorted(int(f.stem[1:]) for f in (state_root / experiment / f"client-{cid}")
                  .glob("r*.npz"))


def newest_states(state_root: Path, experiment: str) -> dict[int, tuple[int, list[np.ndarray]]]:
    """Each client's newest saved round and its state (w_prev, and c_i under SCAFFOLD), in
    one list."""
    out = {}
    for cid in range(3):
        files = sorted((state_root / experiment / f"client-{cid}").glob("r*.npz"))
        groups, meta = read_record(files[-1])
        out[cid] = (int(meta["round"]), [*groups[W_PREV], *groups.get(C_LOCAL, [])])
    return out


@pytest.mark.parametrize("method", ["fedavg", "fedadam", "scaffold", "fedcm"])
def test_killed_mid_buffer_and_resumed_ends_bit_identical(
        tmp_path: Path, method: str, caplog: pytest.LogCaptureFixture) -> None:
    """FedInit (fedavg, beta 0.1: each client's w_prev), FedAdam (its moments on the
    server), SCAFFOLD (c, each client's c_i, and the c of version 0 and 2 that the tasks
    in flight carry) and FedCM (its momentum d, and the d of versions 0 and 2): the resumed
    run re-sends the two tasks in flight at version 3 from the versions they were sent, and
    ends where the uninterrupted run ends."""
    over = {"method": method, **({"server-lr": 0.1} if method == "fedadam" else {})}
    run_dir, killed = killed_beside_reference(tmp_path, over)
    assert [r["round"] for r in rows(run_dir)] == [1, 2, 3]
    ckpt = load_checkpoint(run_dir)
    assert ckpt.server_round == 3 and ckpt.async_state is not None
    in_flight = ckpt.async_state["in-flight"]
    assert [(t[0], t[1]) for t in in_flight] == [(2, 0), (0, 2)]  # (client, version sent)
    down = {"scaffold": "scaffold-c", "fedcm": "fedcm-d"}.get(method)
    sent_c = {f"version-0/{down}", f"version-2/{down}"} if down else set()
    assert set(ckpt.extra) == {"version-0", "version-2", *sent_c}
    assert saved_rounds(tmp_path / "state", run_dir.name, 0) == [4, 5, 6]  # 4: pinned
    late = list(killed._pending)
    assert late, "the killed run left no reply on the link"

    resumed = config(tmp_path, **over, **{"resume-dir": str(run_dir)})
    caplog.set_level(logging.WARNING)
    run_async_experiment(LateRepliesGrid(resumed, late), resumed)
    dropped = [r for r in caplog.records if "dropped a reply" in r.getMessage()]
    assert len(dropped) == len(late)

    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))
    got, want = rows(run_dir), rows(tmp_path / "ref-run")
    assert [r["round"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    assert all(r["state-fallbacks"] == 0 for r in got)
    got_state = load_checkpoint(run_dir).strategy_state
    want_state = load_checkpoint(tmp_path / "ref-run").strategy_state
    assert set(got_state) == set(want_state)
    assert all(same(got_state[k], want_state[k]) for k in want_state)
    if method in ("fedadam", "scaffold", "fedcm"):  # the moments, c, d are there and moved
        assert any(np.any(a != 0) for k in want_state if not k.startswith(("norms:", "acc"))
                   for a in want_state[k])
    mine = newest_states(tmp_path / "state", run_dir.name)
    ref = newest_states(tmp_path / "state", "ref-run")
    assert {p: r for p, (r, _) in mine.items()} == {p: r for p, (r, _) in ref.items()}
    assert all(same(mine[p][1], ref[p][1]) for p in ref)


def test_the_seeded_choice_of_idle_clients_goes_on_from_its_saved_state(
        tmp_path: Path) -> None:
    """5 clients, 2 training at once: each freed slot is a seeded draw among 3 idle clients,
    so a resumed run that drew afresh (or not at the generator's saved state) would send
    other clients and end elsewhere."""
    speeds = (1.0, 1.3, 1.7, 2.2, 2.9)
    cfg = config(tmp_path, speeds, **{"concurrency": 2, "buffer-size": 2,
                                      "num-server-rounds": 8})
    run_async_experiment(InProcessGrid(5, cfg.to_dict()), cfg, tmp_path / "ref-run")
    run_dir = tmp_path / "crash-run"
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(KilledGrid(9, cfg), cfg, run_dir)
    assert len(rows(run_dir)) in range(2, 8)
    resumed = config(tmp_path, speeds, **{"concurrency": 2, "buffer-size": 2,
                                          "num-server-rounds": 8, "resume-dir": str(run_dir)})
    run_async_experiment(InProcessGrid(5, resumed.to_dict()), resumed)
    got, want = rows(run_dir), rows(tmp_path / "ref-run")
    trained = [c for r in want for c in r["clients-trained"]]
    assert len(set(trained)) == 5  # the draw spread the work
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))


def test_without_keep_round_the_redone_task_loses_its_clients_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kill with the pin left out of the messages: client 0's state of round 4 is
    gone when its round 5 is redone (it starts from w_0, as on its first participation) and
    the model differs from the uninterrupted run's: the test above would catch a broken
    pin."""
    monkeypatch.setattr(async_loop.AsyncLoop, "mark",
                        lambda self, msg, cid, rnd: msg.content.config_records[rk.CONFIG]
                        .__setitem__(rk.ROUND, rnd))
    cfg = config(tmp_path)
    run_async_experiment(InProcessGrid(3, cfg.to_dict()), cfg, tmp_path / "ref-run")
    run_dir = tmp_path / "crash-run"
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(KilledGrid(KILL_AT, cfg), cfg, run_dir)
    assert saved_rounds(tmp_path / "state", run_dir.name, 0) == [5, 6]
    resumed = config(tmp_path, **{"resume-dir": str(run_dir)})
    run_async_experiment(InProcessGrid(3, resumed.to_dict()), resumed)
    assert [r["round"] for r in rows(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert not same(final_model(run_dir), final_model(tmp_path / "ref-run"))


def test_a_pinned_state_version_outlives_the_newest_two(tmp_path: Path) -> None:
    state = StateDir(tmp_path, "exp", 0)
    for rnd in (1, 2, 3, 4):
        state.save(rnd, {W_PREV: [np.full(2, rnd, np.float32)]}, pin=2)
    assert sorted(p.name for p in state.client_dir.iterdir()) == [
        "r000002.npz", "r000003.npz", "r000004.npz"]
    state.save(5, {W_PREV: [np.zeros(2, np.float32)]})
    assert sorted(p.name for p in state.client_dir.iterdir()) == ["r000004.npz", "r000005.npz"]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, quick_runs: None) -> tuple[Path, Path, Path]:
    """A 2-version async run and a 2-round sync run (their checkpoints), and a scratch dir."""
    tmp = tmp_path_factory.mktemp("made")
    cfg = config(tmp, **{"num-server-rounds": 2})
    run_async_experiment(InProcessGrid(3, cfg.to_dict()), cfg, tmp / "async-run")
    sync = RunConfig.parse({**cfg.to_dict(), "rounds": "sync", "fraction-train": 1.0})
    run_experiment(InProcessGrid(3, sync.to_dict()), sync, out_dir=tmp / "sync-run")
    return tmp, tmp / "async-run", tmp / "sync-run"


def one_line(err: pytest.ExceptionInfo[CheckpointError], *parts: str) -> None:
    text = str(err.value)
    assert "\n" not in text and all(p in text for p in parts), text


def test_a_checkpoint_of_the_other_rounds_mode_is_refused_in_one_line(
        made: tuple[Path, Path, Path]) -> None:
    tmp, async_run, sync_run = made
    with pytest.raises(CheckpointError) as err:
        resume_point(config(tmp, **{"num-server-rounds": 4, "resume-dir": str(sync_run)}))
    one_line(err, "rounds='sync' run, this run has rounds='async'")
    sync = RunConfig.parse({**config(tmp).to_dict(), "rounds": "sync", "fraction-train": 1.0,
                            "num-server-rounds": 4, "resume-dir": str(async_run)})
    with pytest.raises(CheckpointError) as err:
        resume_point(sync)
    one_line(err, "rounds='async' run, this run has rounds='sync'")


def test_a_checkpoint_of_another_config_or_done_is_refused_in_one_line(
        made: tuple[Path, Path, Path]) -> None:
    tmp, async_run, _ = made
    with pytest.raises(CheckpointError) as err:
        resume_point(config(tmp, **{"num-server-rounds": 4, "buffer-size": 3,
                                    "resume-dir": str(async_run)}))
    one_line(err, "made with buffer-size=2, this run has buffer-size=3")
    with pytest.raises(CheckpointError) as err:
        resume_point(config(tmp, **{"resume-dir": str(async_run), "num-server-rounds": 2}))
    one_line(err, "at version 2, num-server-rounds=2 leaves nothing to do")
    ok = resume_point(config(tmp, **{"num-server-rounds": 4, "resume-dir": str(async_run)}))
    assert ok is not None
    state, sent = loop_state_of(ok[0], ok[1], has_clock=True)
    assert state.version == 2 and set(sent) == {2, *state.versions()}
    with pytest.raises(CheckpointError) as err:
        loop_state_of(ok[0], ok[1], has_clock=False)
    one_line(err, "virtual clock on, this run has it off")
    broken = ok[1]
    broken.async_state = {k: v for k, v in (broken.async_state or {}).items() if k != "rng"}
    with pytest.raises(CheckpointError) as err:
        loop_state_of(ok[0], broken, has_clock=True)
    one_line(err, "incomplete asynchronous state: missing 'rng'")


def test_without_the_clock_a_resume_redoes_the_tasks_in_flight_and_finishes(
        tmp_path: Path) -> None:
    """``device-speeds`` off: the completion order is the machine's, so no bit-identity is
    claimed, but the resume re-sends the tasks in flight, every version has one row, and no
    client lost its state."""
    over = {"device-speeds": "off", "num-clients": 3}
    cfg = config(tmp_path, **over)
    run_dir = tmp_path / "crash-run"
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(KilledGrid(KILL_AT, cfg), cfg, run_dir)
    done = len(rows(run_dir))
    assert 1 <= done < 6
    assert load_checkpoint(run_dir).async_state["clock-now"] is None  # type: ignore[index]
    resumed = config(tmp_path, **over, **{"resume-dir": str(run_dir)})
    run_async_experiment(InProcessGrid(3, resumed.to_dict()), resumed)
    got = rows(run_dir)
    assert [r["round"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert all(r["state-fallbacks"] == 0 for r in got)
    assert "sim-time" not in got[0]


@pytest.mark.slow  # no processes, but three starts of the engine (~30 s each when loaded)
def test_killed_and_resumed_on_flowers_engine_ends_bit_identical(tmp_path: Path) -> None:
    """The same kill on Flower's InMemoryGrid and engine (tests/sim_engine.py): real message
    ids, the simulation's clients keeping their state in files under the run directory, a
    fresh engine (fresh nodes) for the resumed run."""
    cfg = config(tmp_path)
    over = {k: v for k, v in cfg.to_dict().items() if k != "client-state-dir"}
    cfg = RunConfig.parse(over)
    with InProcessSimulation(3, over) as sim:
        run_async_experiment(sim.grid, cfg, tmp_path / "ref-run")
    run_dir = tmp_path / "crash-run"
    with InProcessSimulation(3, over) as sim:
        push, pushed = sim.grid.push_messages, []

        def dying_push(messages: Iterable[Message]) -> Iterable[str]:
            msgs = list(messages)
            ids = list(push(msgs))
            pushed.extend(m for m in msgs if m.metadata.message_type == "train")
            if len(pushed) >= KILL_AT:
                raise KeyboardInterrupt("server killed")
            return ids

        sim.grid.push_messages = dying_push  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            run_async_experiment(sim.grid, cfg, run_dir)
    assert [r["round"] for r in rows(run_dir)] == [1, 2, 3]
    resumed = {**over, "resume-dir": str(run_dir)}
    with InProcessSimulation(3, resumed) as sim:
        run_async_experiment(sim.grid, RunConfig.parse(resumed))
    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))
    got, want = rows(run_dir), rows(tmp_path / "ref-run")
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    assert list((run_dir / "client-state").rglob("r*.npz")), "no client state files"


@pytest.mark.slow
def test_simulation_process_killed_mid_run_resumes_to_the_same_model(
        sim_env: dict[str, str], tmp_path: Path) -> None:
    """A real ``flwr run`` simulation (fedinit/cli/simulate.py) on the virtual clock: its
    ``flwr-simulation`` process is SIGKILLed wherever it is once 3 versions are written (a
    flush, a push or the middle of a checkpoint), then resumed: the same final model and
    rows as an uninterrupted run's, the clients' state in the run directory."""
    speeds = tmp_path / "speeds.txt"
    speeds.write_text("1\n2.4\n6.3\n1.7\n")
    argv = [sys.executable, "-m", "fedinit.cli.simulate", "num-clients=4", "rounds=async",
            "concurrency=3", "buffer-size=2", "num-server-rounds=14", "train-limit=400",
            "local-epochs=1", "batch-size=50", "beta=0.1", "staleness=poly",
            "personal-eval-every=0", "tracking=off", "eval-every=7",
            f"device-speeds=file:{speeds}"]
    ref = subprocess.run([*argv, f"output-dir={tmp_path / 'ref'}"], env=sim_env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    (ref_dir,) = list((tmp_path / "ref").iterdir())

    out = tmp_path / "crash"
    proc = subprocess.Popen([*argv, f"output-dir={out}"], env=sim_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rows_file = kill_simulation_at(out, 3, "version")
        proc.wait(timeout=120)  # flwr run ends with its simulation; the script cleans up
    finally:
        stop(proc)
    run_dir = rows_file.parent
    assert not (run_dir / "summary.json").exists(), "the run finished before it was killed"
    killed_at = load_checkpoint(run_dir).server_round
    assert 2 <= killed_at < 14  # version 3 written, its checkpoint maybe not yet

    resumed = subprocess.run([*argv, f"output-dir={out}", f"resume-dir={run_dir}"],
                             env=sim_env, capture_output=True, text=True, timeout=600,
                             check=False)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming after version" in resumed.stdout + resumed.stderr
    assert same(final_model(run_dir), final_model(ref_dir))
    got, want = rows(run_dir), rows(ref_dir)
    assert [r["round"] for r in got] == list(range(1, 15))
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    assert list((run_dir / "client-state").rglob("r*.npz")), "no client state files"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the simulate script if it still runs: SIGINT first, so that it removes its staged
    app directory (``fedinit.flower_compat.app_source``), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class WithoutNode(InProcessGrid):
    """A link on which client ``gone``'s node never connected."""

    def __init__(self, cfg: RunConfig, gone: int) -> None:
        super().__init__(cfg.num_clients, cfg.to_dict())
        del self.contexts[1000 + gone]


def test_a_client_gone_at_the_resume_loses_its_task_in_flight(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Client 2's task (sent version 0) was in flight at version 3; its node is not back for
    the resumed run (min-clients=2): the task counts as lost in version 4's row, its slot
    goes to a connected client, and the run makes all its versions."""
    cfg = config(tmp_path)
    run_dir = tmp_path / "crash-run"
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(KilledGrid(KILL_AT, cfg), cfg, run_dir)
    resumed = config(tmp_path, **{"resume-dir": str(run_dir), "min-clients": 2})
    caplog.set_level(logging.INFO)
    run_async_experiment(WithoutNode(resumed, 2), resumed)
    got = rows(run_dir)
    assert [r["round"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert got[3]["num-missing"] == 1 and all(r["num-missing"] == 0 for r in got[4:])
    assert all(2 not in r["clients-trained"] for r in got[3:])
    text = caplog.text
    assert "lost the task of client 2 (sent version 0): not connected" in text
    assert "re-sent 1 of the 2 task(s) in flight" in text


def test_a_run_stopped_for_bad_replies_names_its_checkpoint_and_resumes(
        tmp_path: Path) -> None:
    """Every reply turns NaN once version 2 is made: the loop stops after
    max-failed-rounds x buffer-size rejected replies with one line naming ``resume-dir``;
    resumed with healthy clients from that line's directory, it makes the missing versions
    and ends where an uninterrupted run ends."""
    cfg = config(tmp_path, **{"max-failed-rounds": 1})
    run_async_experiment(InProcessGrid(3, cfg.to_dict()), cfg, tmp_path / "ref-run")
    run_dir = tmp_path / "bad-run"
    grid = InProcessGrid(3, cfg.to_dict())
    broken = [corrupt("nan", 1000 + cid) for cid in range(3)]

    def after_version_2(reply: Message) -> Message | None:
        if (run_dir / "rounds.jsonl").is_file() and len(rows(run_dir)) >= 2:
            for change in broken:
                reply = change(reply) or reply
        return reply

    grid.reply_filter = after_version_2
    with pytest.raises(TooFewReplies) as err:
        run_async_experiment(grid, cfg, run_dir)
    text = str(err.value)
    assert "\n" not in text and f"resume-dir='{run_dir}'" in text, text
    assert [r["round"] for r in rows(run_dir)] == [1, 2]
    resumed = config(tmp_path, **{"max-failed-rounds": 1, "resume-dir": str(run_dir)})
    run_async_experiment(InProcessGrid(3, resumed.to_dict()), resumed)
    assert [r["round"] for r in rows(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))


def test_fedrelax_killed_mid_buffer_and_resumed_ends_bit_identical(tmp_path: Path) -> None:
    """FedRelax (book eq. 128) on the virtual clock: the checkpoint keeps the m_i and d_i
    each task in flight carried (``task-<seq>/...``), built from the client models the
    server held when it was sent; the resumed run re-sends them so and ends where the
    uninterrupted run ends: the global model, the rows, the server state and every client's
    current server copy, bit for bit."""
    graph = tmp_path / "graph.txt"
    graph.write_text("0 1 1.0\n1 2 0.5\n")
    over = {"method": "fedrelax", "beta": 0.0, "staleness": "constant",
            "fedrelax-alpha": 0.5, "graph": f"file:{graph}"}
    run_dir, killed = killed_beside_reference(tmp_path, over)
    ckpt = load_checkpoint(run_dir)
    assert ckpt.async_state is not None
    in_flight = ckpt.async_state["in-flight"]
    assert in_flight and any(t[1] < ckpt.server_round for t in in_flight)  # an older m_i
    for t in in_flight:
        assert {f"task-{t[5]}/{rk.ARRAYS}", f"task-{t[5]}/fedrelax-degree"} <= set(ckpt.extra)

    resumed = config(tmp_path, **over, **{"resume-dir": str(run_dir)})
    run_async_experiment(LateRepliesGrid(resumed, list(killed._pending)), resumed)
    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))
    got, want = rows(run_dir), rows(tmp_path / "ref-run")
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    got_state = load_checkpoint(run_dir).strategy_state
    want_state = load_checkpoint(tmp_path / "ref-run").strategy_state
    assert set(got_state) == set(want_state)
    assert all(same(got_state[k], want_state[k]) for k in want_state)
    version = want_state["version"][0]  # each client's current copy (FedRelaxState)
    for cid in range(3):
        path = Path("server-models") / str(cid) / f"r{int(version[cid])}.npz"
        mine, ref = read_record(run_dir / path)[0]["w"], read_record(
            tmp_path / "ref-run" / path)[0]["w"]
        assert same(mine, ref)
