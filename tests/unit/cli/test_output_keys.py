"""One key style for every ``-o json|yaml``: camelCase field names, data keys untouched."""

from __future__ import annotations

from dataclasses import dataclass

from hotload.cli.fleet_view import ReplicaRow, as_data
from hotload.cli.output import camel, record
from hotload.local.lifecycle import RegionStatus


def test_camel_turns_python_field_names_into_the_api_key_style() -> None:
    assert [camel(n) for n in ("pod", "target_step", "degraded_reason", "a_b_c")] == [
        "pod",
        "targetStep",
        "degradedReason",
        "aBC",
    ]


def test_a_record_camel_cases_field_names_but_not_keys_that_are_data() -> None:
    @dataclass(frozen=True)
    class Row:
        newest_step: int
        states: dict[str, int]

    assert record(Row(3, {"not_loaded": 1})) == {"newestStep": 3, "states": {"not_loaded": 1}}


def test_status_ledger_and_local_status_print_the_same_key_style() -> None:
    row = ReplicaRow("r", "ns", "d", "d-0", "s1", "s2", "Loading", None, None, 1, None, None)
    (ledger_row,) = as_data([row])
    assert {"pod", "snapshot", "behind", "lag"} <= set(ledger_row)
    assert not any("_" in key for key in ledger_row)
    region = RegionStatus(
        name="us-east",
        index=1,
        context="hotload-us-east",
        apiserver_url="https://127.0.0.1:1",
        processes={"kube-apiserver": True},
        nodes_ready=1,
        nodes_total=1,
        services={"hotload_metrics": 9000},
    )
    dumped = region.model_dump(mode="json", by_alias=True)
    assert dumped["apiserverUrl"] == "https://127.0.0.1:1" and dumped["nodesReady"] == 1
    assert dumped["services"] == {"hotload_metrics": 9000}
