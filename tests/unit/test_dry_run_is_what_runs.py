"""`--dry-run` shows what the real run sends: firewall (and `--remove`), ntp (and `--restore`), sync.

Each step runs twice against nodes whose transports record every command (the text before the
platform's root wrapping, and whether it runs as root) and every upload, answering the read-only probes
with realistic output parsed by the real parsers: once with ``dry_run=True``, once for real. The dry
run sends only read-only probes; the real run sends the same probes, then exactly what the dry run
reported, byte for byte: the firewall's commands, chrony's script (and the file its diff describes),
the restore script, the environment build and its uploads, the code bundle. Two dry runs cannot know
everything: the environment's contacts no node (its placeholders are filled with what the real run
had), and the code's compares read-only (the real comparison also creates the directory and its
cache).

Pure logic (the probes' answers are canned): the same steps run on real nodes in
tests/integration/test_firewall.py, test_timesync.py, test_env_sync*.py and test_code_sync*.py.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from orchestrator.cli.common import Settings
from orchestrator.cli.report import plan_lines
from orchestrator.cli.sync import run_sync
from orchestrator.cli.timesync import print_time_report
from orchestrator.facts import SESSION_KEY_PREFIX
from orchestrator.inventory import Inventory, Node, load_inventory, load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.steps.codesync import LocalTree, prepare_tree
from orchestrator.steps.contract import Report
from orchestrator.steps.envsync.spec import resolve_spec, stamp_key
from orchestrator.steps.firewall import FirewallResult, apply_firewall, remove_firewall
from orchestrator.steps.firewall.rules import ClusterTag
from orchestrator.steps.timesync import NodeTime, chrony, restore_time, sync_time
from orchestrator.steps.timesync import windows as timesync_windows
from orchestrator.transports import Result, Transport
from tests.noderecords import (
    answer_nonce,
    answer_sections,
    asks,
    firewall_recorded,
    said,
    sections_asked,
)
from tests.recording import Answer, RecordingNode, RecordingSession, Sent, Upload

DATA = Path(__file__).parent / "data" / "firewall"
RECORDED_TOKEN = "cb-0123456789ab"  # the token the recordings in DATA were framed with
TOKEN = re.compile(r"cb-[0-9a-f]{12}")  # a round trip's frame token (random per run)

# -- a node that records what it is sent -----------------------------------------------------------


def sections_answer(command: str, sections: Mapping[str, tuple[str, int]]) -> str:
    """The records of a ``Platform.sectioned`` script: each section it asks for, with the nonce found
    in it (a section this node has no answer for fails the test)."""
    return answer_sections(command, dict(sections))


def untokened(sent: list[Sent]) -> list[Sent]:
    """The commands with each round trip's random frame token replaced: comparable across runs."""
    return [Sent(TOKEN.sub("cb-TOKEN", s.command), s.become, s.env, s.cwd) for s in sent]


def after_probes(dry: RecordingNode, real: RecordingNode) -> list[Sent | Upload]:
    """What the real run sent beyond the dry run's probes, which it must have sent first, the same."""
    probes = untokened(dry.sent)
    assert [e for e in dry.log if isinstance(e, Upload)] == [], "a dry run uploads nothing"
    assert untokened([e for e in real.log[: len(probes)] if isinstance(e, Sent)]) == probes
    return real.log[len(probes) :]


# -- firewall -------------------------------------------------------------------------------------

FIREWALL_INVENTORY = """\
cluster:
  name: lab
  master: a
  port: 29500
  firewall: {persist: true}
nodes:
  - {name: a, host: 198.18.7.11, user: root}
  - {name: b, host: 198.18.7.12, user: trainer}
  - {name: c, host: 198.18.7.13, user: trainer}
  - {name: w, host: 198.18.7.14, user: bob, os: windows, windows: {mode: native}}
"""
MASTER = "198.18.7.11"
OWN = {"a": MASTER, "b": "198.18.7.12", "c": "198.18.7.13", "w": "198.18.7.14"}
#: each Linux node's firewall, as recorded (tests/unit/data/firewall/README.md): an nftables drop
#: policy, an iptables-nft REJECT, ufw; each already holding rules tagged by earlier versions or this
#: one. The native Windows node w converges its Defender rules itself (one script, which reports).
FIREWALLS = {"a": "nft_drop", "b": "iptables_nft_reject", "c": "ufw_active"}
WINDOWS_REPORT = '{"added": 2, "updated": 0, "removed": 1, "unchanged": 0}'


def windows_firewall(command: str) -> tuple[str, int]:
    return WINDOWS_REPORT + "\n", 0


def network_sections(node: str) -> dict[str, tuple[str, int]]:
    """The node's route to the master (``ip route get``) and its addresses (``ip -4 -o addr``)."""
    own = OWN[node]
    if own == MASTER:
        route = f"local {MASTER} dev lo table local src {MASTER} uid 0 \\    cache <local> "
    else:
        route = f"{MASTER} dev d0 src {own} uid 0 \\    cache "
    return {
        "route": (f"resolved {MASTER}\n{route}", 0),
        "addresses": (
            "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
            f"3: d0    inet {own}/24 scope global d0\\       valid_lft forever preferred_lft forever",
            0,
        ),
    }


def firewall_node(node: str, *, tag: str | None) -> Answer:
    """A node whose firewall is the recording's; ``tag``: its rules of ours carry this tag (None: the
    recorded one, the tag of earlier versions). Every other command (a change) succeeds."""
    text = (DATA / f"{FIREWALLS[node]}.txt").read_text()
    if tag is not None:
        text = re.sub(re.escape("cluster-bootstrap:lab") + r"(?![\w.:-])", tag, text)

    def answer(command: str) -> tuple[str, int]:
        if sections_asked(command):  # ufw's answers in records of the nonce the detection chose
            nonce = answer_nonce(command) or RECORDED_TOKEN
            sections = {**firewall_recorded(text, RECORDED_TOKEN, nonce), **network_sections(node)}
            return sections_answer(command, sections), 0
        return "", 0

    return answer


def firewall_runs(
    step: Callable[..., Report[FirewallResult]], *, tag: str | None
) -> tuple[Report[FirewallResult], RecordingSession, Report[FirewallResult], RecordingSession]:
    """``step`` run with --dry-run, then for real, each on nodes as found (nothing changes between)."""
    inventory = load_inventory_text(FIREWALL_INVENTORY, "hosts.yaml")
    runs = []
    for dry_run in (True, False):
        answers = {n: firewall_node(n, tag=tag) for n in FIREWALLS}
        session = RecordingSession(inventory, {**answers, "w": windows_firewall})
        runs.append((step(session, inventory, dry_run=dry_run), session))
    (dry, dry_session), (real, real_session) = runs
    return dry, dry_session, real, real_session


