"""The AMQP decoders the fleet adds to azure-eventhub's decoder table: char, decimal32, decimal64."""

from __future__ import annotations

from decimal import Decimal

import pytest
from azure.eventhub._pyamqp import _decode

from se_exporter.infra.azure import amqp_types

# The reference encoder is python-qpid-proton, an integration dependency: a unit run without it skips this file.
proton = pytest.importorskip("proton")
Message, char, decimal32, decimal64 = proton.Message, proton.char, proton.decimal32, proton.decimal64


@pytest.fixture
def sdk_table(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The SDK's table as it ships (entries for the three types empty), replaced for this test only."""
    table = list(_decode._DECODE_BY_CONSTRUCTOR)
    for constructor in (amqp_types.CHAR, amqp_types.DECIMAL32, amqp_types.DECIMAL64):
        table[constructor] = None
    monkeypatch.setattr(_decode, "_DECODE_BY_CONSTRUCTOR", table)
    return table


def test_the_sdk_cannot_decode_these_types_and_the_fleet_fills_them(sdk_table: list[object]) -> None:
    """Without the decoders a char property fails the whole message; with them it reads as text and decimals as
    Decimal."""
    data = Message(body=b"{}", properties={"c": char("a"), "d32": decimal32(0x3280007B),
                                           "d64": decimal64(0x31C000000000007B)}).encode()
    with pytest.raises(TypeError, match="'NoneType' object is not callable"):
        _decode.decode_payload(memoryview(data))
    assert amqp_types.install() == [0x73, 0x74, 0x84]
    properties = _decode.decode_payload(memoryview(data)).application_properties
    assert properties == {b"c": "a", b"d32": Decimal(123), b"d64": Decimal(123)}


def test_only_empty_entries_are_filled(sdk_table: list[object]) -> None:
    """An SDK that decodes a type itself keeps its own decoder."""
    own = object()
    sdk_table[amqp_types.CHAR] = own
    assert amqp_types.install() == [0x74, 0x84]
    assert sdk_table[amqp_types.CHAR] is own


@pytest.mark.parametrize(("bits", "value"), [
    (0x3280007B, Decimal(123)), (0xB280007B, Decimal(-123)), (0x3300007B, Decimal("1.23E+3")),
    (0x7800_0000, Decimal("Infinity")), (0xF800_0000, Decimal("-Infinity")), (0x7C00_0000, Decimal("NaN")),
    (0x6CB8_9680, Decimal(10_000_000)),  # the "11" form: implicit 100 prefix, coefficient 8388608 + 1611392
])
def test_decimal32_is_ieee_754_with_a_binary_significand(bits: int, value: Decimal) -> None:
    """Values decode as IEEE 754-2008 decimal32 (BID), including the large-coefficient form and the specials."""
    _rest, decoded = amqp_types.decode_decimal32(memoryview(bits.to_bytes(4, "big")))
    assert decoded == value or (decoded.is_nan() and value.is_nan())


def test_a_char_past_unicode_is_a_replacement_character() -> None:
    """A code point past U+10FFFF cannot be a str: it reads as U+FFFD rather than raising."""
    assert amqp_types.decode_char(memoryview(b"\x7f\xff\xff\xff"))[1] == "\ufffd"
    assert amqp_types.decode_char(memoryview(b"\x00\x01\xf6\x00"))[1] == "\U0001f600"
