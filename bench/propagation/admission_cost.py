"""What the sidecar's ValidatingAdmissionPolicy costs the API server, per pod write.

One local region with the chart installed (its ClusterRole ``hotload-sidecar`` and the
policy), ``--pods`` pods of the reference pod's shape (``examples/pod.yaml``, commands
replaced so kwok runs them) under a sidecar ServiceAccount, and a client per pod holding a
token bound to that pod (what the pod runtime gives each sidecar). Per round and policy
variant, every pod's sidecar sends the report a delta costs (one merge patch of its
``hotload.dev/*`` annotations) through ``pods`` (as sidecars did before) and through
``pods/status`` (as they do now), then another writer (the admin, as the pod runtime
does) patches each pod's status. The API server's and etcd's CPU seconds over each
series, less the same span's CPU without writes, divided by the writes, is the cost per
write. Variants, interleaved round by round so the machine's other load falls on all of
them alike:

- ``none``: the policy's binding removed (no policy at all);
- ``baseline``: the policy as the chart renders it at ``--baseline-rev``;
- ``current``: the policy as the chart renders it in this tree.

Run (one region of its own, torn down at the end)::

    python bench/propagation/admission_cost.py --pods 200 --rounds 5 --baseline-rev 8c71bf7

Results: ``bench/propagation/admission-cost.json`` and a table in ``admission-cost.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kubernetes import client as k8s  # noqa: E402

from bench.propagation.run import CHART, bring_up, cpu_seconds, log  # noqa: E402
from hotload.local import Region, down, helm_path  # noqa: E402
from hotload.local import chart as hotload_chart  # noqa: E402
from hotload.local.bootstrap import api_client  # noqa: E402
from hotload.local.processes import read_records  # noqa: E402
from hotload.local.reaper import start_reaper  # noqa: E402

NAMESPACE = "adm-bench"
SIDECAR = "adm-sidecar"
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
#: The writes measured: the sidecar's report through ``pods`` (as before) and through
#: ``pods/status`` (as now), and another writer's status patch (the pod runtime's).
WRITES = ("sidecar-pods", "sidecar-status", "foreign")


def render_policy(chart: Path) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy the chart at ``chart`` renders (defaults)."""
    out = subprocess.run(
        [str(helm_path()), "template", "hotload", str(chart), "--namespace", "hotload-system",
         "--show-only", "templates/admission-policy.yaml"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    for doc in yaml.safe_load_all(out):
        if doc and doc.get("kind") == "ValidatingAdmissionPolicy":
            return cast(dict[str, Any], doc)
    raise SystemExit(f"no ValidatingAdmissionPolicy rendered from {chart}")


def chart_at(rev: str, into: Path) -> Path:
    """``charts/hotload`` as it was at ``rev``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "charts/hotload"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "charts" / "hotload"


def reference_pod(name: str) -> dict[str, Any]:
    """examples/pod.yaml with its name, account and commands changed (kwok runs it)."""
    pod = yaml.safe_load((REPO / "examples" / "pod.yaml").read_text())
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] = name
    pod["spec"]["serviceAccountName"] = SIDECAR
    pod["spec"].pop("readinessGates", None)
    for container in pod["spec"]["containers"]:
        container["command"] = ["serve"]
        container.pop("ports", None)
        container.pop("livenessProbe", None)
        container.pop("readinessProbe", None)
    pod["spec"]["tolerations"] = [TOLERATION]
    return cast(dict[str, Any], pod)


def pod_client(region: Region, token: str) -> k8s.CoreV1Api:
    config = k8s.Configuration()
    config.host = region.apiserver_url
    config.ssl_ca_cert = str(region.certificates.ca_cert)
    config.api_key = {"authorization": f"Bearer {token}"}
    return k8s.CoreV1Api(k8s.ApiClient(config))


def server_cpu(region: Region) -> float:
    """CPU seconds of the region's kube-apiserver and etcd so far."""
    return sum(
        cpu_seconds(record.pid)
        for record in read_records(region.pids_dir)
        if record.name in ("kube-apiserver", "etcd")
    )


class Bench:
    def __init__(self, region: Region, api: k8s.ApiClient, pods: int) -> None:
        self.region = region
        self.api: Any = api
        # Any: the generated clients' Optional fields, read where the server always sets them.
        self.core: Any = k8s.CoreV1Api(api)
        self.admission: Any = k8s.AdmissionregistrationV1Api(api)
        self.pods = [f"r-{i}" for i in range(pods)]
        self.clients: dict[str, Any] = {}
        self.policy_name = ""
        self.binding: dict[str, Any] | None = None
        self.counter = 0

    def setup(self) -> None:
        self.core.create_namespace(cast(Any, {"metadata": {"name": NAMESPACE}}))
        self.core.create_namespaced_service_account(
            NAMESPACE, cast(Any, {"metadata": {"name": SIDECAR}})
        )
        k8s.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(
            NAMESPACE,
            cast(Any, {
                "metadata": {"name": SIDECAR},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "hotload-sidecar"},
                "subjects": [{"kind": "ServiceAccount", "name": SIDECAR,
                              "namespace": NAMESPACE}],
            }),
        )  # fmt: skip
        for name in self.pods:
            pod = self.core.create_namespaced_pod(NAMESPACE, cast(Any, reference_pod(name)))
            spec = {
                "audiences": [], "expirationSeconds": 7200,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                                   "uid": pod.metadata.uid},
            }  # fmt: skip
            token = self.core.create_namespaced_service_account_token(
                SIDECAR, NAMESPACE, cast(Any, {"spec": spec})
            ).status.token
            self.clients[name] = pod_client(self.region, token)
        policies = self.admission.list_validating_admission_policy().items
        self.policy_name = next(p.metadata.name for p in policies if "sidecar-own-pod" in
                                p.metadata.name)  # fmt: skip
        binding = self.admission.read_validating_admission_policy_binding(self.policy_name)
        self.binding = {
            "metadata": {"name": binding.metadata.name},
            "spec": self.api.sanitize_for_serialization(binding.spec),
        }

    def use(self, policy: dict[str, Any] | None) -> None:
        """Install ``policy`` (its spec replaces the policy's), or remove the binding."""
        assert self.binding is not None
        names = {b.metadata.name for b in
                 self.admission.list_validating_admission_policy_binding().items}  # fmt: skip
        if policy is None:
            if self.binding["metadata"]["name"] in names:
                self.admission.delete_validating_admission_policy_binding(
                    self.binding["metadata"]["name"]
                )
        else:
            current = self.admission.read_validating_admission_policy(self.policy_name)
            body = {
                "metadata": {"name": self.policy_name,
                             "resourceVersion": current.metadata.resource_version},
                "spec": policy["spec"],
            }  # fmt: skip
            self.admission.replace_validating_admission_policy(self.policy_name, cast(Any, body))
            if self.binding["metadata"]["name"] not in names:
                self.admission.create_validating_admission_policy_binding(cast(Any, self.binding))
        time.sleep(3.0)  # the apiserver's policy informer picks the change up
        validates = policy is not None and policy["spec"]["validations"] != [{"expression": "true"}]
        self._check_enforced(validates)

    def _check_enforced(self, enforced: bool) -> None:
        """A sidecar's write to another pod is refused exactly when a policy is in force."""
        victim, writer = self.pods[0], self.clients[self.pods[1]]
        try:
            writer.patch_namespaced_pod(
                victim, NAMESPACE, {"metadata": {"annotations": {"hotload.dev/state": "Ready"}}}
            )
            refused = False
        except k8s.ApiException as err:
            refused = err.status in (403, 422)
        if refused != enforced:
            raise SystemExit(f"policy enforced={refused}, wanted {enforced}")
        if not refused:  # undo the write it was allowed
            self.core.patch_namespaced_pod(
                victim, NAMESPACE, {"metadata": {"annotations": {"hotload.dev/state": None}}}
            )

    def series(self, what: str) -> tuple[float, int]:
        """CPU seconds of the apiserver and etcd for one write per pod, and the writes."""
        self.counter += 1
        stamp = f"{self.counter}"

        notes = {"metadata": {"annotations": {"hotload.dev/target": f"s-{stamp}",
                                              "hotload.dev/state": "Ready"}}}  # fmt: skip

        def sidecar_pods(name: str) -> None:  # the report as sidecars sent it before
            _accepted(self.clients[name].patch_namespaced_pod(
                name, NAMESPACE, notes, _preload_content=False,
                _content_type="application/merge-patch+json",
            ))  # fmt: skip

        def sidecar_status(name: str) -> None:  # the report as one write of pods/status
            _accepted(self.clients[name].patch_namespaced_pod_status(
                name, NAMESPACE, notes, _preload_content=False,
                _content_type="application/merge-patch+json",
            ))  # fmt: skip

        def foreign(name: str) -> None:
            body = {"status": {"conditions": [{"type": "example.com/Probe", "status": "True",
                                               "reason": f"R{stamp}"}]}}  # fmt: skip
            _accepted(
                self.core.patch_namespaced_pod_status(name, NAMESPACE, body, _preload_content=False)
            )

        work = {"sidecar-pods": sidecar_pods, "sidecar-status": sidecar_status,
                "foreign": foreign}[what]  # fmt: skip
        before, began = server_cpu(self.region), time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, self.pods))
        time.sleep(1.0)  # etcd's and the watchers' share of the last writes
        spent, took = server_cpu(self.region) - before, time.monotonic() - began
        # The same time without writes: what the region spends anyway (leases, controllers).
        before = server_cpu(self.region)
        time.sleep(took)
        idle = server_cpu(self.region) - before
        return spent - idle, len(self.pods)


