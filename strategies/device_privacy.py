"""What a device releases is the device's decision: its local-DP floor, its refusals and its
own accountant (docs/algorithms.md, "Local DP owned by the device"; deploy/edge/README.md).

The run config comes from whoever submits the run, so it cannot be what protects a device.
The floor is the node's own configuration: Flower's ``--node-config`` keys

    dp-floor="local" dp-max-clip=1.0 dp-min-noise=1.0 [dp-delta=1e-5] [dp-ledger="/path"]
    [dp-max-epsilon=50]

or the same keys in a TOML file: ``dp-floor-file="/path"`` in the node config, else
``<state-dir>/dp-floor.toml`` when it exists (a key set in both places is refused). With a
floor, a task whose run config asks for less (``dp`` neither ``local`` nor ``distributed``,
a clip bound above ``dp-max-clip`` on any uploaded vector, a noise multiplier of the device's
own noise below ``dp-min-noise``: z, or z / sqrt(t_min) under ``distributed``), or whose
next release would take the device's epsilon past ``dp-max-epsilon``, gets one log line and
an error reply, and nothing of the device's data or state is used.

Under local DP (a floor, or a run config with ``dp=local``) the device answers no exact query
about its data or state: every evaluate message (divergence, personalized and federated
evaluation, the plain evaluate) is refused (a noisy scalar under client-level DP needs noise
of the order of its whole range), and a train reply carries only the noised uploads, no
train loss, step or example count or compute time. Each train release is counted in the
device's ledger (``fedinit.store.privacy_ledger``) before it leaves, and its epsilon logged; a
task that fails under local DP replies only that it failed (its reason stays in the log).

The client half's code, run by the project's ClientApp and by ``strategies.client.method_train``
in a user's: it protects a device as far as the device runs only an app its owner approved
(a run's app is code the server side submits). A user's own evaluate and query handlers are
guarded by ``device_floor_mod`` (``ClientApp(mods=[device_floor_mod])``), which refuses them
under a local-DP floor before they run.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable, Mapping
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Context, Error, Message, MessageType, MetricRecord
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from fedinit.config.shown import shown
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.store.client_store import ClientStore
from fedinit.store.privacy_ledger import LEDGER_NAME, PrivacyLedger

if TYPE_CHECKING:  # annotations only: the client half does not load the run config
    from fedinit.config import RunConfig

FLOOR = "dp-floor"
MAX_CLIP = "dp-max-clip"
MIN_NOISE = "dp-min-noise"
DELTA = "dp-delta"
LEDGER = "dp-ledger"
MAX_EPSILON = "dp-max-epsilon"
FILE = "dp-floor-file"
KEYS = (FLOOR, MAX_CLIP, MIN_NOISE, DELTA, LEDGER, MAX_EPSILON)
"""The floor's keys, in the node config or the floor file."""
DEFAULT_FILE = "dp-floor.toml"
"""The floor file read from the node's ``state-dir`` when the node config names none."""
DEFAULT_DELTA = 1e-5
REFUSED = ErrorCode.MOD_FAILED_PRECONDITION
"""Error code of a refusal: the device's precondition for the task does not hold."""
PREFIX = "device privacy: "


class FloorError(ValueError):
    """The device's own privacy settings cannot be used (one line): every task is refused
    until the operator fixes them, never run without them."""


