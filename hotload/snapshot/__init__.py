"""Snapshot layout, manifest, lossless delta codec and chain planning (no Kubernetes here).

The public surface (pinned by a test; docs/snapshot-format.md describes the bytes):

- the manifest: :data:`MANIFEST_NAME`, :class:`Manifest` and its parts,
  :func:`parse_manifest`, :func:`read_manifest`, ``Manifest.files_to_fetch()``;
- the planner: :func:`plan_update`, :func:`plan_update_with`, :func:`next_manifest_needed`
  → :class:`UpdatePlan`;
- the decoder: :func:`rebuild` → :class:`RebuildResult`, :func:`verify` →
  :class:`VerifyResult`, :func:`patch_tensors` (in place, for engines holding weights);
- the encoder: :func:`encode`, :func:`encode_full` → :class:`EncodeResult`, and
  :func:`encode_state_dict` for a torch state_dict (torch imported lazily);
- snapshots stored as parts (v4, :data:`FORMAT_PARTS`) by several writers at once:
  :class:`PartsWriter` (one per writer) → :class:`TensorPart`, :func:`write_parted`
  (the one place that checks coverage and writes the manifest) over :class:`TensorMeta`;
- :func:`inspect_snapshot` → :class:`SnapshotReport` (what ``hotload snapshot inspect`` prints).

Names load on first use (PEP 562 ``__getattr__``): ``hotload snapshot decode`` imports
the decoder, not the encoder, the inspector or the torch bridge.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from hotload.snapshot.codec.tensor_codec import CodecOptions
    from hotload.snapshot.decoder import RebuildResult, rebuild
    from hotload.snapshot.encoder import EncodeResult, TensorReport, encode, encode_full
    from hotload.snapshot.inspection import SnapshotReport, TensorSummary, inspect_snapshot
    from hotload.snapshot.layout import ADAPTER_CONFIG, REBUILT_NAME
    from hotload.snapshot.manifest import (
        FORMAT,
        FORMAT_PARTS,
        MANIFEST_NAME,
        ByteRange,
        CodecId,
        FileHash,
        Manifest,
        ManifestCheckpoint,
        ReferencedFile,
        ShardEntry,
        StoredFile,
        TensorEntry,
        TensorPart,
        parse_manifest,
        read_manifest,
    )
    from hotload.snapshot.parted import PartsWriter, TensorMeta, write_parted
    from hotload.snapshot.patching import patch_tensors
    from hotload.snapshot.planner import (
        UpdatePlan,
        manifest_digest,
        next_manifest_needed,
        plan_update,
        plan_update_with,
    )
    from hotload.snapshot.state_dict import encode_state_dict
    from hotload.snapshot.verifier import VerifyResult, verify

#: Where each public name lives.
_HOMES: Final = {
    "CodecOptions": "hotload.snapshot.codec.tensor_codec",
    "RebuildResult": "hotload.snapshot.decoder",
    "rebuild": "hotload.snapshot.decoder",
    "EncodeResult": "hotload.snapshot.encoder",
    "TensorReport": "hotload.snapshot.encoder",
    "encode": "hotload.snapshot.encoder",
    "encode_full": "hotload.snapshot.encoder",
    "SnapshotReport": "hotload.snapshot.inspection",
    "TensorSummary": "hotload.snapshot.inspection",
    "inspect_snapshot": "hotload.snapshot.inspection",
    "ADAPTER_CONFIG": "hotload.snapshot.layout",
    "REBUILT_NAME": "hotload.snapshot.layout",
    "FORMAT": "hotload.snapshot.manifest",
    "FORMAT_PARTS": "hotload.snapshot.manifest",
    "MANIFEST_NAME": "hotload.snapshot.manifest",
    "ByteRange": "hotload.snapshot.manifest",
    "CodecId": "hotload.snapshot.manifest",
    "FileHash": "hotload.snapshot.manifest",
    "Manifest": "hotload.snapshot.manifest",
    "ManifestCheckpoint": "hotload.snapshot.manifest",
    "ReferencedFile": "hotload.snapshot.manifest",
    "ShardEntry": "hotload.snapshot.manifest",
    "StoredFile": "hotload.snapshot.manifest",
    "TensorEntry": "hotload.snapshot.manifest",
    "TensorPart": "hotload.snapshot.manifest",
    "PartsWriter": "hotload.snapshot.parted",
    "TensorMeta": "hotload.snapshot.parted",
    "write_parted": "hotload.snapshot.parted",
    "parse_manifest": "hotload.snapshot.manifest",
    "read_manifest": "hotload.snapshot.manifest",
    "patch_tensors": "hotload.snapshot.patching",
    "UpdatePlan": "hotload.snapshot.planner",
    "manifest_digest": "hotload.snapshot.planner",
    "next_manifest_needed": "hotload.snapshot.planner",
    "plan_update": "hotload.snapshot.planner",
    "plan_update_with": "hotload.snapshot.planner",
    "encode_state_dict": "hotload.snapshot.state_dict",
    "VerifyResult": "hotload.snapshot.verifier",
    "verify": "hotload.snapshot.verifier",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ADAPTER_CONFIG",
    "FORMAT",
    "FORMAT_PARTS",
    "MANIFEST_NAME",
    "REBUILT_NAME",
    "ByteRange",
    "CodecId",
    "CodecOptions",
    "EncodeResult",
    "FileHash",
    "Manifest",
    "ManifestCheckpoint",
    "PartsWriter",
    "RebuildResult",
    "ReferencedFile",
    "ShardEntry",
    "SnapshotReport",
    "StoredFile",
    "TensorEntry",
    "TensorMeta",
    "TensorPart",
    "TensorReport",
    "TensorSummary",
    "UpdatePlan",
    "VerifyResult",
    "encode",
    "encode_full",
    "encode_state_dict",
    "inspect_snapshot",
    "manifest_digest",
    "next_manifest_needed",
    "parse_manifest",
    "patch_tensors",
    "plan_update",
    "plan_update_with",
    "read_manifest",
    "rebuild",
    "verify",
    "write_parted",
]
