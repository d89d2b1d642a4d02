"""SecAgg+ (Bell et al. 2020) for the Message API: a transport-agnostic client and server.

The two halves exchange plain dicts whose values a Flower ``ConfigRecord`` carries (int,
float, str, bytes and lists of them), so a strategy stage can put each one in a ``Message``.
Key agreement, Shamir sharing, authenticated encryption and quantisation are Flower's
(``flwr.common.secure_aggregation``, ``flwr.supercore.primitives.asymmetric``); masks are
expanded with ChaCha20 from ``cryptography`` (see ``masks``). docs/algorithms.md, SecAgg+.
"""

from fedinit.secure_aggregation.client import SecAggClient
from fedinit.secure_aggregation.params import MOD_BITS, MODULUS, SecAggParams
from fedinit.secure_aggregation.server import RoundFailedError, SecAggServer
from fedinit.secure_aggregation.wire import SecAggInputError, Stage

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
