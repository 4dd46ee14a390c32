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
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BootstrapError, CommandFailedError, UsageError
from orchestrator.executor import Outcome
from orchestrator.facts.network import Addresses, InterfaceAddress, MasterRoute, Route
from orchestrator.platforms import PosixShell, PowerShell
from orchestrator.steps.preflight import sample_clock
from orchestrator.steps.preflight.checks import ClockSample
from orchestrator.steps.root import run_as_root
from orchestrator.steps.timesync import chrony
from orchestrator.steps.timesync.chrony import ChronyRole, Probe, peer_address, time_source

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Result, Transport

__all__ = ["NodeTime", "TimeReport", "restore_time", "sync_time"]


@dataclass
class NodeTime:
    """What the step did and measured on one node (a row of the summary table)."""

    node: str
    role: str = "-"  # "server" (the master serving the workers), "client", "-" (not managed)
    daemon: str = "-"  # chrony, timesyncd, w32time, none
    # added, changed, unchanged, started, measured, restored, nothing to restore; "failed": configured
    # (see actions) but following no source (problem says why)
    state: str = "-"
    sources: list[str] = field(default_factory=list)  # what it is configured to follow (not: has)
    mode: str | None = None  # dropin, block, file (where our chrony directives went)
    path: str | None = None
    selected: str | None = None  # chrony's selected source (^*)
    chrony_offset_ms: float | None = None  # chrony: this node minus its selected source
    offset_ms: float | None = None  # this node minus the master, over the connection (as `check`)
    offset_error_ms: float | None = None  # +- of offset_ms (half the round trips)
    clock_control: bool | None = None  # False: chronyd -x (measures only; shared kernel clock)
    actions: list[str] = field(default_factory=list)
    diff: str = ""  # --dry-run: the configuration diff
    script: str = ""  # --dry-run: what would run (as root)
    problem: str | None = None  # why this node fails the step, with what to do

    def public_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TimeReport:
    outcomes: list[Outcome[NodeTime]]  # one per node, inventory order
    max_offset_ms: float
    master: str
    dry_run: bool = False

    @property
    def failed(self) -> bool:
        return any(not o.ok or (o.value is not None and o.value.problem) for o in self.outcomes)

    def public_dict(self) -> dict[str, Any]:
        return {
            "master": self.master,
            "max_offset_ms": self.max_offset_ms,
            "dry_run": self.dry_run,
            "nodes": [
                {
                    "name": o.node,
                    "ok": o.ok and not (o.value and o.value.problem),
                    "error": None if o.error is None else {"message": o.error.message, "hint": o.error.hint},
                    **(o.value.public_dict() if o.value else {}),
                }
                for o in self.outcomes
            ],
        }


# -- helpers -----------------------------------------------------------------------------------------


def _as_root(transport: Transport, node: Node, script: str, what: str, timeout: float = 120) -> Result:
    return run_as_root(node, transport, script, what, timeout)


def _probe(node: Node, transport: Transport) -> Probe:
    shell = _posix(node, transport)
    result = _as_root(transport, node, chrony.probe_script(shell), "reading the time configuration", 60)
    if not result.ok:
        raise CommandFailedError(
            f"reading the time configuration failed (exit {result.exit_code}): {' | '.join(result.tail(3))}",
            node=node.name,
            result=result,
        )
    return chrony.parse_probe(result.stdout)


def _posix(node: Node, transport: Transport) -> PosixShell:
    platform = transport.platform
    if not isinstance(platform, PosixShell):
        raise CommandFailedError(
            f"time sync on {platform.name} nodes needs the WinRM transport", node=node.name
        )
    return platform


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


# -- planning ----------------------------------------------------------------------------------------


