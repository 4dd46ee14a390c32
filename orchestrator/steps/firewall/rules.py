"""What the firewall must allow, independent of which firewall a node runs.

Training needs, from every peer of the cluster (and only from them): the rendezvous port on the master,
the ephemeral ports gloo and NCCL listen on (every rank binds port 0 and connects a full mesh; no variable
pins a range, see FIELD_NOTES, "Ports and firewalls"), and the inventory's extra ports. The pipeline's
own ``ntp`` step needs one more: when the master serves the cluster's time (chrony ``allow``), UDP 123
on the master from the workers (:func:`time_rules`). A rule is one (source address, port range,
protocol): small enough that a changed peer set or port range changes exactly the rules concerned, and
the same shape for nftables, iptables, ufw and firewalld.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

#: every rule we add carries this prefix plus the cluster's readable name and digest (see ClusterTag)
TAG_PREFIX = "cluster-bootstrap"
#: the readable part of a tag keeps at most this many characters of the cluster name
READABLE_LIMIT = 48
#: hex digits of sha256(cluster name) in a tag: 48 bits, so two cluster names never share a tag by chance
DIGEST_LENGTH = 12
#: firewalld policy names are limited like zone names (17 characters)
FIREWALLD_NAME_LIMIT = 17
#: the longest tag: nft keeps comments of up to 128 characters, iptables 256; Windows rule names add
#: "-tcp-32768-60999" to it
TAG_LIMIT = len(TAG_PREFIX) + 1 + READABLE_LIMIT + 1 + DIGEST_LENGTH
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

Protocol = Literal["tcp", "udp"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)


def _digest(cluster_name: str) -> str:
    return hashlib.sha256(cluster_name.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ClusterTag:
    """Every name our firewall objects carry, derived from the exact cluster name, in one place.

    ``tag`` (a rule's comment, the firewalld policy's description, the Windows rule group) is
    ``cluster-bootstrap:<readable>:<digest>``: the readable part is the name with every character
    other than letters, digits, ``_.-`` made ``_`` and cut at 48 characters (so firewalls and people
    can show it), the digest the first 12 hex digits of the name's SHA-256. Two cluster names that
    differ anywhere (``fw test`` and ``fw_test``, or past the 48th character) get different tags,
    so one cluster's ``--remove`` never matches another's rules. Rules are ours only when their tag
    is exactly one of ours (:meth:`owns`), never by prefix.

    ``legacy`` is the tag earlier versions wrote (``cluster-bootstrap:<first 64 safe characters>``,
    shared by such names): rules carrying it are removed, by ``--remove`` and by a rerun, which then
    writes them again with ``tag`` (docs/firewall.md, "Tags").
    """

    cluster_name: str

    @property
    def readable(self) -> str:
        return _UNSAFE.sub("_", self.cluster_name)[:READABLE_LIMIT] or "cluster"

    @property
    def digest(self) -> str:
        return _digest(self.cluster_name)[:DIGEST_LENGTH]

    @property
    def tag(self) -> str:
        return f"{TAG_PREFIX}:{self.readable}:{self.digest}"

    @property
    def legacy(self) -> str:
        safe = _UNSAFE.sub("_", self.cluster_name)[:64] or "cluster"
        return f"{TAG_PREFIX}:{safe}"

    def owns(self, comment: str) -> bool:
        """A rule whose tag (comment) is exactly this cluster's, current or legacy."""
        return comment in (self.tag, self.legacy)

    def is_legacy(self, comment: str) -> bool:
        return comment == self.legacy

    @property
    def policy(self) -> str:
        """Our firewalld policy: ``cb-<readable>-<6 hex digits>``, at most 17 characters."""
        head = re.sub(r"[^A-Za-z0-9_-]", "_", self.cluster_name)[: FIREWALLD_NAME_LIMIT - 10] or "cluster"
        return f"cb-{head}-{self.digest[:6]}"

    @property
    def legacy_policy(self) -> str:
        """The firewalld policy name earlier versions used (``cb-<name>`` when short enough)."""
        safe = re.sub(r"[^A-Za-z0-9_-]", "_", self.cluster_name)
        head = f"cb-{safe}"
        if len(head) <= FIREWALLD_NAME_LIMIT:
            return head
        sha1 = hashlib.sha1(self.cluster_name.encode()).hexdigest()
        return f"{head[: FIREWALLD_NAME_LIMIT - 6]}-{sha1[:5]}"

    @property
    def windows_prefix(self) -> str:
        """Names of our Windows rules are this plus ``tcp-<ports>`` (Hyper-V rules have no group)."""
        return self.tag.replace(":", "-") + "-"

    @property
    def legacy_windows_prefix(self) -> str:
        return self.legacy.replace(":", "-") + "-"