def _accepted(response: Any) -> None:
    """A raw (not preloaded) answer must be a 2xx: a refused write measures nothing."""
    if not 200 <= response.status <= 299:
        raise SystemExit(f"write refused ({response.status}): {response.data[:300]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-rev", default=None, help="git rev of the baseline chart")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="Also the current policy with its validations replaced by `true` (the cost of "
        "matching it: the objects' conversion, the match conditions) and without its "
        "authorizer checks.",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "propagation")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hotload-bench-admission-"))
    variants: dict[str, dict[str, Any] | None] = {"none": None}
    if args.baseline_rev:
        variants["baseline"] = render_policy(chart_at(args.baseline_rev, work))
    variants["current"] = render_policy(hotload_chart.chart_path())
    if args.probe:  # where the current policy's cost goes
        current = variants["current"]
        assert current is not None
        matching = copy.deepcopy(current)
        matching["spec"]["validations"] = [{"expression": "true"}]
        matching["spec"].pop("variables", None)
        variants["current, match only"] = matching
        by_name = copy.deepcopy(current)
        by_name["spec"]["matchConditions"] = [
            {
                "name": "a-hotload-sidecar",
                "expression": "request.userInfo.username.startsWith('system:serviceaccount:')"
                " && request.userInfo.username.endsWith('-sidecar')",
            }
        ]
        variants["current, no authorizer checks"] = by_name
    state = work / "state"
    reaper = start_reaper(state)  # should this process be killed, it takes the region down
    regions = bring_up(state, 2)
    region = regions.regions[0]
    rows: dict[str, dict[str, list[float]]] = {v: {w: [] for w in WRITES} for v in variants}
    try:
        hotload_chart.install([region], CHART)
        with api_client(region) as api:
            bench = Bench(region, api, args.pods)
            bench.setup()
            log(f"{args.pods} pods with pod-bound tokens; variants {list(variants)}")
            for round_ in range(args.rounds):
                for name, policy in variants.items():
                    bench.use(policy)
                    for what in WRITES:
                        cpu, writes = bench.series(what)
                        rows[name][what].append(cpu / writes * 1000)
                    log(f"round {round_ + 1} {name}: " + ", ".join(
                        f"{w} {rows[name][w][-1]:.2f} ms" for w in WRITES))  # fmt: skip
    finally:
        down(state)
        reaper.terminate()
    write(args, rows)


