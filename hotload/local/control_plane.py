"""The processes of one region's control plane, as :class:`ProcessSpec` values.

Flags follow what was checked on this machine kind (shared/control-plane-facts.md):
etcd without fsync (a throwaway test store), an apiserver with RBAC and the
ServiceAccount admission plugin on, a controller-manager with node lifecycle kept on
(only it lifts the not-ready taint from fresh nodes) and without nodeipam or the endpoint
controllers (loopback pod addresses are refused in Endpoints and EndpointSlices), a scheduler,
and kwok managing only our fake nodes, with our own Stages and the region's loopback /24
for pod IPs. Every component binds 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Final

from hotload.local.processes import ProcessSpec, Wave
from hotload.local.readiness import HttpReady
from hotload.local.region import Region

#: ClusterIPs are allocated from here and never dialled (CONTRACTS.md: nothing connects
#: to a ClusterIP locally), so this range is only a name space for Services.
SERVICE_CLUSTER_IP_RANGE: Final = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc"
#: kwok renews node leases with this duration; the node lifecycle controller watches them.
NODE_LEASE_SECONDS: Final = 40
#: Fake nodes report this address: the "node" is this host.
NODE_IP: Final = "127.0.0.1"
KWOK_NODE_LABEL: Final = "type=kwok"


def argv(binary: Path, options: Mapping[str, str], *switches: str) -> tuple[str, ...]:
    """``binary --key value … --switch …`` (options keep their order)."""
    pairs = [part for key, value in options.items() for part in (key, value)]
    return (str(binary), *pairs, *switches)


def kwok_stages_text() -> str:
    """Our kwok Stages (package data, so an installed hotload has them too)."""
    return resources.files("hotload.local").joinpath("kwok-stages.yaml").read_text()


def etcd(region: Region, tools: Mapping[str, Path]) -> ProcessSpec:
    ports = region.ports
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    check = HttpReady(f"{client}/health", expect='"health":"true"')
    options = {
        "--name": "etcd",
        "--data-dir": str(region.etcd_data),
        "--listen-client-urls": client,
        "--advertise-client-urls": client,
        "--listen-peer-urls": peer,
        "--initial-advertise-peer-urls": peer,
        "--initial-cluster": f"etcd={peer}",
        "--log-level": "warn",
    }
    return ProcessSpec(
        name="etcd",
        argv=argv(tools["etcd"], options, "--unsafe-no-fsync"),
        wave=Wave.STORAGE,
        ready=check,
        ready_what=check.describe(),
        ports=(ports.etcd_client, ports.etcd_peer),
        ready_timeout_s=30.0,
    )


def apiserver(region: Region, tools: Mapping[str, Path]) -> ProcessSpec:
    certs = region.certificates
    check = HttpReady(
        f"{region.apiserver_url}/readyz",
        ca_cert=certs.ca_cert,
        client_cert=certs.admin_cert,
        client_key=certs.admin_key,
        expect="ok",
    )
    options = {
        "--etcd-servers": f"http://127.0.0.1:{region.ports.etcd_client}",
        "--bind-address": "127.0.0.1",
        "--advertise-address": "127.0.0.1",
        "--secure-port": str(region.ports.apiserver),
        "--cert-dir": str(certs.directory),
        "--tls-cert-file": str(certs.serving_cert),
        "--tls-private-key-file": str(certs.serving_key),
        "--client-ca-file": str(certs.ca_cert),
        "--service-account-issuer": SERVICE_ACCOUNT_ISSUER,
        "--service-account-key-file": str(certs.service_account_public_key),
        "--service-account-signing-key-file": str(certs.service_account_key),
        "--service-cluster-ip-range": SERVICE_CLUSTER_IP_RANGE,
        "--authorization-mode": "RBAC",
        # The apiserver would publish its own 127.0.0.1 as the `kubernetes` Service's
        # endpoint, which endpoint validation refuses (loopback) every few seconds.
        "--endpoint-reconciler-type": "none",
    }
    return ProcessSpec(
        name="kube-apiserver",
        argv=argv(tools["kube-apiserver"], options, "--allow-privileged", "--profiling=false"),
        wave=Wave.API,
        ready=check,
        ready_what=check.describe(),
        ports=(region.ports.apiserver,),
        ready_timeout_s=90.0,
    )


def _health(region: Region, port: int) -> HttpReady:
    return HttpReady(
        f"https://127.0.0.1:{port}/healthz", ca_cert=region.certificates.ca_cert, expect="ok"
    )


def _serving_options(region: Region, port: int) -> dict[str, str]:
    """Client and serving flags shared by the controller-manager and the scheduler."""
    certs = region.certificates
    kubeconfig = str(region.admin_kubeconfig)
    return {
        "--kubeconfig": kubeconfig,
        "--authentication-kubeconfig": kubeconfig,
        "--authorization-kubeconfig": kubeconfig,
        "--bind-address": "127.0.0.1",
        "--secure-port": str(port),
        "--tls-cert-file": str(certs.serving_cert),
        "--tls-private-key-file": str(certs.serving_key),
    }


CONTROLLERS = (
    "*",
    "-nodeipam",
    "-endpoints-controller",
    "-endpointslice-controller",
    "-endpointslice-mirroring-controller",
)
"""kube-controller-manager's ``--controllers``: everything but what a loopback region cannot use."""


