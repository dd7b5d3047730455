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
    """Build (or reuse) the shim on the transport's host, from sources sent through the
    transport; returns the library's path there (the same on every host: ``root`` is absolute).

    The sources go in chunks small enough for a Kubernetes exec, which carries its command in
    the URL; the host needs ``python`` and ``cc`` (the build matches the host's glibc).
    """
    d = f"{root or REMOTE_ROOT}/{shim_hash('cc')}"
    lib = f"{d}/{LIBRARY_NAME}"
    where = transport.host
    if transport.run(f"test -f {shlex.quote(lib)}", timeout=timeout).ok:
        return lib
    if not transport.run("command -v cc", timeout=timeout).ok:
        raise InjectionError(f"{where}: no C compiler (`cc`) to build the CUDA shim: it is built on each node from "
                             "source to match the node's glibc; install one in the node image, or build "
                             f"{LIBRARY_NAME} there yourself and pass its path as shim_path")
    payload = base64.b64encode(gzip.compress(json.dumps(_source_texts()).encode())).decode()
    stage = f"{d}/.upload-{uuid.uuid4().hex[:8]}"
    steps = [f"mkdir -p {shlex.quote(d)} && : > {shlex.quote(stage)}.b64"]
    steps += [f"printf %s {shlex.quote(payload[i:i + UPLOAD_CHUNK])} >> {shlex.quote(stage)}.b64"
              for i in range(0, len(payload), UPLOAD_CHUNK)]
    unpack = ("import base64, gzip, json, os, sys; s = sys.argv[1]; os.makedirs(s); "
              "[open(os.path.join(s, n), 'w').write(t) for n, t in "
              "json.loads(gzip.decompress(base64.b64decode(open(s + '.b64').read()))).items()]")
    srcs = " ".join(shlex.quote(f"{stage}/{n}") for n in SHIM_SOURCES)
    steps += [f"{shlex.quote(python)} -c {shlex.quote(unpack)} {shlex.quote(stage)}",
              f"cc {' '.join(CFLAGS)} -o {shlex.quote(stage)}.so {srcs} {' '.join(LIBS)} && "
              f"mv -f {shlex.quote(stage)}.so {shlex.quote(lib)}"]
    try:
        for step in steps:
            result = transport.run(step, timeout=timeout)
            if not result.ok:
                raise InjectionError(f"{where}: putting the CUDA shim at {lib} failed (exit {result.exit_code}): "
                                     f"{(result.stderr or result.stdout).strip()[-2000:]}")
    finally:
        transport.run(f"rm -rf {shlex.quote(stage)} {shlex.quote(stage)}.b64 {shlex.quote(stage)}.so",
                      timeout=timeout)
    return lib
