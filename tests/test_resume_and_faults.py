"""Crashes, restarts and bad replies, through the real server loop and ClientApp in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Error, Message, MessageType, RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.store.client_store import W_PREV, ClientStore
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from strategies.round_stages.quorum import TooFewReplies

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 4, "train-limit": 800,
         "local-epochs": 1}


def config(tmp: Path, **over: Any) -> RunConfig:
    return RunConfig.parse({**SMALL, "output-dir": str(tmp / "out"),
                            "client-state-dir": str(tmp / "state"), **over})


def final_model(run_dir: Path) -> list[np.ndarray]:
    with np.load(run_dir / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]


def bitwise_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


class CrashingGrid(InProcessGrid):
    """Dies (like a killed server) right after the clients of ``crash_round`` trained."""

    def __init__(self, crash_round: int, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.crash_round = crash_round

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        msgs = list(messages)
        out = super().send_and_receive(msgs, timeout=timeout)
        if msgs and msgs[0].content.config_records.get(rk.CONFIG, {}).get(rk.ROUND) \
                == self.crash_round:
            raise KeyboardInterrupt("server killed")
        return out


PER_CLIENT = {"fedrelax": {"beta": 0.0, "graph-refresh-every": 2, "graph-k": 1},
              "fedrelax-loss": {"beta": 0.0, "graph": "loss", "graph-refresh-every": 2,
                                "graph-k": 1},
              "fedrelax-warm": {"beta": 0.0, "relax-warmup": 2, "graph-refresh-every": 2,
                                "graph-k": 1},
              "fedrelax-warm-loss": {"beta": 0.0, "graph": "loss", "relax-warmup": 2,
                                     "graph-refresh-every": 2, "graph-k": 1},
              "clustered": {"beta": 0.0, "cluster-every": 2},
              "clustered-kmeans": {"beta": 0.0, "cluster-every": 2, "cluster-assign": "kmeans"},
              "clustered-auto": {"beta": 0.0, "num-clusters": 0, "cluster-warmup": 2,
                                 "num-regimes": 2, "regime-kind": "permute-labels"}}
"""FedRelax (server copies of the clients' models on disk, the learned graph rebuilt after
the resume; under graph=loss the clients' choices and when each measured; under relax-warmup
the warm model, checkpointed at the warm-up's last round, every client's start after it; with
graph=loss too, the warm-up's uploads kept as the candidate models round 3 scores) and
clustered FL (cluster models; the clients' loss-based choices, or under
k-means the assignment re-clustered after the resume; under num-clusters=0 the K the warm-up
chose)."""


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedadam", "feddyn", "fedcm",
                                    "fedrelax", "fedrelax-loss", "fedrelax-warm",
                                    "fedrelax-warm-loss", "clustered",
                                    "clustered-kmeans", "clustered-auto"])
def test_killed_and_resumed_run_ends_bit_identical(tmp_path: Path, method: str) -> None:
    """Guards the checkpoint of every kind of server state (SCAFFOLD's c, Adam's moments,
    FedDyn's H, FedCM's momentum d, the norm history, FedRelax's per-client versions and
    graph, clustered FL's models and assignment): a server killed after round 3's training
    and resumed ends with the same model and the same server state, bit for bit."""
    over = {"method": method.split("-")[0], **({"server-lr": 0.1} if method == "fedadam" else {}),
            **PER_CLIENT.get(method, {})}
    ref_cfg = config(tmp_path / "ref", **over)
    run_experiment(InProcessGrid(4, ref_cfg.to_dict()), ref_cfg, out_dir=tmp_path / "ref-run")

    cfg = config(tmp_path / "crash", **over)
    run_dir = tmp_path / "crash-run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(CrashingGrid(3, 4, cfg.to_dict()), cfg, out_dir=run_dir)
    assert [r["round"] for r in rows(run_dir)] == [1, 2]
    # a new server process and fresh SuperNodes: all in-memory state is gone
    resumed = config(tmp_path / "crash", **over, **{"resume-dir": str(run_dir)})
    run_experiment(InProcessGrid(4, resumed.to_dict()), resumed)
    assert bitwise_equal(final_model(run_dir), final_model(tmp_path / "ref-run"))
    assert [r["round"] for r in rows(run_dir)] == [1, 2, 3, 4]
    ref_acc = [r["test-acc"] for r in rows(tmp_path / "ref-run")]
    assert [r["test-acc"] for r in rows(run_dir)] == ref_acc
    got_state = load_checkpoint(run_dir).strategy_state
    want_state = load_checkpoint(tmp_path / "ref-run").strategy_state
    assert set(got_state) == set(want_state)
    assert all(bitwise_equal(got_state[k], want_state[k]) for k in want_state)
    if method == "clustered-auto":  # the checkpoint after round 2 holds the 2 models chosen
        first = json.loads((run_dir / "clusters.jsonl").read_text().splitlines()[0])
        assert (first["round"], first["num-clusters"]) == (2, 2)
    if method != "fedavg":  # the method's own state is there and not all zeros
        own = [k for k in want_state if not k.startswith("norms:")]
        assert own and any(np.any(a != 0) for k in own for a in want_state[k])


@pytest.mark.parametrize("method", ["fedrelax", "fedrelax-warm-loss"])
def test_fedrelax_killed_after_writing_its_client_models_resumes_bit_identical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """The server dies after round 3 stored the replies' models (server-models/) but before
    its checkpoint: the resumed run reads the versions round 2's checkpoint names, not the
    newer files, and ends as the uninterrupted run, server copies and graph included. Under
    relax-warmup=2 with graph=loss round 3 is the first to score candidates, the warm-up's
    uploads, which its writes keep beside the new files for the resumed round 3 to read."""
    over = {"method": "fedrelax", **PER_CLIENT[method]}
    ref_cfg = config(tmp_path / "ref", **over)
    run_experiment(InProcessGrid(4, ref_cfg.to_dict()), ref_cfg, out_dir=tmp_path / "ref-run")

    import server_app.experiment as experiment

    real_save = experiment.save_checkpoint

    def dying_save(run_dir: Path, ckpt: Any) -> None:
        if ckpt.server_round == 3:
            raise KeyboardInterrupt("server killed before round 3's checkpoint")
        real_save(run_dir, ckpt)

    cfg = config(tmp_path / "crash", **over)
    run_dir = tmp_path / "crash-run"
    monkeypatch.setattr(experiment, "save_checkpoint", dying_save)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(InProcessGrid(4, cfg.to_dict()), cfg, out_dir=run_dir)
    monkeypatch.setattr(experiment, "save_checkpoint", real_save)
    assert load_checkpoint(run_dir).server_round == 2
    stale = sorted(p.relative_to(run_dir).as_posix()
                   for p in (run_dir / "server-models").glob("*/r3.npz"))
    assert stale  # round 3 had written its clients' models
    resumed = config(tmp_path / "crash", **over, **{"resume-dir": str(run_dir)})
    run_experiment(InProcessGrid(4, resumed.to_dict()), resumed)
    assert bitwise_equal(final_model(run_dir), final_model(tmp_path / "ref-run"))
    got, want = (load_checkpoint(d).strategy_state for d in (run_dir, tmp_path / "ref-run"))
    assert set(got) == set(want) and all(bitwise_equal(got[k], want[k]) for k in want)
    assert len(want["graph"][0]) > 0  # a learned graph, rebuilt after the resume (round 4)

    def copies(d: Path) -> dict[str, bytes]:
        return {p.relative_to(d).as_posix(): b"".join(a.tobytes() for a in np.load(p).values())
                for p in (d / "server-models").glob("*/r*.npz")}

    assert copies(run_dir) == copies(tmp_path / "ref-run")


def test_restarted_supernode_restores_its_saved_state(tmp_path: Path) -> None:
    cfg = config(tmp_path, method="scaffold", **{"num-server-rounds": 6})
    ref = InProcessGrid(4, cfg.to_dict())
    run_experiment(ref, cfg, out_dir=tmp_path / "ref")

    grid = InProcessGrid(4, cfg.to_dict())
    restarted: dict[str, Any] = {}
    original = grid.send_and_receive

    def restart_after_round_3(messages: Any, *, timeout: float | None = None) -> Any:
        msgs = list(messages)
        out = original(msgs, timeout=timeout)
        if msgs and msgs[0].content.config_records.get(rk.CONFIG, {}).get(rk.ROUND) == 3:
            for node, ctx in list(grid.contexts.items()):
                saved = ClientStore(ctx.state).entries()
                if saved:
                    restarted[node] = saved
                    grid.contexts[node] = Context(run_id=1, node_id=node,
                                                  node_config=dict(ctx.node_config),
                                                  state=RecordDict(),
                                                  run_config=dict(ctx.run_config))
        return out

    grid.send_and_receive = restart_after_round_3  # type: ignore[method-assign]
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    assert restarted, "some node should have had state to lose"
    assert bitwise_equal(final_model(tmp_path / "run"), final_model(tmp_path / "ref"))
    # what each restarted node saved on disk is exactly what it held in memory
    from fedinit.store.state_dir import StateDir
    for node, saved in restarted.items():
        cid = node - 1000
        mirror = StateDir(tmp_path / "state", "run", cid)
        _, on_disk = mirror.load_before(10**6) or (0, {})
        later = ClientStore(grid.contexts[node].state).tag()
        if later and later[1] > 3:
            continue  # it trained again after the restart; disk moved on, as it should
        for key in (W_PREV, "scaffold-c-i"):
            assert bitwise_equal(on_disk[key], saved[key])


def corrupt(kind: str, victim: int):  # noqa: ANN201 - returns a reply filter
    def change(reply: Message) -> Message | None:
        if reply.metadata.src_node_id != victim or reply.has_error():
            return reply
        if reply.metadata.message_type != "train":
            return reply
        c = reply.content
        arrays = unpack(c[rk.ARRAYS])
        if kind == "nan":
            arrays[0] = arrays[0].copy()
            arrays[0].flat[0] = np.nan
        elif kind == "shape":
            arrays[0] = arrays[0][:1]
        elif kind == "scaled":
            arrays = [a * 1e6 for a in arrays]
        elif kind == "dtype":
            arrays = [a.astype(np.float64) for a in arrays]
        elif kind == "missing":
            del c[rk.METRICS]
            return reply
        c[rk.ARRAYS] = ArrayRecord(arrays)
        return reply
    return change


FIVE = {"num-clients": 5, "fraction-train": 0.6, "num-server-rounds": 3}
VICTIM = 1000 + 2


class VictimCrashGrid(InProcessGrid):
    """The victim's ClientApp crashes on every train message: its reply is the error the
    grid makes of a client's exception, and it trains nothing."""

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        out: list[Message] = []
        for msg in messages:
            if (msg.metadata.dst_node_id == VICTIM
                    and msg.metadata.message_type == MessageType.TRAIN):
                self.sent.append(msg)
                reply = Message(Error(code=1, reason="crashed"), reply_to=msg)
                self.replies.append(reply)
                out.append(reply)
            else:
                out.extend(super().send_and_receive([msg], timeout=timeout))
        return out


def victim_rounds(grid: InProcessGrid) -> set[int]:
    """The rounds whose train message went to the victim."""
    return {int(m.content.config_records[rk.CONFIG][rk.ROUND])  # type: ignore[arg-type]
            for m in grid.sent if m.metadata.dst_node_id == VICTIM
            and m.metadata.message_type == MessageType.TRAIN}


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory,
                quick_runs: None) -> tuple[list[dict[str, Any]], list[np.ndarray], set[int]]:
    """The same run with the victim crashing instead of replying: its rows, its final model
    and the rounds that sampled the victim."""
    tmp = tmp_path_factory.mktemp("crashed")
    cfg = config(tmp, **FIVE)
    grid = VictimCrashGrid(5, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp / "run")
    return rows(tmp / "run"), final_model(tmp / "run"), victim_rounds(grid)


@pytest.mark.parametrize("kind", ["nan", "shape", "scaled", "dtype", "missing"])
def test_bad_reply_is_rejected_and_counted(
        tmp_path: Path, kind: str,
        crashed_run: tuple[list[dict[str, Any]], list[np.ndarray], set[int]]) -> None:
    """A rejection in exactly the rounds that sampled the bad client (one in each), and the
    model bit for bit that of the run where that client crashed: the bad reply never got in."""
    cfg = config(tmp_path / "bad", **FIVE)
    grid = InProcessGrid(5, cfg.to_dict())
    grid.reply_filter = corrupt(kind, victim=VICTIM)
    run_experiment(grid, cfg, out_dir=tmp_path / "bad-run")
    got = rows(tmp_path / "bad-run")
    crashed_rows, crashed_model, crashed_rounds = crashed_run
    sampled = victim_rounds(grid)
    assert sampled == crashed_rounds and 0 < len(sampled) < len(got)  # both kinds of round
    assert {r["round"]: r["num-rejected"] for r in got} == {
        r["round"]: int(r["round"] in sampled) for r in got}
    assert [r["num-rejected"] for r in got] == [r["num-rejected"] for r in crashed_rows]
    assert [r["num-replies"] for r in got] == [r["num-replies"] for r in crashed_rows]
    assert bitwise_equal(final_model(tmp_path / "bad-run"), crashed_model)


@pytest.mark.parametrize("aggregation", ["median", "trimmed-mean"])
def test_robust_aggregation_bounds_a_scaled_update(tmp_path: Path, aggregation: str) -> None:
    over = {"num-clients": 5, "fraction-train": 1.0, "num-server-rounds": 2,
            "max-update-norm-ratio": 0.0, "aggregation": aggregation, "trim-fraction": 0.2,
            "partition": "iid"}  # robust statistics assume similar honest clients
    cfg = config(tmp_path, **over)
    run_experiment(InProcessGrid(5, cfg.to_dict()), cfg, out_dir=tmp_path / "clean")
    grid = InProcessGrid(5, cfg.to_dict())
    grid.reply_filter = corrupt("scaled", victim=1000 + 1)
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    w = final_model(tmp_path / "run")
    assert max(float(np.abs(a).max()) for a in w) < 10.0  # the 1e6 update did not get in
    got, clean = rows(tmp_path / "run")[-1], rows(tmp_path / "clean")[-1]
    assert abs(got["test-acc"] - clean["test-acc"]) < 0.1


def test_a_silent_client_is_left_out_and_the_run_goes_on(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    grid = InProcessGrid(4, cfg.to_dict())
    grid.reply_filter = lambda r: (None if r.metadata.src_node_id == 1000
                                   and r.metadata.message_type == "train" else r)
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    got = rows(tmp_path / "run")
    assert len(got) == 4 and sum(r["num-missing"] for r in got) >= 1


def test_too_few_replies_stops_with_a_checkpoint_to_resume(tmp_path: Path) -> None:
    cfg = config(tmp_path, **{"min-replies": 2, "max-failed-rounds": 2})
    grid = InProcessGrid(4, cfg.to_dict())
    grid.reply_filter = lambda r: None if r.metadata.message_type == "train" else r
    with pytest.raises(TooFewReplies, match="resume-dir"):
        run_experiment(grid, cfg, out_dir=tmp_path / "run")
    assert (tmp_path / "run" / "checkpoint.npz").exists()
    assert [r["num-replies"] for r in rows(tmp_path / "run")] == [0, 0]
