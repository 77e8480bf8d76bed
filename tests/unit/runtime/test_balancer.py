"""Service routing: Ready pods in turn, sessions sticky while their pod stays Ready."""

from __future__ import annotations

from hotload.local.runtime.balancer import Balancer
from hotload.local.runtime.service_table import Backend, parse_service

A, B, C = (Backend(f"ns/p-{n}", f"127.9.1.{n}", 8480) for n in range(3))


def test_requests_without_a_session_go_round_robin() -> None:
    balancer = Balancer()
    firsts = [balancer.order([A, B, C], None)[0].pod for _ in range(6)]
    assert firsts == ["ns/p-0", "ns/p-1", "ns/p-2", "ns/p-0", "ns/p-1", "ns/p-2"]


def test_a_session_sticks_to_its_pod_while_that_pod_is_ready() -> None:
    balancer = Balancer()
    chosen = balancer.order([A, B, C], "s1")[0]
    for _ in range(5):
        balancer.order([A, B, C], None)
        assert balancer.order([A, B, C], "s1")[0] == chosen
    remaining = [b for b in (A, B, C) if b != chosen]
    moved = balancer.order(remaining, "s1")[0]
    assert moved in remaining
    assert balancer.order([A, B, C], "s1")[0] == moved, "the session stays where it moved"


def test_sessions_are_forgotten_least_recently_used_first() -> None:
    balancer = Balancer(max_sessions=2)
    balancer.pin("old", A)
    balancer.pin("mid", B)
    balancer.order([A, B, C], "mid")
    balancer.pin("new", C)
    assert "old" not in balancer._sessions
    assert "mid" in balancer._sessions


def test_no_backends_means_nothing_to_try() -> None:
    assert Balancer().order([], "s") == []


def test_only_services_with_a_selector_are_proxied_and_named_ports_keep_their_names() -> None:
    service = parse_service(
        {
            "metadata": {"name": "front", "namespace": "ns"},
            "spec": {
                "selector": {"app": "x"},
                "ports": [
                    {"name": "http", "port": 80, "targetPort": "http"},
                    {"port": 9000},
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                ],
            },
        }
    )
    assert service is not None
    assert [p.key for p in service.ports] == ["http", "9000"]
    assert service.selects("ns", {"app": "x", "other": "y"})
    assert not service.selects("other-ns", {"app": "x"})
    assert (
        parse_service({"metadata": {"name": "kubernetes"}, "spec": {"ports": [{"port": 443}]}})
        is None
    )
