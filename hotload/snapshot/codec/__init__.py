"""The per-tensor codecs of hotload-delta/v2 (docs/snapshot-format.md, "Codecs").

Everything here works on numpy words (the bit patterns of a tensor's elements) and
bytes; nothing knows about files. ``tensor_codec`` chooses and runs a codec per tensor;
the other modules are its parts: ``varint`` (the payload's integer fields), ``frames``
(bounded zstd frames), ``planes`` (byte-plane split and join), ``transforms`` (XOR and
zigzag differences), ``dense`` and ``sparse`` (the payload layouts).
"""
