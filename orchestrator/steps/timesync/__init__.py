"""`bootstrap ntp`: keep the nodes' clocks together, and undo it.

By default the master serves time to the workers (chrony ``local stratum`` + ``allow`` for the workers'
addresses), so labs without internet work; ``cluster.time.servers`` makes the nodes follow those
instead. After configuring, the step awaits each node's synchronisation (a selected source within the
threshold), then measures every node's offset from the master over the connection, the preflight's
way (``sample_clock``), and fails above ``max_offset_ms`` with the numbers.

Why it matters (FIELD_NOTES "Clocks"): static rendezvous ignores wall clocks, but c10d elastic
rendezvous compares wall-clock heartbeats and expels nodes skewed by ~15 s; aligned logs need far less.

Linux: chrony (installed with ``time.install: true`` when missing). systemd-timesyncd is recognised and
reported, not configured: it can neither serve the cluster nor report a selected source and offset, and
Debian's chrony package replaces it (docs/time.md). Windows: w32time (windows.py) in the host's
PowerShell over WinRM, for native and WSL-mode nodes (a WSL2 distribution follows the host's clock).

Here: the order of the work over the nodes (:func:`sync_time`, :func:`restore_time`). Who follows whom
is decided in ``master.py``, one node's work over its transport is ``apply.py``, the chrony files and
scripts are ``chrony/``, the w32time scripts ``windows.py``, and the report ``report.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.executor import Outcome
from orchestrator.runner import run_step
from orchestrator.steps.preflight import CLOCK
from orchestrator.steps.timesync import chrony
from orchestrator.steps.timesync.apply import (
    PROBE,
    RestoreTime,
    _apply,
    _apply_windows,
    _await,
    _measure,
    _probe,
    settled,
)
from orchestrator.steps.timesync.chrony.config import ChronyRole, time_source
from orchestrator.steps.timesync.chrony.probe import Probe
from orchestrator.steps.timesync.master import _Addresses, _addresses, roles, windows_clients
from orchestrator.steps.timesync.report import NodeTime, TimeReport

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = ["NodeTime", "RestoreTime", "TimeReport", "restore_time", "sync_time"]


def sync_time(
    session: Session,
    inventory: Inventory,
    nodes: list[Node] | None = None,
    *,
    dry_run: bool = False,
    no_clock_control: bool = False,
    sync_timeout: float = chrony.SYNC_TIMEOUT,
) -> TimeReport:
    """Configure time sync on ``nodes`` (default: the session's), await it, measure, report.

    The master is configured first when it serves (workers' first polls must find it answering) and is
    always measured (offsets are from its clock). ``dry_run`` reads the nodes (read-only) and returns
    each node's configuration diff and script, changing nothing. ``no_clock_control``: chronyd -x
    everywhere (it never adjusts the clock; tests: every namespace shares this machine's clock).
    ``sync_timeout``: seconds each node gets to follow its source within the threshold.
    """
    settings = inventory.cluster.time
    for server in settings.servers:  # they reach configuration files and command lines
        try:
            time_source(server)
        except ValueError:
            raise UsageError(
                f"time.servers: {server!r} is not an IP address or host name",
                hint="list NTP servers as addresses (192.168.1.5) or DNS names (pool.ntp.org)",
            ) from None
    chosen = list(session.nodes if nodes is None else nodes)
    master = inventory.master_node
    linux = [n for n in chosen if n.os == "linux"]
    windows = [n for n in chosen if n.os != "linux"]
    values: dict[str, NodeTime] = {}
    errors: dict[str, Outcome[NodeTime]] = {}
    addresses: _Addresses | None = None

    if not settings.manage:
        for node in linux:
            values[node.name] = NodeTime(node.name, state="measured")
        if not dry_run:
            _measure(session, linux, master, values, settings.max_offset_ms)
    else:
        route_nodes = list(linux)
        if settings.serving and master not in route_nodes and master.os == "linux":
            route_nodes = [master, *route_nodes]
        # every worker of the inventory: the master's allow list must not depend on --nodes
        route_nodes += [n for n in inventory.nodes if n.os == "linux" and n not in route_nodes]
        addresses = _addresses(session, inventory, route_nodes)
        if settings.serving and master.os == "linux":
            # Windows workers ask the master too (w32time): their addresses join its allow list
            allowed, windows_problems = windows_clients(inventory)
            addresses.workers.update(allowed)
            addresses.problems.update(windows_problems)
        node_roles = roles(inventory, addresses)
        for node in list(linux):
            problem = addresses.problems.get(node.name)
            if problem is None and node.name not in node_roles:
                problem = f"the master's address is not known: {addresses.why}"
            if problem is not None:  # never configured: its chrony would follow something else
                error = CommandFailedError(problem, node=node.name)
                errors[node.name] = Outcome(node.name, None, error, 0.0)
                linux.remove(node)

        probes: dict[str, Probe] = {}

        def apply(node: Node, transport: Transport) -> NodeTime:
            probe = probes[node.name] = session.remember(node.name, PROBE, lambda: _probe(node, transport))
            try:
                value = _apply(
                    node,
                    transport,
                    node_roles[node.name],
                    is_master=node.name == master.name,
                    serving=settings.serving,
                    install=settings.install,
                    dry_run=dry_run,
                    no_clock_control=no_clock_control,
                    probe=probe,
                )
            except BaseException:
                session.forget(node.name, PROBE, CLOCK)  # it may have changed part of it
                raise
            if value.state != "unchanged" and not dry_run:
                session.forget(node.name, PROBE, CLOCK)  # read again when asked: it changed
            return value

        first = [master] if settings.serving and master in linux else []
        rest = [n for n in linux if n not in first]
        for group, step in ((first, "ntp-master"), (rest, "ntp")):
            for o in session.map(apply, step=step, nodes=group):
                if o.value is not None:
                    values[o.node] = o.value
                else:
                    errors[o.node] = o
        if not dry_run:
            configured = [n for n in linux if n.name in values]
            waiting = [
                n
                for n in configured
                if n.name
                in to_await(values, probes, node_roles, master.name, settings.serving, settings.max_offset_ms)
            ]
            session.map(
                lambda n, t: _await(
                    n,
                    t,
                    values[n.name],
                    node_roles[n.name],
                    settings.max_offset_ms,
                    sync_timeout,
                    own_address=addresses.workers.get(n.name) if addresses else None,
                ),
                step="sync",
                nodes=waiting,
            )
            _measure(session, configured, master, values, settings.max_offset_ms)

    for node in windows:
        from orchestrator.steps.timesync import windows as win

        value = NodeTime(node.name, role="client", daemon="w32time", state="planned")
        if node.name == master.name and settings.serving:
            # w32time can serve (NtpServer provider) but that is not written yet: use a Linux master
            value.role = "server"
            value.problem = "a Windows master cannot serve time yet: set cluster.time.servers"
        elif settings.manage and settings.serving:
            # the master's own address (from the inventory or the master itself), never its name:
            # what this node would resolve the name to is not checked
            if addresses is not None and node.name in addresses.problems:
                value.problem = addresses.problems[node.name]
            elif addresses is not None and addresses.master is not None:
                value.sources = [addresses.master]
                value.script = win.configure_script(value.sources)
            else:
                why = addresses.why if addresses is not None else "the master was not asked"
                value.problem = f"the master's address is not known: {why}"
        elif settings.manage:
            value.sources = list(settings.servers)
            value.script = win.configure_script(value.sources)
        values[node.name] = value
    runnable = [n for n in windows if values[n.name].problem is None and values[n.name].sources]
    if runnable and not dry_run:
        for o in session.map(
            lambda n, t: _apply_windows(n, t, values[n.name]), step="w32time", nodes=runnable
        ):
            if o.error is not None:
                errors[o.node] = o

    outcomes: list[Outcome[NodeTime]] = []
    for node in chosen:
        if node.name in errors:
            outcomes.append(errors[node.name])
        else:
            outcomes.append(Outcome(node.name, values.get(node.name), None, 0.0))
    warnings = addresses.warnings if addresses is not None else []
    return TimeReport(outcomes, settings.max_offset_ms, master.name, dry_run, warnings)


def to_await(
    values: dict[str, NodeTime],
    probes: dict[str, Probe],
    roles: dict[str, ChronyRole],
    master: str,
    serving: bool,
    max_offset_ms: float,
) -> set[str]:
    """The configured nodes whose synchronisation must be awaited (pure: unit-tested): not those where
    nothing changed and chronyd already followed its source within the limit when probed
    (:func:`~orchestrator.steps.timesync.apply.settled`); but every worker of a serving master that was
    just reconfigured (restarted, or following other servers)."""
    served = values.get(master) if serving else None
    source_changed = served is not None and served.state != "unchanged"
    return {
        name
        for name, value in values.items()
        if name in probes
        and (
            (source_changed and name != master)
            or not settled(value, probes[name], roles[name], max_offset_ms)
        )
    }


def restore_time(
    session: Session, inventory: Inventory, nodes: list[Node] | None = None, *, dry_run: bool = False
) -> TimeReport:
    """Undo `sync_time` on ``nodes`` (:class:`~orchestrator.steps.timesync.apply.RestoreTime`): for
    `bootstrap teardown` and `bootstrap ntp --restore`."""
    report = run_step(session, RestoreTime(), nodes, dry_run=dry_run)
    return TimeReport(
        report.outcomes, inventory.cluster.time.max_offset_ms, inventory.cluster.master, dry_run
    )
