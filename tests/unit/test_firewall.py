"""Firewall decisions on recorded detection output, and the exact commands planned from them.

tests/unit/data/firewall/*.txt are the framed output of the real detection script, recorded in scratch
network namespaces (nftables 1.0.6, iptables 1.8.9, ufw 0.36.2; see README.md there). The recorded node
is 198.18.7.12 and routes to the master 198.18.7.11. firewalld and legacy iptables samples are written
inline: firewalld's `--info-policy` format as firewalld 1.3.3 prints it (it runs for real in
tests/integration/test_firewall.py); legacy iptables would load kernel tables machine-wide.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import records
from orchestrator.facts.network import InterfaceAddress
from orchestrator.inventory import Inventory, load_inventory
from orchestrator.platforms import PosixShell
from orchestrator.platforms.powershell import PowerShell
from orchestrator.steps.addresses import Reached, reached_at
from orchestrator.steps.firewall import cluster_addresses, plan_node
from orchestrator.steps.firewall.firewalld import (
    FirewalldAnswers,
    firewalld_answers,
    firewalld_commands,
    parse_firewalld,
    rich_rule,
)
from orchestrator.steps.firewall.linux import (
    Target,
    iptables_commands,
    nft_persist_commands,
    nft_persist_file,
    nft_targets,
    parse_iptables_rules,
    parse_nft_rule,
    parse_ufw_added,
    ufw_commands,
)
from orchestrator.steps.firewall.linux_detection import Detection, detect, detection_sections
from orchestrator.steps.firewall.rules import (
    NTP_PORT,
    TAG_LIMIT,
    ClusterTag,
    PortRange,
    Present,
    Rule,
    cluster_tag,
    node_ports,
    reconcile,
    time_rules,
)
from tests.noderecords import firewall_recorded, sections_said


def _detect(recording: str, token: str, ids: ClusterTag) -> Detection:
    """``detect`` of a recording (tests/unit/data/firewall: readable framing) as the node sends it."""
    return detect(sections_said(token, firewall_recorded(recording, token, ANSWERS)), token, ids, ANSWERS)


DATA = Path(__file__).parent / "data" / "firewall"
TOKEN = "cb-0123456789ab"
#: the nonce of the answers inside the detection's sections (ufw's, firewalld's)
ANSWERS = "cb-a0a1a2a3a4a5"
IDS = ClusterTag("lab")
TAG = IDS.tag  # cluster-bootstrap:lab:<12 hex digits of sha256("lab")>
LEGACY = "cluster-bootstrap:lab"  # what earlier versions wrote, and the recordings carry
POLICY = IDS.policy
EPHEMERAL = "32768-60999"
COMMENTED = ["-m", "comment", "--comment", TAG, "-j", "ACCEPT"]
MASTER, ME, PEER_C, PEER_D = "198.18.7.11", "198.18.7.12", "198.18.7.13", "198.18.7.14"


def recorded(name: str, *, legacy: bool = False) -> Detection:
    """A recording, its rules of ours carrying the current tag (as this version writes them), or with
    ``legacy`` as recorded: with the tag of earlier versions."""
    text = (DATA / f"{name}.txt").read_text()
    if not legacy:
        text = re.sub(re.escape(LEGACY) + r"(?![\w.:-])", TAG, text)
    return _detect(text, TOKEN, IDS)


def inventory(tmp_path: Path, firewall: str = "", name: str = "lab", time: str = "") -> Inventory:
    text = f"cluster:\n  name: {json.dumps(name)}\n  master: a\n  port: 29500\n{firewall}{time}nodes:\n"
    for node, addr in (("a", MASTER), ("b", ME), ("c", PEER_C), ("d", PEER_D)):
        text += f"  - {{name: {node}, host: {addr}, user: root}}\n"
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return load_inventory(path)


def addresses() -> dict[str, str]:
    return {"a": MASTER, "b": ME, "c": PEER_C, "d": PEER_D}


def nft_lines(command: str) -> list[str]:
    """The ruleset text inside ``printf '%s\\n' '<text>' | nft -f -``."""
    words = shlex.split(command)
    assert words[:2] == ["printf", "%s\\n"] and words[3:] == ["|", "nft", "-f", "-"], command
    return words[2].splitlines()


# -- rules -------------------------------------------------------------------------------------------


def test_port_ranges_parse_and_print_in_each_firewalls_spelling() -> None:
    assert PortRange.parse("32768:60999") == PortRange.parse("32768-60999") == PortRange(32768, 60999)
    assert (str(PortRange(29500, 29500)), PortRange(1, 5).colon) == ("29500", "1:5")
    with pytest.raises(ValueError):
        PortRange(10, 5)


def test_rendezvous_port_only_on_master_and_not_twice() -> None:
    eph = PortRange(32768, 60999)
    assert node_ports(is_master=True, rendezvous_port=29500, ephemeral=eph, extra=["6006"]) == [
        PortRange(6006, 6006),
        PortRange(29500, 29500),
        eph,
    ]
    assert node_ports(is_master=False, rendezvous_port=29500, ephemeral=eph, extra=()) == [eph]
    # a rendezvous port inside the ephemeral range needs no rule of its own; nor an extra inside it
    assert node_ports(is_master=True, rendezvous_port=40000, ephemeral=eph, extra=["40001"]) == [eph]


def test_tag_keeps_only_safe_characters_and_policy_names_fit_firewalld() -> None:
    assert cluster_tag("lab") == TAG == f"cluster-bootstrap:lab:{hashlib.sha256(b'lab').hexdigest()[:12]}"
    hostile = ClusterTag("it's $(rm -rf /) lab")
    assert re.fullmatch(r"cluster-bootstrap:it_s___rm_-rf____lab:[0-9a-f]{12}", hostile.tag)
    assert hostile.legacy == "cluster-bootstrap:it_s___rm_-rf____lab"
    long_a, long_b = ClusterTag("a-very-long-cluster-name-1"), ClusterTag("a-very-long-cluster-name-2")
    assert len(long_a.policy) <= 17 and len(long_b.policy) <= 17 and long_a.policy != long_b.policy
    assert re.fullmatch(r"cb-lab-[0-9a-f]{6}", POLICY)
    assert IDS.legacy_policy == "cb-lab"  # the name earlier versions gave it


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("fw test", "fw_test"),  # the same once unsafe characters are replaced
        ("x" * 64 + "-one", "x" * 64 + "-two"),  # the same first 64 characters
        ("Lab", "lab"),  # Windows compares rule groups and names without case
        ("fw/test", "fw:test"),
    ],
)
def test_names_whose_old_tags_collided_get_different_tags_and_names_everywhere(a: str, b: str) -> None:
    one, two = ClusterTag(a), ClusterTag(b)
    assert one.legacy == two.legacy or one.legacy.lower() == two.legacy.lower()  # the old collision
    for attribute in ("tag", "policy", "windows_prefix"):
        assert getattr(one, attribute).lower() != getattr(two, attribute).lower(), attribute
    # each recognises exactly its own tag (and the shared legacy one), never the other's
    assert one.owns(one.tag) and not one.owns(two.tag) and not two.owns(one.tag)
    assert nft_persist_file(one.tag) != nft_persist_file(two.tag)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_every_name_fits_every_firewalls_limits(name: str) -> None:
    ids = ClusterTag(name)
    assert len(ids.tag) <= TAG_LIMIT <= 128  # nft comments: 128 characters; iptables: 256
    assert re.fullmatch(r"cluster-bootstrap:[A-Za-z0-9_.-]{1,48}:[0-9a-f]{12}", ids.tag)
    assert re.fullmatch(r"cb-[A-Za-z0-9_-]{1,7}-[0-9a-f]{6}", ids.policy)  # firewalld: 17
    assert len(ids.windows_prefix + "tcp-32768-60999") <= 100
    assert ids.owns(ids.tag) and ids.owns(ids.legacy) and ids.is_legacy(ids.legacy)
    assert not ids.is_legacy(ids.tag) and not ids.owns(ids.tag + "x") and not ids.owns(ids.tag[:-1])


def test_reconcile_keeps_one_copy_and_removes_duplicates_strays_and_unknown() -> None:
    eph = PortRange(32768, 60999)
    want = [Rule(PEER_C, eph), Rule(PEER_D, eph)]
    present = [
        Present(Rule(PEER_C, eph), "1"),
        Present(Rule(PEER_C, eph), "2"),  # duplicate (an interrupted run)
        Present(Rule("10.9.9.9", eph), "3"),  # a node that left
        Present(None, "4"),  # tagged ours, edited by hand beyond recognition
    ]
    changes = reconcile(want, present)
    assert changes.add == (Rule(PEER_D, eph),)
    assert [p.ref for p in changes.delete] == ["2", "3", "4"]
    assert changes.unchanged == (Rule(PEER_C, eph),)
    assert not reconcile(want, [Present(r, str(i)) for i, r in enumerate(want)]).changed


# -- detection on recorded output ---------------------------------------------------------------------


def test_no_firewall_means_nothing_to_do(tmp_path: Path) -> None:
    d = recorded("none")
    assert d.kind == "none" and d.targets == []
    assert d.ephemeral == PortRange(32768, 60999)
    assert d.route is not None and d.route.source == ME
    result = plan_node(inventory(tmp_path).node("b"), inventory(tmp_path), d, addresses())
    assert result.commands == [] and result.status == "nothing to do"
    assert any("nothing to open" in n for n in result.notes)


def test_accept_only_nftables_does_not_count_as_a_firewall() -> None:
    assert recorded("nft_accept_only").kind == "none"


def test_nftables_drop_policy_rules_go_into_the_deciding_chain(tmp_path: Path) -> None:
    d = recorded("nft_drop")
    [target] = d.targets
    assert (target.kind, target.family, target.table, target.chain, target.filtering) == (
        "nftables",
        "inet",
        "filter",
        "input",
        True,
    )
    # only this cluster's rules are ours: "cluster-bootstrap:other" belongs to another cluster
    assert not any(p.legacy for p in target.present)
    assert sorted((p.rule, p.ref) for p in target.present if p.rule) == [
        (Rule(PEER_C, PortRange(29500, 29500)), "5"),
        (Rule("198.18.7.99", PortRange(32768, 60999)), "6"),
    ]
    inv = inventory(tmp_path)
    result = plan_node(inv.node("b"), inv, d, addresses())  # b is a worker: no rendezvous port
    assert result.ports == [EPHEMERAL] and result.sources == [MASTER, PEER_C, PEER_D]  # not its own
    assert (result.added, result.removed, result.unchanged) == (3, 2, 0)
    [command] = result.commands
    lines = nft_lines(command)
    assert sorted(lines[:2]) == [
        "delete rule inet filter input handle 5",
        "delete rule inet filter input handle 6",
    ]
    assert lines[2:] == [
        f'insert rule inet filter input ip saddr {PEER_D} tcp dport {EPHEMERAL} accept comment "{TAG}"',
        f'insert rule inet filter input ip saddr {PEER_C} tcp dport {EPHEMERAL} accept comment "{TAG}"',
        f'insert rule inet filter input ip saddr {MASTER} tcp dport {EPHEMERAL} accept comment "{TAG}"',
    ]


def test_master_gets_the_rendezvous_port_and_remove_deletes_only_ours(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    d = recorded("nft_drop")
    master = plan_node(inv.node("a"), inv, d, {**addresses(), "a": ME})  # recorded node as the master
    assert master.ports == ["29500", EPHEMERAL, "123/udp"]  # it serves the workers' time (the default)
    # peers c and d (b is the node itself here) x (29500, ephemeral): c:29500 kept, .99 removed;
    # plus UDP 123 from each of them
    assert (master.added, master.removed, master.unchanged) == (5, 1, 1)
    removal = plan_node(inv.node("b"), inv, d, addresses(), remove=True)
    assert (removal.added, removal.removed) == (0, 2)
    lines = sorted(nft_lines(removal.commands[0]))
    assert lines == ["delete rule inet filter input handle 5", "delete rule inet filter input handle 6"]


def test_second_run_with_everything_in_place_is_unchanged(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    d = recorded("nft_drop")
    eph = PortRange(32768, 60999)
    d.targets[0].present = [Present(Rule(a, eph), str(i)) for i, a in enumerate([MASTER, PEER_C, PEER_D])]
    result = plan_node(inv.node("b"), inv, d, addresses())
    assert result.commands == [] and result.status == "unchanged" and result.unchanged == 3


def test_drop_reached_through_a_jump_and_stale_rules_elsewhere(tmp_path: Path) -> None:
    d = recorded("nft_jump_reject")
    by_label = {t.label: t for t in d.targets}
    assert by_label["nftables ip fw input"].filtering  # policy accept, but jumps to a chain that rejects
    stale = by_label["nftables inet stale c"]
    assert not stale.filtering and [p.rule for p in stale.present] == [Rule("10.1.1.1", PortRange(1, 1))]
    inv = inventory(tmp_path)
    result = plan_node(inv.node("b"), inv, d, addresses())
    lines = nft_lines(result.commands[0])
    deletes = [line for line in lines if line.startswith("delete rule inet stale c handle ")]
    inserts = [line for line in lines if line.startswith("insert rule ip fw input ip saddr ")]
    assert len(deletes) == 1 and len(inserts) == 3 and len(lines) == 4  # stale one goes, wherever it is


def test_iptables_nft_rules_are_inserted_before_the_reject(tmp_path: Path) -> None:
    d = recorded("iptables_nft_reject")
    [target] = d.targets
    assert (target.kind, target.binary, target.label) == ("iptables", "iptables-nft", "iptables-nft INPUT")
    assert [p.rule for p in target.present] == [Rule(PEER_C, PortRange(32768, 60999))]
    inv = inventory(tmp_path)
    result = plan_node(inv.node("b"), inv, d, addresses())
    assert (result.added, result.removed, result.unchanged) == (2, 0, 1)
    assert [shlex.split(c) for c in result.commands] == [
        ["iptables-nft", "-I", "INPUT", "1", "-s", a, "-p", "tcp", "--dport", "32768:60999", *COMMENTED]
        for a in (PEER_D, MASTER)
    ]
    removal = plan_node(inv.node("b"), inv, d, addresses(), remove=True)
    deleted = ["iptables-nft", "-D", "INPUT", "-s", f"{PEER_C}/32", "-p", "tcp", "-m", "tcp", "--dport"]
    assert [shlex.split(c) for c in removal.commands] == [[*deleted, "32768:60999", *COMMENTED]]


def test_ufw_active_wins_and_rules_carry_the_comment(tmp_path: Path) -> None:
    d = recorded("ufw_active")
    assert [t.kind for t in d.targets] == ["ufw"]  # not the iptables-nft chains ufw itself manages
    inv = inventory(tmp_path)
    result = plan_node(inv.node("b"), inv, d, addresses())
    assert [shlex.split(c) for c in result.commands] == [
        ["ufw", "delete", "allow", "from", PEER_D, "to", "any", "port", "29500", "proto", "tcp"],
        ["ufw", "allow", "proto", "tcp", "from", MASTER, "to", "any", "port", "32768:60999", "comment", TAG],
        ["ufw", "allow", "proto", "tcp", "from", PEER_D, "to", "any", "port", "32768:60999", "comment", TAG],
    ]


def test_rules_of_the_legacy_tag_are_replaced_by_a_run_and_deleted_by_remove(tmp_path: Path) -> None:
    """An upgrade leaves nothing nobody can remove: rules that earlier versions tagged
    cluster-bootstrap:lab are deleted by a rerun (which writes them with the new tag) and by --remove."""
    inv = inventory(tmp_path)
    d = recorded("nft_drop", legacy=True)
    [target] = d.targets
    assert sorted(p.ref for p in target.present if p.legacy) == ["5", "6"]  # not "other"'s rule
    result = plan_node(inv.node("b"), inv, d, addresses())
    assert (result.added, result.removed, result.unchanged) == (3, 2, 0)
    lines = nft_lines(result.commands[0])
    assert sorted(lines[:2]) == [
        "delete rule inet filter input handle 5",
        "delete rule inet filter input handle 6",
    ]
    assert all(line.endswith(f'comment "{TAG}"') for line in lines[2:])
    assert any(LEGACY in note and "removed" in note for note in result.notes)
    removal = plan_node(inv.node("b"), inv, d, addresses(), remove=True)
    assert sorted(nft_lines(removal.commands[0])) == sorted(lines[:2])
    for name in ("iptables_nft_reject", "ufw_active"):  # the same for iptables and ufw
        old = recorded(name, legacy=True)
        assert [p.legacy for t in old.targets for p in t.present] == [True] * len(old.targets[0].present)
        assert plan_node(inv.node("b"), inv, old, addresses(), remove=True).removed == len(
            old.targets[0].present
        )


def test_legacy_iptables_is_read_from_its_own_section() -> None:
    text = (
        f"@@{TOKEN} begin range@@\n32768\t60999\n\n@@{TOKEN} end range 0@@\n"
        f"@@{TOKEN} begin iptables_legacy@@\n-P INPUT ACCEPT\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n"
        f'-A INPUT -s 10.0.0.2/32 -p tcp -m tcp --dport 29500 -m comment --comment "{TAG}" -j ACCEPT\n'
        f"-A INPUT -j DROP\n\n@@{TOKEN} end iptables_legacy 0@@\n"
    )
    d = _detect(text, TOKEN, IDS)
    [target] = d.targets
    assert (target.binary, target.filtering) == ("iptables-legacy", True)
    assert [p.rule for p in target.present] == [Rule("10.0.0.2", PortRange(29500, 29500))]


def test_a_rule_with_another_clusters_tag_is_never_ours() -> None:
    rule = '-A INPUT -s 10.0.0.2/32 -p tcp --dport 1 -m comment --comment "{}" -j ACCEPT'
    for other in ("cluster-bootstrap:labx", ClusterTag("Lab").tag, ClusterTag("lab ").tag, TAG + "0"):
        assert parse_iptables_rules(rule.format(other), IDS) == [], other
    assert len(parse_iptables_rules(rule.format(TAG), IDS)) == 1


# -- firewalld (generated commands only: it cannot run in a test namespace) ---------------------------

RUNTIME = f"""{POLICY} (active)
  priority: -100
  target: CONTINUE
  ingress-zones: ANY
  egress-zones: HOST
  services:
  ports:
  rich rules:
