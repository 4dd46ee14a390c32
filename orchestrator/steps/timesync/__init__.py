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

Here: the order of the steps (:func:`sync_time`, :func:`restore_time`), each run by the step runner
(orchestrator/runner.py). Who follows whom is decided in ``master.py``; the install and configure
steps are ``steps.py``, the wait and the offsets ``verify.py``, the probe and the restore ``apply.py``,
the chrony files and scripts ``chrony/``, the w32time scripts ``windows.py``, and the report
``report.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import UsageError
from orchestrator.executor import GroupResult, Outcome
from orchestrator.plans import NodePlan
from orchestrator.runner import Reach, run_step
from orchestrator.steps.contract import Report
from orchestrator.steps.timesync import chrony
from orchestrator.steps.timesync.apply import RestoreTime, settled
from orchestrator.steps.timesync.chrony.config import ChronyRole, time_source
from orchestrator.steps.timesync.chrony.probe import Probe
from orchestrator.steps.timesync.report import NodeTime
from orchestrator.steps.timesync.steps import ConfigureTime, InstallChrony, TimeContext
from orchestrator.steps.timesync.verify import AwaitTime, MeasureTime

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session

__all__ = ["NodeTime", "RestoreTime", "restore_time", "sync_time", "time_report"]


def time_report(
    reach: Reach,
    inventory: Inventory,
    nodes: list[Node],
    *,
    restore: bool = False,
    dry_run: bool = False,
    no_clock_control: bool = False,
    sync_timeout: float = chrony.SYNC_TIMEOUT,
) -> Report[NodeTime]:
    """`bootstrap ntp` (``restore``: `ntp --restore`) on ``nodes``, on a session reaching them."""
    if restore:
        return reach.within(
            nodes, "ntp --restore", lambda on: restore_time(on, inventory, nodes, dry_run=dry_run)
        )
    return reach.within(
        nodes,
        "ntp",
        lambda on: sync_time(
            on,
            inventory,
            nodes,
            dry_run=dry_run,
            no_clock_control=no_clock_control,
            sync_timeout=sync_timeout,
        ),
    )


def _report(
    step: str,
    inventory: Inventory,
    outcomes: list[Outcome[NodeTime]],
    plans: dict[str, NodePlan],
    *,
    dry_run: bool,
    warnings: list[str],
) -> Report[NodeTime]:
    """The time step's one report: a node whose row has a problem fails it."""
    return Report(
        step=step,
        outcomes=GroupResult(outcomes),
        plans=plans,
        warnings=warnings,
        data={"master": inventory.cluster.master, "max_offset_ms": inventory.cluster.time.max_offset_ms},
        dry_run=dry_run,
        failing=[o.node for o in outcomes if o.value is not None and o.value.problem is not None],
    )


def sync_time(
    session: Session,
    inventory: Inventory,
    nodes: list[Node] | None = None,
    *,
    dry_run: bool = False,
    no_clock_control: bool = False,
    sync_timeout: float = chrony.SYNC_TIMEOUT,
) -> Report[NodeTime]:
    """Configure time sync on ``nodes`` (default: the session's), await it, measure, report.

    Runner steps, one after the other, none with a loop over nodes of its own: chrony installed where
    missing (``time.install``), then every node configured, a serving master first (workers' first
    polls must find it answering) (steps.py); then the changed nodes' synchronisation awaited, and
    every node's offset from the master measured (the master always: offsets are from its clock),
    both made of reads (verify.py). The report's plans: each node's install, then its configuration
    (what a dry run shows: it reads the nodes, read-only, and changes nothing; a node chrony would be
    installed on shows the install only, what follows depends on the files its package brings).
    ``no_clock_control``: chronyd -x everywhere (it never adjusts the clock; tests: every namespace
    shares this machine's clock).
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
    errors: dict[str, Outcome[NodeTime]] = {}
    installed: set[str] = set()
    would_install: dict[str, str] = {}
    plans: dict[str, NodePlan] = {}
    if settings.manage and settings.install:
        report = run_step(session, InstallChrony(), chosen, dry_run=dry_run)
        plans.update((name, plan) for name, plan in report.plans.items() if plan.actions)
        for o in report.outcomes:
            if o.error is not None:
                errors[o.node] = Outcome(o.node, None, o.error, o.duration, o.finished)
            elif o.value is not None and o.value.status == "installed":
                installed.add(o.node)
            elif o.value is not None and o.value.status == "would install":
                would_install[o.node] = report.plans[o.node].runs[0].script
    step = ConfigureTime(
        inventory,
        no_clock_control=no_clock_control,
        installed=frozenset(installed),
        would_install=would_install,
    )
    configured = run_step(session, step, [n for n in chosen if n.name not in errors], dry_run=dry_run)
    for name, plan in configured.plans.items():  # after the install that ran (or would run) first
        first = plans.get(name)
        plans[name] = NodePlan(name, [*(first.actions if first else []), *plan.actions], plan.detail)
    values: dict[str, NodeTime] = {}
    for done in configured.outcomes:
        if done.value is not None:
            values[done.node] = done.value
        else:
            errors[done.node] = done
    context: TimeContext = configured.context
    linux = [n for n in chosen if n.os == "linux" and n.name in values]
    if not dry_run and context.addresses is not None:
        probes = {
            name: plan.detail.probe
            for name, plan in configured.plans.items()
            if plan.detail.probe is not None
        }
        chrony_values = {n.name: values[n.name] for n in linux}
        waiting = to_await(
            chrony_values, probes, context.roles, master.name, settings.serving, settings.max_offset_ms
        )
        wait = AwaitTime(
            values, context.roles, settings.max_offset_ms, sync_timeout, context.addresses.workers
        )
        for waited in run_step(session, wait, [n for n in linux if n.name in waiting]).outcomes:
            if waited.error is not None:  # the wait did not run there (sudo refused, cut off)
                errors[waited.node] = waited
    if not dry_run:
        # a node whose sample could not be taken has a note on its row instead (MeasureTime)
        run_step(session, MeasureTime(master, values, settings.max_offset_ms), linux)
    outcomes: list[Outcome[NodeTime]] = []
    for node in chosen:
        if node.name in errors:
            outcomes.append(errors[node.name])
        else:
            outcomes.append(Outcome(node.name, values.get(node.name), None, 0.0))
    warnings = context.addresses.warnings if context.addresses is not None else []
    return _report("ntp", inventory, outcomes, plans, dry_run=dry_run, warnings=warnings)


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
) -> Report[NodeTime]:
    """Undo `sync_time` on ``nodes`` (:class:`~orchestrator.steps.timesync.apply.RestoreTime`): for
    `bootstrap teardown` and `bootstrap ntp --restore`."""
    report = run_step(session, RestoreTime(), nodes, dry_run=dry_run)
    outcomes = list(report.outcomes)
    return _report("ntp --restore", inventory, outcomes, report.plans, dry_run=dry_run, warnings=[])
