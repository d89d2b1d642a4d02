"""A list of arrays as one Flower ``Array``: what every message carries instead of one per tensor.

Flower 1.39 stores and moves each ``Array`` of a message (and its chunk) as its own object: a
SuperNode pulls them one request each, a reply pushes them one request each, and the
SuperLink answers every request with its node-auth check and several SQL statements. For the
default CNN that is 20 objects per message; packed it is 6, and the deployment's round time
falls with the object count (``docs/benchmarks.md``, "Deployment waits"). So every record that
crosses the wire holds one array under ``PACKED``: a little-endian uint8 buffer, laid out as

    8 bytes: header length H | H bytes: JSON [[dtype, [dims...]], ...] | pad to 16 |
    each array's bytes, C order, each padded to 16

``unpack`` reads it back (exact bytes: results are bit-identical to sending the tensors one
by one) and refuses anything else with a one-line reason, since a reply is a client's word:
a header that does not parse, a dtype outside ``DTYPES``, a negative or non-integer dim, or a
buffer whose length is not exactly what the header says. A record without ``PACKED`` is read
as Flower's list of arrays (tests and tools that build records by hand).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from flwr.app import Array, ArrayRecord

PACKED = "packed"
"""The key of the one array in a packed record."""
ALIGN = 16
DTYPES = frozenset({"<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "<u2", "|i1", "|u1", "|b1"})
"""Dtypes a packed record may hold (little-endian numbers and bools)."""
MAX_HEADER = 1 << 20
"""Header bytes a packed record may claim (a 10,000-tensor model needs about 300 KB)."""


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack(arrays: Sequence[np.ndarray]) -> ArrayRecord:
    """``arrays`` as one uint8 ``Array`` under ``PACKED``; ValueError for a dtype the
    receiver's ``unpack`` would refuse (said here, at the sender)."""
    parts = [_wire_form(a) for a in arrays]
    header = json.dumps([[p.dtype.str, list(p.shape)] for p in parts],
                        separators=(",", ":")).encode()
    offset = _padded(8 + len(header))
    offsets = []
    for p in parts:
        offsets.append(offset)
        offset += _padded(p.nbytes)
    buf = np.zeros(offset, dtype=np.uint8)
    buf[:8] = np.frombuffer(len(header).to_bytes(8, "little"), dtype=np.uint8)
    buf[8:8 + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for p, at in zip(parts, offsets, strict=True):
        buf[at:at + p.nbytes] = p.reshape(-1).view(np.uint8)
    return ArrayRecord({PACKED: Array(buf)})


def _wire_form(a: np.ndarray) -> np.ndarray:
    """``a`` little-endian and C-contiguous (0-d stays 0-d), its dtype one of ``DTYPES``."""
    p = np.asarray(a)
    if p.dtype.str[0] == ">":
        p = p.astype(p.dtype.newbyteorder("<"))
    if p.dtype.str not in DTYPES:
        raise ValueError(f"dtype {p.dtype.str!r} cannot be packed; allowed: {sorted(DTYPES)}")
    return p if p.flags.c_contiguous else p.copy(order="C")


class Layout(NamedTuple):
    """One packed array's dtype and shape, read from the header alone."""

    dtype: np.dtype
    shape: tuple[int, ...]


def unpack(record: ArrayRecord) -> list[np.ndarray]:
    """The arrays of a packed record (writable copies), or of a plain one; ValueError with
    the reason for a packed record that is not well formed."""
    if PACKED not in record:
        return record.to_numpy_ndarrays()
    buf = _buffer(record)
    layout, offset = _layout(buf)
    out = []
    for entry in layout:
        count = math.prod(entry.shape)
        out.append(np.frombuffer(buf, dtype=entry.dtype, count=count, offset=offset)
                   .reshape(entry.shape).copy())
        offset += _padded(entry.dtype.itemsize * count)
    return out


def shapes(record: ArrayRecord) -> list[Layout] | list[Array]:
    """Each array's shape without decoding the data (a client checks its saved state against
    the received model's shapes before it decodes the model)."""
    if PACKED not in record:
        return list(record.values())
    return _layout(_buffer(record))[0]


def _buffer(record: ArrayRecord) -> np.ndarray:
    if len(record) != 1:
        raise ValueError(f"a packed ArrayRecord holds only {PACKED!r}; it has "
                         f"{sorted(record.keys())}")
    buf = record[PACKED].numpy()
    if buf.dtype != np.uint8 or buf.ndim != 1:
        raise ValueError(f"packed array is {buf.dtype} of shape {buf.shape}; expected 1-D "
                         "uint8")
    return buf


def _layout(buf: np.ndarray) -> tuple[list[Layout], int]:
    """The header's entries, checked against the buffer's length, and the data's offset."""
    if buf.size < 8:
        raise ValueError(f"packed array of {buf.size} bytes has no header")
    size = int.from_bytes(buf[:8].tobytes(), "little")
    limit = min(MAX_HEADER, buf.size - 8)
    if not 2 <= size <= limit:
        raise ValueError(f"packed header length {size} is outside 2..{limit}")
    try:
        entries = json.loads(buf[8:8 + size].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"packed header is not JSON ({err})") from None
    if not isinstance(entries, list):
        raise ValueError("packed header is not a list of [dtype, shape]")
    layout, start = [], _padded(8 + size)
    offset = start
    for entry in entries:
        item = _entry(entry)
        nbytes = item.dtype.itemsize * math.prod(item.shape)
        if offset + nbytes > buf.size:
            raise ValueError(f"packed array {len(layout)} ({item.dtype.str} {item.shape}) runs "
                             f"past the buffer's {buf.size} bytes")
        layout.append(item)
        offset += _padded(nbytes)
    if offset != buf.size:
        raise ValueError(f"packed buffer has {buf.size} bytes; its header describes {offset}")
    return layout, start


def _entry(entry: object) -> Layout:
    if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
            or not isinstance(entry[1], list)):
        raise ValueError(f"packed header entry {str(entry)[:60]!r} is not [dtype, shape]")
    if entry[0] not in DTYPES:
        raise ValueError(f"packed dtype {entry[0][:20]!r} is not one of {sorted(DTYPES)}")
    dims = entry[1]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ValueError(f"packed shape {str(dims)[:60]} is not a list of non-negative ints")
    return Layout(np.dtype(entry[0]), tuple(dims))
