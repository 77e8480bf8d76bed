"""Kube contexts from a shell: which contexts (one per region), and bucket endpoints.

Shared by the commands that act on several regions at once (``publish``, ``gc``).
"""

from __future__ import annotations

from pathlib import Path

NAMESPACE_HELP = "Namespace of the RolloutDeployment in every region."
ENDPOINT_HELP = (
    "CONTEXT=URL: where the trainer's side reaches that region's bucket (default: its "
    "RolloutDeployment's hotload.dev/publish-endpoint annotation, else spec.hotLoad.endpoint)."
)


def resolve_contexts(given: list[str] | None, kubeconfig: Path | None) -> list[str]:
    """The contexts given, else the kubeconfig's current one."""
    from hotload.cli.fleet_view import current_context
    from hotload.errors import ConfigError

    if given:
        return given
    current = current_context(kubeconfig)
    if current is None:
        raise ConfigError("give --context (one per region): no current context to default to")
    return [current]


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
