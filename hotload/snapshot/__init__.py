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
- :func:`inspect_snapshot` → :class:`SnapshotReport` (what ``hotload snapshot inspect`` prints).
"""

from hotload.snapshot.codec.tensor_codec import CodecOptions
from hotload.snapshot.decoder import RebuildResult, rebuild
from hotload.snapshot.encoder import EncodeResult, TensorReport, encode, encode_full
from hotload.snapshot.inspection import SnapshotReport, TensorSummary, inspect_snapshot
from hotload.snapshot.layout import ADAPTER_CONFIG, REBUILT_NAME
from hotload.snapshot.manifest import (
    FORMAT,
    MANIFEST_NAME,
    ByteRange,
    CodecId,
    FileHash,
    Manifest,
    ShardEntry,
    StoredFile,
    TensorEntry,
    parse_manifest,
    read_manifest,
)
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

__all__ = [
    "ADAPTER_CONFIG",
    "FORMAT",
    "MANIFEST_NAME",
    "REBUILT_NAME",
    "ByteRange",
    "CodecId",
    "CodecOptions",
    "EncodeResult",
    "FileHash",
    "Manifest",
    "RebuildResult",
    "ShardEntry",
    "SnapshotReport",
    "StoredFile",
    "TensorEntry",
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
]
