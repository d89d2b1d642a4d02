"""A device's own privacy accountant: every local-DP release it made, and its epsilon.

Under local DP each participation is, per uploaded vector (channel), one Gaussian mechanism:
the vector clipped to norm C plus N(0, (z C)^2) per coordinate. Any two clipped vectors
differ by at most 2C, so each channel is a Gaussian of noise multiplier z / 2
(``SENSITIVITY``); nothing amplifies it (the server knows who took part). The ledger counts
the releases by (z, channels), composes them with Google's ``dp-accounting`` RDP accountant
(no privacy formula is written here) and keeps them in one JSON file that survives restarts,
across runs: the device's data is the same whichever run asks.

The file is also the device's status: it holds the epsilon, delta and counts in plain JSON.
An unreadable ledger is an error, never an empty one: forgetting releases would understate
epsilon.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from fedinit.store.files import RecordError, atomic_write

SENSITIVITY = 2.0
"""A channel's L2 sensitivity in multiples of its clip bound: any two inputs' clipped vectors
lie in one ball of radius C."""
FORMAT = 1
LEDGER_NAME = "privacy-ledger.json"
"""The ledger's file name in a state directory."""
MEMORY_KEY = "device-privacy-ledger"
"""The ``context.state`` entry of a ledger kept in memory."""


class LedgerError(RecordError):
    """A ledger that cannot be read; one line naming the file and the problem."""

    what = "privacy ledger"


def epsilon(releases: dict[tuple[float, int], int], delta: float) -> float:
    """Epsilon at ``delta`` of ``releases`` ({(z, channels): count}) composed (RDP, the
    replace-one relation: a neighbouring input of the device is any other input); 0 when
    nothing was released, inf when a release had no noise."""
    if not releases:
        return 0.0
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    for (z, channels), count in sorted(releases.items()):
        accountant.compose(dpa.GaussianDpEvent(z / SENSITIVITY), count * channels)
    eps = float(accountant.get_epsilon(delta))
    return eps if math.isfinite(eps) else math.inf


class PrivacyLedger:
    """The releases of one device, read from and written to ``read()`` / ``write(text)``:
    a JSON file (``at``) or the node's memory (``in_state``)."""

    def __init__(self, where: str, read: Callable[[], str | None],
                 write: Callable[[str], None], delta: float) -> None:
        self.where = where
        """Where it is kept (a path, or a description), for log lines."""
        self._write = write
        self.delta = delta
        self.releases: dict[tuple[float, int], int] = {}
        text = read()
        if text is not None:
            self.releases = _parse(where, text)

    @classmethod
    def at(cls, path: Path, delta: float, sync: bool = True) -> PrivacyLedger:
        """The ledger kept in ``path`` (created with its directory at the first release);
        ``sync=False``: written without an fsync of its own (a simulated client's, made
        durable with the client's state by its server)."""
        def read() -> str | None:
            try:
                return path.read_text()
            except FileNotFoundError:
                return None
            except OSError as err:
                raise LedgerError(path, f"cannot be read: {err.strerror}") from None

        def write(text: str) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda f: f.write(text.encode()), sync=sync)

        return cls(str(path), read, write, delta)

    @classmethod
    def in_state(cls, state: RecordDict, delta: float) -> PrivacyLedger:
        """The ledger kept in a node's ``context.state`` (``MEMORY_KEY``): for a node with no
        state directory, where Flower keeps it per run and node (lost on a restart)."""
        def read() -> str | None:
            record = state.config_records.get(MEMORY_KEY)
            return None if record is None else str(record["json"])

        def write(text: str) -> None:
            state[MEMORY_KEY] = ConfigRecord({"json": text})

        return cls("the node's memory (no state-dir: lost on a restart)", read, write, delta)

    @property
    def participations(self) -> int:
        return sum(self.releases.values())

    def epsilon(self) -> float:
        return epsilon(self.releases, self.delta)

    def epsilon_after(self, noise_multiplier: float, channels: int) -> float:
        """The epsilon one more release would bring (nothing is recorded)."""
        key = (float(noise_multiplier), int(channels))
        return epsilon({**self.releases, key: self.releases.get(key, 0) + 1}, self.delta)

    def record(self, noise_multiplier: float, channels: int) -> float:
        """Count one participation (``channels`` Gaussian releases at ``noise_multiplier``)
        and make it durable BEFORE the release leaves the device; its new epsilon."""
        if not (channels >= 1 and noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"a release of {channels} channels at noise multiplier "
                             f"{noise_multiplier!r} cannot be accounted; allowed: >= 1 "
                             "channel at a finite noise multiplier > 0")
        key = (float(noise_multiplier), int(channels))
        self.releases[key] = self.releases.get(key, 0) + 1
        eps = self.epsilon()
        self._write(json.dumps(self.status(eps), indent=1) + "\n")
        return eps

    def status(self, eps: float | None = None) -> dict[str, Any]:
        """What the file holds: the releases and, for a person reading it, the epsilon."""
        eps = self.epsilon() if eps is None else eps
        return {"format": FORMAT, "mechanism": "local DP: Gaussian per channel, "
                "sensitivity 2 x clip (replace-one), no amplification",
                "epsilon": eps if math.isfinite(eps) else "inf", "delta": self.delta,
                "participations": self.participations,
                "releases": [{"noise-multiplier": z, "channels": k, "count": n}
                             for (z, k), n in sorted(self.releases.items())],
                "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _parse(where: str, text: str) -> dict[tuple[float, int], int]:
    """The releases a ledger's text lists; LedgerError naming what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise LedgerError(where, f"is not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LedgerError(where, f"is not a format-{FORMAT} ledger")
    rows = data.get("releases")
    if not isinstance(rows, list):
        raise LedgerError(where, "lists no releases")
    out: dict[tuple[float, int], int] = {}
    for row in rows:
        try:
            z, k, n = float(row["noise-multiplier"]), row["channels"], row["count"]
        except (TypeError, KeyError, ValueError):
            raise LedgerError(where, f"has a release row {row!r} without noise-multiplier, "
                                     "channels and count") from None
        if not (isinstance(k, int) and isinstance(n, int) and k >= 1 and n >= 0 and z > 0
                and math.isfinite(z)):
            raise LedgerError(where, f"has a release row {row!r} that is not z > 0, "
                                     "channels >= 1, count >= 0")
        out[(z, k)] = out.get((z, k), 0) + n
    return out
