"""The local regions' add-ons, as planned and configured before anything runs.

Would catch: a Prometheus that scrapes nothing (wrong labels or ports for the chart's
operator and the renderer's replicas), rules the chart and the local Prometheus disagree
on, WAN bytes counted in the wrong direction, profiles the publisher cannot find by
context, add-on ports that ``down`` would not wait for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import boto3
import pytest
import yaml

from hotload.api.labels import REPLICA_NAME
from hotload.local import addons, object_storage, prometheus, wan
from hotload.local.region import Region, RegionAddons, RegionPorts
from hotload.operator.workload import selector_labels

CHART = Path(__file__).parents[3] / "charts" / "hotload"


def region(tmp_path: Path, name: str = "us-east", **addon_fields: object) -> Region:
    extras = RegionAddons.model_validate(addon_fields)
    return Region(
        name=name,
        index=9,
        directory=tmp_path / name,
        kubeconfig=tmp_path / "kubeconfig",
        ports=RegionPorts(
            etcd_client=1,
            etcd_peer=2,
            apiserver=3,
            controller_manager=4,
            scheduler=5,
            kwok=6,
            **addons.ports(extras),
        ),
        nodes=1,
        gpus_per_node=1,
        addons=extras,
    )


def test_add_on_ports_are_planned_only_when_asked_and_down_waits_for_them(tmp_path: Path) -> None:
    bare = region(tmp_path)
    assert bare.ports.all() == (1, 2, 3, 4, 5, 6)
    full = region(tmp_path, object_storage=True, prometheus=True)
    extra = {full.ports.minio, full.ports.minio_console, full.ports.wan, full.ports.wan_api,
             full.ports.prometheus}  # fmt: skip
    assert None not in extra and extra <= set(full.ports.all())


def test_tools_and_build_groups_follow_the_add_ons() -> None:
    both = RegionAddons(object_storage=True, prometheus=True)
    assert addons.tools(both, regions=3) == ("minio", "toxiproxy-server", "mc", "prometheus")
    assert addons.tools(both, regions=1) == ("minio", "toxiproxy-server", "prometheus")
    assert addons.tools(RegionAddons(), regions=3) == ()
    assert addons.build_groups(both) == ("control-plane", "minio", "toxiproxy", "prometheus")


def test_prometheus_scrapes_the_renderers_replicas_and_the_charts_operator(tmp_path: Path) -> None:
    r = region(tmp_path, prometheus=True)
    config = prometheus.scrape_config(r)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sidecar = jobs["hotload-sidecar"]
    assert sidecar["kubernetes_sd_configs"] == [
        {"role": "pod", "kubeconfig_file": str(r.admin_kubeconfig)}
    ]
    keeps = {
        k["source_labels"][0]: k["regex"]
        for k in sidecar["relabel_configs"]
        if k.get("action") == "keep"
    }
    assert keeps["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == REPLICA_NAME
    assert selector_labels("x")["app.kubernetes.io/name"] == REPLICA_NAME
    assert keeps["__meta_kubernetes_pod_container_port_name"] == "http"
    assert {"target_label": "region", "replacement": "us-east"} in sidecar["relabel_configs"]
    helpers = CHART / "templates" / "_helpers.tpl"
    assert "app.kubernetes.io/component: operator" in helpers.read_text()
    operator = jobs["hotload-operator"]
    assert operator["honor_labels"] is True
    written = prometheus.write_config(r)
    assert yaml.safe_load(written.read_text())["rule_files"] == [
        str(prometheus.directory(r) / prometheus.RULES_FILE)
    ]


def test_recording_rules_are_the_charts(tmp_path: Path) -> None:
    assert (CHART / "rules" / "hotload-rules.yaml").read_text() == prometheus.rules_text()
    groups = yaml.safe_load(prometheus.rules_text())["groups"]
    records = {rule["record"] for group in groups for rule in group["rules"]}
    assert {"hotload:replica_lag_steps", "hotload:propagation_seconds:p99"} <= records


def test_wan_bytes_count_what_clients_send_as_inbound() -> None:
    def line(metric: str, direction: str, value: int, proxy: str = "s3") -> str:
        labels = f'direction="{direction}",listener="l",proxy="{proxy}",upstream="u"'
        return f"toxiproxy_proxy_{metric}_bytes_total{{{labels}}} {value}"

    text = "\n".join(
        [
            "# HELP toxiproxy_proxy_received_bytes_total x",
            line("received", "downstream", 6552),
            line("received", "upstream", 5230),
            line("sent", "upstream", 5230),
            line("received", "upstream", 9, proxy="other"),
        ]
    )
    assert wan.parse_metrics(text) == wan.WanBytes(inbound=5230, outbound=6552)


def test_each_regions_profile_is_named_after_its_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    regions = [region(tmp_path, name, object_storage=True) for name in ("us-east", "eu-west")]
    for r in regions:
        object_storage.make_credentials(r)
    creds_file, config_file = object_storage.write_aws_profiles(regions, tmp_path / "aws")
    assert oct(creds_file.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds_file))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config_file))
    for r in regions:
        found = boto3.session.Session(profile_name=r.context).get_credentials()
        assert found is not None
        assert found.access_key == object_storage.credentials(r).access_key_id


def test_the_dashboard_only_uses_recorded_series_and_real_metrics() -> None:
    dashboard = json.loads((CHART / "dashboards" / "hotload.json").read_text())
    groups = yaml.safe_load(prometheus.rules_text())["groups"]
    records = {rule["record"] for group in groups for rule in group["rules"]}
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"hotload:[a-z_:0-9]+", expr)}
    assert used and used <= records
    raw = {name for expr in exprs for name in re.findall(r"\bhotload_[a-z_]+", expr)}
    assert raw <= {"hotload_operator_replicas", "hotload_failures_total"}
