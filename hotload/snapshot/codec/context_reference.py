"""The context codec's chunk kernels in Python: the specification in code, and the fallback.

Same inputs, outputs and refusals as the native module ``_context`` (built from
``_context.c`` by ``pip install``); tests check that both give the same bytes and
refuse the same streams. This one runs at Python speed (a loop per change, numpy per
class), so the encoder and decoder use the native kernels whenever they are built.

A chunk's stream (docs/snapshot-format.md, "Context payload"), LSB-first bits:
for each class, the Golomb-coded number of its elements before its first change; then,
at each change in element order, a sign bit, the magnitude (``1`` for a class of unit
magnitudes, else 1 + an Exp-Golomb code), and the Golomb-coded number of the class's
elements before its next change (after its last change: before the chunk's end). Zero
bits pad the last byte.
"""

from __future__ import annotations

import numpy as np

from hotload.snapshot.codec.context_model import UNIT_MAGNITUDES, ContextModel


class StreamError(ValueError):
    """A malformed stream (the native module raises ValueError alike)."""


def classes_of(words: np.ndarray, model: ContextModel) -> np.ndarray:
    """Each element's context class, from its previous bits."""
    if model.key_bits == 0:
        return np.zeros(len(words), dtype=np.int64)
    keys = (words.astype(np.uint64) >> np.uint64(model.key_shift)) & np.uint64(
        (1 << model.key_bits) - 1
    )
    classes = keys.astype(np.int64) - model.lo + 1
    return np.clip(classes, 0, model.classes - 1)


