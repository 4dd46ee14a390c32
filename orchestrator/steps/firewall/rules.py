"""What the firewall must allow, independent of which firewall a node runs.

Training needs, from every peer of the cluster (and only from them): the rendezvous port on the master,
the ephemeral ports gloo and NCCL listen on (every rank binds port 0 and connects a full mesh; no variable
pins a range, see FIELD_NOTES, "Ports and firewalls"), and the inventory's extra ports. A
rule is one (source address, port range) pair: small enough that a changed peer set or port range changes
exactly the rules concerned, and the same shape for nftables, iptables, ufw and Windows.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: every rule we add carries this prefix plus the cluster name (comment, zone description, rule group)
TAG_PREFIX = "cluster-bootstrap"


@dataclass(frozen=True, order=True)
class PortRange:
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high <= 65535:
            raise ValueError(f"bad port range {self.low}-{self.high}")

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """``"29500"``, ``"32768-60999"`` or ``"32768:60999"`` (iptables, ufw)."""
        low, sep, high = text.strip().replace(":", "-").partition("-")
        return cls(int(low), int(high if sep else low))

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"

    @property
    def colon(self) -> str:
        """iptables/ufw spelling of a range (``32768:60999``)."""
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


@dataclass(frozen=True, order=True)
class Rule:
    """Allow TCP from ``source`` (an IPv4 address or network) to ``ports`` on the node."""

    source: str
    ports: PortRange

    def __str__(self) -> str:
        return f"tcp from {self.source} to port {self.ports}"


def cluster_tag(cluster_name: str) -> str:
    """``cluster-bootstrap:<name>`` with only characters every firewall keeps in a comment.

    The tag is how our rules are told apart from everybody else's: re-runs compare against it and
    ``--remove`` deletes exactly the rules carrying it. Any other character becomes ``_``.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", cluster_name)[:64] or "cluster"
    return f"{TAG_PREFIX}:{safe}"


def short_name(cluster_name: str, limit: int) -> str:
    """A name of at most ``limit`` characters for places with length limits (firewalld zones: 17),
    unique per cluster name thanks to a hash suffix."""
    digest = hashlib.sha1(cluster_name.encode()).hexdigest()[:5]
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", cluster_name)
    head = f"cb-{safe}"
    if len(head) <= limit:
        return head
    return f"{head[: limit - 6]}-{digest}"


def normalize_source(text: str) -> str:
    """An IPv4 address (``a.b.c.d``) or network (``a.b.c.0/24``) in canonical form; ``/32`` dropped."""
    network = ipaddress.ip_network(text.strip(), strict=False)
    if network.version != 4:
        raise ValueError(f"{text!r} is not IPv4")
    return str(network.network_address) if network.prefixlen == 32 else str(network)


def is_usable_peer(address: str) -> bool:
    """A peer address worth a rule: IPv4, not loopback/unspecified/multicast (those are never peers)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == 4 and not (ip.is_loopback or ip.is_unspecified or ip.is_multicast)


def wanted_rules(sources: Iterable[str], ports: Iterable[PortRange]) -> list[Rule]:
    """Every (source, port range) pair, sorted: the rules one node must carry."""
    return sorted({Rule(s, p) for s in sources for p in ports})


def node_ports(
    *, is_master: bool, rendezvous_port: int, ephemeral: PortRange | None, extra: Sequence[str]
) -> list[PortRange]:
    """The ports one node opens: the rendezvous port (master only: the TCPStore listens there, for
    static and c10d rendezvous alike, since the endpoint is the master), its ephemeral range, extras."""
    ports: set[PortRange] = {PortRange.parse(p) for p in extra}
    if ephemeral is not None:
        ports.add(ephemeral)
    if is_master and not (ephemeral and ephemeral.low <= rendezvous_port <= ephemeral.high):
        ports.add(PortRange(rendezvous_port, rendezvous_port))
    # a port inside another range adds nothing (one fewer rule to keep in sync)
    kept = {p for p in ports if not any(o != p and o.low <= p.low and p.high <= o.high for o in ports)}
    return sorted(kept)


@dataclass(frozen=True)
class Present:
    """A rule of ours found on a node: what it allows (None: tagged ours but not understood, e.g. a
    hand edit; it is removed) and how the firewall names it for deletion (nft handle, iptables spec)."""

    rule: Rule | None
    ref: str


@dataclass(frozen=True)
class Changes:
    """What turns the present rules of one place (a chain, a zone) into the wanted ones."""

    add: tuple[Rule, ...]
    delete: tuple[Present, ...]
    unchanged: tuple[Rule, ...]

    @property
    def changed(self) -> bool:
        return bool(self.add or self.delete)


def reconcile(wanted: Iterable[Rule], present: Iterable[Present]) -> Changes:
    """Keep one present copy of each wanted rule, delete the rest of ours, add what is missing."""
    want = set(wanted)
    kept: set[Rule] = set()
    delete: list[Present] = []
    for entry in present:
        if entry.rule is not None and entry.rule in want and entry.rule not in kept:
            kept.add(entry.rule)
        else:
            delete.append(entry)  # not wanted (any more), a duplicate, or not understood
    return Changes(add=tuple(sorted(want - kept)), delete=tuple(delete), unchanged=tuple(sorted(kept)))
