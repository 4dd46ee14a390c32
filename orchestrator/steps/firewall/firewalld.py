"""firewalld: our rules as rich rules in a firewalld policy of our own (its description is our tag),
read back from the detection's ``--info-policy`` sections, and the ``firewall-cmd`` commands that
reconcile them, in the runtime and, when persisting, the permanent configuration."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator import records
from orchestrator.platforms import Platform, PosixShell
from orchestrator.steps.firewall.linux import Target
from orchestrator.steps.firewall.rules import (
    Changes,
    ClusterTag,
    PortRange,
    Present,
    Rule,
    normalize_source,
    protocol_of,
    reconcile,
)

__all__ = [
    "FirewalldAnswers",
    "firewalld_answers",
    "firewalld_commands",
    "firewalld_section",
    "parse_firewalld",
    "rich_rule",
]

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
    for line in block.split("\n"):
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


#: what is asked about each policy of ours: answer kind -> the firewall-cmd arguments
_ASKED = {
    "runtime": ["--info-policy={}"],
    "permanent": ["--permanent", "--info-policy={}"],
    "description": ["--permanent", "--policy={}", "--get-description"],
}


def firewalld_section(platform: PosixShell, policies: Sequence[str], nonce: str) -> str:
    """The detection's firewalld section: exit 127 without firewall-cmd, 3 when firewalld does not
    run (firewall-cmd is slow when no daemon answers: asked only when one runs); else the daemon's
    state (``running``), then per policy in ``policies`` three answers, each a record of ``nonce``
    (``PosixShell.section_answer``): ``runtime POLICY`` and ``permanent POLICY`` (its
    ``--info-policy``), ``description POLICY``. Whatever a policy holds (a description is any text)
    stays inside its own answer."""
    lines = [
        "command -v firewall-cmd >/dev/null 2>&1 || exit 127",
        "if command -v pgrep >/dev/null 2>&1 && ! pgrep -x firewalld >/dev/null; then exit 3; fi",
        "firewall-cmd --state || exit 3",
    ]
    for policy in dict.fromkeys(policies):
        for which, args in _ASKED.items():
            argv = ["firewall-cmd", *(a.format(policy) for a in args)]
            lines.append(
                f"{platform.join(argv)} 2>/dev/null | {platform.section_answer(nonce, which, policy)}"
            )
    return "\n".join([*lines, "exit 0"])


@dataclass(frozen=True)
class FirewalldAnswers:
    """What the detection's firewalld section said: whether the daemon runs, and each answer about a
    policy by (kind, policy)."""

    running: bool
    said: Mapping[tuple[str, str], str]


def firewalld_answers(text: str, code: int, nonce: str) -> FirewalldAnswers:
    """The answers of :func:`firewalld_section` (its output and exit code, its records' ``nonce``)."""
    running = code == 0 and records.plain(text, nonce).split("\n", 1)[0].strip() == "running"
    said = {(r.kind, r.text(0)): r.text(1) for r in records.decode(text, nonce) if len(r.fields) == 2}
    return FirewalldAnswers(running, said)


def parse_firewalld(
    answers: FirewalldAnswers, policy: str, ids: ClusterTag, *, legacy: bool = False
) -> Target | None:
    """``--info-policy`` of ``policy``, runtime and permanent (absent: the command printed nothing),
    as a Target; None when a policy of that name exists whose description is not our tag (the
    current one, or for the legacy name the legacy one): another cluster's, never touched."""
    runtime, permanent, description = (answers.said.get((which, policy), "") for which in _ASKED)
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
