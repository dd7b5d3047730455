"""The fast tier starts no Ray: outside tests marked ``integration`` a cluster start or a
driver connection fails the test at once, naming the marker to use instead."""

import pytest


def _refuse(*_args, **_kwargs):
    raise AssertionError("make test starts no Ray: a test that needs a real cluster is marked "
                         "@pytest.mark.integration (make integration)")


@pytest.fixture(autouse=True)
def _no_ray_outside_integration(request, monkeypatch):
    if request.node.get_closest_marker("integration") is None:
        import ray

        from chaos.embedded.cluster import EmbeddedCluster

        monkeypatch.setattr(EmbeddedCluster, "up", _refuse)
        monkeypatch.setattr(ray, "init", _refuse)
    yield
