"""``hotload snapshot encode|decode|verify|inspect``: the snapshot format from a shell.

The same code the publisher and the sidecar run (``hotload.snapshot``); typed errors
leave through ``hotload.cli.main`` as one line on stderr and exit code 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hotload.cli.output import OutputFormat, emit, print_table

if TYPE_CHECKING:
    from hotload.snapshot import SnapshotReport

snapshot_app = typer.Typer(
    name="snapshot",
    help="Encode, decode, verify and inspect hotload-delta/v3 snapshots.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _held_snapshot(previous: Path) -> tuple[str | None, int | None]:
    """Identity and step of the snapshot a directory holds (rebuilt record or manifest)."""
    from hotload.errors import HotloadError
    from hotload.snapshot import MANIFEST_NAME, read_manifest
    from hotload.snapshot.decoder import read_rebuilt_record

    record = read_rebuilt_record(previous)
    if record is not None:
        identity, step = record.get("identity"), record.get("step")
        if isinstance(identity, str) and isinstance(step, int):
            return identity, step
    if (previous / MANIFEST_NAME).is_file():
        try:
            manifest = read_manifest(previous)
        except HotloadError:
            return None, None
        return manifest.identity, manifest.step
    return None, None


@snapshot_app.command("encode")
def encode_command(
    current: Path = typer.Option(..., "--current", help="The new weights: a model directory."),
    out: Path = typer.Option(..., "--out", help="Snapshot directory to write (absent or empty)."),
    previous: Path | None = typer.Option(
        None, "--previous", help="The previous weights; without it a Full (or LoRA) snapshot."
    ),
    identity: str | None = typer.Option(
        None, "--identity", help="Snapshot identity (default: the --out directory's name)."
    ),
    step: int | None = typer.Option(
        None, "--step", min=0, help="Trainer step (default: the previous step + 1, else 0)."
    ),
    previous_identity: str | None = typer.Option(
        None,
        "--previous-identity",
        help="Identity of --previous (default: read from its rebuilt record or manifest).",
    ),
    ignore_config_field: list[str] = typer.Option(
        [], "--ignore-config-field", help="config.json key that may change (repeatable)."
    ),
    level: int = typer.Option(3, "--level", min=1, max=22, help="zstd level."),
    threads: int = typer.Option(1, "--threads", min=1, help="Encoder threads."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Write a snapshot of --current (a delta against --previous when given)."""
    from hotload.errors import ConfigError
    from hotload.snapshot import CodecOptions, encode

    held_identity, held_step = (None, None) if previous is None else _held_snapshot(previous)
    previous_identity = previous_identity or held_identity
    if previous is not None and previous_identity is None:
        raise ConfigError("--previous-identity is needed: --previous does not say what it holds")
    if step is None:
        step = 0 if held_step is None else held_step + 1
    result = encode(
        previous,
        current,
        out,
        identity=identity or out.name,
        step=step,
        previous_identity=previous_identity,
        ignored_config_fields=ignore_config_field,
        options=CodecOptions(level=level),
        threads=threads,
    )
    manifest = result.manifest
    data = {
        "identity": manifest.identity,
        "step": manifest.step,
        "kind": manifest.kind.value,
        "previous": manifest.previous,
        "path": str(result.path),
        "tensorBytes": result.tensor_bytes,
        "storedBytes": result.stored_bytes,
        "ratio": round(result.ratio, 3),
    }
    if not emit(data, output):
        typer.echo(
            f"wrote {manifest.kind.value} snapshot {manifest.identity} (step {manifest.step}) "
            f"to {result.path}: {result.stored_bytes} bytes stored for {result.tensor_bytes} "
            f"bytes of tensors, ratio {result.ratio:.1f}x"
        )


