"""The documented real-cluster command collects the suites, from a fresh checkout.

``pytest -m chaos --chaos-profile staging.yaml`` (README, docs/profiles.md, the example
profiles) once ended in ``import file mismatch ... Interrupted: 3 errors during collection``:
``testpaths`` collected tests/ as well, and ``tests/unit/test_campaign.py`` and
``suites/test_campaign.py`` were both the module ``test_campaign``.  Collection only: no
cluster is reached and no Ray started.
"""

import shutil
import subprocess
import sys

from fresh_checkout import ROOT, copy_checkout


def test_the_documented_profile_command_collects_the_suites_only(tmp_path):
    clone = copy_checkout(tmp_path / "clone")
    shutil.copy(ROOT / "examples" / "profiles" / "vm-ssh.yaml", clone / "staging.yaml")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "chaos", "--chaos-profile", "staging.yaml",
                           "--collect-only", "-q"], cwd=clone, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(clone), "HOME": str(tmp_path)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids and all(i.startswith("suites/") for i in ids), out[-3000:]
    files = {i.split("::")[0] for i in ids}
    # the two whose names a unit test file shares (test_campaign.py is the soak's: deselected)
    assert {"suites/test_final_state.py", "suites/test_head_loss.py"} <= files, out[-3000:]
