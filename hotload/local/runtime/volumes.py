"""A pod's files on this host: its directory, its volumes and each container's root.

Layout (one directory per pod under the region's ``runtime/pods``)::

    <ns>_<name>_<uid>/
        kubeconfig                 the pod-bound token (``KUBECONFIG``)
        volumes/<volume>/          emptyDir, configMap, secret, projected and
                                   downwardAPI files; an emptyDir of medium Memory is a
                                   link to a folder on tmpfs (below)
        containers/<c>/root/       the container's ``HOTLOAD_ROOT``: ``root/<mountPath>``
                                   is a link to the volume (or its ``subPath``)
        logs/<c>.log               the container's stdout and stderr, across restarts

Every container of the pod that mounts a volume reaches the same folder, even at
different mount paths (CONTRACTS.md, the pod contract).

``emptyDir: {medium: Memory}`` is backed by tmpfs, as the kubelet does: its folder lives
under ``/dev/shm/hotload-<hash of the pods directory>/<pod>/<volume>`` (the region's
memory root), so staging there costs what it costs in a real pod — no disk writes, no
fsync to a device — and counts against memory. One with a ``sizeLimit`` is a tmpfs of
that size there (:mod:`~hotload.local.runtime.sized_tmpfs`; as root), so a full staging
volume fails its writes with ``ENOSPC`` as in a real pod. Where ``/dev/shm`` is missing it
is a plain directory as before. ``down`` and the runtime's cleanup remove the memory root
with the pods. Other volume types (hostPath,
persistentVolumeClaim, ...) are refused with ``CreateContainerConfigError`` when a
container mounts them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final

from hotload.errors import ContainerConfigInvalid
from hotload.local.runtime.atomic_files import atomic_write
from hotload.local.runtime.environment import ApiSources, PodFacts, field_value
from hotload.local.runtime.sized_tmpfs import mount_sized, quantity_bytes, unmount_under
from hotload.mounts import host_path

SUPPORTED_VOLUMES: Final = ("emptyDir", "configMap", "secret", "projected", "downwardAPI")
SHARED_MEMORY: Final = Path("/dev/shm")


def memory_root(pods_dir: Path) -> Path | None:
    """Where the region's Memory emptyDirs live (tmpfs), or None where there is none."""
    if not SHARED_MEMORY.is_dir():
        return None
    digest = hashlib.sha256(str(pods_dir.absolute()).encode()).hexdigest()[:16]
    return SHARED_MEMORY / f"hotload-{digest}"


def remove_memory_root(pods_dir: Path) -> None:
    """Remove every Memory emptyDir of the region whose pods live in ``pods_dir``."""
    root = memory_root(pods_dir)
    if root is not None:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def _safe_relative(path: str, *, what: str) -> PurePosixPath:
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ContainerConfigInvalid(f"{what} must be a relative path without '..'", path=path)
    return relative


