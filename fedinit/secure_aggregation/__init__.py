"""SecAgg+ (Bell et al. 2020) for the Message API: a transport-agnostic client and server.

The two halves exchange plain dicts whose values a Flower ``ConfigRecord`` carries (int,
float, str, bytes and lists of them), so a strategy stage can put each one in a ``Message``.
Key agreement, Shamir sharing, authenticated encryption and quantisation are Flower's
(``flwr.common.secure_aggregation``, ``flwr.supercore.primitives.asymmetric``); masks are
expanded with ChaCha20 from ``cryptography`` (see ``masks``). docs/algorithms.md, SecAgg+.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedinit.secure_aggregation.client import SecAggClient
    from fedinit.secure_aggregation.params import MOD_BITS, MODULUS, SecAggParams
    from fedinit.secure_aggregation.server import SecAggServer
    from fedinit.secure_aggregation.wire import RoundFailedError, SecAggInputError, Stage

HOME = {"SecAggClient": "client", "MOD_BITS": "params", "MODULUS": "params",
        "SecAggParams": "params", "RoundFailedError": "wire", "SecAggServer": "server",
        "SecAggInputError": "wire", "Stage": "wire"}
"""Name -> its module. Loaded on first use, so a server that never runs SecAgg+ (a strategy
without ``secure_aggregation=``) does not import the protocol's cryptography."""


def __getattr__(name: str) -> Any:
    if name in HOME:
        return getattr(importlib.import_module(f"{__name__}.{HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MODULUS",
    "MOD_BITS",
    "RoundFailedError",
    "SecAggClient",
    "SecAggInputError",
    "SecAggParams",
    "SecAggServer",
    "Stage",
]
