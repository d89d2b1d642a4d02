"""DP accounting that matches what the server does (issue 35, problems 1-4 and what is written).

- Sampling under DP is m of ALL N registered clients whoever is connected: each client's
  inclusion frequency stays m / N with half the clients offline (the replacing sampler used
  outside DP would double it: shown as the oracle).
- Both epsilons (replace-one, fixed-size; add-or-remove-one, Poisson at q = m / N) against
  ``dp_accounting`` called here with the events written out, and the issue's checked figure.
- No data-dependent skip: a rejected reply is a zero contribution and the round still moves
  the model by the clipped sum plus noise of std z C / m (checked by statistics on 30,000
  coordinates; the same round outside DP is skipped).
- Count before release: every message carrying round t's model (or round t's training) leaves
  after the ledger counts round t; a crash after round 3's evaluation and before its
  checkpoint is counted, and its rerun counted again.
- Nothing public in the run directory names the clients a round sampled (the same check on a
  run without DP finds them: the oracle).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import clip
from fedinit.methods.dp_budget import Budget
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.sampling import sample_available, sample_clients
from fedinit.methods.scaffold import DELTA_C
from fedinit.methods.weights import Weights
from server_app.checkpoint import CHECKPOINT_FILE, CheckpointError, load_checkpoint
from server_app.experiment import _progress_line, run_experiment
from server_app.privacy import LEDGER_FILE, Ledger
from strategies.method_strategy import MethodStrategy

pytestmark = pytest.mark.usefixtures("quick_runs")

D_MODEL = 30_000


def strategy(mode: str, n: int, *, method: str = "fedavg", online: Iterable[int] | None = None,
             **over: object) -> MethodStrategy:
    set_task_identity()
    cfg = RunConfig.parse({"method": method, "num-clients": n, "output-dir": "/tmp/unused",
                           "dp": mode, "weighting": "uniform", **over})
    ids = sorted(online) if online is not None else list(range(n))
    return MethodStrategy(cfg, {p: 1000 + p for p in range(n)},
                          [np.zeros(D_MODEL, np.float32)], examples=[10] * n,
                          available=lambda: ids)


# ---------------------------------------------------------------- 1. sampling from all N
def test_dp_inclusion_rate_is_m_over_n_with_half_the_clients_offline() -> None:
    """N = 100, m = 10, clients 0, 2, 4, ... offline: over 20,000 rounds every client is
    sampled in 10% +- 10% of them (4.7 binomial sigmas), online clients messaged at that rate
    and the offline ones never; the replacing sampler (outside DP) would message each online
    client at about m / |A| = 0.2, which this test rejects."""
    online = range(1, 100, 2)
    s = strategy("central", 100, online=online, **{"fraction-train": 0.1})
    s.sampling_seed = 12345  # fixed here so that the test is deterministic
    rounds, m, n = 20_000, 10, 100
    messaged = np.zeros(n)
    for r in range(1, rounds + 1):
        chosen = s.sample(r)
        assert s._sampled == m and set(chosen) <= set(online)
        messaged[chosen] += 1
    sampled = np.zeros(n)
    for r in range(1, rounds + 1):
        sampled[sample_clients(12345, r, n, m)] += 1
    rate = m / n
    assert np.all(np.abs(sampled / rounds - rate) <= 0.1 * rate), sampled.min()
    on = np.array(list(online))
    assert np.all(np.abs(messaged[on] / rounds - rate) <= 0.1 * rate)
    assert not messaged[0::2].any()
    old = np.zeros(n)  # the oracle: the sampler used outside DP, m / |A| = 0.2
    for r in range(1, 2001):
        old[sample_available(12345, r, n, m, online)] += 1
    assert old[on].sum() / 2000 / len(on) == pytest.approx(2 * rate)
    assert not np.any(np.abs(old[on] / 2000 - rate) <= 0.1 * rate)


def test_dp_messages_only_the_present_sampled_and_counts_the_absent_missing() -> None:
    online = range(0, 20, 2)
    s = strategy("central", 20, online=online, **{"fraction-train": 0.5})
    w = ArrayRecord([np.zeros(D_MODEL, np.float32)])
    msgs = list(s.configure_train(1, w, ConfigRecord(), cast(Grid, None)))
    sampled = sample_clients(s.sampling_seed, 1, 20, 10)
    assert sorted(m.metadata.dst_node_id - 1000 for m in msgs) == [
        p for p in sampled if p % 2 == 0]
    arrays, metrics = s.aggregate_train(1, [])
    assert arrays is None and metrics is not None and metrics[rk.NUM_MISSING] == 10


def test_outside_dp_the_sample_is_sample_available_exactly() -> None:
    online = [p for p in range(30) if p % 3]
    s = strategy("off", 30, online=online, **{"fraction-train": 0.2, "seed": 7})
    w = ArrayRecord([np.zeros(D_MODEL, np.float32)])
    for r in range(1, 6):
        msgs = s.configure_train(r, w, ConfigRecord(), cast(Grid, None))
        assert sorted(m.metadata.dst_node_id - 1000 for m in msgs) == sample_available(
            7, r, 30, 6, online)


# ---------------------------------------------------------------- 2. two epsilons
def library_epsilons(n: int, m: int, z: float, rounds: int, delta: float,
                     channels: int = 1) -> tuple[float, float]:
    """Replace-one (fixed-size, multiplier z / 2 per channel) and add/remove (Poisson at
    m / n, multiplier z per channel), the library called directly."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    rel = dpa.NeighboringRelation
    replace = RdpAccountant(neighboring_relation=rel.REPLACE_ONE)
    replace.compose(dpa.SampledWithoutReplacementDpEvent(
        n, m, dpa.ComposedDpEvent([dpa.GaussianDpEvent(z / 2)] * channels)), rounds)
    add_remove = RdpAccountant(neighboring_relation=rel.ADD_OR_REMOVE_ONE)
    add_remove.compose(dpa.PoissonSampledDpEvent(
        m / n, dpa.GaussianDpEvent(z / math.sqrt(channels))), rounds)
    return replace.get_epsilon(delta), add_remove.get_epsilon(delta)


