"""Privacy: client-level differential privacy (``dp*``) and secure aggregation (SecAgg+)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedinit.config.choices import SECAGG_MAX_BITS
from fedinit.config.errors import ConfigError, bad_value, did_you_mean
from fedinit.methods.dp import MODES as DP_MODES


@dataclass(frozen=True)
class PrivacyConfig:
    """``dp`` .. ``secagg-bits``, typed (names: keys with '-' -> '_')."""

    dp: str
    dp_clip: float
    dp_clip_extra: float
    dp_noise_multiplier: float
    dp_delta: float
    dp_target_epsilon: float
    dp_release_client_metrics: bool
    secure_aggregation: str
    secagg_num_shares: int
    secagg_threshold: int
    secagg_clip: float
    secagg_bits: int


def check_dp_keys(p: PrivacyConfig) -> None:
    """DP's own keys (checked whichever ``dp``), then the bounds that hold with DP on."""
    if p.dp not in DP_MODES:
        raise ConfigError(f"run config: dp={p.dp!r} is not allowed{did_you_mean(p.dp, DP_MODES)}"
                          f"; allowed: {' | '.join(DP_MODES)}")
    for key, value in (("dp-clip", p.dp_clip), ("dp-clip-extra", p.dp_clip_extra),
                       ("dp-noise-multiplier", p.dp_noise_multiplier),
                       ("dp-target-epsilon", p.dp_target_epsilon)):
        if value < 0.0:
            raise bad_value(key, value, "a number >= 0")
    if not 0.0 < p.dp_delta < 1.0:
        raise bad_value("dp-delta", p.dp_delta,
                        "0 < dp-delta < 1 (typically below 1 / num-clients)")
    if p.dp == "off":
        return
    for key, value in (("dp-clip", p.dp_clip), ("dp-noise-multiplier", p.dp_noise_multiplier)):
        if value == 0.0:
            raise bad_value(key, value, f"a number > 0 with dp={p.dp!r}")


def check_distributed_needs_secagg(p: PrivacyConfig) -> None:
    """``dp=distributed`` noises each upload too little to be seen outside a secure sum."""
    if p.dp == "distributed" and p.secure_aggregation == "off":
        raise bad_value("dp", p.dp, "off | central | local with secure-aggregation='off' "
                        "(distributed: each upload carries only 1/min-replies of the noise's "
                        "variance, safe only inside the secure sum; set "
                        "secure-aggregation='secagg+')")


def check_secagg_keys(p: PrivacyConfig) -> None:
    """SecAgg+'s keys, checked whichever ``secure-aggregation``."""
    k, t = p.secagg_num_shares, p.secagg_threshold
    if k < 3 or k % 2 == 0:
        raise bad_value("secagg-num-shares", k, "an odd integer >= 3 (the client plus (k-1)/2 "
                        "ring neighbours on each side)")
    if not k // 2 < t <= k:
        raise bad_value("secagg-threshold", t, f"{k // 2 + 1}..{k} (more than half of "
                        f"secagg-num-shares={k}, so no server can rebuild both secrets of a "
                        f"client)")
    if not (math.isfinite(p.secagg_clip) and p.secagg_clip > 0.0):
        raise bad_value("secagg-clip", p.secagg_clip, "a finite number > 0 (the "
                        "per-coordinate bound of each upload)")
    if not 1 <= p.secagg_bits <= SECAGG_MAX_BITS:
        raise bad_value("secagg-bits", p.secagg_bits, f"1..{SECAGG_MAX_BITS}")
