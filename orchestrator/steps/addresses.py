"""Where the nodes are, as the controller knows it: the one source of the addresses bootstrap writes
into other nodes' configuration (firewall rules, chrony ``allow`` lines) and of the rendezvous address
every rank dials.

A node's own answers (the source address of its route to the master, what it resolves names to) are
checks, never sources: a compromised or misconfigured node must not open the other nodes' firewalls
to an address of its choosing, nor send every rank to another machine. A node's address is, in order:

1. its ``host`` in the inventory, when that is an IPv4 address;
2. the address the controller's own connection reached (an SSH connection without a proxy: the
   socket's peer, which also covers an ssh_config ``HostName``);
3. its ``host`` resolved here, on the controller;
4. a node reached with ``connection: local`` is this machine: its own answers are the controller's.

Through a ProxyJump or a NAT the controller may reach a node at another address than its peers do:
the node's own answer then differs, which is a warning naming it (write its IP address as ``host``).
The master's address (the rendezvous, the time server) is the master's own: its inventory IP, else
what the master says about itself, checked against its own addresses (:func:`master_identity`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.facts.network import InterfaceAddress, Route
    from orchestrator.inventory import Node
    from orchestrator.session import Session

__all__ = [
    "MasterIdentity",
    "Reached",
    "cluster_address",
    "master_identity",
    "reached_at",
    "reached_nodes",
    "usable",
]

#: how a host name is resolved here: its IPv4 addresses (``socket.getaddrinfo``), [] when it has none
Resolver = Callable[[str], list[str]]


def usable(text: object) -> str | None:
    """``text`` as an IPv4 address a peer can have (not loopback, unspecified or multicast), or None."""
    try:
        ip = ipaddress.ip_address(str(text).strip("[]"))
    except ValueError:
        return None
    if ip.version != 4 or ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        return None
    return str(ip)


def resolve_here(host: str) -> list[str]:
    """``host``'s IPv4 addresses as this machine resolves it (empty when it does not)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Reached:
    """A node's address as the controller established it, and how (for messages)."""

    address: str
    how: str


def reached_at(node: Node, peer: str | None, *, resolve: Resolver = resolve_here) -> Reached | None:
    """``node``'s address from the controller's side (the module's rules 1-3), or None: a local node
    (this machine: its own answers count), or one the controller cannot place (pure but for
    ``resolve``: unit-tested)."""
    if (literal := usable(node.host)) is not None:
        return Reached(literal, "its host in the inventory")
    if node.connection == "local":
        return None
    if peer is not None and (direct := usable(peer)) is not None:
        return Reached(direct, f"where the controller's {node.connection} connection reached {node.host!r}")
    for address in resolve(node.host):
        if (found := usable(address)) is not None:
            return Reached(found, f"{node.host!r} resolved on the controller")
    return None


def reached_nodes(
    session: Session, nodes: Iterable[Node], *, resolve: Resolver = resolve_here
) -> dict[str, Reached]:
    """:func:`reached_at` for every node the controller can place (a node already connected in this
    session by its connection's peer address)."""
    return reached_from(
        {node.name: session.peer_address(node.name) for node in nodes}, nodes, resolve=resolve
    )


def reached_from(
    peers: Mapping[str, str | None], nodes: Iterable[Node], *, resolve: Resolver = resolve_here
) -> dict[str, Reached]:
    """:func:`reached_at` for every node the controller can place, given where its connection reached
    each node (``peers``: the connection's peer address, None or absent when unknown)."""
    found: dict[str, Reached] = {}
    for node in nodes:
        reached = reached_at(node, peers.get(node.name), resolve=resolve)
        if reached is not None:
            found[node.name] = reached
    return found


def cluster_address(
    node: Node, reached: Reached | None, reported: str | None
) -> tuple[str | None, str | None]:
    """(the address peers' rules and chrony name ``node`` by, a warning or None).

    ``reported``: what the node says its address toward the cluster is (the source of its route to the
    master). A check only: a mismatch is a warning naming the node. A local node is this machine, so
    its report is used; a node the controller cannot place gets no address (the warning says why)."""
    said = usable(reported) if reported else None
    if node.connection == "local" and reached is None:
        return said, None
    if reached is None:
        return None, (
            f"no address of {node.name!r} is known to the controller ({node.host!r} does not resolve here"
            + (f"; the node itself says {said}, which is not taken from it" if said else "")
            + "): its peers get no rule for it; write its IP address as its host in the inventory"
        )
    if said is not None and said != reached.address:
        return reached.address, (
            f"node {node.name!r} says its address toward the master is {said}, but it is {reached.address} "
            f"({reached.how}): the rules and chrony name {reached.address}; if its ranks really reach the "
            f"others from {said} (a proxy or NAT between here and it), write {said} as its host"
        )
    return reached.address, None


@dataclass(frozen=True)
class MasterIdentity:
    """The master as every rank and worker must find it (:func:`master_identity`)."""

    address: str | None  # the address workers are told to use (None: unknown)
    addresses: frozenset[str]  # every address that is the master's (a worker may resolve to any)
    why: str  # how ``address`` was found, or why it could not be


def master_identity(
    host: str,
    own_route: Route | None,
    own: tuple[InterfaceAddress, ...] | None,
    *,
    error: str = "",
    reached: str | None = None,
) -> MasterIdentity:
    """The master's address from the inventory (``host`` as an IP address) or from what the master
    reports about itself (``own_route``: its own name resolved on it; ``own``: its interface
    addresses), or where the controller reached it (``reached``) when that is one of the master's
    addresses, never from what the workers resolve (pure: unit-tested)."""
    literal = usable(host)
    mine = frozenset(a for a in (usable(i.address) for i in own or ()) if a is not None)
    if literal is not None:
        return MasterIdentity(literal, mine | {literal}, f"{literal}, its host in the inventory")
    if own is None:
        why = f"the master could not be asked for its addresses ({error or 'no answer'})"
        return MasterIdentity(None, mine, why)
    resolved = usable(own_route.address) if own_route else None
    if resolved is not None and resolved in mine:
        return MasterIdentity(resolved, mine, f"{resolved}, what {host!r} resolves to on the master itself")
    if reached is not None and reached in mine:
        return MasterIdentity(reached, mine, f"{reached}, where the controller reached {host!r}")
    if len(mine) == 1:
        [only] = mine
        return MasterIdentity(only, mine, f"{only}, the master's only address")
    said = own_route.address if own_route and own_route.address else "nothing"
    listed = ", ".join(sorted(mine, key=ip_key)) or "none"
    return MasterIdentity(
        None,
        mine,
        f"on the master itself {host!r} resolves to {said}, not one of its addresses ({listed}): write "
        "the master's IP address as its host in the inventory, or map its name to it on the master",
    )


def ip_key(address: str) -> tuple[int, int, str]:
    """Addresses in numeric order (IPv4 before IPv6), anything else last."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (99, 0, address)
    return (ip.version, int(ip), "")


def reached_of(reached: Mapping[str, Reached], name: str) -> str | None:
    """The address in ``reached`` for ``name`` (None: not placed)."""
    found = reached.get(name)
    return found.address if found is not None else None
