"""The run config's error and its one-line messages, with nothing but the standard library.

Every layer that checks a run-config value (the config itself, a method's parameters) raises
this one error type, so the apps and scripts catch one thing and print one line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A run-config value that cannot be used; the message is one line naming the key."""


def bad_value(key: str, value: Any, allowed: str) -> ConfigError:
    """'run config: key=value is not allowed; allowed: ...'."""
    return ConfigError(f"run config: {key}={value!r} is not allowed; allowed: {allowed}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of ``choices``, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
