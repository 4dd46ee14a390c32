"""Linux firewalls: where our rules live (:class:`Target`), and for nftables, iptables and ufw how the
rules of ours are read back and what commands write and remove them.

Why rules go INTO the filtering chains: nftables evaluates every base chain on a hook and a packet must
be accepted by each of them; an ``accept`` in a table of our own ends only our chain, while the host's
``policy drop`` still drops (nftables wiki, "Configuring chains": base chain priority; FIELD_NOTES.md).
So each rule is inserted at the top of every filtering chain, tagged with a comment, and found again
by that comment. ufw and firewalld own their rulesets: we go through them (a rule comment for ufw, a
firewalld policy object of our own whose name is the tag: ``firewalld.py``).

Everything here is pure: the parsers take the detection's output (``linux_detection.py``), the planners
return shell text. The step module runs them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.platforms import Platform
from orchestrator.steps.firewall.rules import (
    TAG_PREFIX,
    Changes,
    ClusterTag,
    PortRange,
    Present,
    Rule,
    normalize_source,
    protocol_of,
)

Kind = Literal["nftables", "iptables", "ufw", "firewalld"]

#: nft and iptables identifiers we are willing to put into a command (anything else is left alone)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")  # .fullmatch only
#: where persisted nftables rules live (Debian/Ubuntu `nftables.service` loads /etc/nftables.conf)
NFT_CONF = "/etc/nftables.conf"
NFT_DIR = "/etc/nftables.d"
#: netfilter-persistent's files (Debian/Ubuntu `iptables-persistent`)
IPTABLES_RULES = "/etc/iptables/rules.v4"
#: nft rule handles: what `delete rule ... handle N` takes
_HANDLE_RE = re.compile(r"[0-9]+")


def nft_persist_file(tag: str) -> str:
    """Where the nft rules tagged ``tag`` are persisted (the current tag's file, or a legacy one)."""
    return f"{NFT_DIR}/{tag.replace(':', '-')}.nft"


@dataclass
class Target:
    """One place rules live: a chain (nftables/iptables), ufw, or our firewalld policy."""

    kind: Kind
    label: str  # for people: "nftables inet filter input", "iptables-nft INPUT", "ufw", ...
    filtering: bool  # False: it only holds stale rules of ours (they are removed, none added)
    present: list[Present] = field(default_factory=list)
    family: str = ""  # nftables
    table: str = ""
    chain: str = ""
    binary: str = ""  # iptables: iptables-nft / iptables-legacy
    exists: bool = True  # firewalld: our policy exists (runtime)
    permanent: list[Present] = field(default_factory=list)  # firewalld: rules in the permanent config
    permanent_exists: bool = False
    policy: str = ""  # firewalld: the policy's name
    legacy: bool = False  # firewalld: the policy of the legacy name (removed with its rules)


# -- nftables -----------------------------------------------------------------------------------------


def _verdicts(expr: Any) -> Iterable[tuple[str, str | None]]:
    """Every verdict in a rule's expression list: ("drop", None), ("jump", "chain"), ..."""
    if isinstance(expr, list):
        for item in expr:
            yield from _verdicts(item)
        return
    if not isinstance(expr, dict):
        return
    for key, value in expr.items():
        if key in ("drop", "reject"):
            yield key, None
        elif key in ("jump", "goto") and isinstance(value, dict):
            yield key, str(value.get("target"))
        elif key == "xt" and isinstance(value, dict) and value.get("type") == "target":
            name = str(value.get("name", "")).upper()
            if name in ("REJECT", "DROP"):  # iptables-nft's REJECT is an xtables target
                yield "reject", None
        elif key in ("vmap", "verdict map") and isinstance(value, dict):
            yield from _verdicts(value.get("data"))
        elif isinstance(value, (list, dict)):
            yield from _verdicts(value)


def _filters(
    family: str, table: str, chain: str, policy: str | None, rules: dict[tuple[str, str, str], list[Any]]
) -> bool:
    """Policy drop, or a drop/reject in the chain or a chain it jumps to (cycles are impossible in
    nftables, but a visited set keeps this safe anyway)."""
    if policy == "drop":
        return True
    seen: set[str] = set()
    stack = [chain]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for expr in rules.get((family, table, name), []):
            for verdict, target in _verdicts(expr):
                if verdict in ("drop", "reject"):
                    return True
                if target:
                    stack.append(target)
    return False


def _match_value(expr: list[Any], protocol: str, field_name: str) -> Any:
    for item in expr:
        match = item.get("match") if isinstance(item, dict) else None
        if not isinstance(match, dict) or match.get("op") not in ("==", "in"):
            continue
        left = match.get("left")
        payload = left.get("payload") if isinstance(left, dict) else None
        if isinstance(payload, dict) and (payload.get("protocol"), payload.get("field")) == (
            protocol,
            field_name,
        ):
            return match.get("right")
    return None


def parse_nft_rule(expr: list[Any]) -> Rule | None:
    """The (source, ports, protocol) of a rule we wrote: ``ip saddr A tcp dport P accept`` (or ``udp
    dport``); None otherwise (also when it matches ports of both protocols: not a rule we write)."""
    if not any(isinstance(i, dict) and "accept" in i for i in expr):
        return None
    source = _match_value(expr, "ip", "saddr")
    found = [(p, v) for p in ("tcp", "udp") if (v := _match_value(expr, p, "dport")) is not None]
    if len(found) != 1:
        return None
    [(name, ports)] = found
    protocol = protocol_of(name)
    if protocol is None:
        return None
    try:
        if isinstance(source, dict) and isinstance(source.get("prefix"), dict):
            prefix = source["prefix"]
            address = normalize_source(f"{prefix['addr']}/{prefix['len']}")
        elif isinstance(source, str):
            address = normalize_source(source)
        else:
            return None
        if isinstance(ports, int):
            port_range = PortRange(ports, ports)
        elif isinstance(ports, dict) and isinstance(ports.get("range"), list):
            low, high = ports["range"]
            port_range = PortRange(int(low), int(high))
        else:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    return Rule(address, port_range, protocol)


def _is_iptables_nft(family: str, table: str, chain: str) -> bool:
    # iptables-nft keeps its INPUT chain in "ip filter"; rules there are iptables' business (native nft
    # rules would make `iptables -L` refuse the table as incompatible)
    return family == "ip" and table == "filter" and chain == "INPUT"


def nft_targets(doc: dict[str, Any], ids: ClusterTag, *, iptables_nft: bool) -> list[Target]:
    """Filtering input chains (IPv4-relevant families) plus any chain holding rules of ours."""
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    chains: list[dict[str, Any]] = []
    rules: dict[tuple[str, str, str], list[Any]] = {}
    ours: dict[tuple[str, str, str], list[Present]] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        if "chain" in item and isinstance(item["chain"], dict):
            chains.append(item["chain"])
        elif "rule" in item and isinstance(item["rule"], dict):
            r = item["rule"]
            key = (str(r.get("family")), str(r.get("table")), str(r.get("chain")))
            expr = r.get("expr") or []
            rules.setdefault(key, []).append(expr)
            comment, handle = r.get("comment"), str(r.get("handle"))
            if isinstance(comment, str) and ids.owns(comment) and _HANDLE_RE.fullmatch(handle):
                present = Present(parse_nft_rule(expr), handle, legacy=ids.is_legacy(comment))
                ours.setdefault(key, []).append(present)
    targets: list[Target] = []
    for c in chains:
        family, table, name = str(c.get("family")), str(c.get("table")), str(c.get("name"))
        key = (family, table, name)
        base_input = c.get("hook") == "input" and c.get("type", "filter") == "filter"
        if family not in ("ip", "inet"):
            continue  # IPv6-only, ARP, bridge, netdev chains never see the cluster's IPv4 TCP
        filtering = base_input and _filters(family, table, name, c.get("policy"), rules)
        if iptables_nft and _is_iptables_nft(family, table, name):
            if filtering:
                targets.append(Target("iptables", "iptables-nft INPUT", True, binary="iptables-nft"))
            continue
        if not (filtering or key in ours):
            continue
        if not all(_NAME_RE.fullmatch(part) for part in (family, table, name)):
            continue  # a name we cannot safely write into a command: left alone
        label = f"nftables {family} {table} {name}"
        targets.append(
            Target("nftables", label, filtering, ours.get(key, []), family=family, table=table, chain=name)
        )
    return targets


def nft_rule_text(target: Target, rule: Rule, tag: str) -> str:
    return (
        f"insert rule {target.family} {target.table} {target.chain} "
        f'ip saddr {rule.source} {rule.protocol} dport {rule.ports} accept comment "{tag}"'
    )


def nft_commands(platform: Platform, changes: Sequence[tuple[Target, Changes]], tag: str) -> list[str]:
    """One ``nft -f -`` transaction: every deletion and insertion at once (all or nothing)."""
    lines: list[str] = []
    for target, change in changes:
        for entry in change.delete:
            lines.append(f"delete rule {target.family} {target.table} {target.chain} handle {entry.ref}")
        for rule in reversed(change.add):  # inserted at the top: reversed keeps them in sorted order
            lines.append(nft_rule_text(target, rule, tag))
    if not lines:
        return []
    return [f"printf '%s\\n' {platform.quote(chr(10).join(lines))} | nft -f -"]


def nft_persist_commands(
    platform: Platform, targets: Sequence[tuple[Target, Sequence[Rule]]], tag: str, *, remove: bool
) -> list[str]:
    """Keep our rules across reboots: a file of ``insert rule`` lines included at the end of
    /etc/nftables.conf (after the tables it inserts into are defined). Removal deletes both."""
    path = nft_persist_file(tag)
    include = f'include "{path}"'
    q = platform.quote
    if remove:
        # rewritten in place from memory: no temporary file beside it, the file keeps its owner and
        # mode, and it works on a bind-mounted file (where sed -i's rename would fail)
        drop_include = (
            f"if grep -qxF {q(include)} {q(NFT_CONF)}; then "
            f'kept="$(grep -vxF {q(include)} {q(NFT_CONF)} || true)"; '
            f"printf '%s\\n' \"$kept\" > {q(NFT_CONF)}; fi"
        )
        return [f"rm -f {q(path)}", f"[ ! -f {q(NFT_CONF)} ] || {{ {drop_include}; }}"]
    body = "\n".join(
        [f"# {tag}: written by cluster-bootstrap (bootstrap firewall --remove deletes it)"]
        + [nft_rule_text(t, r, tag) for t, rules in targets for r in reversed(list(rules))]
    )
    return [
        f"mkdir -p {q(NFT_DIR)}",
        f"printf '%s\\n' {q(body)} > {q(path)}",
        f"grep -qxF {q(include)} {q(NFT_CONF)} || printf '%s\\n' {q(include)} >> {q(NFT_CONF)}",
    ]


# -- iptables -----------------------------------------------------------------------------------------


def iptables_filters(text: str) -> bool:
    """``-S INPUT`` output: policy DROP, or a DROP/REJECT rule."""
    for line in text.split("\n"):  # not splitlines: a comment may hold \x1c, \u2028, ...
        words = line.split()
        if words[:3] == ["-P", "INPUT", "DROP"]:
            return True
        if words[:2] == ["-A", "INPUT"] and "-j" in words[:-1]:
            if_target = words[words.index("-j") + 1]
            if if_target in ("DROP", "REJECT"):
                return True
    return False


def parse_iptables_rules(text: str, ids: ClusterTag) -> list[Present]:
    """Rules of ours in ``-S INPUT`` output; ``ref`` is the rule's spec (what ``-D INPUT`` takes)."""
    found: list[Present] = []
    for line in text.split("\n"):
        if not line.startswith("-A INPUT ") or TAG_PREFIX not in line:
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if "--comment" not in words or not ids.owns(comment := words[words.index("--comment") + 1]):
            continue
        rule: Rule | None = None
        try:
            source = words[words.index("-s") + 1]
            ports = words[words.index("--dport") + 1]
            protocol = protocol_of(words[words.index("-p") + 1])
            if "ACCEPT" in words and protocol is not None:
                rule = Rule(normalize_source(source), PortRange.parse(ports), protocol)
        except (ValueError, IndexError):
            rule = None
        found.append(Present(rule, shlex.join(words[2:]), legacy=ids.is_legacy(comment)))
    return found


def iptables_commands(platform: Platform, target: Target, change: Changes, tag: str) -> list[str]:
    commands = []
    for entry in change.delete:
        commands.append(platform.join([target.binary, "-D", "INPUT", *shlex.split(entry.ref)]))
    for rule in reversed(change.add):  # each goes to the top: before any DROP/REJECT
        argv = [target.binary, "-I", "INPUT", "1", "-s", rule.source, "-p", rule.protocol, "--dport"]
        argv += [rule.ports.colon, "-m", "comment", "--comment", tag, "-j", "ACCEPT"]
        commands.append(platform.join(argv))
    return commands


def iptables_persist_commands(platform: Platform, target: Target, persist: set[str]) -> list[str]:
    """netfilter-persistent's file, when the package that loads it at boot is there."""
    if "rules.v4" not in persist:
        return []
    save = target.binary.replace("iptables", "iptables-save", 1) if target.binary else "iptables-save"
    return [f"{platform.quote(save)} > {platform.quote(IPTABLES_RULES)}"]


# -- ufw ----------------------------------------------------------------------------------------------


def parse_ufw_added(text: str, ids: ClusterTag) -> list[Present]:
    """``ufw show added`` lines with our comment; ``ref`` is the rule as ufw prints it."""
    found: list[Present] = []
    for line in text.split("\n"):
        if not line.startswith("ufw ") or TAG_PREFIX not in line:
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if "comment" not in words or not ids.owns(comment := words[words.index("comment") + 1]):
            continue
        rule: Rule | None = None
        try:
            protocol = protocol_of(words[words.index("proto") + 1]) if "proto" in words else None
            if words[1] == "allow" and protocol is not None:
                source = words[words.index("from") + 1]
                ports = words[words.index("port") + 1]
                rule = Rule(normalize_source(source), PortRange.parse(ports), protocol)
        except (ValueError, IndexError):
            rule = None
        found.append(Present(rule, shlex.join(words[1:]), legacy=ids.is_legacy(comment)))
    return found


def ufw_commands(platform: Platform, change: Changes, tag: str) -> list[str]:
    commands = []
    for entry in change.delete:
        words = shlex.split(entry.ref)
        if "comment" in words:  # ufw matches the rule without its comment
            i = words.index("comment")
            words = words[:i] + words[i + 2 :]
        commands.append(platform.join(["ufw", "delete", *words]))
    for rule in change.add:
        argv = ["ufw", "allow", "proto", rule.protocol, "from", rule.source, "to", "any", "port"]
        argv.append(rule.ports.colon)
        commands.append(platform.join([*argv, "comment", tag]))
    return commands
