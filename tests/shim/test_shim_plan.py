"""The Python plan model, its agreement with shim.c, the control file, and the builders."""

from __future__ import annotations

import platform
import os
import re
import struct
import subprocess

import pytest
from pydantic import ValidationError

from chaos.errors import InjectionError, ProfileError
from chaos.shim import build
from chaos.shim.control import MAGIC, SIZE, control_command, disarm, read_log, write_control
from chaos.shim.cuda_errors import CODES, ERRORS, error_message
from chaos.shim.plan import PRESETS, WRAPPED, Plan
from chaos.transport.local import LocalTransport

SHIM_C = (build.SHIM_DIR / "shim.c").read_text()


def error_for(**fields) -> str:
    with pytest.raises(ValidationError) as e:
        Plan(**fields)
    return str(e.value)


@pytest.mark.parametrize("fields, field, words", [
    ({"symbols": ("cuFooBar",)}, "symbols", "'cuFooBar' matches no wrapped entry point"),
    ({"symbols": "cuLaunch*; rm"}, "symbols", "may only hold"),
    ({"symbols": ()}, "symbols", "at least 1"),
    ({"error": "CUDA_ERROR_NOPE"}, "error", "unknown CUDA error name 'CUDA_ERROR_NOPE'"),
    ({"error": 0}, "error", "0 is success"),
    ({"mode": "explode"}, "mode", "'error', 'deferred', 'sticky', 'hang' or 'delay'"),
    ({"probability": 0}, "probability", "greater than 0"),
    ({"probability": 1.5}, "probability", "less than or equal to 1"),
    ({"every": 0}, "every", "greater than 0"),
    ({"times": 0}, "times", "greater than 0"),
    ({"rank": -1}, "rank", "greater than or equal to 0"),
    ({"plan_id": "has space"}, "plan_id", "should match pattern"),
    ({"kernel": "a b"}, "kernel", "without spaces"),
    ({"boot_id": "node-1"}, "boot_id", "'node-1' is not a Linux boot id"),
    ({"boot_id": "1B4E28BA-2FA1-11D2-883F-0016D3CCA427"}, "boot_id", "is not a Linux boot id"),
    ({"boot_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427\n"}, "boot_id", "is not a Linux boot id"),
    ({"mode": "delay"}, "delay_us", "needs delay_us > 0"),
    ({"delay_us": 5}, "delay_us", "only applies to mode 'delay'"),
    ({"colour": "red"}, "colour", "Extra inputs are not permitted"),
])
def test_validation_errors_name_the_field_and_value(fields, field, words):
    message = error_for(**fields)
    assert field in message and words in message, message


def test_error_accepts_names_and_codes():
    assert Plan(error="CUDA_ERROR_ECC_UNCORRECTABLE").error == 214
    assert Plan(error=700).error_name == "CUDA_ERROR_ILLEGAL_ADDRESS"


def test_presets_and_overrides():
    ecc = Plan.preset("ecc", rank=2)
    assert (ecc.mode, ecc.sticky, ecc.error, ecc.rank) == ("deferred", True, 214, 2)
    assert Plan.preset("gpu-lost").symbols == ("*",)
    with pytest.raises(ProfileError, match="unknown CUDA fault preset 'nvlink'.*known: ecc"):
        Plan.preset("nvlink")
    with pytest.raises(ValidationError, match="probability"):
        Plan.preset("ecc", probability=2)


