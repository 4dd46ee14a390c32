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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CommandFailedError
from orchestrator.plans import NodePlan, Run
from orchestrator.platforms import Platform, platform_for_node, posix_for_node, windows_host_shell
from orchestrator.records import new_nonce
from orchestrator.runner import Reach, run_step
from orchestrator.steps.addresses import Reached, cluster_address, reached_from
from orchestrator.steps.contract import ClusterFacts, Read, Report, Sections, Step
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
from orchestrator.steps.firewall.linux_detection import Detection, detect_sections, detection_sections
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
from orchestrator.steps.root import sudo_error
from orchestrator.view import Cell, CellLike

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Result

__all__ = [
    "Firewall",
    "FirewallContext",
    "FirewallResult",
    "apply_firewall",
    "cluster_addresses",
    "firewall_report",
    "plan_node",
    "plan_windows",
    "remove_firewall",
    "serves_time",
]

DETECT_TIMEOUT = 60.0
APPLY_TIMEOUT = 120.0
#: ``Session.remember`` key of a node's :class:`Detection` (the main pipeline's first round trip
#: reads it with the root check: orchestrator/pipeline.py _first_reads); forgotten once the step
#: changed the node
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

    def row(self, *, dry_run: bool) -> tuple[CellLike, ...]:
        """The firewall table's cells: the firewall, what changed (green: applied; yellow: would
        change), the ports, the peers."""
        style = "green" if self.changed and self.applied else "yellow" if self.changed else ""
        status = self.status + (" (would)" if dry_run and self.commands else "")
        sources = f"{len(self.sources)} peer(s)" if self.sources else "-"
        return (self.kind, Cell(status, style), ", ".join(self.ports) or "-", sources)


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
    platform: Platform | None = None,
) -> FirewallResult:
    """The commands that bring ``node`` from what ``detection`` found to what the cluster needs."""
    platform = platform or posix_for_node(node)
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
        windows_host_shell(node),
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


# -- the step ------------------------------------------------------------------------------------------


@dataclass
class FirewallContext:
    """The cluster-wide decisions: every node's cluster address (the peer set) and what to say once."""

    detections: dict[str, Detection]
    addresses: dict[str, str]
    warnings: list[str] = field(default_factory=list)


