"""The time step's work as runner steps (orchestrator/steps/contract.py): chrony installed where it is
missing (:class:`InstallChrony`), then every node configured (:class:`ConfigureTime`: chrony on Linux,
w32time on the Windows host), the master first when it serves the workers' time.

What they read: each Linux node's route to the master (and the master's own addresses), as the login
user, and chrony's state (the probe), as root; the main pipeline's first round trip
(orchestrator/pipeline.py ``_first_reads``) has read both already, under the same keys. After the
configure, ``sync_time`` awaits each changed node's source and measures every offset from the master
(verify.py: ``AwaitTime``, ``MeasureTime``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orchestrator.steps.timesync.chrony as chrony
from orchestrator.errors import CommandFailedError
from orchestrator.facts.base import FactSet, parse_sections
from orchestrator.plans import NodePlan, Run
from orchestrator.platforms import posix_for_node, windows_host_shell
from orchestrator.platforms.windows_admin import check_elevated_run
from orchestrator.steps.addresses import reached_from
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.steps.preflight import CLOCK
from orchestrator.steps.root import sudo_error
from orchestrator.steps.timesync.apply import PROBE, _missing_chrony, probe_read
from orchestrator.steps.timesync.chrony.config import ChronyRole
from orchestrator.steps.timesync.chrony.probe import Probe
from orchestrator.steps.timesync.master import (
    ROUTE,
    _Addresses,
    addresses_from,
    roles,
    route_facts,
    windows_clients,
)
from orchestrator.steps.timesync.report import NodeTime
from orchestrator.steps.timesync.windows import configure_script, parse_stripchart, status_script

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.transports import Result

__all__ = ["ConfigureTime", "InstallChrony", "Installed", "TimeContext", "TimePlan", "route_read"]

CONFIGURE_TIMEOUT = 120.0
INSTALL_TIMEOUT = 600.0


def route_read(node: Node, master: Node) -> Read:
    """Where ``node`` finds the master (``ip route get``), and on the master its own addresses."""
    facts = route_facts(node, master.host, master.name)

    def parse(sections: Sections, ran: Result) -> FactSet:
        return parse_sections(facts, dict(sections), f"no output (exit code {ran.exit_code})")

    return Read(ROUTE, lambda platform: [(f.name, f.command(platform)) for f in facts], parse)


# -- install -------------------------------------------------------------------------------------------


@dataclass
class Installed:
    """Whether chrony was (or would be) installed on a node."""

    status: str  # "present", "installed", "would install", "not installable"

    def public_dict(self) -> dict[str, Any]:
        return {"status": self.status}


class InstallChrony(Step[None, Installed]):
    """Install chrony (``cluster.time.install: true``) on the selected Linux nodes that lack it, with
    the node's package manager. A node without one (or without chrony, when installing is not
    allowed) is left to :class:`ConfigureTime`, which says what to do."""

    name = "install chrony"

    def scope(self, selected: Sequence[Node]) -> list[Node]:
        return [n for n in selected if n.os == "linux"]

    def reads(self, node: Node) -> list[Read]:
        return [probe_read(node)] if node.os == "linux" else []

    def context(self, found: ClusterFacts) -> None:
        return None

    def plan(self, node: Node, facts: Mapping[str, Any], context: None) -> NodePlan:
        probe: Probe | None = facts.get(PROBE)
        if probe is None or probe.chronyd:
            return NodePlan(node.name, detail=Installed("present"))
        command = chrony.install_command(probe.package_manager)
        if command is None:
            return NodePlan(node.name, detail=Installed("not installable"))
        run = Run(command, become=True, timeout=INSTALL_TIMEOUT, what="installing chrony")
        return NodePlan(node.name, [run], detail=Installed("installed"))

    def judge(self, node: Node, plan: NodePlan, results: list[Result] | None, context: None) -> Installed:
        done: Installed = plan.detail
        if results is None:
            return Installed("would install") if plan.actions else done
        if results:
            ran = results[0]
            if not ran.ok and posix_for_node(node).sudo_refused(ran.stderr):
                raise sudo_error(node, ran, "installing chrony")
            if not ran.ok:
                raise CommandFailedError(
                    f"installing chrony failed (exit {ran.exit_code})",
                    node=node.name,
                    hint=" | ".join(ran.tail(3)),
                    result=ran,
                )
        return done

    def forgets(self, node: Node) -> list[str]:
        return [PROBE, CLOCK]  # chrony's state changed, and the clock may have moved


# -- configure -----------------------------------------------------------------------------------------


@dataclass
class TimePlan:
    """A node's plan detail: its row so far, the probe it was planned from (Linux), and the script a
    dry run shows (the plan's own, or the install a dry run of :class:`InstallChrony` planned)."""

    value: NodeTime
    probe: Probe | None = None
    script: str = ""
    done: str = ""  # what the node's row says once the plan ran ("wrote /etc/chrony.conf")


@dataclass
class TimeContext:
    """Who follows whom: the addresses established (None: time not managed) and each Linux node's role."""

    addresses: _Addresses | None
    roles: dict[str, ChronyRole] = field(default_factory=dict)


class ConfigureTime(Step[TimeContext, NodeTime]):
    """Point every selected node's time daemon at its source: chrony on Linux (the master serving the
    workers, or everyone following ``time.servers``), w32time on the Windows host of Windows nodes
    (native and WSL: a WSL2 distribution follows the host's clock). A Linux master that serves goes
    first: the workers' first polls must find it answering.

    ``installed``: nodes where chrony was just installed; ``would_install``: nodes a dry run of
    :class:`InstallChrony` would install it on (their row shows that install)."""

    name = "ntp"

    def __init__(
        self,
        inventory: Inventory,
        *,
        no_clock_control: bool = False,
        installed: frozenset[str] = frozenset(),
        would_install: Mapping[str, str] | None = None,
    ) -> None:
        self.inventory = inventory
        self.settings = inventory.cluster.time
        self.master = inventory.master_node
        self.no_clock_control = no_clock_control
        self.installed = installed
        self.would_install = dict(would_install or {})
        self.selected: set[str] = set()

    def scope(self, selected: Sequence[Node]) -> list[Node]:
        self.selected = {n.name for n in selected}
        if not self.settings.manage:
            return []
        linux = [n for n in selected if n.os == "linux"]
        scoped = list(linux)
        if self.settings.serving and self.master not in scoped and self.master.os == "linux":
            scoped = [self.master, *scoped]
        # every worker of the inventory: the master's allow list must not depend on --nodes
        return scoped + [n for n in self.inventory.nodes if n.os == "linux" and n not in scoped]

    def reads(self, node: Node) -> list[Read]:
        wanted = [route_read(node, self.master)]
        if node.name in self.selected:
            wanted.append(probe_read(node))
        return wanted

    def context(self, found: ClusterFacts) -> TimeContext:
        if not self.settings.manage:
            return TimeContext(None)
        nodes = [n for n in self.inventory.nodes if n.name in found.values or n.name in found.failed]
        routes = {name: values.get(ROUTE) for name, values in found.values.items()}
        errors = {name: error.message for name, error in found.failed.items() if routes.get(name) is None}
        addresses = addresses_from(
            self.inventory, nodes, routes, errors, reached_from(found.peers, self.inventory.nodes)
        )
        if self.settings.serving and self.master.os == "linux":
            # Windows workers ask the master too (w32time): their addresses join its allow list
            allowed, problems = windows_clients(self.inventory)
            addresses.workers.update(allowed)
            addresses.problems.update(problems)
        return TimeContext(addresses, roles(self.inventory, addresses))

    def waves(self, nodes: list[Node], context: TimeContext) -> list[list[Node]]:
        if self.settings.serving and self.master in nodes:
            return [[self.master], [n for n in nodes if n is not self.master]]
        return [nodes]

    def forgets(self, node: Node) -> list[str]:
        return [PROBE, CLOCK]  # read again when asked: it changed (ROUTE did not)

    # -- plans

    def plan(self, node: Node, facts: Mapping[str, Any], context: TimeContext) -> NodePlan:
        if node.os != "linux":
            return self._plan_windows(node, context)
        if context.addresses is None:  # not managed: only measured
            return NodePlan(node.name, detail=TimePlan(NodeTime(node.name, state="measured")))
        problem = context.addresses.problems.get(node.name)
        if problem is None and node.name not in context.roles:
            problem = f"the master's address is not known: {context.addresses.why}"
        if problem is not None:  # never configured: its chrony would follow something else
            raise CommandFailedError(problem, node=node.name)
        return self._plan_chrony(node, facts[PROBE], context.roles[node.name])

    def _plan_chrony(self, node: Node, probe: Probe, role: ChronyRole) -> NodePlan:
        shell = posix_for_node(node)
        is_master = node.name == self.master.name
        out = NodeTime(
            node.name,
            role="server" if is_master and self.settings.serving else "client",
            sources=list(role.sources),
        )
        if role.serve:
            out.sources = [*role.sources] or ["local clock"]
        if node.name in self.installed:
            out.actions.append("installed chrony")
        if not probe.chronyd:
            if node.name in self.would_install:  # a dry run: the install comes first
                out.actions.append("would install chrony")
                out.daemon, out.state = "chrony", "would install"
                return NodePlan(node.name, detail=TimePlan(out, probe, self.would_install[node.name]))
            if node.name in self.installed:
                raise CommandFailedError(
                    "chrony was installed but chronyd is still not found", node=node.name
                )
            raise _missing_chrony(node, probe)
        out.daemon = "chrony"
        out.clock_control = not (self.no_clock_control or probe.shared_clock)
        mode, change = chrony.plan_config(probe, role)
        out.mode, out.path = mode, change.path
        running = probe.unit_active if (probe.systemd and probe.unit) else probe.running_pid is not None
        parts: list[str] = []
        if change.changed:
            parts.append(chrony.write_file_script(shell, change))
            out.diff = change.diff()
        if change.changed or not running:
            try:
                parts.append(
                    chrony.start_script(shell, probe, no_clock_control=self.no_clock_control, restart=running)
                )
            except chrony.ForeignChronyd as exc:
                raise CommandFailedError(
                    str(exc),
                    node=node.name,
                    hint="stop it (or run it under systemd), then rerun: bootstrap must restart chronyd "
                    "with the new configuration",
                ) from None
        if change.changed:
            out.state = "added" if change.before is None or (mode == "block" and change.backup) else "changed"
        elif not running:
            out.state = "started"
        else:
            out.state = "unchanged"
        if not parts:
            return NodePlan(node.name, detail=TimePlan(out, probe))
        script = "set -e\n" + "\n".join(parts)
        done = f"wrote {change.path}" if change.changed else "started chronyd"
        what = f"writing {change.path}, (re)starting chronyd" if change.changed else "starting chronyd"
        run = Run(script, become=True, timeout=CONFIGURE_TIMEOUT, what=what)
        return NodePlan(node.name, [run], detail=TimePlan(out, probe, script, done))

    def _plan_windows(self, node: Node, context: TimeContext) -> NodePlan:

        value = NodeTime(node.name, role="client", daemon="w32time", state="planned")
        addresses = context.addresses
        if node.name == self.master.name and self.settings.serving:
            # w32time can serve (NtpServer provider) but that is not written yet: use a Linux master
            value.role = "server"
            value.problem = "a Windows master cannot serve time yet: set cluster.time.servers"
        elif self.settings.manage and self.settings.serving:
            # the master's own address (from the inventory or the master itself), never its name:
            # what this node would resolve the name to is not checked
            if addresses is not None and node.name in addresses.problems:
                value.problem = addresses.problems[node.name]
            elif addresses is not None and addresses.master is not None:
                value.sources = [addresses.master]
            else:
                why = addresses.why if addresses is not None else "the master was not asked"
                value.problem = f"the master's address is not known: {why}"
        elif self.settings.manage:
            value.sources = list(self.settings.servers)
        if value.problem is not None or not value.sources:
            return NodePlan(node.name, detail=TimePlan(value))
        return w32time_plan(node, value)

    # -- verdicts

    def judge(
        self, node: Node, plan: NodePlan, results: list[Result] | None, context: TimeContext
    ) -> NodeTime:
        detail: TimePlan = plan.detail
        out = detail.value
        if results is None:  # a dry run: what would run
            out.script = detail.script
            if node.os == "linux" and out.state not in ("unchanged", "measured", "would install"):
                out.state = f"would be {out.state}"
            return out
        if not results:
            return out
        if node.os != "linux":
            return w32time_verdict(out, results)
        ran = results[0]
        if not ran.ok and posix_for_node(node).sudo_refused(ran.stderr):
            raise sudo_error(node, ran, "configuring chrony")
        if not ran.ok:
            raise CommandFailedError(
                f"configuring chrony failed (exit {ran.exit_code}): {' | '.join(ran.tail(3))}",
                node=node.name,
                hint=f"see {out.path}; `bootstrap ntp --restore` puts back the previous configuration",
                result=ran,
            )
        out.actions.append(detail.done)
        return out


def w32time_plan(node: Node, value: NodeTime) -> NodePlan:
    """w32time pointed at ``value.sources`` on the Windows host (elevated), then its offset from the
    first one read (``w32tm /stripchart``). The script is ``value.script`` (what a dry run shows)."""
    shell = windows_host_shell(node)
    value.script = configure_script(value.sources, shell)

    def configured(ran: Result) -> None:  # nothing more runs when the configuration did not take
        check_elevated_run(node.name, node.user, "configuring w32time", ran)

    configure = Run(value.script, become=True, host=True, timeout=180, what="w32time", check=configured)
    status = Run(
        status_script(value.sources[0], shell), become=True, host=True, timeout=120, what="w32tm /stripchart"
    )
    return NodePlan(node.name, [configure, status], detail=TimePlan(value, script=value.script))


def w32time_verdict(value: NodeTime, results: list[Result]) -> NodeTime:
    """The row of a Windows node from its configure and stripchart results."""
    ran, status = results[0], results[1]
    value.state = "unchanged" if "unchanged" in ran.stdout.split() else "changed"
    value.actions.append("w32tm /config /update, service restarted" if value.state == "changed" else "none")
    offset = parse_stripchart(status.stdout) if status.ok else None
    if offset is not None:
        value.chrony_offset_ms = round(offset * 1000.0, 3)
        value.selected = value.sources[0]
    return value
