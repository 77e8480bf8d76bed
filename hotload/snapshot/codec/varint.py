"""Unsigned LEB128 integers, the payload's header fields, read with strict bounds."""

from __future__ import annotations

from hotload.errors import DecodeFailed

_MAX_VARINT_BYTES = 9  # 63 bits: every field of the format fits


def write_varint(value: int, into: bytearray) -> None:
    """Append ``value`` (0 ≤ value < 2**63) as unsigned LEB128."""
    if value < 0 or value >= 1 << 63:
        raise ValueError(f"varint out of range: {value}")
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            into.append(byte | 0x80)
        else:
            into.append(byte)
            return


class Reader:
    """A cursor over a payload that refuses to read past its end or accept padded varints."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def varint(self, *, limit: int, field: str) -> int:
        """The next varint, which must be ≤ ``limit``; :class:`DecodeFailed` otherwise."""
        value = 0
        for index in range(_MAX_VARINT_BYTES):
            if self.pos >= len(self.data):
                raise DecodeFailed("payload truncated in a header field", field=field)
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                if byte == 0 and index > 0:
                    raise DecodeFailed("payload has a non-canonical varint", field=field)
                if value > limit:
                    raise DecodeFailed(
                        "payload header field over its limit", field=field, value=value, limit=limit
                    )
                return value
        raise DecodeFailed("payload varint too long", field=field)

    def byte(self, *, field: str) -> int:
        if self.pos >= len(self.data):
            raise DecodeFailed("payload truncated in a header field", field=field)
        value = self.data[self.pos]
        self.pos += 1
        return int(value)

    def take(self, length: int, *, field: str) -> memoryview:
        """The next ``length`` bytes."""
        if length > len(self.data) - self.pos:
            raise DecodeFailed("payload shorter than its frames declare", field=field)
        view = self.data[self.pos : self.pos + length]
        self.pos += length
        return view

    def remaining(self) -> int:
        return len(self.data) - self.pos
