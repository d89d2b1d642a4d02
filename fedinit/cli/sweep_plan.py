"""Experiment grids: a YAML file read into validated sweep cells, every error with its line.

A file has ``base`` (run-config overrides shared by every cell), ``grid`` (axes whose cartesian
product gives the cells), optional ``overrides`` keyed by method (e.g. FedDyn's lr-decay) and
optional ``name``, ``description``, ``connection``, ``metric`` and ``resources``. Every cell is
validated with ``RunConfig.parse`` here, before anything runs, so a typo in cell 40 of a
two-hour sweep fails in a second, naming the file, the line and the key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedinit.cli.flower_env import REPO
from fedinit.config import ConfigError, RunConfig, load_defaults
from fedinit.config.keys import (  # two runs differing only in NOT_IDENTITY: the same cell
    NOT_IDENTITY,
    value_before,
)
from fedinit.methods.registry import METHOD_NAMES

# Axes that take a list of values; their cartesian product gives the cells.
VALUE_AXES: tuple[str, ...] = ("method", "beta", "dirichlet-alpha", "fraction-train",
                               "num-clients", "seed", "model", "dataset", "local-epochs")
# Axes whose items are mappings that set several keys together (zipped, not crossed).
ZIPPED_AXES: dict[str, tuple[str, ...]] = {
    # the paper's "10%-100", "5%-200"; train-limit lets a grid keep the data per client fixed
    "participation": ("num-clients", "fraction-train", "train-limit"),
    "setup": ("num-clients", "fraction-train", "dirichlet-alpha"),  # Figure 2's panels
    "variant": ("method", "beta"),  # rows of Table 4: six plain methods and FedInit
    "data": ("partition", "dirichlet-alpha", "num-regimes", "regime-kind"),  # regimes or not
}
TOP_KEYS: tuple[str, ...] = ("name", "description", "base", "grid", "overrides", "connection",
                             "metric", "resources")
METRIC_KEYS: dict[str, type] = {"window": int, "last": int, "target": float}
"""metric: window and last of the smoothed peak; target: an accuracy in % whose time to reach
the report gives (fedinit/cli/time_to_target.py)."""
RESOURCE_KEYS: tuple[str, ...] = ("num-cpus-per-client", "num-gpus-per-client")
SWEEP_OWNED: frozenset[str] = frozenset({"output-dir"})

Path_ = tuple[str | int, ...]


class PlanError(ValueError):
    """A grid file that cannot be used; the message is ``file:line: key: what is wrong``."""


@dataclass(frozen=True)
class Cell:
    """One run of the sweep: its id, its run-config overrides and its grid coordinates."""

    id: str
    overrides: dict[str, Any]
    coords: dict[str, Any]
    config: dict[str, Any] = field(repr=False)  # the validated full config (to_dict)

    def identity(self) -> dict[str, Any]:
        """The config keys that define the experiment (paths and timeouts left out)."""
        return identity(self.config)


@dataclass(frozen=True)
class SweepPlan:
    """A parsed grid file: its cells in run order and the settings around them."""

    path: Path
    name: str
    description: str
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    overrides: dict[str, dict[str, Any]]
    cells: list[Cell]
    connection: str | None = None
    metric: dict[str, int] = field(default_factory=dict)
    target: float | None = None  # metric.target: report rounds and seconds to reach it (%)
    resources: dict[str, float] = field(default_factory=dict)


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without the keys that do not change the experiment."""
    return {k: v for k, v in config.items() if k not in NOT_IDENTITY}


# --------------------------------------------------------------------------- YAML with lines
class _Located:
    """Line numbers of every key and list item of a YAML document, by path."""

    def __init__(self, file: str, node: yaml.Node) -> None:
        self.file = file
        self.lines: dict[Path_, int] = {}
        self._walk(node, ())

    def _walk(self, node: yaml.Node, path: Path_) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in seen:
                    raise PlanError(f"{self.file}:{key_node.start_mark.line + 1}: "
                                    f"{_dotted((*path, key))}: duplicate key")
                seen.add(key)
                self._walk(value_node, (*path, key))
                self.lines[(*path, key)] = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*path, i))

    def error(self, path: Path_, message: str) -> PlanError:
        """A PlanError at the line of ``path`` (or of its nearest located parent)."""
        probe = path
        while probe not in self.lines and probe:
            probe = probe[:-1]
        line = self.lines.get(probe, 1)
        where = _dotted(path) or "(top level)"
        return PlanError(f"{self.file}:{line}: {where}: {message}")


def _dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _read_yaml(path: Path) -> tuple[Any, _Located]:
    try:
        text = path.read_text()
    except OSError as err:
        raise PlanError(f"{path}: cannot read the grid file ({err.strerror}); allowed: an "
                        "experiments/*.yaml file") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise PlanError(f"{path}:{line}: not valid YAML: {problem}") from None
    if node is None:
        raise PlanError(f"{path}:1: the file is empty; expected a mapping with base: and grid:")
    return data, _Located(str(path), node)


