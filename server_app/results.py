"""Everything a run leaves behind: per-round rows, a summary, plots and the final model.

Rows are appended (JSONL and CSV) and flushed as each round ends, so a crash loses at most
the round in flight; the summary, plots and model are written atomically (temp + rename).
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.methods import wire as rk
from fedinit.store.files import atomic_write, atomic_write_bytes, atomic_write_text, npz_bytes
from server_app.client_divergence import FIELDS as DIVERGENCE_FIELDS
from server_app.federated_eval import FIELDS as FEDERATED_FIELDS
from server_app.public_rows import TIMING_FIELDS as TIMING_FIELDS  # re-exported
from server_app.tracking import TensorBoardTracker, client_columns
from strategies import operator_log
from strategies.personal_summary import FIELDS as PERSONAL_FIELDS
from strategies.personal_summary import KINDS

ACCURACY_LABEL = "test accuracy (%)"
EVAL_SOURCE_LABELS = {"central": "central test set",
                      "federated": "federated: clients' local test splits"}
"""Where ``test-acc`` came from (``RunConfig.eval_source``), as the accuracy plot says it."""
DIVERGENCE_LABEL = r"divergence $\frac{1}{|S|}\sum_{i \in S} \|w_{i,K} - w_{t+1}\|^2$"
"""The paper's consistency term, as ``fedinit.methods.ri.divergence`` computes it each round: the
mean squared distance of the selected clients' final local models from the new global model."""

AGGREGATED = rk.AGGREGATED
"""Round field (``fedinit.methods.wire.AGGREGATED``), set by whoever writes the row
(server_app/experiment.py, strategies/async_loop.py); ``Recorder.aggregated_rounds`` counts it,
kept rows of a resumed run included."""
ROUND_FIELDS = ("round", "test-acc", "test-loss", rk.ROUND_TRAIN_LOSS, rk.DIVERGENCE, "lr",
                rk.NUM_REPLIES, rk.NUM_REJECTED, rk.NUM_MISSING, AGGREGATED, "state-fallbacks",
                rk.NORM_LIMIT_USED, rk.BYTES_UP, rk.BYTES_DOWN, "round-seconds", "elapsed-seconds",
                "collect-seconds", "client-seconds-max", *PERSONAL_FIELDS, *FEDERATED_FIELDS,
                *DIVERGENCE_FIELDS, "clients-trained")
DP_FIELDS = ("dp-epsilon", "dp-epsilon-add-remove", "dp-rounds-counted")
"""Round fields of a run with differential privacy (``dp`` on), at ``dp-delta`` after the
round (``fedinit.methods.dp_budget``): the replace-one epsilon of the server's fixed-size sampling
(the one ``dp-target-epsilon`` stops on), the add-or-remove-one epsilon of Poisson sampling at
q = m / N (the papers' convention, for comparison), and the mechanism's runs counted
(``server_app.privacy.Ledger``). Other runs' rows keep exactly ROUND_FIELDS."""
DP_CONVENTIONS = {
    "dp-epsilon": "replace-one (one client's data replaced, N public), m of N clients sampled "
                  "without replacement each round: what the server does",
    "dp-epsilon-add-remove": "add-or-remove-one (one client added or removed), Poisson "
                             "sampling at q = m/N: the convention papers report; this server "
                             "samples a fixed m, so it is for comparison, not its guarantee",
}
"""What each epsilon promises, as summary.json states it beside the figures."""
DP_LEFT_OUT = ("clients-trained", "local-own-clients", "divergence-untrained")
"""Round fields left out under DP: the sample is secret (amplification by sampling needs it
unknown), so no public file lists who a round sampled or who replied, nor counts how many of
the evaluated clients have trained (with one evaluated client, whether it was ever sampled).
The per-client file of personalized evaluation (PERSONAL_CLIENTS: an empty ``acc-own`` says
that client never trained) is not written either."""
PERSONAL_CLIENTS = "personal_clients.csv"
"""Per-client accuracies of the last personalized evaluation."""
CLIENT_FIELDS = ("round", "partition-id", "num-test",
                 *(f"acc-{kind}" for kind in KINDS))
KIND_LABELS = {"global": "(a) global model", "finetuned": "(b) global, fine-tuned",
               "own": "(c) own model (w_prev / Ditto's v)"}


def was_aggregated(row: dict[str, Any]) -> bool:
    """The row's AGGREGATED flag; a row written before the flag existed (kept from an older
    checkpoint) counts when it reports a train loss or a divergence, which only aggregated
    sync rounds do (such an old secure row reports neither and does not count)."""
    flag = row.get(AGGREGATED)
    if isinstance(flag, bool):
        return flag
    return row.get(rk.ROUND_TRAIN_LOSS) is not None or row.get(rk.DIVERGENCE) is not None


def smoothed_peak(accs: Sequence[float], window: int = 5, last: int = 50) -> float:
    """The paper's metric: max over the last ``last`` rounds of the moving-average curve."""
    a = np.asarray(accs, dtype=np.float64)
    if len(a) == 0:
        return float("nan")
    w = min(window, len(a))
    smooth = np.convolve(a, np.ones(w) / w, mode="valid")
    return float(smooth[-last:].max())


