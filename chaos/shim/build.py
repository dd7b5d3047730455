"""Compile the CUDA fault shim, locally (cached) or on a cluster's host through its transport.

The shim is built from source on the host that uses it rather than shipped as a binary,
so it always matches that host's glibc.  Builds are cached by the SHA-256 of the sources,
flags and compiler, and published with an atomic rename so concurrent builders (several
workers on one node) never see a half-written library.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import tempfile
import uuid
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
# On a cluster's hosts: absolute, so one LD_PRELOAD path fits every host whatever its $HOME.
REMOTE_ROOT = "/var/tmp/ray-chaos/shim"
UPLOAD_CHUNK = 3000  # base64 characters per command: a Kubernetes exec carries its command in the URL


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


def deliver_shim(transport: Transport, python: str = "python3", root: str | None = None,
                 timeout: float = 120.0) -> str:
    """Put the shim on the transport's host; returns its path there (the same on every host:
    ``root`` is absolute).  Built there from sources sent through the transport where the
    host has ``cc`` (it then matches the host's glibc); otherwise this machine's build is sent,
    where the host's architecture is this machine's and its glibc no older; otherwise refused,
    naming the host and what it has.

    Files go in chunks small enough for a Kubernetes exec, which carries its command in the
    URL; the host needs ``python`` to unpack them.
    """
    d = f"{root or REMOTE_ROOT}/{shim_hash('cc')}"
    lib = f"{d}/{LIBRARY_NAME}"
    if transport.run(f"test -f {shlex.quote(lib)}", timeout=timeout).ok:
        return lib
    stage = f"{d}/.upload-{uuid.uuid4().hex[:8]}"
    q = shlex.quote
    if transport.run("command -v cc", timeout=timeout).ok:
        files = {name: text.encode() for name, text in _source_texts().items()}
        srcs = " ".join(q(f"{stage}/{n}") for n in SHIM_SOURCES)
        make = f"cc {' '.join(CFLAGS)} -o {q(stage)}/{LIBRARY_NAME} {srcs} {' '.join(LIBS)}"
    else:
        _check_prebuilt_fits(transport, timeout)
        files = {LIBRARY_NAME: ensure_shim().read_bytes()}
        make = f"chmod 755 {q(stage)}/{LIBRARY_NAME}"
    payload = base64.b64encode(gzip.compress(json.dumps(
        {name: base64.b64encode(data).decode() for name, data in files.items()}).encode())).decode()
    unpack = ("import base64, gzip, json, os, sys; s = sys.argv[1]; os.makedirs(s); "
              "[open(os.path.join(s, n), 'wb').write(base64.b64decode(b)) for n, b in "
              "json.loads(gzip.decompress(base64.b64decode(open(s + '.b64').read()))).items()]")
    steps = [f"mkdir -p {q(d)} && : > {q(stage)}.b64"]
    steps += [f"printf %s {q(payload[i:i + UPLOAD_CHUNK])} >> {q(stage)}.b64"
              for i in range(0, len(payload), UPLOAD_CHUNK)]
    steps += [f"{q(python)} -c {q(unpack)} {q(stage)}", f"{make} && mv -f {q(stage)}/{LIBRARY_NAME} {q(lib)}"]
    try:
        for step in steps:
            result = transport.run(step, timeout=timeout)
            if not result.ok:
                raise InjectionError(f"{transport.host}: putting the CUDA shim at {lib} failed (exit "
                                     f"{result.exit_code}): {(result.stderr or result.stdout).strip()[-2000:]}")
    finally:
        transport.run(f"rm -rf {q(stage)} {q(stage)}.b64", timeout=timeout)
    return lib


def _check_prebuilt_fits(transport: Transport, timeout: float) -> None:
    """Refuse, naming the host and what it has, unless this machine's build runs there: the
    same architecture, a glibc no older than the one it was linked against."""
    seen = transport.run("uname -m; getconf GNU_LIBC_VERSION", timeout=timeout).stdout.split()
    arch, libc = (seen[0], seen[-1]) if len(seen) >= 3 else (seen[0] if seen else "unknown", "unknown")
    mine_arch, mine_libc = platform.machine(), platform.libc_ver()[1]
    why = None
    if arch != mine_arch:
        why = f"it is {arch} and this machine's build is {mine_arch}"
    elif not re.fullmatch(r"\d+(\.\d+)*", libc) or _version(libc) < _version(mine_libc):
        why = f"its glibc is {libc} and this machine's build needs {mine_libc} or newer"
    if why:
        raise InjectionError(f"{transport.host}: no C compiler (`cc`) to build the CUDA shim, and this machine's "
                             f"build does not fit it ({why}); install a compiler in the node image, or build "
                             f"{LIBRARY_NAME} there yourself and pass its path as shim_path")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))