@dataclass
class _Addresses:
    """Where the workers find the master, and where the master finds the workers.

    ``master`` is the master's own address, never a vote of the workers: its ``host`` when that is an
    IP address, else what the master reports about itself (:func:`master_identity`). A worker follows
    the address it resolves the master's name to only when that is one of the master's addresses
    (``servers``); one resolving it elsewhere has a ``problem`` and is not configured.
    """

    master: str | None  # None: not established (``why`` says why)
    workers: dict[str, str]  # worker -> its address toward the master (the master allows exactly those)
    servers: dict[str, str] = field(default_factory=dict)  # worker -> the master address it follows
    problems: dict[str, str] = field(default_factory=dict)  # worker -> why it cannot follow the master
    why: str = ""  # how the master's address was established, or why it could not be


def _usable(text: str | None) -> str | None:
    try:
        return peer_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class MasterIdentity:
    """The master as its workers must find it (:func:`master_identity`)."""

    address: str | None  # the address workers are told to follow (None: unknown)
    addresses: frozenset[str]  # every address that is the master's (a worker may resolve to any)
    why: str  # how ``address`` was found, or why it could not be


def master_identity(
    host: str, own_route: Route | None, own: tuple[InterfaceAddress, ...] | None, *, error: str = ""
) -> MasterIdentity:
    """The master's address from the inventory (``host`` as an IP address) or from what the master
    reports about itself (``own_route``: its own name resolved on it; ``own``: its interface
    addresses), never from what the workers resolve (pure: unit-tested)."""
    literal = _usable(host)
    mine = frozenset(a for a in (_usable(i.address) for i in own or ()) if a is not None)
    if literal is not None:
        return MasterIdentity(literal, mine | {literal}, f"{literal}, its host in the inventory")
    if own is None:
        why = f"the master could not be asked for its addresses ({error or 'no answer'})"
        return MasterIdentity(None, mine, why)
    resolved = _usable(own_route.address) if own_route else None
    if resolved is not None and resolved in mine:
        return MasterIdentity(resolved, mine, f"{resolved}, what {host!r} resolves to on the master itself")
    if len(mine) == 1:
        [only] = mine
        return MasterIdentity(only, mine, f"{only}, the master's only address")
    said = own_route.address if own_route and own_route.address else "nothing"
    listed = ", ".join(sorted(mine, key=_ip_key)) or "none"
    return MasterIdentity(
        None,
        mine,
        f"on the master itself {host!r} resolves to {said}, not one of its addresses ({listed}): write "
        "the master's IP address as its host in the inventory, or map its name to it on the master",
    )


def follow_master(
    node: str, host: str, route: Route | None, master: MasterIdentity
) -> tuple[str | None, str | None]:
    """(the master address ``node`` follows, None) or (None, the problem), from what ``node``
    resolved the master's ``host`` to (pure: unit-tested)."""
    if master.address is None:
        return None, f"the master's address is not known: {master.why}"
    resolved = route.address if route else None
    if resolved is None:  # the worker cannot resolve the name: it is given the address itself
        return master.address, None
    checked = _usable(resolved)
    if checked is not None and checked in master.addresses:
        return checked, None
    expected = ", ".join(sorted(master.addresses, key=_ip_key))
    return None, (
        f"resolves the master's host {host!r} to {resolved}, but the master is {master.why}: its chrony "
        f"would follow {resolved}, not the master; fix {host!r} in /etc/hosts or DNS on {node} "
        f"(`getent ahostsv4 {host}` there must print {expected}), then rerun"
    )


