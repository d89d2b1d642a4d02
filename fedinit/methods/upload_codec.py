"""Compressed uploads on both halves of a round: the client's encode, the server's decode.

The codec is ``fedinit.methods.compression`` (``compression`` in the run config). The server names
it in each train message (``rk.COMPRESSION``; absent: off), so every client half, the project's
ClientApp and ``strategies.client.method_train`` alike, compresses as the message asks, and
says in its reply's CONFIG record which codec it used; the server refuses a reply whose codec
is not the run's.

Channels are the model upload (``rk.ARRAYS``) and each model-shaped extra (SCAFFOLD's
Delta_c_i), each encoded with its own generator, seeded by (seed, round, client id, channel),
after local DP's noise (local DP noises, then compresses). The model upload is encoded as a
move from a point the server knows: Delta_i as it is; under ``ri-aggregation=model`` the move
w_iK - w_t from the received model (the RI start is the client's secret), which the server
adds back to w_t after decoding. Top-k's residual (error feedback) is client state, one entry
per channel (``residual_key``), restored like c_i to the version of the client's last
aggregated reply (``residual_keys`` join the method's ``accounted_keys``): the residual of a
reply the server never counted rolls back with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from fedinit.methods import wire as rk
from fedinit.methods.compression import RESIDUAL, Compression, CompressionError
from fedinit.methods.packed_arrays import pack
from fedinit.methods.weights import Weights

OFF = "off"


class State(Protocol):
    """The part of a client's store the encoder uses
    (``fedinit.store.client_store.ClientStore``)."""

    def get(self, key: str) -> list[np.ndarray] | None: ...

    def put(self, key: str, arrays: list[np.ndarray]) -> None: ...


def residual_key(channel: str) -> str:
    """The client-state key of top-k's residual for one upload channel."""
    return f"{RESIDUAL}/{channel}"


def channels(up_keys: Sequence[str]) -> tuple[str, ...]:
    """The upload channels in seed order: the model upload, then the method's extras."""
    return (rk.ARRAYS, *up_keys)


def residual_keys(text: str, up_keys: Sequence[str]) -> tuple[str, ...]:
    """The state keys restored to the accounted version beside the method's (top-k only)."""
    codec = Compression.parse(text)
    if codec is None or not codec.keeps_residual:
        return ()
    return tuple(residual_key(c) for c in channels(up_keys))


def generator(seed: int, server_round: int, client_id: int, channel: int) -> np.random.Generator:
    """The stochastic rounding's randomness of one channel of one participation."""
    return np.random.default_rng([seed, server_round, client_id, channel, 0xC0DEC])


def encode_reply(text: str, upload: Weights, extras: Mapping[str, Weights], *,
                 w_t: Weights, delta: bool, state: State, seed: int, server_round: int,
                 client_id: int, changes: Mapping[str, tuple[str, Weights]] | None = None,
                 ) -> tuple[dict[str, ArrayRecord], ConfigRecord]:
    """The reply's upload records (packed) and the CONFIG entries saying how they were made.

    ``upload`` is what leaves after DP's release (Delta_i, or w_iK when not ``delta``);
    ``text`` the codec the train message names. Off: the arrays as they are. ``changes``:
    {extra upload: (the accounted state key it changes, that key before this round)}
    (``ClientRule.uploaded_changes``); compressed, the key is stored as before + what the
    server will decode, so the server's sum of the decoded changes is the clients' sum."""
    codec = Compression.parse(text)
    said = ConfigRecord({rk.UPLOAD_DELTA: delta})
    if codec is None:
        return ({rk.ARRAYS: pack(upload), **{k: pack(v) for k, v in extras.items()}}, said)
    said[rk.COMPRESSION] = text
    moved = list(upload) if delta else [np.asarray(u, np.float32) - np.asarray(w, np.float32)
                                        for u, w in zip(upload, w_t, strict=True)]
    vectors = {rk.ARRAYS: moved, **extras}
    records: dict[str, ArrayRecord] = {}
    for i, name in enumerate(channels(sorted(extras))):
        key = residual_key(name)
        residual = state.get(key) if codec.keeps_residual else None
        wire, decoded, new_residual = codec.encode(vectors[name],
                                                   generator(seed, server_round, client_id, i),
                                                   residual)
        if codec.keeps_residual:
            state.put(key, new_residual)
        if changes and name in changes:
            changed, before = changes[name]
            state.put(changed, [(b.astype(np.float64) + d).astype(np.float32)
                                for b, d in zip(before, decoded, strict=True)])
        records[name] = pack(wire)
    return records, said


def codec_problem(text: str, said: object) -> str | None:
    """Why a reply's stated codec (its CONFIG's ``compression``; None: off) is not the
    run's ``text``, or None."""
    stated = OFF if said is None else said
    if stated == text:
        return None
    return (f"the reply says {rk.COMPRESSION}={stated!r}; the run's is {text!r} "
            f"(allowed: {text!r})")


def decode_channel(codec: Compression | None, name: str, arrays: list[np.ndarray],
                   w_t: Weights, delta: bool) -> Weights:
    """One upload channel as the model-shaped vector it encodes (w_iK for a model upload
    when not ``delta``); CompressionError (one line) when malformed. Off: unchanged."""
    if codec is None:
        return arrays
    decoded = codec.decode(arrays, [w.shape for w in w_t], repr(name))
    if name == rk.ARRAYS and not delta:
        return [np.asarray(w + d, dtype=w.dtype) for w, d in zip(w_t, decoded, strict=True)]
    return [np.asarray(d, dtype=w.dtype) for w, d in zip(w_t, decoded, strict=True)]


__all__ = ["OFF", "CompressionError", "channels", "codec_problem", "decode_channel",
           "encode_reply", "generator", "residual_key", "residual_keys"]
