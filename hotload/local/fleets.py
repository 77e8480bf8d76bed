"""A RolloutDeployment per region, each reading its own region's bucket: what the demo,
the cross-region tests and the benchmarks deploy, and how they ask it for a completion.

Each region's deployment names the region's bucket at the region's own endpoint (its
sidecars never cross the WAN), the Secret with that bucket's credentials, and, in the
``hotload.dev/publish-endpoint`` annotation, where the trainer's side reaches the same
bucket (through the region's WAN link): the publisher learns both from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

import httpx
import kubernetes.client
from kubernetes.client.exceptions import ApiException

from hotload.api import GROUP, VERSION, RolloutDeployment
from hotload.api import pod as contract
from hotload.api.labels import PUBLISH_ENDPOINT_ANNOTATION
from hotload.api.rollout_deployment import PLURAL as DEPLOYMENTS
from hotload.errors import LocalRegionError
from hotload.kube import map_api_exception
from hotload.local import object_storage, wan
from hotload.local.bootstrap import FAKE_NODE_TAINT, api_client
from hotload.local.region import Region
from hotload.local.runtime.service_ports import read_ports

SECRET_SUFFIX: Final = "-bucket"
FIELD_MANAGER: Final = "hotload-local"


@dataclass(frozen=True)
class FleetSpec:
    """One deployment, the same in every region but for its bucket."""

    name: str
    namespace: str
    replicas: int = 2
    engine: str = "reference"
    engine_args: tuple[str, ...] = ()
    """Extra engine arguments, e.g. the reference engine's ``--model-config`` (a size, or a
    config.json path on this host: locally, pods are this host's processes)."""
    model: str = "hotload-reference"
    served_name: str = "policy"
    transition: str = "ASYNC"
    kv_cache_policy: str = "new_session"


def bucket_secret(region: Region, spec: FleetSpec) -> dict[str, Any]:
    """The Secret with the region's bucket credentials, under boto3's own names."""
    creds = object_storage.credentials(region)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{spec.name}{SECRET_SUFFIX}", "namespace": spec.namespace},
        "type": "Opaque",
        "stringData": {
            "AWS_ACCESS_KEY_ID": creds.access_key_id,
            "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
        },
    }


def regional_deployment(region: Region, spec: FleetSpec) -> dict[str, Any]:
    """The RolloutDeployment of ``spec`` in ``region``, reading the region's own bucket."""
    deployment = RolloutDeployment.model_validate(
        {
            "metadata": {
                "name": spec.name,
                "namespace": spec.namespace,
                "annotations": {PUBLISH_ENDPOINT_ANNOTATION: wan.endpoint(region)},
            },
            "spec": {
                "model": {"name": spec.model, "servedName": spec.served_name},
                "engine": {
                    "kind": spec.engine,
                    "args": list(spec.engine_args),
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                },
                "replicas": spec.replicas,
                "hotLoad": {
                    "bucketUrl": object_storage.bucket_url(region),
                    "endpoint": object_storage.endpoint(region),
                    "region": object_storage.S3_REGION,
                    "credentialsSecretRef": {"name": f"{spec.name}{SECRET_SUFFIX}"},
                    "transition": spec.transition,
                    "kvCachePolicy": spec.kv_cache_policy,
                },
                "scheduling": {
                    "tolerations": [
                        {
                            "key": FAKE_NODE_TAINT["key"],
                            "operator": "Exists",
                            "effect": FAKE_NODE_TAINT["effect"],
                        }
                    ]
                },
            },
        }
    )
    return deployment.to_k8s()


def apply_fleet(region: Region, spec: FleetSpec) -> None:
    """Create (or update) the bucket Secret and the RolloutDeployment in ``region``."""
    api = api_client(region)
    try:
        core = kubernetes.client.CoreV1Api(api)
        custom = kubernetes.client.CustomObjectsApi(api)
        secret = bucket_secret(region, spec)
        deployment = regional_deployment(region, spec)
        try:
            core.patch_namespaced_secret(
                secret["metadata"]["name"], spec.namespace, cast(Any, secret),
                field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml",
            )  # fmt: skip
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, DEPLOYMENTS, spec.name,
                deployment, field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml",
            )  # fmt: skip
        except ApiException as err:
            raise map_api_exception(err, region=region.name, deployment=spec.name) from err
    finally:
        api.close()  # type: ignore[no-untyped-call]


def engine_urls(region: Region, namespace: str) -> dict[str, str]:
    """Pod name → its reference engine's URL, for every running pod of ``namespace`` (locally,
    pods are this host's processes, each on its own loopback address)."""
    api = api_client(region)
    try:
        pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(namespace).items
    finally:
        api.close()  # type: ignore[no-untyped-call]
    urls = {}
    for pod in pods:
        status, meta = pod.status, pod.metadata
        if status and meta and status.phase == "Running" and status.pod_ip:
            urls[str(meta.name)] = f"http://{status.pod_ip}:{contract.REFERENCE_ENGINE_PORT}"
    return urls


def swap_record(engine_url: str, identity: str) -> dict[str, Any] | None:
    """The engine's own record of its last swap to ``identity`` (``swap_log`` of
    ``/admin/identity``: ``at`` is when it took effect, Unix seconds); None when it has none
    or does not answer."""
    try:
        response = httpx.get(f"{engine_url}/admin/identity", timeout=5, trust_env=False)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    found = [r for r in response.json().get("swap_log", []) if r.get("identity") == identity]
    return dict(found[-1]) if found else None


def service_port(region: Region, spec: FleetSpec) -> int | None:
    """The local port of the deployment's Service (the pod runtime's proxy), once it has one."""
    return read_ports(region.services_file).get(f"{spec.namespace}/{spec.name}", {}).get("http")


@dataclass(frozen=True)
class Completion:
    """One completion and the policy that served it."""

    region: str
    model: str
    """The response's ``model``: ``<servedName>@<identity>``."""
    policy: str
    """The ``x-hotload-policy`` header: the identity the front served it with."""
    text: str

    @property
    def identity(self) -> str:
        return self.model.partition("@")[2]


def complete(
    region: Region, spec: FleetSpec, prompt: str, *, max_tokens: int = 8, timeout_s: float = 60.0
) -> Completion:
    """Ask the region's deployment (through its Service) for a completion."""
    port = service_port(region, spec)
    if port is None:
        raise LocalRegionError("the deployment's Service has no local port yet", region=region.name)
    try:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": spec.served_name, "prompt": prompt, "max_tokens": max_tokens},
            timeout=timeout_s,
        )
        response.raise_for_status()
    except httpx.HTTPError as err:
        raise LocalRegionError(
            "the deployment did not answer", region=region.name, error=str(err)[:300]
        ) from err
    body = response.json()
    return Completion(
        region=region.name,
        model=str(body.get("model", "")),
        policy=response.headers.get(contract.POLICY_HEADER, ""),
        text=str((body.get("choices") or [{}])[0].get("text", "")),
    )
