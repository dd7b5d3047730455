"""A fresh clone's files, copied: what a team gets from ``git clone``, for tests that must not
see this checkout's build outputs, caches or virtualenv."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(dest: Path) -> Path:
    """The tracked files and the new ones not yet committed (none that git ignores), into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():  # a worktree's links to the shared venv
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest
