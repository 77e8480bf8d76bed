"""Rebuilding into a staging volume that fills (issue 22, finding 8): a real tmpfs.

Before this test, a fresh rebuild wrote its shards through a memory map of a sparse file,
so a full tmpfs killed the process with ``SIGBUS``; and an in-place rebuild that ran out
of room left its half-written ``.<shard>.new`` (a 1 MiB partial) inside the previous
buffer it restored, whose record still said it was complete. Now the shard's bytes are
claimed before the map is written (``ENOSPC``, which the sidecar classes ``DiskFull``)
and the restored buffer holds exactly what it held.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hotload.snapshot import REBUILT_NAME, encode, encode_full, rebuild
from tests.fixtures.small_volume import small_volume
from tests.unit.snapshot.models import Tensor, nudge, words, write_model
from tests.unit.snapshot.test_in_place import _write_with_metadata

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[3]


def _tensors() -> dict[str, Tensor]:
    """One 1 MiB tensor and a small one: a shard big enough to fail in its middle."""
    return {
        "big.weight": ("BF16", words("BF16", (512, 1024), 1)),
        "small.bias": ("F32", words("F32", (64,), 2)),
    }


def _snapshot_of(directory: Path) -> dict[str, str]:
    """Every file, hidden ones included, with its sha256."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _chain(root: Path, metadata: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A Full (s1, rebuilt as r1 on the test's disk) and a delta s2 against it; the shard of
    step 2 carries ``metadata`` in its header when given (a trainer writing the step)."""
    tensors = _tensors()
    moved = {n: (d, nudge(a, 0.02, 7)) for n, (d, a) in tensors.items()}
    v1 = write_model(root / "v1", {"model.safetensors": tensors})
    v2 = write_model(root / "v2", {"model.safetensors": moved})
    if metadata is not None:
        _write_with_metadata(v2 / "model.safetensors", moved, metadata)
    full = encode_full(v1, root / "s1", identity="s1", step=1)
    rebuild(None, full.path, root / "r1")
    delta = encode(root / "r1", v2, root / "s2", identity="s2", step=2, previous_identity="s1")
    return full.path, delta.path


def test_a_fresh_rebuild_into_a_full_tmpfs_fails_with_enospc_not_sigbus(tmp_path: Path) -> None:
    _, delta = _chain(tmp_path)
    with small_volume(tmp_path / "staging", 4 * MIB) as volume:
        volume.fill(leave=256 * 1024)  # the small files fit, the decoded shard does not
        script = textwrap.dedent(
            f"""
            import errno, sys
            from pathlib import Path
            from hotload.snapshot import rebuild
            try:
                rebuild(Path({str(tmp_path / "r1")!r}), Path({str(delta)!r}),
                        Path({str(volume.path / "r2")!r}))
            except OSError as err:
                sys.exit(3 if err.errno == errno.ENOSPC else 4)
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120
        )
        assert done.returncode == 3, (
            f"the rebuild ended with {done.returncode} (-7 is SIGBUS), not ENOSPC: "
            f"{done.stderr.decode()[-2000:]}"
        )
        assert volume.files() == [], "the failed rebuild left files behind"
        volume.release()
        rebuild(tmp_path / "r1", delta, volume.path / "r2")
        assert (volume.path / "r2" / REBUILT_NAME).is_file()


@pytest.mark.parametrize(
    "metadata",
    [{"step": "2"}, {"step": "2" * 64}],
    ids=["same-header-length", "header-rewritten"],
)
def test_an_in_place_rebuild_out_of_room_restores_the_buffer_without_strays(
    tmp_path: Path, metadata: dict[str, str]
) -> None:
    full, delta = _chain(tmp_path, metadata)
    with small_volume(tmp_path / "staging", 4 * MIB) as volume:
        previous = volume.path / "r1"
        rebuild(None, full, previous)
        before = _snapshot_of(previous)
        # Room for the small files (config, record) but not for a copy of the shard.
        volume.fill(leave=0 if metadata == {"step": "2"} else 256 * 1024)
        with pytest.raises(OSError) as caught:
            rebuild(previous, delta, volume.path / "r2", consume_previous=True)
        assert caught.value.errno == 28
        assert _snapshot_of(previous) == before, "the restored buffer changed or holds strays"
        assert not (volume.path / "r2").exists()
        assert [p.name for p in volume.path.iterdir() if p.name != ".filler"] == ["r1"]
        volume.release()
        rebuild(previous, delta, volume.path / "r2", consume_previous=True)
        assert not [p for p in (volume.path / "r2").rglob(".*")]
