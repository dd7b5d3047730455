"""The emulated kube-apiserver: an aiohttp application on 127.0.0.1, in a thread or a process.

No kube-apiserver can run on the machines this harness is tested on, so this server speaks
the real wire protocol — the REST paths, JSON bodies, watch streams, WebSocket exec and
Status errors that kubectl and the official Python client use — over a small in-memory
store.  Everything a fault needs is here (pod delete with and without grace, eviction with
disruption budgets, node labels and cordon, exec), with server-side dry run on create and
Pod Security admission's main checks; scheduling, protobuf (but for access reviews), SPDY
and aggregated discovery are not.  Any bearer token (or none) is accepted; an optional
``Rbac`` refuses what it does not allow and answers SelfSubjectAccessReviews.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Iterator, Sequence

from aiohttp import web

from chaos.embedded.kube import discovery
from chaos.embedded.kube.eviction import DisruptionBudget, Evictions
from chaos.embedded.kube.lifecycle import NullRuntime, PodLifecycle
from chaos.embedded.kube.pods import Pods
from chaos.embedded.kube.rbac import Rbac
from chaos.embedded.kube.resources import NAMESPACES, prepare_new
from chaos.embedded.kube.rest import Rest, json_response, unknown_path
from chaos.embedded.kube.status import ApiError
from chaos.embedded.kube.store import Store
from chaos.embedded.threaded import ThreadedServer


class ApiServer(ThreadedServer):
    """One emulated control plane.  ``start()`` runs it on its own thread and event loop.

    ``requests`` keeps the last requests seen (method, path with query, Content-Type,
    Upgrade), so a test can check what a client really sent.
    """

    thread_name = "kube-apiserver"

    def __init__(self, lifecycle: PodLifecycle | None = None, budgets: Sequence[DisruptionBudget] = (),
                 rbac: Rbac | None = None, history: int = 1000, bookmark_interval_s: float = 30.0,
                 host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self.store = Store(history)
        self.lifecycle = lifecycle or NullRuntime()
        self.pods = Pods(self.store, self.lifecycle)
        self.evictions = Evictions(self.pods, list(budgets))
        self.rest = Rest(self.store, self.pods, self.evictions, self.lifecycle, rbac, bookmark_interval_s)
        self.requests: collections.deque[tuple[str, str, str, str]] = collections.deque(maxlen=2000)
        self.store.create(NAMESPACES.plural, prepare_new(NAMESPACES, {"metadata": {"name": "default"}}, None))
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)  # the python client's VersionApi asks with the slash
        app.router.add_get("/api", self._api)
        app.router.add_get("/apis", self._apis)
        app.router.add_get("/api/v1", self._core)
        app.router.add_get("/apis/{group}", self._group)
        app.router.add_get("/apis/{group}/{version}", self._group_version)
        app.router.add_route("*", "/api/v1/{tail:.+}", self._core_resources)
        app.router.add_route("*", "/apis/{group}/{version}/{tail:.+}", self._group_resources)
        return app

    async def _version(self, request: web.Request) -> web.Response:
        return json_response(discovery.version())

    async def _api(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_versions(f"{self.host}:{self.port}"))

    async def _apis(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_group_list())

    async def _core(self, request: web.Request) -> web.Response:
        return json_response(discovery.resource_list("", "v1"))

    async def _core_resources(self, request: web.Request) -> web.StreamResponse:
        return await self.rest.handle(request, "", "v1", request.match_info["tail"])

    async def _group_resources(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        return await self.rest.handle(request, info["group"], info["version"], info["tail"])

    async def _group(self, request: web.Request) -> web.Response:
        body = discovery.api_group(request.match_info["group"])
        if body is None:
            raise unknown_path()
        return json_response(body)

    async def _group_version(self, request: web.Request) -> web.Response:
        body = discovery.resource_list(request.match_info["group"], request.match_info["version"])
        if body is None:
            raise unknown_path()
        return json_response(body)

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs, request.headers.get("Content-Type", ""),
                              request.headers.get("Upgrade", "")))
        try:
            return await handler(request)
        except ApiError as err:
            return json_response(err.body(), err.code)
        except web.HTTPNotFound:  # no route: the apiserver's answer for an unknown path
            return json_response(unknown_path().body(), 404)
        except web.HTTPMethodNotAllowed:
            return json_response(ApiError(405, "MethodNotAllowed", "the server does not allow this method on the "
                                          "requested resource").body(), 405)

    async def start_async(self) -> None:
        """Listen on the running loop (for callers that own one); ``port`` 0 picks a free port."""
        self._runner = web.AppRunner(self.application(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]

    async def stop_async(self) -> None:
        self.store.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@contextlib.contextmanager
def serve(**options) -> Iterator[ApiServer]:
    """``with serve(lifecycle=..., budgets=...) as server:`` — a started server, stopped on exit."""
    with ApiServer(**options) as server:
        yield server
