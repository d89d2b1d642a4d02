"""Client-level differential privacy, DP-FedAvg style: clip each client's contribution, add
Gaussian noise to the sum, divide by a fixed denominator (docs/algorithms.md, section DP).

Every uploaded vector is its own channel: the model upload (Delta_i = w_iK - s_i, the move
from the RI start point, so RI is inside the clipped quantity) is clipped to ``dp-clip`` C,
each extra upload of the method (SCAFFOLD's Delta_c_i) to ``dp-clip-extra`` (C when 0), each
as one vector over all its arrays jointly. Noise of std z x bound goes on each channel's sum:
on the server (``central``), on each client's own clipped upload (``local``), or split over
the devices under secure aggregation (``distributed``: each adds N(0, (z x bound)^2 / t_min),
t_min = ``min-replies`` the fewest uploads a released sum holds, so the sum of any released
round carries at least the central noise while the server sees only that sum). Noise comes
from fresh OS entropy, never from the run's seed, which is public in config.json.
Pure numpy: the accountant lives in ``fedinit.methods.dp_budget``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from fedinit.methods.method import ClientUpdate
from fedinit.methods.weights import Weights

MODES: tuple[str, ...] = ("off", "central", "local", "distributed")
DEVICE_NOISE: tuple[str, ...] = ("local", "distributed")
"""The modes in which the devices add the noise (the server adds none)."""
CLIP_SIGMAS = 20.0
"""Under ``distributed`` the per-coordinate quantiser bound ``secagg-clip`` must be at least
dp-clip + CLIP_SIGMAS device noise stds: a coordinate of a clipped upload is at most C, so a
clip at c needs a device's N(0, 1) draw past 20, probability 2 Q(20) = 5.5e-89 per coordinate
(docs/algorithms.md, "Distributed DP")."""


class PrivacyKeys(Protocol):
    """The run config's DP keys (``fedinit.config.privacy.PrivacyConfig`` has them)."""

    @property
    def dp(self) -> str: ...
    @property
    def dp_clip(self) -> float: ...
    @property
    def dp_clip_extra(self) -> float: ...
    @property
    def dp_noise_multiplier(self) -> float: ...
    @property
    def dp_delta(self) -> float: ...


class MinReplies(Protocol):
    """The run config's ``min-replies`` (``fedinit.config.fleet.FleetConfig`` has it)."""

    @property
    def min_replies(self) -> int: ...


class DpSettings(Protocol):
    """What DP reads of the run config (``fedinit.config.RunConfig`` has it; fedinit/methods/
    sits below fedinit/task/, so it names the fields rather than importing the class)."""

    @property
    def privacy(self) -> PrivacyKeys: ...
    @property
    def fleet(self) -> MinReplies: ...
    @property
    def num_clients(self) -> int: ...
    @property
    def clients_per_round(self) -> int: ...


def norm(vec: Weights) -> float:
    """L2 norm of a model-shaped vector over all its arrays jointly, in float64."""
    return float(np.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in vec)))


def clip(vec: Weights, bound: float) -> Weights:
    """``vec`` scaled down to norm ``bound`` when longer (all arrays by one factor)."""
    length = norm(vec)
    if length <= bound:
        return [np.array(a, copy=True) for a in vec]
    scale = bound / length
    return [(a.astype(np.float64) * scale).astype(a.dtype) for a in vec]


def gaussian_like(vec: Weights, std: float, rng: np.random.Generator) -> Weights:
    """Independent N(0, std^2) noise per coordinate, shaped like ``vec`` (float64)."""
    return [rng.normal(0.0, std, size=a.shape) for a in vec]