@pytest.mark.parametrize(
    ("step", "tag"),
    [
        (apply_firewall, None),
        (apply_firewall, ClusterTag("lab").tag),
        (remove_firewall, ClusterTag("lab").tag),
    ],
    ids=["apply-replacing-legacy-rules", "apply", "remove"],
)
def test_firewall_runs_exactly_the_commands_its_dry_run_shows(
    step: Callable[..., Report[FirewallResult]], tag: str | None
) -> None:
    """Per Linux node, `firewall --dry-run` (and `--remove --dry-run`) only reads the firewall; the
    real run reads it the same way, then runs the commands the dry run printed, each byte for byte, in
    order, as root, in one script stopping at the first failure (``set -e``), and nothing else. A
    Windows node is sent nothing by the dry run, then the one script it printed, elevated."""
    dry, dry_session, real, real_session = firewall_runs(step, tag=tag)
    assert [o.node for o in dry.outcomes] == [o.node for o in real.outcomes] == [*FIREWALLS, "w"]
    assert dry.data["addresses"] == real.data["addresses"]
    for shown, done in zip(dry.outcomes, real.outcomes, strict=True):
        assert shown.error is None and done.error is None, (shown.error, done.error)
        assert shown.value is not None and done.value is not None
        planned = shown.value.commands
        assert planned, f"{shown.node}: nothing to change: the comparison would prove nothing"
        assert all(s.become for s in dry_session.fakes[shown.node].sent)  # detection reads as root
        extra = after_probes(dry_session.fakes[shown.node], real_session.fakes[shown.node])
        if shown.node == "w":
            assert not dry_session.fakes["w"].log and len(planned) == 1
            assert extra == [Sent(planned[0], become=True)]
        else:
            assert extra == [Sent("set -e\n" + "\n".join(planned), become=True)], shown.node
            assert (done.value.added, done.value.removed) == (shown.value.added, shown.value.removed)
        # the report of the real run names what ran: the same commands
        assert done.value.commands == planned and done.value.applied and not shown.value.applied


# -- time sync -------------------------------------------------------------------------------------

TIME_INVENTORY = """\
cluster: {name: lab, master: a}
nodes:
  - {name: a, host: 198.18.7.11, user: root}
  - {name: b, host: 198.18.7.12, user: trainer}
  - {name: c, host: 198.18.7.13, user: trainer}
  - {name: w, host: 198.18.7.14, user: bob, os: windows, windows: {mode: native}}
"""
SYNC_TIMEOUT = 5.0
CANDIDATES = ("/etc/chrony/chrony.conf", "/etc/chrony.conf")
DEBIAN_CONF = b"""\
# Welcome to the chrony configuration file. See chrony.conf(5) for more
# information about usable directives.

# Include configuration files found in /etc/chrony/conf.d.
confdir /etc/chrony/conf.d

# Use Debian vendor zone.
pool 2.debian.pool.ntp.org iburst

# Use time sources from DHCP.
sourcedir /run/chrony-dhcp

# Use NTP sources found in /etc/chrony/sources.d.
sourcedir /etc/chrony/sources.d

keyfile /etc/chrony/chrony.keys
driftfile /var/lib/chrony/chrony.drift
ntsdumpdir /var/lib/chrony
logdir /var/log/chrony
maxupdateskew 100.0
rtcsync
makestep 1 3
leapsectz right/UTC
"""
RHEL_CONF = b"""\
# Use public servers from the pool.ntp.org project.
# Please consider joining the pool (https://www.pool.ntp.org/join.html).
pool 2.rocky.pool.ntp.org iburst

# Use NTP servers from DHCP.
sourcedir /run/chrony-dhcp

# Record the rate at which the system clock gains/losses time.
driftfile /var/lib/chrony/drift

# Allow the system clock to be stepped in the first three updates
# if its offset is larger than 1 second.
makestep 1.0 3

# Enable kernel synchronization of the real-time clock (RTC).
rtcsync

keyfile /etc/chrony.keys
ntsdumpdir /var/lib/chrony
leapsectz right/UTC
logdir /var/log/chrony
"""
DROPIN = "/etc/chrony/conf.d/cluster-bootstrap.conf"
POOL_SERVER = "162.159.200.1"
SOURCES = "^,*,{source},3,6,377,23,0.000004120,0.000003805,0.000125000\n"
TRACKING = (
    "C6120B0B,{source},4,1733224412.586520624,0.000004785,0.000002193,0.000006062,-10.535,-0.001,"
    "0.024,0.000243451,0.000030189,64.6,Normal\n"
)


def chrony_probe(
    *,
    os_id: str,
    files: Mapping[str, bytes | None],
    unit: str | None = None,
    etc_chrony: bool = False,
    shared_clock: bool = False,
    pid: int | None = None,
    cmdline: str = "",
    pkg: str = "apt-get",
    chronyd: bool = True,
) -> str:
    """What chrony's probe script (steps/timesync/chrony/probe.py) prints on such a node: ``files``
    are the paths it dumps, in its order (None: absent)."""
    lines = [f"os {os_id}"]
    if unit:
        lines.append("systemd yes")
    if etc_chrony:
        lines.append("etcchrony yes")
    lines += [*(["chronyd /usr/sbin/chronyd"] if chronyd else []), f"pkg {pkg}", "user _chrony"]
    if shared_clock:
        lines.append("sharedclock yes")
    if unit:
        lines += [f"unit {unit}", "unitactive yes"]
    main = next((p for p in CANDIDATES if files.get(p) is not None), None)
    for path, data in files.items():
        if path == DROPIN and main is not None:
            lines.append(f"main {main}")
        lines.append(f"nofile {path}" if data is None else f"file {path} {base64.b64encode(data).decode()}")
    if main is not None and DROPIN not in files:
        lines.append(f"main {main}")
    lines.append("pidfile /run/chrony/chronyd.pid")
    if pid is not None:  # running: chronyc's sources and tracking (a pool server is followed)
        sources = base64.b64encode(SOURCES.format(source=POOL_SERVER).encode()).decode()
        tracking = base64.b64encode(TRACKING.format(source=POOL_SERVER).encode()).decode()
        lines += [f"running {pid}", f"cmdline {cmdline}", f"sources {sources}", f"tracking {tracking}"]
    return "\n".join(lines) + "\n"


def dumps(present: Mapping[str, bytes], *, dropin: bool) -> dict[str, bytes | None]:
    """The probe's file list (main candidates, their backups and state files; the drop-in and its
    backup when the main file has a confdir), with ``present`` holding the files that exist."""
    paths = [p + suffix for p in CANDIDATES for suffix in ("", chrony.BACKUP_SUFFIX, chrony.STATE_SUFFIX)]
    if dropin:
        paths += [DROPIN, DROPIN + chrony.BACKUP_SUFFIX]
    return {p: present.get(p) for p in paths}


