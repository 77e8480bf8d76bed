"""Kube contexts from a shell: which kubeconfig, which contexts (one per region).

Shared by the commands that act on several regions at once (``publish``, ``gc``).
"""

from __future__ import annotations

import os
from pathlib import Path

CONTEXT_HELP = "Kube context of a region (repeatable); default: the current context."
NAMESPACE_HELP = "Namespace of the RolloutDeployment in every region."
KUBECONFIG_HELP = "Default: $KUBECONFIG, else ~/.kube/config."
ENDPOINT_HELP = (
    "CONTEXT=URL: where the trainer's side reaches that region's bucket (default: its "
    "RolloutDeployment's hotload.dev/publish-endpoint annotation, else spec.hotLoad.endpoint)."
)


def resolve_kubeconfig(option: Path | None) -> Path | None:
    """--kubeconfig, else $KUBECONFIG, else ~/.kube/config, else in-cluster (None)."""
    from hotload.kube import kubeconfig_from

    if option is not None:
        return option
    from_env = kubeconfig_from(os.environ)
    if from_env is not None:
        return from_env
    default = Path.home() / ".kube" / "config"
    return default if default.is_file() else None


def resolve_contexts(given: list[str] | None, kubeconfig: Path | None) -> list[str]:
    """The contexts given, else the kubeconfig's current one."""
    from hotload.errors import ConfigError

    if given:
        return given
    if kubeconfig is None:
        raise ConfigError("give --context (one per region), or a kubeconfig with a current one")
    import yaml

    current = (yaml.safe_load(kubeconfig.read_text()) or {}).get("current-context")
    if not current:
        raise ConfigError("give --context: the kubeconfig has no current context")
    return [str(current)]


def parse_endpoints(values: list[str] | None) -> dict[str, str]:
    """``CONTEXT=URL`` options as a mapping."""
    from hotload.errors import ConfigError

    endpoints = {}
    for value in values or []:
        context, sep, url = value.partition("=")
        if not sep or not context or not url:
            raise ConfigError("--endpoint takes CONTEXT=URL", value=value)
        endpoints[context] = url
    return endpoints