def add(vec: Weights, noise: Weights) -> Weights:
    """vec + noise, in float64, returned in ``vec``'s dtypes."""
    return [(a.astype(np.float64) + n).astype(a.dtype) for a, n in zip(vec, noise, strict=True)]


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """The DP settings both halves apply (``from_config`` reads the run config)."""

    mode: str
    clip: float
    """C: the model upload's L2 bound."""
    clip_extra: float
    """The bound of each extra upload (SCAFFOLD's Delta_c_i)."""
    noise_multiplier: float
    """z: the noise std of a channel's sum is z x that channel's bound."""
    expected_clients: int
    """m: the fixed denominator (clients sampled per round), whatever number replies."""
    noise_shares: int = 1
    """t_min under ``distributed`` (``min-replies``): each device adds 1 / t_min of the
    noise's variance, so a sum of at least t_min uploads carries at least N(0, (z x bound)^2);
    1 otherwise."""

    @classmethod
    def from_config(cls, c: DpSettings) -> Mechanism:
        p = c.privacy
        return cls(mode=p.dp, clip=p.dp_clip, clip_extra=p.dp_clip_extra or p.dp_clip,
                   noise_multiplier=p.dp_noise_multiplier,
                   expected_clients=c.clients_per_round,
                   noise_shares=c.fleet.min_replies if p.dp == "distributed" else 1)

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def bound(self, key: str | None) -> float:
        """The clip bound of the model upload (``key`` None) or of extra upload ``key``."""
        return self.clip if key is None else self.clip_extra

    def device_std(self, key: str | None = None) -> float:
        """The noise std per coordinate a device adds to channel ``key``: z x bound under
        ``local``, z x bound / sqrt(t_min) under ``distributed``, 0 otherwise."""
        if self.mode not in DEVICE_NOISE:
            return 0.0
        return self.noise_multiplier * self.bound(key) / float(np.sqrt(self.noise_shares))

    # ------------------------------------------------------------ client half
    def release(self, upload: Weights, extras: Mapping[str, Weights],
                rng: np.random.Generator | None = None,
                ) -> tuple[Weights, dict[str, Weights]]:
        """What a client sends: each channel clipped and, under ``local``, noised with std
        z x its bound (``distributed``: z x bound / sqrt(t_min), its share of the sum's). A
        channel that is not finite (training diverged on this client's data) is sent as
        zeros, so that whether it diverged is released only through the mechanism, never as
        a NaN the server sees (or rejects). Unchanged when DP is off."""
        if not self.on:
            return upload, dict(extras)
        rng = rng or np.random.default_rng()
        channels: dict[str | None, Weights] = {None: upload, **extras}
        out = {}
        for key, vec in channels.items():
            if not all(np.isfinite(a).all() for a in vec):
                vec = [np.zeros_like(a) for a in vec]
            clipped = clip(vec, self.bound(key))
            if self.mode in DEVICE_NOISE:
                clipped = add(clipped, gaussian_like(clipped, self.device_std(key), rng))
            out[key] = clipped
        return out.pop(None), out  # type: ignore[return-value]

    # ------------------------------------------------------------ server half
    def replies(self, updates: Sequence[ClientUpdate],
                rng: np.random.Generator | None = None) -> list[ClientUpdate]:
        """The replies the method's rule sees. ``central``: each channel re-clipped (the
        bound holds whatever a client sent) and carrying 1/k of the noise's variance, so
        that any sum over the k replies is the clipped sum plus N(0, (z x bound)^2) per
        coordinate, as one draw on the sum would be. ``local``: as received (the clients
        clipped and noised them); ``distributed`` never reaches here (the server holds only
        the secure sum). Unchanged when DP is off or there are no replies."""
        if self.mode != "central" or not updates:
            return list(updates)
        rng = rng or np.random.default_rng()
        share = 1.0 / np.sqrt(len(updates))
        out = []
        for u in updates:
            upload = clip(u.upload, self.clip)
            upload = add(upload, gaussian_like(upload, share * self.noise_multiplier
                                               * self.clip, rng))
            extras = {}
            for key, vec in u.extras.items():
                clipped = clip(vec, self.clip_extra)
                extras[key] = add(clipped, gaussian_like(
                    clipped, share * self.noise_multiplier * self.clip_extra, rng))
            out.append(dataclasses.replace(u, upload=upload, extras=extras))
        return out

    def mean(self, vectors: Sequence[Weights], weights: Sequence[float]) -> Weights:
        """D = sum / m with m the FIXED expected clients per round (uniform weights; a
        missing or rejected reply changes the sum, never the denominator)."""
        out = [np.zeros(a.shape, dtype=np.float64) for a in vectors[0]]
        for vec in vectors:
            for acc, a in zip(out, vec, strict=True):
                acc += a.astype(np.float64)
        return [(a / self.expected_clients).astype(np.float32) for a in out]


def refusal(mode: str, ri_aggregation: str, weighting: str,
            aggregation: str) -> tuple[str, str, str] | None:
    """(key, value, allowed) of a run setting DP cannot run with, or None. A method DP cannot
    run with says so itself (``ServerRule.dp_refusal``)."""
    if mode == "off":
        return None
    if ri_aggregation == "model":
        return ("ri-aggregation", ri_aggregation,
                "update or auto with dp (under model the server averages final models, so "
                "each client's RI offset beta (w_t - w_prev_i) would be released unclipped)")
    if weighting != "uniform":
        return ("weighting", weighting,
                "uniform with dp (example counts as weights would let a client's data size "
                "scale its influence past the clip bound)")
    if aggregation != "mean":
        return ("aggregation", aggregation,
                "mean with dp (the noise is calibrated to the sum; a median or trimmed mean of "
                "the replies is not covered)")
    return None


def min_secagg_clip(clip: float, noise_multiplier: float, t_min: int) -> float:
    """The smallest per-coordinate quantiser bound c ``distributed`` accepts: C plus
    ``CLIP_SIGMAS`` device noise stds (z C / sqrt(t_min))."""
    return clip + CLIP_SIGMAS * noise_multiplier * clip / float(np.sqrt(t_min))
