"""S3 storage the harness runs itself: moto's server and the fault proxy in front of it, on
one address the cluster's nodes reach (loopback for the plain embedded cluster, the
test-host bridge's address for test hosts and the foreign-cluster stand-in), every process
tracked and stopped by PID.

Its storage settings are what a profile would say about a team's own S3: the proxy as the
endpoint, the credentials by the names of environment variables (moto takes any value; the
harness's own are made up, ``CREDENTIALS``), the proxy's admin API for the storage faults.
"""

from __future__ import annotations

import sys
from pathlib import Path

from chaos.errors import ClusterError
from chaos.procs import TrackedProcess
from chaos.storage.access import ObjectStorage
from chaos.storage.proxy import ProxyAdmin
from chaos.storage.server import S3Server
from chaos.waits import poll_until

BUCKET = "ray-chaos"
REGION = "us-east-1"
#: moto accepts any credentials; these made-up ones are what the harness's own runs are given
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "chaos-local-key", "AWS_SECRET_ACCESS_KEY": "chaos-local-key"}


class LocalStorage:
    """moto_server behind the fault proxy on ``host``; ports from ``free_port()``."""

    def __init__(self, host: str, base_dir: Path, free_port, prefix: str = "checkpoints"):
        self.host, self.base_dir, self.prefix = host, Path(base_dir), prefix
        self._free_port = free_port
        self.server: S3Server | None = None
        self.proxy: TrackedProcess | None = None
        self.proxy_port = self.admin_port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.proxy_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def settings(self) -> dict:
        """The profile's ``storage`` section for it."""
        return {"path": f"s3://{BUCKET}/{self.prefix}", "s3": {
            "endpoint_url": self.endpoint_url, "region": REGION,
            "credentials": {"from": "env", "env": sorted(CREDENTIALS)},
            "fault_proxy": {"admin_url": self.admin_url, "upstream": self.server.url}}}

    def object_storage(self) -> ObjectStorage:
        from chaos.profile.models import StorageSettings

        return ObjectStorage(StorageSettings.model_validate(self.settings()), environ=CREDENTIALS)

    def start(self) -> "LocalStorage":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.server = S3Server(self.host, self._free_port(), self.base_dir / "moto.log").start()
            self.server.create_bucket(BUCKET)
            self.proxy_port, self.admin_port = self._free_port(), self._free_port()
            self.proxy = TrackedProcess(
                [sys.executable, "-m", "chaos.storage.proxy", "--listen", f"{self.host}:{self.proxy_port}",
                 "--admin", f"{self.host}:{self.admin_port}", "--upstream", self.server.url,
                 "--log", str(self.base_dir / "requests.jsonl")],
                self.base_dir / "proxy.log", name=f"storage-proxy-{self.proxy_port}")
            poll_until(self._proxy_answers, 30, f"the storage fault proxy on {self.admin_url} to answer", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def _proxy_answers(self):
        if not self.proxy.alive():
            raise ClusterError(f"the storage fault proxy exited with code {self.proxy.popen.returncode} while "
                               f"starting; see {self.base_dir / 'proxy.log'}")
        try:
            return ProxyAdmin(self.admin_url, timeout=2).health(), "answered"
        except Exception as e:
            return None, str(e)

    def pids(self) -> list[int]:
        """The session leaders to stop by PID should whoever started them die first."""
        return [p.pid for p in (self.server.proc if self.server else None, self.proxy) if p is not None]

    def stop(self) -> None:
        """Stop the proxy and the server by PID; idempotent."""
        try:
            if self.proxy is not None:
                self.proxy.stop()
                self.proxy = None
        finally:
            if self.server is not None:
                self.server.stop()
                self.server = None
