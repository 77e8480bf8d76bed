"""The chart as helm renders it: lint-clean, values checked by its schema, the operator pod
that the pod contract and `hotload operator` expect, and RBAC scoped by the watched
namespaces. Real helm, no cluster.

It would catch a chart that lints with warnings, a typo in values slipping through, the
operator started without its leader Lease or without its pod identity, the Lease's
rights or the fencing policy missing or pointed at another Lease, probes on a port it does not
serve, the sidecar ClusterRole drifting from hotload.api's rules, and cluster-wide rights
granted where Roles in the watched namespaces would do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hotload.api.pod import SIDECAR_RBAC_RULES
from hotload.local.chart import ChartRelease, chart_path
from hotload.operator.workload import SIDECAR_CLUSTER_ROLE
from tests.integration.chart.rendering import Manifest, find, helm, one, render

#: What the operator may do in the namespaces it watches (docs/chart.md says why).
NAMESPACED_RESOURCES = {
    "rolloutdeployments", "policysnapshots", "rolloutdeployments/status",
    "policysnapshots/status", "pods", "statefulsets", "services", "serviceaccounts",
    "rolebindings", "networkpolicies", "clusterroles", "events",
}  # fmt: skip
#: What the operator holds cluster-wide in the default mode: reads for kopf.
CLUSTER_RESOURCES = {"customresourcedefinitions", "namespaces"}
CLUSTER_WIDE = {"clusterWide": {"enabled": True}}


def _container(objects: list[Manifest]) -> Manifest:
    deployment = one(objects, "Deployment", "hotload-operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _resources(rules: list[dict[str, Any]]) -> set[str]:
    return {resource for rule in rules for resource in rule.get("resources", [])}


def test_lint_is_clean_with_strict_checks(tmp_path: Path) -> None:
    done = helm("lint", "--strict", str(chart_path()), tmp=tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


def test_operator_runs_hotload_operator_with_its_lease_and_its_pod_identity(
    tmp_path: Path,
) -> None:
    objects = render(tmp_path)
    deployment = one(objects, "Deployment", "hotload-operator")
    container = _container(objects)

    assert deployment["spec"]["replicas"] == ChartRelease().operator_replicas == 2
    assert container["command"] == ["hotload", "operator"]
    assert container["args"] == [
        "--namespace", "hotload-system",
        "--lease", "hotload-leader", "--port", "8080", "--log-format", "json",
    ]  # fmt: skip
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert env["POD_NAMESPACE"] == "metadata.namespace", "the Lease lives in the pod's namespace"
    assert env["POD_IP"] == "status.podIP", "the operator binds $POD_IP:8080"
    assert env["POD_NAME"] == env["POD_ID"] == "metadata.name"
    assert not find(objects, "ClusterKopfPeering")
    assert not find(objects, "CustomResourceDefinition", "clusterkopfpeerings.kopf.dev")


def test_the_lease_has_its_role_and_the_fencing_policy_reads_that_lease(tmp_path: Path) -> None:
    objects = render(tmp_path)

    role = one(objects, "Role", "hotload-operator-leader")
    assert role["metadata"]["namespace"] == "hotload-system"
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "verbs": ["get", "update"], "resourceNames": ["hotload-leader"]}]  # fmt: skip
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "hotload-operator-fence")
    assert binding["spec"]["paramRef"] == {
        "name": "hotload-leader", "namespace": "hotload-system",
        "parameterNotFoundAction": "Allow",  # test_fencing_params.py says why
    }  # fmt: skip
    policy = one(objects, "ValidatingAdmissionPolicy", "hotload-operator-fence")
    assert policy["spec"]["paramKind"] == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:hotload-system:hotload-operator'" in condition["expression"]
    off = render(tmp_path, {"leaderElection": {"fencingPolicy": False}})
    assert not find(off, "ValidatingAdmissionPolicy", "hotload-operator-fence")


def test_probes_ask_the_operators_health_endpoint_on_its_port(tmp_path: Path) -> None:
    container = _container(render(tmp_path))

    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe


def test_watched_namespaces_become_operator_arguments(tmp_path: Path) -> None:
    named = _container(render(tmp_path, {"watchNamespaces": ["team-a", "team-b"]}))
    patterns = _container(render(tmp_path, {"watchNamespaces": ["hl-*", "x"], **CLUSTER_WIDE}))
    everything = _container(render(tmp_path, CLUSTER_WIDE))

    assert named["args"][:4] == ["--namespace", "team-a", "--namespace", "team-b"]
    assert patterns["args"][:4] == ["--namespace", "hl-*", "--namespace", "x"]
    assert everything["args"][0] == "--all-namespaces"
    assert "--all-namespaces" not in named["args"] + patterns["args"]


def test_the_default_install_writes_only_in_its_own_namespace(tmp_path: Path) -> None:
    """Issue 22: `watchNamespaces: []` gave the operator create on StatefulSets in every
    namespace through a ClusterRole. The default is a Role in the release's namespace."""
    objects = render(tmp_path)

    cluster_role = one(objects, "ClusterRole", "hotload-operator-cluster")
    assert _resources(cluster_role["rules"]) == CLUSTER_RESOURCES
    (role,) = find(objects, "Role", "hotload-operator")
    assert role["metadata"]["namespace"] == "hotload-system"
    assert _resources(role["rules"]) == NAMESPACED_RESOURCES
    (binding,) = find(objects, "RoleBinding", "hotload-operator")
    assert binding["metadata"]["namespace"] == "hotload-system"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hotload-operator"
    }  # fmt: skip


