"""`bootstrap dashboard` and the ``--dashboard`` option of `bootstrap`, `launch` and `logs --follow`:
a page served from this machine, fed by the streams the command reads anyway (docs/dashboard.md)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.cli.common import Settings
from orchestrator.errors import BootstrapError, ExitCode

if TYPE_CHECKING:
    from orchestrator.dashboard.model import LiveRun
    from orchestrator.dashboard.server import Listen
    from orchestrator.inventory import Inventory

F = TypeVar("F", bound=Callable[..., Any])

_WANTED = "dashboard.listen"  # ctx.meta: the Listen asked for (None: no dashboard)
_LIVE = "dashboard.live"  # ctx.meta: the LiveRun being served (the pipeline's, reused by its launch)
_LISTEN_HELP = (
    "Where the dashboard listens: ADDR[:PORT] (default 127.0.0.1:8787; port 0: any free one). Every "
    "address, loopback too, needs the token printed at start in the URL."
)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta.setdefault("dashboard.options", {})[param.name] = value
    return value


def dashboard_options(fn: F) -> F:
    """``--dashboard`` and ``--listen ADDR``, kept in ``ctx.meta`` (read by :func:`live_dashboard`)."""
    fn = click.option(
        "--listen", "listen", metavar="ADDR[:PORT]", expose_value=False, callback=_remember, help=_LISTEN_HELP
    )(fn)
    return click.option(
        "--dashboard",
        "dashboard",
        is_flag=True,
        default=False,
        expose_value=False,
        callback=_remember,
        help="Serve a live page of the run from here (see --listen; docs/dashboard.md).",
    )(fn)


def _wanted(ctx: click.Context) -> Listen | None:
    from orchestrator.dashboard.server import Listen, parse_listen

    options = ctx.meta.get("dashboard.options", {})
    listen = options.get("listen")
    if not options.get("dashboard"):
        if listen:
            from orchestrator.errors import UsageError

            raise UsageError("--listen is for the dashboard: add --dashboard")
        return None
    return parse_listen(listen) if listen else Listen()


@contextlib.contextmanager
def live_dashboard(
    ctx: click.Context, settings: Settings, inventory: Inventory, nodes: Sequence[str], command: str
) -> Iterator[LiveRun | None]:
    """The dashboard the command line asked for, serving while the body runs (None when not asked).
    Nested (the main pipeline's launch phase): the one already serving."""
    existing = ctx.meta.get(_LIVE)
    if existing is not None:
        yield existing
        return
    listen = _wanted(ctx)
    if listen is None:
        yield None
        return
    from orchestrator.dashboard.model import LiveRun
    from orchestrator.dashboard.server import DashboardServer
    from orchestrator.render import secret_values

    live = LiveRun(list(nodes), secrets=secret_values(inventory), command=command)
    server = DashboardServer(live, listen)
    server.start()
    settings.ui.info(f"dashboard: {server.url}")  # the token is printed this once
    ctx.meta[_LIVE] = live
    try:
        yield live
    finally:
        ctx.meta.pop(_LIVE, None)
        if live.state == "running":
            live.ended("stopped", "the command ended")
        server.stop()


@click.command()
@click.option("--listen", "listen", metavar="ADDR[:PORT]", help=_LISTEN_HELP)
@click.pass_context
def dashboard(ctx: click.Context, listen: str | None) -> int:
    """Serve the dashboard of past runs here (runs/: records, logs, bench pages) until Ctrl-C.

    A run is watched live with `launch --dashboard`, `logs --run RUN --follow --dashboard` or
    `bootstrap --dashboard`: those pages show it as it goes, and the past runs too.
    """
    from orchestrator.dashboard.server import DashboardServer, Listen, parse_listen
    from orchestrator.inventory import load_inventory
    from orchestrator.render import secret_values

    settings = Settings.from_context(ctx)
    hidden: list[str] = []
    if settings.inventory is not None:  # its secrets, as set here, masked in past runs' logs too
        try:
            hidden = secret_values(load_inventory(settings.inventory))
        except BootstrapError as exc:  # still served, but said: its secrets are not known here
            settings.ui.warn(f"{exc}: past runs' logs are shown without its train.env secrets masked")
    where = parse_listen(listen) if listen else Listen()
    server = DashboardServer(None, where, runs_root=Path("runs"), masked=hidden)
    server.start()
    settings.ui.info(f"dashboard: {server.url}")
    settings.ui.note("past runs under ./runs; Ctrl-C stops it")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return ExitCode.OK
