"""Regimes (fedinit/task/regimes.py): clients fall into a few seeded, balanced groups whose
examples are
rotated or relabelled the group's way, the same in train and local test split and in any
process; with ``num-regimes`` 0 nothing changes."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from fedinit.config import ConfigError, RunConfig
from fedinit.scripts.regime_graph import main as graph_main
from fedinit.scripts.regime_graph import read_edges
from fedinit.task.datasets import load_dataset
from fedinit.task.federated_data import (
    client_examples,
    client_indices,
    client_test_examples,
    local_test_indices,
    regime_of,
    regimes_of,
)
from fedinit.task.regimes import (
    client_regimes,
    label_permutation,
    rotate,
    same_regime_edges,
)
from server_app.regime_files import read_regimes, write_regimes

RUN = {"num-clients": 8, "train-limit": 800, "partition": "iid", "seed": 3,
       "num-regimes": 4, "regime-kind": "rotate"}
PERMUTED = {**RUN, "regime-kind": "permute-labels"}
"""RUN with relabelled regimes: what tests/another_process.py's fresh interpreter derives."""


def _raw(cfg: RunConfig, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    data = load_dataset(cfg.data.dataset, cfg.data.resolved_data_dir)
    return data.train_x[idx], data.train_y[idx]


def test_assignment_is_balanced_and_seeded() -> None:
    for n, r in ((50, 4), (7, 3), (10, 10), (5, 1)):
        regimes = client_regimes(n, r, seed=0)
        counts = np.bincount(regimes, minlength=r)
        assert counts.size == r and counts.max() - counts.min() <= 1, (n, r, counts)
    a = client_regimes(50, 4, seed=0)
    np.testing.assert_array_equal(a, client_regimes(50, 4, seed=0))
    assert not np.array_equal(a, client_regimes(50, 4, seed=1))
    assert not np.array_equal(a, np.arange(50) % 4)  # shuffled, not by id


def test_permutations_are_bijections_identity_only_in_regime_zero() -> None:
    np.testing.assert_array_equal(label_permutation(10, 0, seed=5), np.arange(10))
    perms = [label_permutation(10, r, seed=5) for r in range(1, 6)]
    for p in perms:
        np.testing.assert_array_equal(np.sort(p), np.arange(10))  # a bijection
        assert not np.array_equal(p, np.arange(10))
    assert len({p.tobytes() for p in perms}) == 5
    np.testing.assert_array_equal(perms[0], label_permutation(10, 1, seed=5))
    assert not np.array_equal(perms[0], label_permutation(10, 1, seed=6))
    # two classes: the only other permutation is the swap
    np.testing.assert_array_equal(label_permutation(2, 3, seed=0), [1, 0])


def test_rotate_is_np_rot90_of_each_image() -> None:
    x = np.random.default_rng(0).integers(0, 256, size=(3, 5, 5, 2), dtype=np.uint8)
    for r in range(4):
        out = rotate(x, r)
        for i in range(3):
            np.testing.assert_array_equal(out[i], np.rot90(x[i], k=r))
    assert out.flags.c_contiguous
    with pytest.raises(ValueError, match="square"):
        rotate(np.zeros((1, 4, 6, 1), np.uint8), 1)


def test_rotated_clients_see_rot90_of_their_raw_images_in_both_splits() -> None:
    cfg = RunConfig.parse(RUN)
    plain = RunConfig.parse({**RUN, "num-regimes": 0})
    assert sorted(set(regimes_of(cfg))) == [0, 1, 2, 3]
    for cid in range(cfg.num_clients):
        k = regime_of(cfg, cid)
        for examples, indices in ((client_examples, client_indices),
                                  (client_test_examples, local_test_indices)):
            x, y = examples(cfg, cid)
            raw_x, raw_y = _raw(cfg, indices(cfg, cid))
            assert x.shape[0] > 0
            np.testing.assert_array_equal(y, raw_y)
            for i in range(x.shape[0]):
                np.testing.assert_array_equal(x[i], np.rot90(raw_x[i], k=k))
            # the same examples as without regimes, only turned
            np.testing.assert_array_equal(examples(plain, cid)[0], raw_x)
            if k:
                assert not np.array_equal(x, raw_x)


def test_label_permutation_applies_to_train_and_test_alike() -> None:
    cfg = RunConfig.parse({**RUN, "regime-kind": "permute-labels", "num-regimes": 3})
    for cid in range(cfg.num_clients):
        perm = label_permutation(10, regime_of(cfg, cid), cfg.seed)
        for examples, indices in ((client_examples, client_indices),
                                  (client_test_examples, local_test_indices)):
            x, y = examples(cfg, cid)
            raw_x, raw_y = _raw(cfg, indices(cfg, cid))
            np.testing.assert_array_equal(x, raw_x)
            np.testing.assert_array_equal(y, perm[raw_y])
    assert {regime_of(cfg, p) for p in range(cfg.num_clients)} == {0, 1, 2}


def test_regimes_off_leaves_the_data_untouched() -> None:
    cfg = RunConfig.parse({**RUN, "num-regimes": 0})
    for cid in (0, 5):
        x, y = client_examples(cfg, cid)
        raw_x, raw_y = _raw(cfg, client_indices(cfg, cid))
        np.testing.assert_array_equal(x, raw_x)
        np.testing.assert_array_equal(y, raw_y)


def test_another_process_derives_the_same_regimes(another_process: dict[str, Any]) -> None:
    """A deployed client derives its regime and data from run config + partition id."""
    cfg = RunConfig.parse(PERMUTED)
    mine = hashlib.sha256(b"".join(client_examples(cfg, p)[1].tobytes()
                                   for p in range(8))).hexdigest()
    assert another_process["regimes"] == list(regimes_of(cfg))
    assert another_process["labels"] == mine


@pytest.mark.parametrize(("update", "key"), [
    ({"num-regimes": 5}, "num-regimes"),  # rotate: 0/90/180/270 only
    ({"num-regimes": -1}, "num-regimes"),
    ({"num-regimes": 9, "regime-kind": "permute-labels"}, "num-regimes"),  # > num-clients
    ({"regime-kind": "flip"}, "regime-kind"),
])
def test_bad_regime_settings_are_refused_in_one_line(update: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^run config: {key}=") as err:
        RunConfig.parse({**RUN, **update})
    assert "\n" not in str(err.value)


def test_same_regime_edges_connect_exactly_the_clients_of_a_regime() -> None:
    regimes = [0, 1, 0, 2, 1, 0]
    edges = same_regime_edges(regimes, weight=0.5)
    assert {(i, j) for i, j, _ in edges} == {(0, 2), (0, 5), (2, 5), (1, 4)}
    assert all(w == 0.5 for *_, w in edges)
    with pytest.raises(ValueError, match="weight"):
        same_regime_edges(regimes, weight=0.0)


def test_results_file_and_graph_file_round_trip(tmp_path) -> None:
    cfg = RunConfig.parse(RUN)
    write_regimes(tmp_path, cfg)
    regimes = read_regimes(tmp_path)
    assert regimes == dict(enumerate(regimes_of(cfg)))
    text = (tmp_path / "regimes.csv").read_text()
    assert "rot90" in text and "rot270" in text
    out = tmp_path / "graph.txt"
    assert graph_main(["--run-dir", str(tmp_path), "--out", str(out)]) == 0
    edges = read_edges(out)
    assert edges == same_regime_edges([regimes[p] for p in range(8)])
    # the same graph straight from the run config, without a run
    out2 = tmp_path / "graph2.txt"
    assert graph_main(["--out", str(out2), *(f"{k}={v}" for k, v in RUN.items())]) == 0
    assert read_edges(out2) == edges
    off = tmp_path / "off"
    off.mkdir()
    write_regimes(off, RunConfig.parse({**RUN, "num-regimes": 0}))
    assert read_regimes(off) == {}


def _fake_run(run_dir, regimes: dict[int, int], own: dict[int, float]) -> list[dict]:
    """A finished run's files as the report reads them: regimes.csv, personal_clients.csv."""
    run_dir.mkdir(parents=True)
    if regimes:
        (run_dir / "regimes.csv").write_text(
            "partition-id,regime,transform\n"
            + "".join(f"{p},{r},x\n" for p, r in regimes.items()))
    (run_dir / "personal_clients.csv").write_text(
        "round,partition-id,num-test,acc-global,acc-finetuned,acc-own\n"
        + "".join(f"30,{p},40,0.5,0.6,{a}\n" for p, a in own.items()))
    return [{"round": 30, "test-acc": 0.7, "local-global-mean": 0.5, "local-own-mean": 0.8}]


def test_report_groups_by_data_set_and_gives_each_regimes_mean(tmp_path) -> None:
    from fedinit.cli.report import CellResult
    from fedinit.cli.sweep_plan import load_plan
    from fedinit.scripts.personal_report import tables

    cells = [c for c in load_plan("experiments/fmnist-network.yaml").cells
             if c.config["method"] == "fedavg" and c.config["beta"] == 0.0
             and c.config["seed"] in (0, 1)]
    results = []
    for i, cell in enumerate(cells):
        reg = {0: 0, 1: 1, 2: 0, 3: 1} if cell.config["num-regimes"] else {}
        own = {0: 0.9, 1: 0.2 + 0.1 * i, 2: 0.7, 3: 0.4}
        rows = _fake_run(tmp_path / cell.id, reg, own)
        results.append(CellResult(cell, run_dir=tmp_path / cell.id, rows=rows))
    text, flat = tables(results)
    assert "4 rotate regimes, iid (mean" in text and "Dir-0.1 (mean" in text
    per_regime = [line for line in text.splitlines() if line.startswith("| FedAvg")]
    assert len(per_regime) == 3  # two data sets, one per-regime table
    # regime 0 holds clients 0 and 2 (0.9, 0.7), regime 1 clients 1 and 3 (0.2 + 0.1 i, 0.4)
    for i, row in enumerate(flat):
        if row["num-regimes"]:
            assert abs(row["r0-own"] - 80.0) < 1e-9
            assert abs(row["r1-own"] - 100 * (0.6 + 0.1 * i) / 2) < 1e-9
            assert row["r2-own"] is None  # no client of regime 2 in this fake run
        else:
            assert row["r0-own"] is None
    assert per_regime[-1] == ("| FedAvg | 2 | 50.0 ± 0.0 | 50.0 ± 0.0 | – | – | 60.0 ± 0.0 | "
                              "60.0 ± 0.0 | – | – | 80.0 ± 0.0 | 32.5 ± 3.5 | – | – |")


def test_report_reads_run_directories_given_on_the_command_line(tmp_path, capsys) -> None:
    """``--runs``: cells run with --set (a per-seed graph file) are read from their own
    summary's config, grouped by label, and averaged over seeds with the grid's rule."""
    import json

    from fedinit.scripts.personal_report import main

    runs = []
    for seed, own in ((0, 0.6), (1, 0.8)):
        run = tmp_path / f"run-s{seed}"
        rows = _fake_run(run, {0: 0, 1: 1}, {0: own, 1: own})
        rows[0]["local-own-mean"] = own
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = {"method": "fedrelax", "beta": 0.0, "graph": f"file:/g{seed}.txt",
                  "relax-warmup": 10, "seed": seed, "num-regimes": 2, "regime-kind": "rotate",
                  "partition": "iid", "dirichlet-alpha": 0.1}
        (run / "summary.json").write_text(json.dumps({"config": config}))
        runs.append(str(run))
    assert main(["--runs", *runs]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(x for x in lines if x.startswith("| FedRelax (given graph, warm-up 10) | 2 |"))
    assert row.split(" | ")[-3] == "70.0 ± 14.1"  # (c) mean of 60 and 80
    with pytest.raises(SystemExit):
        main(["--runs", str(tmp_path / "missing")])


def test_report_rows_tell_a_given_graph_from_a_learned_one() -> None:
    from fedinit.scripts.personal_report import row_label

    assert row_label({"method": "fedavg", "beta": 0.1}) == "FedInit"
    assert row_label({"method": "fedavg", "beta": 0.0, "graph": "file:/g.txt"}) == "FedAvg"
    for graph, suffix in (("file:/g.txt", " (given graph)"), ("knn", " (learned graph: knn)")):
        config = {"method": "fedrelax", "beta": 0.0, "graph": graph}
        assert row_label(config).endswith(suffix)