def test_the_issues_figure_and_the_papers_convention() -> None:
    """N = 100, m = 10, z = 1, 60 rounds, delta 1e-5 (the defaults): replace-one 54.41 (the
    issue's independently checked figure), add/remove the library's Poisson figure, and the
    first about 8.6 x the second."""
    b = Budget("central", 1.0, 1, 100, 10, 1e-5)
    replace, add_remove = library_epsilons(100, 10, 1.0, 60, 1e-5)
    assert b.epsilon(60) == pytest.approx(54.41, abs=0.005)
    assert b.epsilon(60) == pytest.approx(replace, rel=1e-9)
    assert b.epsilon_add_remove(60) == pytest.approx(add_remove, rel=1e-9)
    assert b.epsilon(60) / b.epsilon_add_remove(60) == pytest.approx(8.6, abs=0.05)


@pytest.mark.parametrize(("n", "m", "z", "rounds", "channels"),
                         [(50, 5, 1.3, 25, 1), (40, 8, 2.0, 12, 2)])
def test_both_epsilons_equal_the_library(n: int, m: int, z: float, rounds: int,
                                         channels: int) -> None:
    """Other settings, and SCAFFOLD's two channels (one Gaussian of z / sqrt(2) inside the
    Poisson event: the composition written out independently of the code's)."""
    b = Budget("central", z, channels, n, m, 1e-6)
    replace, add_remove = library_epsilons(n, m, z, rounds, 1e-6, channels)
    assert b.epsilon(rounds) == pytest.approx(replace, rel=1e-9)
    assert b.epsilon_add_remove(rounds) == pytest.approx(add_remove, rel=1e-9)
    assert b.epsilon_add_remove(rounds) < b.epsilon(rounds)


