"""A pod's files: volumes shared by its containers at their mount paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotload.errors import ContainerConfigInvalid
from hotload.local.runtime.environment import ApiSources, PodFacts
from hotload.local.runtime.volumes import (
    PodDirectory,
    memory_root,
    remove_memory_root,
    remove_stale_pod_dirs,
)
from hotload.mounts import host_path

POD: dict[str, Any] = {
    "metadata": {"name": "demo-0", "namespace": "ns", "uid": "u-1", "labels": {"a": "b"}},
    "spec": {
        "volumes": [
            {"name": "staging", "emptyDir": {"medium": "Memory"}},
            {
                "name": "settings",
                "configMap": {"name": "cm", "items": [{"key": "k", "path": "dir/k.txt"}]},
            },
            {"name": "creds", "secret": {"secretName": "s"}},
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"},
                                    }
                                ]
                            }
                        },
                    ]
                },
            },
        ],
        "containers": [
            {
                "name": "engine",
                "volumeMounts": [{"name": "staging", "mountPath": "/var/lib/hotload/staging"}],
            },
            {
                "name": "sidecar",
                "volumeMounts": [
                    {"name": "staging", "mountPath": "/data/staging"},
                    {"name": "settings", "mountPath": "/etc/settings"},
                    {"name": "creds", "mountPath": "/etc/creds"},
                    {
                        "name": "kube-api-access",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    },
                    {"name": "staging", "mountPath": "/sub", "subPath": "part"},
                ],
            },
        ],
    },
}
SOURCES = ApiSources(secrets={"s": {"password": "hunter2"}}, config_maps={"cm": {"k": "v"}})


@pytest.fixture(autouse=True)
def _no_memory_left(tmp_path: Path) -> Iterator[None]:
    """Memory emptyDirs live on /dev/shm, outside tmp_path: remove them after each test."""
    yield
    remove_memory_root(tmp_path / "pods")


def _filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (longest mount point of /proc/mounts)."""
    resolved = str(path.resolve())
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        mount_point, fs_type = line.split()[1:3]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, kind = mount_point, fs_type
    return kind


def _prepared(tmp_path: Path, pod: dict[str, Any] = POD) -> PodDirectory:
    directory = PodDirectory(tmp_path / "pods", pod)
    directory.create()
    facts = PodFacts(pod, "127.9.1.1", "127.0.0.1")
    directory.prepare_volumes(pod, facts, SOURCES, {None: "the-token"})
    return directory


def test_containers_share_a_volume_at_their_own_mount_paths(tmp_path: Path) -> None:
    directory = _prepared(tmp_path)
    engine_root = directory.mount(POD["spec"]["containers"][0])
    sidecar_root = directory.mount(POD["spec"]["containers"][1])
    (host_path("/data/staging", sidecar_root) / "weights.safetensors").write_bytes(b"x")
    seen = host_path("/var/lib/hotload/staging", engine_root) / "weights.safetensors"
    assert seen.read_bytes() == b"x"
    assert (host_path("/etc/settings", sidecar_root) / "dir" / "k.txt").read_text() == "v"
    assert (host_path("/etc/creds", sidecar_root) / "password").read_text() == "hunter2"
    token_dir = host_path("/var/run/secrets/kubernetes.io/serviceaccount", sidecar_root)
    assert (token_dir / "token").read_text() == "the-token"
    assert (token_dir / "namespace").read_text() == "ns"
    (host_path("/sub", sidecar_root) / "f").write_text("in a subPath")
    assert (directory.volume_dir("staging") / "part" / "f").read_text() == "in a subPath"


def test_mounting_twice_is_harmless(tmp_path: Path) -> None:
    directory = _prepared(tmp_path)
    container = POD["spec"]["containers"][1]
    assert directory.mount(container) == directory.mount(container)


def test_a_volume_type_the_runtime_cannot_provide_is_a_config_error(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u-2"},
        "spec": {
            "volumes": [{"name": "host", "hostPath": {"path": "/etc"}}],
            "containers": [{"name": "c", "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
        },
    }
    directory = PodDirectory(tmp_path / "pods", pod)
    directory.create()
    with pytest.raises(ContainerConfigInvalid, match="volume type"):
        directory.prepare_volumes(pod, PodFacts(pod, "127.9.1.2", "127.0.0.1"), ApiSources(), {})


def test_stale_pod_directories_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    live = _prepared(tmp_path)
    gone = PodDirectory(tmp_path / "pods", {"metadata": {"name": "old", "uid": "u-gone"}})
    gone.create()
    removed = remove_stale_pod_dirs(tmp_path / "pods", {"u-1"})
    assert removed == [gone.path.name]
    assert live.path.exists() and not gone.path.exists()


def test_memory_empty_dirs_are_on_tmpfs_as_in_a_real_pod(tmp_path: Path) -> None:
    """The kubelet backs ``emptyDir: {medium: Memory}`` with tmpfs; so does the runtime,
    so staging pays no disk writes or fsync to a device here either."""
    pod = {**POD, "spec": {**POD["spec"], "volumes": [*POD["spec"]["volumes"]]}}
    pod["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    directory = _prepared(tmp_path, pod)
    staging = directory.volume_dir("staging")
    root = memory_root(tmp_path / "pods")
    assert root is not None and staging.resolve().is_relative_to(root)
    assert _filesystem_type(staging) == "tmpfs"
    assert not directory.volume_dir("scratch").is_symlink()  # no medium: a plain folder
    sidecar_root = directory.mount(POD["spec"]["containers"][1])
    (host_path("/data/staging", sidecar_root) / "w").write_bytes(b"x")
    assert (staging.resolve() / "w").read_bytes() == b"x"
    directory.prepare_volumes(pod, PodFacts(pod, "127.9.1.1", "127.0.0.1"), SOURCES, {})
    assert (staging / "w").read_bytes() == b"x", "refreshing volumes must keep their files"


def test_removing_a_pod_removes_its_memory_volumes(tmp_path: Path) -> None:
    directory = _prepared(tmp_path)
    folder = directory.volume_dir("staging").resolve()
    assert folder.is_dir()
    directory.remove()
    assert not folder.exists() and not directory.path.exists()


def test_stale_memory_volumes_are_removed_and_the_region_root_on_down(tmp_path: Path) -> None:
    live = _prepared(tmp_path)
    pod = {**POD, "metadata": {**POD["metadata"], "name": "old", "uid": "u-gone"}}
    gone = _prepared(tmp_path, pod)
    gone_folder = gone.volume_dir("staging").resolve()
    remove_stale_pod_dirs(tmp_path / "pods", {"u-1"})
    assert not gone_folder.exists()
    assert live.volume_dir("staging").resolve().is_dir()
    remove_memory_root(tmp_path / "pods")
    root = memory_root(tmp_path / "pods")
    assert root is not None and not root.exists()