def test_the_cluster_wide_mode_is_one_cluster_role_and_only_on_request(tmp_path: Path) -> None:
    objects = render(tmp_path, {"watchNamespaces": ["hl-*"], **CLUSTER_WIDE})

    cluster_role = one(objects, "ClusterRole", "hotload-operator-cluster")
    assert _resources(cluster_role["rules"]) == NAMESPACED_RESOURCES | CLUSTER_RESOURCES
    assert not find(objects, "Role", "hotload-operator")  # the Lease's Role only


@pytest.mark.parametrize("pattern", ["hl-*", "!kube-system", "team-?", "a,b"])
def test_a_pattern_without_the_cluster_wide_mode_fails_saying_what_it_would_grant(
    tmp_path: Path, pattern: str
) -> None:
    done = helm(
        "template", "hotload", str(chart_path()), values={"watchNamespaces": [pattern]},
        tmp=tmp_path,
    )  # fmt: skip

    assert done.returncode != 0
    assert "clusterWide.enabled=true" in done.stderr and "StatefulSets" in done.stderr


def test_plain_namespace_names_get_roles_there_and_nothing_cluster_wide(tmp_path: Path) -> None:
    objects = render(tmp_path, {"watchNamespaces": ["team-a", "team-b"]})

    cluster_role = one(objects, "ClusterRole", "hotload-operator-cluster")
    assert _resources(cluster_role["rules"]) == {"customresourcedefinitions", "namespaces"}
    roles = find(objects, "Role", "hotload-operator")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _resources(role["rules"]) == NAMESPACED_RESOURCES
    bindings = find(objects, "RoleBinding", "hotload-operator")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "hotload-operator", "namespace": "hotload-system"}
        ]


@pytest.mark.parametrize("values", [{}, CLUSTER_WIDE], ids=["default", "cluster-wide"])
def test_operator_never_writes_pods_and_binds_only_the_sidecar_role(
    tmp_path: Path, values: dict[str, Any]
) -> None:
    objects = render(tmp_path, values)
    roles = find(objects, "ClusterRole", "hotload-operator-cluster") + find(objects, "Role")
    rules = [rule for role in roles for rule in role["rules"]]

    pod_verbs = {v for r in rules if "pods" in r.get("resources", []) for v in r["verbs"]}
    assert pod_verbs == {"get", "list", "watch"}
    (bind,) = [r for r in rules if "clusterroles" in r.get("resources", [])]
    assert bind["verbs"] == ["bind"]
    assert bind["resourceNames"] == [SIDECAR_CLUSTER_ROLE]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule.get("resources", [])
        assert "secrets" not in rule.get("resources", [])


