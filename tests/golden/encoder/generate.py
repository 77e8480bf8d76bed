"""Golden payloads of the tensor encoder: what ``encode_tensor`` wrote before its native path.

    ~/.cache/hotload/venv/bin/python tests/golden/encoder/generate.py [--baseline COMMIT]

Every case is a previous and a new tensor (words) made from integers alone (splitmix64
and shifts, no random stream, no float function: the same words on any machine and numpy
version), with the encoder options and the dtype. ``expected.json`` holds, per case, the
codec the encoder chose, the changed count and the payload's length and sha256.

They were written by the encoder of commit d2baf31 (``--baseline d2baf31``: that
commit's package, built beside this one by bench/codec/baseline_package.py), before the
encoder's native scan, rank and model kernels; tests/unit/snapshot/test_encoder_paths.py
checks every path of today's encoder against them. Regenerate (with the current encoder,
no ``--baseline``) only after a deliberate change of what the encoder writes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
EXPECTED = HERE / "expected.json"

WIDTHS = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "I16": 2,
    "U16": 2,
    "I32": 4,
    "U32": 4,
    "I64": 8,
    "U64": 8,
    "BOOL": 1,
}
#: (exponent shift, exponent bits, mantissa bits) of the float dtypes
FLOATS = {
    "BF16": (7, 8, 7),
    "F16": (10, 5, 10),
    "F32": (23, 8, 23),
    "F64": (52, 11, 52),
    "F8_E4M3": (3, 4, 3),
    "F8_E5M2": (2, 5, 2),
}
M64 = (1 << 64) - 1


def mix(seed: int, n: int) -> np.ndarray:
    """splitmix64 of ``seed * 2**32 + i`` for i < n: uniform uint64 words."""
    z = (np.arange(n, dtype=np.uint64) + np.uint64((seed << 32) & M64)) * np.uint64(
        0x9E3779B97F4A7C15
    )
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: np.ndarray = z ^ (z >> np.uint64(31))
    return result


def below(seed: int, n: int, per_million: int) -> np.ndarray:
    """A mask of n elements, each true with probability per_million / 10**6."""
    result: np.ndarray = (mix(seed, n) % np.uint64(1_000_000)) < np.uint64(per_million)
    return result


def previous_words(dtype: str, n: int, seed: int) -> np.ndarray:
    """Weights-like words: floats with exponents around 2**-6, a geometric tail of smaller
    ones and random signs and mantissas; integers uniform."""
    width = WIDTHS[dtype]
    word = np.dtype(f"u{width}")
    bits = mix(seed, n)
    if dtype not in FLOATS:
        return (bits >> np.uint64(64 - 8 * width)).astype(word)
    shift, exponent_bits, mantissa_bits = FLOATS[dtype]
    bias = (1 << (exponent_bits - 1)) - 1
    # exponent: bias - 6 less a geometric number of steps (a word's trailing zeros)
    tail = mix(seed + 1, n)
    steps = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    for j in range(12):
        alive &= ((tail >> np.uint64(j)) & np.uint64(1)) == 0
        steps += alive
    top = max(1, bias - min(6, bias - 1))
    exponent = np.maximum(top - steps, 0).astype(np.uint64)
    mantissa = bits & np.uint64((1 << mantissa_bits) - 1)
    sign = (bits >> np.uint64(63)) << np.uint64(8 * width - 1)
    return (sign | (exponent << np.uint64(shift)) | mantissa).astype(word)


def stepped(old: np.ndarray, seed: int, per_million: int, style: str) -> np.ndarray:
    """``old`` moved at about per_million of its elements: by one unit ("ulp"), by small
    and sign-crossing amounts ("mixed"), or rewritten ("random")."""
    n = len(old)
    word = old.dtype
    modulus = 1 << (8 * word.itemsize)
    moved = below(seed, n, per_million)
    new = old.astype(np.uint64)
    amount = mix(seed + 7, n)
    if style == "random":
        change = amount >> np.uint64(64 - 8 * word.itemsize)
        new = np.where(moved, change, new)
        same = moved & (new == old.astype(np.uint64))
        new = np.where(same, new ^ np.uint64(1), new)
    else:
        up = (amount & np.uint64(1)).astype(bool)
        size = np.ones(n, dtype=np.uint64)
        if style == "mixed":
            big = (amount >> np.uint64(8)) % np.uint64(16) == 0
            size = np.where(
                big, (amount >> np.uint64(16)) % np.uint64(min(modulus // 2, 1 << 40)), size
            )
            size = np.maximum(size, np.uint64(1))
        delta = np.where(up, size, np.uint64(modulus) - size if modulus < 1 << 64 else -size)
        new = np.where(moved, new + delta, new)
    if modulus < 1 << 64:
        new = new % np.uint64(modulus)
    return new.astype(word)


@dataclass(frozen=True)
class Case:
    name: str
    dtype: str | None
    width: int
    n: int
    seed: int
    per_million: int
    style: str
    chunk: int = 1 << 20
    options: dict[str, Any] = field(default_factory=dict)

    def words(self) -> tuple[np.ndarray, np.ndarray]:
        known = self.dtype is not None and self.dtype in WIDTHS
        dtype = self.dtype if known else f"U{8 * self.width}"
        old = previous_words(dtype, self.n, self.seed)
        return old, stepped(old, self.seed + 100, self.per_million, self.style)


def cases() -> Iterator[Case]:
    """Every dtype at RL-like rates; shapes at chunk and block edges; every fraction
    around the encoder's thresholds; options that change the candidates."""
    seed = 1
    for dtype, width in WIDTHS.items():
        for per_million, style in ((6500, "mixed"), (300, "ulp"), (50_000, "mixed")):
            seed += 1
            yield Case(
                f"{dtype}-{per_million}-{style}", dtype, width, 20_011, seed, per_million, style
            )
    for n in (0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 4097, 70_001):
        seed += 1
        yield Case(f"bf16-n{n}", "BF16", 2, n, seed, 200_000, "mixed", chunk=64)
    for per_million in (0, 1, 100, 19_999, 20_001, 250_000, 299_999, 300_001, 600_000, 10**6):
        for style in ("ulp", "random"):
            seed += 1
            yield Case(f"f32-{per_million}-{style}", "F32", 4, 9_000, seed, per_million, style)
    for chunk in (1, 7, 256, 4096):
        seed += 1
        yield Case(f"bf16-chunk{chunk}", "BF16", 2, 30_000, seed, 8000, "mixed", chunk=chunk)
    for classes in (1, 2, 3, 8):
        seed += 1
        yield Case(
            f"bf16-classes{classes}",
            "BF16",
            2,
            50_000,
            seed,
            4000,
            "mixed",
            options={"context_classes": classes},
        )
    for codecs in (("context",), ("sparse", "raw"), ("context", "dense-sub"), ("raw",)):
        seed += 1
        yield Case(
            f"f16-only-{'+'.join(codecs)}",
            "F16",
            2,
            12_345,
            seed,
            30_000,
            "mixed",
            options={"codecs": list(codecs)},
        )
    for dtype, width in ((None, 2), ("INT4", 1), ("F64", 8)):
        seed += 1
        yield Case(f"nokey-{dtype}-{width}", dtype, width, 8_191, seed, 7_000, "mixed")
    seed += 1
    yield Case("f64-huge-moves", "F64", 8, 6_000, seed, 40_000, "random")


