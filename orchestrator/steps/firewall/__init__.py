"""`bootstrap firewall`: open exactly what training (and the pipeline's own time sync) needs between the
cluster's nodes, undo it cleanly.

Two phases over the nodes, each one round trip: detect (as root: which firewall decides, the node's
route to the master and its ephemeral port range, the rules of ours already there), then, with every
node's cluster address known, apply the difference between the wanted rules and ours. A second run finds
everything in place and changes nothing; ``remove`` deletes every rule carrying our tag and nothing else.
Besides the training ports (TCP), the master lets the workers reach its NTP server (UDP 123) when it
serves the cluster's time (``cluster.time``, see :func:`serves_time`): the ``ntp`` step that follows in
the pipeline needs it. The main pipeline calls :func:`apply_firewall` before `ntp` and `check`;
teardown calls :func:`remove_firewall`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CommandFailedError
from orchestrator.executor import Outcome
from orchestrator.facts.base import split_sections
from orchestrator.platforms import PosixShell
from orchestrator.records import new_nonce
from orchestrator.steps.addresses import Reached, cluster_address, reached_nodes
from orchestrator.steps.firewall.firewalld import firewalld_commands
from orchestrator.steps.firewall.linux import (
    Target,
    iptables_commands,
    iptables_persist_commands,
    nft_commands,
    nft_persist_commands,
    nft_persist_file,
    ufw_commands,
)
from orchestrator.steps.firewall.linux_detection import Detection, detect, detection_sections
from orchestrator.steps.firewall.rules import (
    NTP_PORT,
    Changes,
    ClusterTag,
    PortRange,
    Rule,
    is_usable_peer,
    node_ports,
    reconcile,
    time_rules,
    wanted_rules,
)
from orchestrator.steps.root import run_as_root

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = [
    "FirewallResult",
    "FirewallRun",
    "apply_firewall",
    "cluster_addresses",
    "plan_node",
    "plan_windows",
    "remove_firewall",
    "serves_time",
]

DETECT_TIMEOUT = 60.0
APPLY_TIMEOUT = 120.0
#: ``Session.remember`` key of a node's :class:`Detection` (the main pipeline's first round trip
#: reads it with the root check: steps/setup_read.py); forgotten once the step changed the node
DETECTION = "firewall.detection"


@dataclass
class FirewallResult:
    """What the step did (or, with dry_run, would do) on one node."""

    kind: str  # "nftables", "iptables", "ufw", "firewalld", "none", "unmanaged"
    places: list[str]  # chains / policy touched or inspected
    added: int = 0
    removed: int = 0
    unchanged: int = 0
    ports: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # exactly what ran (dry run: would run), as root
    applied: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)

    @property
    def status(self) -> str:
        if self.kind == "unmanaged":
            return "left alone"
        if not self.commands:
            return "unchanged" if self.unchanged else "nothing to do"
        parts = [f"{n} {what}" for n, what in ((self.added, "added"), (self.removed, "removed")) if n]
        if self.unchanged:
            parts.append(f"{self.unchanged} unchanged")
        return ", ".join(parts) or "updated"

    def public_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "places": self.places,
            "status": self.status,
            "added": self.added,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "ports": self.ports,
            "sources": self.sources,
            "commands": self.commands,
            "applied": self.applied,
            "notes": self.notes,
        }


@dataclass
class FirewallRun:
    """Outcomes for the selected nodes (inventory order), the cluster addresses used, warnings."""

    outcomes: list[Outcome[FirewallResult]]
    addresses: dict[str, str]
    warnings: list[str] = field(default_factory=list)


# -- peers ----------------------------------------------------------------------------------------------


def cluster_addresses(
    inventory: Inventory, detections: dict[str, Detection], reached: Mapping[str, Reached]
) -> tuple[dict[str, str], dict[str, str]]:
    """(node -> the address its peers' rules name, node -> a warning about it).

    The address is the one the controller knows the node by (``reached``: its inventory IP, where the
    controller's connection reached it, or its name resolved here; see orchestrator/steps/addresses.py).
    What the node reports (its route's source toward the master, judged as the preflight's interface
    check does) is a check: a mismatch is a warning naming the node, never a rule for the address it
    reported. A local node is this machine: its own report is the controller's."""
    from orchestrator.steps.preflight import check_interfaces
    from orchestrator.steps.preflight.checks import PreflightFacts

    facts = [
        PreflightFacts(
            node=node,
            python=None,
            torch=None,
            gpus=None,
            route=d.route,
            addresses=d.addresses,
            interfaces=d.interfaces,
            hostname=None,
            hostname_address=None,
            disk=None,
        )
        for node in inventory.nodes
        if (d := detections.get(node.name)) is not None
    ]
    single = len(inventory.nodes) == 1
    verdicts = check_interfaces(facts, inventory.cluster.master, single=single, reached=reached)
    found: dict[str, str] = {}
    warnings: dict[str, str] = {}
    for node in inventory.nodes:
        verdict = verdicts.get(node.name)
        reported = verdict.data.get("source") if verdict is not None else None
        address, warning = cluster_address(
            node, reached.get(node.name), reported if isinstance(reported, str) else None
        )
        if address is not None and is_usable_peer(address):
            found[node.name] = address
        if warning is not None and not single:
            warnings[node.name] = warning
    return found, warnings


def _peers_of(node: Node, addresses: dict[str, str], detection: Detection) -> dict[str, str]:
    """Every other node's cluster address (by name), minus the node's own addresses."""
    own = {a.address for a in detection.addresses}
    if node.name in addresses:
        own.add(addresses[node.name])
    return {name: addr for name, addr in addresses.items() if name != node.name and addr not in own}


def _sources_for(
    node: Node, inventory: Inventory, addresses: dict[str, str], detection: Detection
) -> list[str]:
    """Every peer's address plus the inventory's extra sources, minus the node's own addresses."""
    peers = set(_peers_of(node, addresses, detection).values())
    return sorted(peers | set(inventory.cluster.firewall.extra_sources))


def serves_time(inventory: Inventory) -> bool:
    """Does `bootstrap ntp` make the master serve the workers' time (chrony ``local stratum`` +
    ``allow``)? Only when it manages time, serves from the master (no ``time.servers``, or
    ``serve_from_master: true``) and the master runs Linux (a Windows master cannot serve yet)."""
    settings = inventory.cluster.time
    return settings.manage and settings.serving and inventory.master_node.os == "linux"


# -- planning (pure) ------------------------------------------------------------------------------------


def plan_node(
    node: Node,
    inventory: Inventory,
    detection: Detection,
    addresses: dict[str, str],
    *,
    remove: bool = False,
    platform: PosixShell | None = None,
) -> FirewallResult:
    """The commands that bring ``node`` from what ``detection`` found to what the cluster needs."""
    platform = platform or PosixShell()
    settings = inventory.cluster.firewall
    ids = ClusterTag(inventory.cluster.name)
    tag = ids.tag
    filtering = [t for t in detection.targets if t.filtering]
    result = FirewallResult(kind=detection.kind, places=[t.label for t in detection.targets])
    result.notes.extend(detection.notes)

    rules: list[Rule] = []
    if not remove:
        if settings.ephemeral_ports == "auto":
            ephemeral = detection.ephemeral
        else:
            ephemeral = PortRange.parse(settings.ephemeral_ports)
        ports = node_ports(
            is_master=node.name == inventory.cluster.master,
            rendezvous_port=inventory.cluster.port,
            ephemeral=ephemeral,
            extra=settings.extra_ports,
        )
        result.ports = [str(p) for p in ports]
        if len(inventory.nodes) == 1:
            result.notes.append("single node: its ranks meet over loopback, nothing to open")
        else:
            result.sources = _sources_for(node, inventory, addresses, detection)
            rules = wanted_rules(result.sources, ports)
            # the workers' time source: the master's chrony allows exactly their cluster addresses
            ntp = time_rules(
                is_master=node.name == inventory.cluster.master,
                serves_time=serves_time(inventory),
                workers=_peers_of(node, addresses, detection).values(),
            )
            if ntp:
                rules = sorted(set(rules) | set(ntp))
                result.ports.append(f"{NTP_PORT}/udp")
                result.notes.append(
                    f"UDP {NTP_PORT} (NTP) from the {len(ntp)} worker(s): the master serves the "
                    "cluster's time (bootstrap ntp; cluster.time)"
                )
    if not filtering and not remove and detection.kind == "none":
        result.notes.append("no active firewall filters incoming traffic here: nothing to open")

    commands: list[str] = []
    legacy = 0  # rules with the legacy tag, removed
    nft_changes: list[tuple[Target, Changes]] = []
    nft_wanted: list[tuple[Target, list[Rule]]] = []
    for target in detection.targets:
        wanted = rules if target.filtering else []
        if target.kind == "firewalld":
            change, fw_commands = firewalld_commands(
                platform, target, wanted, tag, persist=settings.persist, remove=remove
            )
            commands += fw_commands
            if target.legacy and fw_commands:
                result.notes.append(f"removed {target.label} (and its rules): the rules carry {tag} now")
        else:
            change = reconcile(wanted, target.present)
            if target.kind == "nftables":
                nft_changes.append((target, change))
                if target.filtering:
                    nft_wanted.append((target, wanted))
            elif target.kind == "iptables":
                commands += iptables_commands(platform, target, change, tag)
                if change.changed and settings.persist:
                    saved = iptables_persist_commands(platform, target, detection.persist)
                    commands += saved
                    if not saved:
                        result.notes.append(
                            "persist: no /etc/iptables/rules.v4 (install iptables-persistent): "
                            "the rules last until reboot"
                        )
            elif target.kind == "ufw":
                commands += ufw_commands(platform, change, tag)
        result.added += len(change.add)
        result.removed += len(change.delete)
        result.unchanged += len(change.unchanged)
        legacy += sum(1 for entry in change.delete if entry.legacy)
    if legacy:
        result.notes.append(
            f"{legacy} rule(s) tagged {ids.legacy} (the tag of earlier versions, which other cluster "
            f"names could share) removed" + ("" if remove else f"; the cluster's rules carry {tag} now")
        )
    commands = nft_commands(platform, nft_changes, tag) + commands
    nft_changed = any(change.changed for _, change in nft_changes)
    persisted = "included" in detection.persist
    if nft_wanted and settings.persist and not remove:
        if "nftables.conf" not in detection.persist:
            result.notes.append(
                "persist: no /etc/nftables.conf here (rules loaded some other way): "
                "the rules last until reboot"
            )
        elif nft_changed or not persisted:
            commands += nft_persist_commands(platform, nft_wanted, tag, remove=False)
    elif persisted and (remove or not settings.persist):
        commands += nft_persist_commands(platform, [], tag, remove=True)
        result.notes.append(f"removed the persisted rules ({nft_persist_file(tag)})")
    if "legacy" in detection.persist:  # persisted under the legacy tag: a rerun persists them anew
        commands += nft_persist_commands(platform, [], ids.legacy, remove=True)
        result.notes.append(f"removed the persisted rules of the legacy tag ({nft_persist_file(ids.legacy)})")
    result.commands = commands
    return result


def plan_windows(
    node: Node, inventory: Inventory, addresses: dict[str, str], *, remove: bool = False
) -> FirewallResult:
    """The PowerShell script converging a Windows node: Defender rules for native ranks, Hyper-V
    firewall rules for ranks inside WSL (mirrored networking); see windows.py. TCP only: a Windows
    master never serves time (:func:`serves_time`), so no node here needs UDP 123 opened."""
    from orchestrator.platforms.powershell import PowerShell
    from orchestrator.steps.firewall.windows import WSL_DEFAULT_EPHEMERAL, firewall_script

    settings = inventory.cluster.firewall
    wsl = node.windows.mode == "wsl"
    fixed = settings.ephemeral_ports != "auto"
    ephemeral = (
        PortRange.parse(settings.ephemeral_ports) if fixed else (WSL_DEFAULT_EPHEMERAL if wsl else None)
    )
    ports = node_ports(
        is_master=node.name == inventory.cluster.master,
        rendezvous_port=inventory.cluster.port,
        ephemeral=ephemeral,
        extra=settings.extra_ports,
    )
    fixed_ports = [p for p in ports if p != ephemeral]
    own = addresses.get(node.name)
    sources = sorted({a for n, a in addresses.items() if n != node.name and a != own})
    sources = sorted(set(sources) | set(settings.extra_sources))
    if len(inventory.nodes) == 1:
        sources = []
    script = firewall_script(
        PowerShell(),
        cluster_name=inventory.cluster.name,
        ports=fixed_ports,
        ephemeral=ephemeral,
        sources=sources,
        wsl=wsl,
        remove=remove,
    )
    kind = "hyper-v (wsl)" if wsl else "windows defender"
    shown_ports = [str(p) for p in fixed_ports] + [str(ephemeral) if ephemeral else "dynamic range"]
    return FirewallResult(
        kind=kind,
        places=[f"{kind} rules {ClusterTag(inventory.cluster.name).tag}"],
        ports=[] if remove else shown_ports,
        sources=[] if remove else sources,
        commands=[script],
        notes=["the script converges on the node and reports what it changed"],
    )


def apply_windows(node: Node, transport: Transport, result: FirewallResult) -> FirewallResult:
    """Run the converging script in an elevated PowerShell session and read its report."""
    from orchestrator.platforms.powershell import PowerShell
    from orchestrator.platforms.windows_admin import not_elevated_error
    from orchestrator.steps.firewall.windows import parse_report

    run_windows = getattr(transport, "run_windows", None)
    if isinstance(transport.platform, PowerShell):
        ran = transport.run(result.commands[0], become=True, timeout=APPLY_TIMEOUT)
    elif run_windows is not None:  # a WSL node: the rules belong to the Windows host under it
        ran = run_windows(result.commands[0], become=True, timeout=APPLY_TIMEOUT)
    else:
        raise CommandFailedError(
            f"the {result.kind} rules need PowerShell on the Windows host; this node's commands run in "
            f"{transport.platform.name} over {transport.kind}",
            node=node.name,
            hint="run `bootstrap firewall --dry-run` and paste the script into an administrator "
            "PowerShell on the node, or reach the node over WinRM",
        )
    if (refused := not_elevated_error(node.name, node.user, "setting the firewall rules", ran)) is not None:
        raise refused
    if not ran.ok:
        raise CommandFailedError(
            "the Windows firewall script failed: " + (" | ".join(ran.tail(4)) or f"exit {ran.exit_code}"),
            node=node.name,
            hint="it needs an elevated session (a member of Administrators over WinRM); rerun to converge",
            result=ran,
        )
    try:
        report = parse_report(ran.stdout)
    except ValueError as exc:
        raise CommandFailedError(str(exc), node=node.name, result=ran) from None
    result.added, result.removed = report["added"] + report["updated"], report["removed"]
    result.unchanged = report["unchanged"]
    if not result.changed:
        result.commands = []  # converged already: nothing ran that changed anything
    result.applied = True
    return result


# -- running ------------------------------------------------------------------------------------------


def detect_node(node: Node, transport: Transport, inventory: Inventory) -> Detection:
    """One round trip as root: which firewall decides, our rules, the route to the master."""
    if not isinstance(transport.platform, PosixShell):
        raise CommandFailedError(
            f"the Linux firewall detection needs a POSIX shell, this node speaks {transport.platform.name}",
            node=node.name,
        )
    platform = transport.platform
    ids = ClusterTag(inventory.cluster.name)
    sections = detection_sections(platform, master_host=inventory.master_node.host, ids=ids)
    token = new_nonce()
    result = run_as_root(
        node, transport, platform.sectioned(sections, token), "reading the firewall", DETECT_TIMEOUT
    )
    if "range" not in split_sections(result.stdout, token):
        raise CommandFailedError(
            f"the firewall detection did not run (exit code {result.exit_code}): "
            + (" | ".join(result.tail(3)) or "no output"),
            node=node.name,
            hint="the firewall step needs root (sudo -n for other users) and a POSIX sh",
            result=result,
        )
    return detect(result.stdout, token, ids)


def apply_node(node: Node, transport: Transport, result: FirewallResult) -> FirewallResult:
    """Run the planned commands as root, stopping at the first failure."""
    if not result.commands:
        return result
    script = "set -e\n" + "\n".join(result.commands)
    ran = run_as_root(node, transport, script, "changing the firewall", APPLY_TIMEOUT)
    if not ran.ok:
        raise CommandFailedError(
            "a firewall command failed: " + (" | ".join(ran.tail(4)) or f"exit code {ran.exit_code}"),
            node=node.name,
            hint="the commands before it took effect (nftables changes are one transaction: none did); "
            "rerun `bootstrap firewall` (it converges) or `bootstrap firewall --remove`",
            result=ran,
        )
    result.applied = True
    return result


def _firewall_step(
    session: Session,
    inventory: Inventory,
    nodes: list[Node] | None,
    *,
    dry_run: bool,
    remove: bool,
    addresses: dict[str, str] | None,
) -> FirewallRun:
    selected = list(session.nodes if nodes is None else nodes)
    settings = inventory.cluster.firewall
    warnings: list[str] = []
    if not settings.manage and not remove:
        outcomes: list[Outcome[FirewallResult]] = [
            Outcome(
                n.name,
                FirewallResult(kind="unmanaged", places=[], notes=["cluster.firewall.manage is false"]),
                None,
                0.0,
            )
            for n in selected
        ]
        return FirewallRun(outcomes, {}, ["cluster.firewall.manage is false: no firewall was touched"])
    # the peer set needs every node's address: detect on all of them unless addresses were given;
    # Windows nodes are not probed (their script converges on the node itself)
    probe = selected if remove or addresses is not None else list(inventory.nodes)
    probe = [n for n in probe if n.os == "linux"]
    detected = session.map(
        lambda n, t: session.remember(n.name, DETECTION, lambda: detect_node(n, t, inventory)),
        step="read firewall",
        nodes=probe,
    )
    detections = {o.node: o.value for o in detected if o.value is not None}
    said: dict[str, str] = {}  # node -> a warning about its address, said already
    if addresses is None and not remove:
        addresses, said = cluster_addresses(inventory, detections, reached_nodes(session, inventory.nodes))
        warnings.extend(said.values())
    elif addresses is None:
        addresses = {}
    else:  # given by the caller (the preflight's interface sources): checked like our own
        for name, address in addresses.items():
            if not is_usable_peer(address):
                warnings.append(f"{name}: {address!r} is not a usable IPv4 address: no rule names it")
        addresses = {name: a for name, a in addresses.items() if is_usable_peer(a)}
    chosen = {n.name for n in selected}
    for o in detected:
        if o.node not in chosen and o.error is not None:
            known = f" (using {addresses[o.node]} from the inventory)" if o.node in addresses else ""
            warnings.append(f"{o.node} (not selected) could not be inspected{known}: {o.error.message}")
    if not remove:
        missing = [n.name for n in inventory.nodes if n.name not in addresses and n.name not in said]
        if missing and len(inventory.nodes) > 1:
            warnings.append(
                f"no cluster address known for {', '.join(missing)}: its peers get no rule for it; "
                "give its IP address as host: (or make its name resolve on this machine) and rerun"
            )
    plans = {
        name: plan_node(inventory.node(name), inventory, d, addresses, remove=remove)
        for name, d in detections.items()
        if name in chosen
    }
    for node in selected:
        if node.os == "windows":
            plans[node.name] = plan_windows(node, inventory, addresses, remove=remove)
    applied = {name: Outcome(name, plan, None, 0.0) for name, plan in plans.items()}
    if not dry_run:  # only nodes with something to run are contacted again
        ran = session.map(
            lambda n, t: (apply_windows if n.os == "windows" else apply_node)(n, t, plans[n.name]),
            step="change firewall",
            nodes=[n for n in selected if n.name in plans and plans[n.name].commands],
        )
        applied.update({o.node: o for o in ran})
        for name in (c.node for c in ran):  # what was read there is history now (even a failed change)
            session.forget(name, DETECTION)
    by_name = {o.node: o for o in detected}
    final: list[Outcome[FirewallResult]] = []
    for node in selected:
        first = by_name.get(node.name) or Outcome(node.name, None, None, 0.0)
        if first.error is not None or node.name not in applied:
            final.append(Outcome(node.name, None, first.error, first.duration))
        else:
            second = applied[node.name]
            final.append(Outcome(node.name, second.value, second.error, first.duration + second.duration))
    return FirewallRun(final, addresses, warnings)


def apply_firewall(
    session: Session,
    inventory: Inventory,
    nodes: list[Node] | None = None,
    *,
    dry_run: bool = False,
    addresses: dict[str, str] | None = None,
) -> FirewallRun:
    """Open the training ports on ``nodes`` (default: the session's) for the cluster's peers only.

    ``addresses`` (node -> address toward the cluster, e.g. the preflight's interface ``source``)
    skips detecting the nodes that are not selected. With ``dry_run`` only the read-only detection
    runs; each result's ``commands`` are what would run as root.
    """
    return _firewall_step(session, inventory, nodes, dry_run=dry_run, remove=False, addresses=addresses)


def remove_firewall(
    session: Session, inventory: Inventory, nodes: list[Node] | None = None, *, dry_run: bool = False
) -> FirewallRun:
    """Delete every rule tagged with this cluster's exact tag, current or legacy (see
    :class:`~orchestrator.steps.firewall.rules.ClusterTag`), on ``nodes`` (and our persisted files),
    nothing else: what `bootstrap firewall --remove` and teardown do."""
    return _firewall_step(session, inventory, nodes, dry_run=dry_run, remove=True, addresses=None)
