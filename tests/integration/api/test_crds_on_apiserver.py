"""Our CRDs on a real kube-apiserver: established in every region, printer columns shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.local import LocalRegions
from tests.fixtures.cluster import Kubectl

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "crds"
EXAMPLES = REPO / "examples"


def test_applying_crds_dir_establishes_both_crds_in_every_region(
    local_regions: LocalRegions, kubectl: Kubectl
) -> None:
    names = sorted(path.name.removesuffix(".yaml") for path in CRDS.glob("*.yaml"))
    assert names == ["policysnapshots.hotload.dev", "rolloutdeployments.hotload.dev"]
    for region in local_regions.regions:
        applied = kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(CRDS), context=region.name
        )
        assert all(name in applied for name in names), applied
        kubectl(
            "wait",
            "--for=condition=Established",
            *(f"crd/{name}" for name in names),
            "--timeout=30s",
            context=region.name,
        )
        resources = kubectl(
            "api-resources", "--api-group=hotload.dev", "-o", "name", context=region.name
        )
        assert sorted(resources.split()) == names


def _header(output: str) -> list[str]:
    return output.splitlines()[0].split()


def test_get_rd_and_psnap_prints_the_printer_columns(kubectl: Kubectl, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "rolloutdeployment.yaml"))
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "policysnapshot-full.yaml"))

    deployments = kubectl("get", "rd", "-n", namespace)
    assert _header(deployments) == ["NAME", "REPLICAS", "READY", "TARGET", "CURRENT", "AGE"]
    assert deployments.splitlines()[1].split()[:2] == ["demo", "2"]

    snapshots = kubectl("get", "psnap", "-n", namespace)
    assert _header(snapshots) == ["NAME", "DEPLOYMENT", "STEP", "KIND", "READY", "PHASE", "AGE"]
    assert snapshots.splitlines()[1].split()[:4] == ["demo-step-0", "demo", "0", "Full"]

    both = kubectl("get", "rd,psnap", "-n", namespace)
    assert "rolloutdeployment.hotload.dev/demo" in both
    assert "policysnapshot.hotload.dev/demo-step-0" in both
    headers = [line.split() for line in both.splitlines() if line.startswith("NAME")]
    assert [h[1] for h in headers] == ["REPLICAS", "DEPLOYMENT"]
