"""The one guard every patch passes before it bends Flower or Ray.

A patch was measured against the exact source of what it replaces or relies on, in flwr
``CHECKED_FLWR``. Its guard re-reads that source (``source_of``) and compares its SHA-256
with the one recorded in the patch's table entry (``fedinit.flower_compat.registry``). Any other
flwr version, or any changed text, and the patch declines: Flower's own behaviour stays, one
warning is logged (once per patch per process), nothing raises. Verdicts are kept per
process, so asking again is free.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import threading
from logging import WARNING

CHECKED_FLWR = "1.39.0"
"""The flwr release every patch's source was read and measured against (the only one)."""

_verdicts: dict[str, str | None] = {}
_lock = threading.Lock()


def source_of(target: str) -> str:
    """The source text of ``target``: ``"module"`` or ``"module:Qual.name"``."""
    module_name, _, qualname = target.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return inspect.getsource(obj)  # type: ignore[arg-type]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def why_not(name: str) -> str | None:
    """None when patch ``name`` may be applied here; else the reason, in a few words."""
    import flwr

    from fedinit.flower_compat.registry import patch

    if flwr.__version__ != CHECKED_FLWR:
        return f"flwr {flwr.__version__} is not the checked {CHECKED_FLWR}"
    for target, expected in patch(name).checked:
        try:
            text = source_of(target)
        except (ImportError, AttributeError, OSError, TypeError) as err:
            return f"{target} cannot be read ({type(err).__name__})"
        if digest(text) != expected:
            return f"{target} is not the source checked against flwr {CHECKED_FLWR}"
    return None


def allowed(name: str) -> bool:
    """Whether patch ``name`` may be applied; the first refusal in this process logs one
    warning naming what stays (Flower's own behaviour)."""
    from flwr.supercore import log

    from fedinit.flower_compat.registry import patch

    with _lock:
        known = name in _verdicts
        if not known:
            _verdicts[name] = why_not(name)
        reason = _verdicts[name]
    if reason is not None and not known:
        log(WARNING, "flower_compat: %s not applied (%s); %s", name, reason,
            patch(name).declined)
    return reason is None


def forget() -> None:
    """Drop the verdicts (tests: read the sources again)."""
    with _lock:
        _verdicts.clear()
