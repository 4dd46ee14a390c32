"""The reachability check's data and judgement, pure: the probe's output lines (probes/reach.py), the
measured pairs, and one verdict per node from them (reachability.py runs the probes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.runs.ids import is_run_id
from orchestrator.steps.preflight.model import Verdict, fail, ok, warn

CHECK = "reachability"

Role = Literal["rendezvous", "mesh"]
Outcome = Literal["ok", "refused", "timed out", "no route", "error"]

#: the probe's outcome words -> ours
_PROBE_OUTCOMES: dict[str, Outcome] = {
    "ok": "ok",
    "refused": "refused",
    "timeout": "timed out",
    "unreachable": "no route",
    "error": "error",
}
_EXPLAIN: dict[Outcome, str] = {
    "ok": "ok",
    "refused": "refused",
    "timed out": "timed out: a firewall dropping packets?",
    "no route": "no route",
    "error": "error",
}


@dataclass(frozen=True)
class Pair:
    """One measured connection attempt from ``source`` to ``target``'s listener."""

    source: str
    target: str
    role: Role
    address: str
    port: int
    outcome: Outcome
    ms: float | None = None
    detail: str = ""  # errno name for "error" (and "refused"/"no route", for the curious)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def explain(self) -> str:
        if self.outcome == "error" and self.detail:
            return f"error {self.detail}"
        return _EXPLAIN[self.outcome]

    def public_dict(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "role": self.role,
            "address": self.address,
            "port": self.port,
            "result": self.outcome,
            "ms": self.ms,
            "detail": self.detail or None,
        }


# -- the probe's output lines ----------------------------------------------------------------------


@dataclass(frozen=True)
class Listening:
    address: str
    port: int
    role: Role


@dataclass(frozen=True)
class Busy:
    port: int
    holder: str  # "python3 (pid 812)"; "" when /proc could not tell (another user's, without root)
    #: the runs of bootstrap holding it (well-formed run ids, checked on both sides)
    runs: tuple[str, ...] = ()


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class InboxAt:
    path: str  # the listener's FIFO: one "connect ..." line there makes it connect (probes/reach.py)


@dataclass(frozen=True)
class Connected:
    """The listener's connections (asked through its inbox) are all reported."""


@dataclass(frozen=True)
class Done:
    how: str  # "complete", "deadline", "stopped"


@dataclass(frozen=True)
class ProbeError:
    message: str


@dataclass(frozen=True)
class Clock:
    unix_time: float  # the node's wall clock when the connector started


ListenerEvent = Listening | Busy | PortRange | InboxAt | Ready | Done | Connected | ProbeError


@dataclass(frozen=True)
class ConnectResult:
    index: int
    outcome: Outcome
    ms: float | None
    target: str
    detail: str


def _role(word: str) -> Role | None:
    return "mesh" if word == "mesh" else "rendezvous" if word == "rendezvous" else None


def parse_listener_line(line: str) -> ListenerEvent | None:
    """One line of ``cbt-reach listen`` output; None for anything else (a login banner, a typo)."""
    words = line.split()
    if not words:
        return None
    head, rest = words[0], words[1:]
    try:
        if head == "listening" and len(rest) == 4 and rest[0] == "on":
            role = _role(rest[3])
            return Listening(rest[1], int(rest[2]), role) if role else None
        if head == "busy" and len(rest) >= 2:  # busy PORT RUNS [HOLDER...] (RUNS: "-" for none)
            runs = tuple(r for r in rest[1].split(",") if is_run_id(r) and r != "latest")
            return Busy(int(rest[0]), line.split(None, 3)[3].strip() if len(rest) > 2 else "", runs)
        if head == "range" and len(rest) == 2:
            return PortRange(int(rest[0]), int(rest[1]))
        if head == "inbox" and rest:
            return InboxAt(line.split(None, 1)[1].strip())
        if head == "connected" and not rest:
            return Connected()
        if head == "ready" and len(rest) == 1:
            return Ready(int(rest[0]))
        if head == "done" and len(rest) == 1:
            return Done(rest[0])
        if head == "error" and rest:
            return ProbeError(line.split(None, 1)[1].strip())
    except ValueError:
        return None
    return None


def parse_clock_line(line: str) -> Clock | None:
    """``clock UNIX_TIME``, the first line of ``cbt-reach connect``; None for anything else."""
    words = line.split()
    if len(words) != 2 or words[0] != "clock":
        return None
    try:
        return Clock(float(words[1]))
    except ValueError:
        return None