def test_sidecar_cluster_role_is_the_apis_sidecar_rules(tmp_path: Path) -> None:
    role = one(render(tmp_path), "ClusterRole", SIDECAR_CLUSTER_ROLE)

    assert role["rules"] == [dict(rule) for rule in SIDECAR_RBAC_RULES]


def test_admission_policy_is_bound_and_enforced(tmp_path: Path) -> None:
    objects = render(tmp_path)

    policy = one(objects, "ValidatingAdmissionPolicy", "hotload-sidecar-own-pod")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "hotload-sidecar-own-pod")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == "hotload-sidecar-own-pod"
    assert binding["spec"]["validationActions"] == ["Deny"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods", "pods/status"] and rule["operations"] == ["UPDATE"]
    # Who is a sidecar is a variable every rule starts with, not a match condition (which
    # would convert both pods for CEL a second time on every sidecar write).
    assert "matchConditions" not in policy["spec"]
    assert policy["spec"]["variables"][0]["name"] == "sidecar"
    for validation in policy["spec"]["validations"]:
        assert validation["expression"].startswith("!variables.sidecar || "), validation


def test_metrics_service_and_optional_service_monitor(tmp_path: Path) -> None:
    default = render(tmp_path)
    service = one(default, "Service", "hotload-operator-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "operator"
    assert not find(default, "ServiceMonitor")

    monitored = render(tmp_path, {"metrics": {"serviceMonitor": {"enabled": True}}})
    monitor = one(monitored, "ServiceMonitor", "hotload-operator")
    assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_optional_recording_rules_and_dashboard(tmp_path: Path) -> None:
    assert not find(render(tmp_path), "PrometheusRule")

    objects = render(
        tmp_path,
        {
            "metrics": {
                "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
                "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
            }
        },
    )

    rule = one(objects, "PrometheusRule", "hotload-operator")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert rules and all("expr" in r for r in rules)
    dashboard = one(objects, "ConfigMap", "hotload-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["hotload.json"])["panels"]
    assert any("hotload_" in json.dumps(panel) for panel in panels)


@pytest.mark.parametrize(
    ("release", "values"),
    [
        ("hotload", {}),
        ("blue", {}),
        ("hotload-canary", {}),
        ("blue", {"nameOverride": "rollouts"}),
        ("blue", {"fullnameOverride": "fleet"}),
    ],
)
def test_the_local_installer_names_the_deployment_as_the_chart_does(
    tmp_path: Path, release: str, values: dict[str, Any]
) -> None:
    objects = render(tmp_path, values, release=release)

    expected = ChartRelease(release=release, values=values).operator_deployment
    assert find(objects, "Deployment", expected), [o["metadata"]["name"] for o in objects]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"watchNamespace": ["hl-*"]}, "watchNamespace"),
        ({"operator": {"replicas": 0}}, "replicas"),
        ({"watchNamespaces": ["Bad_Name"]}, "watchNamespaces"),
        ({"clusterWide": True}, "clusterWide"),
        ({"clusterWide": {"enabled": "yes"}}, "enabled"),
        ({"admissionPolicy": {"validationActions": ["Block"]}}, "validationActions"),
        ({"operator": {"logFormat": "xml"}}, "logFormat"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ],
)
def test_schema_refuses_bad_values_naming_the_field(
    tmp_path: Path, values: dict[str, Any], complaint: str
) -> None:
    done = helm("template", "hotload", str(chart_path()), values=values, tmp=tmp_path)

    assert done.returncode != 0
    assert complaint in done.stderr, done.stderr
