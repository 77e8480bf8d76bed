"""The public names of hotload.snapshot are pinned: renaming one is a deliberate act."""

from __future__ import annotations

import hotload.snapshot


def test_public_surface_is_pinned() -> None:
    assert hotload.snapshot.__all__ == [
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
    for name in hotload.snapshot.__all__:
        assert getattr(hotload.snapshot, name) is not None


def test_contract_names() -> None:
    assert hotload.snapshot.MANIFEST_NAME == "hotload-manifest.json"
    assert hotload.snapshot.FORMAT == "hotload-delta/v3"
    assert hotload.snapshot.FORMAT_PARTS == "hotload-delta/v4"


def test_core_import_does_not_pull_torch() -> None:
    import subprocess
    import sys

    code = "import sys, hotload.snapshot; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
