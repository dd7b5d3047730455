"""The "unreachable" route a test-host bridge leaves for its subnet (chaos.embedded.netns)."""

import ipaddress

from chaos.embedded import netns


def laid_routes(monkeypatch, address: str, prefixlen: int) -> list[list[str]]:
    laid = []
    monkeypatch.setattr(netns, "run_cmd", lambda argv, **kw: laid.append(list(argv)))
    monkeypatch.setattr(netns, "link_exists", lambda name: True)
    netns.Bridge("rcx", ipaddress.IPv4Address(address), prefixlen).up()
    return [argv for argv in laid if argv[:2] == ["ip", "route"]]


def test_a_bridge_in_the_test_host_range_leaves_its_subnet_unreachable(monkeypatch):
    assert laid_routes(monkeypatch, "198.18.9.1", 24) == [
        ["ip", "route", "replace", "unreachable", "198.18.9.0/24", "metric", str(netns.GONE_BRIDGE_METRIC)]]


def test_no_route_shadows_a_subnet_outside_the_test_host_range(monkeypatch):
    """Outside RFC 2544's block a configured subnet may be a real network."""
    assert laid_routes(monkeypatch, "10.9.8.1", 24) == []
    assert laid_routes(monkeypatch, "198.20.0.1", 24) == []