@dataclasses.dataclass(frozen=True)
class DeviceFloor:
    """The least privacy this device accepts; ``local`` False: no floor (the run decides)."""

    local: bool = False
    max_clip: float = math.inf
    min_noise: float = 0.0
    delta: float = DEFAULT_DELTA
    ledger: Path | None = None
    """Where the device keeps its ledger: ``dp-ledger``, else ``<state-dir>/privacy-ledger.json``
    (None: no place of the device's own)."""
    max_epsilon: float = math.inf
    """The device trains no more once one more release would take its epsilon past this."""

    @classmethod
    def of(cls, node_config: Mapping[str, Any]) -> DeviceFloor:
        """The floor the node config (and its floor file) sets; FloorError when it is bad."""
        own = {k: v for k, v in node_config.items() if str(k).startswith("dp-")}
        unknown = sorted(set(own) - {*KEYS, FILE})
        if unknown:
            raise FloorError(f"node config key {unknown[0]!r} is not a device privacy key; "
                             f"allowed: {', '.join((*KEYS, FILE))}")
        state_dir = str(node_config.get("state-dir", ""))
        settings = {k: v for k, v in own.items() if k != FILE}
        path = _floor_file(own.get(FILE), state_dir)
        if path is not None:
            for key, value in _read_floor_file(path).items():
                if key in settings:
                    raise FloorError(f"{key} is set both in the node config and in {path}; "
                                     "allowed: one place")
                settings[key] = value
        return cls._parse(settings, state_dir, "" if path is None else f" ({path})")

    @classmethod
    def _parse(cls, s: Mapping[str, Any], state_dir: str, where: str) -> DeviceFloor:
        mode = s.get(FLOOR, "off")
        if mode not in ("off", "local"):
            raise FloorError(f"{FLOOR}={mode!r}{where} is not allowed; allowed: 'local' "
                             "(or 'off': no floor)")
        delta = _number(s, DELTA, DEFAULT_DELTA, where)
        if not 0.0 < delta < 1.0:
            raise FloorError(f"{DELTA}={delta!r}{where} is not allowed; allowed: 0 < {DELTA} "
                             "< 1")
        ledger_value = s.get(LEDGER)
        if ledger_value is not None and (not isinstance(ledger_value, str) or not ledger_value):
            raise FloorError(f"{LEDGER}={ledger_value!r}{where} is not allowed; allowed: a file "
                             "path")
        ledger = (Path(ledger_value) if ledger_value else
                  Path(state_dir) / LEDGER_NAME if state_dir else None)
        if mode == "off":
            given = [k for k in (MAX_CLIP, MIN_NOISE, MAX_EPSILON) if k in s]
            if given:
                raise FloorError(f"{given[0]} is set but {FLOOR} is {mode!r}{where}; allowed: "
                                 f"{FLOOR}='local' with it (or neither)")
            return cls(delta=delta, ledger=ledger)
        for key in (MAX_CLIP, MIN_NOISE):
            if key not in s:
                raise FloorError(f"{FLOOR}='local'{where} needs {key}; allowed: a number > 0")
        max_clip, min_noise = _number(s, MAX_CLIP, 0, where), _number(s, MIN_NOISE, 0, where)
        for key, value in ((MAX_CLIP, max_clip), (MIN_NOISE, min_noise)):
            if not (math.isfinite(value) and value > 0):
                raise FloorError(f"{key}={value!r}{where} is not allowed; allowed: a number > 0")
        max_epsilon = _number(s, MAX_EPSILON, math.inf, where)
        if not max_epsilon > 0:
            raise FloorError(f"{MAX_EPSILON}={max_epsilon!r}{where} is not allowed; allowed: a "
                             "number > 0 (absent: no limit)")
        if ledger is None:
            raise FloorError(f"{FLOOR}='local' needs state-dir or {LEDGER} in the node config; "
                             "allowed: a directory of the device's own (its privacy ledger "
                             "must survive restarts)")
        return cls(True, max_clip, min_noise, delta, ledger, max_epsilon)

    def shortfall(self, asked: DeviceRelease) -> str | None:
        """How the release a task asks for falls short of this floor (one line), or None.
        Under ``distributed`` the noise this device adds itself, z / sqrt(t_min) in multiples
        of the clip, is what must reach ``dp-min-noise``: its upload carries no more should
        the secure sum fail (a server that unmasks one upload sees exactly that)."""
        if not self.local:
            return None
        m = asked.mechanism
        if m.mode not in DEVICE_MODES:
            return (f"run config dp={m.mode!r}; this device's floor is {FLOOR}='local' "
                    f"(allowed: dp='local' or dp='distributed')")
        bounds = [("dp-clip", m.clip)]
        if asked.channels > 1:  # the method uploads more vectors: each has its bound
            bounds.append(("dp-clip-extra", m.clip_extra))
        for key, bound in bounds:
            if bound > self.max_clip:
                run, own = shown(bound, self.max_clip)
                return f"run config {key}={run} > this device's {MAX_CLIP}={own}"
        z = asked.multiplier
        if m.mode == "distributed" and z < self.min_noise:
            run, own = shown(z, self.min_noise, least=4)
            return (f"run config dp='distributed' gives this device noise multiplier "
                    f"dp-noise-multiplier / sqrt(min-replies) = "
                    f"{shown(m.noise_multiplier)[0]} / "
                    f"sqrt({m.noise_shares}) = {run} < this device's {MIN_NOISE}={own}")
        if z < self.min_noise:
            run, own = shown(z, self.min_noise)
            return f"run config dp-noise-multiplier={run} < this device's {MIN_NOISE}={own}"
        return None


    def budget_spent(self, asked: DeviceRelease) -> str | None:
        """Why one more release like ``asked`` would take the device past
        ``dp-max-epsilon`` (one line), or None; reads the ledger (LedgerError when it is
        damaged)."""
        if not (self.local and math.isfinite(self.max_epsilon) and self.ledger is not None):
            return None
        z = asked.multiplier
        eps = PrivacyLedger.at(self.ledger, self.delta).epsilon_after(z, asked.channels)
        if eps <= self.max_epsilon:
            return None
        after, most = shown(eps, self.max_epsilon, least=4)
        return (f"one more release at noise multiplier {shown(z)[0]} would take this "
                f"device's epsilon to {after} > {MAX_EPSILON}={most} (delta {self.delta:g})")