def run(case: Case, encode_tensor: Callable[..., Any], options_type: Any, codec_id: Any) -> Any:
    old, new = case.words()
    settings: dict[str, Any] = {"chunk_elements": case.chunk}
    for key, value in case.options.items():
        settings[key] = tuple(codec_id(c) for c in value) if key == "codecs" else value
    return encode_tensor(new, old, options_type(**settings), dtype=case.dtype)


def summary(encoded: Any) -> dict[str, Any]:
    return {
        "codec": str(encoded.codec.value),
        "changed": encoded.changed,
        "bytes": len(encoded.payload),
        "sha256": hashlib.sha256(encoded.payload).hexdigest(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a commit whose encoder writes the vectors")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    package = "hotload"
    if args.baseline:
        sys.path.insert(0, str(REPO / "bench" / "codec"))
        from baseline_package import load_baseline

        package = load_baseline(args.baseline).__name__
    codec = importlib.import_module(f"{package}.snapshot.codec.tensor_codec")
    manifest = importlib.import_module(f"{package}.snapshot.manifest")
    expected = {
        case.name: summary(run(case, codec.encode_tensor, codec.CodecOptions, manifest.CodecId))
        for case in cases()
    }
    EXPECTED.write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"{len(expected)} cases written to {EXPECTED}")


if __name__ == "__main__":
    main()