class Recorder:
    """Writes one run's results into its own directory."""

    def __init__(self, out_dir: Path, config: dict[str, Any], keep_rounds: int = 0,
                 rows: list[dict[str, Any]] | None = None,
                 eval_source: str = "central", extra_fields: tuple[str, ...] = (),
                 left_out: tuple[str, ...] = (), tracking: str = "off",
                 withheld: frozenset[str] = frozenset(), private_log: bool = False) -> None:
        """Start a run's files; when resuming, keep the rows of rounds 1..``keep_rounds``.

        The kept rows are ``rows`` (the copy stored in the checkpoint) when given, else what
        can be read back from rounds.jsonl. Rows beyond the checkpoint (a round that finished
        but was not checkpointed) are dropped, so the files hold each round exactly once.
        ``withheld`` fields (``server_app.public_rows``) stay in ``rows``, the checkpoint's
        copy, and out of every public file. ``private_log`` (DP): the lines that say who was
        sampled go to the run's operator.log until ``finish`` (``strategies.operator_log``).
        """
        self.fields = (*(f for f in ROUND_FIELDS if f not in left_out), *extra_fields)
        """The row's columns: ROUND_FIELDS but ``left_out`` (DP_LEFT_OUT under DP), then
        e.g. DP_FIELDS."""
        self.public = tuple(f for f in self.fields if f not in withheld)
        """The columns of the public files: ``fields`` but the ``withheld`` ones."""
        self.dir = out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        if private_log:
            operator_log.attach(self.dir)
        self.config = config
        self.eval_source = eval_source
        kept = rows if rows is not None else self._earlier_rows(keep_rounds)
        self.rows = [{k: r.get(k) for k in self.fields} for r in kept
                     if 0 < r.get("round", 0) <= keep_rounds]
        self.t0 = time.monotonic() - ((self.rows[-1]["elapsed-seconds"] or 0.0)
                                      if self.rows else 0.0)
        lines = "".join(json.dumps(r) + "\n" for r in self.public_rows())
        atomic_write_text(self.dir / "rounds.jsonl", lines)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.public)
        writer.writeheader()
        writer.writerows(self.public_rows())
        atomic_write_text(self.dir / "rounds.csv", text.getvalue())
        self._jsonl = (self.dir / "rounds.jsonl").open("a")
        self._csv_file = (self.dir / "rounds.csv").open("a", newline="")
        self._csv = csv.DictWriter(self._csv_file, fieldnames=self.public)
        atomic_write_text(self.dir / "config.json", json.dumps(config, indent=2, sort_keys=True))
        self.tracker = (TensorBoardTracker(self.dir, config, first_round=keep_rounds + 1,
                                           hide_times="round-seconds" in withheld)
                        if tracking == "tensorboard" else None)
        """TensorBoard event files (``tracking``), written with each row."""

    def _earlier_rows(self, keep_rounds: int) -> list[dict[str, Any]]:
        """Rows read back from rounds.jsonl (checkpoints without stored rows): a torn or
        garbled line anywhere is skipped, the last row of a round wins, sorted by round."""
        path = self.dir / "rounds.jsonl"
        if keep_rounds <= 0 or not path.exists():
            return []
        by_round: dict[int, dict[str, Any]] = {}
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("round"), int):
                by_round[row["round"]] = row
        return [by_round[r] for r in sorted(by_round)]

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def public_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row as the public files carry it: the ``public`` columns."""
        return {k: row.get(k) for k in self.public}

    def public_rows(self) -> list[dict[str, Any]]:
        return [self.public_row(r) for r in self.rows]

    def add_round(self, row: dict[str, Any]) -> None:
        """Append one round's row to both files and flush them to disk."""
        full = {k: row.get(k) for k in self.fields}
        self.rows.append(full)
        public = self.public_row(full)
        self._jsonl.write(json.dumps(public) + "\n")
        self._csv.writerow(public)
        for f in (self._jsonl, self._csv_file):
            f.flush()
            os.fsync(f.fileno())
        if self.tracker is not None:
            self.tracker.add_round(public)

    def write_personal_clients(self, rows: list[dict[str, Any]]) -> None:
        """Replace the per-client file with the latest personalized evaluation's rows."""
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=CLIENT_FIELDS)
        writer.writeheader()
        writer.writerows({k: r.get(k) for k in CLIENT_FIELDS} for r in rows)
        atomic_write_text(self.dir / PERSONAL_CLIENTS, text.getvalue())
        if self.tracker is not None and rows:
            self.tracker.add_clients(int(rows[0]["round"]),
                                     client_columns(rows, CLIENT_FIELDS[3:]))

    def aggregated_rounds(self) -> int:
        """Rows whose round aggregated replies (``was_aggregated``), the rows a resumed run
        kept included: the one count the run's NothingTrained check reads."""
        return sum(1 for r in self.rows if was_aggregated(r))

    def accuracies(self) -> list[float]:
        """The public rows' test accuracies (none where ``test-acc`` is withheld)."""
        return [r["test-acc"] for r in self.public_rows() if r.get("test-acc") is not None]

    def finish(self, final_weights: list[np.ndarray], extra: dict[str, Any]) -> dict[str, Any]:
        """Write summary.json, the plots and the final model; return the summary (public:
        a withheld column gives no total either)."""
        accs = self.accuracies()
        public = self.public_rows()
        summary = {
            "config": self.config,
            "rounds": len(self.rows),
            "final-test-acc": accs[-1] if accs else None,
            "best-test-acc": max(accs) if accs else None,
            "smoothed-peak-acc": smoothed_peak(accs) if accs else None,
            "wall-seconds": self.elapsed(),
            **({"state-fallbacks": sum(r.get("state-fallbacks") or 0 for r in public)}
               if "state-fallbacks" in self.public else {}),
            **({"mean-round-seconds": float(np.mean([r["round-seconds"] for r in public]))
                if public else None} if "round-seconds" in self.public else {}),
            **extra,
        }
        atomic_write_text(self.dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True))
        atomic_write_bytes(self.dir / "final_model.npz",  # arr_0, arr_1, ... as np.savez names
                           npz_bytes({f"arr_{i}": w for i, w in enumerate(final_weights)}))
        self.plot()
        self._jsonl.close()
        self._csv_file.close()
        if self.tracker is not None:
            self.tracker.close()
        operator_log.detach()
        return summary

    def plot(self) -> None:
        """accuracy.png and divergence.png against rounds."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.public_rows()
        rounds = [r["round"] for r in rows]
        title = method_label(self.config)
        for key, fname, label, scale in (
                ("test-acc", "accuracy.png",
                 f"{ACCURACY_LABEL}, {EVAL_SOURCE_LABELS[self.eval_source]}", 100.0),
                ("divergence", "divergence.png", DIVERGENCE_LABEL, 1.0)):
            pts = [(x, scale * r[key]) for x, r in zip(rounds, rows, strict=True)
                   if r.get(key) is not None]
            fig, ax = plt.subplots(figsize=(6, 4))
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="." if len(pts) < 60 else None)
            ax.set_xlabel("round")
            ax.set_ylabel(label)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            if key == "divergence":
                ax.set_yscale("log")
            fig.tight_layout()
            atomic_write(self.dir / fname, lambda f, fig=fig: fig.savefig(f, format="png", dpi=100))
            plt.close(fig)
        if any(r.get("local-global-mean") is not None for r in rows):
            self.plot_personal(plt, title, rows)

    def plot_personal(self, plt: Any, title: str, rows: list[dict[str, Any]]) -> None:
        """personal.png: the three mean local accuracies against rounds; personal_cdf.png:
        the distribution of per-client accuracy at the last personalized evaluation."""
        fig, ax = plt.subplots(figsize=(6, 4))
        for kind, label in KIND_LABELS.items():
            pts = [(r["round"], 100 * r[f"local-{kind}-mean"]) for r in rows
                   if r.get(f"local-{kind}-mean") is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=label)
        ax.set_xlabel("round")
        ax.set_ylabel("mean accuracy on the clients' local tests (%)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        atomic_write(self.dir / "personal.png", lambda f: fig.savefig(f, format="png", dpi=100))
        plt.close(fig)
        clients = read_personal_clients(self.dir)
        if not clients:  # not written (DP): no per-client distribution to draw
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        for kind, label in KIND_LABELS.items():
            accs = np.sort([100 * float(r[f"acc-{kind}"]) for r in clients
                            if r.get(f"acc-{kind}") not in (None, "")])
            if accs.size:
                ax.step(np.concatenate([accs[:1], accs]),
                        np.arange(accs.size + 1) / accs.size, where="post",
                        label=f"{label} ({accs.size} clients)")
        rnd = clients[0]["round"] if clients else "-"
        ax.set_xlabel(f"accuracy on the client's local test (%), round {rnd}")
        ax.set_ylabel("fraction of clients at or below")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
        fig.tight_layout()
        atomic_write(self.dir / "personal_cdf.png",
                     lambda f: fig.savefig(f, format="png", dpi=100))
        plt.close(fig)


def read_personal_clients(run_dir: Path) -> list[dict[str, str]]:
    """The per-client rows of a run's last personalized evaluation ([] without one)."""
    path = run_dir / PERSONAL_CLIENTS
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def method_label(config: dict[str, Any]) -> str:
    """'FedInit (beta=0.1), fashion-mnist Dir(0.1)' style title for plots and tables."""
    method, beta = str(config.get("method")), config.get("beta", 0.0)
    if method == "fedavg":
        name = f"FedInit (beta={beta:g})" if beta else "FedAvg"
    else:
        name = f"{method}+RI (beta={beta:g})" if beta else method
    return f"{name}, {config.get('dataset')} Dir({config.get('dirichlet-alpha')})"

