"""Write the golden vectors of hotload-delta/v3 (docs/snapshot-format.md, "Golden vectors").

    ~/.cache/hotload/venv/bin/python tests/golden/snapshot/generate.py

Deterministic: the same code and the pinned zstandard write the same bytes. The vectors:
``previous/`` and ``current/`` (tiny model directories, several dtypes, ``current``
with a changed ignored config field, a new tensor, a removed one), ``full/`` (the Full
snapshot of ``previous``), ``delta/`` (the Incremental from ``previous`` to ``current``,
codecs chosen by size) and ``delta-<codec>/`` (the same with one codec forced),
``parts-full/`` and ``parts-delta/`` (hotload-delta/v4: the same two snapshots stored as
parts by three writers, each holding a ``torch.chunk`` of every tensor's rows, as the
ranks of a sharded trainer write them),
and ``expected.json``: per snapshot, the sha256 of every file of its rebuilt directory.
The vectors of v1 and v2 (tests/golden/snapshot-v1, tests/golden/snapshot-v2) are frozen:
readers must still rebuild them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from hotload.snapshot import REBUILT_NAME, CodecId, CodecOptions, encode, encode_full, rebuild  # noqa: E402
from tests.unit.snapshot.models import base_tensors, words, write_model  # noqa: E402
from tests.unit.snapshot.parting import write_parted_snapshot  # noqa: E402

CHUNK = 64
FORCED = (CodecId.SPARSE, CodecId.CONTEXT, CodecId.DENSE_SUB, CodecId.DENSE_XOR, CodecId.RAW)


def models(root: Path) -> tuple[Path, Path]:
    tensors = base_tensors(seed=7)
    rng = np.random.default_rng(11)
    moved: dict[str, tuple[str, np.ndarray]] = {}
    for name, (dtype, data) in tensors.items():
        flat = data.reshape(-1).copy()
        if name == "mask":
            pass  # unchanged
        elif name == "int.table":
            flat = words(dtype, data.shape, 99).reshape(-1)  # rewritten
        else:
            count = max(1, len(flat) // 50)
            where = rng.choice(len(flat), size=count, replace=False)
            flat[where] += rng.choice(np.array([1, np.iinfo(flat.dtype).max], flat.dtype), count)
        moved[name] = (dtype, flat.reshape(data.shape))
    del moved["quant.scale"]
    moved["head.weight"] = ("BF16", words("BF16", (4, 32), 5))
    config = {"hidden_size": 32, "transformers_version": "4.0"}
    extra = {"tokenizer.json": '{"vocab": ["a", "b"]}', "sub/extra.json": '{"x": 1}'}
    previous = write_model(
        root / "previous", {"model.safetensors": tensors}, config=config, extra_files=extra
    )
    config = {**config, "transformers_version": "4.1"}
    current = write_model(
        root / "current", {"model.safetensors": moved}, config=config, extra_files=extra
    )
    return previous, current


def rebuilt_hashes(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != REBUILT_NAME
    }


def generate(root: Path) -> dict[str, dict[str, str]]:
    previous, current = models(root)
    expected: dict[str, dict[str, str]] = {}
    encode_full(previous, root / "full", identity="golden-1", step=1)
    snapshots = {"delta": CodecOptions(chunk_elements=CHUNK)}
    snapshots |= {
        f"delta-{codec.value}": CodecOptions(chunk_elements=CHUNK, codecs=(codec,))
        for codec in FORCED
    }
    for name, options in snapshots.items():
        encode(
            previous,
            current,
            root / name,
            identity="golden-2",
            step=2,
            previous_identity="golden-1",
            ignored_config_fields=["transformers_version"],
            options=options,
        )
    write_parted_snapshot(None, previous, root / "parts-full", identity="golden-1", step=1)
    write_parted_snapshot(
        previous,
        current,
        root / "parts-delta",
        identity="golden-2",
        step=2,
        previous_identity="golden-1",
        options=CodecOptions(chunk_elements=CHUNK),
        ignored_config_fields=("transformers_version",),
    )
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("full", "parts-full"):
            rebuild(None, root / name, Path(scratch) / name)
            expected[name] = rebuilt_hashes(Path(scratch) / name)
        for name in [*snapshots, "parts-delta"]:
            rebuild(previous, root / name, Path(scratch) / name)
            expected[name] = rebuilt_hashes(Path(scratch) / name)
    (root / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    return expected


def main() -> None:
    for item in HERE.iterdir():
        if item.is_dir():
            shutil.rmtree(item)
    (HERE / "expected.json").unlink(missing_ok=True)
    generate(HERE)
    print(f"wrote golden vectors under {HERE}")


if __name__ == "__main__":
    main()
