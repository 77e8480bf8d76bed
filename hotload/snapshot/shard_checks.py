"""Checks of a snapshot's shards against its manifest: header bytes, tensor list, hashes.

One place for what the decoder checks while it rebuilds and the verifier checks without
rebuilding, so neither imports the other.
"""

from __future__ import annotations

from hotload.errors import ChecksumMismatch, ManifestInvalid
from hotload.snapshot.digest import tensor_hash
from hotload.snapshot.manifest import Manifest, ShardEntry, TensorEntry
from hotload.snapshot.safetensors_file import SafetensorsHeader
from hotload.snapshot.tensor_files import TensorIndex


def check_complete_shards(index: TensorIndex, manifest: Manifest) -> None:
    """Shard headers and tensor hashes of a Full or LoRA snapshot against its manifest."""
    entries = entries_by_shard(manifest)
    for shard_entry in manifest.shards:
        shard = index.shards[shard_entry.path]
        check_shard_header(shard_entry, shard.header.header_bytes, manifest)
        check_tensors_match(shard.header, entries.get(shard_entry.path, {}), shard_entry.path)
        for info in shard.header.tensors:
            check_tensor_hash(entries[shard_entry.path][info.name], shard.raw(info), manifest)


def entries_by_shard(manifest: Manifest) -> dict[str, dict[str, TensorEntry]]:
    """The manifest's tensor entries by shard path, then by tensor name."""
    result: dict[str, dict[str, TensorEntry]] = {}
    for tensor in manifest.tensors:
        result.setdefault(tensor.file, {})[tensor.name] = tensor
    return result


def check_shard_header(entry: ShardEntry, header_bytes: bytes, manifest: Manifest) -> None:
    """The shard header's length and hash are the manifest's, else ``ChecksumMismatch``."""
    if len(header_bytes) != entry.header_length or tensor_hash(header_bytes) != entry.header_hash:
        raise ChecksumMismatch(
            "shard header differs from the manifest",
            snapshot=manifest.identity,
            file=entry.path,
        )


def check_tensors_match(
    header: SafetensorsHeader, entries: dict[str, TensorEntry], shard: str
) -> None:
    """The header lists exactly the manifest's tensors, dtypes and shapes (``ManifestInvalid``)."""
    declared = {name: (e.dtype, tuple(e.shape)) for name, e in entries.items()}
    found = {t.name: (t.dtype.name, t.shape) for t in header.tensors}
    if declared != found:
        missing = sorted(set(found) ^ set(declared))[:5]
        differing = sorted(n for n in set(found) & set(declared) if found[n] != declared[n])[:5]
        raise ManifestInvalid(
            "manifest and shard header disagree on the tensors",
            file=shard,
            unlisted_or_missing=missing,
            differing=differing,
        )


def check_tensor_hash(entry: TensorEntry, data: memoryview | bytes, manifest: Manifest) -> None:
    """A rebuilt tensor's bytes have the manifest's xxh3-128, else ``ChecksumMismatch``."""
    found = tensor_hash(data)
    if found != entry.hash:
        raise ChecksumMismatch(
            "rebuilt tensor hash differs from the manifest",
            snapshot=manifest.identity,
            tensor=entry.name,
            expected=entry.hash,
            found=found,
        )
