"""From a torch state_dict to a snapshot, through the same encoder as directories.

torch is imported only when these functions run, so the core never needs it. The
state_dict is written as safetensors (one shard, or several with an index when
``max_shard_bytes`` is set) into a temporary directory beside ``out``, together with
the non-tensor files of ``files_from`` (config, tokenizer), and encoded from there.
Tensors on any device are accepted; CUDA tensors are copied to the host.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from hotload.api.kinds import Identity
from hotload.errors import ConfigError
from hotload.snapshot.codec.tensor_codec import CodecOptions
from hotload.snapshot.encoder import EncodeResult, encode, write_incremental
from hotload.snapshot.layout import SHARD_SUFFIX, ModelDir, scan
from hotload.snapshot.safetensors_file import build_header, length_prefix
from hotload.snapshot.torch_dtypes import safetensors_dtype

if TYPE_CHECKING:
    import torch


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in row-major order, on the host."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    host: np.ndarray = flat.view(torch.uint8).numpy()
    return memoryview(host.data).cast("B")


INDEX_NAME: Final = "model.safetensors.index.json"

Layout = list[tuple[str, list[tuple[str, Any]]]]


def shard_layout(state_dict: Mapping[str, Any], max_shard_bytes: int | None = None) -> Layout:
    """Shard names and their tensors, sorted by name, split before ``max_shard_bytes``."""
    sizes = [(name, t.numel() * t.element_size()) for name, t in state_dict.items()]
    return [
        (relpath, [(name, state_dict[name]) for name in names])
        for relpath, names in shard_groups(sizes, max_shard_bytes)
    ]


def shard_groups(
    sizes: list[tuple[str, int]], max_shard_bytes: int | None = None
) -> list[tuple[str, list[str]]]:
    """Shard names and the names of their tensors (given with their bytes), sorted by
    name, split before ``max_shard_bytes``: the layout of :func:`write_state_dict`."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, nbytes in sorted(sizes):
        if max_shard_bytes is not None and groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        return [("model" + SHARD_SUFFIX, groups[0])]
    count = len(groups)
    return [
        (f"model-{i:05d}-of-{count:05d}{SHARD_SUFFIX}", group)
        for i, group in enumerate(groups, start=1)
    ]


def write_index(layout: Layout, directory: Path) -> None:
    """``model.safetensors.index.json`` for a sharded layout (nothing for one shard)."""
    if len(layout) < 2:
        return
    weight_map = {key: name for name, group in layout for key, _ in group}
    total = sum(t.numel() * t.element_size() for _, group in layout for _, t in group)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2))


def write_state_dict(
    state_dict: Mapping[str, Any], directory: Path, *, max_shard_bytes: int | None = None
) -> list[str]:
    """Write ``state_dict`` as safetensors shards into ``directory``; returns their names."""
    layout = shard_layout(state_dict, max_shard_bytes)
    for name, group in layout:
        header, _ = build_header(
            [(key, safetensors_dtype(t), tuple(t.shape)) for key, t in group], {"format": "pt"}
        )
        with (directory / name).open("wb") as handle:
            handle.write(length_prefix(header) + header)
            for _, tensor in group:
                handle.write(tensor_bytes(tensor))
    write_index(layout, directory)
    return [name for name, _ in layout]


def _copy_others(source: Path | None, target: Path) -> None:
    if source is None:
        return
    for relpath in scan(source).others:
        destination = target / relpath
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relpath, destination)


def encode_state_dict(
    state_dict: Mapping[str, Any],
    out: Path,
    *,
    identity: Identity,
    step: int,
    previous: Path | Mapping[str, Any] | None = None,
    previous_identity: Identity | None = None,
    previous_digest: str | None = None,
    files_from: Path | None = None,
    previous_files_from: Path | None = None,
    ignored_config_fields: Iterable[str] = (),
    max_shard_bytes: int | None = None,
    options: CodecOptions = CodecOptions(),
    threads: int = 1,
) -> EncodeResult:
    """Encode a torch ``state_dict`` as a snapshot (Full without ``previous``, else a delta).

    ``previous`` is the previous snapshot's rebuilt directory, or its weights as a
    state_dict: then the delta is computed where the tensors are (CUDA included; see
    ``hotload.snapshot.torch_codec``) and only the encoded bytes reach the host, every
    shard header is stored, the previous digest is ``previous_digest`` (e.g.
    ``manifest_digest`` of the previous manifest) or hashed from the tensors, and the
    previous non-tensor files are taken from ``previous_files_from`` (default:
    ``files_from``). ``files_from`` supplies the non-tensor files (config.json,
    tokenizer); its own safetensors files are not used.
    """
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.weights-", dir=out.parent))
    try:
        _copy_others(files_from, scratch)
        if previous is None or isinstance(previous, Path):
            write_state_dict(state_dict, scratch, max_shard_bytes=max_shard_bytes)
            return encode(
                previous,
                scratch,
                out,
                identity=identity,
                step=step,
                previous_identity=previous_identity,
                ignored_config_fields=ignored_config_fields,
                options=options,
                threads=threads,
            )
        if previous_identity is None:
            raise ConfigError("an incremental snapshot needs previous_identity", identity=identity)
        return _encode_from_tensors(
            state_dict,
            previous,
            scratch,
            out,
            identity=identity,
            step=step,
            previous_identity=previous_identity,
            previous_digest=previous_digest,
            previous_files_from=previous_files_from or files_from,
            ignored=sorted(set(ignored_config_fields)),
            max_shard_bytes=max_shard_bytes,
            options=options,
            threads=threads,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _encode_from_tensors(
    state_dict: Mapping[str, Any],
    previous: Mapping[str, Any],
    scratch: Path,
    out: Path,
    *,
    identity: Identity,
    step: int,
    previous_identity: Identity,
    previous_digest: str | None,
    previous_files_from: Path | None,
    ignored: list[str],
    max_shard_bytes: int | None,
    options: CodecOptions,
    threads: int,
) -> EncodeResult:
    from concurrent.futures import ThreadPoolExecutor

    from hotload.snapshot.torch_codec import torch_source  # imports torch

    layout = shard_layout(state_dict, max_shard_bytes)
    write_index(layout, scratch)
    model = scan(scratch)
    before = (
        scan(previous_files_from) if previous_files_from is not None else ModelDir(scratch, (), ())
    )
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        return write_incremental(
            before,
            model,
            torch_source(shard_layout(previous)),
            torch_source(layout),
            out,
            identity=identity,
            step=step,
            previous_identity=previous_identity,
            ignored=ignored,
            options=options,
            pool=pool,
            previous_digest=previous_digest,
            store_headers=True,
        )
    finally:
        if pool is not None:
            pool.shutdown()
