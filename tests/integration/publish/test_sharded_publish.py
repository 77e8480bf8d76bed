"""A sharded trainer publishes from every rank, and the region's replicas serve exactly the
weights a single process would have published from the gathered model.

Real processes: a torch.distributed job of 2 and of 4 ranks (gloo on CPU), the reference
engine's tiny model sharded with FSDP2 (``fully_shard``), real AdamW steps; each rank's
Publisher encodes and uploads only its own rows, rank 0 writes the manifest last and
applies the PolicySnapshot; the session's region (real apiserver, the chart's operator)
rolls it out to a reference-engine replica (real sidecar, real engine) from a
``file://`` bucket. The job's oracle is the gathered model (``full_tensor``) written as a
single-process publish writes it.

Would catch: a rank's rows encoded at the wrong offset or against another rank's base;
a tensor hash that is not the whole tensor's (the manifest digest would differ from the
single process's, and the sidecar refuses an engine whose digest differs); a manifest
written before every rank's files are in the bucket, or at all when a rank dies; a
surviving rank that hangs, or hears another outcome; a next publish that does not go on
from the last committed snapshot.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hotload.api import pod as contract
from hotload.engines.reference import model as rm
from hotload.local import LocalRegions
from hotload.operator.workload import label_selector
from hotload.snapshot import MANIFEST_NAME, manifest_digest, read_manifest, rebuild
from hotload.snapshot.digest import tensor_hash, tensor_set_digest
from hotload.snapshot.tensor_files import mapped_shards
from hotload.waiting import wait_until
from tests.fixtures.sharded_job import JobSpec, kill_job, kill_rank, launch

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]

DEPLOYMENT = "sharded"
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
JOB_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class Fleet:
    """One reference replica in the session's first region, reading a ``file://`` bucket."""

    regions: LocalRegions
    region: str
    namespace: str
    bucket: Path
    root: Path
    core: k8s.CoreV1Api

    def spec(self, name: str, steps: list[int], **overrides: Any) -> JobSpec:
        files = self.root / "model"
        if not files.exists():
            rm.save_snapshot(rm.build_model(rm.build_config("tiny")), files)
        return JobSpec(
            out=str(self.root / name),
            workdir=str(self.root / "publisher"),
            kubeconfig=str(self.regions.kubeconfig),
            contexts=[self.region],
            namespace=self.namespace,
            deployment=DEPLOYMENT,
            prefix="shard",
            files_from=str(files),
            steps=steps,
            **overrides,
        )

    def serving(self) -> list[str | None]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=label_selector(DEPLOYMENT)
        ).items
        notes = [(p.to_dict()["metadata"].get("annotations") or {}) for p in pods]
        return [n.get(contract.ANNOTATION_SNAPSHOT) for n in notes]


@pytest.fixture
def fleet(
    operated_regions: LocalRegions,
    operated_namespace: str,
    kube_clients: dict[str, k8s.ApiClient],
    tmp_path: Path,
) -> Fleet:
    region = operated_regions.regions[0].name
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    k8s.CustomObjectsApi(kube_clients[region]).create_namespaced_custom_object(
        "hotload.dev",
        "v1alpha1",
        operated_namespace,
        "rolloutdeployments",
        {
            "apiVersion": "hotload.dev/v1alpha1",
            "kind": "RolloutDeployment",
            "metadata": {"name": DEPLOYMENT},
            "spec": {
                "model": {"name": "reference-tiny", "servedName": "policy"},
                "engine": {"kind": "reference", "args": ["--threads", "1"]},
                "replicas": 1,
                "hotLoad": {"bucketUrl": f"file://{bucket}"},
                "scheduling": {"tolerations": [TOLERATION]},
            },
        },
    )
    return Fleet(
        operated_regions, region, operated_namespace, bucket, tmp_path,
        k8s.CoreV1Api(kube_clients[region]),
    )  # fmt: skip


def run(spec: JobSpec, ranks: int, kill: int | None = None) -> list[dict[str, Any]]:
    """Run the job to its end; with ``kill``, SIGKILL that rank once it froze."""
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    job = launch(spec, ranks, out)
    try:
        if kill is not None:
            frozen = wait_until(lambda: (out / f"frozen-{kill}").exists(), JOB_TIMEOUT_S)
            assert frozen, _logs(out, ranks)
            kill_rank(out, kill)
        job.wait(timeout=JOB_TIMEOUT_S)
    except (subprocess.TimeoutExpired, AssertionError):
        kill_job(job)
        raise AssertionError(f"the job did not end:\n{_logs(out, ranks)}") from None
    print(f"{out.name}: {ranks} ranks ended after {time.monotonic() - started:.1f} s")
    return [
        json.loads((out / f"rank-{r}.json").read_text())
        for r in range(ranks)
        if (out / f"rank-{r}.json").exists()
    ]


