"""What one node's chrony says, read into its row: the probe's read (:func:`probe_read`), whether a
node needs no wait (:func:`settled`), what it follows, why it follows nothing
(:func:`no_reply_problem`), and the undoing of the time sync (:class:`RestoreTime`, a runner step).

The chrony files and scripts themselves are built by :mod:`orchestrator.steps.timesync.chrony` and the
w32time scripts by :mod:`orchestrator.steps.timesync.windows`; the wait and the offsets are read by
the steps of :mod:`orchestrator.steps.timesync.verify`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orchestrator.steps.timesync.chrony as chrony
from orchestrator.errors import BootstrapError, CommandFailedError
from orchestrator.plans import NodePlan, Run
from orchestrator.platforms import posix_for_node, windows_host_shell
from orchestrator.platforms.windows_admin import check_elevated_run
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.steps.root import sudo_error
from orchestrator.steps.timesync.chrony.config import ChronyRole
from orchestrator.steps.timesync.chrony.probe import Probe
from orchestrator.steps.timesync.report import NodeTime

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Result

__all__ = ["PROBE", "RestoreTime", "no_reply_problem", "probe_read", "settled"]

#: ``Session.remember`` key of a node's chrony :class:`Probe` (read by the main pipeline's first round
#: trip: orchestrator/pipeline.py _first_reads); forgotten once the step changed the node
PROBE = "timesync.probe"


def _daemon_name(probe: Probe) -> str:
    if probe.chronyd:
        return "chrony"
    return "timesyncd" if probe.timesyncd_active else "none"


def _missing_chrony(node: Node, probe: Probe) -> BootstrapError:
    install = chrony.install_command(probe.package_manager) or "install the chrony package"
    if probe.timesyncd_active:
        why = "only systemd-timesyncd runs here: it cannot serve the cluster nor report its source and offset"
    else:
        why = "no time daemon (chrony or systemd-timesyncd) is installed"
    return CommandFailedError(
        why,
        node=node.name,
        hint=f"run `sudo {install}` on it (chrony replaces systemd-timesyncd), "
        "or set cluster.time.install: true to let bootstrap install it",
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def no_reply_problem(
    node: str,
    role: ChronyRole,
    traffic: dict[str, chrony.Traffic],
    *,
    master: str | None,
    own_address: str | None,
) -> str:
    """Why ``node`` has no time source when none of its sources ever answered, and what to do (pure:
    unit-tested). ``master``: the master's address when the node follows it; ``own_address``: the
    node's address the master's chrony allows (and the firewall step opens UDP 123 for)."""
    port = chrony.NTP_PORT
    if master is not None and role.sources == (master,):
        sent = traffic[master].sent if master in traffic else None
        asked = f"none of the {sent} NTP requests sent to it" if sent else "no NTP request"
        whom = f" from {own_address}" if own_address else ""
        return (
            f"no time source: the master ({master}) answered {asked}: UDP {port} to the master is "
            f"blocked: run `bootstrap firewall` (the pipeline does) or open UDP {port}{whom} on the "
            "master (else the master's chronyd is not serving: see its row)"
        )
    asked = ", ".join(
        f"{a}: {traffic[a].sent} sent, {traffic[a].received} answered" if a in traffic else a
        for a in role.sources
    )
    return (
        f"no time source: none of its servers answered an NTP request ({asked}): check that UDP "
        f"{port} reaches them from {node} (a firewall on the way), and that they serve NTP"
    )


def _follows(value: NodeTime, role: ChronyRole, sources: list[chrony.SourceLine]) -> chrony.SourceLine | None:
    """Record what chronyd follows (its selected source and offset) on ``value``; returns that source."""
    selected = next((s for s in sources if s.selected), None)
    value.selected = selected.address if selected else None
    value.chrony_offset_ms = _ms(selected.offset) if selected else (0.0 if role.serve else None)
    return selected


def _note_preference(value: NodeTime, role: ChronyRole, selected: chrony.SourceLine | None) -> None:
    if role.prefer_first and selected is not None and selected.address not in role.sources:
        value.actions.append(f"chrony prefers {selected.address} (also a source here) over the master")


def settled(value: NodeTime, probe: Probe, role: ChronyRole, max_offset_ms: float) -> bool:
    """Whether the node needs no wait: nothing was changed on it, and what chronyd said when it was
    probed already meets :func:`_await`'s condition (a selected source within the limit; a master
    serving only its own clock: a normal leap status). Records what it follows, as the wait would."""
    if value.state != "unchanged" or (probe.running_pid is None and not probe.unit_active):
        return False
    sources = chrony.parse_sources(probe.sources_csv)
    if role.sources:
        chosen = next((s for s in sources if s.selected), None)
        if chosen is None or abs(chosen.offset) > max_offset_ms / 1000:
            return False
    elif chrony.parse_tracking(probe.tracking_csv).get("leap") != "Normal":
        return False
    _note_preference(value, role, _follows(value, role, sources))
    return True


# -- undoing ---------------------------------------------------------------------------------------


def probe_read(node: Node) -> Read:
    """What chrony has on the node (as root), kept in the session under :data:`PROBE`."""

    def parse(sections: Sections, ran: Result) -> Probe:
        output, code = sections.get("chrony", ("", ran.exit_code or 1))
        if code != 0:
            raise CommandFailedError(
                f"reading the time configuration failed (exit {code}): "
                + (" | ".join(output.split("\n")[-3:]) or "no output"),
                node=node.name,
                result=ran,
            )
        return chrony.parse_probe(output)

    return Read(
        PROBE,
        lambda platform: [("chrony", chrony.probe_script(posix_for_node(node)))],
        parse,
        become=True,
        what="reading the time configuration",
    )


class RestoreTime(Step[None, NodeTime]):
    """Undo `bootstrap ntp`: chrony's files back byte for byte (from the backups the first configure
    made), the files it created deleted, what it started stopped; w32time's peers, type and service
    state put back from what its first configure saved. Reads chrony's state on Linux nodes."""

    name = "restore"

    def reads(self, node: Node) -> list[Read]:
        return [probe_read(node)] if node.os == "linux" else []

    def context(self, found: ClusterFacts) -> None:
        return None

    def plan(self, node: Node, facts: Mapping[str, Any], context: None) -> NodePlan:
        import orchestrator.steps.timesync.windows as win

        if node.os != "linux":
            script = win.restore_script(windows_host_shell(node))
            run = Run(script, become=True, host=True, timeout=120, what="w32time")
            return NodePlan(node.name, [run], detail=NodeTime(node.name, daemon="w32time"))
        probe: Probe = facts[PROBE]
        restore = chrony.plan_restore(posix_for_node(node), probe)
        out = NodeTime(node.name, daemon=_daemon_name(probe), actions=restore.actions)
        out.diff = "".join(c.diff() for c in restore.changes)
        if not restore.script:
            out.state = "nothing to restore"
            return NodePlan(node.name, detail=out)
        run = Run(restore.script, become=True, timeout=120, what="restoring the time configuration")
        return NodePlan(node.name, [run], detail=out)

    def judge(self, node: Node, plan: NodePlan, results: list[Result] | None, context: None) -> NodeTime:
        out: NodeTime = plan.detail
        if results is None:  # a dry run: what would run
            out.script = plan.runs[0].script if plan.runs else ""
            if plan.runs:
                out.state = "would be restored" + (" (if configured)" if node.os != "linux" else "")
            return out
        if not results:
            return out
        ran = results[0]
        if node.os != "linux":
            check_elevated_run(node.name, node.user, "restoring w32time", ran)
        elif not ran.ok and posix_for_node(node).sudo_refused(ran.stderr):
            raise sudo_error(node, ran, "restoring the time configuration")
        elif not ran.ok:
            raise CommandFailedError(
                f"restoring the time configuration failed (exit {ran.exit_code}): " + " | ".join(ran.tail(3)),
                node=node.name,
                result=ran,
            )
        windows_nothing = node.os != "linux" and "nothing" in ran.stdout.split()
        out.state = "nothing to restore" if windows_nothing else "restored"
        return out
