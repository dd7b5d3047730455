"""moto's S3 server (``moto_server``, the ``moto[server]`` extra) as a real HTTP endpoint.

Started and stopped by PID like every process the harness starts, bound to one address:
127.0.0.1 (or another loopback address), or the test-host bridge's address so that test
hosts, which have no other route, reach it.  The training job talks HTTP to it through
pyarrow's S3 client; nothing in the job is mocked.
"""

from __future__ import annotations

import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from chaos.errors import ClusterError
from chaos.procs import TrackedProcess
from chaos.waits import poll_until

#: no proxy from the environment on the way to a server on loopback or the bridge
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def moto_server_binary() -> str:
    """``moto_server`` beside this interpreter, or a clear error naming how to get it."""
    path = Path(sys.executable).with_name("moto_server")
    if not path.exists():
        raise ClusterError(f"no moto_server beside {sys.executable}: the S3 server is moto's server mode, "
                           "installed by `make setup` (pip install 'moto[server]')")
    return str(path)


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) of one request, never through an environment proxy; an HTTP error
    status is an answer, not an exception."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _DIRECT.open(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class S3Server:
    """One moto_server on ``host:port``; its buckets live in its memory (a restarted server is
    empty: a suite's run keeps one server for its whole session)."""

    def __init__(self, host: str, port: int, log_path: Path, start_timeout: float = 30.0):
        self.host, self.port, self.log_path, self.start_timeout = host, port, Path(log_path), start_timeout
        self.proc: TrackedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "S3Server":
        """Start it and return once it answers S3's ListBuckets."""
        self.proc = TrackedProcess([moto_server_binary(), "-H", self.host, "-p", str(self.port)], self.log_path,
                                   name=f"moto-s3-{self.port}")

        def answered():
            if not self.proc.alive():
                tail = self.log_path.read_text(errors="replace").splitlines()[-8:]
                raise ClusterError(f"moto_server on {self.url} exited with code {self.proc.popen.returncode} while "
                                   f"starting; see {self.log_path}:\n" + "\n".join(tail))
            try:
                status, _ = http("GET", self.url + "/", timeout=2)
            except OSError as e:
                return None, f"no answer: {e}"
            return status == 200 or None, f"HTTP {status}"

        try:
            poll_until(answered, self.start_timeout, f"moto_server on {self.url} to answer ListBuckets", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (moto accepts an unsigned CreateBucket; creating it again is a no-op)."""
        status, body = http("PUT", f"{self.url}/{name}")
        if status != 200:
            raise ClusterError(f"moto_server on {self.url} refused to create bucket {name!r}: HTTP {status} "
                               f"{body[:300]!r}")

    def stop(self) -> None:
        """Stop it by PID; idempotent."""
        if self.proc is not None:
            self.proc.stop(sig=signal.SIGKILL)