def test_local_add_remove_is_the_plain_gaussian_every_round() -> None:
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    ref = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    ref.compose(dpa.GaussianDpEvent(1.5), 20)
    assert Budget("local", 1.5, 1, 100, 10, 1e-5).epsilon_add_remove(20) == pytest.approx(
        ref.get_epsilon(1e-5), rel=1e-9)


def test_the_progress_line_labels_both_epsilons() -> None:
    row = {"round": 3, "test-acc": 0.5, "test-loss": 1.0, "round-seconds": 1.0,
           "elapsed-seconds": 3.0, "dp-epsilon": 54.41, "dp-epsilon-add-remove": 6.337}
    line = _progress_line(row, 60, 10, 1e-5)
    assert ("epsilon 54.41 (replace-one, fixed-size sampling) / 6.337 (add/remove, Poisson "
            "q=m/N) at delta 1e-05") in line
    assert "epsilon" not in _progress_line({**row, "dp-epsilon": None}, 60, 10, 1e-5)


# ---------------------------------------------------------------- 3. no data-dependent skip
def reply(msg: Message, upload: Weights, extras: Weights | None = None) -> Message:
    more = {DELTA_C: ArrayRecord(extras)} if extras is not None else {}
    content = RecordDict({rk.ARRAYS: ArrayRecord(upload), rk.METRICS: MetricRecord(
        {rk.NUM_EXAMPLES: 10, rk.TRAIN_LOSS: 0.1, rk.NUM_STEPS: 2}),
        rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: True}), **more})
    return Message(content=content, reply_to=msg)


def nan_move() -> Weights:
    bad = np.ones(D_MODEL, np.float32)
    bad[7] = np.nan
    return [bad]


def one_round(s: MethodStrategy, answers: dict[int, Weights | str],
              extras: dict[int, Weights] | None = None
              ) -> tuple[Weights | None, Any]:
    """Round 1; client i answers ``answers[i]``: a move, or an error code name."""
    msgs = list(s.configure_train(1, ArrayRecord([np.zeros(D_MODEL, np.float32)]),
                                  ConfigRecord(), cast(Grid, None)))
    replies = []
    for msg in msgs:
        cid = msg.metadata.dst_node_id - 1000
        answer = answers.get(cid)
        if isinstance(answer, str):
            replies.append(Message(Error(code=getattr(ErrorCode, answer), reason=answer),
                                   reply_to=msg))
        elif answer is not None:
            replies.append(reply(msg, answer, None if extras is None else extras[cid]))
    arrays, metrics = s.aggregate_train(1, replies)
    return (None if arrays is None else unpack(arrays)), metrics


def moves(n: int, seed: int) -> dict[int, Weights]:
    rng = np.random.default_rng(seed)
    return {i: [(rng.standard_normal(D_MODEL) * 0.05).astype(np.float32)] for i in range(n)}


def assert_noise(got: np.ndarray, noiseless: np.ndarray, std: float) -> None:
    noise = got.astype(np.float64) - noiseless
    assert abs(noise.std() / std - 1.0) < 0.05, (noise.std(), std)
    assert abs(noise.mean()) < 0.05 * std


def test_a_rejected_reply_under_dp_still_moves_the_model_by_the_noised_sum() -> None:
    """5 sampled, 2 reply, one with a NaN; min-replies = 2. Under central DP the round is
    released: w_1 - clip(the good move) / 5 is N(0, (z C / 5)^2); the same round without DP
    is skipped (the data-dependent event the issue describes)."""
    over = {"fraction-train": 1.0, "min-replies": 2, "dp-clip": 0.7,
            "dp-noise-multiplier": 1.5}
    good = moves(1, seed=3)[0]
    s = strategy("central", 5, **over)
    got, metrics = one_round(s, {0: good, 1: nan_move()})
    assert got is not None
    assert metrics[rk.NUM_REPLIES] == 1 and metrics[rk.NUM_REJECTED] == 1
    assert metrics[rk.NUM_MISSING] == 3
    assert_noise(got[0], clip(good, 0.7)[0].astype(np.float64) / 5, 1.5 * 0.7 / 5)
    assert s.accounted == {0: 1}
    off, _ = one_round(strategy("off", 5, **over), {0: good, 1: nan_move()})
    assert off is None


