"""Local and server training, the same whatever the method: rounds, sampling fraction, the
local SGD pass, the model, RI and the server's step."""

from __future__ import annotations

from dataclasses import dataclass

from fedinit.config.errors import ConfigError, bad_value
from fedinit.methods.compression import BITS, Compression, CompressionError
from fedinit.methods.registry import METHODS


@dataclass(frozen=True)
class TrainConfig:
    """``beta`` .. ``model``: how every round trains, typed (names: keys with '-' -> '_')."""

    beta: float
    ri_aggregation: str
    weighting: str
    server_lr: float
    num_server_rounds: int
    fraction_train: float
    local_epochs: int
    batch_size: int
    lr: float
    lr_decay: float
    weight_decay: float
    clip_norm: float
    model: str
    compression: str = "off"
    server_momentum: float = 0.0
    """mu of the server's momentum on its step (``fedinit.methods.async_server_opt``); 0: none."""

    def lr_at(self, server_round: int) -> float:
        """Local learning rate of round t (1-based): lr * lr_decay^(t-1)."""
        return self.lr * self.lr_decay ** (server_round - 1)


def check_beta_fraction(t: TrainConfig) -> None:
    """RI's beta and the sampled fraction, each an open or half-open interval."""
    if not -1.0 < t.beta < 1.0:
        raise bad_value("beta", t.beta, "-1 < beta < 1 (the paper uses 0.01..0.15)")
    if not 0.0 < t.fraction_train <= 1.0:
        raise bad_value("fraction-train", t.fraction_train, "0 < fraction-train <= 1")


def check_server_lr_decay(t: TrainConfig) -> None:
    """``server-lr`` (0: the method's default) and ``lr-decay``."""
    if t.server_lr < 0.0:
        raise bad_value("server-lr", t.server_lr, "a number > 0, or 0 for the method's default "
                        f"({server_lr_defaults()})")
    if not 0.0 < t.lr_decay <= 1.0:
        raise bad_value("lr-decay", t.lr_decay, "0 < lr-decay <= 1")


def check_server_momentum(t: TrainConfig, method: str) -> None:
    """``server-momentum``: -1 < mu < 1 (negative: the damping Mitliagkas et al. 2016 tune
    against the momentum asynchrony adds), and only for a method whose server rule is one
    step on one model (``fedinit.methods.async_server_opt.momentum_refusal``)."""
    if not -1.0 < t.server_momentum < 1.0:
        raise bad_value("server-momentum", t.server_momentum, "-1 < server-momentum < 1")
    if not t.server_momentum:  # the momentum's module only for a run that sets it
        return
    from fedinit.methods.async_server_opt import momentum_refusal

    why = momentum_refusal(method)
    if why is not None:
        raise bad_value("server-momentum", t.server_momentum,
                        f"0 with method={method!r} ({why})")


def check_compression(t: TrainConfig, secure_aggregation: str, secagg_bits: int,
                      secagg_bits_default: int) -> None:
    """``compression``: the codec's one line for a name it does not parse. Under SecAgg+ only
    ``qB`` (one scale for all: the field's [-secagg-clip, secagg-clip] grid at B bits is the
    codec, so the masked sum is of B-bit values); ``secagg-bits`` then is B or left at its
    default."""
    try:
        codec = Compression.parse(t.compression)
    except CompressionError as err:
        raise ConfigError(f"run config: {err}") from None
    if codec is None:
        return
    if secure_aggregation == "off":
        return
    q = codec.quantiser
    if codec.topk is not None or q is None or q.block:
        raise ConfigError(
            f"run config: compression={t.compression!r} with secure-aggregation="
            f"{secure_aggregation!r} is not allowed; allowed: off | "
            f"{' | '.join(f'q{b}' for b in BITS)} (a masked sum needs one quantisation grid "
            "for all clients: no top-k indices, no per-block scales)")
    if secagg_bits not in (q.bits, secagg_bits_default):
        raise bad_value("secagg-bits", secagg_bits,
                        f"{q.bits} (compression={t.compression!r} quantises the masked "
                        f"upload to {q.bits} bits) or its default {secagg_bits_default}")


def server_lr_defaults() -> str:
    """What ``server-lr=0`` means, from the registry: e.g. '0.1 for fedadam, 1 otherwise'."""
    own = [f"{spec.server_lr:g} for {name}" for name, spec in METHODS.items()
           if spec.server_lr != 1.0]
    return ", ".join([*own, "1 otherwise"])