def controller_manager(region: Region, tools: Mapping[str, Path]) -> ProcessSpec:
    certs = region.certificates
    port = region.ports.controller_manager
    check = _health(region, port)
    options = {
        **_serving_options(region, port),
        "--cluster-name": region.name,
        "--service-account-private-key-file": str(certs.service_account_key),
        "--root-ca-file": str(certs.ca_cert),
        "--cluster-signing-cert-file": str(certs.ca_cert),
        "--cluster-signing-key-file": str(certs.ca_key),
        # nodelifecycle stays on: it lifts the not-ready taint once kwok reports a node
        # Ready. nodeipam is off: kwok hands out pod IPs from our loopback range. The
        # endpoint controllers are off because the API server refuses loopback addresses in
        # Endpoints and EndpointSlices: they never wrote one, and retried every failure with
        # the whole Service's addresses in the error (at 1,000 pods: 12 CPU-s per rollout
        # and 16 MB of log, bench/propagation); the pod runtime routes from pod readiness.
        "--controllers": ",".join(CONTROLLERS),
    }
    return ProcessSpec(
        name="kube-controller-manager",
        argv=argv(
            tools["kube-controller-manager"],
            options,
            "--use-service-account-credentials",
            "--leader-elect=false",
        ),
        wave=Wave.CONTROLLERS,
        ready=check,
        ready_what=check.describe(),
        ports=(port,),
    )


def scheduler(region: Region, tools: Mapping[str, Path]) -> ProcessSpec:
    port = region.ports.scheduler
    check = _health(region, port)
    return ProcessSpec(
        name="kube-scheduler",
        argv=argv(tools["kube-scheduler"], _serving_options(region, port), "--leader-elect=false"),
        wave=Wave.CONTROLLERS,
        ready=check,
        ready_what=check.describe(),
        ports=(port,),
    )


def kwok(region: Region, tools: Mapping[str, Path]) -> ProcessSpec:
    port = region.ports.kwok
    check = HttpReady(f"http://127.0.0.1:{port}/healthz")
    options = {
        "--kubeconfig": str(region.admin_kubeconfig),
        "--manage-nodes-with-label-selector": KWOK_NODE_LABEL,
        "--config": str(region.kwok_stages),
        "--server-address": f"127.0.0.1:{port}",
        "--cidr": str(region.kwok_network),
        "--node-ip": NODE_IP,
        "--node-lease-duration-seconds": str(NODE_LEASE_SECONDS),
    }
    return ProcessSpec(
        name="kwok",
        argv=argv(tools["kwok"], options, "--manage-all-nodes=false"),
        wave=Wave.CONTROLLERS,
        ready=check,
        ready_what=check.describe(),
        ports=(port,),
    )