@snapshot_app.command("decode")
def decode_command(
    snapshot: Path = typer.Option(..., "--snapshot", help="The snapshot directory."),
    out: Path = typer.Option(..., "--out", help="Rebuilt model directory (absent or empty)."),
    previous: Path | None = typer.Option(
        None, "--previous", help="Rebuilt directory of the delta's previous snapshot."
    ),
    threads: int = typer.Option(1, "--threads", min=1, help="Decoder threads."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Rebuild the full model directory of --snapshot, every checksum verified."""
    from hotload.snapshot import rebuild

    result = rebuild(previous, snapshot, out, threads=threads)
    data = {
        "identity": result.manifest.identity,
        "step": result.manifest.step,
        "kind": result.manifest.kind.value,
        "path": str(result.path),
        "tensorBytes": result.tensor_bytes,
        "files": result.files,
    }
    if not emit(data, output):
        typer.echo(
            f"rebuilt {result.manifest.identity} into {result.path}: "
            f"{result.files} files, {result.tensor_bytes} bytes of tensors verified"
        )


@snapshot_app.command("verify")
def verify_command(
    snapshot: Path = typer.Argument(..., help="The snapshot directory."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Check every stored file's size and hash, and every payload's layout."""
    from hotload.snapshot import verify

    result = verify(snapshot)
    data = {
        "identity": result.manifest.identity,
        "kind": result.manifest.kind.value,
        "files": result.files,
        "bytes": result.bytes,
        "verified": True,
    }
    if not emit(data, output):
        typer.echo(f"{result.manifest.identity}: {result.files} files, {result.bytes} bytes, ok")


def report_data(report: SnapshotReport) -> dict[str, Any]:
    """The inspect report as plain data (what ``-o json|yaml`` prints)."""
    manifest = report.manifest
    return {
        "identity": manifest.identity,
        "step": manifest.step,
        "kind": manifest.kind.value,
        "previous": manifest.previous,
        "format": manifest.format,
        "tensorBytes": report.tensor_bytes,
        "storedBytes": report.stored_bytes,
        "manifestBytes": report.manifest_bytes,
        "ratio": round(report.ratio, 3),
        "changedFraction": report.changed_fraction,
        "codecs": report.codec_counts(),
        "removed": report.removed,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "codec": t.codec.value,
                "changed": t.changed,
                "changedFraction": t.changed_fraction,
                "storedBytes": t.stored_bytes,
                "tensorBytes": t.tensor_bytes,
            }
            for t in report.tensors
        ],
    }


@snapshot_app.command("inspect")
def inspect_command(
    snapshot: Path = typer.Argument(..., help="The snapshot directory."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Sizes, compression ratio, and per tensor the codec chosen and the fraction changed."""
    from hotload.snapshot import inspect_snapshot

    report = inspect_snapshot(snapshot)
    if emit(report_data(report), output):
        return
    _print_report(report)


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def _print_report(report: SnapshotReport) -> None:
    from rich.console import Console

    manifest = report.manifest
    console = Console(width=160)
    previous = f" after {manifest.previous}" if manifest.previous else ""
    console.print(
        f"{manifest.identity}: {manifest.kind.value} snapshot, step {manifest.step}{previous}, "
        f"{manifest.format}"
    )
    console.print(
        f"stored {report.stored_bytes} bytes (manifest {report.manifest_bytes}) for "
        f"{report.tensor_bytes} bytes of tensors: ratio {report.ratio:.1f}x, "
        f"changed {_fraction(report.changed_fraction)}"
    )
    rows: list[tuple[str, ...]] = []
    for t in report.tensors:
        ratio = f"{t.tensor_bytes / t.stored_bytes:.1f}x" if t.stored_bytes else "-"
        rows.append(
            (
                t.name,
                t.dtype,
                "x".join(map(str, t.shape)) or "scalar",
                t.codec.value,
                _fraction(t.changed_fraction),
                str(t.stored_bytes),
                ratio,
            )
        )
    columns = ("TENSOR", "DTYPE", "SHAPE", "CODEC", "CHANGED", "STORED", "RATIO")
    print_table(columns, rows, width=160)
    if report.removed:
        console.print(f"removed: {', '.join(report.removed)}")