# --------------------------------------------------------------------------- checks
def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_value(loc: _Located, path: Path_, key: str, value: Any,
                 defaults: Mapping[str, Any]) -> Any:
    """A run-config value of the right type (as its pyproject default), else a PlanError."""
    if key not in defaults:
        raise loc.error(path, f"unknown run-config key {key!r}; known keys: "
                        f"{', '.join(sorted(defaults))}")
    if key in SWEEP_OWNED:
        raise loc.error(path, f"{key} is set by the sweep (one directory per cell); "
                        "use fedinit-sweep --out")
    kind = type(defaults[key])
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise loc.error(path, f"expected {kind.__name__}, got {_type_name(value)} {value!r}")
    if key == "data-dir" and value and not Path(value).is_absolute():
        return str(REPO / value)  # relative data paths are relative to the repository
    return value


def _mapping(loc: _Located, path: Path_, value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise loc.error(path, f"expected a mapping ({what}), got {_type_name(value)}")
    return value


def _run_config_block(loc: _Located, path: Path_, value: Any,
                      defaults: Mapping[str, Any]) -> dict[str, Any]:
    block = _mapping(loc, path, value, "run-config key: value")
    return {str(k): _check_value(loc, (*path, str(k)), str(k), v, defaults)
            for k, v in block.items()}


def _axes(loc: _Located, raw: Any, defaults: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The grid's axes, each a non-empty list of checked values (or of checked mappings)."""
    grid = _mapping(loc, ("grid",), raw, "axis: [values]")
    if not grid:
        raise loc.error(("grid",), "no axes; give at least one, e.g. method: [fedavg]")
    axes: dict[str, list[Any]] = {}
    owner: dict[str, str] = {}
    for axis, values in grid.items():
        axis = str(axis)
        path: Path_ = ("grid", axis)
        if axis not in VALUE_AXES and axis not in ZIPPED_AXES:
            raise loc.error(path, f"unknown grid key; allowed: "
                            f"{', '.join((*VALUE_AXES, *ZIPPED_AXES))}")
        if not isinstance(values, list) or not values:
            raise loc.error(path, f"expected a non-empty list, got {_type_name(values)}")
        sets = ZIPPED_AXES.get(axis, (axis,))
        for key in sets:
            if key in owner:
                raise loc.error(path, f"{key} is already set by grid.{owner[key]}")
            owner[key] = axis
        items = []
        for i, item in enumerate(values):
            if axis in ZIPPED_AXES:
                m = _mapping(loc, (*path, i), item, f"keys of {', '.join(sets)}")
                bad = sorted(set(m) - set(sets))
                if bad or not m:
                    raise loc.error((*path, i, *bad[:1]),
                                    f"a {axis} item sets {' and/or '.join(sets)}")
                items.append({k: _check_value(loc, (*path, i, k), k, v, defaults)
                              for k, v in m.items()})
            else:
                items.append(_check_value(loc, (*path, i), axis, item, defaults))
        if len({json.dumps(x, sort_keys=True) for x in items}) != len(items):
            raise loc.error(path, "repeated value")
        axes[axis] = items
    return axes


def _overrides(loc: _Located, raw: Any, axes: Mapping[str, list[Any]],
               defaults: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-method run-config overrides; they may not set a key the grid varies."""
    block = _mapping(loc, ("overrides",), raw, "method: {key: value}")
    grid_keys = {k for a in axes for k in ZIPPED_AXES.get(a, (a,))}
    out: dict[str, dict[str, Any]] = {}
    for method, values in block.items():
        method = str(method)
        if method not in METHOD_NAMES:
            raise loc.error(("overrides", method), f"unknown method; known: "
                            f"{', '.join(METHOD_NAMES)}")
        checked = _run_config_block(loc, ("overrides", method), values, defaults)
        for key in checked:
            if key in grid_keys or key == "method":
                raise loc.error(("overrides", method, key),
                                "the grid sets this key; an override may not")
        out[method] = checked
    return out


def _small_block(loc: _Located, name: str, raw: Any, kinds: Mapping[str, type],
                 minimum: float) -> dict[str, Any]:
    """A flat block of non-run-config numbers (metric window, client resources)."""
    block = _mapping(loc, (name,), raw, f"{', '.join(kinds)}")
    out: dict[str, Any] = {}
    for key, value in block.items():
        key = str(key)
        if key not in kinds:
            raise loc.error((name, key), f"unknown key; allowed: {', '.join(kinds)}")
        kind = kinds[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) or value < minimum:
            raise loc.error((name, key), f"expected a {kind.__name__} >= {minimum:g}, "
                            f"got {value!r}")
        out[key] = value
    return out


# --------------------------------------------------------------------------- expansion
def cell_id(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> str:
    """Readable and unique: the usual coordinates, then a hash of what the grid sets.

    The hash covers the explicit settings (not the defaults), so a run-config key added to
    pyproject later does not rename finished cells, and grids with the same settings that
    share a cell directory (--cells) share their runs. Whether a finished run still matches
    is decided by ``matches`` on the full config.
    """
    ri = f"ri{config['beta']:g}" if config["beta"] else "nori"
    parts = [str(config["method"]), ri, str(config["dataset"]), str(config["model"]),
             f"dir{config['dirichlet-alpha']:g}",
             *([f"{config['num-regimes']}{config['regime-kind']}"]
               if config.get("num-regimes") else []),
             f"p{100 * config['fraction-train']:g}of{config['num-clients']}",
             f"s{config['seed']}"]
    explicit = {k: config[k] for k in overrides if k not in NOT_IDENTITY}
    digest = hashlib.sha1(json.dumps(explicit, sort_keys=True).encode()).hexdigest()
    return "-".join(parts) + "-" + digest[:8]


def matches(run_config: Mapping[str, Any], cell: Cell) -> bool:
    """Whether a finished run's config is this cell's experiment.

    Keys the run does not know (added to pyproject after it ran) must hold their default, or
    the value the run had before the key existed (``config_keys.BEFORE_KEY``); keys pyproject
    no longer has are ignored; paths and timeouts never count.
    """
    defaults = load_defaults()
    for key, want in cell.identity().items():
        if run_config.get(key, value_before(key, defaults.get(key), run_config)) != want:
            return False
    return True


_KEY_IN_ERROR = re.compile(r"run config: (?:unknown key '([^']+)'|([a-z0-9-]+)=)")


def expand(loc: _Located, base: Mapping[str, Any], axes: Mapping[str, list[Any]],
           overrides: Mapping[str, Mapping[str, Any]],
           extra: Mapping[str, Any] | None = None) -> list[Cell]:
    """The cartesian product of the axes, each cell validated by RunConfig.parse."""
    cells: list[Cell] = []
    names = list(axes)
    for combo in itertools.product(*(range(len(axes[a])) for a in names)):
        values: dict[str, Any] = {**base, **(extra or {})}
        source: dict[str, Path_] = {k: ("base", k) for k in base}
        source.update({k: ("--set", k) for k in extra or {}})
        coords: dict[str, Any] = {}
        for axis, i in zip(names, combo, strict=True):
            item = axes[axis][i]
            setting = item if isinstance(item, dict) else {axis: item}
            values.update(setting)
            coords[axis] = item
            for k in setting:
                source[k] = ("grid", axis, i)
        method = values.get("method", load_defaults()["method"])
        for k, v in overrides.get(method, {}).items():
            values[k] = v
            source[k] = ("overrides", method, k)
        try:
            config = RunConfig.parse(values).to_dict()
        except ConfigError as err:
            match = _KEY_IN_ERROR.search(str(err))
            key = next((g for g in match.groups() if g), "") if match else ""
            if source.get(key, ("",))[0] == "--set":
                raise PlanError(f"{loc.file}: --set {key}: {err}") from None
            raise loc.error(source.get(key, ("grid",)), f"{err} (in cell {coords})") from None
        cells.append(Cell(cell_id(config, values), values, coords, config))
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        raise loc.error(("grid",), "two cells are the same experiment (check overrides)")
    return cells


def load_plan(path: str | Path, extra: Mapping[str, Any] | None = None) -> SweepPlan:
    """Read, check and expand a grid file; ``extra`` overrides base (e.g. from --set)."""
    path = Path(path)
    data, loc = _read_yaml(path)
    if not isinstance(data, dict):
        raise loc.error((), f"expected a mapping with base: and grid:, got {_type_name(data)}")
    for key in data:
        if key not in TOP_KEYS:
            raise loc.error((str(key),), f"unknown top-level key; allowed: {', '.join(TOP_KEYS)}")
    defaults = load_defaults()
    for key in ("name", "description", "connection"):
        if key in data and not isinstance(data[key], str):
            raise loc.error((key,), f"expected a string, got {_type_name(data[key])}")
    base = _run_config_block(loc, ("base",), data.get("base"), defaults)
    axes = _axes(loc, data.get("grid"), defaults)
    grid_keys = {k for a in axes for k in ZIPPED_AXES.get(a, (a,))}
    for key in base:
        if key in grid_keys:
            raise loc.error(("base", key), "also set by the grid; keep it in one place")
    extra = dict(extra or {})
    for key in extra:
        if key not in defaults or key in SWEEP_OWNED:
            raise PlanError(f"{path}: --set {key}: not a run-config key the sweep can set")
        if key in grid_keys:
            raise PlanError(f"{path}: --set {key}: the grid varies this key")
    overrides = _overrides(loc, data.get("overrides"), axes, defaults)
    metric = _small_block(loc, "metric", data.get("metric"), METRIC_KEYS, 1)
    target = metric.pop("target", None)
    if target is not None and target > 100:
        raise loc.error(("metric", "target"), f"expected an accuracy in % (1 to 100), "
                        f"got {target!r}")
    resources = _small_block(loc, "resources", data.get("resources"),
                             dict.fromkeys(RESOURCE_KEYS, float), 0)
    cells = expand(loc, base, axes, overrides, extra)
    return SweepPlan(path=path, name=str(data.get("name") or path.stem),
                description=str(data.get("description") or "").strip(), base=base, axes=axes,
                overrides=overrides, cells=cells, connection=data.get("connection"),
                metric=metric, target=target, resources=resources)
