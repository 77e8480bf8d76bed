"""Engine images the local runtime runs from the cache (hotload.local.runtime.images).

Pure planning: which images are known, where their virtualenv is, the environment and
command line a container gets. The real vLLM running as a pod's engine is covered by
tests/integration/engines/test_vllm_real.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hotload.errors import ImageNotInstalled
from hotload.local.runtime.images import STAMP, image_argv, image_env, local_image
from hotload.local.runtime.ownership import ContainerMode, plan_containers


def test_vllm_images_map_to_the_virtualenv_of_their_version(tmp_path: Path) -> None:
    image = local_image("vllm/vllm-openai:v0.32.0", tmp_path)
    assert image is not None
    assert image.venv == tmp_path / "engines" / "vllm-0.32.0"
    assert local_image("docker.io/vllm/vllm-openai:v0.33.0", tmp_path).venv.name == (  # type: ignore[union-attr]
        "vllm-0.33.0"
    )
    assert local_image("lmsysorg/sglang:v0.5.23", tmp_path) is None
    assert local_image("vllm/vllm-openai:latest", tmp_path) is None


def test_a_pod_with_a_vllm_engine_container_runs_it_and_nothing_unknown() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "engine", "image": "vllm/vllm-openai:v0.32.0", "command": ["vllm"]},
                {"name": "other", "image": "busybox", "command": ["sh"]},
                {"name": "sidecar", "image": "hotload", "command": ["hotload", "sidecar"]},
            ]
        },
    }
    modes = [plan.mode for plan in plan_containers(pod)]
    assert modes == [ContainerMode.IMAGE, ContainerMode.UNSUPPORTED, ContainerMode.PROCESS]


def test_the_image_env_sits_under_the_containers_own_and_drops_the_projects_python(
    tmp_path: Path,
) -> None:
    image = local_image("vllm/vllm-openai:v0.32.0", tmp_path)
    assert image is not None
    env = image_env(
        image,
        {"PATH": "/usr/bin", "PYTHONPATH": "/work", "VLLM_CPU_KVCACHE_SPACE": "3"},
        own=["VLLM_CPU_KVCACHE_SPACE"],
    )
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"  # the container's own value wins
    assert env["HF_HUB_OFFLINE"] == "1"  # the image's default
    assert "PYTHONPATH" not in env
    assert env["PATH"].split(os.pathsep)[0] == str(image.venv / "bin")


def test_a_missing_install_waits_with_err_image_never_pull(tmp_path: Path) -> None:
    image = local_image("vllm/vllm-openai:v0.32.0", tmp_path)
    assert image is not None
    with pytest.raises(ImageNotInstalled) as raised:
        image_argv(image, {}, ["vllm", "serve"], tmp_path)
    assert raised.value.reason == "ErrImageNeverPull"
    assert "hack/install-vllm" in str(raised.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_volumes_are_mounted_at_their_mount_path_inside_the_namespace(tmp_path: Path) -> None:
    image = local_image("vllm/vllm-openai:v0.32.0", tmp_path)
    assert image is not None
    (image.venv / "bin").mkdir(parents=True)
    (image.venv / STAMP).write_text("x")
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "weights").write_text("served")
    root = tmp_path / "root"
    mount_path = f"/tmp/hotload-image-test-{os.getpid()}/staging"
    (root / mount_path.lstrip("/")).parent.mkdir(parents=True)
    (root / mount_path.lstrip("/")).symlink_to(volume)
    container = {"volumeMounts": [{"name": "s", "mountPath": mount_path, "readOnly": True}]}
    try:
        argv = image_argv(image, container, ["cat", f"{mount_path}/weights"], root)
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert out.stdout == "served"
        assert not Path(mount_path, "weights").exists()  # only inside the namespace
        write = image_argv(image, container, ["touch", f"{mount_path}/new"], root)
        assert subprocess.run(write, capture_output=True).returncode != 0  # readOnly holds
    finally:
        shutil.rmtree(Path(mount_path).parent, ignore_errors=True)  # the empty mount point
