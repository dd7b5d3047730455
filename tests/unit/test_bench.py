"""The benchmarks' pure parts (arguments, tables, the overhead computation) without clusters
or test hosts."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest

from chaos.backends.base import Host
from chaos.errors import TransportError
from chaos.faults.correlated import fan_out
from chaos.transport.ssh import SSHTransport

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fanout = _load("bench_fanout")
lag = _load("bench_detection_lag")
over = _load("bench_overhead")


# -- bench_fanout ------------------------------------------------------------------------

def test_fanout_args_default_to_1_8_32_and_are_sorted_and_deduplicated():
    assert fanout.parse_args([]).ks == [1, 8, 32]
    assert fanout.parse_args(["--ks", "8", "1", "8"]).ks == [1, 8]


@pytest.mark.parametrize("argv", [["--ks", "0"], ["--ks", "33"], ["--repeat", "0"], ["--boot-delay", "-1"]])
def test_fanout_args_out_of_range_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        fanout.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_fanout_table_shows_medians_and_ratios_to_the_smallest_k():
    rounds = [fanout.Round(1, 0.20, 0.001, 0.25, 2.0), fanout.Round(1, 0.40, 0.001, 0.35, 2.2),
              fanout.Round(32, 0.45, 0.004, 0.60, 3.3), fanout.Round(32, 0.45, 0.006, 0.60, 3.3)]
    lines = fanout.table(rounds).splitlines()
    assert lines[0].split()[:3] == ["k", "rounds", "returned"]
    one, many = lines[1].split(), lines[2].split()
    assert one == ["1", "2", "0.300", "1.00", "1.0", "0.300", "1.00", "2.100", "1.00"]
    assert many == ["32", "2", "0.450", "1.50", "5.0", "0.600", "2.00", "3.300", "1.57"]


def test_fanout_table_without_rounds():
    assert fanout.table([]) == "(no rounds)"


# -- bench_detection_lag -----------------------------------------------------------------

def test_detection_lag_args():
    assert lag.parse_args([]).kills == 5
    with pytest.raises(SystemExit):
        lag.parse_args(["--kills", "0"])


def test_detection_lag_table_min_median_max():
    kills = [lag.Kill(100.0, 101.5, 101.6), lag.Kill(200.0, 201.4, 201.9), lag.Kill(300.0, 302.0, 302.2)]
    lines = lag.table(kills).splitlines()
    assert lines[1].split()[-3:] == ["0.100", "0.200", "0.500"]
    assert lines[1].startswith("harness saw - Ray's death")
    assert lines[2].split()[-3:] == ["1.400", "1.500", "2.000"]
    assert lag.table([]) == "(no kills)"


def test_arrival_timeline_keeps_the_event_time_and_notes_the_arrival():
    timeline = lag.ArrivalTimeline()
    event = timeline.emit("cluster", "node_dead", t=1000.0, node_id="n1")
    assert event.t == 1000.0
    assert timeline.arrived[id(event)] > 1000.0
    assert timeline.of("node_dead") == [event]


# -- bench_overhead ----------------------------------------------------------------------

def _timeline(submitted: float | None, finished: float | None) -> dict:
    events = [{"t": submitted - 1, "source": "harness", "kind": "clock_offset", "data": {}}] if submitted else []
    if submitted is not None:
        events.append({"t": submitted, "source": "harness", "kind": "job_submitted", "data": {}})
    if finished is not None:
        events.append({"t": finished, "source": "harness", "kind": "job_finished", "data": {"status": "SUCCEEDED"}})
    return {"events": events}


def test_overhead_of_one_test():
    o = over.overhead("t", 1000.0, 1060.0, _timeline(1002.0, 1055.0))
    assert (o.test_s, o.run_s, o.before_s, o.after_s) == (60.0, 53.0, 2.0, 5.0)
    assert o.ratio == pytest.approx(60 / 53)


def test_overhead_needs_a_finished_job_inside_the_test():
    with pytest.raises(ValueError, match="no job_finished"):
        over.overhead("t", 1000.0, 1060.0, _timeline(1002.0, None))
    with pytest.raises(ValueError, match="not inside"):
        over.overhead("t", 1000.0, 1060.0, _timeline(1002.0, 1070.0))


def _result(d: Path, uid: str, name: str, start: float, stop: float, timeline: dict | None) -> None:
    attachments = []
    if timeline is not None:
        (d / f"{uid}-attachment.txt").write_text(json.dumps(timeline))
        attachments.append({"name": "timeline.json", "source": f"{uid}-attachment.txt", "type": "text/plain"})
    (d / f"{uid}-result.json").write_text(json.dumps({"name": name.split("#")[-1], "fullName": name,
                                                      "start": int(start * 1000), "stop": int(stop * 1000),
                                                      "attachments": attachments}))


def test_overhead_from_allure_results_keeps_each_tests_latest_result(tmp_path):
    _result(tmp_path, "a", "suites.s#test_a", 1000, 1100, _timeline(1010, 1090))  # older run of test_a
    _result(tmp_path, "b", "suites.s#test_a", 2000, 2060, _timeline(2002, 2056))
    _result(tmp_path, "c", "suites.s#test_b", 3000, 3030, _timeline(3001, 3020))
    _result(tmp_path, "d", "suites.s#test_gpu", 4000, 4001, None)
    rows, skipped = over.from_allure(tmp_path)
    assert [(r.test, r.test_s, r.run_s) for r in rows] == [("suites.s#test_a", 60.0, 54.0),
                                                          ("suites.s#test_b", 30.0, 19.0)]
    assert skipped == ["suites.s#test_gpu: no run timeline attached"]
    table = over.table(rows).splitlines()
    assert table[-1].split() == ["median", "45.0", "36.5", "1.5", "7.0", f"{(60 / 54 + 30 / 19) / 2:.2f}"]


def test_overhead_main_says_how_to_produce_missing_results(tmp_path, capsys):
    assert over.main(["--results", str(tmp_path / "none")]) == 1
    assert "make chaos" in capsys.readouterr().err
    assert over.main(["--results", str(tmp_path)]) == 1
    assert "no chaos test with a run timeline" in capsys.readouterr().err


# -- what the fan-out bench found: fixes in chaos.faults.correlated and chaos.transport.ssh --

class _Transport:
    """A shared connection that records when it was opened, or cannot be opened."""

    def __init__(self, host, fail=None):
        self.host, self.fail, self.connected = host, fail, threading.Event()

    def connect(self):
        if self.fail:
            raise TransportError(self.fail)
        self.connected.set()


class _Inj:
    def __init__(self, transport):
        self.host = Host(key=transport.host, name=transport.host, transport=transport)


def test_fan_out_connects_every_member_before_any_is_injected():
    transports = [_Transport(f"h{i}") for i in range(8)]
    seen = []
    results = fan_out([_Inj(t) for t in transports],
                      lambda inj: seen.append(all(t.connected.is_set() for t in transports)) or {}, start_timeout_s=5)
    assert [r.ok for r in results] == [True] * 8
    assert seen == [True] * 8, "a member was injected before every member's connection was open"


def test_a_member_that_cannot_connect_first_is_left_to_its_injection():
    """Pre-connecting only saves time: a fault that needs no connection still goes in, and
    one that does fails with its own error, as before."""
    transports = [_Transport("h0"), _Transport("h1", fail="h1: cannot connect within 5.0s"), _Transport("h2")]
    injected = []

    def inject(inj):
        injected.append(inj.host.key)
        if inj.host.transport.fail:
            raise TransportError(inj.host.transport.fail)
        return {}

    results = fan_out([_Inj(t) for t in transports], inject, start_timeout_s=5)
    assert sorted(injected) == ["h0", "h1", "h2"]
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error == "TransportError: h1: cannot connect within 5.0s"


class _DroppedChannel:
    """A channel whose host rebooted under it: the status came, closing hits a dead socket."""

    status_event = threading.Event()

    def recv_stderr_ready(self):
        return False

    def exit_status_ready(self):
        return True

    def recv_exit_status(self):
        return -1

    def close(self):
        raise EOFError()


def test_a_launch_whose_connection_drops_before_its_close_is_a_launch():
    t = SSHTransport("198.18.250.9")
    t._open_session = lambda cmd: _DroppedChannel()
    t.launch("systemctl reboot", grace=0)
    assert t.transcript[-1].note == "launched; connection dropped"
    assert t.transcript[-1].error is None
