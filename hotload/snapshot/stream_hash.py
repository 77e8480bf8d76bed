"""xxh3-128 of one byte stream hashed in turns by several processes.

A sharded trainer holds each tensor's rows on different ranks, and the manifest must
name the xxh3-128 of the *whole* tensor — the value a single process hashing the
gathered tensor gets — because replicas compare it with what they rebuilt and engines
report their weights' digest from it. XXH3 cannot combine hashes of pieces, but its
state after a prefix is small: :class:`StreamHash` holds it (the 8 accumulators, the
stripe count, the last stripe and the < 64 bytes not consumed yet; at most 240 bytes of
a stream so short that XXH3 hashes it whole) and :meth:`StreamHash.to_bytes` carries it
to the rank that holds the next rows, which continues with :meth:`StreamHash.update`.

The long-input algorithm is implemented here from the XXH3 specification (the default
secret, seed 0); short streams (≤ 240 bytes) are hashed by the ``xxhash`` package, and
every result is checked against it in the tests. The stripe loop runs in C
(``_stream_hash.c``, without the GIL) when the native module is built, else in numpy.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import numpy as np
import xxhash

if TYPE_CHECKING:
    from typing_extensions import Buffer

STRIPE: Final = 64
STRIPES_PER_BLOCK: Final = 16
SHORT_MAX: Final = 240
"""Streams up to this long are hashed whole (XXH3's short and medium inputs)."""
LAST_STRIPE_SECRET: Final = 192 - STRIPE - 7
MASK: Final = (1 << 64) - 1

PRIME32_1: Final = 0x9E3779B1
PRIME32_2: Final = 0x85EBCA77
PRIME32_3: Final = 0xC2B2AE3D
PRIME64_1: Final = 0x9E3779B185EBCA87
PRIME64_2: Final = 0xC2B2AE3D27D4EB4F
PRIME64_3: Final = 0x165667B19E3779F9
PRIME64_4: Final = 0x85EBCA77C2B2AE63
PRIME64_5: Final = 0x27D4EB2F165667C5
PRIME_MX1: Final = 0x165667919E3779F9

SECRET: Final = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_INITIAL: Final = (
    PRIME32_3,
    PRIME64_1,
    PRIME64_2,
    PRIME64_3,
    PRIME64_4,
    PRIME32_2,
    PRIME64_5,
    PRIME32_1,
)
_MAGIC: Final = b"HX3\x01"
_HEAD: Final = struct.Struct("<4sQQ?BH")


def _words(data: bytes, offset: int, count: int = 8) -> tuple[int, ...]:
    return struct.unpack_from(f"<{count}Q", data, offset)


def _secret_rows() -> np.ndarray:
    """The secret's 8 words each stripe of a block is keyed with."""
    return np.array([_words(SECRET, 8 * n) for n in range(STRIPES_PER_BLOCK)], dtype=np.uint64)


_SECRET_ROWS: Final = _secret_rows()
_SCRAMBLE_KEY: Final = np.array(_words(SECRET, 192 - STRIPE), dtype=np.uint64)
_SWAP: Final = [1, 0, 3, 2, 5, 4, 7, 6]


def _stripes_numpy(acc: bytearray, done: int, data: Buffer) -> int:
    """The stripe loop in numpy: a block's stripes summed at once (their contributions
    add up), then the accumulators scrambled after each block's last stripe."""
    lanes = np.frombuffer(acc, dtype="<u8").copy()
    rows = np.frombuffer(memoryview(data), dtype="<u8").reshape(-1, 8)
    at = 0
    while at < len(rows):
        position = (done + at) % STRIPES_PER_BLOCK
        if position:  # finish the block begun before these stripes
            count = min(len(rows) - at, STRIPES_PER_BLOCK - position)
            sums = _block_sums(rows[at : at + count].reshape(1, count, 8), position)
        else:
            blocks = (len(rows) - at) // STRIPES_PER_BLOCK or 1
            count = min(len(rows) - at, blocks * STRIPES_PER_BLOCK)
            sums = _block_sums(rows[at : at + count].reshape(blocks, -1, 8), 0)
        for index, block in enumerate(sums):
            lanes += block
            full = index < len(sums) - 1 or (position + count) % STRIPES_PER_BLOCK == 0
            if full:
                lanes ^= lanes >> np.uint64(47)
                lanes ^= _SCRAMBLE_KEY
                lanes *= np.uint64(PRIME32_1)
        at += count
    acc[:] = lanes.astype("<u8").tobytes()
    return done + len(rows)


def _block_sums(blocks: np.ndarray, position: int) -> np.ndarray:
    """Per block (of stripes starting at ``position`` in their block), what its stripes
    add to each accumulator."""
    keyed = blocks ^ _SECRET_ROWS[position : position + blocks.shape[1]]
    products = (keyed & np.uint64(0xFFFFFFFF)) * (keyed >> np.uint64(32))
    result: np.ndarray = products.sum(axis=1, dtype=np.uint64)
    result += blocks.sum(axis=1, dtype=np.uint64)[:, _SWAP]
    return result


def _native() -> Callable[[bytearray, int, Buffer], int] | None:
    if sys.byteorder != "little":
        return None
    try:
        from hotload.snapshot import _stream_hash
    except ImportError:
        return None
    return _stream_hash.stripes


_NATIVE: Final = _native()


class StreamHash:
    """The xxh3-128 of everything given to :meth:`update`, across processes."""

    def __init__(self, *, native: bool = True) -> None:
        self.total = 0
        self.stripes = 0
        self.acc: bytearray | None = None
        """The 8 accumulators (little-endian), once the stream is longer than 240 bytes."""
        self.last = b""
        """The last stripe consumed (the final stripe may reach back into it)."""
        self.pending = b""
        self._loop = (_NATIVE if native else None) or _stripes_numpy

    def update(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        self.total += len(view)
        if self.acc is None:
            if self.total <= SHORT_MAX:
                self.pending += bytes(view)
                return
            self.acc = bytearray(struct.pack("<8Q", *_INITIAL))
        head = self.pending + bytes(view[: (-len(self.pending)) % STRIPE])
        rest = view[len(head) - len(self.pending) :]
        # Consume every stripe but what ends the stream: at least one byte stays pending
        # (the last stripe is keyed differently and may overlap the one before it).
        count = (len(head) + len(rest) - 1) // STRIPE
        from_head = min(count, len(head) // STRIPE)
        from_rest = count - from_head
        if from_head:
            self._consume(head[: STRIPE * from_head])
        if from_rest:
            self._consume(rest[: STRIPE * from_rest])
            self.pending = bytes(rest[STRIPE * from_rest :])
        else:
            self.pending = head[STRIPE * from_head :] + bytes(rest)

    def _consume(self, stripes: Buffer) -> None:
        assert self.acc is not None
        view = memoryview(stripes)
        self.stripes = self._loop(self.acc, self.stripes, view)
        self.last = bytes(view[-STRIPE:])

    def hexdigest(self) -> str:
        """As ``xxhash.xxh3_128_hexdigest`` of the whole stream."""
        if self.acc is None:
            return xxhash.xxh3_128_hexdigest(self.pending)
        lanes = list(_words(bytes(self.acc), 0))
        tail = (self.last + self.pending)[-STRIPE:]
        for i, (data, key) in enumerate(
            zip(_words(tail, 0), _words(SECRET, LAST_STRIPE_SECRET), strict=True)
        ):
            keyed = data ^ key
            lanes[i ^ 1] = (lanes[i ^ 1] + data) & MASK
            lanes[i] = (lanes[i] + (keyed & 0xFFFFFFFF) * (keyed >> 32)) & MASK
        low = _merge(lanes, 11, self.total * PRIME64_1 & MASK)
        high = _merge(lanes, 192 - STRIPE - 11, ~(self.total * PRIME64_2) & MASK)
        return f"{high:016x}{low:016x}"

    def to_bytes(self) -> bytes:
        """The state, for the process that hashes the next bytes."""
        long = self.acc is not None
        head = _HEAD.pack(_MAGIC, self.total, self.stripes, long, len(self.last), len(self.pending))
        return head + (bytes(self.acc) if self.acc is not None else b"") + self.last + self.pending

    @classmethod
    def from_bytes(cls, data: bytes, *, native: bool = True) -> StreamHash:
        """A state written by :meth:`to_bytes`; ``ValueError`` if it is not one."""
        if len(data) < _HEAD.size:
            raise ValueError("not a stream hash state")
        magic, total, stripes, long, last, pending = _HEAD.unpack_from(data)
        body = data[_HEAD.size :]
        expected = (64 if long else 0) + last + pending
        sound = magic == _MAGIC and len(body) == expected
        if long:
            sound = sound and last == STRIPE and 1 <= pending <= STRIPE
            sound = sound and total == STRIPE * stripes + pending and total > SHORT_MAX
        else:
            sound = sound and last == 0 and stripes == 0 and total == pending <= SHORT_MAX
        if not sound:
            raise ValueError("not a stream hash state")
        state = cls(native=native)
        state.total, state.stripes = total, stripes
        if long:
            state.acc = bytearray(body[:64])
            body = body[64:]
        state.last, state.pending = body[:last], body[last:]
        return state


def _merge(lanes: list[int], offset: int, start: int) -> int:
    result = start
    key = _words(SECRET, offset)
    for i in range(4):
        product = (lanes[2 * i] ^ key[2 * i]) * (lanes[2 * i + 1] ^ key[2 * i + 1])
        result = (result + ((product & MASK) ^ (product >> 64))) & MASK
    result ^= result >> 37
    result = result * PRIME_MX1 & MASK
    return result ^ (result >> 32)
