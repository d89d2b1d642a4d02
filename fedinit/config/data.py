"""The data: which data set, where, how it is split among clients and perturbed, and the
schema a ``dataset=device`` node's own data must meet."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedinit.config.choices import MAX_ROTATIONS
from fedinit.config.errors import bad_value
from fedinit.data_sets import (
    DEVICE,
    Schema,
    default_data_dir,
    spec_of,
    split_floats,
    split_names,
)

if TYPE_CHECKING:
    from fedinit.config.run_config import RunConfig


@dataclass(frozen=True)
class DataConfig:
    """``dataset`` .. ``local-test-fraction``, typed (names: keys with '-' -> '_')."""

    dataset: str
    data_dir: str
    device_classes: str
    device_image_size: int
    device_channels: int
    device_mean: str
    device_std: str
    partition: str
    dirichlet_alpha: float
    num_regimes: int
    regime_kind: str
    channel_noise: float
    brightness_noise: float
    train_limit: int
    local_test_fraction: float

    @property
    def resolved_data_dir(self) -> str:
        """The data location: the configured one or the dataset's first default that holds it."""
        return self.data_dir or str(default_data_dir(self.dataset))

    @property
    def on_devices(self) -> bool:
        """Whether every node brings its own data (``dataset=device``): no central copy."""
        return self.dataset == DEVICE


def check_device_schema(d: DataConfig) -> None:
    """The schema every device must meet (``dataset=device`` only)."""
    names = split_names(d.device_classes)
    if len(names) < 2 or any(not n or "/" in n or n.startswith(".") for n in names):
        raise bad_value("device-classes", d.device_classes,
                        "at least 2 comma-separated class names (folder names: no '/', no "
                        "leading '.') when dataset='device'")
    if len(set(names)) != len(names):
        raise bad_value("device-classes", d.device_classes, "class names that are all different")
    if d.device_channels not in (1, 3):
        raise bad_value("device-channels", d.device_channels, "1 (grayscale) or 3 (RGB)")
    if d.device_image_size < 1:
        raise bad_value("device-image-size", d.device_image_size, "an integer >= 1")
    for key, text, low in (("device-mean", d.device_mean, -math.inf),
                           ("device-std", d.device_std, 0.0)):
        try:
            values = split_floats(text)
        except ValueError:
            values = ()
        if (len(values) != d.device_channels
                or not all(math.isfinite(v) and v > low for v in values)):
            raise bad_value(key, text, f"{d.device_channels} comma-separated finite number(s) "
                            f"(one per device-channels){', each > 0' if low == 0.0 else ''}")


def check_local_test_fraction(d: DataConfig) -> None:
    """The local test split's share: 0 (off) up to, not including, 1."""
    if not 0.0 <= d.local_test_fraction < 1.0:
        raise bad_value("local-test-fraction", d.local_test_fraction,
                        "0 <= local-test-fraction < 1 (0 turns the local test split off)")


def check_regimes(d: DataConfig, num_clients: int | None) -> None:
    """``num-regimes``: 0 (off) or 1..num-clients; rotations by 90 degrees give at most 4
    (None: the client count is not known yet, that bound waits for it)."""
    if not 0 <= d.num_regimes <= (d.num_regimes if num_clients is None else num_clients):
        raise bad_value("num-regimes", d.num_regimes,
                        f"0 (off) to num-clients={num_clients} regimes")
    if d.regime_kind == "rotate" and d.num_regimes > MAX_ROTATIONS:
        raise bad_value("num-regimes", d.num_regimes, f"0 (off) to {MAX_ROTATIONS} with "
                        "regime-kind='rotate' (0/90/180/270 degrees)")


def device_schema(cfg: RunConfig) -> Schema:
    """The schema the run config declares for device data (checked by the config)."""
    names = split_names(cfg.data.device_classes)
    return Schema(num_classes=len(names), in_channels=cfg.data.device_channels,
                  image_size=cfg.data.device_image_size, mean=split_floats(cfg.data.device_mean),
                  std=split_floats(cfg.data.device_std), class_names=names)


def schema_of(cfg: RunConfig) -> Schema:
    """The run's schema: the data set's own, or the one the run config declares for device
    data. What a model is built from, so the server needs no data to build it."""
    spec = spec_of(cfg.data.dataset)
    return device_schema(cfg) if spec.schema is None else spec.schema
