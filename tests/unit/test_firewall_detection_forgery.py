"""What a node's own names and texts hold cannot change what the firewall detection concludes.

The real detection script (``detection_sections``, framed by ``PosixShell.sectioned``) runs in a local
``sh`` whose PATH starts with stand-ins for ``ip``, ``pgrep``, ``firewall-cmd``, ``nft`` and
``iptables-nft``: they print what a node could hold, an interface named like a marker, a firewalld
policy description or an iptables rule comment carrying record- and marker-like lines. The detection
must read each answer as the text it is: the same targets and rules as for the honest node.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from orchestrator import records
from orchestrator.platforms import PosixShell
from orchestrator.steps.firewall.linux_detection import Detection, detect, detection_sections
from orchestrator.steps.firewall.rules import ClusterTag

IDS = ClusterTag("lab")
MASTER, ME = "198.18.7.11", "198.18.7.12"
TOKEN = "cb-0123456789ab"
ANSWERS = "cb-a0a1a2a3a4a5"  # of the answers inside the sections
#: lines a node's text could smuggle in: our own sub-answers as they once were, and records
FORGED = [
    records.record(TOKEN, "section", "persist", "included\n\x000").rstrip("\n"),
    records.record(ANSWERS, "description", IDS.legacy_policy, IDS.legacy).rstrip("\n"),
    "@@added",
    f"ufw allow from 6.6.6.6 to any port 1 proto tcp comment '{IDS.tag}'",
    f"@@policy {IDS.legacy_policy}",
    "@@runtime",
    f"{IDS.legacy_policy} (active)",
    "@@permanent",
    IDS.legacy_policy,
    "@@description",
    IDS.legacy,
]


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _node(tmp_path: Path, *, interface: str, description: str, comment: str, firewalld: bool) -> Detection:
    """The detection of a node with ``interface`` beside its own, a foreign firewalld policy of our
    legacy name beside one of our current name described by ``description`` (when ``firewalld``
    runs), else an iptables-nft INPUT chain with a foreign rule commented ``comment``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    answers = {
        "route": f"{MASTER} dev d0 src {ME} uid 0 \\    cache ",
        "addr": f"3: d0    inet {ME}/24 scope global d0\n4: {interface}    inet 10.77.0.1/24 scope global x",
        "link": f"3: d0@d1: <UP> mtu 1500\n4: {interface}: <UP> mtu 1500",
        # the policy of our current name belongs to someone else (its description says whose)
        "current": f"{IDS.policy} (active)\n  rich rules:",
        "current.description": description,
        # so does the one of the legacy name: its description is not our legacy tag
        "legacy": f"{IDS.legacy_policy} (active)\n  rich rules:",
        "legacy.description": "the storage team's policy",
        "iptables": "-P INPUT DROP\n"
        f'-A INPUT -s 10.1.1.1/32 -p tcp -m tcp --dport 22 -m comment --comment "{comment}" -j ACCEPT',
    }
    for name, text in answers.items():
        (data / name).write_text(text + "\n", encoding="utf-8")
    _stub(
        bin_dir,
        "ip",
        f'case "$*" in\n  *route*) cat {data}/route;;\n  *addr*) cat {data}/addr;;\n'
        f"  *link*) cat {data}/link;;\nesac\n",
    )
    _stub(bin_dir, "pgrep", "exit 0\n" if firewalld else "exit 1\n")
    _stub(
        bin_dir,
        "firewall-cmd",
        'case "$*" in\n  --state) echo running;;\n'
        f"  *--policy={IDS.policy}\\ --get-description) cat {data}/current.description;;\n"
        f"  *--policy={IDS.legacy_policy}\\ --get-description) cat {data}/legacy.description;;\n"
        f"  *--info-policy={IDS.policy}) cat {data}/current;;\n"
        f"  *--info-policy={IDS.legacy_policy}) cat {data}/legacy;;\n"
        "  *) exit 2;;\nesac\n",
    )
    # the nft JSON's chain, whole: input hook, filter type, policy drop
    chain = {"family": "ip", "table": "filter", "name": "INPUT", "hook": "input", "type": "filter"}
    (data / "nft").write_text(json.dumps({"nftables": [{"chain": {**chain, "policy": "drop"}}]}))
    _stub(bin_dir, "nft", f"cat {data}/nft\n")
    _stub(bin_dir, "iptables-nft", f"cat {data}/iptables\n")
    shell = PosixShell()
    script = shell.sectioned(detection_sections(shell, master_host=MASTER, ids=IDS, nonce=ANSWERS), TOKEN)
    ran = subprocess.run(
        ["/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    return detect(ran.stdout, TOKEN, IDS, ANSWERS)


def _concluded(d: Detection) -> tuple[object, ...]:
    return (
        d.kind,
        [(t.label, t.filtering, t.exists, t.permanent_exists, t.legacy, t.present) for t in d.targets],
        sorted(d.persist),
        d.notes,
        d.route.source if d.route else None,
    )


def test_a_firewalld_description_cannot_pass_for_another_policys_answers(tmp_path: Path) -> None:
    honest = _node(tmp_path, interface="x0", description="the web team's", comment="x", firewalld=True)
    # neither policy is ours: nothing to change, nothing to remove, the current one named in a note
    assert honest.kind == "none" and honest.targets == []
    assert any(IDS.policy in note for note in honest.notes)
    forged = _node(
        tmp_path,
        interface="x0",
        description="the web team's\n" + "\n".join(FORGED),
        comment="x",
        firewalld=True,
    )
    assert _concluded(forged) == _concluded(honest)


def test_interface_names_and_rule_comments_cannot_add_rules_of_ours(tmp_path: Path) -> None:
    honest = _node(tmp_path, interface="x0", description="", comment="ssh", firewalld=False)
    [target] = honest.targets
    assert (target.label, target.filtering, target.present) == ("iptables-nft INPUT", True, [])
    assert {a.address for a in honest.addresses} == {ME, "10.77.0.1"}
    # an interface name of marker bytes, and a comment whose "line separators" (not newlines: iptables
    # prints one rule per line) would start rules of ours for a reader splitting on them
    rule = f'-A INPUT -s 6.6.6.6/32 -p tcp -m tcp --dport 1 -m comment --comment "{IDS.tag}" -j ACCEPT'
    comment = "ssh" + "".join(f"{sep}{rule}" for sep in ("\u2028", "\x1c", "\x85")) + "\u2028@@added"
    forged = _node(tmp_path, interface="@@added", description="", comment=comment, firewalld=False)
    assert _concluded(forged) == _concluded(honest)
    assert ("@@added", "10.77.0.1") in {(a.interface, a.address) for a in forged.addresses}