def parse_connect_line(line: str) -> ConnectResult | None:
    """``result INDEX OUTCOME MS TARGET DETAIL`` of ``cbt-reach connect``; None for anything else."""
    words = line.split()
    if len(words) != 6 or words[0] != "result" or words[2] not in _PROBE_OUTCOMES:
        return None
    try:
        index, ms = int(words[1]), float(words[3])
    except ValueError:
        return None
    detail = "" if words[5] == "-" else words[5]
    return ConnectResult(index, _PROBE_OUTCOMES[words[2]], ms, words[4], detail)


# -- verdicts: pure ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeFailure:
    """A node whose probe could not run (no interpreter, crash, lost connection): no measurement."""

    reason: str
    fix: str


def _names(items: Iterable[str]) -> str:
    return ", ".join(dict.fromkeys(items))


def _blame(pairs: Sequence[Pair]) -> dict[Pair, str]:
    """The node whose firewall most likely broke each failed pair.

    Usually the target's (incoming rules are where hosts filter). But a source that reaches none of
    its peers while they are reached by others drops outgoing traffic or the replies itself (a
    ``drop`` without ``ct state established,related accept``).
    """
    reached_by: dict[str, set[str]] = defaultdict(set)
    attempts: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        if p.source == p.target:  # local delivery proves nothing about the network between hosts
            continue
        attempts[p.source].append(p)
        if p.ok:
            reached_by[p.target].add(p.source)
    isolated = {source for source, tried in attempts.items() if not any(p.ok for p in tried)}
    blame: dict[Pair, str] = {}
    for p in pairs:
        if p.ok:
            continue
        if p.source != p.target and p.source in isolated and reached_by[p.target] - {p.source}:
            blame[p] = p.source
        else:
            blame[p] = p.target
    return blame


def _unresolved(p: Pair) -> bool:
    """A connection that failed before any packet: the name did not resolve (getaddrinfo's negative
    error codes: -2 unknown name, -3 no answer from the resolver, -5 no address)."""
    return p.outcome == "error" and p.detail.startswith("-") and p.detail[1:].isdigit()


def _cannot_reach(p: Pair, master: str) -> str:
    where = f"{p.address}:{p.port}"
    if p.role == "rendezvous" and p.source == p.target:
        return f"cannot reach its own rendezvous port {where} ({p.explain()})"
    if p.role == "rendezvous":
        return f"cannot reach master {master} {where} ({p.explain()})"
    return f"cannot reach {p.target} {where} ({p.explain()})"


def _not_reachable_from(incoming: Sequence[Pair], port: int) -> list[str]:
    groups: dict[tuple[Role, str], list[str]] = {}
    for p in incoming:
        groups.setdefault((p.role, p.explain()), []).append(p.source)
    texts = []
    for (role, explain), sources in groups.items():
        what = f"port {port} not reachable" if role == "rendezvous" else "not reachable"
        texts.append(f"{what} from {_names(sources)} ({explain})")
    return texts


def _allow_fix(
    name: str, sources: Sequence[str], master: str, port: int, addresses: str, span: tuple[int, int] | None
) -> str:
    ephemeral = f"ephemeral ports ({span[0]}-{span[1]})" if span else "ephemeral ports"
    ports = f"port {port} and to {ephemeral}" if name == master else ephemeral
    return (
        f"{name}'s firewall probably blocks incoming TCP from {_names(sources)}: allow TCP from the "
        f"cluster's addresses ({addresses}) to {ports} on {name}; opening only the rendezvous port is "
        "not enough: gloo and NCCL listen on random ports. `bootstrap firewall` adds exactly these rules "
        "(the main pipeline runs it on clusters of 2+ nodes; docs/firewall.md)"
    )


