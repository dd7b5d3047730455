"""The storage fault proxy: the S3 endpoint as the cluster reaches it, in front of the real one.

An HTTP reverse proxy (aiohttp) that passes every request on to ``upstream`` unchanged (its
Host header included: moto does not check signatures against its own name; an upstream that
does must know the proxy's address as its own) and logs each one — method, object key,
client address, status, start and end — which is the timeline's ``storage`` evidence: when
each checkpoint's upload began and ended, and which requests a fault answered.

While a storage fault is armed (its *rule*, through the admin API on a second port) the
proxy answers matching requests itself with an S3 error (503 ``SlowDown``, 500
``InternalError``) or holds them for a latency before passing them on.  A rule lifts itself
at its ``until`` time, whatever becomes of the session that armed it (the proxy's own clock).

    python -m chaos.storage.proxy --listen 198.18.0.1:9000 --admin 198.18.0.1:9001 \
        --upstream http://198.18.0.1:9100 --log proxy.jsonl

Admin API (JSON): ``GET /health``; ``GET /rules``; ``PUT /rules/<id>`` arms a rule;
``DELETE /rules/<id>``, ``DELETE /rules`` lift them; ``GET /log?after=<seq>`` the requests
logged after ``seq``.  A rule lifted (by its time or a DELETE) is gone from ``GET /rules``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fnmatch
import json
import re
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

KINDS = ("errors", "slow")
#: the S3 error each status is answered with: (code, message), as AWS words them
S3_ERRORS = {503: ("SlowDown", "Please reduce your request rate."),
             500: ("InternalError", "We encountered an internal error. Please try again.")}
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade"}
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """A storage fault as the proxy applies it: requests matching ``methods`` (empty: any),
    ``keys`` (a glob on ``bucket/key``) and ``clients`` (source addresses; empty: any) are
    answered with ``status`` (``errors``) or held ``latency_s`` first (``slow``) until the
    wall-clock time ``until`` — or, with ``window_s``, for that long from the first request it
    matches (a burst at the start of the next checkpoint upload, however late the harness
    learns of it), and never after ``until``."""

    id: str
    kind: str
    until: float
    status: int = 503
    latency_s: float = 0.0
    methods: tuple[str, ...] = ()
    keys: str = "*"
    clients: tuple[str, ...] = ()
    window_s: float | None = None

    def __post_init__(self):
        if not _ID.fullmatch(self.id):
            raise ValueError(f"rule id {self.id!r}: 1-64 letters, digits, '_', '.', '-'")
        if self.kind not in KINDS:
            raise ValueError(f"rule kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.kind == "errors" and self.status not in S3_ERRORS:
            raise ValueError(f"status {self.status}: one of {', '.join(map(str, S3_ERRORS))}")
        if self.kind == "slow" and not 0 < self.latency_s <= 600:
            raise ValueError(f"latency_s {self.latency_s}: > 0 and <= 600")
        if self.window_s is not None and not 0 < self.window_s <= 3600:
            raise ValueError(f"window_s {self.window_s}: > 0 and <= 3600")

    @classmethod
    def from_json(cls, rule_id: str, d: dict) -> "Rule":
        """A rule as the admin API takes it: ``for_s`` (from now, on the proxy's clock) instead of ``until``."""
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)} - {"id", "until"} - {"for_s"}
        if unknown:
            raise ValueError(f"unknown rule fields: {', '.join(sorted(unknown))}")
        for_s = float(d["for_s"])
        if not 0 < for_s <= 3600:
            raise ValueError(f"for_s {for_s}: > 0 and <= 3600 (a rule always lifts itself)")
        return cls(id=rule_id, kind=d.get("kind", ""), until=time.time() + for_s, status=int(d.get("status", 503)),
                   latency_s=float(d.get("latency_s", 0.0)),
                   methods=tuple(m.upper() for m in d.get("methods") or ()), keys=str(d.get("keys") or "*"),
                   clients=tuple(d.get("clients") or ()),
                   window_s=float(d["window_s"]) if d.get("window_s") is not None else None)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def matches(self, method: str, key: str, client: str, now: float) -> bool:
        return (now < self.until and (not self.methods or method in self.methods)
                and fnmatch.fnmatchcase(key, self.keys) and (not self.clients or client in self.clients))


