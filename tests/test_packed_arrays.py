"""One packed Array per record: exact round trips, fewer wire objects, malformed packs refused."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import ALIGN, PACKED, pack, shapes, unpack
from tests.test_reply_bounds import W_T, answer, cid, final, send, server

RNG = np.random.default_rng(3)
MIXED = [RNG.standard_normal((8, 1, 5, 5)).astype(np.float32),
         RNG.standard_normal(8).astype(np.float64),
         np.arange(7, dtype=np.int64), np.array(True), np.zeros((0, 3), np.float32),
         np.asfortranarray(RNG.standard_normal((3, 4)).astype(np.float32)),
         RNG.standard_normal((4, 6)).astype(np.float32)[:, ::2],  # not contiguous
         np.arange(5, dtype=">i4")]  # big-endian: sent little-endian, same values


def test_every_array_comes_back_with_its_dtype_shape_and_values() -> None:
    got = unpack(pack(MIXED))
    assert len(got) == len(MIXED)
    for want, have in zip(MIXED, got, strict=True):
        assert have.shape == want.shape
        assert have.dtype == want.dtype.newbyteorder("<")
        np.testing.assert_array_equal(have, want)
        assert have.flags.writeable and have.flags.c_contiguous


def test_the_layout_is_the_documented_one() -> None:
    """Read back by hand from the bytes: header length, JSON header, 16-byte aligned data."""
    a, b = np.arange(3, dtype=np.float32), np.array([[1, 2]], dtype=np.int64)
    buf = pack([a, b])[PACKED].numpy().tobytes()
    size = int.from_bytes(buf[:8], "little")
    assert json.loads(buf[8:8 + size]) == [["<f4", [3]], ["<i8", [1, 2]]]
    start = -(-(8 + size) // ALIGN) * ALIGN
    assert buf[start:start + 12] == a.tobytes()
    assert buf[start + 16:start + 32] == b.tobytes()
    assert len(buf) == start + 32


def test_a_plain_record_is_read_as_flower_s_list() -> None:
    got = unpack(ArrayRecord(list(W_T)))
    for want, have in zip(W_T, got, strict=True):
        np.testing.assert_array_equal(have, want)


def test_a_message_holds_far_fewer_wire_objects() -> None:
    """The default CNN's 8 tensors: Flower stores 2 objects per array (Array and chunk)."""
    model = [np.zeros(s, np.float32) for s in
             [(8, 1, 5, 5), (8,), (16, 8, 5, 5), (16,), (64, 784), (64,), (10, 64), (10,)]]

    def objects(record: ArrayRecord) -> int:
        return len(get_all_nested_objects(RecordDict({rk.ARRAYS: record,
                                                      rk.CONFIG: ConfigRecord({"a": 1})})))

    assert objects(ArrayRecord(model)) == 2 * len(model) + 3
    assert objects(pack(model)) == 2 + 3


def packed_bytes(buf: bytes) -> ArrayRecord:
    return ArrayRecord({PACKED: Array(np.frombuffer(buf, dtype=np.uint8).copy())})


def header(entries: object, data: bytes = b"") -> bytes:
    text = json.dumps(entries).encode()
    pad = -(-(8 + len(text)) // ALIGN) * ALIGN - 8 - len(text)
    return len(text).to_bytes(8, "little") + text + b"\0" * pad + data


@pytest.mark.parametrize(("record", "reason"), [
    (packed_bytes(b"\1\0"), "has no header"),
    (packed_bytes((10**9).to_bytes(8, "little") + b"[]" + b"\0" * 6), "header length"),
    (packed_bytes(header("x")[:8] + b"\xff\xfe" + header("x")[10:]), "not JSON"),
    (packed_bytes(header({"a": 1})), "not a list"),
    (packed_bytes(header([["<f4"]])), "is not [dtype, shape]"),
    (packed_bytes(header([["object", [1]]])), "is not one of"),
    (packed_bytes(header([["<f4", [-1]]])), "non-negative ints"),
    (packed_bytes(header([["<f4", [1.5]]])), "non-negative ints"),
    (packed_bytes(header([["<f4", [10**12]]], b"\0" * 16)), "runs past"),
    (packed_bytes(header([["<f4", [2]]], b"\0" * 32)), "its header describes"),
    (ArrayRecord({PACKED: Array(np.zeros(4, np.float32))}), "expected 1-D uint8"),
    (ArrayRecord({PACKED: Array(np.zeros(16, np.uint8)), "x": Array(np.zeros(1))}),
     "holds only"),
])
def test_a_malformed_pack_is_refused_with_its_reason(record: ArrayRecord, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        unpack(record)


def test_the_server_rejects_a_reply_whose_pack_is_malformed_and_aggregates_the_rest() -> None:
    s = server()
    msgs = send(s, 1)
    replies = [answer(m, final(W_T, cid(m))) for m in msgs]
    bad = replies[1].content
    bad.array_records[rk.ARRAYS] = packed_bytes(header([["<f4", [3]]], b"\0" * 32))
    got, metrics = s.aggregate_train(1, replies)
    assert got is not None and metrics is not None
    assert metrics[rk.NUM_REJECTED] == 1 and metrics[rk.NUM_REPLIES] == len(msgs) - 1


def test_shapes_are_read_from_the_header_alone() -> None:
    record = pack(MIXED)
    assert [s.shape for s in shapes(record)] == [a.shape for a in MIXED]
    assert [s.shape for s in shapes(ArrayRecord(list(W_T)))] == [a.shape for a in W_T]


def test_a_dtype_the_receiver_would_refuse_is_refused_by_the_sender() -> None:
    with pytest.raises(ValueError, match=re.escape("dtype '<c8' cannot be packed")):
        pack([np.zeros(2, np.complex64)])
