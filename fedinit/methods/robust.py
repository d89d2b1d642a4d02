"""How the round's uploads are combined: weighted mean, a coordinate-wise robust statistic, or
a Byzantine-resilient selection of whole replies (Krum, Multi-Krum, Bulyan).

Two steps. ``select`` picks the replies that take part (all of them, except under Krum,
Multi-Krum and Bulyan), so a reply's move is in or out as a whole (``unaccounted`` may then
keep a selected reply's extra uploads out, below). ``combine`` then folds one vector per
selected reply into one: the SAME rule for the model upload and for every extra upload
(``RoundInput.combine``).

Channels. A reply uploads one or more model-shaped vectors (channels): its model move and a
method's extra uploads, e.g. SCAFFOLD's Delta_c_i. Each channel is judged on its own scale, so
that no channel can steer the judgement of another:

- ``median``, ``trimmed-mean``: coordinate by coordinate, ignoring the example weights (a
  client cannot buy influence by claiming more examples): each coordinate, hence each channel,
  is combined on its own. The trimmed mean is Flower's (``fedtrimmedavg.trim_mean``:
  floor(trim * n) values cut at each end, as scipy's).
- ``krum``, ``multi-krum``, ``bulyan``: the replies are selected on the MODEL MOVE alone, by
  Flower's ``select_multikrum`` (Blanchard et al. 2017: Krum's score is the sum of a reply's
  squared L2 distances to its n - f - 2 nearest others; Krum keeps the lowest score,
  Multi-Krum the n - f lowest, Bulyan theta = n - 2f lowest), so nothing a reply sends in
  another upload can promote it or change the model step: a stalling or flipped move is kept
  exactly as often as on the move alone. An extra upload (SCAFFOLD's Delta_c_i) can only be
  screened out: where a selected reply's Krum score in that upload alone is above ``SCREEN``
  x the upload's median score over the round's replies (scale-free), its move still counts
  but its extra uploads are not summed and its state is not accounted (``unaccounted``: its
  client's c_i rolls back, so c stays the mean of the c_i). Under Krum a screened pick thus
  moves the model and leaves c as it was; no other reply is promoted. Combine (the moves,
  and the extra uploads of the accounted replies): Krum the one vector; Multi-Krum the
  UNWEIGHTED mean (the claimed example counts get no say); Bulyan (El Mhamdi et al. 2018, as
  Flower 1.39) per coordinate the mean of the beta = m - 2f values closest to the
  coordinate-wise median of the m combined (``bulyan.aggregate_n_closest_weights``),
  unweighted; a Bulyan round whose screen leaves fewer than 2f + 1 accounted sums no extra
  upload.

n is the number of usable replies and f ``byzantine-f``; Krum and Multi-Krum need n > 2f + 2,
Bulyan n >= 4f + 3 (``robust_choices.min_replies``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from fedinit.methods.ri import weighted_mean
from fedinit.methods.robust_choices import SELECTIONS, min_replies
from fedinit.methods.weights import Weights

SCREEN = 10.0
"""An extra upload whose Krum score is above SCREEN x its round median score is screened out
(``unaccounted``; docs/algorithms.md says how the figure was chosen)."""


def coordinate_median(vectors: Sequence[Weights]) -> Weights:
    """Coordinate-wise median of model-shaped vectors."""
    return [np.median(np.stack([v[i] for v in vectors]), axis=0).astype(np.float32)
            for i in range(len(vectors[0]))]


def trimmed_mean(vectors: Sequence[Weights], trim: float) -> Weights:
    """Coordinate-wise mean after dropping floor(trim * n) values at each end."""
    return [np.asarray(trim_mean(np.stack([v[i].astype(np.float64) for v in vectors]), trim))
            .astype(np.float32) for i in range(len(vectors[0]))]


def upload_channels(joint: Sequence[Weights]) -> int:
    """How many model-shaped uploads a reply's joint vector holds: the largest c such that
    its array shapes are c repeats of one list. The server builds the joint vector as the
    model move followed by each extra upload, each checked to have the model's shapes, so
    this is exact whenever the model's first array shape occurs once in the model (every
    model of ``fedinit/task/models.py``: its first layer is the only one fed the input)."""
    shapes = [np.shape(a) for a in joint[0]]
    total = len(shapes)
    for c in range(total, 1, -1):
        if total % c == 0 and shapes == shapes[:total // c] * c:
            return c
    return 1


def squared_distances(vectors: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """n x n squared L2 distances between vectors of equal-shaped arrays, summed array by
    array from exact differences in float64 (never an n x d copy of the whole model)."""
    n = len(vectors)
    out = np.zeros((n, n))
    for k in range(len(vectors[0])):
        x = np.stack([np.asarray(v[k], np.float64).ravel() for v in vectors])
        for i in range(n):
            out[i] += np.sum((x - x[i]) ** 2, axis=1)
    return out


def krum_scores(dist: np.ndarray, f: int) -> np.ndarray:
    """Krum's score of each of n points, from their n x n squared distances: the sum of the
    distances to its max(1, n - f - 2) nearest others (Flower's ``select_multikrum``)."""
    n = len(dist)
    closest = max(1, n - f - 2)
    return np.asarray([np.sort(np.delete(dist[i], i))[:closest].sum() for i in range(n)])


def channel_scores(joint: Sequence[Weights], channels: int, f: int) -> np.ndarray:
    """n x channels: each reply's Krum score in each channel alone over the channel's median
    score (its mean where the median is 0; all 0 where every reply agrees in it), so a
    typical reply scores about 1 in every channel whatever the channel's scale."""
    per = len(joint[0]) // channels
    out = np.empty((len(joint), channels))
    for ch in range(channels):
        s = krum_scores(squared_distances([v[ch * per:(ch + 1) * per] for v in joint]), f)
        scale = float(np.median(s)) or float(np.mean(s)) or 1.0
        out[:, ch] = s / scale
    return out


def move_select(moves: Sequence[Weights], kind: str, f: int) -> list[int]:
    """What Krum, Multi-Krum or Bulyan keeps judging one vector per reply (the model move):
    Flower's ``select_multikrum``, best first."""
    n = len(moves)
    keep = {"krum": 1, "multi-krum": n - f, "bulyan": n - 2 * f}[kind]
    contents = [RecordDict({"joint": ArrayRecord([np.asarray(a, np.float64) for a in v])})
                for v in moves]
    chosen = select_multikrum(contents, num_malicious_nodes=f, num_nodes_to_select=keep)
    return [next(i for i, c in enumerate(contents) if c is s) for s in chosen]


def screened(extras: Sequence[Weights], channels: int, f: int) -> set[int]:
    """The replies whose extra uploads are screened out: Krum score above ``SCREEN`` x the
    median score in any of the ``channels`` extra uploads (``channel_scores``)."""
    if channels < 1:
        return set()
    worst = channel_scores(extras, channels, f).max(axis=1)
    return {int(i) for i in np.flatnonzero(worst > SCREEN)}


def select(joint: Sequence[Weights], kind: str, f: int,
           channels: int | None = None) -> list[int] | None:
    """Indices (ascending) of the replies that take part, given each reply's joint vector
    (all its uploads, as the server sees them, split into ``channels`` equal-shaped uploads,
    the model move first; None: ``upload_channels``); None when there are too few replies
    for ``kind`` with ``f`` attackers. Only the move decides (module docstring); equal
    scores: the lower index first."""
    n = len(joint)
    if kind not in SELECTIONS:
        return list(range(n))
    if n < min_replies(kind, f):
        return None
    per = len(joint[0]) // _channels(joint, channels)
    return sorted(move_select([v[:per] for v in joint], kind, f))


def unaccounted(joint: Sequence[Weights], chosen: Sequence[int], kind: str, f: int,
                channels: int | None = None) -> list[int]:
    """The chosen replies whose extra uploads do not count (ascending): those ``screened``,
    or every chosen one under Bulyan when fewer than 2f + 1 would be left (its combine of
    the rest needs beta = m - 2f >= 1). Their moves still count; the server neither sums
    their extra uploads nor accounts their state (module docstring)."""
    if kind not in SELECTIONS:
        return []
    nch = _channels(joint, channels)
    per = len(joint[0]) // nch
    out = sorted(set(chosen) & screened([v[per:] for v in joint], nch - 1, f))
    if kind == "bulyan" and out and len(chosen) - len(out) < 2 * f + 1:
        return sorted(chosen)
    return out


def _channels(joint: Sequence[Weights], channels: int | None) -> int:
    """The channel count given or read (``upload_channels``), checked to divide the arrays."""
    nch = upload_channels(joint) if channels is None else channels
    arrays = len(joint[0])
    if nch < 1 or arrays % nch:
        raise ValueError(f"channels={nch} is not allowed; allowed: a divisor of the {arrays} "
                         "arrays of a joint vector")
    return nch


def combine(vectors: Sequence[Weights], weights: Sequence[float], kind: str,
            trim: float, f: int = 0) -> Weights:
    """The configured combination (``aggregation`` key) of one vector per selected reply;
    ``weights`` count under ``mean`` only."""
    if kind == "median":
        return coordinate_median(vectors)
    if kind == "trimmed-mean":
        return trimmed_mean(vectors, trim)
    if kind == "krum":
        if len(vectors) != 1:
            raise ValueError(f"krum combines the one selected reply, got {len(vectors)}")
        return [np.asarray(a, np.float32) for a in vectors[0]]
    if kind == "bulyan":
        beta = len(vectors) - 2 * f
        ref = [np.median(np.stack([v[i] for v in vectors]), axis=0)
               for i in range(len(vectors[0]))]
        return [np.asarray(a, np.float32) for a in aggregate_n_closest_weights(
            ref, [list(v) for v in vectors], beta)]
    if kind == "multi-krum":
        return weighted_mean(vectors, [1.0] * len(vectors))
    return weighted_mean(vectors, weights)
