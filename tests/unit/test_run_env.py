"""What an experiment puts into the run's environment: Train's preemption watcher goes off
only where nothing can drain a node (a wrong "off" would hide a real preemption from the run
under test); the tape's path only when asked."""

from types import SimpleNamespace

from chaos.experiment import PREEMPTION_WATCHER, Environment, Experiment
from chaos.faults.correlated import Correlated
from chaos.faults.preempt import Preempt
from chaos.faults.raylet import RayletKill
from chaos.ledger import Ledger
from chaos.train.tape import ENV_TAPE_FILE
from chaos.triggers import AfterCheckpoint
from chaos.verify import Expectation


def run_env(tmp_path, faults, external_drains=False, tape=False):
    backend = SimpleNamespace(external_drains=external_drains)
    env = Environment(backend=backend, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path, tape=tape)
    exp = Experiment(env, spec=None, faults=[(AfterCheckpoint(2), f) for f in faults], expect=Expectation(),
                     test_id="t::env")
    return exp.run_env()


def test_watcher_off_when_no_fault_drains_and_the_platform_cannot(tmp_path):
    assert run_env(tmp_path, [RayletKill(rank=1)])[PREEMPTION_WATCHER] == "0"
    assert run_env(tmp_path, [Correlated.on_ranks(RayletKill, [0, 1])])[PREEMPTION_WATCHER] == "0"


def test_watcher_stays_on_for_a_draining_fault_even_inside_a_correlated_group(tmp_path):
    assert PREEMPTION_WATCHER not in run_env(tmp_path, [RayletKill(rank=0), Preempt(rank=1, via="drain")])
    assert PREEMPTION_WATCHER not in run_env(tmp_path, [Correlated.on_ranks(
        lambda rank: Preempt(rank=rank, via="drain"), [0, 1])])


def test_watcher_stays_on_where_the_platform_may_drain(tmp_path):
    assert PREEMPTION_WATCHER not in run_env(tmp_path, [RayletKill(rank=1)], external_drains=True)


def test_tape_path_only_when_asked(tmp_path):
    assert ENV_TAPE_FILE not in run_env(tmp_path, [RayletKill(rank=1)])
    path = run_env(tmp_path, [RayletKill(rank=1)], tape=True)[ENV_TAPE_FILE]
    assert path.startswith(str(tmp_path.resolve())) and path.endswith("/tape.jsonl")
