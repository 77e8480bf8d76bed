"""Engine images the local pod runtime runs from a virtualenv of the cache.

A pod's engine container names an image (``vllm/vllm-openai:v0.32.0``) and a command
(``vllm serve ...``) written for a real cluster. The runtime has no container engine;
for the images in :data:`LOCAL_IMAGES` it runs the command from the virtualenv that
``hack/install-vllm`` put in ``${HOTLOAD_CACHE}/engines/<name>-<version>`` (the image's
``bin`` first on ``PATH``, the image's own environment under the container's), in a
private mount namespace where each of the container's volumes is bind-mounted at its
``mountPath`` — so the engine reads ``/var/lib/hotload/staging/...`` exactly as the
sidecar names it, as in a real pod (our own ``hotload`` commands map mount paths through
``HOTLOAD_ROOT`` instead; an engine we did not write cannot). That namespace needs root
(``unshare``), as a container runtime does. Anything else stays ``UnsupportedCommand``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hotload.errors import ContainerConfigInvalid, ImageNotInstalled
from hotload.local.locations import cache_dir
from hotload.mounts import host_path

STAMP: Final = ".hotload-stamp"
"""Written last by hack/install-vllm: the virtualenv is complete."""


@dataclass(frozen=True)
class ImageSpec:
    """An image this runtime knows: where its virtualenv lives, its environment."""

    pattern: re.Pattern[str]
    """Matches the image reference; group ``version`` names the virtualenv."""
    venv_name: str
    """``<venv_name>-<version>`` under ``${HOTLOAD_CACHE}/engines``."""
    env: Mapping[str, str]
    """What the image's own ENV lines would set (the container's env wins)."""
    install_hint: str


LOCAL_IMAGES: Final = (
    ImageSpec(
        pattern=re.compile(
            r"^(?:docker\.io/)?vllm/vllm-openai(?:-cpu)?:v(?P<version>[0-9][\w.+-]*)$"
        ),
        venv_name="vllm",
        env={
            # No hub here: a model is a local directory (a bad path is otherwise looked up
            # as a repository id, which needs the network).
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # GiB of KV cache: the vLLM CPU default (4) is a lot beside other servers.
            "VLLM_CPU_KVCACHE_SPACE": "1",
        },
        install_hint="hack/install-vllm",
    ),
)


@dataclass(frozen=True)
class LocalImage:
    """One image resolved to its virtualenv."""

    reference: str
    venv: Path
    env: Mapping[str, str]
    install_hint: str

    @property
    def installed(self) -> bool:
        return (self.venv / STAMP).is_file()


def local_image(reference: str, cache: Path | None = None) -> LocalImage | None:
    """The local image for ``reference``, or None when the runtime does not know it."""
    for spec in LOCAL_IMAGES:
        match = spec.pattern.match(reference.strip())
        if match:
            root = (cache or cache_dir()) / "engines"
            venv = root / f"{spec.venv_name}-{match.group('version')}"
            return LocalImage(reference, venv, dict(spec.env), spec.install_hint)
    return None


def image_env(image: LocalImage, env: Mapping[str, str], own: Sequence[str]) -> dict[str, str]:
    """The container's environment inside ``image``: the image's ENV under the names the
    container sets itself (``own``), its ``bin`` first on ``PATH``, none of the host's
    Python settings (``PYTHONPATH`` points into the project, not into the image)."""
    result = dict(env)
    for name, value in image.env.items():
        if name not in own:
            result[name] = value
    result.pop("PYTHONPATH", None)
    result["VIRTUAL_ENV"] = str(image.venv)
    result["PATH"] = os.pathsep.join([str(image.venv / "bin"), env.get("PATH", os.defpath)])
    return result


def image_argv(
    image: LocalImage, container: Mapping[str, Any], argv: Sequence[str], root: Path
) -> list[str]:
    """``argv`` run inside the image: the command from its ``bin`` when it is there, in a
    private mount namespace with each volume bind-mounted at its ``mountPath``."""
    if not image.installed:
        raise ImageNotInstalled(
            f"the image {image.reference} is not installed here; run {image.install_hint}",
            image=image.reference,
            venv=str(image.venv),
        )
    if not argv:
        raise ContainerConfigInvalid(
            "a local image has no entrypoint: give the container a command",
            image=image.reference,
        )
    command = list(argv)
    inside = image.venv / "bin" / command[0]
    if "/" not in command[0] and inside.exists():
        command[0] = str(inside)
    mounts = [
        (host_path(str(m["mountPath"]), root).resolve(), str(m["mountPath"]), m.get("readOnly"))
        for m in container.get("volumeMounts") or []
    ]
    if not mounts:
        return command
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        raise ContainerConfigInvalid(
            "volumes of a local image need a mount namespace (unshare, as root)",
            image=image.reference,
        )
    script = []
    for source, target, read_only in mounts:
        quoted = shlex.quote(target)
        script.append(f"mkdir -p {quoted} && mount --bind {shlex.quote(str(source))} {quoted}")
        if read_only:
            script.append(f"mount -o remount,bind,ro {quoted}")
    script.append('exec "$@"')
    return [unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-ec",
            " && ".join(script), "sh", *command]  # fmt: skip