def test_every_reply_rejected_under_dp_releases_the_noise_alone() -> None:
    """SCAFFOLD, central DP, the one arrived reply rejected: the model moves by N(0, (z C /
    m)^2) and c by N(0, (z C_x / N)^2) (a zero contribution carries the noise of both
    channels), no client is counted as aggregated, no train loss is reported."""
    over = {"fraction-train": 0.5, "dp-clip": 0.5, "dp-clip-extra": 2.0,
            "dp-noise-multiplier": 0.8}
    s = strategy("central", 4, method="scaffold", **over)
    first = sample_clients(s.sampling_seed, 1, 4, 2)[0]
    got, metrics = one_round(s, {first: nan_move()}, extras={first: nan_move()})
    assert got is not None and rk.ROUND_TRAIN_LOSS not in metrics
    assert metrics[rk.NUM_REPLIES] == 0 and metrics[rk.NUM_REJECTED] == 1
    assert_noise(got[0], np.zeros(D_MODEL), 0.8 * 0.5 / 2)
    assert_noise(s.state.c[0], np.zeros(D_MODEL), 0.8 * 2.0 / 4)  # type: ignore[attr-defined]
    assert s.accounted == {}


def test_under_dp_only_arrived_replies_count_against_min_replies() -> None:
    """A client's own error (its ClientApp raised) arrived: released; the SuperLink's
    node-unavailable did not: with nothing else arrived the round is skipped."""
    over = {"fraction-train": 0.5, "dp-noise-multiplier": 1.0}
    s = strategy("central", 4, **over)
    first = sample_clients(s.sampling_seed, 1, 4, 2)[0]
    got, metrics = one_round(s, {first: "CLIENT_APP_RAISED_EXCEPTION"})
    assert got is not None and metrics[rk.NUM_REJECTED] == 1
    s = strategy("central", 4, **over)
    first = sample_clients(s.sampling_seed, 1, 4, 2)[0]
    got, metrics = one_round(s, {first: "NODE_UNAVAILABLE"})
    assert got is None and metrics[rk.NUM_REJECTED] == 1


# ---------------------------------------------------------------- 4. count before release
SMALL = {"num-clients": 3, "fraction-train": 0.67, "num-server-rounds": 4, "train-limit": 300,
         "local-epochs": 1, "batch-size": 50, "node-wait-timeout": 3.0, "dp": "central",
         "weighting": "uniform", "dp-noise-multiplier": 2.0, "dp-clip": 0.05,
         "evaluation": "federated", "divergence-every": 1, "personal-eval-every": 2,
         "personal-eval-clients": 0}
"""Every kind of message that carries the new model goes out: federated evaluation, the
divergence query, personalized evaluation, the next round's training."""


def ledger_count(run_dir: Path) -> int:
    path = run_dir / LEDGER_FILE
    return json.loads(path.read_text())["rounds-counted"] if path.exists() else 0


class WatchingGrid(InProcessGrid):
    """Records, for each message, its type, its round and the ledger's count on disk at the
    moment it leaves; and who each train message went to."""

    def __init__(self, run_dir: Path, *args: Any) -> None:
        super().__init__(*args)
        self.run_dir = run_dir
        self.log: list[tuple[str, int, int]] = []
        self.trained: dict[int, list[int]] = {}

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        msgs = list(messages)
        for msg in msgs:
            if msg.metadata.message_type == MessageType.QUERY:
                continue
            rnd = int(msg.content.config_records[rk.CONFIG][rk.ROUND])  # type: ignore[arg-type]
            self.log.append((msg.metadata.message_type, rnd, ledger_count(self.run_dir)))
            if msg.metadata.message_type == MessageType.TRAIN:
                self.trained.setdefault(rnd, []).append(msg.metadata.dst_node_id - 1000)
        return super().send_and_receive(msgs, timeout=timeout)


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory,
           quick_runs: None) -> tuple[Path, WatchingGrid]:
    tmp = tmp_path_factory.mktemp("dp-run")
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp)})
    grid = WatchingGrid(tmp / "run", 3, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp / "run")
    return tmp / "run", grid


