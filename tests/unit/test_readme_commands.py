"""The README's commands are the ones make runs: its own-script line is make chaos's
``own-script`` recipe to the letter (plus where Allure results go), and .ci/run calls the
two commands the README names."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_own_script_line_is_what_make_chaos_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own training script", 1)[1]
    line = re.search(r"```\n(.+?)\n```", section, re.S)[1].strip()
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^own-script:.*\n\t(.+)$", makefile, re.M)[1].strip()
    assert recipe == f"{line} --alluredir $(ALLURE)", f"README: {line}\nMakefile: {recipe}"
    assert re.search(r"^chaos:.*\n(\t.*\n)*\t\$\(MAKE\) --no-print-directory own-script$", makefile, re.M), (
        "make chaos must run the own-script line")
    script = re.search(r'--chaos-workload "python (\S+)" --chaos-workload-dir (\S+)', line)
    assert (ROOT / script[2] / script[1]).is_file(), f"{script[2]}/{script[1]} does not exist"


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for command in ("make test", "make chaos"):
        assert re.search(rf"^{command}$", ci, re.M), f".ci/run does not run {command}"
        assert re.search(rf"^{command} +#", readme, re.M), f"the README's two commands lack {command}"
