"""Linux firewalls: find the one that decides (one round trip), read our rules, write the commands.

Detection order: ufw (active), firewalld (running), then what the kernel really evaluates: nftables base
chains hooked at ``input`` (native tables, and iptables-nft's ``ip filter INPUT``) and the legacy
iptables ``INPUT`` chain. A chain *filters* when its policy is drop or a drop/reject is reachable from it.

Why rules go INTO the filtering chains: nftables evaluates every base chain on a hook and a packet must
be accepted by each of them; an ``accept`` in a table of our own ends only our chain, while the host's
``policy drop`` still drops (nftables wiki, "Configuring chains": base chain priority; FIELD_NOTES.md).
So each rule is inserted at the top of every filtering chain, tagged with a comment, and found again
by that comment. ufw and firewalld own their rulesets: we go through them (a rule comment for ufw, a
firewalld policy object of our own whose name is the tag).

Everything here is pure except nothing: the detection *script* is text, the parsers take its output,
the planners return shell text. The step module runs them.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.facts.base import split_sections
from orchestrator.facts.network import Addresses, InterfaceAddress, Interfaces, MasterRoute, Route
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
    reconcile,
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


# -- detection ----------------------------------------------------------------------------------------


def detection_sections(platform: Platform, *, master_host: str, ids: ClusterTag) -> list[tuple[str, str]]:
    """``(name, shell)`` sections of the one detection round trip (run as root: listing rulesets
    needs CAP_NET_ADMIN). Each section's exit code says whether the tool exists (127) or is off.
    Our firewalld policy and persisted nft file are looked for under their current and legacy names."""
    q = platform.quote
    persist_file, legacy_file = nft_persist_file(ids.tag), nft_persist_file(ids.legacy)
    legacy_include = f'include "{legacy_file}"'
    policies = " ".join(q(p) for p in dict.fromkeys((ids.policy, ids.legacy_policy)))
    return [
        ("route", MasterRoute(master_host).command(platform)),
        ("addresses", Addresses().command(platform)),
        ("interfaces", Interfaces().command(platform)),
        ("range", "cat /proc/sys/net/ipv4/ip_local_port_range"),
        (
            "ufw",
            # `ufw` is a Python program (about a second): asked only when its config says enabled
            "command -v ufw >/dev/null 2>&1 || exit 127\n"
            "grep -qs '^ENABLED=yes' /etc/ufw/ufw.conf || { echo 'Status: inactive'; exit 0; }\n"
            "ufw status\necho '@@added'\nufw show added",
        ),
        (
            "firewalld",
            # firewall-cmd too (and slower when no daemon answers): asked only when firewalld runs
            "command -v firewall-cmd >/dev/null 2>&1 || exit 127\n"
            "if command -v pgrep >/dev/null 2>&1 && ! pgrep -x firewalld >/dev/null; then exit 3; fi\n"
            "firewall-cmd --state || exit 3\n"
            f"for p in {policies}; do\n"
            '  echo "@@policy $p"\n'
            "  echo '@@runtime'; firewall-cmd --info-policy=\"$p\"\n"
            "  echo '@@permanent'; firewall-cmd --permanent --info-policy=\"$p\"\n"
            "  echo '@@description'; firewall-cmd --permanent --policy=\"$p\" --get-description\n"
            "done\nexit 0",
        ),
        ("nft", "command -v nft >/dev/null 2>&1 || exit 127\nnft -j list ruleset"),
        (
            "iptables_nft",
            # iptables-nft lists nothing it did not create; `-S` never creates a table
            "command -v iptables-nft >/dev/null 2>&1 || exit 127\niptables-nft -S INPUT",
        ),
        (
            "iptables_legacy",
            # only when legacy tables exist in this network namespace: listing would load them
            "grep -qx filter /proc/net/ip_tables_names 2>/dev/null || exit 3\n"
            "command -v iptables-legacy >/dev/null 2>&1 || exit 127\niptables-legacy -S INPUT",
        ),
        (
            "persist",
            f"[ -f {q(NFT_CONF)} ] && echo nftables.conf\n"
            f"[ -f {q(persist_file)} ] && grep -qF {q(persist_file)} {q(NFT_CONF)} && echo included\n"
            # the file of the legacy tag, or its include line alone: removed (a rerun persists anew)
            f"{{ [ -f {q(legacy_file)} ] || grep -qxF {q(legacy_include)} {q(NFT_CONF)}; }} && echo legacy\n"
            f"[ -f {q(IPTABLES_RULES)} ] && echo rules.v4\nexit 0",
        ),
    ]


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


@dataclass
class Detection:
    """What one node runs and what of ours is on it."""

    targets: list[Target]
    ephemeral: PortRange | None
    route: Route | None
    addresses: tuple[InterfaceAddress, ...]
    interfaces: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    persist: set[str] = field(default_factory=set)  # "nftables.conf", "included", "legacy", "rules.v4"

    @property
    def kind(self) -> str:
        """The firewall in charge, for the summary ("none" when nothing filters)."""
        kinds = sorted({t.kind for t in self.targets if t.filtering})
        return "+".join(kinds) if kinds else "none"


def parse_port_range(text: str) -> PortRange | None:
    words = text.split()
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return None
    try:
        return PortRange(int(words[0]), int(words[1]))
    except ValueError:
        return None


def detect(stdout: str, token: str, ids: ClusterTag) -> Detection:
    """Decide from the framed output of :func:`detection_sections` (pure: tested on recorded output)."""
    sections = split_sections(stdout, token)

    def out(name: str) -> tuple[str, int]:
        return sections.get(name, ("", 127))

    route: Route | None = None
    text, code = out("route")
    if "route" in sections:
        try:
            route = MasterRoute("").parse(text, code)
        except ValueError:
            route = None
    addresses: tuple[InterfaceAddress, ...] = ()
    text, code = out("addresses")
    if "addresses" in sections:
        try:
            addresses = Addresses().parse(text, code)
        except ValueError:
            addresses = ()
    interfaces: tuple[str, ...] = ()
    text, code = out("interfaces")
    if "interfaces" in sections:
        try:
            interfaces = Interfaces().parse(text, code)
        except ValueError:
            interfaces = ()
    ephemeral = parse_port_range(out("range")[0])
    persist = {line.strip() for line in out("persist")[0].splitlines() if line.strip()}
    detection = Detection([], ephemeral, route, addresses, interfaces, persist=persist)
    if ephemeral is None:
        detection.notes.append("could not read /proc/sys/net/ipv4/ip_local_port_range")

    ufw_text, ufw_code = out("ufw")
    if ufw_code != 127 and re.search(r"^Status: active", ufw_text, re.M):
        detection.targets.append(Target("ufw", "ufw", True, parse_ufw_added(ufw_text, ids)))
        return detection
    fwd_text, fwd_code = out("firewalld")
    if fwd_code == 0 and fwd_text.splitlines()[:1] == ["running"]:
        current = parse_firewalld(fwd_text, ids.policy, ids)
        if current is None:
            detection.notes.append(
                f"firewalld policy {ids.policy} exists but is not this cluster's (its description is "
                f"not {ids.tag}): left alone; rename that policy, or this cluster"
            )
        else:
            detection.targets.append(current)
        if ids.legacy_policy != ids.policy:
            legacy = parse_firewalld(fwd_text, ids.legacy_policy, ids, legacy=True)
            if legacy is not None and (legacy.exists or legacy.permanent_exists):
                detection.targets.append(legacy)
        return detection

    nft_text, nft_code = out("nft")
    ipt_nft_text, ipt_nft_code = out("iptables_nft")
    if nft_code == 0 and nft_text.strip():
        try:
            doc = json.loads(nft_text)
        except ValueError:
            detection.notes.append("`nft -j list ruleset` printed something that is not JSON")
            doc = {"nftables": []}
        detection.targets.extend(nft_targets(doc, ids, iptables_nft=ipt_nft_code == 0))
        if ipt_nft_code == 0:
            for target in detection.targets:
                if target.kind == "iptables":
                    target.present = parse_iptables_rules(ipt_nft_text, ids)
    legacy_text, legacy_code = out("iptables_legacy")
    if legacy_code == 0:
        present = parse_iptables_rules(legacy_text, ids)
        filtering = iptables_filters(legacy_text)
        if filtering or present:
            detection.targets.append(
                Target("iptables", "iptables-legacy INPUT", filtering, present, binary="iptables-legacy")
            )
    return detection


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
    for line in text.splitlines():
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
    for line in text.splitlines():
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
    _, _, added = text.partition("@@added")
    found: list[Present] = []
    for line in added.splitlines():
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


# -- firewalld ----------------------------------------------------------------------------------------

_RICH_RE = re.compile(
    r'rule family="ipv4" source address="(?P<source>[0-9./]+)" '
    r'port port="(?P<port>[0-9-]+)" protocol="(?P<protocol>tcp|udp)" accept'
)


def rich_rule(rule: Rule) -> str:
    return (
        f'rule family="ipv4" source address="{rule.source}" port port="{rule.ports}" '
        f'protocol="{rule.protocol}" accept'
    )


def _rich_rules(block: str) -> list[Present]:
    found: list[Present] = []
    for line in block.splitlines():
        line = line.strip()
        if not line.startswith("rule "):
            continue
        match = _RICH_RE.fullmatch(line)
        rule = None
        if match:
            try:
                protocol = protocol_of(match["protocol"])
                if protocol is not None:
                    rule = Rule(normalize_source(match["source"]), PortRange.parse(match["port"]), protocol)
            except ValueError:
                rule = None
        found.append(Present(rule, line))
    return found


def _policy_block(text: str, policy: str) -> str:
    """The detection's lines about ``policy`` (between ``@@policy NAME`` and the next one)."""
    blocks = re.split(r"^@@policy (\S+)$", text, flags=re.M)
    for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
        if name == policy:
            return body
    return ""