def test_every_message_of_round_t_leaves_after_round_t_is_counted(
        dp_run: tuple[Path, WatchingGrid]) -> None:
    run_dir, grid = dp_run
    kinds = {kind for kind, _, _ in grid.log}
    assert kinds == {MessageType.TRAIN, MessageType.EVALUATE}
    assert len({(k, r) for k, r, _ in grid.log}) >= 8  # train and evaluate in each round
    assert all(counted >= rnd for _, rnd, counted in grid.log), grid.log
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    b = Budget.for_run(RunConfig.parse({**SMALL, "output-dir": "/tmp/unused"}), channels=1)
    assert [r["dp-rounds-counted"] for r in rows] == [1, 2, 3, 4]
    assert [r["dp-epsilon"] for r in rows] == pytest.approx([b.epsilon(t) for t in (1, 2, 3, 4)])
    assert [r["dp-epsilon-add-remove"] for r in rows] == pytest.approx(
        [b.epsilon_add_remove(t) for t in (1, 2, 3, 4)])
    # the rows against the library itself: N = 3, m = round(0.67 * 3) = 2, z = 2, one channel
    delta = RunConfig.parse({**SMALL, "output-dir": "/tmp/unused"}).privacy.dp_delta
    library = [library_epsilons(3, 2, 2.0, t, delta) for t in (1, 2, 3, 4)]
    assert [r["dp-epsilon"] for r in rows] == pytest.approx([e for e, _ in library], rel=1e-9)
    assert [r["dp-epsilon-add-remove"] for r in rows] == pytest.approx(
        [e for _, e in library], rel=1e-9)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dp-epsilon"] == pytest.approx(b.epsilon(4))
    assert summary["dp-epsilon-add-remove"] == pytest.approx(b.epsilon_add_remove(4))
    assert "replace-one" in summary["dp-epsilon-conventions"]["dp-epsilon"]
    assert "Poisson" in summary["dp-epsilon-conventions"]["dp-epsilon-add-remove"]


