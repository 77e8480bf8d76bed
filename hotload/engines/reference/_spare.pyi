from typing_extensions import Buffer

def widen_bf16_at(
    out: Buffer, words: Buffer, positions: Buffer, start: int = 0, width: int = 8
) -> None: ...
