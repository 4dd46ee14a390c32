"""One node's time configuration over its transport: chrony on Linux (probe, install, configure,
await its source, measure, restore) and w32time on Windows (configure, measure, restore).

The chrony files and scripts themselves are built by :mod:`orchestrator.steps.timesync.chrony` and the
w32time scripts by :mod:`orchestrator.steps.timesync.windows`; here they are run (as root) and what
they print becomes the node's :class:`NodeTime`. In which order the nodes get this work is decided by
:func:`orchestrator.steps.timesync.sync_time` and :func:`orchestrator.steps.timesync.restore_time`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orchestrator.steps.timesync.chrony as chrony
from orchestrator.errors import BootstrapError, CommandFailedError
from orchestrator.plans import NodePlan, Run
from orchestrator.platforms import PosixShell, posix_for_node
from orchestrator.platforms.windows_admin import check_elevated_run
from orchestrator.records import new_nonce
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.steps.preflight import CLOCK, sample_clock
from orchestrator.steps.preflight.checks import ClockSample
from orchestrator.steps.root import run_as_root, sudo_error
from orchestrator.steps.timesync.chrony.config import ChronyRole
from orchestrator.steps.timesync.chrony.probe import Probe
from orchestrator.steps.timesync.report import NodeTime

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.session import Session
    from orchestrator.transports import Result, Transport

__all__ = ["PROBE", "RestoreTime", "no_reply_problem", "probe_read", "settled"]

#: ``Session.remember`` key of a node's chrony :class:`Probe` (read by the main pipeline's first round
#: trip: steps/setup_read.py); forgotten once the step changed the node
PROBE = "timesync.probe"


def _as_root(transport: Transport, node: Node, script: str, what: str, timeout: float = 120) -> Result:
    return run_as_root(node, transport, script, what, timeout)


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


def _await(
    node: Node,
    transport: Transport,
    value: NodeTime,
    role: ChronyRole,
    max_offset_ms: float,
    timeout: float,
    *,
    own_address: str | None = None,
) -> None:
    """Wait until chronyd on the node follows its source within the threshold, or until none of its
    sources can answer (fails at once, saying why); record what it says."""
    nonce = new_nonce()
    script = chrony.wait_script(
        max_offset_s=max_offset_ms / 1000, timeout=timeout, has_sources=bool(role.sources), nonce=nonce
    )
    result = _as_root(transport, node, script, "reading chronyc", timeout=timeout + 30)
    sources_csv, tracking_csv, ntpdata = chrony.split_wait_output(result.stdout, nonce)
    sources = chrony.parse_sources(sources_csv)
    tracking = chrony.parse_tracking(tracking_csv)
    selected = _follows(value, role, sources)
    if selected is None and role.sources and result.exit_code in (3, chrony.NO_REPLY_EXIT):
        value.state = "failed"  # configured (its actions say how), but it follows nothing
    if result.exit_code == chrony.NO_REPLY_EXIT:
        traffic = chrony.parse_ntpdata(ntpdata)
        master = role.sources[0] if role.prefer_first else None  # a worker of a serving master
        value.problem = no_reply_problem(node.name, role, traffic, master=master, own_address=own_address)
    elif result.exit_code == 3:
        seen = ", ".join(f"{s.address} ({s.state}, reach {s.reach:o})" for s in sources) or "none"
        if selected is not None:
            value.problem = (
                f"chrony follows {selected.address} but is still {abs(selected.offset) * 1000:.1f} ms off "
                f"after {timeout:g} s (limit {max_offset_ms:g} ms)"
            )
        else:
            value.problem = (
                f"chrony selected no source within {timeout:g} s (sources: {seen}; "
                f"leap status {tracking.get('leap', '?')}): check that UDP 123 reaches "
                f"{', '.join(role.sources) or 'the sources'} from {node.name}"
            )
    elif not result.ok:
        value.problem = f"chronyc failed (exit {result.exit_code}): {' | '.join(result.tail(3))}"
    else:
        _note_preference(value, role, selected)


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


def _measure(
    session: Session, nodes: list[Node], master: Node, values: dict[str, NodeTime], max_offset_ms: float
) -> None:
    """Each node's offset from the master over the connection (the preflight's method)."""
    targets = [n for n in nodes if n.name in values]
    if master not in targets:
        targets = [master, *targets]

    # a sample this session already took (the main pipeline's first round trip) stands for the nodes
    # the step did not change (sync_time forgets the others'), the master's too: offsets are
    # differences of samples against our one clock, each with its error shown and allowed for
    def sample_of(node: Node, transport: Transport) -> ClockSample:
        return session.remember(node.name, CLOCK, lambda: sample_clock(transport))

    clocks = session.map(sample_of, step="clock", nodes=targets)
    samples: dict[str, ClockSample | None] = {o.node: o.value for o in clocks}
    reference = samples.get(master.name)
    for name, value in values.items():
        sample = samples.get(name)
        if reference is None or sample is None:
            value.actions.append("offset from the master not measured (`date` failed)")
            continue
        offset = sample.offset - reference.offset
        error = (sample.rtt + reference.rtt) / 2
        value.offset_ms, value.offset_error_ms = _ms(offset), _ms(error)
        if value.problem is None and abs(offset) - error > max_offset_ms / 1000:
            value.problem = (
                f"clock is {offset * 1000:+.1f} ms (+-{error * 1000:.1f}) from the master's, over the "
                f"{max_offset_ms:g} ms limit: check that its time daemon follows the master "
                "(chronyc sources), or raise cluster.time.max_offset_ms"
            )
        chrony_ms = value.chrony_offset_ms
        if value.problem is None and chrony_ms is not None and abs(chrony_ms) > max_offset_ms:
            value.problem = (
                f"chrony reports {chrony_ms:+.3f} ms from {value.selected}, "
                f"over the {max_offset_ms:g} ms limit"
            )


# -- undoing ---------------------------------------------------------------------------------------


def probe_read(node: Node) -> Read:
    """What chrony has on the node (as root), kept in the session under :data:`PROBE`."""

    def parse(sections: Sections, ran: Result) -> Probe:
        output, code = sections.get("chrony", ("", ran.exit_code or 1))
        if code != 0:
            raise CommandFailedError(
                f"reading the time configuration failed (exit {code}): {' | '.join(ran.tail(3))}",
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
            run = Run(win.restore_script(), become=True, host=True, timeout=120, what="w32time")
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
        elif not ran.ok and PosixShell.sudo_refused(ran.stderr):
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