def _addresses(session: Session, inventory: Inventory, nodes: list[Node]) -> _Addresses:
    """The master's address (from the inventory or the master itself), where each worker resolves the
    master to (``ip route get``, like the preflight) and its own address toward it (the master allows
    exactly those)."""
    from orchestrator.facts import FactSet, gather

    master = inventory.master_node
    serving = inventory.cluster.time.serving

    def facts(node: Node, transport: Transport) -> FactSet:
        wanted: list[Any] = [MasterRoute(master.host)]
        if node.name == master.name:
            wanted.append(Addresses())
        return gather(transport, wanted)

    outcomes = {o.node: o for o in session.map(facts, step="route", nodes=nodes)}
    mine = outcomes.get(master.name)
    found = mine.value if mine is not None else None
    if master.os != "linux":
        literal = _usable(master.host)
        known = frozenset({literal} if literal else ())
        identity = MasterIdentity(literal, known, "a Windows master (it cannot serve yet)")
    else:
        own = found.get("addresses") if found is not None else None
        identity = master_identity(
            master.host,
            found.get("route") if found is not None else None,
            own if isinstance(own, tuple) else None,
            error=mine.error.message if mine is not None and mine.error is not None else "",
        )
    out = _Addresses(identity.address, {}, why=identity.why)
    for node in nodes:
        if node.name == master.name:
            continue
        o = outcomes.get(node.name)
        route = o.value.get("route") if o is not None and o.value is not None else None
        if serving and o is not None and o.value is not None:  # unreachable: its step fails anyway
            server, problem = follow_master(node.name, master.host, route, identity)
            if problem is not None:
                out.problems[node.name] = problem
            elif server is not None:
                out.servers[node.name] = server
        source = _usable(route.source) if route is not None and node.name not in out.problems else None
        address = source or _usable(node.host)  # unreachable now: still allowed, as the inventory says
        if address is not None:
            out.workers[node.name] = address
    return out


def roles(inventory: Inventory, addresses: _Addresses) -> dict[str, ChronyRole]:
    """Each Linux node's chrony role (pure: unit-tested)."""
    settings = inventory.cluster.time
    master = inventory.cluster.master
    allow = tuple(sorted(set(addresses.workers.values()), key=_ip_key))
    out: dict[str, ChronyRole] = {}
    for node in inventory.nodes:
        if node.name == master:
            out[node.name] = ChronyRole(tuple(settings.servers), serve=settings.serving, allow=allow)
        elif settings.serving:
            server = addresses.servers.get(node.name, addresses.master)
            if node.name in addresses.problems or server is None:
                continue  # not configured: the step reports the problem for this node
            out[node.name] = ChronyRole((server,), prefer_first=True)
        else:
            out[node.name] = ChronyRole(tuple(settings.servers))
    return out