def test_a_round_released_before_a_crash_is_counted_after_the_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server dies after round 3's model went out (federated and personalized
    evaluation, divergence query) and before its checkpoint: the resume reruns round 3 with
    a fresh sample and fresh noise, and epsilon counts 5 runs of the mechanism, not 4 (the
    figure a round-numbered count would report)."""
    import server_app.experiment as experiment

    real_save = experiment.save_checkpoint

    def dying_save(run_dir: Path, ckpt: Any) -> None:
        if ckpt.server_round == 3:
            raise KeyboardInterrupt("server killed before round 3's checkpoint")
        real_save(run_dir, ckpt)

    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path)})
    run_dir = tmp_path / "run"
    grid = WatchingGrid(run_dir, 3, cfg.to_dict())
    monkeypatch.setattr(experiment, "save_checkpoint", dying_save)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(grid, cfg, out_dir=run_dir)
    monkeypatch.setattr(experiment, "save_checkpoint", real_save)
    assert (MessageType.EVALUATE, 3) in {(k, r) for k, r, _ in grid.log}  # round 3 released
    assert load_checkpoint(run_dir).server_round == 2 and ledger_count(run_dir) == 3
    resumed = RunConfig.parse({**SMALL, "output-dir": str(tmp_path),
                               "resume-dir": str(run_dir)})
    run_experiment(InProcessGrid(3, resumed.to_dict()), resumed)
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    b = Budget.for_run(cfg, channels=1)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert [r["dp-rounds-counted"] for r in rows] == [1, 2, 4, 5]
    assert rows[-1]["dp-epsilon"] == pytest.approx(b.epsilon(5))
    assert rows[-1]["dp-epsilon"] > b.epsilon(4)
    assert ledger_count(run_dir) == 5


def test_a_resume_counts_the_largest_of_checkpoint_rows_and_ledger(tmp_path: Path) -> None:
    rows = [{"round": 1, "dp-rounds-counted": 1}, {"round": 2, "dp-rounds-counted": 3}]
    assert Ledger.open(tmp_path, 2, rows).counted == 3  # an earlier rerun, in the rows
    assert Ledger.open(tmp_path, 2, None).counted == 2  # a run from before the ledger
    (tmp_path / LEDGER_FILE).write_text(json.dumps({"rounds-counted": 5, "last-round": 3}))
    assert Ledger.open(tmp_path, 2, rows).counted == 5  # round 3 sent twice, never saved
    assert Ledger.open(tmp_path, 0, None).counted == 0  # a new run ignores a stale file
    ledger = Ledger.open(tmp_path, 2, rows)
    assert ledger.count(3) == 6 and ledger_count(tmp_path) == 6


@pytest.mark.parametrize("text", ["{torn", '{"rounds-counted": -1}', '{"rounds": 3}'])
def test_an_unusable_ledger_stops_the_resume_in_one_line(tmp_path: Path, text: str) -> None:
    (tmp_path / LEDGER_FILE).write_text(text)
    with pytest.raises(CheckpointError) as err:
        Ledger.open(tmp_path, 2, None)
    assert LEDGER_FILE in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- 5. what is written
PRIVATE = {CHECKPOINT_FILE, "client-state"}
"""Operator-secret under DP (docs/faults.md): the checkpoint's accounted-rounds and the
simulated clients' own state files say who trained when."""


FIELDS = ("clients-trained", "local-own-clients", "divergence-untrained", "partition-id")
"""Field names that name or count the clients that trained (``partition-id``: the per-client
personalized-evaluation file, whose empty ``acc-own`` says a client never trained)."""


def sample_traces(run_dir: Path, trained: dict[int, list[int]]) -> list[str]:
    """Where the public files of ``run_dir`` (TensorBoard's binary event files too) name a
    round's sampled clients: the field name, or the round's list of client ids as JSON or
    CSV writes it."""
    found = []
    lists = {json.dumps(sorted(ids)) for ids in trained.values()}
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if not path.is_file() or rel.parts[0] in PRIVATE or path.suffix in (".png", ".pt",
                                                                              ".npz"):
            continue
        text = path.read_bytes().decode("utf-8", "replace")  # event files are binary
        found += [f"{rel}: {field}" for field in FIELDS if field in text]
        found += [f"{rel}: {ids}" for ids in sorted(lists) if ids in text
                  or ids.replace('"', "") in text.replace('"', "")]
    return found


def test_no_public_file_names_the_sampled_clients_under_dp(
        dp_run: tuple[Path, WatchingGrid], tmp_path: Path) -> None:
    run_dir, grid = dp_run
    assert len(grid.trained) == 4
    names = {p.name for p in run_dir.iterdir()}
    assert {"rounds.jsonl", "rounds.csv", "config.json", "summary.json", LEDGER_FILE} <= names
    assert sample_traces(run_dir, grid.trained) == []
    # the oracle: the same run without DP lists them, and the check finds it
    cfg = RunConfig.parse({**SMALL, "dp": "off", "output-dir": str(tmp_path)})
    off = WatchingGrid(tmp_path / "run", 3, cfg.to_dict())
    run_experiment(off, cfg, out_dir=tmp_path / "run")
    traces = sample_traces(tmp_path / "run", off.trained)
    assert any(t.startswith("rounds.jsonl: clients-trained") for t in traces)
    assert any(t.startswith("rounds.csv: [") for t in traces), traces
    assert "personal_clients.csv: partition-id" in traces
    assert any(t.startswith("rounds.jsonl: local-own-clients") for t in traces)
