"""Linux firewalls: find the one that decides, and the rules of ours on it, in one round trip.

Detection order: ufw (active), firewalld (running), then what the kernel really evaluates: nftables base
chains hooked at ``input`` (native tables, and iptables-nft's ``ip filter INPUT``) and the legacy
iptables ``INPUT`` chain. A chain *filters* when its policy is drop or a drop/reject is reachable from it.
The same round trip reads the node's route to the master, its addresses and interfaces, its ephemeral
port range and how rules persist there. Pure: the *script* is text, :func:`detect` parses its output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator import records
from orchestrator.facts.base import split_sections
from orchestrator.facts.network import Addresses, InterfaceAddress, Interfaces, MasterRoute, Route
from orchestrator.platforms import Platform
from orchestrator.steps.firewall.firewalld import firewalld_answers, firewalld_section, parse_firewalld
from orchestrator.steps.firewall.linux import (
    IPTABLES_RULES,
    NFT_CONF,
    Target,
    iptables_filters,
    nft_persist_file,
    nft_targets,
    parse_iptables_rules,
    parse_ufw_added,
)
from orchestrator.steps.firewall.rules import ClusterTag, PortRange

__all__ = ["Detection", "detect", "detection_sections", "parse_port_range"]


def detection_sections(
    platform: Platform, *, master_host: str, ids: ClusterTag, nonce: str, network: bool = True
) -> list[tuple[str, str]]:
    """``(name, shell)`` sections of the one detection round trip (run as root: listing rulesets
    needs CAP_NET_ADMIN). Each section's exit code says whether the tool exists (127) or is off.
    ufw's and firewalld's several answers are records of ``nonce`` inside their section
    (``PosixShell.section_answer``; :func:`detect_sections` reads them with the same nonce): no rule
    comment or policy description can end one answer or pass for another.
    Our firewalld policy and persisted nft file are looked for under their current and legacy names.
    ``network=False``: without the route, addresses and interfaces (a caller that has them already:
    the main pipeline's first round trip reads them as the node's facts)."""
    sh = platform.as_posix()
    if sh is None:
        raise TypeError(f"the Linux firewall detection is POSIX sh, not {platform.name}")
    q = sh.quote
    persist_file, legacy_file = nft_persist_file(ids.tag), nft_persist_file(ids.legacy)
    legacy_include = f'include "{legacy_file}"'
    own = [
        ("route", MasterRoute(master_host).command(sh)),
        ("addresses", Addresses().command(sh)),
        ("interfaces", Interfaces().command(sh)),
    ]
    return [
        *(own if network else []),
        # (cat: dash's `read` takes a byte at a time, and this sysctl answers only a read from 0)
        ("range", "cat /proc/sys/net/ipv4/ip_local_port_range"),
        (
            "ufw",
            # `ufw` is a Python program (about a second): asked only when its config says enabled.
            # Configuration files are read by builtins (`read`, `case`): no grep process per node
            "command -v ufw >/dev/null 2>&1 || exit 127\n"
            f"{_lines('/etc/ufw/ufw.conf', ('ENABLED=yes*', 'e'))}\n"
            'if [ -n "$e" ]; then\n'
            f"  ufw status | {sh.section_answer(nonce, 'status')}\n"
            f"  ufw show added | {sh.section_answer(nonce, 'added')}\n"
            # the answer of a disabled ufw is known here: framed here (no encoder process)
            f"else printf %s {q(records.record(nonce, 'status', 'Status: inactive' + chr(10)))}; fi",
        ),
        ("firewalld", firewalld_section(sh, (ids.policy, ids.legacy_policy), nonce)),
        ("nft", "command -v nft >/dev/null 2>&1 || exit 127\nnft -j list ruleset"),
        (
            "iptables_nft",
            # iptables-nft lists nothing it did not create; `-S` never creates a table
            "command -v iptables-nft >/dev/null 2>&1 || exit 127\niptables-nft -S INPUT",
        ),
        (
            "iptables_legacy",
            # only when legacy tables exist in this network namespace: listing would load them
            f"{_lines('/proc/net/ip_tables_names', ('filter', 't'))}\n"
            '[ -n "$t" ] || exit 3\n'
            "command -v iptables-legacy >/dev/null 2>&1 || exit 127\niptables-legacy -S INPUT",
        ),
        (
            "persist",
            # nftables.conf read once: whether it names our file, whether it holds the legacy include
            f"[ -f {q(NFT_CONF)} ] && echo nftables.conf\n"
            f"{_lines(q(NFT_CONF), (f'*{q(persist_file)}*', 'i'), (q(legacy_include), 'g'))}\n"
            f'[ -f {q(persist_file)} ] && [ -n "$i" ] && echo included\n'
            # the file of the legacy tag, or its include line alone: removed (a rerun persists anew)
            f'{{ [ -f {q(legacy_file)} ] || [ -n "$g" ]; }} && echo legacy\n'
            f"[ -f {q(IPTABLES_RULES)} ] && echo rules.v4\nexit 0",
        ),
    ]


def _lines(path: str, *tests: tuple[str, str]) -> str:
    """Shell text reading the file ``path`` (a shell word) line by line with builtins: per ``(pattern,
    variable)``, the variable is 1 when a line matches the ``case`` pattern, else empty (also when the
    file cannot be read)."""
    empty = " ".join(f"{variable}=" for _, variable in tests)
    cases = "; ".join(f"case $l in {pattern}) {variable}=1 ;; esac" for pattern, variable in tests)
    return f'{empty}\n{{ while IFS= read -r l || [ -n "$l" ]; do {cases}; done <{path}; }} 2>/dev/null'


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


def detect(stdout: str, token: str, ids: ClusterTag, nonce: str | None = None) -> Detection:
    """Decide from the output of :func:`detection_sections` framed by ``Platform.sectioned`` with
    ``token`` (pure: tested on recorded output); ``nonce``: the sections' own (default: ``token``)."""
    return detect_sections(split_sections(stdout, token), ids, nonce or token)


def detect_sections(sections: Mapping[str, tuple[str, int]], ids: ClusterTag, nonce: str) -> Detection:
    """Decide from the answers of :func:`detection_sections` (name -> output, exit code), whose
    answers inside a section are records of ``nonce``."""

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
    persist = set(out("persist")[0].split())  # the words our own echo printed
    detection = Detection([], ephemeral, route, addresses, interfaces, persist=persist)
    if ephemeral is None:
        detection.notes.append("could not read /proc/sys/net/ipv4/ip_local_port_range")

    ufw_text, ufw_code = out("ufw")
    ufw = {r.kind: r.text(0) for r in records.decode(ufw_text, nonce)} if ufw_code != 127 else {}
    if ufw.get("status", "").split("\n", 1)[0] == "Status: active":  # ufw's first line
        detection.targets.append(Target("ufw", "ufw", True, parse_ufw_added(ufw.get("added", ""), ids)))
        return detection
    firewalld = firewalld_answers(*out("firewalld"), nonce)
    if firewalld.running:
        current = parse_firewalld(firewalld, ids.policy, ids)
        if current is None:
            detection.notes.append(
                f"firewalld policy {ids.policy} exists but is not this cluster's (its description is "
                f"not {ids.tag}): left alone; rename that policy, or this cluster"
            )
        else:
            detection.targets.append(current)
        if ids.legacy_policy != ids.policy:
            legacy = parse_firewalld(firewalld, ids.legacy_policy, ids, legacy=True)
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