def ours(role: chrony.ChronyRole, *, whole: bool = False) -> bytes:
    body = chrony.directives(role)
    return (chrony.standalone_config(body) if whole else chrony.HEADER + body).encode()


MASTER_ROLE = chrony.ChronyRole((), serve=True, allow=("198.18.7.12", "198.18.7.13", "198.18.7.14"))
WORKER_ROLE = chrony.ChronyRole((MASTER,), prefer_first=True)
#: each Linux node before `bootstrap ntp`: a: Debian, chrony.service running with the distribution's
#: file (a drop-in is added); b: a container sharing the host's clock, chronyd installed, no file, not
#: running (a whole file, chronyd -x started by us); c: Rocky Linux, chronyd.service with a main file
#: without confdir (a marked block appended after a backup)
UNCONFIGURED = {
    "a": chrony_probe(
        os_id="debian",
        files=dumps({"/etc/chrony/chrony.conf": DEBIAN_CONF}, dropin=True),
        unit="chrony.service",
        etc_chrony=True,
        pid=612,
        cmdline="/usr/sbin/chronyd -F 1",
    ),
    "b": chrony_probe(os_id="debian", files=dumps({}, dropin=False), shared_clock=True),
    "c": chrony_probe(
        os_id="rocky",
        files=dumps({"/etc/chrony.conf": RHEL_CONF}, dropin=False),
        unit="chronyd.service",
        pid=733,
        cmdline="/usr/sbin/chronyd -F 2",
        pkg="dnf",
    ),
}
#: each Linux node after `bootstrap ntp`, as the probe then finds it (what `--restore` undoes)
BLOCKED = chrony.replace_block(RHEL_CONF.decode(), chrony.directives(WORKER_ROLE)).encode()
CONFIGURED = {
    "a": chrony_probe(
        os_id="debian",
        files=dumps({"/etc/chrony/chrony.conf": DEBIAN_CONF, DROPIN: ours(MASTER_ROLE)}, dropin=True),
        unit="chrony.service",
        etc_chrony=True,
        pid=618,
        cmdline="/usr/sbin/chronyd -F 1",
    ),
    "b": chrony_probe(
        os_id="debian",
        files=dumps(
            {
                "/etc/chrony.conf": ours(WORKER_ROLE, whole=True),
                "/etc/chrony.conf.cluster-bootstrap.state": b"pid=4242\n",
            },
            dropin=False,
        ),
        shared_clock=True,
        pid=4242,
        cmdline="/usr/sbin/chronyd -f /etc/chrony.conf -x",
    ),
    "c": chrony_probe(
        os_id="rocky",
        files=dumps(
            {"/etc/chrony.conf": BLOCKED, "/etc/chrony.conf.cluster-bootstrap.bak": RHEL_CONF}, dropin=False
        ),
        unit="chronyd.service",
        pid=741,
        cmdline="/usr/sbin/chronyd -F 2",
        pkg="dnf",
    ),
}


def wait_sections(node: str) -> dict[str, tuple[str, int]]:
    """What the wait's sections answer once chronyd follows its source (the master serves its own
    clock), and a clock sample."""
    source = "127.127.1.1" if node == "a" else MASTER
    sources = "" if node == "a" else SOURCES.format(source=source)
    return {
        chrony.WAIT: ("", 0),
        chrony.SOURCES: (sources, 0),
        chrony.TRACKING: (TRACKING.format(source=source), 0),
        chrony.NTPDATA: ("", 0),
        "clock.sample": (f"{time.time():.9f}", 0),
    }


def chrony_node(node: str, probe: Mapping[str, str | tuple[str, str]]) -> Answer:
    """A node whose chrony probe prints ``probe[node]`` (a pair: before and after chrony is
    installed). The wait for a source finds it; clock samples answer; any other command succeeds."""
    sections = network_sections(node)
    found = probe[node]
    before, after = found if isinstance(found, tuple) else (found, found)
    installed: list[str] = []

    def answer(command: str) -> tuple[str, int]:
        if sections_asked(command):  # the runner's reads: the probe, the wait, a clock sample
            probed = {**sections, **wait_sections(node), "chrony": ((after if installed else before), 0)}
            return sections_answer(command, probed), 0
        if command == chrony.probe_script(PosixShell()):
            return (after if installed else before), 0
        if command == chrony.install_command("apt-get"):
            installed.append(command)
            return "Setting up chrony (4.3-2+deb12u1) ...\n", 0
        return "", 0  # a change: done

    return answer


def w32time(command: str) -> tuple[str, int]:
    if "/stripchart" in command:
        return "Tracking 198.18.7.11 [198.18.7.11:123].\n16:41:52, +00.0003121s\n", 0
    return "configured\n", 0


def time_runs(
    run: Callable[[RecordingSession, Inventory, bool], Report[NodeTime]],
    probe: Mapping[str, str | tuple[str, str]],
    inventory_text: str = TIME_INVENTORY,
) -> tuple[Report[NodeTime], RecordingSession, Report[NodeTime], RecordingSession]:
    inventory = load_inventory_text(inventory_text, "hosts.yaml")
    runs = []
    for dry_run in (True, False):
        answers = {n: chrony_node(n, probe) for n in ("a", "b", "c")}
        session = RecordingSession(inventory, {**answers, "w": w32time})
        runs.append((run(session, inventory, dry_run), session))
    (dry, dry_session), (real, real_session) = runs
    assert [o.node for o in dry.outcomes] == [o.node for o in real.outcomes] == ["a", "b", "c", "w"]
    for o in [*dry.outcomes, *real.outcomes]:
        assert o.error is None and o.value is not None and o.value.problem is None, (o.node, o.error, o.value)
    return dry, dry_session, real, real_session


WRITE = re.compile(r"^printf %s ([A-Za-z0-9+/=]+) \| base64 -d > (\S+)$", re.M)
MOVE = re.compile(r"^mv -f -- (\S+) (\S+)$", re.M)


def written(script: str) -> dict[str, str]:
    """The files ``script`` replaces (chrony.write_file_script: base64 into a temporary file, moved
    over the target) and their new text."""
    staged = {shlex.split(tmp)[0]: base64.b64decode(data) for data, tmp in WRITE.findall(script)}
    return {
        shlex.split(target)[0]: staged[shlex.split(tmp)[0]].decode()
        for tmp, target in MOVE.findall(script)
        if shlex.split(tmp)[0] in staged
    }


HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patched(before: Mapping[str, str], diff: str) -> dict[str, str]:
    """Each file the unified ``diff`` names (``+++`` path), as it is once the diff is applied to its
    text in ``before`` (absent: empty). Context and removed lines must match ``before``."""
    lines = diff.splitlines(keepends=True)
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        assert lines[i].startswith("--- ") and lines[i + 1].startswith("+++ "), lines[i : i + 2]
        path = lines[i + 1][4:].rstrip("\n")
        old = before.get(path, "").splitlines(keepends=True)
        new: list[str] = []
        at = 0
        i += 2
        while i < len(lines) and (hunk := HUNK.match(lines[i])):
            start, old_count = int(hunk.group(1)), int(hunk.group(2) or 1)
            begin = start - 1 if old_count else start
            new += old[at:begin]
            at = begin
            left, added = old_count, int(hunk.group(4) or 1)
            i += 1
            while left or added:
                tag, text = lines[i][0], lines[i][1:]
                if tag in " -":
                    assert old[at] == text, (path, old[at], text)
                    at, left = at + 1, left - 1
                if tag in " +":
                    new.append(text)
                    added -= 1
                i += 1
        out[path] = "".join(new + old[at:])
    return out


def files_of(probe: str) -> dict[str, str]:
    """The files a probe output shows (path -> text)."""
    return {
        path: base64.b64decode(data).decode() for path, data in re.findall(r"^file (\S+) (\S+)$", probe, re.M)
    }


def sync(session: RecordingSession, inventory: Inventory, dry_run: bool) -> Report[NodeTime]:
    return sync_time(session, inventory, dry_run=dry_run, sync_timeout=SYNC_TIMEOUT)


def restore(session: RecordingSession, inventory: Inventory, dry_run: bool) -> Report[NodeTime]:
    return restore_time(session, inventory, dry_run=dry_run)


def shown_plans(report: Report[NodeTime], capsys: pytest.CaptureFixture[str]) -> str:
    """What `ntp --dry-run` prints for ``report`` (the plans, each below its diff, then the table)."""
    capsys.readouterr()
    assert print_time_report(Settings(dry_run=True), report) == 0
    return capsys.readouterr().out


def test_ntp_runs_exactly_the_plan_its_dry_run_shows_and_writes_what_its_diff_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Per Linux node, `ntp --dry-run` reads where the node finds the master and what chrony has, and
    prints its plan (the one dry-run printer) below the configuration diff; the real run reads the
    same, then runs that plan's script, byte for byte, as root, then only reads (the wait for a
    source, a clock sample). The file that script writes is the one the printed diff makes of the
    node's file. A Windows node's plan is the w32time script and its status read, both elevated."""
    dry, dry_session, real, real_session = time_runs(sync, UNCONFIGURED)
    inventory = load_inventory_text(TIME_INVENTORY, "hosts.yaml")
    max_offset_s = inventory.cluster.time.max_offset_ms / 1000
    printed = shown_plans(dry, capsys)
    for shown, done in zip(dry.outcomes, real.outcomes, strict=True):
        assert shown.value is not None and done.value is not None
        plan = dry.plans[shown.node]
        assert plan.runs, f"{shown.node}: nothing to change: the comparison would prove nothing"
        assert real.plans[shown.node] == plan  # the real run applied the plan the dry run showed
        head = shown.value.diff + "\n".join(plan_lines(plan.public_dict(), shown.node))
        assert head in printed, shown.node
        sent = [Sent(run.script, become=run.become) for run in plan.runs]
        extra = after_probes(dry_session.fakes[shown.node], real_session.fakes[shown.node])
        if shown.node == "w":  # w32time: the script, then its status (read-only)
            assert not dry_session.fakes["w"].log and all(run.host for run in plan.runs)
            assert (
                extra
                == sent
                == [
                    Sent(shown.value.script, become=True),
                    Sent(timesync_windows.status_script(MASTER), become=True),
                ]
            )
            continue
        assert shown.value.state.startswith("would be ") and done.value.state in ("added", "changed")
        shell = PosixShell()
        wait = shell.sectioned(
            chrony.wait_sections(
                max_offset_s=max_offset_s, timeout=SYNC_TIMEOUT, has_sources=shown.node != "a"
            ),
            "cb-000000000000",
        )
        clock = shell.sectioned([("clock.sample", "date +%s.%N")], "cb-000000000000")
        # the plan's script, then only reads: the wait for its source (as root), a clock sample
        assert sent == [Sent(shown.value.script, become=True)]
        expected = [*sent, Sent(wait, become=True), Sent(clock)]
        assert untokened([s for s in extra if isinstance(s, Sent)]) == untokened(expected), shown.node
        # the diff printed is what the script writes
        before = files_of(UNCONFIGURED[shown.node])
        script = plan.runs[0].script
        assert patched(before, shown.value.diff) == written(script), shown.node
        assert done.value.path in written(script) and done.value.mode == shown.value.mode


def test_ntp_restore_runs_exactly_the_plan_its_dry_run_shows(capsys: pytest.CaptureFixture[str]) -> None:
    """`ntp --restore --dry-run` reads what chrony has and prints each node's plan below its diff;
    the real restore reads the same, then runs that plan's script, as root, and nothing else; what
    its diff shows is what the files become (the backup put back, our files removed)."""
    dry, dry_session, real, real_session = time_runs(restore, CONFIGURED)
    printed = shown_plans(dry, capsys)
    for shown, done in zip(dry.outcomes, real.outcomes, strict=True):
        assert shown.value is not None and done.value is not None
        plan = dry.plans[shown.node]
        [run] = plan.runs
        assert real.plans[shown.node] == plan, f"{shown.node}: nothing to restore: this would prove nothing"
        assert shown.value.diff + "\n".join(plan_lines(plan.public_dict(), shown.node)) in printed
        script = run.script
        extra = after_probes(dry_session.fakes[shown.node], real_session.fakes[shown.node])
        assert extra == [Sent(script, become=True)], shown.node
        assert done.value.state == "restored" and shown.value.state.startswith("would be")
        if shown.node == "w":
            continue
        before = files_of(CONFIGURED[shown.node])
        after = patched(before, shown.value.diff)
        moved = dict(MOVE.findall(script))
        removed = re.findall(r"^rm -f -- (\S+)$", script, re.M)
        assert after, shown.node
        for path, text in after.items():
            if text:  # put back from its backup by the script
                assert moved[shlex.quote(path + chrony.BACKUP_SUFFIX)] == shlex.quote(path)
                assert text == before[path + chrony.BACKUP_SUFFIX]
            else:
                assert shlex.quote(path) in removed, (shown.node, path)


def test_ntp_dry_run_shows_the_install_of_chrony_that_runs_first() -> None:
    """On a node without chrony (``time.install: true``), `ntp --dry-run` shows the install command
    and says the node would be installed: what chrony's configuration is there depends on the files
    its package brings, which only a node that has it can show. The real run installs with exactly
    that command, reads the node again, and then configures it."""
    without = chrony_probe(os_id="debian", files=dumps({}, dropin=False), shared_clock=True, chronyd=False)
    probes: dict[str, str | tuple[str, str]] = {**UNCONFIGURED, "b": (without, UNCONFIGURED["b"])}
    text = TIME_INVENTORY.replace("master: a}", "master: a, time: {install: true}}")
    dry, dry_session, _, real_session = time_runs(sync, probes, text)
    [shown] = [o.value for o in dry.outcomes if o.node == "b"]
    [install] = dry.plans["b"].runs  # what a dry run can know there: the install, nothing after it
    assert shown is not None and shown.state == "would install"
    assert install.script == shown.script == chrony.install_command("apt-get") and install.become
    # the dry run read chrony's state (as root), then the route to the master with chrony's state
    # nested as root in the same command (one command per node and step); the real run reads the
    # state, installs with the command shown, reads the route and chrony's state again, configures
    probe, route = untokened(dry_session.fakes["b"].sent)
    real = untokened(real_session.fakes["b"].sent)
    assert probe.become and chrony.probe_script(PosixShell()) in probe.command and not route.become
    assert real[:2] == [probe, Sent(install.script, become=True)]
    again = real[2]
    assert isinstance(again, Sent) and not again.become and asks(again.command, "route")
    assert asks(again.command, "as_root") and asks(again.command, "chrony")
    configure = real[3]
    assert isinstance(configure, Sent) and configure.become and configure.command.startswith("set -e\n")
    assert "/usr/sbin/chronyd -f /etc/chrony.conf -x" in configure.command


# -- sync: the environment, then the code ----------------------------------------------------------

SYNC_INVENTORY = """\
cluster:
  name: lab
  master: a
  env:
    requirements: requirements.txt
    index_url: {index_url}
  code: {{source: {source}}}
