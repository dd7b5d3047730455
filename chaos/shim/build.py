"""Compile the CUDA fault shim, locally (cached) or on a remote host through a transport.

The shim is built from source on the host that uses it rather than shipped as a binary,
so it always matches that host's glibc.  Builds are cached by the SHA-256 of the sources,
flags and compiler, and published with an atomic rename so concurrent builders (several
workers on one node) never see a half-written library.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from chaos.errors import InjectionError
from chaos.transport.base import Transport

SHIM_DIR = Path(__file__).resolve().parent
SHIM_SOURCES = ("shim.c",)
LIBRARY_NAME = "libchaos_cuda.so"
CFLAGS = ("-O2", "-fPIC", "-shared", "-Wall")
LIBS = ("-ldl", "-lpthread")
DEFAULT_CACHE = Path("~/.cache/ray-chaos/shim")


def compiler() -> str:
    """The C compiler to use: $CC, else `cc`."""
    return os.environ.get("CC", "cc")


def compile_shared(sources: Sequence[Path], output: Path, flags: Sequence[str] = CFLAGS,
                   libs: Sequence[str] = LIBS) -> Path:
    """Compile `sources` into the shared object `output`, atomically (temp file + rename).

    Raises InjectionError carrying the compiler's output when the build fails.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    cmd = [compiler(), *flags, "-o", tmp, *map(str, sources), *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        os.unlink(tmp)
        raise InjectionError(f"cannot run the C compiler `{shlex.join(cmd)}`: {e}") from e
    if proc.returncode != 0:
        os.unlink(tmp)
        raise InjectionError(
            f"building {output.name} failed (`{shlex.join(cmd)}` exited {proc.returncode}):\n"
            f"{(proc.stderr or proc.stdout).strip()}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, output)
    return output


def _source_texts() -> dict[str, str]:
    return {name: (SHIM_DIR / name).read_text() for name in SHIM_SOURCES}


def shim_hash(compiler_name: str | None = None) -> str:
    """SHA-256 over the sources, flags and compiler: the cache key of one build."""
    h = hashlib.sha256()
    for name, text in sorted(_source_texts().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    h.update(" ".join((compiler_name or compiler(), *CFLAGS, *LIBS)).encode())
    return h.hexdigest()[:32]


def ensure_shim(cache_dir: Path | None = None) -> Path:
    """Return the path of libchaos_cuda.so, compiling it once per source version.

    Default location: ~/.cache/ray-chaos/shim/<hash>/libchaos_cuda.so.
    """
    root = (cache_dir or DEFAULT_CACHE).expanduser()
    target = root / shim_hash() / LIBRARY_NAME
    if target.exists():
        return target
    return compile_shared([SHIM_DIR / n for n in SHIM_SOURCES], target)


def remote_build_script(cache_root: str = str(DEFAULT_CACHE)) -> str:
    """A POSIX shell script that builds the shim on another host and prints its path.

    The sources travel inside the script (heredocs), so any transport that can run a
    command is enough; the remote cache is keyed by the same hash as a local build made
    with the remote's `cc`.
    """
    root = (f'"$HOME"/{shlex.quote(cache_root[2:])}' if cache_root.startswith("~/")
            else shlex.quote(cache_root))
    lines = ["set -e", f"d={root}/{shim_hash('cc')}",
             f'if [ -f "$d/{LIBRARY_NAME}" ]; then echo "$d/{LIBRARY_NAME}"; exit 0; fi',
             'mkdir -p "$d"', 'src=$(mktemp -d)', "trap 'rm -rf \"$src\"' EXIT"]
    for name, text in _source_texts().items():
        lines += [f"cat > \"$src/{name}\" <<'CHAOS_SHIM_EOF'", text.rstrip("\n"), "CHAOS_SHIM_EOF"]
    srcs = " ".join(f'"$src/{n}"' for n in SHIM_SOURCES)
    lines += [f'tmp="$d/.{LIBRARY_NAME}.$$"',
              f'cc {" ".join(CFLAGS)} -o "$tmp" {srcs} {" ".join(LIBS)}',
              f'mv -f "$tmp" "$d/{LIBRARY_NAME}"', f'echo "$d/{LIBRARY_NAME}"']
    return "\n".join(lines) + "\n"


def ensure_remote_shim(transport: Transport, timeout: float = 120.0,
                       cache_root: str = str(DEFAULT_CACHE)) -> str:
    """Build (or reuse) the shim on the transport's host; returns the remote library path."""
    script = remote_build_script(cache_root)
    result = transport.run(f"sh -c {shlex.quote(script)}", timeout=timeout)
    if not result.ok:
        raise InjectionError(f"{transport.host}: building the CUDA shim failed "
                             f"(exit {result.exit_code}):\n{(result.stderr or result.stdout).strip()}")
    return result.stdout.strip().splitlines()[-1]