DEVICE_MODES = ("local", "distributed")
"""The ``dp`` modes in which the device itself noises each upload: the only ones a floor
admits."""


@dataclasses.dataclass(frozen=True)
class DeviceRelease:
    """What a task asks the device to release: the run's DP mechanism (its mode, each
    channel's clip bound, z and t_min) and how many vectors each reply uploads (the model
    move and the method's extra uploads, e.g. SCAFFOLD's Delta_c_i). The project's ClientApp
    reads it from the run config (``of_run``), ``strategies.client.method_train`` from the
    train message (``strategies.wire.release_of``)."""

    mechanism: Mechanism
    channels: int

    @classmethod
    def of_run(cls, cfg: RunConfig) -> DeviceRelease:
        return cls(Mechanism.from_config(cfg), 1 + len(cfg.spec.server.up_keys))

    @property
    def local(self) -> bool:
        return self.mechanism.mode == "local"

    @property
    def multiplier(self) -> float:
        """The noise multiplier of the device's own noise on one upload: z under
        ``local``, z / sqrt(t_min) under ``distributed`` (``Mechanism.device_std`` over the
        clip), 0 otherwise."""
        m = self.mechanism
        if m.mode == "local":
            return m.noise_multiplier
        if m.mode == "distributed":
            return m.noise_multiplier / math.sqrt(m.noise_shares)
        return 0.0


def local_dp(asked: DeviceRelease, floor: DeviceFloor) -> bool:
    """Whether this task runs under local DP (a floor admits only such runs)."""
    return floor.local or asked.local


def admitted(msg: Message, context: Context, asked: DeviceRelease,
             task: str) -> tuple[DeviceFloor, Message | None]:
    """The node's privacy floor, and the refusal of ``task`` when the node's privacy
    settings are unusable or the task asks for less than they allow (else None)."""
    try:
        floor = DeviceFloor.of(context.node_config)
    except FloorError as err:
        return DeviceFloor(), refusal(msg, task, str(err))
    short = floor.shortfall(asked)
    return floor, None if short is None else refusal(msg, task, short)


def under_floor(msg: Message, context: Context, asked: DeviceRelease, task: str,
                reply: Callable[[DeviceFloor], Message],
                refused: tuple[type[Exception], ...] = ()) -> Message:
    """``reply(floor)`` when the device's floor admits the task (else its refusal, before
    anything is read). Under local DP one more release must fit the device's epsilon cap,
    and a task that fails replies only that it failed (its error's text may tell of the
    data); an error of a ``refused`` type (a place on disk that is not the device's) is a
    refusal in one line. The train path of the project's ClientApp and of
    ``strategies.client.method_train``."""
    floor, refusing = admitted(msg, context, asked, task)
    if refusing is not None:
        return refusing
    local = local_dp(asked, floor)
    try:
        if local:
            spent = floor.budget_spent(asked)
            if spent is not None:
                return refusal(msg, task, spent)
        return reply(floor)
    except refused as err:
        return refusal(msg, task, str(err))
    except Exception as err:
        if not local:
            raise
        return private_failure(msg, task, err)  # its text stays on the device


def refusal(msg: Message, task: str, reason: str) -> Message:
    """The one log line and the error reply of a refused task; the run goes on without it."""
    line = f"{PREFIX}refused the {task}{_round_of(msg)}: {reason}"
    log(WARNING, "%s", line)
    return Message(Error(code=REFUSED, reason=line), reply_to=msg)