\trule family="ipv4" source address="{PEER_C}" port port="32768-60999" protocol="tcp" accept
\trule family="ipv4" source address="10.9.9.9" port port="32768-60999" protocol="tcp" accept"""
PERMANENT = f"{POLICY}\n  priority: -100\n  rich rules:"


def firewalld_said(policies: dict[str, tuple[str, str, str]]) -> dict[str, tuple[str, int]]:
    """The firewalld section of a node running firewalld (``firewalld_section``): its state, then per
    policy its runtime and permanent ``--info-policy`` and its description (empty: no such policy)."""
    said = "running\n" + "".join(
        records.record(ANSWERS, which, policy, text + "\n" if text else "")
        for policy, answers in policies.items()
        for which, text in zip(("runtime", "permanent", "description"), answers, strict=True)
    )
    return {"firewalld": (said.rstrip("\n"), 0)}


def answers_of(sections: dict[str, tuple[str, int]]) -> FirewalldAnswers:
    return firewalld_answers(*sections["firewalld"], ANSWERS)


#: our policy with two rich rules at runtime, none in the permanent configuration; no legacy one
FIREWALLD_RUNNING = firewalld_said({POLICY: (RUNTIME, PERMANENT, TAG), IDS.legacy_policy: ("", "", "")})


def detect_said(sections: dict[str, tuple[str, int]]) -> Detection:
    """``detect`` of a node's answers to the detection's sections (name: (output, exit code))."""
    return detect(sections_said(TOKEN, sections), TOKEN, IDS, ANSWERS)


def test_firewalld_first_run_creates_our_policy_then_adds_rich_rules() -> None:
    target = parse_firewalld(answers_of(firewalld_said({POLICY: ("", "", "")})), POLICY, IDS)
    assert target is not None and not target.exists and not target.permanent_exists
    rule = Rule(PEER_C, PortRange(29500, 29500))
    changes, commands = firewalld_commands(PosixShell(), target, [rule], TAG, persist=False, remove=False)
    argv = [shlex.split(c) for c in commands]
    assert argv[0] == ["firewall-cmd", "--permanent", f"--new-policy={POLICY}"]
    assert ["firewall-cmd", "--permanent", f"--policy={POLICY}", f"--set-description={TAG}"] in argv
    assert ["firewall-cmd", "--permanent", f"--policy={POLICY}", "--add-ingress-zone=ANY"] in argv
    assert ["firewall-cmd", "--permanent", f"--policy={POLICY}", "--add-egress-zone=HOST"] in argv
    assert argv[-2] == ["firewall-cmd", "--reload"]
    assert argv[-1] == [
        "firewall-cmd",
        f"--policy={POLICY}",
        f'--add-rich-rule=rule family="ipv4" source address="{PEER_C}" port port="29500" protocol="tcp"'
        " accept",
    ]
    assert changes.add == (rule,)


def test_firewalld_changes_runtime_and_with_persist_the_permanent_config(tmp_path: Path) -> None:
    inv = inventory(tmp_path, firewall="  firewall: {persist: true}\n")
    d = detect_said({"range": ("32768 60999", 0), **FIREWALLD_RUNNING})
    assert d.kind == "firewalld" and len(d.targets) == 1  # no policy of the legacy name there
    result = plan_node(inv.node("b"), inv, d, addresses())
    argv = [shlex.split(c) for c in result.commands]
    assert not any(f"--new-policy={POLICY}" in a or "--reload" in a for a in argv)  # it exists already
    runtime = [a for a in argv if "--permanent" not in a]
    permanent = [a for a in argv if "--permanent" in a]
    assert [a[2].split("=", 1)[0] for a in runtime] == ["--remove-rich-rule"] + ["--add-rich-rule"] * 2
    assert 'source address="10.9.9.9"' in runtime[0][2]
    assert len(permanent) == 3 and all(a[3].startswith("--add-rich-rule=") for a in permanent)
    assert (result.added, result.removed, result.unchanged) == (2, 1, 1)


def test_firewalld_remove_deletes_rules_and_our_policy() -> None:
    target = parse_firewalld(answers_of(FIREWALLD_RUNNING), POLICY, IDS)
    assert target is not None
    _, commands = firewalld_commands(PosixShell(), target, [], TAG, persist=False, remove=True)
    argv = [shlex.split(c) for c in commands]
    assert len([a for a in argv if a[2].startswith("--remove-rich-rule=")]) == 2
    assert argv[-1] == ["firewall-cmd", "--permanent", f"--delete-policy={POLICY}"]


def test_firewalld_policy_of_the_legacy_name_is_removed_and_a_foreign_one_left_alone(tmp_path: Path) -> None:
    legacy = (
        "cb-lab (active)\n  rich rules:\n"
        f'\trule family="ipv4" source address="{PEER_C}" port port="29500" protocol="tcp" accept',
        "cb-lab\n  rich rules:",
        LEGACY,
    )
    d = detect_said(firewalld_said({POLICY: ("", "", ""), "cb-lab": legacy}))
    assert [(t.policy, t.legacy, t.filtering) for t in d.targets] == [
        (POLICY, False, True),
        ("cb-lab", True, False),
    ]
    inv = inventory(tmp_path)
    argv = [shlex.split(c) for c in plan_node(inv.node("b"), inv, d, addresses()).commands]
    assert ["firewall-cmd", "--policy=cb-lab", argv[-2][2]] == argv[-2] and "remove-rich-rule" in argv[-2][2]
    assert argv[-1] == ["firewall-cmd", "--permanent", "--delete-policy=cb-lab"]
    assert not any(a[1].startswith("--policy=cb-lab") and "add-rich-rule" in a[-1] for a in argv)
    # a policy of the legacy name that another cluster made (its description is not our legacy tag)
    foreign = firewalld_said({POLICY: ("", "", ""), "cb-lab": (*legacy[:2], "cluster-bootstrap:lab2")})
    assert [t.policy for t in detect_said(foreign).targets] == [POLICY]


# -- inventory settings, quoting, persistence ---------------------------------------------------------


def test_extra_ports_sources_and_fixed_ephemeral_range(tmp_path: Path) -> None:
    fw = (
        "  firewall: {extra_ports: [6006, '7000-7010'], extra_sources: [10.5.0.0/16],"
        " ephemeral_ports: 50000-50100}\n"
    )
    inv = inventory(tmp_path, firewall=fw)
    result = plan_node(inv.node("b"), inv, recorded("nft_drop"), addresses(), remove=False)
    assert result.ports == ["6006", "7000-7010", "50000-50100"]
    assert result.sources == ["10.5.0.0/16", MASTER, PEER_C, PEER_D]
    assert result.added == 12


def test_single_node_cluster_opens_nothing(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(f"cluster: {{name: lab}}\nnodes:\n  - {{name: a, host: {ME}, user: root}}\n")
    inv = load_inventory(path)
    result = plan_node(inv.node("a"), inv, recorded("nft_drop"), {"a": ME})
    assert result.added == 0 and result.removed == 2  # only stale rules of ours go
    assert any("single node" in n for n in result.notes)


def test_hostile_cluster_name_cannot_escape_the_nft_script(tmp_path: Path) -> None:
    inv = inventory(tmp_path, name="x\" accept; flush ruleset; #'")
    result = plan_node(inv.node("b"), inv, recorded("none"), addresses())
    assert result.commands == []
    d = recorded("nft_drop")
    result = plan_node(inv.node("b"), inv, d, addresses())
    safe = re.compile(
        r"(insert rule inet filter input ip saddr [0-9.]+ tcp dport [0-9-]+ accept"
        r' comment "cluster-bootstrap:[\w.-]+:[0-9a-f]{12}"'
        r"|delete rule inet filter input handle [0-9]+)"
    )
    for line in nft_lines(result.commands[0]):
        assert safe.fullmatch(line), line  # the name became a harmless comment, nothing more


def _reached(inv: Inventory) -> dict[str, Reached]:
    return {n.name: r for n in inv.nodes if (r := reached_at(n, None, resolve=lambda _h: [])) is not None}


def test_cluster_addresses_are_the_inventorys_and_agree_with_the_route(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    found, warnings = cluster_addresses(inv, {"b": recorded("none")}, _reached(inv))
    assert found == addresses() and warnings == {}  # b's route's source is its inventory IP: no warning


def test_a_workers_own_address_opens_no_firewall(tmp_path: Path) -> None:
    """b says its route to the master leaves from 198.51.100.7 (an address it added, or a lie): the
    master's rules, UDP 123 included, name b's inventory IP only, and the warning names b."""
    inv = inventory(tmp_path)
    lying = recorded("none")
    lying.route = replace(lying.route, source="198.51.100.7")
    lying.addresses = (*lying.addresses, InterfaceAddress("eth0", "198.51.100.7", 32))
    found, warnings = cluster_addresses(inv, {"b": lying}, _reached(inv))
    assert found == addresses()
    assert (
        list(warnings) == ["b"]
        and "node 'b' says its address toward the master is 198.51.100.7" in warnings["b"]
    )
    on_master = replace(recorded("nft_drop"), addresses=(InterfaceAddress("eth0", MASTER, 24),))
    master = plan_node(inv.node("a"), inv, on_master, found)
    assert master.sources == [ME, PEER_C, PEER_D] and "198.51.100.7" not in " ".join(master.commands)
    assert f"ip saddr {ME} udp dport 123 accept" in " ".join(master.commands)


def test_a_node_the_controller_cannot_place_gets_no_rule_whatever_it_says(tmp_path: Path) -> None:
    text = tmp_path / "hosts.yaml"
    inventory(tmp_path)
    text.write_text(text.read_text().replace(f"host: {ME}", "host: b.unknown"))
    inv = load_inventory(text)
    found, warnings = cluster_addresses(inv, {"b": recorded("none")}, _reached(inv))
    assert "b" not in found and "'b.unknown' does not resolve here" in warnings["b"]
    assert f"the node itself says {ME}, which is not taken from it" in warnings["b"]


def test_nft_persistence_file_and_include_line_are_added_and_removed() -> None:
    target = Target(
        "nftables", "nftables inet filter input", True, family="inet", table="filter", chain="input"
    )
    add = nft_persist_commands(PosixShell(), [(target, [Rule(PEER_C, PortRange(1, 2))])], TAG, remove=False)
    assert f'include "/etc/nftables.d/cluster-bootstrap-lab-{IDS.digest}.nft"' in add[-1]
    assert f"ip saddr {PEER_C} tcp dport 1-2 accept" in add[1]
    remove = nft_persist_commands(PosixShell(), [], TAG, remove=True)
    assert remove[0] == f"rm -f /etc/nftables.d/cluster-bootstrap-lab-{IDS.digest}.nft"
    assert "grep -vxF" in remove[1]


def test_rules_persisted_under_the_legacy_tag_are_removed(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    d = recorded("nft_drop")
    d.persist = {"nftables.conf", "legacy"}  # the detection found /etc/nftables.d/cluster-bootstrap-lab.nft
    for remove in (False, True):
        commands = plan_node(inv.node("b"), inv, d, addresses(), remove=remove).commands
        assert "rm -f /etc/nftables.d/cluster-bootstrap-lab.nft" in commands
        assert any("grep -vxF 'include \"/etc/nftables.d/cluster-bootstrap-lab.nft\"'" in c for c in commands)
    persist = dict(detection_sections(PosixShell(), master_host="m", ids=IDS, nonce=ANSWERS))["persist"]
    # the legacy include line, exactly, in /etc/nftables.conf
    assert "case $l in 'include \"/etc/nftables.d/cluster-bootstrap-lab.nft\"') g=1 ;;" in persist
    assert "done </etc/nftables.conf" in persist


def test_detection_script_is_one_round_trip_with_every_section() -> None:
    sections = detection_sections(PosixShell(), master_host="m'x", ids=IDS, nonce=ANSWERS)
    names = [n for n, _ in sections]
    assert names == [
        "route",
        "addresses",
        "interfaces",
        "range",
        "ufw",
        "firewalld",
        "nft",
        "iptables_nft",
        "iptables_legacy",
        "persist",
    ]
    assert "'m'\"'\"'x'" in dict(sections)["route"]  # the inventory value is quoted by the platform


# -- Windows: generated PowerShell, parsed (no PowerShell runs here) ----------------------------------


def windows_inventory(tmp_path: Path, mode: str, master: str = "w") -> Inventory:
    path = tmp_path / "win.yaml"
    path.write_text(
        f"cluster: {{name: lab, master: {master}, port: 29500}}\nnodes:\n"
        f"  - {{name: w, host: {ME}, os: windows, windows: {{mode: {mode}}}}}\n"
        f"  - {{name: c, host: {PEER_C}, user: root}}\n"
        f"  - {{name: d, host: {PEER_D}, user: root}}\n"
    )
    return load_inventory(path)


def arguments(script: str) -> list[tuple[str, dict[str, str]]]:
    """Every command of the parsed script with its ``-Parameter value`` pairs (switches map to "")."""
    from tests.pwsh import assert_parses, walk

    found = []
    for node in walk(assert_parses(PowerShell().wrap(script, become=True)).root_node):
        command_name = node.child_by_field_name("command_name")
        if node.type != "command" or command_name is None:
            continue
        name = (command_name.text or b"").decode()
        pairs: dict[str, str] = {}
        current = None
        elements = node.child_by_field_name("command_elements")
        for el in elements.children if elements is not None else []:
            text = (el.text or b"").decode()
            if el.type == "command_parameter":
                current = text.lower()
                pairs[current] = ""
            elif el.type != "command_argument_sep" and current is not None:
                pairs[current] = text
                current = None
        found.append((name, pairs))
    return found


def test_windows_native_master_gets_defender_rules_for_peers_only(tmp_path: Path) -> None:
    from orchestrator.steps.firewall import plan_windows

    inv = windows_inventory(tmp_path, "native")
    result = plan_windows(inv.node("w"), inv, {"w": ME, "c": PEER_C, "d": PEER_D})
    assert result.kind == "windows defender" and result.sources == [PEER_C, PEER_D]
    calls = arguments(result.commands[0])
    rules = [p for name, p in calls if name == "Set-CbRule"]
    prefix = f"cluster-bootstrap-lab-{IDS.digest}-"
    assert [(r["-name"], r["-port"]) for r in rules] == [
        (f"'{prefix}tcp-29500'", "'29500'"),
        (f"'{prefix}tcp-ephemeral'", "$cbEphemeral"),  # Windows' dynamic range, read there
    ]
    assert {r["-remote"] for r in rules} == {f"@('{PEER_C}', '{PEER_D}')"}
    [new] = [p for name, p in calls if name == "New-NetFirewallRule"]
    assert (new["-group"], new["-direction"], new["-action"], new["-protocol"]) == (
        "$cbGroup",
        "Inbound",
        "Allow",
        "TCP",
    )
    assert new["-remoteaddress"] == "$Remote" and new["-localport"] == "$Port"
    assert f"$cbGroup = '{TAG}'" in result.commands[0]
    assert ("Get-NetTCPSetting", {"-settingname": "Internet"}) in calls
    # stray rules of ours are found by group and removed; so is every rule of the legacy group
    assert [p["-group"] for name, p in calls if name == "Get-NetFirewallRule" and "-group" in p] == [
        "$cbGroup",
        "$cbLegacyGroup",
    ]
    assert f"$cbLegacyGroup = '{LEGACY}'" in result.commands[0]


def test_windows_wsl_worker_gets_hyperv_rules_for_the_wsl_vm(tmp_path: Path) -> None:
    from orchestrator.steps.firewall import plan_windows
    from orchestrator.steps.firewall.windows import WSL_VM_CREATOR_ID

    inv = windows_inventory(tmp_path, "wsl", master="c")
    result = plan_windows(inv.node("w"), inv, {"w": ME, "c": PEER_C, "d": PEER_D})
    assert result.kind == "hyper-v (wsl)" and result.ports == ["32768-60999"]  # worker: no rendezvous
    calls = arguments(result.commands[0])
    [rule] = [p for name, p in calls if name == "Set-CbRule"]
    assert rule == {
        "-name": f"'cluster-bootstrap-lab-{IDS.digest}-tcp-32768-60999'",
        "-port": "'32768-60999'",
        "-remote": f"@('{PEER_C}', '{PEER_D}')",
    }
    [new] = [p for name, p in calls if name == "New-NetFirewallHyperVRule"]
    assert (new["-vmcreatorid"], new["-localports"], new["-remoteaddresses"]) == (
        "$cbCreator",
        "$Port",
        "$Remote",
    )
    assert f"$cbCreator = '{WSL_VM_CREATOR_ID}'" in result.commands[0]
    assert not any(name == "New-NetFirewallRule" for name, _ in calls)


def test_windows_remove_deletes_only_our_group(tmp_path: Path) -> None:
    from orchestrator.steps.firewall import plan_windows
    from orchestrator.steps.firewall.windows import parse_report

    inv = windows_inventory(tmp_path, "native")
    result = plan_windows(inv.node("w"), inv, {"w": ME, "c": PEER_C}, remove=True)
    calls = arguments(result.commands[0])
    assert not any(name in ("Set-CbRule", "New-NetFirewallRule") for name, _ in calls)
    assert ("Remove-NetFirewallRule", {"-name": "$_.Name"}) in calls
    assert "$cbWanted = @()" in result.commands[0]
    assert parse_report('noise\n{"added":0,"updated":0,"removed":2,"unchanged":0}\n') == {
        "added": 0,
        "updated": 0,
        "removed": 2,
        "unchanged": 0,
    }


def test_manage_false_touches_no_node(tmp_path: Path) -> None:
    from orchestrator.steps.firewall import apply_firewall

    class NoSession:  # any use of a connection would fail loudly
        nodes: tuple[object, ...] = ()

        def peer_address(self, node: str) -> None:  # where a connection reached it: none was made
            return None

        def map(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("connected although firewall.manage is false")

    inv = inventory(tmp_path, firewall="  firewall: {manage: false}\n")
    NoSession.inventory = inv  # type: ignore[attr-defined]
    run = apply_firewall(NoSession(), inv, list(inv.nodes))  # type: ignore[arg-type]
    assert [o.value.status for o in run.outcomes if o.value] == ["left alone"] * 4
    assert run.warnings == ["cluster.firewall.manage is false: no firewall was touched"]


def test_hyperv_rules_are_recognised_by_their_whole_name_never_by_prefix() -> None:
    """Hyper-V rules have no group: the script matches names with these patterns (-cmatch), so a
    cluster whose name starts like ours ("lab-x") keeps its rules when "lab" removes its own."""
    from orchestrator.steps.firewall.windows import rule_name_pattern

    ours = re.compile(rule_name_pattern(IDS.windows_prefix))
    legacy = re.compile(rule_name_pattern(IDS.legacy_windows_prefix))
    for name in (f"{IDS.windows_prefix}tcp-29500", f"{IDS.windows_prefix}tcp-ephemeral"):
        assert ours.match(name) and not legacy.match(name), name
    assert legacy.match("cluster-bootstrap-lab-tcp-32768-60999")  # written by earlier versions
    for other in (ClusterTag("lab-x"), ClusterTag("Lab"), ClusterTag("lab.tcp")):
        for name in (f"{other.windows_prefix}tcp-29500", f"{other.legacy_windows_prefix}tcp-29500"):
            assert not ours.match(name) and not legacy.match(name), name


# -- UDP 123 on the master: the pipeline's own time sync ---------------------------------------------

WORKERS = [ME, PEER_C, PEER_D]
NTP = PortRange(123, 123)


def as_master(name: str) -> Detection:
    """A recording as if taken on the master (its own address MASTER): the workers are b, c and d."""
    d = recorded(name)
    d.addresses = (InterfaceAddress("eth0", MASTER, 24),)
    return d


def udp_rules(result_commands: list[str]) -> list[str]:
    return [line for line in nft_lines(result_commands[0]) if " udp " in line]


def test_time_rules_only_on_a_serving_master_and_from_the_workers_only() -> None:
    assert time_rules(is_master=True, serves_time=True, workers=[PEER_D, ME, ME]) == [
        Rule(ME, NTP, "udp"),
        Rule(PEER_D, NTP, "udp"),
    ]
    assert time_rules(is_master=False, serves_time=True, workers=WORKERS) == []
    assert time_rules(is_master=True, serves_time=False, workers=WORKERS) == []
    assert NTP_PORT == NTP and str(Rule(ME, NTP, "udp")) == f"udp from {ME} to port 123"
    with pytest.raises(ValueError):
        Rule(ME, NTP, "icmp")  # type: ignore[arg-type]


def test_serving_master_opens_udp_123_to_each_worker_scoped_and_tagged(tmp_path: Path) -> None:
    # extra_sources (a workstation) may reach the training ports, but is no worker: no NTP for it
    inv = inventory(tmp_path, firewall="  firewall: {extra_sources: [10.5.0.0/16]}\n")
    result = plan_node(inv.node("a"), inv, as_master("nft_drop"), addresses())
    assert result.ports == ["29500", EPHEMERAL, "123/udp"]
    assert result.sources == ["10.5.0.0/16", *WORKERS]
    assert udp_rules(result.commands) == [
        f'insert rule inet filter input ip saddr {w} udp dport 123 accept comment "{TAG}"'
        for w in reversed(WORKERS)  # inserted at the top: reversed keeps them in sorted order
    ]
    assert any("UDP 123 (NTP) from the 3 worker(s)" in n for n in result.notes)
    # 4 sources x 2 TCP ports + 3 UDP, of which 1 TCP present; the stray (.99) goes
    assert (result.added, result.removed, result.unchanged) == (10, 1, 1)
    # a worker opens no NTP port: nobody asks it for time
    worker = plan_node(inv.node("b"), inv, recorded("nft_drop"), addresses())
    assert "123/udp" not in worker.ports and not udp_rules(worker.commands)


@pytest.mark.parametrize(
    ("time", "opened"),
    [
        ("", True),  # default: no servers, the master serves
        ("  time: {servers: [pool.ntp.org]}\n", False),  # every node follows the pool
        ("  time: {servers: [pool.ntp.org], serve_from_master: true}\n", True),
        ("  time: {manage: false}\n", False),  # ntp does not configure anything
    ],
)
def test_udp_123_only_when_the_master_serves_time(tmp_path: Path, time: str, opened: bool) -> None:
    inv = inventory(tmp_path, time=time)
    result = plan_node(inv.node("a"), inv, as_master("nft_drop"), addresses())
    assert ("123/udp" in result.ports) is opened
    assert len(udp_rules(result.commands)) == (3 if opened else 0)


def test_a_windows_master_serves_no_time_so_nothing_opens_udp_123(tmp_path: Path) -> None:
    """``bootstrap ntp`` refuses a Windows master as a time server (use time.servers): neither its
    script nor anything else opens UDP 123."""
    from orchestrator.steps.firewall import plan_windows, serves_time

    inv = windows_inventory(tmp_path, "native")
    assert not serves_time(inv)
    result = plan_windows(inv.node("w"), inv, {"w": ME, "c": PEER_C, "d": PEER_D})
    assert "udp" not in result.commands[0].lower() and "123" not in result.ports


def test_udp_rules_in_place_are_unchanged_and_a_departed_worker_loses_its_own(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    d = as_master("nft_drop")
    first = plan_node(inv.node("a"), inv, d, addresses())
    wanted = [Rule(a, PortRange.parse(p)) for a in WORKERS for p in ("29500", EPHEMERAL)]
    wanted += [Rule(a, NTP, "udp") for a in WORKERS]
    assert first.added + first.unchanged == len(wanted)
    d.targets[0].present = [Present(r, str(i)) for i, r in enumerate(wanted)]
    again = plan_node(inv.node("a"), inv, d, addresses())
    assert again.commands == [] and again.status == "unchanged" and again.unchanged == 9
    left = plan_node(inv.node("a"), inv, d, {k: v for k, v in addresses().items() if k != "d"})
    assert (left.added, left.removed) == (0, 3)  # d's two TCP rules and its UDP 123
    assert sorted(nft_lines(left.commands[0])) == sorted(
        f"delete rule inet filter input handle {i}" for i, r in enumerate(wanted) if r.source == PEER_D
    )
    removal = plan_node(inv.node("a"), inv, d, addresses(), remove=True)
    assert removal.removed == 9 and removal.added == 0  # --remove: the UDP rules too


def test_udp_rules_are_read_back_from_every_firewall() -> None:
    """What each firewall prints for a UDP 123 rule we wrote (nft JSON and `iptables -S` as nft 1.0.6
    and iptables 1.8.9 print them in the test namespaces) is understood as that rule: found again,
    so a rerun leaves it alone, and --remove deletes it by its tag."""
    udp = Rule(PEER_C, NTP, "udp")
    # nft: `ip saddr 198.18.7.13 udp dport 123 accept comment "TAG"`
    expr: list[dict[str, Any]] = [
        {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": PEER_C}},
        {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 123}},
        {"accept": None},
    ]
    assert parse_nft_rule(expr) == udp
    both = [
        *expr[:2],
        {"match": {**expr[1]["match"], "left": {"payload": {"protocol": "tcp", "field": "dport"}}}},
    ]
    assert parse_nft_rule([*both, {"accept": None}]) is None  # not a rule we write
    doc = {
        "nftables": [
            {
                "chain": {
                    "family": "inet",
                    "table": "filter",
                    "name": "input",
                    "hook": "input",
                    "policy": "drop",
                }
            },
            {
                "rule": {
                    "family": "inet",
                    "table": "filter",
                    "chain": "input",
                    "handle": 9,
                    "comment": TAG,
                    "expr": expr,
                }
            },
        ]
    }
    [target] = nft_targets(doc, IDS, iptables_nft=False)
    assert target.present == [Present(udp, "9")]
    # iptables
    line = f'-A INPUT -s {PEER_C}/32 -p udp -m udp --dport 123 -m comment --comment "{TAG}" -j ACCEPT'
    [present] = parse_iptables_rules(line, IDS)
    assert present.rule == udp
    ipt = Target("iptables", "iptables-nft INPUT", True, binary="iptables-nft")
    [add] = iptables_commands(PosixShell(), ipt, reconcile([udp], []), TAG)
    assert shlex.split(add) == [
        "iptables-nft",
        "-I",
        "INPUT",
        "1",
        "-s",
        PEER_C,
        "-p",
        "udp",
        "--dport",
        "123",
        *COMMENTED,
    ]
    [delete] = iptables_commands(PosixShell(), ipt, reconcile([], [present]), TAG)
    assert shlex.split(delete)[:9] == [
        "iptables-nft",
        "-D",
        "INPUT",
        "-s",
        f"{PEER_C}/32",
        "-p",
        "udp",
        "-m",
        "udp",
    ]
    # ufw (`ufw show added` prints the protocol last)
    added = (
        "Added user rules (see 'ufw status' for running firewall):\n"
        f"ufw allow from {PEER_C} to any port 123 proto udp comment '{TAG}'"
    )
    [present] = parse_ufw_added(added, IDS)
    assert present.rule == udp
    assert [shlex.split(c) for c in ufw_commands(PosixShell(), reconcile([udp], []), TAG)] == [
        ["ufw", "allow", "proto", "udp", "from", PEER_C, "to", "any", "port", "123", "comment", TAG]
    ]
    assert [shlex.split(c) for c in ufw_commands(PosixShell(), reconcile([], [present]), TAG)] == [
        ["ufw", "delete", "allow", "from", PEER_C, "to", "any", "port", "123", "proto", "udp"]
    ]
    # firewalld: a rich rule in our policy
    assert (
        rich_rule(udp)
        == f'rule family="ipv4" source address="{PEER_C}" port port="123" protocol="udp" accept'
    )
    runtime = RUNTIME.replace('port port="32768-60999" protocol="tcp"', 'port port="123" protocol="udp"', 1)
    policy = parse_firewalld(answers_of(firewalld_said({POLICY: (runtime, PERMANENT, TAG)})), POLICY, IDS)
    assert policy is not None and Present(udp, rich_rule(udp)) in policy.present
    _, commands = firewalld_commands(PosixShell(), policy, [udp], TAG, persist=False, remove=False)
    assert not any(rich_rule(udp) in c and "add-rich-rule" in c for c in commands)  # in place already


def test_detection_reads_config_lines_with_builtins_as_grep_did(tmp_path: Path) -> None:
    import subprocess

    from orchestrator.steps.firewall.linux_detection import _lines

    conf = tmp_path / "nftables.conf"
    conf.write_text('flush ruleset\n  include "/x/ours.nft" # ours\ninclude "/x/legacy.nft"')  # no last \n
    test = [("*/x/ours.nft*", "i"), ("'include \"/x/legacy.nft\"'", "g"), ("ENABLED=yes*", "e")]
    script = "i=stale e=stale\n" + _lines(PosixShell().quote(str(conf)), *test) + '\necho "$i,$g,$e"'
    assert subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True).stdout == "1,1,\n"
    missing = _lines(PosixShell().quote(str(tmp_path / "none")), ("*", "i")) + '\necho "[$i]"'
    assert subprocess.run(["/bin/sh", "-c", missing], capture_output=True, text=True).stdout == "[]\n"
