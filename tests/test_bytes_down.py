"""``bytes-down`` (strategies/download_bytes.py) against the serialized size worked out by hand.

Flower 1.39 deflates each object of a message's content to ``<type> <child ids> <body
length>\\0<body>`` (child ids: 64 hex characters each, comma-joined). The small message here:
a packed model of three float32 values and a config of one int, its sizes counted below from
that format, the npy format and the protobuf wire format, not read from Flower.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Error, Message, MessageType, RecordDict

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import pack
from strategies.download_bytes import content_bytes

ID = 64
"""Hex characters of an object id (SHA-256)."""


def head(type_name: str, children: int, body: int) -> int:
    """Bytes of an object's header: type, space, child ids (comma-joined), space, body
    length in decimal, the NUL divider."""
    ids = children * ID + max(children - 1, 0)
    return len(type_name) + 1 + ids + 1 + len(str(body)) + 1


def pad16(n: int) -> int:
    return -(-n // 16) * 16


def small_message(values: int = 3, node: int = 1) -> Message:
    set_task_identity()  # a Message needs one, as inside a real run
    content = RecordDict({rk.ARRAYS: pack([np.arange(values, dtype=np.float32)]),
                          rk.CONFIG: ConfigRecord({rk.ROUND: 1})})
    return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)


def hand_size(values: int = 3) -> int:
    """The small message's content with a model of ``values`` float32s, object by object."""
    # the packed buffer (fedinit/methods/packed_arrays.py): an 8-byte length and the JSON header
    # [["<f4",[values]]], padded to 16; the data bytes, padded to 16
    packed = pad16(8 + len(f'[["<f4",[{values}]]]')) + pad16(4 * values)
    # the Array's data is np.save's: a 128-byte npy v1 header (10 bytes + the dict, padded
    # to a multiple of 64) before the uint8 values; one chunk (under Flower's 5 MB)
    chunk_body = 128 + packed
    chunk = head("ArrayChunk", 0, chunk_body) + chunk_body
    array_body = len(f'{{"dtype": "uint8", "shape": [{packed}], "stype": "numpy.ndarray", '
                     '"arraychunk_ids": [0]}')
    array = head("Array", 1, array_body) + array_body
    record_body = len('{"packed": "') + ID + len('"}')
    record = head("ArrayRecord", 1, record_body) + record_body
    # ConfigRecord {items: [Item{key: "server-round", value: {sint64: 1}}]} in protobuf:
    # key: tag + length + 12 bytes = 14; value: tag + length + (tag + zigzag(1) = 2) = 4;
    # the Item 18, in the repeated field: tag + length + 18 = 20
    config_body = 2 + (2 + len(rk.ROUND)) + 4
    config = head("ConfigRecord", 0, config_body) + config_body
    dict_body = len('{"arrays": "') + ID + len('", "config": "') + ID + len('"}')
    record_dict = head("RecordDict", 2, dict_body) + dict_body
    return chunk + array + record + config + record_dict


def test_one_message_is_its_objects_serialized_sizes() -> None:
    # 3 values: packed 32 + 16 = 48; chunk 16 + 176; array 74 + 82; record 80 + 78;
    # config 17 + 20; dict 145 + 156
    assert hand_size(3) == 192 + 156 + 158 + 37 + 301
    assert content_bytes([small_message(3)]) == hand_size(3)
    # 300,000 values: the model is most of it (1.2 MB in one chunk)
    assert content_bytes([small_message(300_000)]) == hand_size(300_000)
    assert hand_size(300_000) - 4 * 300_000 < 1_000


def test_a_shared_model_counts_once_per_message_and_an_error_message_nothing() -> None:
    one, two = small_message(node=1), small_message(node=2)
    two.content[rk.ARRAYS] = one.content[rk.ARRAYS]  # the round's global model, shared
    error = Message(Error(code=1, reason="x"), reply_to=small_message(node=3))
    assert content_bytes([one, two, error]) == 2 * hand_size()
    assert content_bytes([]) == 0
