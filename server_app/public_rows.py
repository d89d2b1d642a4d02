"""Which round-row fields the public files carry under DP: the one table.

Under ``dp`` != off the rows the server computes keep every field in the operator-secret
checkpoint, but the public outputs (``rounds.jsonl``/``rounds.csv``, TensorBoard, summary.json,
the plots, the per-round INFO line) leave out the ``withheld`` ones, because epsilon covers
only what the mechanism released (docs/faults.md, "What each DP mode shows, and to whom").
``CLIENT_FIGURES`` are exact functions of the clients' data (means of their clear train and
evaluation metrics, distances of their final models): in a round with one reply each is one
client's exact figure, noiseless and unaccounted, so it is written only when the operator
accepts that with ``dp-release-client-metrics=true``. With ``evaluation=federated`` the
round's ``test-acc`` and ``test-loss`` are such means too.

``SAMPLE_FIGURES`` count or time the round's replies: how many of the sampled clients
answered, were rejected or missing, how many bytes they uploaded (``bytes-up``, a multiple
of the replies) and were sent (``bytes-down``, the model times the messaged clients: under
DP the sampled that were connected), whether the round aggregated, how long it took (a round
whose sampled clients are all offline sends nothing and ends at once; with ``device-speeds``
a round's simulated time is its slowest sampled client's, whose speed the public seed
gives). With the connected clients known, each says how many of them the secret sample held,
which amplification by sampling assumes no reader of the public files learns: never public
while the sample is secret (synchronous DP). ``rounds=async`` DP claims no amplification
(q = 1), so its rows keep them.
"""

from __future__ import annotations

from fedinit.methods import wire as rk
from server_app.client_divergence import FIELDS as DIVERGENCE_FIELDS
from server_app.federated_eval import FIELDS as FEDERATED_FIELDS
from strategies.personal_summary import FIELDS as PERSONAL_FIELDS
from strategies.virtual_clock import CLOCK_FIELDS

RELEASE_KEY = "dp-release-client-metrics"
"""The run-config key with which an operator writes CLIENT_FIGURES under DP anyway."""
TIMING_FIELDS = frozenset({"round-seconds", "elapsed-seconds", "collect-seconds",
                           "client-seconds-max", "local-eval-seconds", "fed-eval-seconds",
                           "divergence-seconds"})
"""Round fields measured in wall time: they differ between two runs of the same config."""
SAMPLE_FIGURES = frozenset({rk.NUM_REPLIES, rk.NUM_REJECTED, rk.NUM_MISSING, rk.BYTES_UP,
                            rk.BYTES_DOWN,
                            "aggregated",
                            "state-fallbacks", "divergence-sample", "divergence-trained",
                            *TIMING_FIELDS, *CLOCK_FIELDS})
"""Fields that count or time the round's replies: withheld while the sample is secret."""
CLIENT_FIGURES = frozenset({rk.ROUND_TRAIN_LOSS, rk.DIVERGENCE, rk.NORM_LIMIT_USED,
                            *PERSONAL_FIELDS, *FEDERATED_FIELDS, *DIVERGENCE_FIELDS}
                           - SAMPLE_FIGURES)
"""Exact figures of the clients' data: withheld under DP unless RELEASE_KEY is true."""
FEDERATED_EVAL = frozenset({"test-acc", "test-loss"})
"""With ``evaluation=federated`` these are the clients' example-weighted means too."""


def withheld(dp: str, *, secret_sample: bool, release_client_metrics: bool,
             eval_source: str) -> frozenset[str]:
    """The round fields kept out of the public files of a run (empty with ``dp`` off);
    ``secret_sample``: the accountant assumes nobody public learns who was sampled."""
    if dp == "off":
        return frozenset()
    out = set(SAMPLE_FIGURES) if secret_sample else set()
    if not release_client_metrics:
        out |= CLIENT_FIGURES | (FEDERATED_EVAL if eval_source == "federated" else set())
    return frozenset(out)

