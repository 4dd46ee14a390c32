"""Who follows whom: the master's address, where each worker finds it, and each node's chrony role.

The master's address comes from the inventory (its ``host`` as an IP address) or from what the master
reports about itself, never from what the workers resolve its name to: a worker that resolves the name
elsewhere would have its chrony follow another machine, so it is not configured and its row says why.
The master allows exactly the workers' addresses as the controller knows them (orchestrator/steps/
addresses.py; what the firewall step opens UDP 123 for): a worker's own report is a check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.facts.network import Addresses, MasterRoute, Route
from orchestrator.steps.addresses import (
    MasterIdentity,
    Reached,
    cluster_address,
    ip_key,
    master_identity,
)
from orchestrator.steps.timesync.chrony.config import ChronyRole, peer_address

if TYPE_CHECKING:
    from orchestrator.facts import FactSet
    from orchestrator.inventory import Inventory, Node

__all__ = [
    "ROUTE",
    "MasterIdentity",
    "addresses_from",
    "follow_master",
    "master_identity",
    "roles",
    "route_facts",
]


@dataclass
class _Addresses:
    """Where the workers find the master, and where the master finds the workers.

    ``master`` is the master's own address, never a vote of the workers: its ``host`` when that is an
    IP address, else what the master reports about itself (:func:`master_identity`). A worker follows
    the address it resolves the master's name to only when that is one of the master's addresses
    (``servers``); one resolving it elsewhere has a ``problem`` and is not configured.
    """

    master: str | None  # None: not established (``why`` says why)
    workers: dict[str, str]  # worker -> its address as the controller knows it (the master allows those)
    servers: dict[str, str] = field(default_factory=dict)  # worker -> the master address it follows
    problems: dict[str, str] = field(default_factory=dict)  # worker -> why it cannot follow the master
    why: str = ""  # how the master's address was established, or why it could not be
    warnings: list[str] = field(default_factory=list)  # a worker's own report that disagrees


def _usable(text: str | None) -> str | None:
    try:
        return peer_address(text)
    except ValueError:
        return None


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
    expected = ", ".join(sorted(master.addresses, key=ip_key))
    return None, (
        f"resolves the master's host {host!r} to {resolved}, but the master is {master.why}: its chrony "
        f"would follow {resolved}, not the master; fix {host!r} in /etc/hosts or DNS on {node} "
        f"(`getent ahostsv4 {host}` there must print {expected}), then rerun"
    )


#: ``Session.remember`` key of a node's :func:`route_facts` (read by the main pipeline's first round
#: trip: orchestrator/pipeline.py _first_reads)
ROUTE = "timesync.route"


def route_facts(node: Node, master_host: str, master_name: str) -> list[Any]:
    """What the time step asks a node first: where it finds the master (``ip route get``, like the
    preflight), and on the master itself its own addresses."""
    wanted: list[Any] = [MasterRoute(master_host)]
    if node.name == master_name:
        wanted.append(Addresses())
    return wanted


def addresses_from(
    inventory: Inventory,
    nodes: list[Node],
    routes: Mapping[str, FactSet | None],
    errors: Mapping[str, str],
    reached: Mapping[str, Reached],
) -> _Addresses:
    """The master's address (from the inventory or the master itself), where each worker resolves the
    master to (``ip route get``, like the preflight, a check), and each worker's address as the
    controller knows it (the master allows exactly those; a worker's own route source is a check).
    ``routes``: what :func:`route_facts` read on each node of ``nodes`` (None or absent: nothing);
    ``errors``: why a node's read failed (the master's: why its address is unknown)."""
    master = inventory.master_node
    serving = inventory.cluster.time.serving
    found = routes.get(master.name)
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
            error=errors.get(master.name, ""),
            reached=reached[master.name].address if master.name in reached else None,
        )
    out = _Addresses(identity.address, {}, why=identity.why)
    for node in nodes:
        if node.name == master.name:
            continue
        facts = routes.get(node.name)
        route = facts.get("route") if facts is not None else None
        if serving and facts is not None:  # unreachable: its step fails anyway
            server, problem = follow_master(node.name, master.host, route, identity)
            if problem is not None:
                out.problems[node.name] = problem
            elif server is not None:
                out.servers[node.name] = server
        reported = route.source if route is not None and node.name not in out.problems else None
        address, warning = cluster_address(node, reached.get(node.name), reported)
        if address is not None:
            out.workers[node.name] = address
        if warning is not None:
            out.warnings.append(warning)
    return out


def windows_clients(inventory: Inventory, resolve: Any = None) -> tuple[dict[str, str], dict[str, str]]:
    """(Windows worker -> the address the master's chrony must allow, Windows worker -> why it has
    none), for a Linux master serving time (pure but for ``resolve``: unit-tested).

    w32time on a Windows node (native or WSL mode: the host keeps the time) asks the master from the
    node's own LAN address, which is what the inventory connects to: its ``host`` when that is an IP
    address, else that name resolved here (``resolve``: ``socket.gethostbyname``)."""
    import socket

    resolve = resolve or socket.gethostbyname
    allowed: dict[str, str] = {}
    problems: dict[str, str] = {}
    for node in inventory.nodes:
        if node.os == "linux" or node.name == inventory.cluster.master:
            continue
        address = _usable(node.host)
        if address is None:
            try:
                address = _usable(resolve(node.host))
            except OSError:
                address = None
        if address is None:
            problems[node.name] = (
                f"the master's chrony must allow this node, and its host {node.host!r} does not resolve "
                "to an IP address here: write the node's IP address as its host in the inventory"
            )
        else:
            allowed[node.name] = address
    return allowed, problems


def roles(inventory: Inventory, addresses: _Addresses) -> dict[str, ChronyRole]:
    """Each Linux node's chrony role (pure: unit-tested)."""
    settings = inventory.cluster.time
    master = inventory.cluster.master
    allow = tuple(sorted(set(addresses.workers.values()), key=ip_key))
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
