"""FedRelax under ``rounds=async`` (book section 5.8, eq. (128)/(130)): the real FedBuff loop,
strategy and client code on the least-squares problem with a hand-written completion order
(``testbeds/lsq_async.py``), against a numpy replay of the rule written here.

The replay: a task sent to client i carries m_i = sum_j A_ij w_j / d_i of the models the
server holds at send time, whatever their version; the client takes K full-batch gradient
steps on L_i(w) + alpha sum_j A_ij ||w - w_j||^2 (gradient X^T (X w - y) / n + 2 alpha d_i
(w - m_i)) from its own stored model (the m_i it first receives when it has none) and keeps
the result, whether or not the server accepts it; a flush of K accepted replies is one event
k of eq. (128) with A(k) the buffered clients: each one's server copy is replaced by its
last buffered model. Also: one buffer of all clients is the sync round, enough events reach
the GTVMin closed form (eq. (58)), and a kill and resume ends bit-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.config import ConfigError, RunConfig
from fedinit.methods.fedrelax import OWN
from fedinit.store.state_dir import StateDir
from server_app import async_resume
from server_app.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from strategies.async_loop import BufferedStrategy
from testbeds.lsq_async import (
    EXPERIMENT,
    Script,
    ScriptedGrid,
    make_loop,
    run_lsq_async,
    speed_order,
)
from testbeds.lsq_problem import Federation, Problem, lsq_problem
from testbeds.lsq_resume import resumable_run, uninterrupted_and_killed

N, DIM, K_STEPS, LR, ALPHA = 4, 5, 5, 0.05, 0.5
EDGES = [(0, 1, 1.0), (1, 2, 0.5), (2, 3, 2.0), (0, 3, 1.0)]
"""A weighted ring: degrees 2, 1.5, 2.5, 3."""
LOCAL = {"num-clients": N, "lr": LR, "local-epochs": K_STEPS, "batch-size": 1000,
         "weighting": "uniform", "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0,
         "beta": 0.0, "max-update-norm-ratio": 0.0, "personal-eval-every": 0,
         "output-dir": "/tmp/unused", "method": "fedrelax", "fedrelax-alpha": ALPHA}
"""Full-batch steps (batch-size > n), no RI, decay, clipping or norm filter."""
SCRIPT: Script = [(0, "ok"), (1, "ok"), (0, "ok"), (2, "ok"), (0, "lost"), (1, "ok"),
                  (3, "ok"), (0, "ok"), (2, "nan"), (1, "ok"), (3, "ok"), (0, "ok"),
                  (2, "ok"), (1, "ok")]
"""Buffer 2: client 3 first answers after two flushes (tau 2), so its m_3 was built from the
initial models; client 0 loses a reply and client 2's second is rejected (NaN), though both
clients keep what they trained. Buffer 3: flush 1 holds two replies of client 0 (the later
replaces the earlier)."""


def problem() -> Problem:
    return lsq_problem(num_clients=N, dim=DIM, n=20, seed=7)


def graph_file(root: Path, edges: list[tuple[int, int, float]] = EDGES) -> str:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "graph.txt"
    path.write_text("".join(f"{i} {j} {a}\n" for i, j, a in edges))
    return f"file:{path}"


def async_cfg(root: Path, **raw: Any) -> RunConfig:
    return RunConfig.parse({**LOCAL, "rounds": "async", "concurrency": N,
                            "staleness": "constant", "graph": graph_file(root), **raw})


def adjacency() -> np.ndarray:
    a = np.zeros((N, N))
    for i, j, w in EDGES:
        a[i, j] = a[j, i] = w
    return a


def f32(w: np.ndarray) -> np.ndarray:
    """What crosses the wire and is stored: float32."""
    return w.astype(np.float32).astype(np.float64)


def oracle(script: Script, buffer_size: int, flushes: int, max_staleness: int = 0,
           at_once: bool = False) -> dict[str, Any]:
    """Eq. (128) with (130)'s local step over ``script``, in float64. A client trains when its
    task is sent (as the testbed's nodes do; its inputs are fixed then), so its own model
    includes the tasks still out when the run ends. ``at_once``: the rule not chosen, each
    accepted reply replacing its held model when it arrives instead of at the flush."""
    p, a = problem(), adjacency()
    held = [p.w0.astype(np.float64)] * N  # the server's copy of each client's model
    own: dict[int, np.ndarray] = {}  # each client's own stored model
    task: dict[int, tuple[int, np.ndarray]] = {}
    version, buffer = 0, []

    def send(cid: int) -> None:
        m = f32(sum(a[cid, j] * held[j] for j in range(N)) / a[cid].sum())  # of held now
        y = own.get(cid, m).copy()
        for _ in range(K_STEPS):
            y -= LR * (p.gradient(cid, y) + 2.0 * ALPHA * a[cid].sum() * (y - m))
        own[cid] = f32(y)
        task[cid] = (version, own[cid])

    for cid in range(N):
        send(cid)
    for cid, fate in script:
        v_sent, y = task.pop(cid)
        if fate == "ok" and not (max_staleness and version - v_sent > max_staleness):
            buffer.append((cid, y))
            if at_once:
                held[cid] = y
        if len(buffer) == buffer_size:
            for j, w in buffer:  # event k: A(k) = the buffered clients, the last reply wins
                held[j] = w
            version, buffer = version + 1, []
        if version == flushes:
            break
        send(cid)
    assert version == flushes, "the script ends before the last flush"
    return {"held": np.stack(held), "own": np.stack([own[i] for i in range(N)])}


def held_models(strategy: BufferedStrategy) -> np.ndarray:
    rule, state = strategy.rule, strategy.state
    return np.stack([rule.model_of(state, cid)[0] for cid in range(N)])  # type: ignore[attr-defined]


def own_models(grid: ScriptedGrid) -> np.ndarray:
    return np.stack([grid.store(cid).get(OWN)[0] for cid in range(N)])  # type: ignore[index]


# ---------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize(("buffer_size", "flushes", "max_staleness"),
                         [(2, 5, 0), (2, 5, 1), (3, 4, 0)])
def test_stale_lost_and_rejected_replies_match_the_oracle(
        tmp_path: Path, buffer_size: int, flushes: int, max_staleness: int) -> None:
    cfg = async_cfg(tmp_path, **{"buffer-size": buffer_size, "num-server-rounds": flushes,
                                 "max-staleness": max_staleness})
    w, strategy, grid, _ = run_lsq_async(problem(), cfg, SCRIPT, tmp_path / "state")
    want = oracle(SCRIPT, buffer_size, flushes, max_staleness=max_staleness)
    np.testing.assert_allclose(held_models(strategy), want["held"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(own_models(grid), want["own"], rtol=1e-5, atol=1e-6)
    # the global model is the mean of the held models; held and own differ where a reply
    # was lost, rejected or not flushed yet
    np.testing.assert_allclose(w, want["held"].mean(axis=0), rtol=1e-5, atol=1e-6)
    assert np.abs(want["own"] - want["held"]).max() > 1e-3


@pytest.mark.parametrize(("buffer_size", "flushes"), [(2, 5), (3, 4)])
def test_the_oracle_tells_the_rule_from_near_misses(tmp_path: Path, buffer_size: int,
                                                    flushes: int) -> None:
    """Accepting the lost and rejected replies, dropping client 3's stale one (buffer 2), or
    replacing a held model when its reply arrives instead of at the flush (buffer 3: a
    client is re-sent between a buffered reply and its flush) all end elsewhere."""
    cfg = async_cfg(tmp_path, **{"buffer-size": buffer_size, "num-server-rounds": flushes})
    _, strategy, _, _ = run_lsq_async(problem(), cfg, SCRIPT, tmp_path / "state")
    held = held_models(strategy)
    fresh = [(cid, "ok") for cid, _ in SCRIPT]
    misses = [oracle(fresh, buffer_size, flushes)]
    misses.append(oracle(SCRIPT, 2, 5, max_staleness=1) if buffer_size == 2 else
                  oracle(SCRIPT, 3, 4, at_once=True))
    for other in misses:
        assert np.abs(held - other["held"]).max() > 1e-3


# ---------------------------------------------------------------------------- sync and (58)
def test_one_buffer_of_all_clients_is_the_sync_round(tmp_path: Path) -> None:
    """concurrency = buffer-size = N: flush 1 is sync round 1 of ``Federation`` (the sync
    strategy on the same problem): the global model, every held model and every client's."""
    cfg = async_cfg(tmp_path, **{"buffer-size": N, "num-server-rounds": 1})
    script: Script = [(cid, "ok") for cid in (2, 0, 3, 1)]
    w, strategy, grid, _ = run_lsq_async(problem(), cfg, script, tmp_path / "state")
    fed = Federation(problem(), {**LOCAL, "graph": graph_file(tmp_path), "fraction-train": 1.0})
    sync = fed.run(1)
    np.testing.assert_allclose(w, sync, rtol=1e-6, atol=1e-7)
    assert np.abs(w - problem().w0).max() > 1e-2
    sync_held = np.stack([fed.strategy.rule.model_of(fed.strategy.state, cid)[0]  # type: ignore[attr-defined]
                          for cid in range(N)])
    np.testing.assert_allclose(held_models(strategy), sync_held, rtol=1e-6, atol=1e-7)
    sync_own = np.stack([fed.state_of(cid, OWN)[0] for cid in range(N)])  # type: ignore[index]
    round_1 = np.stack([StateDir(tmp_path / "state", EXPERIMENT, cid).load_version(
        1, [np.zeros(DIM)])[OWN][0] for cid in range(N)])  # later tasks trained at push
    np.testing.assert_allclose(round_1, sync_own, rtol=1e-6, atol=1e-7)


def gtvmin(p: Problem, alpha: float) -> np.ndarray:
    """Eq. (58) for L_i(w) = ||X_i w - y_i||^2 / (2 n_i): the stationary point of
    sum_i L_i(w_i) + alpha sum_edges A_ij ||w_i - w_j||^2 solves
    (blockdiag(X_i^T X_i / n_i) + 2 alpha L (x) I) w = (X_i^T y_i / n_i) stacked."""
    a = adjacency()
    lap = np.diag(a.sum(axis=1)) - a
    big = np.kron(2.0 * alpha * lap, np.eye(DIM))
    rhs = np.zeros(N * DIM)
    for i in range(N):
        x, y = p.xs[i].double().numpy(), p.ys[i].double().numpy()
        big[i * DIM:(i + 1) * DIM, i * DIM:(i + 1) * DIM] += x.T @ x / len(y)
        rhs[i * DIM:(i + 1) * DIM] = x.T @ y / len(y)
    return np.linalg.solve(big, rhs).reshape(N, DIM)


def test_enough_events_reach_the_gtvmin_closed_form(tmp_path: Path) -> None:
    """Clients of four speeds (the slowest about 4x the fastest: replies up to several
    flushes stale), buffer-size 2, 100 flushes at alpha 0.1: every held model is within
    1e-5 of eq. (58) (measured 2.6e-6), which is 46% away from each client's own least
    squares (alpha 0)."""
    cfg = async_cfg(tmp_path, **{"buffer-size": 2, "num-server-rounds": 100, "lr": 0.15,
                                 "local-epochs": 10, "fedrelax-alpha": 0.1})
    grid = ScriptedGrid(problem(), cfg, speed_order([1.0, 1.3, 2.1, 3.7], 240),
                        tmp_path / "state")
    loop, strategy = make_loop(grid)
    taus: list[int] = []
    loop.run([problem().w0.copy()], lambda flush, facts: taus.extend(flush.staleness))
    assert max(taus) >= 2
    target = gtvmin(problem(), 0.1)
    gap = np.abs(held_models(strategy) - target).max() / np.abs(target).max()
    assert gap < 1e-5, gap
    assert np.abs(gtvmin(problem(), 0.0) - target).max() > 0.3 * np.abs(target).max()


# ---------------------------------------------------------------------------- kill and resume
KILLED: Script = [(1, "ok"), (0, "ok"), (1, "nan"), (2, "ok"), (3, "ok"), (1, "ok")]
"""Version 2's checkpoint (after the 5th reply, before client 3's next task) has clients 0, 1
and 2 training on m_i built from version 1's held models (clients 2 and 3's changed at flush
2); client 1's reply is then buffered and the server killed."""
AFTER: Script = [(1, "ok"), (0, "ok"), (2, "ok"), (3, "ok"), (1, "ok"), (0, "ok"),
                 (2, "ok"), (3, "ok")]
"""What follows the checkpoint in the uninterrupted run (the resumed one redoes the first)."""


def killed_run(tmp_path: Path) -> tuple[RunConfig, np.ndarray, BufferedStrategy, Path, Path]:
    """The uninterrupted run's model and strategy, and the run and state directories of the
    same run killed after checkpoint 2."""
    cfg = async_cfg(tmp_path, **{"buffer-size": 2, "num-server-rounds": 5})
    return cfg, *uninterrupted_and_killed(problem(), cfg, tmp_path, KILLED, AFTER, ckpt_at=2)


def test_killed_and_resumed_ends_bit_identical(tmp_path: Path) -> None:
    """Fresh nodes over the same state directories: the resumed run re-sends the three tasks
    in flight at version 2 (clients 0, 1, 2), each with the m_i it carried, built from
    version 1's models, and ends with the uninterrupted run's global model, every held model and the
    server state, bit for bit; it matches the oracle too."""
    cfg, ref_w, ref, run_dir, states = killed_run(tmp_path)
    ckpt = load_checkpoint(run_dir)
    assert sum(k.startswith("task-") and k.endswith("/arrays") for k in ckpt.extra) == 3
    w, got = resumable_run(ScriptedGrid(problem(), cfg, AFTER, states), run_dir,
                           ckpt_at=0, resume=True)
    assert w.tobytes() == ref_w.tobytes()
    assert held_models(got).tobytes() == held_models(ref).tobytes()
    mine, want = got.server_state(), ref.server_state()
    assert set(mine) == set(want)
    assert all(a.tobytes() == b.tobytes() for k in want
               for a, b in zip(mine[k], want[k], strict=True))
    np.testing.assert_allclose(held_models(got), oracle(KILLED[:5] + AFTER, 2, 5)["held"],
                               rtol=1e-5, atol=1e-6)


def test_a_resume_that_rebuilt_m_i_would_end_elsewhere(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept content matters: re-sending the tasks with m_i rebuilt from the checkpoint's
    models (their saved content left out) ends away from the uninterrupted run."""
    cfg, ref_w, _, run_dir, states = killed_run(tmp_path)
    monkeypatch.setattr(async_resume, "sent_contents_of", lambda *args: {})
    w, _ = resumable_run(ScriptedGrid(problem(), cfg, AFTER, states), run_dir,
                         ckpt_at=0, resume=True)
    assert np.abs(w - ref_w).max() > 1e-6


def test_a_checkpoint_without_the_tasks_content_is_refused(tmp_path: Path) -> None:
    cfg, _, _, run_dir, states = killed_run(tmp_path)
    ckpt = load_checkpoint(run_dir)
    for key in [k for k in ckpt.extra if k.startswith("task-")]:
        del ckpt.extra[key]
    save_checkpoint(run_dir, ckpt)
    with pytest.raises(CheckpointError, match="lacks the content of client \\d's task in "
                                              "flight") as err:
        resumable_run(ScriptedGrid(problem(), cfg, AFTER, states), run_dir, ckpt_at=0,
                      resume=True)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("over", "line"), [
    ({"staleness": "poly"}, "staleness='poly' is not allowed; allowed: constant with "
                            "method='fedrelax' with rounds='async' (a reply replaces"),
    ({"graph": "knn"}, "graph='knn' is not allowed; allowed: file:<path> with "
                       "method='fedrelax' with rounds='async' (a learned graph"),
    ({"graph": "loss"}, "graph='loss' is not allowed"),
])
def test_what_fedrelax_cannot_run_under_async_is_refused_in_one_line(
        tmp_path: Path, over: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        async_cfg(tmp_path, **over)
    assert line in str(err.value) and "\n" not in str(err.value)
    async_cfg(tmp_path, **{"max-staleness": 3})  # max-staleness is allowed