def test_render_is_the_key_value_text_the_shim_parses():
    text = Plan(plan_id="x1", symbols="cuMemcpy*, cuLaunchKernel", error=999, rank=0, times=None).render()
    assert text.splitlines() == [
        "plan_id=x1", "symbols=cuMemcpy*,cuLaunchKernel", "mode=error", "sticky=0", "error=999", "after=0",
        "every=1", "probability=1.0", "seed=0", "times=0", "rank=0", "delay_us=0"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_shim_accepts_every_preset(run_driver, preset):
    plan = Plan.preset(preset, plan_id=f"preset-{preset}")
    [armed] = [e for e in run_driver("gpa2", "esync", plan=plan).log if e["event"] == "arm"]
    assert (armed["plan_id"], armed["error"], armed["error_name"]) == (plan.plan_id, plan.error, plan.error_name)


def test_python_and_c_agree_on_wrapped_symbols_and_error_names():
    rows = re.findall(r'^\s+X\((\w+), "(\w+)"', SHIM_C, re.M)
    assert dict(rows) == WRAPPED
    c_errors = {int(code): name for code, name in re.findall(r'\{(\d+), "(CUDA_ERROR_\w+)"\}', SHIM_C)}
    assert c_errors == CODES


def test_pytorch_wording_of_errors():
    assert error_message(214) == "CUDA error: uncorrectable ECC error encountered"
    assert error_message(700) == "CUDA error: an illegal memory access was encountered"
    assert error_message(719) == "CUDA error: unspecified launch failure"
    assert error_message(999) == "CUDA error: unknown error"
    assert error_message(12345) == "CUDA error: unrecognized error code 12345"
    assert set(CODES.values()) == set(ERRORS)


# ---- control file ----

def test_control_file_layout(tmp_path):
    path = tmp_path / "ctl"
    gen = write_control(path, "symbols=cuLaunchKernel\n")
    data = path.read_bytes()
    assert len(data) == SIZE and data[:8] == MAGIC
    assert struct.unpack_from("<III", data, 8)[:2] == (gen, 23) and gen % 2 == 0
    assert disarm(path) == gen + 2
    with pytest.raises(ValueError, match="at most 4032"):
        write_control(path, "x" * 5000)


def test_control_command_arms_without_the_harness_installed(tmp_path):
    path = tmp_path / "ctl"
    plan = Plan(plan_id="remote")
    subprocess.run(control_command(str(path), plan), shell=True, check=True, cwd=tmp_path, timeout=30,
                   env={"PATH": "/usr/bin:/bin"})
    data = path.read_bytes()
    assert data[64:64 + len(plan.render())].decode() == plan.render()
    subprocess.run(control_command(str(path), None), shell=True, check=True, timeout=30)
    assert struct.unpack_from("<I", path.read_bytes(), 12)[0] == 0


def test_read_log_skips_foreign_and_torn_lines(tmp_path):
    log = tmp_path / "log"
    log.write_text('some stderr noise\n{"event":"inject","call":1}\n{"other":1}\n{"event":"arm"')
    assert read_log(log) == [{"event": "inject", "call": 1}]


# ---- builders ----

def test_ensure_shim_is_cached_by_source_hash(tmp_path):
    first = build.ensure_shim(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build.ensure_shim(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert first.parent.name == build.shim_hash() and first.name == "libchaos_cuda.so"
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]


def test_compile_errors_carry_the_compiler_output(tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return undeclared_thing; }\n")
    with pytest.raises(InjectionError, match="undeclared_thing") as e:
        build.compile_shared([bad], tmp_path / "out" / "libbad.so")
    assert "exited" in str(e.value)
    assert list((tmp_path / "out").iterdir()) == []


class Recording(LocalTransport):
    """The local transport, keeping every command it ran; ``answers``: commands it answers
    itself (a host without a compiler, another machine's uname and glibc)."""

    def __init__(self, host="node-1", answers=None):
        super().__init__(host)
        self.commands, self.answers = [], answers or {}

    def run(self, command, timeout=30.0):
        self.commands.append(command)
        if command in self.answers:
            return super().run(self.answers[command])
        return super().run(command, timeout)


NO_CC = {"command -v cc": "exit 1"}


def test_the_shim_is_delivered_through_a_transport_in_commands_an_exec_url_can_carry(tmp_path):
    transport = Recording()
    path = build.deliver_shim(transport, root=str(tmp_path))
    assert path == f"{tmp_path}/{build.shim_hash('cc')}/libchaos_cuda.so"
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    assert " cuGetProcAddress_v2" in out and " dlsym" in out
    # the sources (35 KB) went in several commands, none longer than a Kubernetes exec URL allows
    assert len(transport.commands) > 4 and max(map(len, transport.commands)) < 4096, \
        sorted(map(len, transport.commands))[-3:]
    assert [p.name for p in (tmp_path / build.shim_hash("cc")).iterdir()] == ["libchaos_cuda.so"]  # no staging left
    again = Recording()
    assert build.deliver_shim(again, root=str(tmp_path)) == path and len(again.commands) == 1  # already there


def test_a_host_without_a_compiler_gets_this_machines_build_where_it_fits(tmp_path):
    transport = Recording(answers=NO_CC)
    path = build.deliver_shim(transport, root=str(tmp_path))
    assert open(path, "rb").read() == build.ensure_shim().read_bytes()
    assert not any(c.startswith("cc ") for c in transport.commands)
    assert max(map(len, transport.commands)) < 4096
    assert [p.name for p in (tmp_path / build.shim_hash("cc")).iterdir()] == ["libchaos_cuda.so"]


@pytest.mark.parametrize("uname_libc, why", [
    ("echo sparc64; echo glibc 2.99", f"it is sparc64 and this machine's build is {platform.machine()}"),
    ("uname -m; echo glibc 2.17", "its glibc is 2.17 and this machine's build needs"),
    ("uname -m; echo musl", "its glibc is unknown"),
])
def test_a_host_without_a_compiler_that_the_build_does_not_fit_is_refused_by_name(tmp_path, uname_libc, why):
    transport = Recording(answers={**NO_CC, "uname -m; getconf GNU_LIBC_VERSION": uname_libc})
    with pytest.raises(InjectionError, match=r"node-1: no C compiler \(`cc`\) to build the CUDA shim, and this "
                                             r"machine's build does not fit it \(" + re.escape(why)):
        build.deliver_shim(transport, root=str(tmp_path))
    assert not (tmp_path / build.shim_hash("cc")).exists()  # nothing left on the host




def test_an_unwritable_target_path_is_refused_naming_the_host_and_path_and_leaves_nothing(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        transport = Recording(answers={"command -v cc": "exit 0"})
        if os.geteuid() == 0:  # root writes anyway: a file where the directory must go stands in
            locked.chmod(0o755)
            (locked / build.shim_hash("cc")).write_text("not a directory")
        with pytest.raises(InjectionError, match=rf"node-1: putting the CUDA shim at {re.escape(str(locked))}/\w+/"
                                                 r"libchaos_cuda.so failed \(exit \d+\)"):
            build.deliver_shim(transport, root=str(locked))
        assert not [p for p in locked.rglob("*") if ".upload-" in p.name]  # no staging left
    finally:
        locked.chmod(0o755)


def test_a_host_without_the_python_to_unpack_is_refused_naming_it(tmp_path):
    """A pod without a shell fails at its first command (the exec transport names it); one with a
    shell but no python fails at the unpacking, named, and nothing is left."""
    transport = Recording()
    with pytest.raises(InjectionError, match=r"node-1: putting the CUDA shim at .* failed \(exit 127\)"):
        build.deliver_shim(transport, python="/nonexistent/python3", root=str(tmp_path))
    assert not [p for p in tmp_path.rglob("*") if ".upload-" in p.name]
