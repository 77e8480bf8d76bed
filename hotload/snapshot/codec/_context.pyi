from collections.abc import Sequence

from typing_extensions import Buffer

def decode_chunk(
    prev: Buffer,
    width: int,
    shift: int,
    key_bits: int,
    lo: int,
    golomb: bytes,
    value_k: bytes,
    stream: Buffer,
    changes: int,
    positions_out: Buffer,
    values_out: Buffer,
    simd: bool = True,
) -> None: ...
def encode_chunk(
    prev: Buffer,
    width: int,
    shift: int,
    key_bits: int,
    lo: int,
    golomb: bytes,
    value_k: bytes,
    positions: Buffer,
    values: Buffer,
    simd: bool = True,
) -> bytes: ...
def scan_chunk(
    new: Buffer,
    old: Buffer,
    width: int,
    shift: int,
    key_bits: int,
    positions_out: Buffer,
    values_out: Buffer,
    hist_out: Buffer,
    simd: bool = True,
    keys_out: Buffer = ...,
) -> int: ...
def apply_changes(
    words: Buffer, width: int, positions: Buffer, position_width: int, zig: Buffer
) -> None: ...

SIMD: int

def value_orders(magnitudes: Buffer, change_class: Buffer, classes: int) -> bytes | None: ...
def model_prepare(per_key: Buffer, changed: Buffer, classes: int) -> tuple[int, int, bytes]: ...
def model_finish(
    rows: Buffer,
    logs: Buffer,
    per_key: Buffer,
    changed: Buffer,
    first: int,
    count: int,
    classes: int,
) -> tuple[int, tuple[int, ...], tuple[int, ...]]: ...
def fit_prepare(
    keys: Sequence[Buffer], per_key: Buffer, classes: int
) -> tuple[bytes, int, int, bytes]: ...
def fit_finish(
    values: Sequence[Buffer],
    width: int,
    keys: Sequence[Buffer] | None,
    elements: int,
    window: tuple[bytes, Buffer, Buffer, bytes, int, int, int] | None,
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None: ...
def stream_lengths(
    positions: Sequence[Buffer],
    values: Sequence[Buffer],
    lengths: Buffer,
    width: int,
    golomb: int,
    value_k: int,
) -> tuple[int, ...] | None: ...
def sparse_planes(
    positions: Buffer, values: Buffer, width: int
) -> tuple[int, list[bytes | None]]: ...
