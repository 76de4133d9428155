"""A fault-injecting HTTP proxy in front of the emulated Kubernetes API (or any HTTP server), by rule.

The operator under test is pointed at the proxy (`FaultProxy.write_kubeconfig`); the test itself keeps talking to
the emulator directly, so only the operator sees the faults. A `Rule` matches requests by method, path (a regular
expression searched in the path) and whether it is a watch, and does one of:

* ``status=503`` — answer that status with a Kubernetes `Status` body; the request never reaches the API;
* ``land_then=500`` — forward the request; if the API accepts it (2xx: the write landed), answer that status
  instead of the API's reply. A request the API refuses (a 409 on a stale resourceVersion) did not land: its answer
  is passed on and the rule does not count it as fired, so it fires on a later match (the write that lands);
* ``hold=2.0`` — hold the request that many seconds (or until `release()`), then forward it — or, with
  ``status``, answer that without forwarding (a request that never lands, e.g. when its client was killed);
* ``cut_after=0.5`` — for watches: stream for that long, then cut the connection (kopf must re-list/re-watch).

A rule may also match the request body (`body`, a regex: one write among many). A rule fires on its first `times` matches (None: always), with `probability` (seeded), after skipping `skip`
matches. Every request is recorded (`log`), with the rule that fired, so tests can prove the fault happened.
Runs an aiohttp server on 127.0.0.1 in a thread with its own event loop; `stop()` closes it and every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

from kit.ports import HOST, free_port

_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
                          "host", "upgrade", "proxy-connection", "te", "trailer"})


@dataclass
class Rule:
    """One fault; see the module docstring. `name` labels it in the log."""

    method: str | None = None            # "PATCH", "POST"...; None: any
    path: str | None = None              # a regex searched in the request path; None: any
    watch: bool | None = None            # True: watches only; False: no watches; None: both
    body: str | None = None              # a regex searched in the request body (e.g. one write among many)
    status: int | None = None
    land_then: int | None = None
    hold: float | None = None
    cut_after: float | None = None
    times: int | None = 1
    skip: int = 0
    probability: float = 1.0
    name: str = ""
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def matches(self, method: str, path: str, watch: bool, body: bytes = b"") -> bool:
        if self.method is not None and method.upper() != self.method.upper():
            return False
        if self.path is not None and not re.search(self.path, path):
            return False
        if self.body is not None and not re.search(self.body, body.decode(errors="replace")):
            return False
        return self.watch is None or self.watch == watch

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    query: str
    watch: bool
    rule: str | None      # the name (or index) of the rule that fired, None when passed through
    status: int | None    # what the client was answered (None for streams cut or still open)


def _status_body(code: int, message: str) -> dict[str, Any]:
    reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
              504: "Timeout"}.get(code, "InternalError")
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason,
            "code": code}


class FaultProxy:
    """See the module docstring."""

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self.rules: list[Rule] = []
        self.log: list[Logged] = []
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._port = free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._released: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._port}"

    # --- rules ----------------------------------------------------------------------------------

    def add(self, rule: Rule | None = None, **fields: Any) -> Rule:
        """Add a rule (or build one from keyword fields); rules are tried in order, the first that fires wins."""
        rule = rule or Rule(**fields)
        with self._lock:
            rule.name = rule.name or f"rule{len(self.rules)}"
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
        self.release()

    def release(self) -> None:
        """Let every held request through now."""
        if self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)

    def fired(self, name: str | None = None) -> list[Logged]:
        with self._lock:
            return [entry for entry in self.log if entry.rule is not None and (name is None or entry.rule == name)]

    def _pick(self, method: str, path: str, watch: bool, body: bytes) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.exhausted or not rule.matches(method, path, watch, body):
                    continue
                rule.seen += 1
                if rule.seen <= rule.skip or self._random.random() >= rule.probability:
                    continue
                rule.fired += 1
                return rule
        return None

    def _unfire(self, rule: Rule) -> None:
        """Take back a firing that did not happen (a `land_then` write the API refused)."""
        with self._lock:
            rule.fired -= 1

    def _record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self._port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)
            assert not self._thread.is_alive(), "the fault proxy did not stop"
        self._thread = self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """A kubeconfig for the proxy (plain HTTP, a dummy token), as the emulator writes its own."""
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "faults", "preferences": {},
                  "clusters": [{"name": "faults", "cluster": {"server": self.url}}],
                  "users": [{"name": "faults", "user": {"token": "emulator-token"}}],
                  "contexts": [{"name": "faults", "context": {"cluster": "faults", "user": "faults",
                                                              "namespace": namespace}}]}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        return path

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._released = asyncio.Event()
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            self._session = session
            runner = aiohttp.web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, HOST, self._port)
            await site.start()
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                await runner.cleanup()

    # --- proxying -------------------------------------------------------------------------------

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        path, query = request.path, request.query_string
        body = await request.read()
        rule = self._pick(request.method, path, watch, body)
        name = rule.name if rule is not None else None
        if rule is not None and rule.hold is not None:
            assert self._released is not None
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), timeout=rule.hold)
        if rule is not None and rule.status is not None:
            self._record(Logged(request.method, path, query, watch, name, rule.status))
            return aiohttp.web.json_response(_status_body(rule.status, f"injected by {name}"), status=rule.status)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        url = f"{self.upstream}{path}" + (f"?{query}" if query else "")
        try:
            assert self._session is not None
            upstream = await self._session.request(request.method, url, data=body or None, headers=headers)
        except aiohttp.ClientError as exc:
            if rule is not None and rule.land_then is not None:
                self._unfire(rule)  # nothing landed
                name = None
            self._record(Logged(request.method, path, query, watch, name, 502))
            return aiohttp.web.json_response(_status_body(502, f"upstream: {exc}"), status=502)
        async with upstream:
            if rule is not None and rule.land_then is not None and not 200 <= upstream.status <= 299:
                self._unfire(rule)  # refused, so not landed: the client hears the API's own answer
                rule, name = None, None
            if rule is not None and rule.land_then is not None:
                await upstream.read()  # the write landed; the client is told otherwise
                self._record(Logged(request.method, path, query, watch, name, rule.land_then))
                return aiohttp.web.json_response(_status_body(rule.land_then, f"injected by {name} after the "
                                                                              "request landed"),
                                                 status=rule.land_then)
            if not watch:
                data = await upstream.read()
                self._record(Logged(request.method, path, query, watch, name, upstream.status))
                return aiohttp.web.Response(body=data, status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS})
            return await self._stream(request, upstream, rule, path, query)

    async def _stream(self, request: aiohttp.web.Request, upstream: aiohttp.ClientResponse, rule: Rule | None,
                      path: str, query: str) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS})
        await response.prepare(request)
        cut = rule.cut_after if rule is not None else None
        self._record(Logged(request.method, path, query, True, rule.name if rule else None, None))
        assert self._stopping is not None
        try:
            async with asyncio.timeout(cut):
                async for chunk in _chunks(upstream, self._stopping):
                    await response.write(chunk)
        except TimeoutError:
            # a dropped watch: the connection ends mid-stream, without a final chunk
            if request.transport is not None:
                request.transport.close()
            return response
        except (ConnectionResetError, aiohttp.ClientError):
            return response
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            await response.write_eof()
        return response


async def _chunks(upstream: aiohttp.ClientResponse, stopping: asyncio.Event) -> AsyncIterator[bytes]:
    while not stopping.is_set():
        chunk = await upstream.content.readany()
        if not chunk:
            return
        yield chunk
