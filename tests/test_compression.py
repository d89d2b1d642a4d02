"""``fedinit.methods.compression``: the quantiser is unbiased (the mean of many decodes is the
vector),
top-k sends the k largest of x + residual and its error feedback loses nothing (residual +
sent = meant, every round and summed over rounds), the server decodes exactly what the device
meant to send, refuses a malformed upload in one line, and q8 carries ~4x fewer bytes."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from fedinit.methods.compression import Compression, CompressionError, Quantiser

SHAPES = [(8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (10, 400), (10,)]


def vector(seed: int, shapes: list[tuple[int, ...]] = SHAPES) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [g.normal(scale=0.1, size=s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("spec", ["q8", "q4", "q4/64", "q8/7", "q2", "q1", "q2/16"])
def test_the_quantiser_is_unbiased_and_on_its_grid(spec: str) -> None:
    codec = Compression.parse(spec)
    assert codec is not None and codec.quantiser is not None
    q = codec.quantiser
    x = vector(0, [(300,)])
    g = np.random.default_rng(1)
    draws = np.stack([codec.encode(x, g)[1][0] for _ in range(3000)]).astype(np.float64)
    # the grid by hand: scale s = max |x| over each block, values (2c / L - 1) s, c in 0..L
    n, size = 300, 300 if q.block == 0 else q.block
    s = np.repeat([np.abs(x[0][i:i + size]).max() for i in range(0, n, size)], size)[:n]
    levels = 2 ** q.bits - 1
    c = (draws / s + 1) / 2 * levels
    assert np.allclose(c, np.round(c), atol=1e-3) and c.min() > -1e-3 and c.max() < levels + 1e-3
    step = 2 * s / levels
    # each draw is within one step of x; their mean within 5 sigma of x (sigma <= step/2/sqrt(N))
    assert np.all(np.abs(draws - x[0]) <= step + 1e-7)
    assert np.all(np.abs(draws.mean(axis=0) - x[0]) <= 5 * step / 2 / math.sqrt(3000))


def test_the_server_decodes_what_the_device_meant_to_send() -> None:
    for spec in ["q8", "q4/32", "topk:0.1", "topk:0.05+q8", "topk:0.2+q4/16"]:
        codec = Compression.parse(spec)
        assert codec is not None
        x = vector(2)
        wire, decoded, _ = codec.encode(x, np.random.default_rng(3), None)
        got = codec.decode(wire, [t.shape for t in x])
        assert all(np.array_equal(a, b) for a, b in zip(got, decoded, strict=True)), spec
        assert sum(a.nbytes for a in wire) == codec.wire_bytes([t.shape for t in x]), spec


def test_topk_sends_the_k_largest_of_x_plus_the_residual() -> None:
    codec = Compression.parse("topk:0.25")
    assert codec is not None
    x, e = [np.array([0.1, -0.9, 0.3, 0.05, 0.2, -0.4, 0.0, 0.6], np.float32)], \
        [np.array([0.0, 0.0, 0.0, 0.7, 0.0, 0.0, 0.0, 0.0], np.float32)]
    wire, sent, residual = codec.encode(x, np.random.default_rng(0), e)
    # v = x + e = [0.1, -0.9, 0.3, 0.75, 0.2, -0.4, 0, 0.6]; k = ceil(0.25 * 8) = 2: -0.9, 0.75
    assert wire[0].tolist() == [1, 3]
    assert np.allclose(sent[0], [0, -0.9, 0, 0.75, 0, 0, 0, 0])
    assert np.allclose(residual[0], [0.1, 0, 0.3, 0, 0.2, -0.4, 0, 0.6], atol=1e-7)


@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.05+q8", "topk:0.1+q4/64"])
def test_error_feedback_loses_nothing_over_rounds(spec: str) -> None:
    codec = Compression.parse(spec)
    assert codec is not None
    g = np.random.default_rng(4)
    residual: list[np.ndarray] | None = None
    meant = [np.zeros(s, np.float64) for s in SHAPES]
    sent_total = [np.zeros(s, np.float64) for s in SHAPES]
    for r in range(6):
        x = vector(10 + r)
        before = [np.zeros(s, np.float32) for s in SHAPES] if residual is None else residual
        _, sent, residual = codec.encode(x, g, residual)
        for i in range(len(SHAPES)):  # this round: residual' + sent = x + residual
            assert np.allclose(residual[i].astype(np.float64) + sent[i],
                               x[i].astype(np.float64) + before[i], atol=1e-6)
            meant[i] += x[i]
            sent_total[i] += sent[i]
    for i in range(len(SHAPES)):  # over all rounds: what was sent + what is left = all meant
        assert np.allclose(sent_total[i] + residual[i], meant[i], atol=1e-5)


def test_q8_carries_four_times_fewer_bytes_and_topk_one_percent_fifty() -> None:
    shapes = [t.shape for t in vector(0)]
    plain = 4 * sum(math.prod(s) for s in shapes)
    q8, top = Compression.parse("q8"), Compression.parse("topk:0.01+q8")
    assert q8 is not None and top is not None
    assert plain / q8.wire_bytes(shapes) >= 3.9
    assert plain / top.wire_bytes(shapes) >= 50 * 0.5  # small tensors keep at least one value


def test_q4_packs_two_codes_a_byte() -> None:
    q = Quantiser(4)
    wire, _ = q.encode(np.arange(-5, 6, dtype=np.float64), np.random.default_rng(0))
    assert wire[0].dtype == np.uint8 and wire[0].size == 6  # 11 codes
    codes = np.concatenate([wire[0] & 0x0F, wire[0] >> 4])
    assert codes.max() <= 15


@pytest.mark.parametrize(("spec", "damage", "message"), [
    ("q8", lambda w: w[:-1], "11 arrays is not allowed; allowed: 12"),
    ("q8", lambda w: [w[0].astype(np.int8), *w[1:]], "upload tensor 0 codes: int8[72]"),
    ("q8", lambda w: [w[0], np.array([np.nan], np.float32), *w[2:]],
     "upload tensor 0: a scale is negative or not finite"),
    ("q8", lambda w: [w[0], np.array([-1.0], np.float32), *w[2:]],
     "upload tensor 0: a scale is negative or not finite"),
    ("topk:0.1", lambda w: [np.full_like(w[0], 10_000), *w[1:]],
     "upload tensor 0: indices out of 0..71 or not strictly ascending"),
    ("topk:0.1", lambda w: [w[0][::-1].copy(), *w[1:]],
     "upload tensor 0: indices out of 0..71 or not strictly ascending"),
    ("topk:0.1", lambda w: [np.zeros_like(w[0]), *w[1:]],
     "upload tensor 0: indices out of 0..71 or not strictly ascending"),
    ("topk:0.1", lambda w: [w[0].astype(np.int32), *w[1:]],
     "upload tensor 0 indices: int32[8] is not allowed; allowed: uint16[8]"),
    ("topk:0.1", lambda w: [w[0], np.full_like(w[1], np.inf), *w[2:]],
     "upload tensor 0: a value is not finite"),
])
def test_a_malformed_upload_is_refused_in_one_line(spec: str, damage: object,
                                                   message: str) -> None:
    codec = Compression.parse(spec)
    assert codec is not None
    x = vector(5)
    wire, _, _ = codec.encode(x, np.random.default_rng(0))
    with pytest.raises(CompressionError, match=re.escape(message)):
        codec.decode(damage(wire), [t.shape for t in x])  # type: ignore[operator]


@pytest.mark.parametrize("text", ["q3", "q16", "q8/0", "topk:0", "topk:1.5", "topk:x",
                                  "topk:0.1:0", "topk:0.1:", "topk:0.1:x", "topk:0.1:2:3",
                                  "q8+topk:0.1", "topk:0.1+topk:0.2", "zip", ""])
def test_a_bad_setting_is_refused_naming_what_is_allowed(text: str) -> None:
    with pytest.raises(CompressionError, match=rf"^compression={re.escape(repr(text))} is not "
                                               "allowed; allowed: off \\| qB \\(B = 8, 4, 2, 1\\)"):
        Compression.parse(text)


def test_the_settings_parse_as_named() -> None:
    assert Compression.parse("off") is None
    assert Compression.parse("q8") == Compression(None, Quantiser(8, 0))
    assert Compression.parse("q4/256") == Compression(None, Quantiser(4, 256))
    assert Compression.parse("topk:0.01+q8") == Compression(0.01, Quantiser(8, 0))
    assert Compression.parse("topk:0.01:80+q8") == Compression(0.01, Quantiser(8, 0), 80)
    assert Compression.parse("topk:0.01") == Compression.parse("topk:0.01:1")


def test_topk_with_a_floor_keeps_at_least_m_values_of_every_tensor() -> None:
    """topk:0.1:3 on 8 values: k = max(3, ceil(0.8)) = 3, the three largest |v|; on 2 values
    both (k = min(n, 3)); on 100 values ceil(0.1 * 100) = 10 > 3."""
    codec = Compression.parse("topk:0.1:3")
    assert codec is not None
    x = [np.array([0.1, -0.9, 0.3, 0.05, 0.2, -0.4, 0.0, 0.6], np.float32),
         np.array([0.5, -0.25], np.float32), np.linspace(-1, 1, 100, dtype=np.float32)]
    wire, decoded, residual = codec.encode(x, np.random.default_rng(0))
    f32 = np.float32
    assert wire[0].tolist() == [1, 5, 7] and np.array_equal(wire[1], f32([-0.9, -0.4, 0.6]))
    assert np.array_equal(decoded[0], f32([0, -0.9, 0, 0, 0, -0.4, 0, 0.6]))
    assert np.array_equal(residual[0], f32([0.1, 0, 0.3, 0.05, 0.2, 0, 0, 0]))
    assert wire[2].tolist() == [0, 1] and np.array_equal(residual[1], [0, 0])
    assert wire[4].tolist() == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
    assert [w.dtype for w in wire[0::2]] == [np.uint16] * 3
    # 3 + 2 + 10 kept values: a uint16 index (2 bytes) and a float32 value each
    assert codec.wire_bytes([t.shape for t in x]) == 6 * 15 == sum(a.nbytes for a in wire)



def test_the_wire_bytes_of_the_test_model_worked_out_by_hand() -> None:
    """SHAPES hold 72, 8, 1152, 16, 4000 and 10 values (5,258 in 6 tensors)."""
    shapes = [t.shape for t in vector(0)]
    by_spec = {"q8": 5258 + 4 * 6,  # a byte a value, a float32 scale a tensor
               "q4": (36 + 4 + 576 + 8 + 2000 + 5) + 4 * 6,  # two values a byte, rounded up
               "q2": (18 + 2 + 288 + 4 + 1000 + 3) + 4 * 6,  # four a byte
               "q1": (9 + 1 + 144 + 2 + 500 + 2) + 4 * 6,  # eight a byte
               "q8/100": 5258 + 4 * (1 + 1 + 12 + 1 + 40 + 1),  # a scale per 100 values
               # k = ceil(0.01 n) = 1, 1, 12, 1, 40, 1: a uint16 index (every tensor holds
               # at most 65,536 values) and a float32 value each
               "topk:0.01": 6 * 56,
               # the same k, each value a byte, a scale per tensor
               "topk:0.01+q8": 2 * 56 + 56 + 4 * 6,
               # k = min(n, max(16, ceil(0.01 n))) = 16, 8, 16, 16, 40, 10 (106 in all)
               "topk:0.01:16+q8": 2 * 106 + 106 + 4 * 6}
    for spec, want in by_spec.items():
        codec = Compression.parse(spec)
        assert codec is not None
        assert codec.wire_bytes(shapes) == want, spec
        wire, _, _ = codec.encode(vector(1), np.random.default_rng(0))
        assert sum(a.nbytes for a in wire) == want, spec


def test_a_tensor_of_more_than_65536_values_sends_int32_indices() -> None:
    """70,000 values, topk:0.01: k = 700, each a 4-byte index and a float32 value."""
    codec = Compression.parse("topk:0.01")
    assert codec is not None
    x = [np.random.default_rng(0).normal(size=70_000).astype(np.float32)]
    wire, decoded, _ = codec.encode(x, np.random.default_rng(1))
    assert wire[0].dtype == np.int32 and wire[0].size == 700
    assert codec.wire_bytes([(70_000,)]) == 8 * 700 == sum(a.nbytes for a in wire)
    assert np.array_equal(codec.decode(wire, [(70_000,)])[0], decoded[0])


def test_narrow_codes_pack_the_first_into_the_lowest_bits() -> None:
    """2-bit codes 0, 1, 2, 3, 1: 0 | 1 << 2 | 2 << 4 | 3 << 6 = 228, then 1; 1-bit codes
    1, 0, 1, 1, 0, 0, 0, 1, 1: 1 + 4 + 8 + 128 = 141, then 1."""
    for bits, codes, packed in [(2, [0, 1, 2, 3, 1], [228, 1]),
                                (1, [1, 0, 1, 1, 0, 0, 0, 1, 1], [141, 1])]:
        q = Quantiser(bits)
        assert q._pack(np.array(codes, np.uint8)).tolist() == packed
        assert q._unpack(np.array(packed, np.uint8), len(codes)).tolist() == codes
        assert q.code_bytes(len(codes)) == len(packed)
