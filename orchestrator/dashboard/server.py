"""The dashboard's HTTP server: one page, its script and style (shipped in the package: no CDN, it works
on an offline LAN), a snapshot and a stream of deltas (server-sent events), past runs from ``runs/``.

Runs aiohttp on a thread of its own (the CLI's commands are threads, not asyncio). One ticker on that
thread takes the run's delta every ``TICK`` seconds and sends the same serialized text to every
viewer: a viewer costs a socket write, never a read of the nodes.

Safe by default: it listens on 127.0.0.1 unless told otherwise; every request for data needs the
random token printed once (``?token=...``, compared in constant time), on loopback too (another user
of this machine reaches loopback as well: the runs' logs are the controller user's own, ``runs/`` is
0700); on loopback the Host header must also name a loopback address (a web page elsewhere cannot
reach it by DNS rebinding). Every
answer forbids framing and inline script (Content-Security-Policy), and the page renders node text as
text only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import secrets
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from orchestrator.dashboard.model import LiveRun
from orchestrator.dashboard.past import bench_page, past_runs, run_log_tail
from orchestrator.errors import UsageError

#: seconds between deltas: a line reaches the page within this plus the network
TICK = 0.2
DEFAULT_PORT = 8787
#: deltas a slow viewer may lag behind before it is dropped (its page reconnects and starts afresh)
QUEUE = 256
_STATIC = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


@dataclass(frozen=True)
class Listen:
    """Where the dashboard listens: ``host`` and ``port`` (0: any free port)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_listen(text: str) -> Listen:
    """``ADDR``, ``ADDR:PORT``, ``[V6]:PORT`` or ``:PORT``; refused (UsageError) with what to write."""
    host, port = text, str(DEFAULT_PORT)
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise UsageError(f"--listen {text}: write [ADDRESS]:PORT for an IPv6 address")
        port = rest[1:] or port
    elif text.count(":") == 1:
        host, port = text.split(":")
    host = host or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {text}: the port must be a number from 0 to 65535 (0: any free port)")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(
                f"--listen {text}: {host!r} is not an IP address (name the address of one of this "
                "machine's interfaces, or 0.0.0.0 for all)"
            ) from None
    return Listen(host, int(port))


