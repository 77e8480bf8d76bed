"""``hotload sidecar`` builds the agent's config from the pod contract's environment only."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.cli.sidecar import config_from_env
from hotload.errors import ConfigError
from hotload.sidecar import AgentConfig

POD_ENV = {
    "POD_NAME": "demo-0",
    "POD_NAMESPACE": "ns",
    "POD_IP": "127.1.3.4",
    "NODE_NAME": "node-1",
    "HOTLOAD_DEPLOYMENT": "demo",
}


def _config(env: dict[str, str]) -> AgentConfig:
    return config_from_env(
        env, port=8480, download_concurrency=4, download_part_size=1 << 20, hold_timeout_s=30
    )


def test_downward_api_env_becomes_the_config() -> None:
    config = _config({**POD_ENV, "HOTLOAD_ROOT": "/tmp/pods/demo-0"})
    assert (config.pod_name, config.namespace, config.deployment) == ("demo-0", "ns", "demo")
    assert config.bind_host == "127.1.3.4"
    assert config.staging_dir == Path("/tmp/pods/demo-0/var/lib/hotload/staging")
    assert config.credentials is None and config.serve_http


def test_the_engine_is_reached_where_the_pod_says_it_listens() -> None:
    """The rendered pod sets HOTLOAD_ENGINE_HOST (its loopback); the front stays on the pod
    IP. Without it (an older pod), the engine is reached on the pod IP."""
    rendered = _config({**POD_ENV, "HOTLOAD_ENGINE_HOST": "127.0.0.1"})
    older = _config(POD_ENV)
    assert (rendered.engine_host, rendered.bind_host) == ("127.0.0.1", "127.1.3.4")
    assert older.engine_host == "127.1.3.4"


def test_without_a_root_staging_is_the_mount_path_and_without_ip_all_interfaces() -> None:
    env = {k: v for k, v in POD_ENV.items() if k != "POD_IP"}
    config = _config(env)
    assert config.staging_dir == Path("/var/lib/hotload/staging")
    assert config.bind_host == "0.0.0.0"


def test_bucket_credentials_come_from_boto3_names_and_never_show_in_repr() -> None:
    config = _config(
        {**POD_ENV, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-v4lue"}
    )
    assert config.credentials is not None
    assert config.credentials.secret_access_key == "s3cr3t-v4lue"
    assert "s3cr3t" not in repr(config) and "AKIDEXAMPLE" not in repr(config)


def test_missing_pod_contract_env_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as missing:
        _config({"POD_NAME": "demo-0"})
    assert missing.value.context["missing"] == ["POD_NAMESPACE", "HOTLOAD_DEPLOYMENT"]