def _logs(out: Path, ranks: int) -> str:
    logs = [out / "launcher.log", *(out / f"rank-{r}.log" for r in range(ranks))]
    return "\n".join(f"--- {p.name}\n" + p.read_text()[-4000:] for p in logs if p.exists())


def oracle_digest(directory: Path) -> str:
    """The tensor-set digest a single-process publish of these gathered weights names."""
    with mapped_shards(directory, ["model.safetensors"]) as index:
        return tensor_set_digest(
            (name, tensor_hash(shard.raw(info))) for name, (shard, info) in index.by_name.items()
        )


def check_published(
    fleet: Fleet, spec: JobSpec, reports: list[dict[str, Any]], previous: Path | None = None
) -> list[str]:
    """Every rank heard the same snapshots; each rebuilds, from the bucket alone (onto
    ``previous``, the rebuild of the snapshot before), to the very bytes of the gathered
    weights, and names their digest. Returns the identities."""
    first = reports[0]["results"]
    for report in reports:
        assert report["error"] is None, report
        assert [r["identity"] for r in report["results"]] == [r["identity"] for r in first]
    identities = [r["identity"] for r in first]
    for result, step in zip(first, spec.steps, strict=True):
        snapshot = fleet.bucket / result["identity"]
        manifest = read_manifest(snapshot)
        assert manifest.format == "hotload-delta/v4" and manifest.has_parts
        gathered = Path(spec.out) / "gathered" / f"step-{step}"
        assert manifest_digest(manifest) == oracle_digest(gathered)
        out = fleet.root / "rebuilt" / result["identity"]
        rebuild(previous, snapshot, out)
        assert (out / "model.safetensors").read_bytes() == (
            gathered / "model.safetensors"
        ).read_bytes()
        assert (out / "config.json").read_bytes() == (
            Path(spec.files_from) / "config.json"
        ).read_bytes()
        assert sorted(r["rank"] for r in result["ranks"]) == list(range(len(reports)))
        previous = out
    return identities


def served(fleet: Fleet, identity: str) -> None:
    """The replica serves ``identity``: its sidecar swapped it in only once the engine's
    own weights digest equalled the manifest's (the handover's check; the reference
    engine always reports one), which :func:`check_published` compared with the
    gathered model's."""
    assert wait_until(lambda: fleet.serving() == [identity], 180), fleet.serving()


def test_sharded_jobs_of_two_and_four_ranks_publish_what_one_process_would(
    fleet: Fleet,
) -> None:
    """One replica, three jobs in turn (a trainer (re)started with the same workdirs):

    a. 2 ranks: a Full and a delta; the replica serves the gathered model's digest.
    b. 4 ranks: their bases are not the last snapshot's sharding, so a Full
       (``ranks-disagree``), served; then rank 2 freezes mid-publish of step 3 and is
       killed: no manifest, and every surviving rank raises RankFailed naming rank 2 and
       step 3.
    c. 4 ranks: the next publish is a delta against the last committed snapshot (step 2).
    """
    spec = fleet.spec("job-a", [0, 1])
    reports = run(spec, 2)
    identities = check_published(fleet, spec, reports)
    results = reports[0]["results"]
    assert [r["kind"] for r in results] == ["Full", "Incremental"]
    assert results[1]["previous"] == identities[0]
    assert all(r["regions"][fleet.region]["outcome"] == "Ready" for r in results)
    for result in results:  # each rank encoded its own half of every tensor
        halves = [r["tensorBytes"] for r in result["ranks"]]
        assert max(halves) < 0.6 * sum(halves)
    served(fleet, identities[1])

    spec = fleet.spec("job-b", [2, 3], hang={"rank": 2, "step": 3}, rank_timeout_s=10)
    reports = run(spec, 4, kill=2)
    assert sorted(r["rank"] for r in reports) == [0, 1, 3]
    for report in reports:
        [full] = report["results"]
        assert (full["kind"], full["why"]) == ("Full", "ranks-disagree")
        error = report["error"]
        assert error["class"] == "RankFailed", error
        assert (error["context"]["rank"], error["context"]["step"]) == (2, 3), error
    full_identity = reports[0]["results"][0]["identity"]
    out = fleet.root / "rebuilt" / full_identity
    rebuild(None, fleet.bucket / full_identity, out)
    gathered = Path(spec.out) / "gathered" / "step-2"
    assert (out / "model.safetensors").read_bytes() == (gathered / "model.safetensors").read_bytes()
    served(fleet, full_identity)
    broken = fleet.bucket / "shard-step-3"
    assert (broken / "hotload-parts-00002.bin").exists()  # the orphan: for hotload gc
    assert not (broken / MANIFEST_NAME).exists()

    spec = fleet.spec("job-c", [4])
    reports = run(spec, 4)
    [recovered] = check_published(fleet, spec, reports, out)
    result = reports[0]["results"][0]
    assert (result["kind"], result["previous"]) == ("Incremental", full_identity)
    assert sorted(r["rank"] for r in result["ranks"]) == [0, 1, 2, 3]
    served(fleet, recovered)