def s3_error(status: int, key: str) -> bytes:
    code, message = S3_ERRORS[status]
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f'<Resource>/{key}</Resource><RequestId>{uuid.uuid4().hex[:16].upper()}</RequestId></Error>').encode()


class Proxy:
    """The proxy's state: the armed rules and the request log."""

    def __init__(self, upstream: str, log_path: Path | None = None):
        self.upstream = upstream.rstrip("/")
        self.rules: dict[str, Rule] = {}
        self.started: dict[str, float] = {}  # rule id -> its first match (rules with a window_s)
        self.records: list[dict] = []
        self.log_path = log_path
        self._session = None

    def _over(self, rule: Rule, now: float) -> bool:
        start = self.started.get(rule.id)
        return rule.until <= now or (rule.window_s is not None and start is not None and now >= start + rule.window_s)

    def rule_for(self, method: str, key: str, client: str) -> Rule | None:
        now = time.time()
        for rid in [r.id for r in self.rules.values() if self._over(r, now)]:
            del self.rules[rid]  # lifted by its own time
        matching = [r for r in self.rules.values() if r.matches(method, key, client, now)]
        # an answer of the endpoint's own (an error) before latency on the way to it
        rule = min(matching, key=lambda r: KINDS.index(r.kind), default=None)
        if rule is not None and rule.window_s is not None:
            self.started.setdefault(rule.id, now)
        return rule

    def state(self, rule: Rule) -> dict:
        return {**rule.to_json(), "started": self.started.get(rule.id)}

    def record(self, rec: dict) -> None:
        rec["seq"] = len(self.records)
        self.records.append(rec)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")

    # -- the S3 side -----------------------------------------------------------------------
    async def forward(self, request):
        from aiohttp import web

        t = time.time()
        key = urllib.parse.unquote(request.raw_path.split("?", 1)[0].lstrip("/"))
        client = request.remote or ""
        rule = self.rule_for(request.method, key, client)
        rec: dict[str, Any] = {"t": t, "method": request.method, "key": key, "query": sorted(request.query),
                               "client": client, "rule": rule.id if rule else None,
                               "fault": rule.kind if rule else None}
        try:
            if rule is not None and rule.kind == "errors":
                async for _ in request.content.iter_chunked(1 << 16):
                    pass  # the client sends its body before it reads the answer
                rec["status"] = rule.status
                return web.Response(status=rule.status, body=s3_error(rule.status, key),
                                    content_type="application/xml")
            if rule is not None:
                await asyncio.sleep(rule.latency_s)  # the fault itself: latency on the path to storage
            response = await self._pass_on(request, rec)
            return response
        finally:
            rec["t_end"] = time.time()
            self.record(rec)

    async def _pass_on(self, request, rec: dict):
        from aiohttp import ClientError, web

        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            async with self._session.request(request.method, self.upstream + request.raw_path, headers=headers,
                                             data=request.content if request.body_exists else None,
                                             allow_redirects=False) as up:
                response = web.StreamResponse(status=up.status, reason=up.reason, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP})
                await response.prepare(request)
                async for chunk in up.content.iter_chunked(1 << 16):
                    await response.write(chunk)
                await response.write_eof()
                rec["status"] = up.status
                return response
        except (ClientError, OSError) as e:
            rec["status"], rec["error"] = 502, str(e)[:300]
            return web.Response(status=502, text=f"the storage proxy could not reach {self.upstream}: {e}")

    # -- the admin side --------------------------------------------------------------------
    async def admin(self, request):
        from aiohttp import web

        parts = [p for p in request.path.split("/") if p]
        try:
            if parts == ["health"]:
                return web.json_response({"upstream": self.upstream, "rules": len(self.rules),
                                          "requests": len(self.records)})
            if parts == ["log"] and request.method == "GET":
                after = int(request.query.get("after", "-1"))
                return web.json_response({"records": self.records[after + 1:]})
            if parts[:1] == ["rules"]:
                return await self._rules(request, parts[1:])
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"error": f"no such admin call: {request.method} {request.path}"}, status=404)

    async def _rules(self, request, rest: list[str]):
        from aiohttp import web

        if not rest and request.method == "GET":
            self.rule_for("", "", "")  # drops lifted rules
            return web.json_response({"rules": [self.state(r) for r in self.rules.values()]})
        if not rest and request.method == "DELETE":
            removed, self.rules = sorted(self.rules), {}
            return web.json_response({"removed": removed})
        if len(rest) == 1 and request.method == "PUT":
            rule = Rule.from_json(rest[0], await request.json())
            self.rules[rule.id] = rule
            self.started.pop(rule.id, None)
            return web.json_response(self.state(rule))
        if len(rest) == 1 and request.method == "DELETE":
            return web.json_response({"removed": [rest[0]] if self.rules.pop(rest[0], None) else []})
        return web.json_response({"error": f"no such admin call: {request.method} {request.path}"}, status=404)


