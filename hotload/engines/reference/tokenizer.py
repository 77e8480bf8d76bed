"""The reference engine's tokenizer: bytes are tokens (no vocabulary file, no download).

Ids 0-255 are the UTF-8 bytes; 256 is BOS, 257 is EOS (generation stops there); ids
above 257 are legal model outputs that decode to nothing. A chat is rendered as
``<|role|>\\ncontent\\n`` per message followed by ``<|assistant|>\\n``. Decoding a stream
token by token keeps partial UTF-8 sequences until they complete.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

BYTE_TOKENS: Final = 256
BOS_ID: Final = 256
EOS_ID: Final = 257
SPECIAL_TOKENS: Final = 2
MIN_VOCAB: Final = BYTE_TOKENS + SPECIAL_TOKENS


def encode(text: str, *, bos: bool = True) -> list[int]:
    ids = list(text.encode("utf-8"))
    return [BOS_ID, *ids] if bos else ids


def decode(token_ids: Iterable[int]) -> str:
    return bytes(token for token in token_ids if 0 <= token < BYTE_TOKENS).decode(
        "utf-8", errors="replace"
    )


def render_chat(messages: Sequence[Mapping[str, str]]) -> str:
    parts = [
        f"<|{message.get('role', 'user')}|>\n{message.get('content', '')}\n" for message in messages
    ]
    return "".join(parts) + "<|assistant|>\n"


class StreamDecoder:
    """Turns one token at a time into text, holding back incomplete UTF-8 sequences."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        if not 0 <= token_id < BYTE_TOKENS:
            return ""
        return self._decoder.decode(bytes([token_id]))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