def private_failure(msg: Message, task: str, err: Exception) -> Message:
    """A task that failed under local DP: its reason is logged here only; the reply says
    that it failed, no more (a schema error names a file and its size, a diverged loss
    tells of the data)."""
    where = _round_of(msg)
    log(ERROR, "%sthe %s%s failed: %s: %s (the reply says only that it failed)", PREFIX,
        task, where, type(err).__name__, " ".join(str(err).split()))
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                         reason=f"{PREFIX}the {task}{where} failed on this device; the "
                                "reason is in its log"), reply_to=msg)


def device_floor_mod(msg: Message, context: Context,
                     call_next: Callable[[Message, Context], Message]) -> Message:
    """A Flower client mod that guards a user's own handlers with the device's floor:
    ``ClientApp(mods=[device_floor_mod])``. Under a local-DP floor every message but a train
    message (a user's ``@app.evaluate()``, ``@app.query()``) is refused before the handler
    runs: each would answer an exact question about the device's data. A floor that cannot
    be used refuses every message, train included; train messages otherwise go on to the
    handler, where ``method_train`` applies the floor to the release. Without a floor the
    run decides, and every message goes on."""
    task = f"{msg.metadata.message_type} message"
    try:
        floor = DeviceFloor.of(context.node_config)
    except FloorError as err:
        return refusal(msg, task, str(err))
    if floor.local and msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
        return refusal(msg, task, "under this device's local-DP floor it answers no exact "
                       "query about its data; allowed: train messages (their uploads noised "
                       "on the device)")
    return call_next(msg, context)


def ledger_for(floor: DeviceFloor, context: Context, store: ClientStore) -> PrivacyLedger:
    """The device's ledger: its own place (``dp-ledger`` or its ``state-dir``); without
    one (no floor), the client's state directory, else the node's memory."""
    if floor.ledger is not None:
        return PrivacyLedger.at(floor.ledger, floor.delta)
    if store.disk is not None:  # written as the client's state is (a simulation: no fsync)
        return PrivacyLedger.at(store.disk.inside(store.disk.client_dir / LEDGER_NAME),
                                floor.delta,
                                sync=store.disk.sync)
    return PrivacyLedger.in_state(context.state, floor.delta)


def account_release(ledger: PrivacyLedger, msg: Message, noise_multiplier: float,
                    channels: int) -> None:
    """Count one train release before it leaves, and log the device's epsilon."""
    eps = ledger.record(noise_multiplier, channels)
    n = ledger.participations
    log(INFO, "%sround %s: released %d channel%s at noise multiplier %g; epsilon %.4g at "
        "delta %g after %d participation%s (ledger %s)", PREFIX, _round_number(msg), channels,
        "" if channels == 1 else "s", noise_multiplier, eps, ledger.delta, n,
        "" if n == 1 else "s", ledger.where)


def train_metrics(local: bool, metrics: Mapping[str, int | float]) -> MetricRecord:
    """A train reply's metrics: none under local DP (each depends on the device's data:
    its loss, its example and step counts, how long it computed), else ``metrics``."""
    return MetricRecord({} if local else dict(metrics))


def _round_number(msg: Message) -> str:
    conf = msg.content.config_records.get(rk.CONFIG) if msg.has_content() else None
    value = conf.get(rk.ROUND) if conf is not None else None
    return "?" if value is None else str(value)


def _round_of(msg: Message) -> str:
    number = _round_number(msg)
    return "" if number == "?" else f" of round {number}"


def _floor_file(named: object, state_dir: str) -> Path | None:
    """The floor file: the one the node config names (it must exist), else the state
    directory's ``dp-floor.toml`` if present."""
    if named is not None:
        if not isinstance(named, str) or not named:
            raise FloorError(f"{FILE}={named!r} is not allowed; allowed: a file path")
        path = Path(named)
        if not path.is_file():
            raise FloorError(f"{FILE}={named!r} is not a file; allowed: the path of a TOML "
                             "file of the device's floor")
        return path
    if state_dir and (Path(state_dir) / DEFAULT_FILE).is_file():
        return Path(state_dir) / DEFAULT_FILE
    return None


def _read_floor_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise FloorError(f"{path} cannot be read as TOML: {' '.join(str(err).split())}") \
            from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise FloorError(f"{path}: key {unknown[0]!r} is not a device privacy key; allowed: "
                         f"{', '.join(KEYS)}")
    return data


def _number(s: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = s.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FloorError(f"{key}={value!r}{where} is not allowed; allowed: a number")
    return float(value)