class ProxyAdmin:
    """The proxy's admin API, as the storage faults and the timeline's storage watch use it."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        from chaos.errors import InjectionError
        from chaos.storage.server import http

        try:
            status, raw = http(method, self.url + path, json.dumps(body).encode() if body is not None else None,
                               timeout=self.timeout, headers={"Content-Type": "application/json"})
        except OSError as e:
            raise InjectionError(f"the storage fault proxy's admin API at {self.url} does not answer: {e}") from e
        if status != 200:
            raise InjectionError(f"the storage fault proxy at {self.url} refused {method} {path}: HTTP {status} "
                                 f"{raw[:300].decode(errors='replace')}")
        return json.loads(raw)

    def health(self) -> dict:
        return self._call("GET", "/health")

    def reachable(self) -> bool:
        """Whether anything answers at the admin URL (a gone proxy has no rules left)."""
        from chaos.storage.server import http

        try:
            http("GET", self.url + "/health", timeout=self.timeout)
        except OSError:
            return False
        return True

    def arm(self, rule_id: str, kind: str, for_s: float, **fields) -> dict:
        """Arm rule ``rule_id`` for ``for_s`` seconds from now (the proxy's clock); ``fields``:
        the rest of a Rule (status, latency_s, methods, keys, clients)."""
        return self._call("PUT", f"/rules/{rule_id}", {"kind": kind, "for_s": for_s, **fields})

    def lift(self, rule_id: str) -> bool:
        """Lift one rule; whether it was still armed."""
        return bool(self._call("DELETE", f"/rules/{rule_id}")["removed"])

    def rules(self) -> list[dict]:
        return self._call("GET", "/rules")["rules"]

    def log(self, after: int = -1) -> list[dict]:
        return self._call("GET", f"/log?after={int(after)}")["records"]


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: host:port")
    return host, int(port)


async def serve(listen: tuple[str, int], admin: tuple[str, int], proxy: Proxy) -> None:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    proxy._session = ClientSession(auto_decompress=False, timeout=ClientTimeout(total=None, sock_connect=10),
                                   connector=TCPConnector(limit=64))
    runners = []
    for (host, port), handler in ((listen, proxy.forward), (admin, proxy.admin)):
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    print(f"storage proxy: {listen[0]}:{listen[1]} -> {proxy.upstream}; admin {admin[0]}:{admin[1]}", flush=True)
    try:
        await asyncio.Event().wait()  # until the process is stopped
    finally:
        for runner in runners:
            await runner.cleanup()
        await proxy._session.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=_host_port, required=True, help="host:port the S3 clients use")
    p.add_argument("--admin", type=_host_port, required=True, help="host:port of the admin API")
    p.add_argument("--upstream", required=True, help="the S3 endpoint's URL, e.g. http://127.0.0.1:9100")
    p.add_argument("--log", type=Path, default=None, help="also append every request to this JSON-lines file")
    args = p.parse_args(argv)
    asyncio.run(serve(args.listen, args.admin, Proxy(args.upstream, args.log)))


if __name__ == "__main__":
    main()
