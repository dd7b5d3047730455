"""What every integration test that runs a chaos session in a subprocess checks afterwards."""

from pathlib import Path


def assert_nothing_left(session_pid):
    """No process of that pytest session's cluster (Ray temp dir /tmp/rc-<pid>) may survive it."""
    marker = f"/tmp/rc-{session_pid}/"
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                left.append(cmdline.parent.name)
        except OSError:
            continue
    assert not left, f"processes of the embedded cluster left behind: {left}"