nodes:
  - {{name: a, host: 198.18.7.11, user: root}}
  - {{name: b, host: 198.18.7.12, user: trainer}}
"""
REQUIREMENTS = "numpy==2.1.3\ntorch==2.5.1\n"
INDEX_URL = "https://ci:s3cret-token@pypi.example.org/simple"
HOMES = {"a": "/root", "b": "/home/trainer"}
PROJECT = {  # path -> (content, mode)
    "train.py": (b"import torch\nprint('training')\n", 0o644),
    "model/net.py": (b"import torch.nn as nn\n\nclass Net(nn.Module):\n    pass\n", 0o644),
    "configs/base.yaml": (b"lr: 0.01\nbatch: 64\n", 0o644),
    "run.sh": (b"#!/bin/sh\nexec python train.py\n", 0o755),
    ".env": (b"WANDB_API_KEY=not-a-real-key\n", 0o600),
}
#: Debian 12's python3 as the environment probe (steps/envsync/probes/env_probe.py) reports it
PYTHON = {
    "executable": "/usr/bin/python3",
    "version": "3.11.2",
    "implementation": "cpython",
    "abi": "cp311",
    "sysconfig_platform": "linux-x86_64",
    "machine": "x86_64",
    "os": "posix",
    "venv_module": True,
    "pip": "23.0.1",
    "pip_wheel": "/usr/share/python-wheels/pip-23.0.1-py3-none-any.whl",
    "libc": "glibc 2.36",
    "platforms": ["manylinux_2_36_x86_64", "manylinux2014_x86_64", "linux_x86_64"],
}


def expand(node: str, path: str) -> str:
    return HOMES[node] + path[1:] if path.startswith("~") else path


def json_argument(command: str) -> dict[str, Any]:
    """The JSON object a ``python -c SCRIPT JSON`` command passes its script ({} for others)."""
    try:
        word = shlex.split(command)[-1] if command.startswith("python3 -c ") else ""
    except ValueError:
        return {}
    return dict(json.loads(word)) if word.startswith("{") else {}


#: what a build prints: its steps and its listing as records of its nonce, pip's lines between them
INSTALLED = {"numpy": "2.1.3", "torch": "2.5.1", "filelock": "3.16.1", "sympy": "1.13.1"}


def build_output(command: str) -> str:
    listing = json.dumps({"packages": INSTALLED, "python": PYTHON["version"]})
    return said(command, ("step", "resolving packages")) + (
        "Successfully installed numpy-2.1.3 torch-2.5.1\n" + said(command, ("installed", listing))
    )


def sync_node(node: str, tree: LocalTree, *, wheelhouse: Mapping[str, str] | None = None) -> Answer:
    """A node without the environment (no venv yet) whose code directory lacks files: a (the master)
    has an older copy of the project (a file changed, one missing, one the project no longer has), b
    has none. ``wheelhouse``: what its wheelhouse holds (offline). The environment probe, the
    markers' read, the build's listing and the code script answer as on a node; anything else (a
    change) succeeds."""
    token: dict[str, str] = {}
    files = {rel: [e.sha256, e.size, e.mode, e.link] for rel, e in tree.files.items()}
    if node == "a":
        files["configs/base.yaml"][0] = "0" * 64  # edited since
        del files["run.sh"]
        files["old_train.py"] = ["1" * 64, 120, 0o644, None]  # gone from the project

    def answer(command: str) -> tuple[str, int]:
        args = json_argument(command)
        if "stamp" in args:  # the environment probe
            path = expand(node, args["path"])
            doc = {
                "home": HOMES[node],
                "python": PYTHON,
                "uv": None,
                "venv": {"path": path, "state": "missing", "target": None, "stamp": None, "packages": None},
                "wheelhouse": None if wheelhouse is None else {"files": dict(wheelhouse)},
            }
            if "marker" in args:  # the real run's: it leaves this sync's marker
                token["token"] = args["marker"]["token"]
                doc["marker"] = {"path": expand(node, args["marker"]["dir"])}
            return json.dumps(doc) + "\n", 0
        if args.get("op") == "read":  # the sync's markers: only this node's own in its directory
            return json.dumps({d: {"seen": {node: token["token"]}} for d in args["dirs"]}) + "\n", 0
        if args.get("op") == "scan":
            dest = expand(node, args["dest"])
            there = node == "a"
            scanned = {"dest": dest, "exists": there, "marked": there, "refused": None, "errors": []}
            # a's record: an earlier sync shipped what it holds (old_train.py too, so it goes)
            shipped = {rel: entry[0] for rel, entry in files.items()} if there else None
            return json.dumps({**scanned, "files": files if there else {}, "shipped": shipped}) + "\n", 0
        if args.get("op") == "apply":
            return json.dumps({"dest": expand(node, args["dest"]), "errors": []}) + "\n", 0
        if "_cb_rec step" in command:  # the build script
            return build_output(command), 0
        return "", 0

    return answer


def sync_runs(
    tmp_path: Path,
    seed: Mapping[str, object] | None = None,
    *,
    env: str = "",
    wheelhouse: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], RecordingSession, dict[str, Any], RecordingSession, LocalTree]:
    """Sync run dry and for real (``seed``: remembered per node in each session first; ``env``: more
    of cluster.env, ``wheelhouse``: what the nodes' wheelhouses hold)."""
    project = tmp_path / "project"
    for rel, (data, mode) in PROJECT.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_bytes(data)
        (project / rel).chmod(mode)
    (tmp_path / "requirements.txt").write_text(REQUIREMENTS)
    text = SYNC_INVENTORY.format(source=project, index_url=INDEX_URL)
    (tmp_path / "hosts.yaml").write_text(text.replace("    index_url:", env + "    index_url:"))
    inventory = load_inventory(tmp_path / "hosts.yaml")
    tree = prepare_tree(inventory)
    runs = []
    for dry_run in (True, False):
        answers = {n.name: sync_node(n.name, tree, wheelhouse=wheelhouse) for n in inventory.nodes}
        session = RecordingSession(inventory, answers)
        for node in inventory.nodes:
            for key, value in (seed or {}).items():
                session.remember(node.name, key, lambda v=value: v)
        settings = Settings(json_mode=True, dry_run=dry_run)
        settings.ui.collected = []
        code = run_sync(settings, inventory, list(inventory.nodes), session=session)
        [doc] = settings.ui.collected
        assert code == 0 and doc["exit_code"] == 0, doc
        runs.append((doc, session))
    (dry, dry_session), (real, real_session) = runs
    return dry, dry_session, real, real_session, tree


def is_op(entry: Sent | Upload, op: str) -> bool:
    return isinstance(entry, Sent) and json_argument(entry.command).get("op") == op


@pytest.fixture
def same_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The values a plan chooses fresh (a build's id, its stamp's time, its records' nonce; the code
    bundle's name, this sync's markers), the same in the dry run and the real one: all that may
    differ between two runs on an unchanged node."""
    from orchestrator import records
    from orchestrator.steps.codesync import sync as codesync
    from orchestrator.steps.envsync import build

    monkeypatch.setattr(build, "new_build_id", lambda: "20261205-170000-c0ffee")
    monkeypatch.setattr(build, "created_now", lambda: "2026-12-05T17:00:00+0000")
    monkeypatch.setattr(records, "new_nonce", lambda: "cb-0123456789ab")
    monkeypatch.setattr(codesync, "upload_name", lambda: ".bootstrap-code-upload-0123456789ab")
    tokens = itertools.cycle(["a" * 16, "b" * 16])  # each run asks for one per node, in order
    monkeypatch.setattr(codesync, "new_token", lambda: next(tokens))


def received(plan: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """What ``plan`` (``NodePlan.public_dict`` as --json prints it) says the node gets, in order, in
    the form the node's log is compared in (:func:`got`)."""
    return [
        ("put", a["put"], a["bytes"], a["sha256"], a["mode"])
        if "put" in a
        else ("run", a["sent"], a["as_root"])
        for a in plan["actions"]
    ]


def got(entries: list[Sent | Upload], node: RecordingNode) -> list[tuple[Any, ...]]:
    """The node's log: each command as its shell receives it, each upload's place, size, hash, mode."""
    out: list[tuple[Any, ...]] = []
    for e in entries:
        if isinstance(e, Upload):
            digest = hashlib.sha256(e.data).hexdigest()
            out.append(("put", e.remote, len(e.data), digest, None if e.mode is None else f"{e.mode:04o}"))
        else:
            wrapped = node.platform.wrap(e.command, env=dict(e.env), cwd=e.cwd, become=e.become)
            out.append(("run", node.plan(wrapped), e.become))
    return out


def env_part(node: RecordingNode) -> list[Sent | Upload]:
    """What the environment sync sent a node (the code's scan comes next)."""
    return node.log[: next(i for i, e in enumerate(node.log) if is_op(e, "scan"))]


#: the stamp a build script writes
STAMP = re.compile(r"^printf %s '(\{.*\})' > \"\$new\"/", re.M)


def test_sync_builds_each_environment_exactly_as_its_dry_run_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_choices: None
) -> None:
    """`sync --dry-run` reads each node (the environment probe: no marker left, no request to the
    index) and shows the plan of its build: every command as the node's shell receives it, every
    upload with its size, hash and mode. The real sync probes (leaving its marker), then sends exactly
    that plan, in order, byte for byte, and nothing else; its report shows the plan it applied."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dry, dry_session, real, real_session, _ = sync_runs(tmp_path)
    inventory = load_inventory(tmp_path / "hosts.yaml")
    spec = resolve_spec(inventory, "linux")
    assert [n["name"] for n in dry["env"]["nodes"]] == [n["name"] for n in real["env"]["nodes"]] == ["a", "b"]
    for shown, done in zip(dry["env"]["nodes"], real["env"]["nodes"], strict=True):
        node = shown["name"]
        assert shown["action"] == "planned" and done["action"] == "installed", done
        assert shown["plan"] == done["plan"], node  # the same choices: the same plan
        dry_node, real_node = dry_session.fakes[node], real_session.fakes[node]
        [dry_probe] = env_part(dry_node)  # a dry run reads, and sends nothing else
        real_probe, *applied = env_part(real_node)
        assert isinstance(dry_probe, Sent) and isinstance(real_probe, Sent)
        asked, probed = json_argument(dry_probe.command), json_argument(real_probe.command)
        assert "marker" not in asked and "index" not in asked and "marker" in probed and "index" in probed
        assert {k: v for k, v in probed.items() if k not in ("marker", "index")} == asked
        # the real run sent exactly the plan the dry run printed, which is the plan its report names
        assert got(applied, real_node) == received(shown["plan"]), node
        whats = [a["what"] for a in shown["plan"]["actions"]]
        assert whats[0].startswith("read the markers") and whats[-1].startswith("build, stamp")
        # every value is the real one: what the node told the probe, what the plan chose
        build = applied[-1]
        assert isinstance(build, Sent) and not build.become
        stamp = json.loads(STAMP.findall(build.command)[0])
        assert stamp["key"] == stamp_key(spec, python_version="3.11.2", platform="linux-x86_64-cpython-cp311")
        assert (stamp["id"], stamp["python"]) == (shown["env_id"], "3.11.2") == (done["env_id"], "3.11.2")
        uploads = [e for e in applied if isinstance(e, Upload)]
        assert [u.data for u in uploads] == [REQUIREMENTS.encode(), f"PIP_INDEX_URL={INDEX_URL}\n".encode()]
        assert all(u.mode == 0o600 for u in uploads)
        assert done["packages"] == INSTALLED


def test_an_offline_sync_pushes_exactly_the_wheels_its_dry_run_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_choices: None
) -> None:
    """Offline (env.offline), the plan pushes the wheels of this machine's wheelhouse the node lacks
    (one it holds with the same bytes stays), then builds from the node's wheelhouse, deleting the
    wheel no longer wanted there: the dry run shows exactly those uploads and that build, and the
    real run sends them."""
    from orchestrator.steps.envsync import wheelhouse as wheelhouse_mod

    house = tmp_path / "house"
    house.mkdir()
    numpy, torch = "numpy-2.1.3-cp311-cp311-linux_x86_64.whl", "torch-2.5.1-cp311-cp311-linux_x86_64.whl"
    for name in (numpy, torch):
        (house / name).write_bytes(name.encode())
    digests = {name: hashlib.sha256(name.encode()).hexdigest() for name in (numpy, torch)}
    filled = wheelhouse_mod.Wheelhouse(house, digests, downloaded=False)
    monkeypatch.setattr(wheelhouse_mod, "fill", lambda spec, target: filled)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    on_node = {numpy: digests[numpy], "old-1.0-py3-none-any.whl": "0" * 64}
    dry, _, real, real_session, _ = sync_runs(tmp_path, env="    offline: true\n", wheelhouse=on_node)
    for shown, done in zip(dry["env"]["nodes"], real["env"]["nodes"], strict=True):
        node = real_session.fakes[shown["name"]]
        assert shown["plan"] == done["plan"] and done["wheels_pushed"] == shown["wheels_pushed"] == 1
        _, *applied = env_part(node)
        assert got(applied, node) == received(shown["plan"])
        [wheel] = [e for e in applied if isinstance(e, Upload) and e.remote.endswith(".whl")]
        assert wheel.remote.endswith(f"/venv.wheels/{torch}") and wheel.data == torch.encode()
        build = applied[-1]
        assert isinstance(build, Sent) and "--no-index" in build.command
        assert "rm -f -- old-1.0-py3-none-any.whl" in build.command and numpy not in build.command


WINDOWS_INVENTORY = """\
cluster:
  name: lab
  master: w
  env:
    requirements: requirements.txt
