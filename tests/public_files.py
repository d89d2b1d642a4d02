"""What a reader of a DP run's public files sees once the released model's figures and the
clock are taken out: two runs whose secret samples differ must look the same (issue 42).

Every file of the run directory is put in one class, so a new public file fails the
comparison until it is classified:
- compared: rounds.jsonl, rounds.csv, summary.json, status.json, config.json,
  privacy_ledger.json and the TensorBoard scalars, each without ``MODEL_FIGURES`` (the
  released model's accuracy and loss: they differ, as the noise does, and are covered) and
  without wall-clock fields (``TIMES``: when the run started, when a file was written, how
  long it ran in all);
- the released model: final_model.npz, model.pt, the plots (accuracy.png draws it);
- operator-secret: checkpoint.npz, client-state/, operator.log (docs/faults.md's field
  table).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedinit.methods.sampling import sample_clients
from server_app.tracking import EVENTS_DIR

MODEL_FIGURES = frozenset({"test-acc", "test-loss", "final-test-acc", "best-test-acc",
                           "smoothed-peak-acc"})
"""Row and summary fields of the released model (covered; they differ with the noise)."""
TIMES = frozenset({"wall-seconds", "started", "written", "identity-seen", "waiting-seconds"})
"""Wall-clock fields of summary.json and status.json: the run's start and total, when the
file was written, when a node answered its identity query (the fleet, not the sample)."""
PATHS = frozenset({"results-dir", "name", "output-dir", "node-registry"})
"""The run directory's path and name (it holds the start time), and the run config's paths
of the operator's machine (two deployments have two work directories)."""
COMPARED = ("rounds.jsonl", "rounds.csv", "summary.json", "status.json", "config.json",
            "privacy_ledger.json")
MODEL_FILES = ("final_model.npz", "model.pt")
PRIVATE = ("checkpoint.npz", "client-state", "operator.log")


def _drop(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with ``keys`` removed from every dict in it, at any depth."""
    if isinstance(value, dict):
        return {k: _drop(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_drop(v, keys) for v in value]
    return value


def _scalars(run_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], set[float]]:
    """TensorBoard's scalars by tag (the released model's ``eval/`` tags left out) and the
    wall times their events carry."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / EVENTS_DIR), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    walls = {e.wall_time for tag in tags for e in events.Scalars(tag)}
    return ({tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in sorted(tags)
             if not tag.startswith("eval/")}, walls)


def _kind(rel: Path) -> str:
    top = rel.parts[0]
    if top in COMPARED:
        return "compared"
    if top == EVENTS_DIR:
        return "events"
    if top in MODEL_FILES or rel.suffix == ".png":
        return "model"
    if top in PRIVATE:
        return "private"
    raise AssertionError(f"{rel}: a file no class of tests/public_files.py names: is it "
                         "public, and what may it say about the sample?")


def public_view(run_dir: Path) -> dict[str, Any]:
    """The comparable content of ``run_dir``'s public files (module docstring)."""
    kinds = {_kind(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}
    assert "compared" in kinds
    hidden = MODEL_FIGURES | TIMES | PATHS
    view: dict[str, Any] = {"kinds": sorted(kinds)}
    for name in COMPARED:
        path = run_dir / name
        if not path.exists():
            view[name] = None
        elif name == "rounds.jsonl":
            view[name] = [_drop(json.loads(x), hidden) for x in path.read_text().splitlines()]
        elif name == "rounds.csv":
            with path.open(newline="") as f:
                view[name] = [_drop(dict(r), hidden) for r in csv.DictReader(f)]
        else:
            view[name] = _drop(json.loads(path.read_text()), hidden)
    if view["status.json"] is not None:
        view["status.json"] = _by_client(view["status.json"])
    if (run_dir / EVENTS_DIR).exists():
        scalars, walls = _scalars(run_dir)
        view["tensorboard"] = scalars
        view["tensorboard wall times"] = len(walls)
    return view


def _by_client(status: dict[str, Any]) -> dict[str, Any]:
    """status.json with each node named by the client it is registered for: node ids are
    the SuperLink's, new in every deployment."""
    fleet = dict(status.get("fleet") or {})
    nodes = [{**n, "node": None} for n in fleet.get("nodes") or []]
    fleet["nodes"] = sorted(nodes, key=lambda n: (str(n.get("registered-client")),
                                                  str(n.get("client"))))
    return {**status, "fleet": fleet}


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Where two views differ, one line each (empty: the same)."""
    return [f"{key}: {a.get(key)!r:.600} != {b.get(key)!r:.600}"
            for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def seeds_with_different_samples(num_clients: int, per_round: int, online: Sequence[int],
                                 rounds: int, differ: Callable[[list[int], list[int]], bool],
                                 ) -> tuple[int, int]:
    """Two sampling seeds whose per-round counts of sampled online clients satisfy
    ``differ`` (each run with some round that samples an online client, so it trains)."""
    def counts(seed: int) -> list[int]:
        return [len(set(sample_clients(seed, r, num_clients, per_round)) & set(online))
                for r in range(1, rounds + 1)]

    found = [s for s in range(1, 2000) if any(counts(s))]
    for a in found:
        for b in found:
            if differ(counts(a), counts(b)):
                return a, b
    raise AssertionError("no two seeds differ as asked")


def online_counts(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Replies per round, from the operator-secret checkpoint's rows (the oracle)."""
    return [int(r["num-replies"] or 0) for r in rows]
