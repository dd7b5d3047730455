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
from chaos.verdicts import Expect


def run_env(tmp_path, faults, external_drains=False, tape=False):
    backend = SimpleNamespace(external_drains=external_drains)
    env = Environment(backend=backend, ledger=Ledger(tmp_path / "ledger.jsonl"), out_dir=tmp_path, tape=tape)
    exp = Experiment(env, spec=None, faults=[(AfterCheckpoint(2), f) for f in faults], expect=Expect(),
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


def test_a_cache_written_between_rays_two_hashes_cannot_orphan_the_job(tmp_path):
    """Ray hashes each runtime_env directory once for the job and once for the upload; a .pyc
    written in between (an integration run's xdist worker importing the harness) left a job
    naming a package nobody uploaded.  With the harness's excludes the hash ignores caches."""
    from ray._private.runtime_env.packaging import get_uri_for_directory

    from chaos.train.run import runtime_env, user_spec

    pkg = tmp_path / "mod"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    excludes = runtime_env(user_spec("python t.py", "n", working_dir=str(tmp_path)), {})["excludes"]
    before = get_uri_for_directory(str(pkg), True, excludes=excludes)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    (pkg / "b.pyc").write_bytes(b"compiled")
    assert get_uri_for_directory(str(pkg), True, excludes=excludes) == before
    assert get_uri_for_directory(str(pkg), True) != before  # what Ray does without them


def test_a_profiles_runtime_env_travels_with_the_job(tmp_path):
    """Every field of a profile's runtime_env reaches the job (its pip, excludes, modules beside
    the harness's), where only env_vars used to; its working_dir is the job's working_dir."""
    from chaos.profile.models import WorkloadSettings
    from chaos.pytest_plugin import profile_workload_spec
    from chaos.train.run import PACKAGE_EXCLUDES, runtime_env

    w = WorkloadSettings(entrypoint="python train.py", runtime_env={
        "pip": ["einops==0.8.1"], "excludes": ["data/"], "py_modules": ["/opt/mylib"],
        "working_dir": str(tmp_path), "env_vars": {"NCCL_DEBUG": "WARN"}})
    renv = runtime_env(profile_workload_spec(w, "run-1"), {"RAY_CHAOS_EVENTS_LOG": "job"})
    assert renv["pip"] == ["einops==0.8.1"] and renv["working_dir"] == str(tmp_path)
    assert renv["excludes"] == ["data/", *PACKAGE_EXCLUDES]
    assert renv["py_modules"][1:] == ["/opt/mylib"] and renv["py_modules"][0].endswith("/chaos")
    assert renv["env_vars"]["NCCL_DEBUG"] == "WARN" and renv["env_vars"]["RAY_CHAOS_EVENTS_LOG"] == "job"