def parse_firewalld(text: str, policy: str, ids: ClusterTag, *, legacy: bool = False) -> Target | None:
    """``--info-policy`` of ``policy``, runtime and permanent (absent: the command printed nothing),
    as a Target; None when a policy of that name exists whose description is not our tag (the
    current one, or for the legacy name the legacy one): another cluster's, never touched."""
    block = _policy_block(text, policy)
    _, _, rest = block.partition("@@runtime")
    runtime, _, rest = rest.partition("@@permanent")
    permanent, _, description = rest.partition("@@description")
    label = f"firewalld policy {policy}" + (" (legacy name)" if legacy else "")
    target = Target("firewalld", label, not legacy, policy=policy, legacy=legacy)
    target.exists = runtime.strip().startswith(policy)
    target.permanent_exists = permanent.strip().startswith(policy)
    # we create policies with our tag as description: a policy of this name without it (a digest
    # collision of the short name, or a policy of someone else's) is left alone
    if target.permanent_exists and description.strip() != (ids.legacy if legacy else ids.tag):
        return None
    target.present = _rich_rules(runtime) if target.exists else []
    target.permanent = _rich_rules(permanent) if target.permanent_exists else []
    return target


def firewalld_commands(
    platform: Platform,
    target: Target,
    wanted: Sequence[Rule],
    tag: str,
    *,
    persist: bool,
    remove: bool,
) -> tuple[Changes, list[str]]:
    """Rich rules in a firewalld policy of our own (ingress ANY -> HOST, before the zones).

    A policy, not a zone: a zone bound to the peers' addresses would take over *all* their traffic
    (ssh included) since firewalld dropped zone drifting; a policy only adds accepts and lets the rest
    continue to the zones. firewalld creates policies only in the permanent configuration, so the
    first run adds it there and reloads once; rules go to runtime, and also to permanent with persist.
    The policy of the legacy name (``target.legacy``) is always removed, rules and all.
    """
    q = platform.quote
    fc = "firewall-cmd"
    policy = target.policy
    if target.legacy:
        wanted, remove = [], True
    commands: list[str] = []
    runtime = reconcile(wanted, target.present)
    if not remove and not target.permanent_exists:
        commands += [
            f"{fc} --permanent --new-policy={q(policy)}",
            f"{fc} --permanent --policy={q(policy)} --set-description={q(tag)}",
            f"{fc} --permanent --policy={q(policy)} --add-ingress-zone=ANY",
            f"{fc} --permanent --policy={q(policy)} --add-egress-zone=HOST",
            f"{fc} --permanent --policy={q(policy)} --set-priority=-100",
        ]
    if not remove and not target.exists:
        commands.append(f"{fc} --reload")
    for entry in runtime.delete:
        commands.append(f"{fc} --policy={q(policy)} --remove-rich-rule={q(entry.ref)}")
    for rule in runtime.add:
        commands.append(f"{fc} --policy={q(policy)} --add-rich-rule={q(rich_rule(rule))}")
    permanent = reconcile(wanted if persist else [], target.permanent)
    for entry in permanent.delete:
        commands.append(f"{fc} --permanent --policy={q(policy)} --remove-rich-rule={q(entry.ref)}")
    for rule in permanent.add:
        commands.append(f"{fc} --permanent --policy={q(policy)} --add-rich-rule={q(rich_rule(rule))}")
    if remove and target.permanent_exists:
        commands.append(f"{fc} --permanent --delete-policy={q(policy)}")
    return runtime, commands
