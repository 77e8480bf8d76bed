"""Helpers that lie: edit a snapshot's files or manifest and re-sign it consistently.

Re-signing (recomputing each stored file's size and sha256 in the manifest) gets a lie
past the stored-file hashes, so a test reaches the checks behind them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotload.snapshot import MANIFEST_NAME
from hotload.snapshot.manifest_codec import load_document

Document = dict[str, Any]


def load(snapshot: Path) -> Document:
    """The manifest document, tensors as a list of objects (v2's columns expanded)."""
    return load_document((snapshot / MANIFEST_NAME).read_bytes())


def save(snapshot: Path, document: Document) -> None:
    """Write the document as plain JSON, tensors as objects (a form v2 readers accept),
    so that a lie the compact form cannot even express still reaches the reader."""
    (snapshot / MANIFEST_NAME).write_text(json.dumps(document))


def resign(snapshot: Path, edit: Callable[[Document], None] | None = None) -> Document:
    """Apply ``edit`` to the manifest, then make every stored file's size and hash match."""
    document = load(snapshot)
    if edit is not None:
        edit(document)
    for key in ("files", "deltas"):
        for entry in document.get(key, []):
            path = snapshot / entry["path"]
            if path.is_file():
                data = path.read_bytes()
                entry["size"] = len(data)
                entry["hash"] = hashlib.sha256(data).hexdigest()
    save(snapshot, document)
    return document


def as_v2(document: Document, previous: Path) -> Document:
    """The same manifest as v2 wrote it: each referenced file with its own sha256 (taken
    from ``previous``), no ``referencedDigest``."""
    older: Document = json.loads(json.dumps(document))
    older["format"] = "hotload-delta/v2"
    older.pop("referencedDigest", None)
    for entry in older.get("referenced", []):
        entry["hash"] = hashlib.sha256((previous / entry["path"]).read_bytes()).hexdigest()
    return older


def tensor(document: Document, name: str) -> Document:
    entry: Document = next(t for t in document["tensors"] if t["name"] == name)
    return entry


def replace_range(snapshot: Path, byte_range: Document, payload: bytes) -> None:
    """Point ``byte_range`` (a dict inside a loaded manifest) at ``payload``, appended to
    its delta file; the old bytes stay where they were, unreferenced."""
    path = snapshot / byte_range["file"]
    offset = path.stat().st_size
    with path.open("ab") as handle:
        handle.write(payload)
    byte_range["offset"] = offset
    byte_range["length"] = len(payload)


def read_range(snapshot: Path, byte_range: Document) -> bytes:
    data = (snapshot / byte_range["file"]).read_bytes()
    return data[byte_range["offset"] : byte_range["offset"] + byte_range["length"]]
