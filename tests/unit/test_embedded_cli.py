"""`python -m chaos.embedded up`'s refusals, before any supervisor starts (no cluster here)."""

import pytest

from chaos.embedded.__main__ import main


@pytest.mark.parametrize("argv, said", [
    (["--kubernetes", "--foreign"], "--kubernetes and --foreign: one kind of cluster at a time"),
    (["--foreign", "--hosts", "plain"], "--foreign: --hosts do not apply (its machines are always test hosts; "
                                        "each node's service restarts its Ray)"),
    (["--kubernetes", "--recovery-delay", "1"], "--kubernetes: --recovery-delay do not apply (its nodes are always "
                                                "test hosts"),
    (["--foreign", "--workers", "0"], "a foreign cluster needs at least 1 worker, got workers=0"),
    (["--cuda-driver-dir", "/nonexistent-driver"], "--cuda-driver-dir /nonexistent-driver: no libcuda.so.1 there"),
    (["--kubernetes", "--cuda-driver-dir", "/x"], "--cuda-driver-dir does not apply to --kubernetes"),
])
def test_up_refuses_what_cannot_work_naming_it(argv, said, capsys, tmp_path):
    assert main(["up", "--dir", str(tmp_path), *argv]) == 2
    assert said in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_a_cuda_driver_dir_comes_first_on_every_nodes_library_path(tmp_path, monkeypatch):
    """What a GPU node has: its driver on the library path before anything else."""
    from chaos.embedded.cluster import EmbeddedCluster, EmbeddedConfig

    (tmp_path / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/other")
    env = EmbeddedCluster(EmbeddedConfig(cuda_driver_dir=tmp_path))._env()
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path.resolve()}:/usr/lib/other"
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert EmbeddedCluster(EmbeddedConfig(cuda_driver_dir=tmp_path))._env()["LD_LIBRARY_PATH"] == str(tmp_path.resolve())
    assert "LD_LIBRARY_PATH" not in EmbeddedCluster(EmbeddedConfig())._env()


@pytest.fixture
def bystander():
    """A live session leader the harness did not start as a cluster: what a recorded PID
    names after a reboot (or a PID wrap)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _state(tmp_path, **fields):
    import json

    (tmp_path / "state.json").write_text(json.dumps({"kind": "embedded", "ready": True, "hosts": [], **fields}))


def test_down_signals_no_pid_recorded_in_another_boot(tmp_path, bystander, capsys):
    _state(tmp_path, serve_pid=bystander.pid, head_pid=bystander.pid, boot_id="an-earlier-boot")
    assert main(["down", "--dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert "written in another boot (boot id an-earlier-boot" in said and "none is signalled" in said, said
    assert bystander.poll() is None  # still running
    assert not (tmp_path / "state.json").exists()


def test_a_recorded_supervisor_pid_that_now_names_another_process_is_not_the_supervisor(tmp_path, bystander, capsys):
    import psutil

    from chaos.embedded.__main__ import _boot_id

    started = psutil.Process(bystander.pid).create_time()
    _state(tmp_path, serve_pid=bystander.pid, serve_started=started - 60, boot_id=_boot_id())
    assert main(["status", "--dir", str(tmp_path)]) == 1  # its start time differs: not the supervisor
    _state(tmp_path, serve_pid=bystander.pid, serve_started=started, boot_id=_boot_id())
    assert main(["status", "--dir", str(tmp_path)]) == 0  # the twin: the recorded process itself