def cluster_tag(cluster_name: str) -> str:
    """``cluster-bootstrap:<readable>:<digest>`` (see :class:`ClusterTag`)."""
    return ClusterTag(cluster_name).tag


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
    """Allow ``protocol`` (TCP unless said otherwise) from ``source`` (an IPv4 address or network) to
    ``ports`` on the node.

    ``source`` must already be canonical (:func:`normalize_source`): a Rule is what every firewall
    command is written from, so nothing that is not an IP address or network can reach one (a value
    a node reported, such as its route's source, included). ``protocol`` is ``tcp`` or ``udp``.
    """

    source: str
    ports: PortRange
    protocol: Protocol = "tcp"

    def __post_init__(self) -> None:
        try:
            canonical = normalize_source(self.source)
        except ValueError:
            raise ValueError(f"not an IPv4 address or network: {self.source!r}") from None
        if canonical != self.source:
            raise ValueError(f"not in canonical form: {self.source!r} (expected {canonical!r})")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"not a protocol we open: {self.protocol!r}")

    def __str__(self) -> str:
        return f"{self.protocol} from {self.source} to port {self.ports}"


def protocol_of(text: str) -> Protocol | None:
    """``text`` as one of our protocols (what a firewall printed for a rule); None for anything else."""
    lowered = text.strip().lower()
    if lowered == "tcp":
        return "tcp"
    if lowered == "udp":
        return "udp"
    return None


def normalize_source(text: str) -> str:
    """An IPv4 address (``a.b.c.d``) or network (``a.b.c.0/24``) in canonical form; ``/32`` dropped.
    ValueError for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not an address")
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
    """Every (source, port range) pair, sorted: the TCP rules one node must carry."""
    return sorted({Rule(s, p) for s in sources for p in ports})


#: NTP: where the master's chrony answers the workers when it serves the cluster's time
NTP_PORT = PortRange(123, 123)


def time_rules(*, is_master: bool, serves_time: bool, workers: Iterable[str]) -> list[Rule]:
    """UDP 123 (NTP) from each worker's address, on the master only and only when it serves time
    (``bootstrap ntp`` writes chrony ``allow`` lines for exactly these addresses): what the pipeline's
    own ``ntp`` step needs through a drop-policy firewall. Nothing for a worker, nothing when the
    nodes follow other servers (``cluster.time.servers``) or time is not managed."""
    if not (is_master and serves_time):
        return []
    return sorted({Rule(w, NTP_PORT, "udp") for w in workers})


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
    hand edit; it is removed) and how the firewall names it for deletion (nft handle, iptables spec).
    ``legacy``: it carries the tag of earlier versions (always removed; a rerun writes it anew)."""

    rule: Rule | None
    ref: str
    legacy: bool = False


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
    """Keep one present copy of each wanted rule, delete the rest of ours (and every rule with the
    legacy tag), add what is missing."""
    want = set(wanted)
    kept: set[Rule] = set()
    delete: list[Present] = []
    for entry in present:
        if entry.rule is not None and not entry.legacy and entry.rule in want and entry.rule not in kept:
            kept.add(entry.rule)
        else:
            delete.append(entry)  # not wanted (any more), a duplicate, or not understood
    return Changes(add=tuple(sorted(want - kept)), delete=tuple(delete), unchanged=tuple(sorted(kept)))
