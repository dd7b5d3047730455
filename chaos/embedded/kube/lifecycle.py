"""The seam between the API server and whatever runs pod containers (the "kubelet").

The server decides *when* a pod must start or stop (create, graceful or forced delete,
eviction); a ``PodLifecycle`` decides *how*: a later kubelet runs real process trees on
test hosts, the fidelity tests run one local process per pod.  The lifecycle reports back
through ``Pods`` (``set_status`` for Running/Failed, ``containers_stopped`` once the
processes of a terminating pod are gone: only then does the API object disappear, as
with a real kubelet).  Hooks are called on the thread that made the change — the server's
event loop for HTTP requests — so they must not block; ``exec`` runs on the loop.
"""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, Protocol, Sequence

from chaos.embedded.kube.status import bad_request

if TYPE_CHECKING:
    from chaos.embedded.kube.store import Store


class ExecProcess(Protocol):
    """A command started in a container; ``asyncio.subprocess.Process`` has exactly this shape."""

    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None
    returncode: int | None

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class PodReports(Protocol):
    """Where a lifecycle reports: ``Pods`` (pods.py, which drives this module's hooks)."""

    store: Store

    def set_status(self, namespace: str, name: str, status: dict, uid: str | None = None) -> dict | None: ...

    def containers_stopped(self, namespace: str, name: str, uid: str) -> None: ...


class PodLifecycle(abc.ABC):
    """What a kubelet does for the pods bound to its nodes (``spec.nodeName`` set)."""

    pods: PodReports

    def attach(self, pods: PodReports) -> None:
        """Called once by the server: ``pods`` is where status and stops are reported."""
        self.pods = pods

    @abc.abstractmethod
    def pod_added(self, pod: dict) -> None:
        """A pod was created: start its containers if it is bound to a node this runtime owns."""

    @abc.abstractmethod
    def pod_terminating(self, pod: dict, grace_seconds: int) -> None:
        """Graceful deletion began (or its grace was shortened): SIGTERM now, SIGKILL after the
        grace, then ``pods.containers_stopped``."""

    @abc.abstractmethod
    def pod_removed(self, pod: dict) -> None:
        """The object is gone without waiting (forced delete): stop the containers anyway."""

    @abc.abstractmethod
    async def exec(self, pod: dict, container: str, argv: Sequence[str], stdin: bool, tty: bool) -> ExecProcess:
        """Start ``argv`` in ``container``; raise ``ApiError`` to refuse (the client sees the Status)."""

    def logs(self, pod: dict, container: str | None) -> bytes | None:
        """What ``container`` (default: the first) of ``pod`` wrote; None: this runtime keeps no logs."""
        return None


class NullRuntime(PodLifecycle):
    """No processes at all: a bound pod is Running and Ready at once and stops at once; exec is refused.

    For an API server used without a kubelet (discovery, selectors, watches, patches).
    """

    def pod_added(self, pod: dict) -> None:
        if pod["spec"].get("nodeName"):
            self.pods.set_status(pod["metadata"]["namespace"], pod["metadata"]["name"], {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})

    def pod_terminating(self, pod: dict, grace_seconds: int) -> None:
        meta = pod["metadata"]
        self.pods.containers_stopped(meta["namespace"], meta["name"], meta["uid"])

    def pod_removed(self, pod: dict) -> None:
        return None  # nothing runs, so nothing to stop

    async def exec(self, pod: dict, container: str, argv: Sequence[str], stdin: bool, tty: bool) -> ExecProcess:
        raise bad_request(f'pod {pod["metadata"]["name"]} has no container runtime (NullRuntime): cannot exec')
