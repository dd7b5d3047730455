"""The plugin's session plumbing: which cluster a test gets, the xdist slots, and
progress lines that reach the terminal from xdist workers."""

import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from chaos import pytest_plugin
from chaos.pytest_plugin import Clusters, _slot


def request_for(marker=None, kubernetes_option=False, profile=None):
    config = types.SimpleNamespace(getoption=lambda name: kubernetes_option if name == "chaos_kubernetes" else None,
                                   stash={pytest_plugin._PROFILE: profile} if profile else {})
    node = types.SimpleNamespace(get_closest_marker=lambda name: name if name == marker else None)
    return types.SimpleNamespace(config=config, node=node)


def test_kubernetes_marked_suites_get_the_embedded_kubernetes_cluster():
    assert Clusters.kind_for(request_for()) == "embedded"
    assert Clusters.kind_for(request_for(marker="kubernetes")) == "kubernetes"
    assert Clusters.kind_for(request_for(kubernetes_option=True)) == "kubernetes"
    assert Clusters.kind_for(request_for(marker="kubernetes", profile=object())) == "profile"


def test_each_xdist_worker_has_two_slots_of_its_own(monkeypatch):
    def worker(name):
        return types.SimpleNamespace(workerinput={"workerid": name})

    assert _slot(types.SimpleNamespace(), 0) is None and _slot(types.SimpleNamespace(), 1) is None
    # a session started by a worker's test inherits the variable but is not a worker
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert _slot(types.SimpleNamespace(), 0) is None
    assert (_slot(worker("gw1"), 0), _slot(worker("gw1"), 1)) == (2, 3)
    with pytest.raises(pytest.exit.Exception, match="at most 4 workers"):
        _slot(worker("gw4"), 0)


class FakeCluster:
    """Stands in for _open: records what was opened and closed, in order."""

    def __init__(self, log, fail=()):
        self.log, self.fail = log, fail

    def __call__(self, kind):
        import contextlib

        @contextlib.contextmanager
        def opened():
            if kind in self.fail:
                raise RuntimeError(f"{kind} would not start")
            self.log.append(f"open {kind}")
            yield f"env-{kind}"
            self.log.append(f"close {kind}")
        return opened()


def test_one_cluster_open_at_a_time_and_a_failed_start_is_not_retried():
    log = []
    clusters = Clusters(request=None)
    clusters._open = FakeCluster(log, fail=("profile",))
    assert clusters.get("embedded") == "env-embedded"
    assert clusters.get("embedded") == "env-embedded"
    assert clusters.get("kubernetes") == "env-kubernetes"
    assert log == ["open embedded", "close embedded", "open kubernetes"]
    for _ in range(2):
        with pytest.raises(RuntimeError, match="profile would not start"):
            clusters.get("profile")
    assert log == ["open embedded", "close embedded", "open kubernetes", "close kubernetes"]
    clusters.close()
    assert clusters.get("embedded") == "env-embedded" and log[-1] == "open embedded"
    clusters.close()
    assert log[-1] == "close embedded"


def test_progress_lines_reach_the_terminal_from_xdist_workers(tmp_path):
    """Both workers report at once, and every line still arrives whole: execnet starts the
    workers with ``python -u``, where a print() is two writes (the text, then the newline),
    so lines from two workers used to merge now and then ("[gw1] ... a 825[gw0] ... b 706")."""
    lines_per_test = 2000
    (tmp_path / "test_progress.py").write_text(textwrap.dedent(f"""
        from chaos.pytest_plugin import live_reporter

        def test_a(request):
            reporter = live_reporter(request.config)
            for i in range({lines_per_test}):
                reporter.say(f"progress of a {{i}}")

        def test_b(request):
            reporter = live_reporter(request.config)
            for i in range({lines_per_test}):
                reporter.say(f"progress of b {{i}}")
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
                           str(tmp_path / "test_progress.py")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    progress = [line for line in done.stderr.splitlines() if "progress of" in line]
    whole = re.compile(r"\[gw\d+\] \[chaos \d\d:\d\d:\d\d\] progress of [ab] \d+")
    broken = [line for line in progress if not whole.fullmatch(line)]
    assert not broken, f"{len(broken)} of {len(progress)} progress lines not whole, e.g. {broken[:3]}"
    for name in ("a", "b"):
        numbers = [int(line.rsplit(" ", 1)[1]) for line in progress if f" progress of {name} " in line]
        assert numbers == list(range(lines_per_test)), f"test_{name}'s progress lines: {numbers[:5]}...{numbers[-5:]}"


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("allow_head, said", [
    ("false", "head faults refused: profile staging-vms does not allow the head (safety.allow_head: false)"),
    ("true", "head faults run on the embedded cluster only; profile staging-vms's cluster is not restarted"),
])
def test_head_faults_on_a_profile_are_refused_or_skipped_before_touching_it(tmp_path, allow_head, said):
    """The example VM profile (nothing there is reachable from here): refused without
    safety.allow_head, skipped with it — before any connection is tried."""
    profile = tmp_path / "vm.yaml"
    profile.write_text((ROOT / "examples/profiles/vm-ssh.yaml").read_text()
                       .replace("allow_head: false", f"allow_head: {allow_head}"))
    p = subprocess.run([sys.executable, "-m", "pytest", "suites/test_head_loss.py", "-m", "chaos", "-rA",
                        "-k", "without_fault", "--chaos-profile", str(profile), "-p", "no:cacheprovider",
                        "--chaos-reports", str(tmp_path / "reports")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert said in p.stdout, p.stdout[-3000:]
    assert p.returncode == (1 if allow_head == "false" else 0), p.stdout[-3000:]


def test_suites_run_grouped_by_cluster_with_the_foreign_stand_in_first():
    """The foreign stand-in's file (the longest) first, so xdist's loadfile starts it first;
    then one group per cluster kind, file order kept within a group."""
    import types

    from chaos.pytest_plugin import _cluster_order

    class Marker:
        def __init__(self, args=()):
            self.args, self.kwargs = args, {}

    def item(name, fixtures=(), **markers):
        return types.SimpleNamespace(name=name, fixturenames=fixtures,
                                     get_closest_marker=lambda m: Marker() if m in markers else None)

    items = [item("k8s", kubernetes=True), item("raylet-1"), item("foreign", fixtures=("foreign",)), item("raylet-2")]
    assert [i.name for i in sorted(items, key=_cluster_order)] == ["foreign", "raylet-1", "raylet-2", "k8s"]
