"""``fedinit.methods.elias_fano`` and ``topk:...+ef``: a hand-worked encoding, every set of
indices comes back as it went, the size stays within Elias-Fano's bound of 2 + log2(n / k)
bits an index, a malformed or non-canonical array is refused in one line, and top-k with coded
indices decodes and leaves on the device exactly what top-k with uint16 indices does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedinit.methods import elias_fano
from fedinit.methods.compression import Compression, CompressionError


def test_a_hand_worked_encoding() -> None:
    """n = 16, indices 1, 5, 7: L = floor(log2(16 / 3)) = 2 low bits each (01, 01, 11), high
    parts 0, 1, 1 set bits 0, 2, 3 of a 3 + (15 >> 2) = 6-bit upper array: 1011 0000 = 176,
    then the low bits 01 01 11 and two zero bits of padding: 0101 1100 = 92."""
    code = elias_fano.encode(np.array([1, 5, 7]), 16)
    assert code.dtype == np.uint8 and code.tolist() == [176, 92]
    assert elias_fano.encoded_bytes(16, 3) == 2
    assert elias_fano.decode(code, 16, 3, "t").tolist() == [1, 5, 7]


@pytest.mark.parametrize(("n", "k"), [(1, 1), (8, 8), (10, 3), (72, 16), (4000, 40),
                                      (65_536, 1), (65_536, 655), (70_000, 700),
                                      (50_176, 1_254), (200, 199)])
def test_every_set_comes_back_within_the_bound(n: int, k: int) -> None:
    g = np.random.default_rng(n + k)
    for _ in range(5):
        idx = np.sort(g.choice(n, size=k, replace=False))
        code = elias_fano.encode(idx, n)
        assert code.size == elias_fano.encoded_bytes(n, k)
        assert np.array_equal(elias_fano.decode(code, n, k, "t"), idx)
    # Elias-Fano's bound: at most 2 + ceil(log2(n / k)) bits an index, plus a byte per part
    # of rounding; below uint16's 16 bits whenever n / k < 2^13
    assert 8 * code.size <= k * (2 + math.ceil(math.log2(n / k))) + 16
    if n / k < 2 ** 13:
        assert code.size < 2 * k


def test_the_extremes_take_their_own_ends() -> None:
    for idx, n in [([0], 1), ([0, 1, 2], 3), ([9], 10), ([0], 10), ([65_535], 65_536)]:
        code = elias_fano.encode(np.array(idx), n)
        assert elias_fano.decode(code, n, len(idx), "t").tolist() == idx
    assert elias_fano.encode(np.zeros(0, np.int64), 5).size == 0
    assert elias_fano.decode(np.zeros(0, np.uint8), 5, 0, "t").size == 0


def test_a_malformed_or_non_canonical_array_is_refused_in_one_line() -> None:
    good = elias_fano.encode(np.array([1, 5, 7]), 16)  # [176, 92], see above
    cases = {
        "wrong dtype": (good.astype(np.int16), "is not allowed; allowed: uint8[2]"),
        "wrong size": (np.concatenate([good, [0]]).astype(np.uint8), "uint8[3] is not"),
        "a fourth set bit": (np.array([176 | 0b100, 92], np.uint8),
                             "4 set bits ending at bit 5"),
        # bits 0, 2 and 7: three, but bit 7 is past the 6-bit upper array
        "a padding bit of the upper part": (np.array([0b10100001, 92], np.uint8),
                                            "3 set bits ending at bit 7"),
        "a padding bit of the low part": (np.array([176, 92 | 1], np.uint8), "padding bit"),
        # indices 1, 1, 7: the second index's low bits 01 -> the high part 1 gives 5; set
        # the first index's high part to 1 too: bits 1, 2, 3 -> 5, 5, 7
        "a repeated index": (np.array([0b01110000, 92], np.uint8), "not strictly ascending"),
    }
    for what, (code, says) in cases.items():
        with pytest.raises(elias_fano.EliasFanoError) as err:
            elias_fano.decode(code, 16, 3, "t")
        assert says in str(err.value) and "\n" not in str(err.value), what
    # n = 10, one index: 3 low bits and a 2-bit upper array; high 1, low 7 would be 15
    with pytest.raises(elias_fano.EliasFanoError, match="out of 0..9"):
        elias_fano.decode(np.array([0b01000000, 0b11100000], np.uint8), 10, 1, "t")


SHAPES = [(8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (10, 400), (10,)]


def vector(seed: int) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [g.normal(scale=0.1, size=s).astype(np.float32) for s in SHAPES]


@pytest.mark.parametrize(("spec", "coded_spec"), [("topk:0.05", "topk:0.05+ef"),
                                                  ("topk:0.01:16+q8", "topk:0.01:16+ef+q8"),
                                                  ("topk:0.2+q4/16", "topk:0.2+ef+q4/16")])
def test_coded_indices_send_what_uint16_indices_send(spec: str, coded_spec: str) -> None:
    """Lossless: with the same draws the server decodes the same vector and the device keeps
    the same residual; the coded upload decodes through the server's ``decode``."""
    plain, coded = Compression.parse(spec), Compression.parse(coded_spec)
    assert plain is not None and coded is not None and coded.elias_fano
    x, e = vector(1), vector(2)
    wire_p, dec_p, res_p = plain.encode(x, np.random.default_rng(0), e)
    wire_c, dec_c, res_c = coded.encode(x, np.random.default_rng(0), e)
    assert all(np.array_equal(a, b) for a, b in zip(dec_p, dec_c, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(res_p, res_c, strict=True))
    got = coded.decode(wire_c, SHAPES)
    assert all(np.array_equal(a, b) for a, b in zip(got, dec_c, strict=True))
    assert sum(a.nbytes for a in wire_c) == coded.wire_bytes(SHAPES)
    assert coded.wire_bytes(SHAPES) < plain.wire_bytes(SHAPES)


def test_the_wire_bytes_of_coded_indices_worked_out_by_hand() -> None:
    """topk:0.01:16+ef+q8 on SHAPES (72, 8, 1152, 16, 4000, 10 values): k = 16, 8, 16, 16,
    40, 10. Per tensor L = floor(log2(n / k)) and upper bits k + ((n - 1) >> L):
    72/16: L 2, 33 bits (5 bytes) + 32 low bits (4) = 9; 8/8: L 0, 15 bits = 2;
    1152/16: L 6, 33 bits (5) + 96 (12) = 17; 16/16: L 0, 31 bits = 4;
    4000/40: L 6, 102 bits (13) + 240 (30) = 43; 10/10: L 0, 19 bits = 3. Indices 78 bytes
    (uint16: 212), values a byte each (106), a float32 scale per tensor (24)."""
    codec = Compression.parse("topk:0.01:16+ef+q8")
    assert codec is not None
    assert codec.wire_bytes(SHAPES) == 78 + 106 + 24
    wire, _, _ = codec.encode(vector(3), np.random.default_rng(0))
    assert [a.size for a in wire[0::3]] == [9, 2, 17, 4, 43, 3]


def test_the_server_refuses_a_coded_upload_that_does_not_decode() -> None:
    codec = Compression.parse("topk:0.05+ef")
    assert codec is not None
    wire, _, _ = codec.encode(vector(4), np.random.default_rng(0))
    bad = list(wire)
    bad[8] = np.concatenate([bad[8], np.zeros(1, np.uint8)])  # tensor 4's indices
    with pytest.raises(CompressionError, match=r"upload tensor 4 indices: uint8\[\d+\] is not"):
        codec.decode(bad, SHAPES)
    bad[8] = np.full_like(wire[8], 255)
    with pytest.raises(CompressionError, match="upload tensor 4 indices: the upper bits"):
        codec.decode(bad, SHAPES)


@pytest.mark.parametrize("text", ["ef", "ef+topk:0.1", "q8+ef", "topk:0.1+q8+ef",
                                  "topk:0.1+ef+ef", "topk:0.1+EF"])
def test_ef_only_codes_topk_indices(text: str) -> None:
    with pytest.raises(CompressionError, match="topk:F\\[:M\\]\\+ef"):
        Compression.parse(text)


def test_ef_parses_beside_the_floor_and_the_quantiser() -> None:
    codec = Compression.parse("topk:0.04:80+ef+q8/64")
    assert codec is not None
    assert (codec.topk, codec.least, codec.elias_fano) == (0.04, 80, True)
    assert codec.quantiser is not None and (codec.quantiser.bits, codec.quantiser.block) == \
        (8, 64)
    assert not Compression.parse("topk:0.04:80+q8").elias_fano  # type: ignore[union-attr]
