"""A job gets only the part of the harness it runs (chaos.train.job_package), and that part
is whole: an import outside ``JOB_FILES`` fails here, not in a job on a team's cluster."""

import ast
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import chaos
from chaos.train.job_package import JOB_FILES, job_package
from chaos.train.run import RECORDER, runtime_env, user_spec

SOURCE = Path(chaos.__file__).resolve().parent


def module_name(file: str) -> str:
    parts = ["chaos", *Path(file).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def chaos_imports(path: Path) -> set[str]:
    """Every ``chaos`` module the file imports, at any depth (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "chaos")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "chaos":
            found.add(node.module)
    return found


def test_every_chaos_import_of_the_job_files_is_one_of_them():
    shipped = {module_name(f) for f in JOB_FILES}
    outside = {f"{f}: {m}" for f in JOB_FILES for m in chaos_imports(SOURCE / f) if m not in shipped}
    assert not outside, f"imports a job would not have (add them to JOB_FILES, or keep them out): {sorted(outside)}"


def test_the_built_package_holds_the_job_files_only():
    package = job_package()
    assert package.name == "chaos" and package is job_package()  # once per process
    built = sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file())
    assert built == sorted(JOB_FILES)
    assert runtime_env(user_spec("python t.py", "n"), {})["py_modules"][0] == str(package)


def test_each_job_module_imports_where_only_the_package_and_ray_are(tmp_path):
    """A fresh interpreter without site (so no editable install of the checkout) whose path is
    the job package and Ray's site-packages; the recorder class RAY_TRAIN_CALLBACKS names
    resolves there."""
    site_packages = sysconfig.get_paths()["purelib"]
    modules = sorted({module_name(f) for f in JOB_FILES})
    code = (f"import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"module, _, cls = {RECORDER!r}.rpartition('.')\n"
            f"getattr(importlib.import_module(module), cls)\n"
            f"import chaos, ray\n"
            f"print(json.dumps([chaos.__file__, sorted(m for m in sys.modules if m.startswith('chaos'))]))\n")
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": f"{job_package().parent}:{site_packages}",
                                            "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(where).parent == job_package(), where
    assert set(imported) == set(modules), imported