class DashboardServer:
    """Serves ``run`` (None: past runs only) on ``listen`` until :meth:`stop`. ``runs_root``: where
    past runs are read."""

    def __init__(
        self,
        run: LiveRun | None,
        listen: Listen,
        *,
        runs_root: Path = Path("runs"),
        masked: Sequence[str] = (),
    ) -> None:
        """``masked``: the secrets past runs' logs are masked with when no run is live (a live run
        masks with its own)."""
        self.run = run
        self.masked = list(masked)
        self.listen = listen
        self.runs_root = runs_root
        self.token = secrets.token_urlsafe(24)
        self.port = listen.port
        self._viewers: set[asyncio.Queue[str | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """The page's address with its token: what is printed once, for the user to open."""
        return self.link("")

    def link(self, path: str) -> str:
        """``path`` (no leading slash) on this dashboard, with the token."""
        host = self.listen.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/{path}?token={self.token}"

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (raises UsageError when the address cannot be used) and serve on a thread."""
        self._thread = threading.Thread(target=self._serve, name="dashboard", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise UsageError(
                f"dashboard: cannot listen on {self.listen.host}:{self.listen.port}: {self._error}",
                hint="pick another with --listen ADDR:PORT (port 0: any free port)",
            )

    def stop(self) -> None:
        """Send the last delta, close every viewer's stream, stop listening."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start(); the thread must not die silently
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._static_page)
        app.router.add_get("/static/{name}", self._static_page)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/stream", self._stream)
        app.router.add_get("/api/runs", self._runs)
        app.router.add_get("/api/runs/{run}/logs/{node}", self._run_log)
        app.router.add_get("/api/runs/{run}/scaling.html", self._bench_page)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.listen.host, self.listen.port, reuse_address=True)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            self._error = exc
            self._ready.set()
            return
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]  # port 0: the one the system chose
        self._ready.set()
        ticker = asyncio.create_task(self._tick())
        await self._stopping.wait()
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        self._broadcast()  # the run's end reaches the pages before the streams close
        for viewer in list(self._viewers):
            viewer.put_nowait(None)
        await asyncio.sleep(0.05)
        await runner.shutdown()
        await runner.cleanup()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self._broadcast()

    def _broadcast(self) -> None:
        if self.run is None:
            return
        delta = self.run.delta()
        if not delta:
            return
        message = f"event: delta\ndata: {json.dumps(delta, ensure_ascii=True)}\n\n"
        for viewer in list(self._viewers):
            try:
                viewer.put_nowait(message)
            except asyncio.QueueFull:  # too slow: dropped; its page reconnects for a fresh snapshot
                self._viewers.discard(viewer)
                with contextlib.suppress(asyncio.QueueFull):
                    viewer.get_nowait()
                    viewer.put_nowait(None)

    # -- requests -------------------------------------------------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # the page's script and style hold no data: served to anyone who reaches the port, so that the
        # page can name them without the token in their URLs
        refused = (
            None
            if request.path.startswith("/static/")
            else self.refusal(request.host, request.query.get("token"))
        )
        if refused:
            return web.Response(status=403, text=refused + "\n", headers=_headers("text/plain"))
        response = await handler(request)
        for name, value in _headers(None).items():
            response.headers.setdefault(name, value)
        return response

    def refusal(self, host: str, token: str | None) -> str | None:
        """Why a request is refused (None: served): a missing or wrong token; on a loopback listen
        also a Host header that is not a loopback address."""
        if token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            return "refused: this dashboard needs the token printed when it started (?token=...)"
        if not self.listen.loopback:
            return None
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]")
        if name == "localhost":
            return None
        try:
            if ipaddress.ip_address(name).is_loopback:
                return None
        except ValueError:
            pass
        return f"refused: Host {host!r} is not this machine's loopback address"

    async def _static_page(self, request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in _STATIC:
            raise web.HTTPNotFound()
        data = resources.files("orchestrator.dashboard").joinpath("static").joinpath(name).read_bytes()
        return web.Response(body=data, headers={"Content-Type": f"{_STATIC[name]}; charset=utf-8"})

    async def _state(self, request: web.Request) -> web.Response:
        doc = self.run.snapshot() if self.run is not None else None
        return _json({"run": doc, "listen": self.listen.host})

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", **_headers(None)}
        )
        await response.prepare(request)
        queue: asyncio.Queue[str | None] = asyncio.Queue(QUEUE)
        # the snapshot and the viewer's registration in one step of the loop: no delta in between
        snapshot = self.run.snapshot() if self.run is not None else None
        self._viewers.add(queue)
        try:
            await response.write(
                f"event: snapshot\ndata: {json.dumps(snapshot, ensure_ascii=True)}\n\n".encode()
            )
            while True:
                try:
                    message = await asyncio.wait_for(queue.get(), 15)
                except asyncio.TimeoutError:
                    message = ": keep-alive\n\n"  # proxies and browsers drop a silent stream
                if message is None:
                    break
                await response.write(message.encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._viewers.discard(queue)
        return response

    async def _runs(self, request: web.Request) -> web.Response:
        return _json({"runs": past_runs(self.runs_root)})

    async def _run_log(self, request: web.Request) -> web.Response:
        hidden = self.masked if self.run is None else []
        text = run_log_tail(self.runs_root, request.match_info["run"], request.match_info["node"], hidden)
        if text is None:
            raise web.HTTPNotFound()
        mask = self.run.mask if self.run is not None else None
        return web.Response(
            text="\n".join(mask(line) for line in text.split("\n")) if mask else text,
            headers={"Content-Type": "text/plain; charset=utf-8"},
        )

    async def _bench_page(self, request: web.Request) -> web.Response:
        page = bench_page(self.runs_root, request.match_info["run"])
        if page is None:
            raise web.HTTPNotFound()
        response = web.Response(body=page, headers={"Content-Type": "text/html; charset=utf-8"})
        response.headers.update(_headers(None))
        # a page of our own without scripts; sandboxed all the same (no script, an origin of its own)
        response.headers["Content-Security-Policy"] = "sandbox; default-src 'none'; style-src 'unsafe-inline'"
        return response


def _headers(content_type: str | None) -> dict[str, str]:
    headers = {
        "Content-Security-Policy": _CSP,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",  # the token must not leave in a Referer
        "Cache-Control": "no-store",
    }
    if content_type:
        headers["Content-Type"] = content_type
    return headers


def _json(doc: Any) -> web.Response:
    return web.Response(
        text=json.dumps(doc, ensure_ascii=True), headers={"Content-Type": "application/json; charset=utf-8"}
    )
