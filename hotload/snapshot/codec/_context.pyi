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
) -> bytes: ...

def apply_changes(
    words: Buffer, width: int, positions: Buffer, position_width: int, zig: Buffer
) -> None: ...

SIMD: int
