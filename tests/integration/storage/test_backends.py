"""The Storage contract, on a real directory and on a real MinIO: what the sidecar relies on."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hotload.errors import ChecksumMismatch, NotFound, ObjectTooLarge
from hotload.storage import Storage
from hotload.storage.download import part_path, state_path

KIB = 1024


class Interrupted(Exception):
    """Raised from a progress callback to cut a download short, as a crash would."""


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible bytes (so a wrong offset cannot go unnoticed)."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


async def test_objects_round_trip_and_list_by_prefix(storage: Storage) -> None:
    await storage.put("step-1/hotload-manifest.json", b'{"kind":"Full"}')
    await storage.put("step-1/model.safetensors", payload(1000))
    await storage.put("step-10/hotload-manifest.json", b"{}")

    assert await storage.get("step-1/hotload-manifest.json") == b'{"kind":"Full"}'
    assert [info.key for info in await storage.list("step-1/")] == [
        "step-1/hotload-manifest.json",
        "step-1/model.safetensors",
    ]
    assert [info.key for info in await storage.list("step-1")] == [
        "step-1/hotload-manifest.json",
        "step-1/model.safetensors",
        "step-10/hotload-manifest.json",
    ]
    info = await storage.stat("step-1/model.safetensors")
    assert (info.key, info.size) == ("step-1/model.safetensors", 1000)
    assert info.etag
    assert await storage.size("step-1/model.safetensors") == 1000


async def test_put_overwrites_whole_objects(storage: Storage) -> None:
    await storage.put("a/b", b"first version, longer")
    await storage.put("a/b", b"second")
    assert await storage.get("a/b") == b"second"


async def test_get_range_is_exact_and_clamped_at_the_end(storage: Storage) -> None:
    data = payload(10 * KIB)
    await storage.put("blob", data)
    assert await storage.get_range("blob", 0, 1) == data[:1]
    assert await storage.get_range("blob", 4097, 8193) == data[4097:8193]
    assert await storage.get_range("blob", 10 * KIB - 5, 20 * KIB) == data[-5:]
    assert await storage.get_range("blob", 100, 100) == b""
    assert await storage.get_range("blob", 10 * KIB + 10, 10 * KIB + 20) == b""  # past the end


async def test_missing_objects_are_not_found(storage: Storage, tmp_path: Path) -> None:
    await storage.put("present", b"x")
    for call in (
        storage.get("absent/hotload-manifest.json"),
        storage.get_range("absent/file", 0, 10),
        storage.stat("absent/file"),
        storage.download("absent/file", tmp_path / "dest"),
    ):
        with pytest.raises(NotFound) as raised:
            await call
        assert raised.value.transient  # replication may deliver it later
        assert raised.value.context["key"].startswith("absent/")
    assert not (tmp_path / "dest").exists()
    assert await storage.list("absent/") == []


async def test_get_refuses_objects_over_its_cap(storage: Storage) -> None:
    await storage.put("big", payload(4 * KIB))
    with pytest.raises(ObjectTooLarge) as raised:
        await storage.get("big", max_bytes=KIB)
    assert not raised.value.transient
    assert await storage.get("big", max_bytes=4 * KIB) == payload(4 * KIB)


async def test_delete_removes_and_tolerates_missing(storage: Storage) -> None:
    await storage.put("x/y/z", b"1")
    await storage.delete("x/y/z")
    await storage.delete("x/y/z")
    assert await storage.list() == []
    with pytest.raises(NotFound):
        await storage.get("x/y/z")


async def test_put_file_uploads_a_local_file(storage: Storage, tmp_path: Path) -> None:
    source = tmp_path / "model.safetensors"
    source.write_bytes(payload(300 * KIB, seed=3))
    await storage.put_file("step-2/model.safetensors", source)
    assert await storage.get("step-2/model.safetensors") == source.read_bytes()


async def test_parallel_ranged_download_is_byte_exact(storage: Storage, tmp_path: Path) -> None:
    data = payload(1000 * KIB + 123, seed=1)
    await storage.put("step-3/model.safetensors", data)
    seen: list[tuple[int, int]] = []
    dest = tmp_path / "staging" / "model.safetensors"

    result = await storage.download(
        "step-3/model.safetensors",
        dest,
        expected_size=len(data),
        part_size=64 * KIB,
        concurrency=4,
        progress=lambda done, total: seen.append((done, total)),
    )

    assert dest.read_bytes() == data
    assert (result.size, result.fetched_bytes, result.resumed_bytes, result.parts) == (
        len(data),
        len(data),
        0,
        16,
    )
    assert seen[0] == (0, len(data))
    assert seen[-1] == (len(data), len(data))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert not part_path(dest).exists()
    assert not state_path(dest).exists()


async def test_empty_objects_download_to_empty_files(storage: Storage, tmp_path: Path) -> None:
    await storage.put("empty", b"")
    result = await storage.download("empty", tmp_path / "empty", expected_size=0)
    assert (tmp_path / "empty").read_bytes() == b""
    assert result.parts == 0


async def test_interrupted_download_resumes_without_refetching_finished_parts(
    storage: Storage, tmp_path: Path
) -> None:
    data = payload(512 * KIB, seed=2)
    await storage.put("step-4/model.safetensors", data)
    dest = tmp_path / "model.safetensors"
    parts_before_crash = 3

    def crash_after_some_parts(done: int, total: int) -> None:
        if done >= parts_before_crash * 32 * KIB:
            raise Interrupted

    with pytest.raises(Interrupted):
        await storage.download(
            "step-4/model.safetensors",
            dest,
            part_size=32 * KIB,
            concurrency=1,
            progress=crash_after_some_parts,
        )
    assert not dest.exists()  # nothing unfinished is ever under the final name
    assert part_path(dest).exists() and state_path(dest).exists()

    result = await storage.download(
        "step-4/model.safetensors", dest, part_size=32 * KIB, concurrency=3
    )

    assert dest.read_bytes() == data
    assert result.resumed_bytes == parts_before_crash * 32 * KIB
    assert result.fetched_bytes == len(data) - result.resumed_bytes
    assert result.parts == 16 - parts_before_crash


async def test_download_starts_over_when_the_object_changed(
    storage: Storage, tmp_path: Path
) -> None:
    await storage.put("obj", payload(256 * KIB, seed=4))
    dest = tmp_path / "obj"

    def crash(done: int, total: int) -> None:
        if done >= 64 * KIB:
            raise Interrupted

    with pytest.raises(Interrupted):
        await storage.download("obj", dest, part_size=32 * KIB, concurrency=1, progress=crash)
    replacement = payload(200 * KIB, seed=5)
    await storage.put("obj", replacement)

    result = await storage.download("obj", dest, part_size=32 * KIB)

    assert result.resumed_bytes == 0
    assert dest.read_bytes() == replacement


async def test_download_ignores_a_damaged_resume_record(storage: Storage, tmp_path: Path) -> None:
    data = payload(128 * KIB, seed=6)
    await storage.put("obj", data)
    dest = tmp_path / "obj"
    part_path(dest).write_bytes(b"\xff" * len(data))
    state_path(dest).write_text("{not json")

    result = await storage.download("obj", dest, part_size=32 * KIB)

    assert result.resumed_bytes == 0
    assert dest.read_bytes() == data


async def test_size_disagreeing_with_the_manifest_is_refused_before_fetching(
    storage: Storage, tmp_path: Path
) -> None:
    await storage.put("obj", payload(1000))
    with pytest.raises(ChecksumMismatch) as raised:
        await storage.download("obj", tmp_path / "obj", expected_size=999)
    assert raised.value.context["size"] == 1000
    assert not (tmp_path / "obj").exists()
    assert not part_path(tmp_path / "obj").exists()


async def test_file_bucket_never_shows_half_written_objects(tmp_path: Path) -> None:
    from hotload.storage import open_storage
    from hotload.storage.file_storage import TEMP_PREFIX

    storage = open_storage(f"file://{tmp_path}/bucket")
    await storage.put("step/obj", b"done")
    (tmp_path / "bucket" / "step" / f"{TEMP_PREFIX}abc-obj2").write_bytes(b"half")
    assert [info.key for info in await storage.list()] == ["step/obj"]
    assert os.listdir(tmp_path / "bucket" / "step") != []


async def test_a_download_keeps_its_partial_file_where_the_caller_says(
    storage: Storage, tmp_path: Path
) -> None:
    data = payload(128 * KIB, seed=7)
    await storage.put("snap/x", data)
    await storage.put("snap/x.part", b"a real file called x.part")
    dest = tmp_path / "fetch" / "x"
    partial = tmp_path / "partial" / "x"

    def crash(done: int, total: int) -> None:
        if done >= 64 * KIB:
            raise Interrupted

    with pytest.raises(Interrupted):
        await storage.download("snap/x", dest, part_size=32 * KIB, concurrency=1, progress=crash)
    # The first download (no partial given) left dest.part; this one keeps its own.
    with pytest.raises(Interrupted):
        await storage.download(
            "snap/x", dest, part_size=32 * KIB, concurrency=1, progress=crash, partial=partial
        )
    assert partial.exists() and state_path(dest, partial).exists()
    await storage.download(
        "snap/x.part", tmp_path / "fetch" / "x.part", partial=partial.with_name("x.part")
    )
    result = await storage.download("snap/x", dest, part_size=32 * KIB, partial=partial)
    assert dest.read_bytes() == data
    assert result.resumed_bytes >= 64 * KIB
    assert (tmp_path / "fetch" / "x.part").read_bytes() == b"a real file called x.part"
    assert not partial.exists(), "the download's own directory goes when it is done"


async def test_a_cancelled_download_returns_only_when_nothing_writes_its_file(
    storage: Storage, tmp_path: Path
) -> None:
    import asyncio

    data = payload(512 * KIB, seed=8)
    await storage.put("obj", data)
    dest = tmp_path / "obj"
    started = asyncio.Event()

    def progress(done: int, total: int) -> None:
        if done > 0:
            started.set()

    task = asyncio.create_task(
        storage.download("obj", dest, part_size=16 * KIB, concurrency=4, progress=progress)
    )
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    part = part_path(dest)
    size, mtime = part.stat().st_size, part.stat().st_mtime_ns
    await asyncio.sleep(0.3)
    assert (part.stat().st_size, part.stat().st_mtime_ns) == (size, mtime), "still written to"
    result = await storage.download("obj", dest, part_size=16 * KIB)
    assert dest.read_bytes() == data
    assert result.resumed_bytes > 0


async def test_file_bucket_refuses_symlinks_out_of_the_bucket(tmp_path: Path) -> None:
    from hotload.errors import StorageRejected
    from hotload.storage import open_storage

    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"not the bucket's")
    storage = open_storage(f"file://{tmp_path}/bucket")
    await storage.put("snap/real", b"inside")
    (tmp_path / "bucket" / "snap" / "leak").symlink_to(secret)
    (tmp_path / "bucket" / "snap" / "alias").symlink_to(tmp_path / "bucket" / "snap" / "real")
    (tmp_path / "bucket" / "escape").symlink_to(tmp_path / "outside")
    for key in ("snap/leak", "escape/secret"):
        with pytest.raises(StorageRejected):
            await storage.get(key)
        with pytest.raises(StorageRejected):
            await storage.stat(key)
        with pytest.raises(StorageRejected):
            await storage.download(key, tmp_path / "dest")
    assert await storage.get("snap/alias") == b"inside", "a link inside the bucket is fine"
    assert [info.key for info in await storage.list("snap/")] == ["snap/alias", "snap/real"]
    with pytest.raises(StorageRejected):
        await storage.put("escape/planted", b"x")
    assert not (tmp_path / "outside" / "planted").exists()
