"""Decoders for the AMQP types azure-eventhub's own decoder lacks: char, decimal32, decimal64.

Why: the SDK's pure-Python AMQP decoder (``azure.eventhub._pyamqp._decode``; seen in azure-eventhub 5.15.1, the
version this project tests with; pyproject allows >=5.12,<6) looks every value's constructor byte up in a
256-entry table, and the entries of three AMQP 1.0 primitive types are empty: 0x73 char, 0x74 decimal32, 0x84
decimal64. A message carrying one of them as an application property (any producer may send one) makes the
receive link fail with ``TypeError: 'NoneType' object is not callable`` before the fleet sees the message; the SDK
reconnects at the same position and fails again, for ever: the partition stops. Filling the three entries lets the
message through, where the fleet checks its properties like any other (a known property of the wrong type is an
invalid message; an unknown one is tolerated).

A workaround, to be reported upstream, pinned to that version range: ``install`` fills only entries that are still
empty, so an SDK that fixes this keeps its own decoders, and an SDK without that table leaves it a no-op. Values
are decoded per the AMQP 1.0 types specification (section 1.6): char as the UTF-32 code point, decimals as IEEE
754-2008 with the binary integer significand.
"""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

CHAR, DECIMAL32, DECIMAL64 = 0x73, 0x74, 0x84
_U32, _U64 = struct.Struct(">I"), struct.Struct(">Q")


def install() -> list[int]:
    """Fill the SDK decoder table's empty entries for char, decimal32 and decimal64; the constructors filled."""
    try:
        from azure.eventhub._pyamqp import _decode  # noqa: PLC0415 - the fleet's receive path only; private by necessity
    except ImportError:
        return []
    table: list[Any] | None = getattr(_decode, "_DECODE_BY_CONSTRUCTOR", None)  # the one table the decoder reads
    if not isinstance(table, list) or len(table) != 256:
        return []
    filled = []
    for constructor, decoder in ((CHAR, decode_char), (DECIMAL32, decode_decimal32), (DECIMAL64, decode_decimal64)):
        if table[constructor] is None:
            table[constructor] = decoder
            filled.append(constructor)
    return filled


def decode_char(buffer: memoryview) -> tuple[memoryview, str]:
    """A UTF-32 code point; one past Unicode's range becomes U+FFFD (Python's chr would raise)."""
    point = _U32.unpack(buffer[:4])[0]
    return buffer[4:], chr(point) if point <= 0x10FFFF else "\ufffd"


def decode_decimal32(buffer: memoryview) -> tuple[memoryview, Decimal]:
    return buffer[4:], _bid(_U32.unpack(buffer[:4])[0], 32, 8, 101)


def decode_decimal64(buffer: memoryview) -> tuple[memoryview, Decimal]:
    return buffer[8:], _bid(_U64.unpack(buffer[:8])[0], 64, 10, 398)


def _bid(bits: int, width: int, exponent_bits: int, bias: int) -> Decimal:
    """IEEE 754-2008 decimal with a binary integer significand (decimal32: 8 exponent bits, bias 101; decimal64: 10
    and 398)."""
    sign = bits >> (width - 1)
    if (bits >> (width - 3)) & 0b11 == 0b11:
        if (bits >> (width - 5)) & 0b11 == 0b11:  # infinity or NaN
            if (bits >> (width - 6)) & 1:
                return Decimal("NaN")
            return Decimal("-Infinity" if sign else "Infinity")
        trailing = width - 3 - exponent_bits
        exponent = (bits >> trailing) & ((1 << exponent_bits) - 1)
        coefficient = (0b100 << trailing) | (bits & ((1 << trailing) - 1))
    else:
        trailing = width - 1 - exponent_bits
        exponent = (bits >> trailing) & ((1 << exponent_bits) - 1)
        coefficient = bits & ((1 << trailing) - 1)
    return Decimal((sign, tuple(int(digit) for digit in str(coefficient)), exponent - bias))