class Firewall(Step[FirewallContext, FirewallResult]):
    """Open exactly the training ports (and the master's NTP for its workers) to the cluster's peers
    on the selected nodes, or, with ``remove``, delete every rule of this cluster's tag (current or
    legacy, see :class:`~orchestrator.steps.firewall.rules.ClusterTag`) and nothing else.

    Reads: each Linux node's firewall (:func:`detection_sections`, as root), on every node of the
    inventory, since the rules name every peer's address. Windows nodes read nothing: their script
    converges on the node (Defender, or Hyper-V rules for WSL ranks) and reports what it changed."""

    name = "firewall"

    def __init__(self, inventory: Inventory, *, remove: bool = False) -> None:
        self.inventory = inventory
        self.remove = remove
        self.ids = ClusterTag(inventory.cluster.name)
        self.managed = inventory.cluster.firewall.manage or remove
        self.selected: set[str] = set()

    def scope(self, selected: Sequence[Node]) -> list[Node]:
        self.selected = {n.name for n in selected}
        if not self.managed:
            return []
        probed = selected if self.remove else self.inventory.nodes
        return [n for n in probed if n.os == "linux"]

    def reads(self, node: Node) -> list[Read]:
        master, ids = self.inventory.master_node.host, self.ids
        nonce = new_nonce()  # of the answers inside the detection's sections

        def parse(sections: Sections, ran: Result) -> Detection:
            if "range" not in sections:
                raise CommandFailedError(
                    f"the firewall detection did not run (exit code {ran.exit_code}): "
                    + (" | ".join(ran.tail(3)) or "no output"),
                    node=node.name,
                    hint="the firewall step needs root (sudo -n for other users) and a POSIX sh",
                    result=ran,
                )
            return detect_sections(sections, ids, nonce)

        return [
            Read(
                DETECTION,
                lambda platform: detection_sections(platform, master_host=master, ids=ids, nonce=nonce),
                parse,
                become=True,
                what="reading the firewall",
                timeout=DETECT_TIMEOUT,
            )
        ]

    def context(self, found: ClusterFacts) -> FirewallContext:
        inventory = self.inventory
        detections = {name: values[DETECTION] for name, values in found.values.items() if DETECTION in values}
        if not self.managed:
            return FirewallContext({}, {}, ["cluster.firewall.manage is false: no firewall was touched"])
        warnings: list[str] = []
        said: dict[str, str] = {}  # node -> a warning about its address, said already
        addresses: dict[str, str] = {}
        if not self.remove:
            reached = reached_from(found.peers, inventory.nodes)
            addresses, said = cluster_addresses(inventory, detections, reached)
            warnings.extend(said.values())
        for name, error in found.failed.items():
            if name not in self.selected:
                known = f" (using {addresses[name]} from the inventory)" if name in addresses else ""
                warnings.append(f"{name} (not selected) could not be inspected{known}: {error.message}")
        if not self.remove:
            missing = [n.name for n in inventory.nodes if n.name not in addresses and n.name not in said]
            if missing and len(inventory.nodes) > 1:
                warnings.append(
                    f"no cluster address known for {', '.join(missing)}: its peers get no rule for it; "
                    "give its IP address as host: (or make its name resolve on this machine) and rerun"
                )
        return FirewallContext(detections, addresses, warnings)

    def plan(self, node: Node, facts: Mapping[str, Any], context: FirewallContext) -> NodePlan:
        if not self.managed:
            unmanaged = FirewallResult(
                kind="unmanaged", places=[], notes=["cluster.firewall.manage is false"]
            )
            return NodePlan(node.name, detail=unmanaged)
        if node.os == "windows":
            result = plan_windows(node, self.inventory, context.addresses, remove=self.remove)
            script = result.commands[0]  # it converges and reports: it runs every time
            run = Run(script, become=True, host=True, timeout=APPLY_TIMEOUT, what="Windows firewall rules")
            return NodePlan(node.name, [run], detail=result)
        platform = platform_for_node(node)
        result = plan_node(
            node, self.inventory, facts[DETECTION], context.addresses, remove=self.remove, platform=platform
        )
        if not result.commands:
            return NodePlan(node.name, detail=result)
        script = "set -e\n" + "\n".join(result.commands)
        return NodePlan(
            node.name, [Run(script, become=True, timeout=APPLY_TIMEOUT, what="firewall rules")], detail=result
        )

    def judge(
        self, node: Node, plan: NodePlan, results: list[Result] | None, context: FirewallContext
    ) -> FirewallResult:
        result: FirewallResult = plan.detail
        if not results:  # a dry run, or nothing to change
            return result
        ran = results[0]
        if node.os == "windows":
            return _windows_verdict(node, ran, result)
        if not ran.ok and platform_for_node(node).sudo_refused(ran.stderr):
            raise sudo_error(node, ran, "changing the firewall")
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

    def warnings(self, context: FirewallContext) -> list[str]:
        return context.warnings

    def data(self, context: FirewallContext) -> dict[str, Any]:
        return {"addresses": context.addresses}


def _windows_verdict(node: Node, ran: Result, result: FirewallResult) -> FirewallResult:
    """What the converging script reported (it ran elevated, or says it could not)."""
    from orchestrator.platforms.windows_admin import check_elevated_run
    from orchestrator.steps.firewall.windows import parse_report

    check_elevated_run(node.name, node.user, "setting the firewall rules", ran, then="rerun to converge")
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


def apply_firewall(
    session: Session, inventory: Inventory, nodes: list[Node] | None = None, *, dry_run: bool = False
) -> Report[FirewallResult]:
    """Open the training ports on ``nodes`` (default: the session's) for the cluster's peers only.
    With ``dry_run`` only the read-only detection runs; the report's plans are what would run."""
    return run_step(session, Firewall(inventory), nodes, dry_run=dry_run)


def remove_firewall(
    session: Session, inventory: Inventory, nodes: list[Node] | None = None, *, dry_run: bool = False
) -> Report[FirewallResult]:
    """Delete every rule tagged with this cluster's tag on ``nodes`` (and our persisted files), nothing
    else: what `bootstrap firewall --remove` and teardown do."""
    return run_step(session, Firewall(inventory, remove=True), nodes, dry_run=dry_run)


def firewall_report(
    reach: Reach, inventory: Inventory, selected: list[Node], *, remove: bool, dry_run: bool
) -> Report[FirewallResult]:
    """`bootstrap firewall` (``remove``: `--remove`) on ``selected``: the session reaches every node
    of the inventory, whose cluster addresses are the peer set, but changes only the selected ones
    (`--remove` needs no peers: the selected nodes only)."""
    reached = selected if remove else list(inventory.nodes)
    step = remove_firewall if remove else apply_firewall
    return reach.within(reached, "firewall", lambda on: step(on, inventory, selected, dry_run=dry_run))