class PodDirectory:
    """The files of one pod; created before its containers start, removed after they stop."""

    def __init__(self, pods_dir: Path, pod: Mapping[str, Any]) -> None:
        metadata = pod["metadata"]
        self.uid = str(metadata["uid"])
        name = f"{metadata.get('namespace', 'default')}_{metadata['name']}_{self.uid}"
        self.path = pods_dir / name
        root = memory_root(pods_dir)
        self.memory_path = None if root is None else root / name
        """The pod's folder on tmpfs, for its emptyDirs of medium Memory."""

    @property
    def kubeconfig(self) -> Path:
        return self.path / "kubeconfig"

    def volume_dir(self, name: str) -> Path:
        return self.path / "volumes" / name

    def container_root(self, container: str) -> Path:
        return self.path / "containers" / container / "root"

    def log_path(self, container: str) -> Path:
        return self.path / "logs" / f"{container}.log"

    def create(self) -> None:
        for sub in ("volumes", "containers", "logs"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    # --- volumes -----------------------------------------------------------------------

    def prepare_volumes(
        self,
        pod: Mapping[str, Any],
        facts: PodFacts,
        sources: ApiSources,
        tokens: Mapping[str | None, str],
    ) -> None:
        """Create or refresh every volume of the pod (files are rewritten atomically)."""
        mounted = {
            mount["name"]
            for container in pod.get("spec", {}).get("containers") or []
            for mount in container.get("volumeMounts") or []
        }
        for volume in pod.get("spec", {}).get("volumes") or []:
            name = str(volume["name"])
            kind = next((k for k in SUPPORTED_VOLUMES if k in volume), None)
            if kind is None:
                if name in mounted:
                    others = sorted(k for k in volume if k != "name")
                    raise ContainerConfigInvalid(
                        "the local pod runtime cannot provide this volume type",
                        volume=name,
                        types=others,
                    )
                continue
            target = self.volume_dir(name)
            if kind == "emptyDir":
                self._empty_dir(target, name, volume["emptyDir"] or {})
            elif kind == "configMap":
                spec = volume["configMap"]
                self._key_files(target, "ConfigMap", spec["name"], spec, sources.config_maps)
            elif kind == "secret":
                spec = volume["secret"]
                self._key_files(target, "Secret", spec["secretName"], spec, sources.secrets)
            elif kind == "downwardAPI":
                target.mkdir(parents=True, exist_ok=True)
                self._downward_files(target, volume["downwardAPI"].get("items") or [], facts)
            else:
                self._projected(target, volume["projected"], facts, sources, tokens)

    def _empty_dir(self, target: Path, name: str, spec: Mapping[str, Any]) -> None:
        if spec.get("medium") != "Memory" or self.memory_path is None:
            target.mkdir(parents=True, exist_ok=True)
            return
        folder = self.memory_path / name
        folder.mkdir(parents=True, exist_ok=True)
        if spec.get("sizeLimit") is not None:
            mount_sized(folder, quantity_bytes(spec["sizeLimit"]))
        if target.is_symlink() and Path(os.readlink(target)) == folder:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        link = target.with_name(f".{name}.link")
        link.unlink(missing_ok=True)
        link.symlink_to(folder, target_is_directory=True)
        os.replace(link, target)

    def _key_files(
        self,
        target: Path,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        objects: Mapping[str, Mapping[str, str] | None],
    ) -> None:
        data = objects.get(name)
        target.mkdir(parents=True, exist_ok=True)
        if data is None:
            if spec.get("optional", False):
                return
            raise ContainerConfigInvalid(f"{kind} {name!r} not found", kind=kind, name=name)
        items = spec.get("items")
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        mode = 0o600 if kind == "Secret" else 0o644
        for key, path in pairs:
            if key not in data:
                if spec.get("optional", False):
                    continue
                raise ContainerConfigInvalid(
                    f"key {key!r} not found in {kind} {name!r}", kind=kind, name=name, key=key
                )
            relative = _safe_relative(path, what="a volume item path")
            atomic_write(target.joinpath(*relative.parts), data[key].encode(), mode)

    def _downward_files(
        self, target: Path, items: list[Mapping[str, Any]], facts: PodFacts
    ) -> None:
        metadata = facts.pod.get("metadata", {})
        for item in items:
            relative = _safe_relative(str(item["path"]), what="a downwardAPI path")
            field_path = str((item.get("fieldRef") or {}).get("fieldPath", ""))
            if field_path in ("metadata.labels", "metadata.annotations"):
                values = metadata.get(field_path.split(".")[1]) or {}
                text = "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
            elif field_path:
                text = field_value(facts, field_path)
            else:
                raise ContainerConfigInvalid(
                    "downwardAPI volume items need a fieldRef", path=str(item["path"])
                )
            atomic_write(target.joinpath(*relative.parts), text.encode())

    def _projected(
        self,
        target: Path,
        spec: Mapping[str, Any],
        facts: PodFacts,
        sources: ApiSources,
        tokens: Mapping[str | None, str],
    ) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for source in spec.get("sources") or []:
            if "serviceAccountToken" in source:
                token_spec = source["serviceAccountToken"]
                relative = _safe_relative(str(token_spec["path"]), what="a token path")
                token = tokens.get(token_spec.get("audience")) or tokens.get(None)
                if token is not None:
                    atomic_write(target.joinpath(*relative.parts), token.encode(), 0o600)
            elif "configMap" in source:
                ref = source["configMap"]
                self._key_files(target, "ConfigMap", ref["name"], ref, sources.config_maps)
            elif "secret" in source:
                ref = source["secret"]
                self._key_files(target, "Secret", ref["name"], ref, sources.secrets)
            elif "downwardAPI" in source:
                self._downward_files(target, source["downwardAPI"].get("items") or [], facts)

    # --- mounts ------------------------------------------------------------------------

    def mount(self, container: Mapping[str, Any]) -> Path:
        """Make the container's root, with a link at each mount path; returns the root."""
        root = self.container_root(str(container["name"]))
        root.mkdir(parents=True, exist_ok=True)
        for mount in container.get("volumeMounts") or []:
            volume = self.volume_dir(str(mount["name"]))
            if not (volume.exists() or volume.is_symlink()):
                raise ContainerConfigInvalid(
                    "a volumeMount names no volume of the pod", volume=str(mount["name"])
                )
            source = volume
            if mount.get("subPath"):
                relative = _safe_relative(str(mount["subPath"]), what="a subPath")
                source = volume.joinpath(*relative.parts)
                source.mkdir(parents=True, exist_ok=True)
            link = host_path(str(mount["mountPath"]), root)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink():
                if Path(os.readlink(link)) == source:
                    continue
                link.unlink()
            elif link.exists():
                raise ContainerConfigInvalid(
                    "two volumeMounts of one container overlap", mount_path=str(mount["mountPath"])
                )
            link.symlink_to(source, target_is_directory=True)
        return root

    # --- cleanup -----------------------------------------------------------------------

    def remove(self) -> None:
        """Delete the pod's files (volumes, roots, kubeconfig, logs, its tmpfs folder)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self.memory_path is not None:
            unmount_under(self.memory_path)
            shutil.rmtree(self.memory_path, ignore_errors=True)


def remove_stale_pod_dirs(pods_dir: Path, live_uids: set[str]) -> list[str]:
    """Remove the directories of pods that no longer exist (after a runtime restart)."""
    removed: list[str] = []
    root = memory_root(pods_dir)
    for directory in (pods_dir, root):
        if directory is not None and directory.is_dir():
            for entry in directory.iterdir():
                uid = entry.name.rsplit("_", 1)[-1]
                if uid not in live_uids:
                    unmount_under(entry)
                    shutil.rmtree(entry, ignore_errors=True)
                    if directory == pods_dir:
                        removed.append(entry.name)
    return removed
