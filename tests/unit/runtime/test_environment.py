"""A container's environment and command line, as a kubelet would build them."""

from __future__ import annotations

from typing import Any

import pytest

from hotload.errors import ContainerConfigInvalid
from hotload.local.runtime.environment import (
    ApiSources,
    PodFacts,
    container_argv,
    container_env,
    expand,
    referenced_sources,
)

POD: dict[str, Any] = {
    "metadata": {
        "name": "demo-0",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "demo"},
        "annotations": {"note": "hi"},
    },
    "spec": {"nodeName": "region-1-gpu-0", "serviceAccountName": "demo-sidecar"},
}
FACTS = PodFacts(POD, "127.101.1.7", "127.0.0.1")
WORLD = {"KUBECONFIG": "/pods/x/kubeconfig", "HOTLOAD_ROOT": "/pods/x/root"}


def _env(
    container: dict[str, Any], sources: ApiSources | None = None, **base: str
) -> dict[str, str]:
    return container_env(container, FACTS, sources or ApiSources(), base=base, world=WORLD)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-2"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$", "$"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("tail$", "tail$"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


def test_downward_api_fields_give_the_pod_identity_and_its_runtime_address() -> None:
    fields = {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
        "POD_IP": "status.podIP",
        "HOST_IP": "status.hostIP",
        "NODE_NAME": "spec.nodeName",
        "SA": "spec.serviceAccountName",
        "APP": "metadata.labels['app']",
        "NOTE": "metadata.annotations['note']",
    }
    container = {
        "name": "c",
        "env": [
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in fields.items()
        ],
    }
    env = _env(container)
    assert env["POD_NAME"] == "demo-0"
    assert env["POD_NAMESPACE"] == "ns"
    assert env["POD_UID"] == "u-1"
    assert env["POD_IP"] == "127.101.1.7"
    assert env["HOST_IP"] == "127.0.0.1"
    assert env["NODE_NAME"] == "region-1-gpu-0"
    assert env["SA"] == "demo-sidecar"
    assert env["APP"] == "demo"
    assert env["NOTE"] == "hi"


def test_secret_and_config_map_refs_read_values_and_honour_optional() -> None:
    sources = ApiSources(
        secrets={"bucket": {"AWS_ACCESS_KEY_ID": "id"}, "gone": None},
        config_maps={"settings": {"level": "debug"}},
    )
    container = {
        "name": "c",
        "env": [
            {
                "name": "KEY",
                "valueFrom": {"secretKeyRef": {"name": "bucket", "key": "AWS_ACCESS_KEY_ID"}},
            },
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "gone", "key": "x", "optional": True}},
            },
            {
                "name": "OPT_KEY",
                "valueFrom": {"secretKeyRef": {"name": "bucket", "key": "nope", "optional": True}},
            },
            {
                "name": "LEVEL",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}},
            },
        ],
    }
    env = _env(container, sources)
    assert env["KEY"] == "id"
    assert env["LEVEL"] == "debug"
    assert "OPT" not in env and "OPT_KEY" not in env


def test_a_missing_required_secret_is_a_config_error_naming_it() -> None:
    container = {
        "name": "c",
        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}],
    }
    with pytest.raises(ContainerConfigInvalid) as caught:
        _env(container, ApiSources(secrets={"absent": None}))
    assert caught.value.reason == "CreateContainerConfigError"
    assert "absent" in str(caught.value)


def test_env_from_adds_prefixed_keys_and_env_overrides_them() -> None:
    sources = ApiSources(config_maps={"cm": {"A": "from-cm", "B": "b", "not valid!": "x"}})
    container = {
        "name": "c",
        "envFrom": [
            {"configMapRef": {"name": "cm"}},
            {"prefix": "P_", "configMapRef": {"name": "cm"}},
        ],
        "env": [{"name": "A", "value": "from-env"}],
    }
    env = _env(container, sources)
    assert env["A"] == "from-env"
    assert env["B"] == "b"
    assert env["P_A"] == "from-cm"
    assert "not valid!" not in env


def test_values_expand_earlier_variables_and_the_runtime_world_wins() -> None:
    container = {
        "name": "c",
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000"},
            {"name": "KUBECONFIG", "value": "/etc/somewhere"},
        ],
    }
    env = _env(container, PATH="/usr/bin", SECRET_TOKEN="host-secret")
    assert env["URL"] == "http://127.101.1.7:8000"
    assert env["KUBECONFIG"] == "/pods/x/kubeconfig"
    assert env["HOTLOAD_ROOT"] == "/pods/x/root"
    assert env["PATH"] == "/usr/bin"
    assert "SECRET_TOKEN" not in env, "the runtime's own environment must not leak into pods"


@pytest.mark.parametrize("written", ["127.0.0.1", "localhost", "::1"])
def test_the_engines_loopback_is_the_pods_own_ip_here(written: str) -> None:
    """Pods share the host's network namespace locally: an engine told to listen on its
    pod's loopback gets the pod's IP (its own), and so does everything that names it."""
    container = {
        "name": "engine",
        "env": [
            {"name": "HOTLOAD_ENGINE_HOST", "value": written},
            {"name": "URL", "value": "http://$(HOTLOAD_ENGINE_HOST):8000"},
            {"name": "OTHER_HOST", "value": "127.0.0.1"},
        ],
    }
    env = _env(container)
    assert env["HOTLOAD_ENGINE_HOST"] == "127.101.1.7"
    assert env["URL"] == "http://127.101.1.7:8000"
    assert env["OTHER_HOST"] == "127.0.0.1", "only the engine's address is translated"


def test_an_engine_host_that_is_not_loopback_is_kept() -> None:
    container = {"name": "engine", "env": [{"name": "HOTLOAD_ENGINE_HOST", "value": "0.0.0.0"}]}
    assert _env(container)["HOTLOAD_ENGINE_HOST"] == "0.0.0.0"


def test_argv_expands_variables_and_runs_our_console_script() -> None:
    container = {"command": ["hotload", "engine", "reference"], "args": ["--port", "$(PORT)"]}
    argv = container_argv(container, {"PORT": "8000"}, "/venv/bin/hotload")
    assert argv == ["/venv/bin/hotload", "engine", "reference", "--port", "8000"]


def test_referenced_sources_cover_env_env_from_and_volumes() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "envFrom": [{"secretRef": {"name": "s1"}}],
                    "env": [
                        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c1", "key": "k"}}}
                    ],
                }
            ],
            "volumes": [
                {"name": "a", "secret": {"secretName": "s2"}},
                {"name": "b", "projected": {"sources": [{"configMap": {"name": "c2"}}]}},
            ],
        }
    }
    assert referenced_sources(pod) == ({"s1", "s2"}, {"c1", "c2"})