def _ip_key(address: str) -> tuple[int, int, str]:
    """Addresses in numeric order (IPv4 before IPv6), anything else last."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (99, 0, address)
    return (ip.version, int(ip), "")


# -- applying ----------------------------------------------------------------------------------------


def _apply(
    node: Node,
    transport: Transport,
    role: ChronyRole,
    *,
    is_master: bool,
    serving: bool,
    install: bool,
    dry_run: bool,
    no_clock_control: bool,
) -> NodeTime:
    shell = _posix(node, transport)
    probe = _probe(node, transport)
    out = NodeTime(
        node.name, role="server" if is_master and serving else "client", sources=list(role.sources)
    )
    if role.serve:
        out.sources = [*role.sources] or ["local clock"]
    script_parts: list[str] = []
    if not probe.chronyd:
        command = chrony.install_command(probe.package_manager)
        if not install or command is None:
            raise _missing_chrony(node, probe)
        if dry_run:
            out.actions.append("would install chrony")
            script_parts.append(command)
            out.daemon = "chrony"
            out.state = "would install"
            out.script = "\n".join(script_parts)
            return out
        result = _as_root(transport, node, command, "installing chrony", timeout=600)
        if not result.ok:
            raise CommandFailedError(
                f"installing chrony failed (exit {result.exit_code})",
                node=node.name,
                hint=" | ".join(result.tail(3)),
                result=result,
            )
        out.actions.append("installed chrony")
        probe = _probe(node, transport)
        if not probe.chronyd:
            raise CommandFailedError("chrony was installed but chronyd is still not found", node=node.name)
    out.daemon = "chrony"
    out.clock_control = not (no_clock_control or probe.shared_clock)
    mode, change = chrony.plan_config(probe, role)
    out.mode, out.path = mode, change.path
    running = probe.unit_active if (probe.systemd and probe.unit) else probe.running_pid is not None
    if change.changed:
        script_parts.append(chrony.write_file_script(shell, change))
        out.diff = change.diff()
    if change.changed or not running:
        try:
            script_parts.append(
                chrony.start_script(shell, probe, no_clock_control=no_clock_control, restart=running)
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
    script = "set -e\n" + "\n".join(script_parts) if script_parts else ""
    if dry_run:
        out.script = script
        out.state = f"would be {out.state}" if out.state != "unchanged" else "unchanged"
        return out
    if script:
        result = _as_root(transport, node, script, "configuring chrony", timeout=120)
        if not result.ok:
            raise CommandFailedError(
                f"configuring chrony failed (exit {result.exit_code}): {' | '.join(result.tail(3))}",
                node=node.name,
                hint=f"see {change.path}; `bootstrap ntp --restore` puts back the previous configuration",
                result=result,
            )
        out.actions.append(f"wrote {change.path}" if change.changed else "started chronyd")
    return out


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
    script = chrony.wait_script(
        max_offset_s=max_offset_ms / 1000, timeout=timeout, has_sources=bool(role.sources)
    )
    result = _as_root(transport, node, script, "reading chronyc", timeout=timeout + 30)
    sources_csv, tracking_csv = chrony.split_wait_output(result.stdout)
    sources = chrony.parse_sources(sources_csv)
    tracking = chrony.parse_tracking(tracking_csv)
    selected = next((s for s in sources if s.selected), None)
    value.selected = selected.address if selected else None
    value.chrony_offset_ms = _ms(selected.offset) if selected else (0.0 if role.serve else None)
    if selected is None and role.sources and result.exit_code in (3, chrony.NO_REPLY_EXIT):
        value.state = "failed"  # configured (its actions say how), but it follows nothing
    if result.exit_code == chrony.NO_REPLY_EXIT:
        traffic = chrony.parse_ntpdata(result.stdout)
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
    elif role.prefer_first and selected is not None and selected.address not in role.sources:
        value.actions.append(f"chrony prefers {selected.address} (also a source here) over the master")


def _measure(
    session: Session, nodes: list[Node], master: Node, values: dict[str, NodeTime], max_offset_ms: float
) -> None:
    """Each node's offset from the master over the connection (the preflight's method)."""
    targets = [n for n in nodes if n.name in values]
    if master not in targets:
        targets = [master, *targets]
    clocks = session.map(lambda n, t: sample_clock(t), step="clock", nodes=targets)
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
        node_roles = roles(inventory, addresses)
        for node in list(linux):
            problem = addresses.problems.get(node.name)
            if problem is None and node.name not in node_roles:
                problem = f"the master's address is not known: {addresses.why}"
            if problem is not None:  # never configured: its chrony would follow something else
                error = CommandFailedError(problem, node=node.name)
                errors[node.name] = Outcome(node.name, None, error, 0.0)
                linux.remove(node)

        def apply(node: Node, transport: Transport) -> NodeTime:
            return _apply(
                node,
                transport,
                node_roles[node.name],
                is_master=node.name == master.name,
                serving=settings.serving,
                install=settings.install,
                dry_run=dry_run,
                no_clock_control=no_clock_control,
            )

        first = [master] if settings.serving and master in linux else []
        rest = [n for n in linux if n not in first]
        for group, step in ((first, "ntp-master"), (rest, "ntp")):
            for o in session.map(apply, step=step, nodes=group):
                if o.value is not None:
                    values[o.node] = o.value
                else:
                    errors[o.node] = o
        if not dry_run:
            waiting = [n for n in linux if n.name in values]
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
            _measure(session, waiting, master, values, settings.max_offset_ms)

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
            if addresses is not None and addresses.master is not None:
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
    return TimeReport(outcomes, settings.max_offset_ms, master.name, dry_run)


def _run_powershell(node: Node, transport: Transport, script: str, timeout: float) -> Result:
    """PowerShell on the Windows host: the node's own shell (native), or beside its WSL distribution
    (a WSL2 distribution follows the host's clock: w32time is what to configure)."""
    run_windows = getattr(transport, "run_windows", None)
    if isinstance(transport.platform, PowerShell):
        return transport.run(script, become=True, timeout=timeout)
    if run_windows is not None:
        result: Result = run_windows(script, timeout=timeout)
        return result
    raise CommandFailedError(
        f"time sync on a Windows node needs PowerShell on its host; this node runs {transport.platform.name}"
        f" over {transport.kind}",
        node=node.name,
        hint="reach Windows nodes over WinRM (connection: winrm)",
    )


def _apply_windows(node: Node, transport: Transport, value: NodeTime) -> NodeTime:
    """w32time pointed at the sources, then its offset from the first one measured (stripchart)."""
    from orchestrator.steps.timesync import windows as win

    ran = _run_powershell(node, transport, value.script, 180)
    if not ran.ok:
        raise CommandFailedError(
            "configuring w32time failed: " + (" | ".join(ran.tail(4)) or f"exit {ran.exit_code}"),
            node=node.name,
            hint="it needs an elevated session (a member of Administrators over WinRM)",
            result=ran,
        )
    value.state = "unchanged" if "unchanged" in ran.stdout.split() else "changed"
    value.actions.append("w32tm /config /update, service restarted" if value.state == "changed" else "none")
    status = _run_powershell(node, transport, win.status_script(value.sources[0]), 120)
    offset = win.parse_stripchart(status.stdout) if status.ok else None
    if offset is not None:
        value.chrony_offset_ms = round(offset * 1000.0, 3)
        value.selected = value.sources[0]
    return value


# -- undoing -----------------------------------------------------------------------------------------


def _restore(node: Node, transport: Transport, dry_run: bool) -> NodeTime:
    shell = _posix(node, transport)
    probe = _probe(node, transport)
    plan = chrony.plan_restore(shell, probe)
    out = NodeTime(node.name, daemon=_daemon_name(probe), actions=plan.actions)
    out.diff = "".join(c.diff() for c in plan.changes)
    if not plan.script:
        out.state = "nothing to restore"
        return out
    if dry_run:
        out.script = plan.script
        out.state = "would be restored"
        return out
    result = _as_root(transport, node, plan.script, "restoring the time configuration")
    if not result.ok:
        raise CommandFailedError(
            f"restoring the time configuration failed (exit {result.exit_code}): "
            + " | ".join(result.tail(3)),
            node=node.name,
            result=result,
        )
    out.state = "restored"
    return out


def _restore_windows(node: Node, transport: Transport, dry_run: bool) -> NodeTime:
    """w32time's peers, type and service state put back from what the first configure saved."""
    from orchestrator.steps.timesync import windows as win

    out = NodeTime(node.name, daemon="w32time")
    script = win.restore_script()
    if dry_run:
        out.script, out.state = script, "would be restored (if configured)"
        return out
    ran = _run_powershell(node, transport, script, 120)
    if not ran.ok:
        raise CommandFailedError(
            "restoring w32time failed: " + (" | ".join(ran.tail(3)) or f"exit {ran.exit_code}"),
            node=node.name,
            result=ran,
        )
    out.state = "nothing to restore" if "nothing" in ran.stdout.split() else "restored"
    return out


def restore_time(
    session: Session, inventory: Inventory, nodes: list[Node] | None = None, *, dry_run: bool = False
) -> TimeReport:
    """Undo `sync_time` on ``nodes``: files back byte for byte, the chronyd/unit we started stopped.
    For `bootstrap teardown` and `bootstrap ntp --restore`."""
    chosen = list(session.nodes if nodes is None else nodes)

    def one(node: Node, transport: Transport) -> NodeTime:
        if node.os == "linux":
            return _restore(node, transport, dry_run)
        return _restore_windows(node, transport, dry_run)

    outcomes = session.map(one, step="restore", nodes=chosen)
    return TimeReport(outcomes, inventory.cluster.time.max_offset_ms, inventory.cluster.master, dry_run)