nodes:
  - {name: w, host: 198.18.7.14, user: bob, os: windows, windows: {mode: native}}
"""
WINDOWS_VENV = "C:\\Users\\bob\\cluster-bootstrap\\venv"


def test_a_windows_build_runs_outside_the_shells_job_exactly_as_its_dry_run_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_choices: None
) -> None:
    """On a native Windows node the plan's build runs outside the WinRS shell's job (its quotas would
    end pip installing torch): the dry run shows that action (its job directory, its script); the real
    run sends the directories' command and the requirements as shown, then hands exactly that script
    and job directory to runs.start.run_outside_job, and reads the installed versions from its records."""
    from orchestrator.runs import start
    from orchestrator.steps.envsync import sync_env

    (tmp_path / "requirements.txt").write_text(REQUIREMENTS)
    (tmp_path / "hosts.yaml").write_text(WINDOWS_INVENTORY)
    inventory = load_inventory(tmp_path / "hosts.yaml")
    python = {**PYTHON, "executable": "C:\\Python311\\python.exe", "sysconfig_platform": "win-amd64"}
    probe = {
        "home": "C:\\Users\\bob",
        "python": {**python, "os": "nt", "platforms": ["win_amd64"]},
        "uv": None,
        "venv": {"path": WINDOWS_VENV, "state": "missing", "target": None, "stamp": None, "packages": None},
        "wheelhouse": None,
    }
    jobs: list[tuple[str, str]] = []

    def outside(node: Node, transport: Transport, job_dir: str, script: str, **kwargs: Any) -> Result:
        jobs.append((job_dir, script))
        return Result(node.name, script, 0, build_output(script), "", 0.1)

    monkeypatch.setattr(start, "run_outside_job", outside)
    runs = []
    for dry_run in (True, False):
        session = RecordingSession(inventory, {"w": lambda command: (json.dumps(probe) + "\n", 0)})
        [outcome] = sync_env(session, inventory, dry_run=dry_run)
        assert outcome.value is not None, outcome.error
        runs.append((outcome.value, session.fakes["w"]))
    (shown, dry_node), (done, real_node) = runs
    assert shown.plan is not None and shown.plan == done.plan and done.packages == INSTALLED
    [build] = [a for a in shown.plan["actions"] if "outside_job" in a]
    assert shown.plan["actions"][-1] == build
    assert jobs == [(build["outside_job"], build["run"])]  # the real run's build: the one shown
    assert build["outside_job"] == f"{WINDOWS_VENV}.versions/{shown.env_id}.job"
    _, *applied = real_node.log
    assert len(dry_node.log) == 1 and got(applied, real_node) == received(shown.plan)[:-1]


def test_sync_dry_run_prints_no_placeholder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bootstrap sync --dry-run` on an inventory with cluster.env prints each node's real commands:
    the stamp with the key, Python and platform of that node, the build id; no stand-in for a value
    it would not know, no login."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sync_runs(tmp_path)  # the inventory, the project
    inventory = load_inventory(tmp_path / "hosts.yaml")
    tree = prepare_tree(inventory)
    session = RecordingSession(inventory, {n.name: sync_node(n.name, tree) for n in inventory.nodes})
    capsys.readouterr()
    assert (
        run_sync(Settings(dry_run=True), inventory, list(inventory.nodes), session=session, only="env") == 0
    )
    out = capsys.readouterr().out
    for placeholder in (
        "BUILD-ID",
        '"KEY"',
        '"TOKEN"',
        '"PYTHON"',
        '"PLATFORM"',
        '"CREATED"',
        "env_probe.py",
    ):
        assert placeholder not in out, placeholder
    stamps = [json.loads(found) for found in STAMP.findall(out)]
    spec = resolve_spec(inventory, "linux")
    key = stamp_key(spec, python_version="3.11.2", platform="linux-x86_64-cpython-cp311")
    assert [(s["key"], s["python"], s["platform"]) for s in stamps] == [
        (key, "3.11.2", "linux-x86_64-cpython-cp311")
    ] * 2
    for node in ("a", "b"):
        assert f"# {node}: environment at ~/cluster-bootstrap/venv" in out
    assert (
        "s3cret" not in out and "the index settings: PIP_INDEX_URL=https://***@pypi.example.org/simple" in out
    )


def test_a_build_line_that_looks_like_a_record_fakes_neither_progress_nor_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build prints the installer's output, which packages from the index write into: a line
    shaped like the old markers (``@@cb-env-step``, ``@@cb-env-installed``) or like a record of
    another nonce is shown as output, and neither the progress display nor the installed versions
    come from it: only from the build's own records."""
    from orchestrator import records
    from orchestrator.steps.envsync import sync_env

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sync_runs(tmp_path)  # the inventory, the project
    inventory = load_inventory(tmp_path / "hosts.yaml")
    tree = prepare_tree(inventory)
    evil = json.dumps({"packages": {"torch": "6.6.6"}, "python": "3.11.2"})
    forged = [
        "@@cb-env-step installing evil",
        "@@cb-env-installed " + evil,
        records.record("cb-000000000000", "step", "a forged step").rstrip("\n"),
        records.record("cb-000000000000", "installed", evil).rstrip("\n"),
    ]

    def node_answer(node: str) -> Answer:
        usual = sync_node(node, tree)

        def answer(command: str) -> tuple[str, int]:
            if "_cb_rec step" in command:  # the build: its own records, then what a package printed
                return build_output(command) + "\n".join(forged) + "\n", 0
            return usual(command)

        return answer

    session = RecordingSession(inventory, {n.name: node_answer(n.name) for n in inventory.nodes})
    activities: list[str] = []
    shown: list[str] = []
    outcomes = sync_env(
        session,
        inventory,
        on_line=lambda node, line: shown.append(line),
        on_progress=lambda node, activity, detail: activities.append(activity),
    )
    assert [o.value.packages if o.value else o.error for o in outcomes] == [INSTALLED, INSTALLED]
    assert "resolving packages" in activities
    assert not [a for a in activities if "evil" in a or "forged" in a], activities
    assert all(shown.count(line) == 2 for line in forged)  # each node's output, as it was


