"""Client partitions of a labelled training set: Dirichlet (Hsu et al.), equal-size or iid.

All randomness comes from `np.random.default_rng(seed)`, so a partition is a pure function of
(labels, scheme, num_clients, alpha, seed) and every process computes the same one.
"""

from __future__ import annotations

import numpy as np

from fedinit.config.choices import PARTITION_NAMES

# Hsu et al. draws are retried this many times before empty clients are repaired by hand.
MAX_DIRICHLET_REDRAWS = 100


def _check_inputs(labels: np.ndarray, num_clients: int, alpha: float | None) -> np.ndarray:
    """Validate shared arguments and return the labels as a 1-D int64 array."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be a non-empty 1-D integer array, got {labels.dtype} {labels.shape}"
        )
    if num_clients < 1 or num_clients > labels.size:
        raise ValueError(
            f"num_clients must be in 1..{labels.size} (the sample count), got {num_clients}"
        )
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    return labels.astype(np.int64, copy=False)


def dirichlet_split(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Hsu et al. (2019): split each class among clients by proportions drawn from Dir(alpha).

    Every index goes to exactly one client (no replacement). Client sizes vary. Draws leaving a
    client empty are redrawn (up to MAX_DIRICHLET_REDRAWS); if that still fails, each empty
    client takes one random sample from the currently largest client, so no client is empty.
    """
    labels = _check_inputs(labels, num_clients, alpha)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    # A draw is judged by its client sizes alone (cut differences), and only the draw that
    # is kept is split into chunks: at 1000 clients most of up to 100 draws leave a client
    # empty, and splitting each one took 0.9 s, before round 1, in the server and in every
    # worker. The generator is called in the same order, so the partition is unchanged.
    draw: list[tuple[np.ndarray, np.ndarray]] = []
    for _ in range(MAX_DIRICHLET_REDRAWS):
        draw = []
        sizes = np.zeros(num_clients, dtype=np.int64)
        for cls in classes:
            members = rng.permutation(np.flatnonzero(labels == cls))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
            draw.append((members, cuts))
            sizes += np.diff(cuts, prepend=0, append=members.size)
        if bool(np.all(sizes > 0)):
            break
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for members, cuts in draw:
        for client, chunk in enumerate(np.split(members, cuts)):
            parts[client].append(chunk)
    merged = [np.concatenate(chunks) for chunks in parts]
    _fill_empty_clients(merged, rng)
    return [np.sort(part).astype(np.int64) for part in merged]


def _fill_empty_clients(parts: list[np.ndarray], rng: np.random.Generator) -> None:
    """Give each empty client one sample taken from the largest client (in place)."""
    for client, part in enumerate(parts):
        if part.size == 0:
            donor = int(np.argmax([p.size for p in parts]))
            pick = int(rng.integers(parts[donor].size))
            parts[client] = parts[donor][pick : pick + 1].copy()
            parts[donor] = np.delete(parts[donor], pick)


def dirichlet_equal_split(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """The FedInit authors' variant: equal-size clients with Dir(alpha) label priors.

    Each client gets len(labels) // num_clients samples. It draws a class prior from Dir(alpha),
    then each of its samples draws a label from that prior and takes the next unused sample of
    that class; an exhausted class pool is refilled with a fresh shuffle, so across clients
    samples are drawn with replacement (a sample may appear in several clients).
    """
    labels = _check_inputs(labels, num_clients, alpha)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == cls) for cls in classes]
    pools = [rng.permutation(m) for m in members]
    cursors = [0] * len(classes)
    size = labels.size // num_clients
    parts: list[np.ndarray] = []
    for _ in range(num_clients):
        prior = rng.dirichlet(np.full(len(classes), alpha))
        counts = rng.multinomial(size, prior / prior.sum())
        taken: list[np.ndarray] = []
        for cls_index, count in enumerate(counts):
            need = int(count)
            while need > 0:
                if cursors[cls_index] == pools[cls_index].size:
                    pools[cls_index] = rng.permutation(members[cls_index])
                    cursors[cls_index] = 0
                start = cursors[cls_index]
                step = min(need, pools[cls_index].size - start)
                taken.append(pools[cls_index][start : start + step])
                cursors[cls_index] += step
                need -= step
        parts.append(np.sort(np.concatenate(taken)).astype(np.int64))
    return parts


def iid_split(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle all indices and deal them into near-equal parts (sizes differ by at most 1)."""
    labels = _check_inputs(labels, num_clients, None)
    order = np.random.default_rng(seed).permutation(labels.size)
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_clients)]


def split(
    labels: np.ndarray, scheme: str, num_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Partition by scheme name (one of PARTITION_NAMES); alpha is ignored for "iid"."""
    if scheme == "dirichlet":
        return dirichlet_split(labels, num_clients, alpha, seed)
    if scheme == "dirichlet-equal":
        return dirichlet_equal_split(labels, num_clients, alpha, seed)
    if scheme == "iid":
        return iid_split(labels, num_clients, seed)
    raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITION_NAMES)}")


def label_skew(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> float:
    """Mean total-variation distance between each client's label distribution and the global one.

    0 means every client mirrors the global mix; 1 means disjoint supports. Empty clients are
    skipped (they have no distribution).
    """
    labels = np.asarray(labels, dtype=np.int64)
    global_dist = np.bincount(labels, minlength=num_classes) / labels.size
    distances = []
    for part in parts:
        if len(part) == 0:
            continue
        counts = np.bincount(labels[part], minlength=num_classes)
        distances.append(0.5 * float(np.abs(counts / counts.sum() - global_dist).sum()))
    return float(np.mean(distances)) if distances else 0.0
