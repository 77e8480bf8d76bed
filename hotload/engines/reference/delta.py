"""Apply a verified delta to the weights the reference engine holds, in place.

A delta at RL learning rates touches under 1% of the elements, so loading a rebuilt
directory (a full read and copy of every weight) costs far more than the change. The
engine keeps the exact bits it serves (``storage``, the snapshot's dtype) and patches
them where they are: every stored file's sha256 and the chain are checked first, the
changes are decoded straight into the held tensors, and every patched tensor's xxh3-128
is checked against the manifest. Only then are new parameters of the compute dtype
made (when the model computes in another dtype, e.g. float32 on CPU), still beside
serving: the parameters of the step before, kept as a spare, take only the elements the
last two deltas changed (:mod:`~hotload.engines.reference.spare`); between two tokens the
parameters are only pointed at them. When the held bits are the parameters themselves,
the whole patch runs between two tokens. Any failure undoes every change (the patch is
all or nothing), so the engine keeps serving exactly its old weights and says why.

A delta that changes the model's layout (a tensor added, removed, reshaped or retyped)
is refused with :class:`LayoutChanged`: the sidecar then loads the rebuilt directory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from pathlib import Path

import numpy as np
import torch

from hotload.api import SnapshotKind
from hotload.api.kinds import Identity
from hotload.engines.reference.spare import SpareParameters, WrittenElements
from hotload.errors import DeltaNotApplicable, EngineRejected, HotloadError
from hotload.snapshot import Manifest, patch_tensors, read_manifest
from hotload.snapshot.patching import ChangeSink
from hotload.snapshot.torch_dtypes import TORCH_DTYPES

_NUMPY_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TORCH_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class LayoutChanged(DeltaNotApplicable):
    """The delta adds, removes, reshapes or retypes a tensor: load the rebuilt directory."""


def read_delta(path: Path, held_identity: Identity, kind: SnapshotKind) -> Manifest:
    """The delta's manifest, once it applies to what the engine serves."""
    try:
        manifest = read_manifest(path)
    except HotloadError as err:
        raise EngineRejected(f"unreadable delta ({err.reason}): {err}", path=str(path)) from err
    if manifest.kind is not SnapshotKind.INCREMENTAL:
        raise EngineRejected("only an incremental snapshot patches the served weights")
    if kind is SnapshotKind.LORA or manifest.previous != held_identity:
        raise EngineRejected(
            "the delta applies to another snapshot than the one served",
            serving=held_identity,
            previous=manifest.previous,
        )
    return manifest


def check_layout(manifest: Manifest, storage: Mapping[str, torch.Tensor]) -> None:
    """:class:`LayoutChanged` unless the delta keeps every held tensor's name, dtype and size."""
    names = {t.name for t in manifest.tensors}
    differing = sorted(
        t.name
        for t in manifest.tensors
        if t.name not in storage
        or TORCH_DTYPES.get(str(storage[t.name].dtype).removeprefix("torch.")) != t.dtype
        or storage[t.name].numel() != t.numel
    )
    if differing or names != set(storage):
        raise LayoutChanged(
            "the delta changes the model's layout: load the rebuilt directory",
            differing=differing[:5],
            missing_or_extra=sorted(names ^ set(storage))[:5],
        )


def patch_storage(
    storage: Mapping[str, torch.Tensor],
    path: Path,
    manifest: Manifest,
    held_identity: Identity,
    *,
    on_change: ChangeSink | None = None,
    executor: Executor | None = None,
) -> None:
    """Patch the held tensors (CPU) in place, all or nothing.

    ``on_change`` hears every range written, once its tensor is patched and checked (a
    later failure still undoes it); ``executor`` decodes each tensor's chunks in parallel."""
    views = {
        name: tensor.detach().reshape(-1).view(_TORCH_WORDS[tensor.element_size()]).numpy()
        for name, tensor in storage.items()
    }
    words = {name: view.view(_NUMPY_WORDS[view.itemsize]) for name, view in views.items()}
    try:
        patch_tensors(
            words,
            path,
            held_identity=held_identity,
            manifest=manifest,
            on_change=on_change,
            raw_in_place=True,
            executor=executor,
        )
    except HotloadError as err:
        raise EngineRejected(
            f"the delta was refused ({err.reason}): {err}", reason=err.reason, path=str(path)
        ) from err


def patch_into_spare(
    storage: Mapping[str, torch.Tensor],
    path: Path,
    manifest: Manifest,
    held_identity: Identity,
    spare: SpareParameters,
    dtype: torch.dtype,
    beside: Executor,
    decode: Executor | None = None,
) -> tuple[dict[str, torch.Tensor], WrittenElements]:
    """Patch the held tensors, and bring the spare parameters (one step behind) up to
    them in ``dtype``, writing only the elements this delta and the one before wrote
    (:mod:`~hotload.engines.reference.spare`). Each tensor is brought forward on
    ``beside`` (one thread) as soon as it is patched and checked, overlapping the
    decoding of the next ones (decoded on ``decode``, chunks in parallel, when given).
    The new parameters by name, and what this delta wrote.
    All or nothing for the held bits; a refused patch leaves no spare (the next delta
    widens every tensor)."""
    written = WrittenElements()
    catch_up = spare.start(written, dtype)
    submitted: list[str] = []
    pending: list[Future[None]] = []

    def submit(name: str) -> None:
        submitted.append(name)
        pending.append(beside.submit(catch_up.tensor, name, storage[name]))

    def heard(name: str, start: int, positions: np.ndarray | None, length: int) -> None:
        if written.ranges and name not in written.ranges:
            # a tensor's ranges are told together, once it is patched and checked: a new
            # name means the one before is final
            submit(next(reversed(written.ranges)))
        written.heard(name, start, positions, length)

    try:
        patch_storage(storage, path, manifest, held_identity, on_change=heard, executor=decode)
        done = set(submitted)
        for name in storage:  # the last one patched, and those the delta left unchanged
            if name not in done:
                submit(name)
    finally:
        for future in pending:  # never leave a thread writing the spare behind
            with contextlib.suppress(Exception):
                future.result()
    for future in pending:
        future.result()  # a failure of the catch-up itself
    return catch_up.fresh, written


def changed_positions(held: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Flat positions where ``new``'s bits differ from ``held``'s (same dtype and shape)."""
    width = held.element_size()
    old_words = held.detach().reshape(-1).view(_TORCH_WORDS[width])
    new_words = new.detach().contiguous().reshape(-1).view(_TORCH_WORDS[width])
    return torch.nonzero(old_words != new_words).reshape(-1)


def write_positions(
    changed: Mapping[str, torch.Tensor],
    tensors: Mapping[str, torch.Tensor],
    storage: Mapping[str, torch.Tensor],
    parameters: Mapping[str, torch.Tensor],
) -> int:
    """Write only the changed elements of ``tensors`` into the held bits and the
    parameters (between two tokens); returns how many were written."""
    written = 0
    with torch.no_grad():
        for name, positions in changed.items():
            if not positions.numel():
                continue
            source = tensors[name].detach().contiguous().reshape(-1)[positions]
            held = storage[name].reshape(-1)
            held[positions] = source
            target = parameters[name].view(-1)
            if target.data_ptr() != held.data_ptr():
                target[positions] = source.to(target.dtype)
            written += int(positions.numel())
    return written