def write(args: argparse.Namespace, rows: dict[str, dict[str, list[float]]]) -> None:
    medians = {
        name: {what: round(statistics.median(v), 3) for what, v in series.items()}
        for name, series in rows.items()
    }
    document = {
        "benchmark": "API server + etcd CPU per pod write, by admission policy variant",
        "command": " ".join(shlex.quote(p) for p in [sys.executable, *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "pods": args.pods,
        "rounds": args.rounds,
        "baseline_rev": args.baseline_rev,
        "ms_per_write_median": medians,
        "ms_per_write_by_round": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "admission-cost.json").write_text(json.dumps(document, indent=2) + "\n")
    none = medians.get("none", {})
    lines = [
        "# The admission policy's cost per pod write",
        "",
        f"Command: `{document['command']}`  ",
        f"When: {document['when']}; {args.pods} pods of the reference pod's shape, "
        f"{args.rounds} interleaved rounds; CPU of kube-apiserver + etcd per write "
        "(median over rounds). The machine is shared: compare the variants, measured "
        "alike in the same rounds.",
        "",
        "| policy | " + " | ".join(f"{w} (ms) | above none" for w in WRITES) + " |",
        "|---|" + "---|---|" * len(WRITES),
    ]
    for name, med in medians.items():
        cells = [
            f"{med[w]:.3f} | " + (f"{med[w] - none[w]:+.3f}" if name != "none" and none else "-")
            for w in WRITES
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (args.out / "admission-cost.md").write_text("\n".join(lines) + "\n")
    log(f"results in {args.out / 'admission-cost.md'}")


if __name__ == "__main__":
    main()