def test_sync_sends_exactly_the_code_changes_its_dry_run_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_choices: None
) -> None:
    """`sync --dry-run` compares each node's code directory (read-only: nothing created, no cache
    written) and shows the files it would add, change and delete, the bytes it would send, and its
    plan: the bundle (size, hash, owner-only, inside that directory) and the command applying it.
    The real sync compares the same way, then sends exactly that plan, byte for byte: the bundle
    holding exactly those files, their bytes, modes and deletions, and the command; nothing else."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dry, dry_session, real, real_session, tree = sync_runs(tmp_path)
    assert (
        [n["name"] for n in dry["code"]["nodes"]] == [n["name"] for n in real["code"]["nodes"]] == ["a", "b"]
    )
    for shown, done in zip(dry["code"]["nodes"], real["code"]["nodes"], strict=True):
        node = shown["name"]
        assert shown["dry_run"] and not shown["unchanged"], f"{node}: nothing would move"
        summary = ("dest", "added", "changed", "deleted", "bytes_sent")
        assert {k: done[k] for k in summary} == {k: shown[k] for k in summary}
        # the dry run's one command after the environment's probe: the comparison, read-only; the
        # real run's is the same, writing
        _, scan = env_part(dry_session.fakes[node]), dry_session.fakes[node].log[-1]
        assert isinstance(scan, Sent) and is_op(scan, "scan")
        args = json_argument(scan.command)
        assert (args["create"], args["write_cache"]) == (False, False)
        log = real_session.fakes[node].log
        start = next(i for i, e in enumerate(log) if is_op(e, "scan"))
        first, bundle, applied = log[start:]
        assert isinstance(first, Sent) and isinstance(bundle, Upload) and isinstance(applied, Sent)
        # the same choices: the same plan (the bundle is built in each run's own temporary directory)
        assert [{**a, "from": None} for a in shown["plan"]["actions"]] == [
            {**a, "from": None} for a in done["plan"]["actions"]
        ]
        assert got([bundle, applied], real_session.fakes[node]) == received(shown["plan"])
        assert shlex.split(first.command)[:-1] == shlex.split(scan.command)[:-1]  # the same script
        marker = json_argument(first.command)["marker"]  # this sync's, for shared directories
        assert marker["name"] == node and len(marker["token"]) == 16
        assert json_argument(first.command) == {**args, "create": True, "write_cache": True, "marker": marker}
        # the bundle: a JSON header, then the bytes of the files to send, in its order
        header_line, _, payload = bundle.data.partition(b"\n")
        header = json.loads(header_line)
        assert [rel for rel, _ in header["delete"]] == shown["deleted"]
        assert header["shipped"] == {rel: e.sha256 for rel, e in tree.files.items()}
        sent = [entry[0] for entry in header["files"]]
        assert sent == sorted(shown["added"] + shown["changed"])
        assert [entry[1:] for entry in header["files"]] == [
            [tree.files[rel].size, tree.files[rel].mode, None, tree.files[rel].sha256] for rel in sent
        ]
        assert payload == b"".join(PROJECT[rel][0] for rel in sent)
        assert len(payload) == shown["bytes_sent"]
        name = bundle.remote.rpartition("/")[2]
        assert bundle.remote == f"{shown['dest']}/{name}" and bundle.mode == 0o600
        assert json_argument(applied.command) == {
            "op": "apply",
            "dest": shown["dest"],
            "bundle": name,
            "shared": {"name": node, "tokens": {"a": ANY, "b": ANY}, "order": ["a", "b"]},
        }
        assert not applied.become and not first.become


def test_an_environment_sync_forgets_the_nodes_facts_not_what_other_steps_read(tmp_path: Path) -> None:
    """A node whose environment was built is asked for its facts (Python, torch) again by the phases
    after; its firewall reading and its clock sample, which the build did not change, are kept."""
    facts = SESSION_KEY_PREFIX + "/usr/bin/python3 route"
    seed = {facts: "before the build", "firewall.detection": "read before", "clock": "sampled before"}
    _, dry_session, _, real_session, _ = sync_runs(tmp_path, seed=seed)
    for node in ("a", "b"):
        assert set(dry_session.keys(node)) >= set(seed)  # a dry run changes nothing
        assert facts not in real_session.keys(node)
        assert real_session.recall(node, "firewall.detection") == "read before"
        assert real_session.recall(node, "clock") == "sampled before"


def test_a_streaming_run_holds_no_generated_file_in_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch's plan uploads rendered files, then streams the training for hours. A controller
    killed meanwhile (kill -9, a closed laptop) runs no cleanup: nothing the plan generated may still
    sit in the temporary directory while the training streams. The upload itself is what the plan
    says."""
    import tempfile

    from orchestrator.plans import NodePlan, Put, Run, apply

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    node = RecordingNode("n1", lambda command: ("step 1\n", 0))
    seen_during_run: list[list[str]] = []
    plan = NodePlan(
        "n1",
        [
            Put("/w/run/launch.sh", data=b"#!/bin/sh\necho hi\n", mode=0o700, what="launch script"),
            Run("sh /w/run/launch.sh", stream=True, what="training"),
        ],
    )
    lines: list[str] = []
    apply(
        plan,
        node,
        output=lambda stream, line: lines.append(line),
        before=lambda run: seen_during_run.append(sorted(p.name for p in tmp_path.iterdir())),
    )
    assert seen_during_run == [[]]
    assert node.log[0] == Upload("/w/run/launch.sh", b"#!/bin/sh\necho hi\n", 0o700)
    assert lines == ["step 1"]