def build_verdicts(
    names: Sequence[str],
    addresses: Mapping[str, str],
    master: str,
    port: int,
    pairs: Sequence[Pair],
    *,
    busy: Busy | None = None,
    failures: Mapping[str, ProbeFailure] | None = None,
    ranges: Mapping[str, tuple[int, int]] | None = None,
    seconds: float | None = None,
    from_default: bool = False,
) -> dict[str, Verdict]:
    """One verdict per node from every measured pair (see the module docstring for the wording).
    ``from_default``: the inventory is the embedded default (a port change needs a copy of it)."""
    failures = failures or {}
    ranges = ranges or {}
    blame = _blame(pairs)
    cluster_addresses = _names(addresses[n] for n in names)
    mesh_pairs = sum(1 for p in pairs if p.role == "mesh")
    untested = [n for n in names if n in failures and n != master]
    verdicts: dict[str, Verdict] = {}
    for name in names:
        data: dict[str, Any] = {
            "master": master,
            "port": port,
            "address": addresses[name],
            "ephemeral_range": list(ranges[name]) if name in ranges else None,
            "pairs": [p.public_dict() for p in pairs if name in (p.source, p.target)],
        }
        if name == master:
            data["port_busy"] = busy is not None
            if busy is not None:
                data["port_holder"] = busy.holder or None
        if seconds is not None:
            data["seconds"] = round(seconds, 3)
        if name in failures:
            verdicts[name] = fail(CHECK, failures[name].reason, failures[name].fix, **data)
            continue

        reasons: list[str] = []
        fixes: list[str] = []
        if busy is not None and name == master:
            by = f" (by {busy.holder})" if busy.holder else ""
            reasons.append(f"port {port} is already in use on the master{by}")
            from orchestrator.resources import default_inventory

            fixes += [
                f"a run of bootstrap holds it: `bootstrap stop --run {run}` ends it" for run in busy.runs
            ]
            copy = (
                f" (the embedded default: copy it first, `cp {default_inventory()} hosts.yaml`, add the "
                "line there, then `bootstrap -i hosts.yaml`)"
                if from_default
                else ""
            )
            fixes.append(
                f"stop that program or choose another cluster port: `port: {port + 1}` under `cluster:` "
                f"in the inventory{copy}"
            )
        # a name the source cannot resolve (an ~/.ssh/config alias only this machine knows): its own
        # failure, said by it; no firewall is to blame on either side
        unresolved = sorted({p.address for p in pairs if p.source == name and not p.ok and _unresolved(p)})
        outgoing = [p for p in pairs if p.source == name and not p.ok and not _unresolved(p)]
        incoming = [
            p for p in pairs if p.target == name and p.source != name and not p.ok and not _unresolved(p)
        ]
        if unresolved:
            reasons.append(f"cannot resolve {_names(unresolved)} on this node (a name it does not know)")
            fixes.append(
                f"write the nodes' IP addresses as their host: in the inventory (an ~/.ssh/config alias is "
                f"known to this machine only), or add {_names(unresolved)} to /etc/hosts on {name}"
            )
        reasons += [_cannot_reach(p, master) for p in outgoing]
        reasons += _not_reachable_from(incoming, port)
        blocked_in = [p.source for p in incoming if blame[p] == name]
        if blocked_in:
            fixes.append(_allow_fix(name, blocked_in, master, port, cluster_addresses, ranges.get(name)))
        if any(p.target == name for p in outgoing):
            # connections to a local address go through the loopback interface
            fixes.append(
                f"{name}'s firewall blocks connections to its own address: allow TCP on the loopback "
                "interface (nftables: `iif lo accept`)"
            )
        if any(blame[p] == name and p.source == name != p.target for p in outgoing):
            fixes.append(
                f"{name} reaches none of its peers although others reach them: its firewall probably "
                "drops outgoing TCP or the replies; allow outgoing TCP and the replies on "
                f"{name} (nftables: `ct state established,related accept`)"
            )
        elsewhere = [blame[p] for p in outgoing + incoming if blame[p] != name]
        if elsewhere:
            whose = "its" if len(set(elsewhere)) == 1 else "their"
            fixes.append(f"the likely cause is on {_names(elsewhere)}: see {whose} fix")

        if busy is not None and name != master:
            reasons.append("master port busy: skipped")
            fixes.append(f"free port {port} on {master} (see its verdict)")
        elif master in failures and name != master:
            reasons.append(f"master {master}'s probe failed: master port not tested")
            fixes.append(f"see {master}'s verdict")
        if outgoing or incoming or unresolved or (busy is not None and name == master):
            verdicts[name] = fail(CHECK, "; ".join(reasons), "; ".join(fixes), **data)
            continue
        if reasons:
            verdicts[name] = warn(CHECK, "; ".join(reasons), "; ".join(fixes), **data)
            continue
        text = (
            f"master port {port} free and reachable from all; "
            f"full mesh on ephemeral ports ok ({mesh_pairs} pairs)"
        )
        others = [n for n in untested if n != name]
        if others:
            verdicts[name] = warn(
                CHECK,
                f"{text}; {_names(others)} not tested (probe failed)",
                f"see the verdict of {_names(others)}",
                **data,
            )
        else:
            verdicts[name] = ok(CHECK, text, **data)
    return verdicts