class _Bits:
    """LSB-first bits of a stream: fields read through 8-byte windows, unary codes
    through the positions of the one bits (found once)."""

    def __init__(self, data: bytes) -> None:
        self.data = data + bytes(16)
        self.size = 8 * len(data)
        self.ones = np.flatnonzero(
            np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        )
        self.pos = 0

    def read(self, count: int) -> int:
        if count == 0:
            return 0
        if self.pos + count > self.size:
            raise StreamError("context stream truncated")
        value = 0
        done = 0
        while done < count:
            take = min(count - done, 56)
            start = self.pos + done
            window = int.from_bytes(self.data[start // 8 : start // 8 + 8], "little")
            value |= ((window >> (start % 8)) & ((1 << take) - 1)) << done
            done += take
        self.pos += count
        return value

    def unary(self, limit: int) -> int:
        index = int(np.searchsorted(self.ones, self.pos))
        if index == len(self.ones) or int(self.ones[index]) - self.pos > limit:
            raise StreamError("context stream has a malformed code")
        zeros = int(self.ones[index]) - self.pos
        self.pos += zeros + 1
        return zeros

    def golomb(self, m: int, limit: int) -> int:
        quotient = self.unary(limit // m + 1)
        if m == 1:
            value = quotient
        else:
            b = (m - 1).bit_length()
            cut = (1 << b) - m
            low = self.read(b - 1)
            if low >= cut:
                low = ((low << 1) | self.read(1)) - cut
            value = quotient * m + low
        if value > limit:
            raise StreamError("context stream has a malformed gap")
        return value

    def exp_golomb(self, k: int) -> int:
        zeros = self.unary(63)
        n = zeros + k
        if n > 63:
            raise StreamError("context stream has a malformed value")
        return ((1 << n) | self.read(n)) - (1 << k)

    def check_end(self) -> None:
        if self.size - self.pos >= 8 or (len(self.ones) and int(self.ones[-1]) >= self.pos):
            raise StreamError("context stream longer than its codes")


def decode_chunk(
    previous: np.ndarray, model: ContextModel, stream: bytes, changes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the chunk, zigzag differences) of the chunk's ``changes`` changes."""
    n = len(previous)
    width = previous.dtype.itemsize
    half = 1 << (8 * width - 1)
    classes = classes_of(previous, model)
    members = [np.flatnonzero(classes == c) for c in range(model.classes)]
    bits = _Bits(stream)
    next_rank = [bits.golomb(model.golomb[c], n) for c in range(model.classes)]
    positions: list[int] = []
    values: list[int] = []
    while True:
        candidates = [
            (int(members[c][next_rank[c]]), c)
            for c in range(model.classes)
            if next_rank[c] < len(members[c])
        ]
        if not candidates:
            break
        position, c = min(candidates)
        if len(positions) == changes:
            raise StreamError("more changes in the stream than the chunk declares")
        sign = bits.read(1)
        if model.value_k[c] == UNIT_MAGNITUDES:
            magnitude = 1
        else:
            magnitude = bits.exp_golomb(model.value_k[c]) + 1
        if magnitude > half or (magnitude == half and not sign):
            raise StreamError("context value out of range for the word width")
        positions.append(position)
        values.append(2 * magnitude - sign)
        next_rank[c] += 1 + bits.golomb(model.golomb[c], n)
    if any(next_rank[c] != len(members[c]) for c in range(model.classes)):
        raise StreamError("context gaps do not end at the chunk's end")
    if len(positions) != changes:
        raise StreamError("fewer changes in the stream than the chunk declares")
    bits.check_end()
    return np.array(positions, dtype=np.uint32), np.array(values, dtype=previous.dtype)


class _Writer:
    def __init__(self) -> None:
        self.bits: list[int] = []

    def put(self, value: int, count: int) -> None:
        self.bits.extend((value >> i) & 1 for i in range(count))

    def unary(self, zeros: int) -> None:
        self.bits.extend([0] * zeros)
        self.bits.append(1)

    def golomb(self, value: int, m: int) -> None:
        self.unary(value // m)
        if m == 1:
            return
        low = value % m
        b = (m - 1).bit_length()
        cut = (1 << b) - m
        if low < cut:
            self.put(low, b - 1)
        else:
            low += cut
            self.put(low >> 1, b - 1)
            self.put(low & 1, 1)

    def exp_golomb(self, value: int, k: int) -> None:
        shifted = value + (1 << k)
        n = shifted.bit_length() - 1
        self.unary(n - k)
        self.put(shifted - (1 << n), n)

    def finish(self) -> bytes:
        bits = np.array(self.bits, dtype=np.uint8)
        return np.packbits(bits, bitorder="little").tobytes()


def encode_chunk(
    previous: np.ndarray, model: ContextModel, positions: np.ndarray, values: np.ndarray
) -> bytes:
    """The chunk's stream for changes at ``positions`` (increasing) by zigzag ``values``."""
    classes = classes_of(previous, model)
    ranks = np.zeros(len(previous), dtype=np.int64)
    for c in range(model.classes):
        members = np.flatnonzero(classes == c)
        ranks[members] = np.arange(len(members))
    sizes = [int(np.count_nonzero(classes == c)) for c in range(model.classes)]
    last = [-1] * model.classes
    gaps_after: dict[int, int] = {}
    firsts = [0] * model.classes
    for t, position in enumerate(positions.tolist()):
        c = int(classes[position])
        rank = int(ranks[position])
        if last[c] < 0:
            firsts[c] = rank
        else:
            gaps_after[last[c]] = rank - int(ranks[positions[last[c]]]) - 1
        last[c] = t
    for c in range(model.classes):
        if last[c] < 0:
            firsts[c] = sizes[c]
        else:
            gaps_after[last[c]] = sizes[c] - int(ranks[positions[last[c]]]) - 1
    out = _Writer()
    for c in range(model.classes):
        out.golomb(firsts[c], model.golomb[c])
    for t, position in enumerate(positions.tolist()):
        c = int(classes[position])
        value = int(values[t])
        if value == 0:
            raise StreamError("a change has a zero difference")
        sign, magnitude = value & 1, (value >> 1) + (value & 1)
        out.put(sign, 1)
        if model.value_k[c] == UNIT_MAGNITUDES:
            if magnitude != 1:
                raise StreamError("a class with unit magnitudes has a larger change")
        else:
            out.exp_golomb(magnitude - 1, model.value_k[c])
        out.golomb(gaps_after[t], model.golomb[c])
    return out.finish()
