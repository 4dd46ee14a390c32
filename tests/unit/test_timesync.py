"""Time sync planning: inventory settings, chrony configuration per layout, the scripts (run for real by
/bin/sh on files in a temporary directory, with a stub chronyc), restore, and the w32time PowerShell
(parsed with tree-sitter and asserted on the tree)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.facts.base import split_sections
from orchestrator.facts.network import InterfaceAddress, Route
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.platforms.powershell import PowerShell
from orchestrator.steps.timesync import NodeTime
from orchestrator.steps.timesync import chrony as c
from orchestrator.steps.timesync import windows as w
from orchestrator.steps.timesync.apply import no_reply_problem
from orchestrator.steps.timesync.master import _Addresses, follow_master, master_identity, roles
from orchestrator.steps.timesync.verify import judge_wait
from tests import pwsh
from tests.noderecords import NONCE
from tests.winrm_server.cmdline import split as split_command_line

SH = PosixShell()


def _inventory(time: str = "") -> str:
    block = f"  time:\n{time}" if time else ""
    return (
        f"cluster:\n  master: m\n{block}nodes:\n"
        "  - {name: m, host: 10.0.0.1}\n  - {name: w1, host: 10.0.0.2}\n  - {name: w2, host: 10.0.0.3}\n"
    )


ADDR = _Addresses("10.0.0.1", {"w2": "10.0.0.3", "w1": "10.0.0.2"})


# -- inventory ---------------------------------------------------------------------------------------


def test_default_time_settings_serve_from_the_master() -> None:
    inv = load_inventory_text(_inventory(), "h.yaml")
    settings = inv.cluster.time
    assert settings.manage and settings.serving and settings.max_offset_ms == 100 and not settings.install
    r = roles(inv, ADDR)
    assert r["m"] == c.ChronyRole((), serve=True, allow=("10.0.0.2", "10.0.0.3"))
    assert r["w1"] == c.ChronyRole(("10.0.0.1",), prefer_first=True)


def test_servers_are_followed_by_every_node_unless_the_master_serves() -> None:
    inv = load_inventory_text(_inventory("    servers: [pool.ntp.org, 10.9.9.9]\n"), "h.yaml")
    assert not inv.cluster.time.serving
    r = roles(inv, ADDR)
    assert {role.sources for role in r.values()} == {("pool.ntp.org", "10.9.9.9")}
    assert not any(role.serve for role in r.values())
    inv = load_inventory_text(_inventory("    servers: ntp.lab\n    serve_from_master: true\n"), "h.yaml")
    r = roles(inv, ADDR)
    assert r["m"].sources == ("ntp.lab",) and r["m"].serve
    assert r["w2"].sources == ("10.0.0.1",)


@pytest.mark.parametrize(
    ("time", "message"),
    [
        ("    serve_from_master: false\n", "serve_from_master: false needs servers (or manage: false)"),
        ("    max_offset_ms: 0\n", "field 'time.max_offset_ms': expected a number of milliseconds > 0"),
        ("    max_offset_ms: true\n", "field 'time.max_offset_ms'"),
        ("    servers: ['a b']\n", "is not a host name or address"),
        ("    sever: [x]\n", "unknown field 'sever'; did you mean 'servers'?"),
    ],
)
def test_bad_time_settings_are_named(time: str, message: str) -> None:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(_inventory(time), "h.yaml")
    assert message in str(info.value)


# -- the master's address: the inventory's or the master's own, never the workers' votes --------------


def _route(target: str, address: str | None, source: str | None = "10.0.0.2") -> Route:
    return Route(target, address, "eth0" if address else None, source if address else None, False)


OWN = (InterfaceAddress("lo", "127.0.0.1", 8), InterfaceAddress("eth0", "10.0.0.1", 24))


def test_master_address_comes_from_the_inventory_or_the_master_itself() -> None:
    literal = master_identity("10.0.0.1", None, None)
    assert (literal.address, literal.why) == ("10.0.0.1", "10.0.0.1, its host in the inventory")
    named = master_identity("m.lab", _route("m.lab", "10.0.0.1"), OWN)
    assert named.address == "10.0.0.1" and named.addresses == {"10.0.0.1"}  # loopback is never one
    # Debian's 127.0.1.1 trap on the master: its only non-loopback address is used
    assert master_identity("m.lab", _route("m.lab", "127.0.1.1"), OWN).address == "10.0.0.1"
    two = (*OWN, InterfaceAddress("eth1", "10.1.0.1", 24))
    unknown = master_identity("m.lab", _route("m.lab", "127.0.1.1"), two)
    assert unknown.address is None and "write the master's IP address as its host" in unknown.why
    unreachable = master_identity("m.lab", None, None, error="connection refused")
    assert unreachable.address is None and "connection refused" in unreachable.why


def test_a_worker_resolving_the_master_elsewhere_is_named_and_never_followed() -> None:
    master = master_identity("m.lab", _route("m.lab", "10.0.0.1"), OWN)
    assert follow_master("w1", "m.lab", _route("m.lab", "10.0.0.1"), master) == ("10.0.0.1", None)
    assert follow_master("w1", "m.lab", _route("m.lab", None), master) == ("10.0.0.1", None)  # no answer
    server, problem = follow_master("w2", "m.lab", _route("m.lab", "6.6.6.6"), master)
    assert server is None and problem is not None
    assert "resolves the master's host 'm.lab' to 6.6.6.6, but the master is 10.0.0.1" in problem
    assert "/etc/hosts or DNS on w2" in problem
    # a multi-homed master: any of its own addresses is fine, each worker follows what it reaches
    multi = master_identity("10.0.0.1", None, (*OWN, InterfaceAddress("eth1", "10.1.0.1", 24)))
    assert follow_master("w3", "10.1.0.1", _route("10.1.0.1", "10.1.0.1"), multi) == ("10.1.0.1", None)


def test_roles_follow_each_workers_checked_server_and_skip_the_disagreeing_one() -> None:
    inv = load_inventory_text(_inventory(), "h.yaml")
    # one worker resolved the master to 6.6.6.6: it gets no role; the other follows the real master
    addresses = _Addresses(
        "10.0.0.1", {"w1": "10.0.0.2"}, servers={"w1": "10.0.0.1"}, problems={"w2": "resolves ... 6.6.6.6"}
    )
    r = roles(inv, addresses)
    assert r["w1"] == c.ChronyRole(("10.0.0.1",), prefer_first=True) and "w2" not in r
    assert r["m"].allow == ("10.0.0.2",)
    mixed = roles(inv, _Addresses("10.0.0.1", {"w2": "fd00::3", "w1": "10.0.0.10", "w3": "10.0.0.9"}))
    assert mixed["m"].allow == ("10.0.0.9", "10.0.0.10", "fd00::3")  # numeric order, IPv4 first


@pytest.mark.parametrize(
    "role",
    [
        {"sources": (), "serve": True, "allow": ("all",)},  # chrony: every host
        {"sources": (), "serve": True, "allow": ("0.0.0.0/0",)},
        {"sources": (), "serve": True, "allow": ("10.0.0.2\nallow",)},
        {"sources": ("6.6.6.6 iburst\nallow",)},
        {"sources": ("-x",)},
        {"sources": ("127.0.0.1",), "allow": ("127.0.0.1",)},
    ],
)
def test_nothing_but_addresses_and_host_names_reaches_a_chrony_configuration(role: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        c.ChronyRole(**role)  # type: ignore[arg-type]


# -- configuration -----------------------------------------------------------------------------------


def test_directives_pool_server_prefer_local_allow() -> None:
    text = c.directives(c.ChronyRole(("2.debian.pool.ntp.org", "ntp.lab"), serve=True, allow=("10.0.0.2",)))
    assert text == (
        "pool 2.debian.pool.ntp.org iburst\nserver ntp.lab iburst\nlocal stratum 10\nallow 10.0.0.2\n"
    )
    assert c.directives(c.ChronyRole(("10.0.0.1",), prefer_first=True)) == "server 10.0.0.1 iburst prefer\n"


def _probe(files: Mapping[str, bytes | None], **kw: object) -> c.Probe:
    probe = c.Probe(files=dict(files), etc_chrony=True, chronyd="/usr/sbin/chronyd", **kw)  # type: ignore[arg-type]
    probe.main = next((p for p in c.MAIN_CANDIDATES if files.get(p) is not None), None)
    return probe


ROLE = c.ChronyRole(("10.0.0.1",), prefer_first=True)


def test_debian_layout_gets_a_dropin_and_keeps_its_file() -> None:
    main = b"confdir /etc/chrony/conf.d\ndriftfile /var/lib/chrony/chrony.drift\n"
    mode, change = c.plan_config(_probe({"/etc/chrony/chrony.conf": main}), ROLE)
    assert (mode, change.path, change.before, change.backup) == (
        "dropin",
        "/etc/chrony/conf.d/cluster-bootstrap.conf",
        None,
        False,
    )
    assert change.after == (c.HEADER + "server 10.0.0.1 iburst prefer\n").encode()
    # second run: the same bytes are there: nothing to change
    again = _probe({"/etc/chrony/chrony.conf": main, change.path: change.after})
    assert not c.plan_config(again, ROLE)[1].changed


def test_dropin_of_someone_else_is_backed_up_once() -> None:
    path = "/etc/chrony/conf.d/cluster-bootstrap.conf"
    files = {"/etc/chrony/chrony.conf": b"confdir /etc/chrony/conf.d\n", path: b"server x\n"}
    assert c.plan_config(_probe(files), ROLE)[1].backup
    files[path + c.BACKUP_SUFFIX] = b"server x\n"
    assert not c.plan_config(_probe(files), ROLE)[1].backup


def test_rhel_layout_gets_one_marked_block_replaced_on_change() -> None:
    main = b"pool 2.rhel.pool.ntp.org iburst\nmakestep 1.0 3"  # no final newline
    mode, change = c.plan_config(_probe({"/etc/chrony/chrony.conf": main}), ROLE)
    assert mode == "block" and change.backup
    assert change.after.startswith(main + b"\n" + c.BLOCK_BEGIN.encode() + b"\nserver 10.0.0.1")
    # a later run with another master replaces the block, keeps the first backup
    files = {"/etc/chrony/chrony.conf": change.after, "/etc/chrony/chrony.conf" + c.BACKUP_SUFFIX: main}
    _, second = c.plan_config(_probe(files), c.ChronyRole(("10.0.0.9",), prefer_first=True))
    assert not second.backup and second.after.count(c.BLOCK_BEGIN.encode()) == 1
    assert b"10.0.0.9" in second.after and b"10.0.0.1" not in second.after
    assert "-server 10.0.0.1 iburst prefer\n+server 10.0.0.9 iburst prefer" in second.diff()


def test_no_config_at_all_gets_a_whole_file_ours_on_every_run() -> None:
    mode, change = c.plan_config(_probe({"/etc/chrony/chrony.conf": None}), ROLE)
    assert mode == "file" and change.path == "/etc/chrony/chrony.conf" and change.before is None
    assert b"driftfile" in change.after
    again = _probe({"/etc/chrony/chrony.conf": change.after})
    assert c.plan_config(again, ROLE) == (
        "file",
        c.FileChange(change.path, change.after, change.after, False),
    )


def test_probe_output_is_parsed() -> None:
    conf = b"confdir /etc/chrony/conf.d\n"
    sources = b"^,*,10.0.0.1,10,6,377,12,0.000012,0.000010,0.000034\n"
    out = "\n".join(
        [
            "os debian",
            "etcchrony yes",
            "chronyd /usr/sbin/chronyd",
            "pkg apt-get",
            "user _chrony",
            "sharedclock yes",
            "file /etc/chrony/chrony.conf " + base64.b64encode(conf).decode(),
            "nofile /etc/chrony/chrony.conf.cluster-bootstrap.state",
            "main /etc/chrony/chrony.conf",
            "pidfile /run/chrony/chronyd.pid",
            "running 4242",
            "cmdline chronyd -f /etc/chrony/chrony.conf -x",
            "sources " + base64.b64encode(sources).decode(),
        ]
    )
    probe = c.parse_probe(out)
    assert probe.shared_clock and probe.etc_chrony and probe.running_pid == 4242
    assert probe.files["/etc/chrony/chrony.conf"] == conf and probe.state == {}
    assert probe.package_manager == "apt-get" and probe.chrony_user == "_chrony"
    assert c.parse_sources(probe.sources_csv)[0].selected


def test_chronyc_csv_is_parsed() -> None:
    # recorded from chrony 4.3 in a test namespace (chronyc -n -c sources; chronyc -c tracking)
    sources = c.parse_sources(
        "^,*,198.18.96.11,10,6,7,1,0.000006740,-0.000005461,0.000033833\n^,?,x,0,6,0,4294967295,0,0,0\n"
    )
    assert sources[0] == c.SourceLine("*", "198.18.96.11", 10, 7, 0.00000674, 0.000033833)
    assert c.describe_sources(sources) == "198.18.96.11"
    tracking = c.parse_tracking(
        "C612600B,198.18.96.11,11,1796225219.798736702,0.000012201,-0.000012201,0.000012201,0.000,"
        "-8.123,1000000.000,0.000066814,1.437135816,0.0,Normal\n"
    )
    assert tracking["leap"] == "Normal" and tracking["ref"] == "198.18.96.11"


# -- starting and stopping ---------------------------------------------------------------------------


def test_shared_clock_or_the_option_means_chronyd_minus_x() -> None:
    base = {"/etc/chrony/chrony.conf": b"x\n"}
    shared = c.start_script(SH, _probe(base, shared_clock=True), no_clock_control=False, restart=False)
    assert "/usr/sbin/chronyd -f /etc/chrony/chrony.conf -x" in shared
    own = c.start_script(SH, _probe(base), no_clock_control=False, restart=False)
    assert " -x" not in own and "/usr/sbin/chronyd -f /etc/chrony/chrony.conf ||" in own
    forced = c.start_script(SH, _probe(base), no_clock_control=True, restart=False)
    assert " -x" in forced


def test_systemd_restarts_the_unit_and_records_only_a_unit_it_started() -> None:
    base = {"/etc/chrony/chrony.conf": b"x\n"}
    inactive = _probe(base, systemd=True, unit="chrony.service")
    script = c.start_script(SH, inactive, no_clock_control=False, restart=False)
    assert "systemctl restart chrony.service" in script and "unit=" in script
    active = _probe(base, systemd=True, unit="chrony.service", unit_active=True)
    assert "unit=" not in c.start_script(SH, active, no_clock_control=False, restart=True)


def test_a_chronyd_we_did_not_start_is_not_killed() -> None:
    probe = _probe({"/etc/chrony/chrony.conf": b"x\n"}, running_pid=77, running_cmdline="chronyd -d")
    with pytest.raises(c.ForeignChronyd, match="pid 77"):
        c.start_script(SH, probe, no_clock_control=False, restart=True)


def _sh(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=30)


def _wait(env: dict[str, str], **asked: float | bool) -> c.WaitAnswer:
    """The wait's sections run here by /bin/sh in one round trip (as the runner sends them), read."""
    result = _sh(SH.sectioned(c.wait_sections(**asked), NONCE), env)  # type: ignore[arg-type]
    assert result.returncode == 0, result
    return c.parse_wait(split_sections(result.stdout, NONCE))


def test_write_then_restore_is_byte_identical(tmp_path: Path) -> None:
    main = tmp_path / "chrony.conf"
    original = b"pool a iburst\n# no newline at the end"
    main.write_bytes(original)
    main.chmod(0o640)
    files: dict[str, bytes | None] = {str(main): original}
    change = c.FileChange(
        str(main), original, c.replace_block(original.decode(), "server b\n").encode(), True
    )
    assert _sh(c.write_file_script(SH, change)).returncode == 0
    assert main.read_bytes() == change.after and main.stat().st_mode & 0o777 == 0o640
    files = {str(main): change.after, str(main) + c.BACKUP_SUFFIX: original}
    probe = c.Probe(files=files, main=str(main))
    plan = c.plan_restore(SH, probe)
    assert plan.actions == [f"restored {main}"]
    assert _sh(plan.script).returncode == 0
    assert main.read_bytes() == original and main.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chrony.conf"]


def test_restore_removes_what_we_created_and_stops_our_chronyd(tmp_path: Path) -> None:
    created = tmp_path / "cluster-bootstrap.conf"
    created.write_bytes((c.HEADER + "server x\n").encode())
    main = tmp_path / "chrony.conf"
    main.write_bytes(b"confdir x\n")
    state = str(main) + c.STATE_SUFFIX
    Path(state).write_text("pid=4242\n")
    files: dict[str, bytes | None] = {
        str(created): created.read_bytes(),
        str(main): b"confdir x\n",
        state: b"pid=4242\n",
    }
    probe = c.Probe(files=files, main=str(main), running_pid=4242)
    plan = c.plan_restore(SH, probe)
    assert plan.actions == [f"removed {created}", "stopped chronyd (pid 4242) that bootstrap ntp started"]
    # the stop only signals a process whose name is chronyd: pid 4242 here is not, so nothing is killed
    assert 'comm 2>/dev/null)" = chronyd' in plan.script
    assert _sh(plan.script).returncode == 0
    assert not created.exists() and not Path(state).exists() and main.read_bytes() == b"confdir x\n"
    nothing = c.plan_restore(SH, c.Probe(files={str(main): b"confdir x\n"}, main=str(main)))
    assert nothing.script == "" and nothing.actions == []


@pytest.mark.parametrize(
    ("csv", "max_s", "has_sources", "rc"),
    [
        ("^,*,10.0.0.1,10,6,7,1,0.000006740,0,0.00003\n", 0.1, True, 0),
        ("^,*,10.0.0.1,10,6,7,1,-0.25,0,0.00003\n", 0.1, True, 3),  # selected, still too far
        ("^,?,10.0.0.1,0,6,0,-,0,0,0\n", 0.1, True, 3),  # nothing selected
    ],
)
def test_wait_script_awaits_a_selected_source_within_the_limit(
    tmp_path: Path, csv: str, max_s: float, has_sources: bool, rc: int
) -> None:
    chronyc = tmp_path / "chronyc"
    (tmp_path / "sources.csv").write_text(csv)
    chronyc.write_text(
        f'#!/bin/sh\ncase "$*" in *sources*) cat {tmp_path}/sources.csv;; '
        "*) echo 7F7F0101,,10,0,0,0,0,0,0,0,0,0,0.0,Normal;; esac\n"
    )
    chronyc.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    answer = _wait(env, max_offset_s=max_s, timeout=1, has_sources=has_sources)
    assert answer.exit_code == rc, answer
    assert (
        c.parse_sources(answer.sources)[0].address == "10.0.0.1"
        and c.parse_tracking(answer.tracking)["leap"] == "Normal"
    )


def test_master_without_sources_waits_for_a_normal_leap_status(tmp_path: Path) -> None:
    chronyc = tmp_path / "chronyc"
    chronyc.write_text("#!/bin/sh\necho 7F7F0101,,10,0,0,0,0,0,0,0,0,0,0.0,Normal\n")
    chronyc.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    assert _wait(env, max_offset_s=0.1, timeout=1, has_sources=False).exit_code == 0


def test_install_commands() -> None:
    assert c.install_command("apt-get") == "DEBIAN_FRONTEND=noninteractive apt-get install -y -q chrony"
    assert c.install_command("dnf") == "dnf install -y -q chrony"
    assert c.install_command(None) is None


# -- Windows: w32time --------------------------------------------------------------------------------


def _native_argv(tree_commands: list[pwsh.Command], script: str) -> list[list[str]]:
    """argv of every native program the script starts (PowerShell.native: Get-Command -Name 'prog',
    then $cbInfo.Arguments = '...' holding the Windows command line)."""
    # each parameter of Get-Command takes one value: the value of -Name sits at its index
    names = [
        cmd.arguments[cmd.parameters.index("-name")].strip("'")
        for cmd in tree_commands
        if cmd.name == "Get-Command"
    ]
    lines = [
        line.split("=", 1)[1].strip().strip("'").replace("''", "'")
        for line in script.splitlines()
        if line.strip().startswith("$cbInfo.Arguments =")
    ]
    assert len(names) == len(lines)
    return [[name, *split_command_line("x " + line)[1:]] for name, line in zip(names, lines, strict=True)]


def test_w32time_configure_script_parses_and_sets_the_peers() -> None:
    shell = PowerShell()
    script = shell.wrap(w.configure_script(["10.0.0.1", "ntp-1.lab"]), become=True)
    tree = pwsh.assert_parses(script)
    commands = pwsh.commands(tree)
    names = [cmd.name for cmd in commands]
    assert "Set-Service" in names and "Restart-Service" in names
    restart = next(cmd for cmd in commands if cmd.name == "Restart-Service")
    assert restart.has("-Name") and restart.has("-Force") and "w32time" in restart.arguments
    argv = _native_argv(commands, script)
    assert argv[0] == [
        "w32tm",
        "/config",
        "/manualpeerlist:10.0.0.1,0x8 ntp-1.lab,0x8",
        "/syncfromflags:manual",
        "/reliable:no",
        "/update",
    ]
    assert argv[1] == ["w32tm", "/resync", "/force"]
    assert "$cbWanted = '10.0.0.1,0x8 ntp-1.lab,0x8'" in script  # quoted by the platform
    assert "Write-Output 'unchanged'" in script  # idempotent: same peers, running: nothing touched
    # a peer is an address or a DNS name, nothing that could add peers or leave the quotes
    for bad in ("o'brien.lab", "a b", "10.0.0.1,0x8 6.6.6.6", "-x", ""):
        with pytest.raises(ValueError):
            w.configure_script([bad])
        with pytest.raises(ValueError):
            w.status_script(bad)


def test_w32time_status_and_restore_scripts_parse() -> None:
    shell = PowerShell()
    status = shell.wrap(w.status_script("10.0.0.1"))
    argv = _native_argv(pwsh.commands(pwsh.assert_parses(status)), status)
    assert argv == [
        ["w32tm", "/query", "/status"],
        ["w32tm", "/stripchart", "/computer:10.0.0.1", "/samples:3", "/dataonly"],
    ]
    restore = shell.wrap(w.restore_script(), become=True)
    commands = pwsh.commands(pwsh.assert_parses(restore))
    set_props = [cmd for cmd in commands if cmd.name == "Set-ItemProperty"]
    assert [cmd.arguments[1] for cmd in set_props] == ["NtpServer", "Type"]
    assert _native_argv(commands, restore) == [["w32tm", "/config", "/update"]]


def test_stripchart_offsets() -> None:
    out = (
        "Tracking 10.0.0.1 [10.0.0.1:123].\nCollecting 3 samples.\n"
        "The current time is 02/12/2026 10:15:00.\n"
        "10:15:00, +00.0012345s\n10:15:02, -00.0020000s\n10:15:04, +00.0005000s\n"
    )
    assert w.parse_stripchart(out) == pytest.approx(0.0005)
    assert w.parse_stripchart("error: 0x800705B4") is None


# -- a source that never answers: known after a few requests, not after the whole timeout -------------

# `chronyc -n ntpdata` of a worker whose master drops UDP 123 (chrony 4.3, a test namespace)
NTPDATA_BLOCKED = """\
Remote address  : 198.18.81.11 (C612510B)
Remote port     : 123
Local address   : [UNSPEC] (00000000)
Leap status     : Normal
Reference time  : Thu Jan 01 00:00:00 1970
NTP tests       : 000 000 0000
Total TX        : 4
Total RX        : 0
Total valid RX  : 0
Total good RX   : 0
"""


def _blocked_chronyc(tmp_path: Path, *, sent: int, reach: str = "0") -> dict[str, str]:
    """A stub chronyc for one source 10.0.0.1 that never answers: each `ntpdata` reports one more
    request sent (chronyd keeps asking), `burst` is recorded. Returns the environment using it."""
    (tmp_path / "tx").write_text(str(sent))
    chronyc = tmp_path / "chronyc"
    chronyc.write_text(
        "#!/bin/sh\n"
        f'd={tmp_path}\ncase "$*" in\n'
        f'  *sources*) echo "^,?,10.0.0.1,0,6,{reach},4294967295,0.000000000,0.000000000,0.000000000";;\n'
        '  *ntpdata*) n=$(($(cat "$d/tx") + 1)); echo "$n" > "$d/tx"\n'
        "    printf 'Remote address  : 10.0.0.1 (0A000001)\\nRemote port     : 123\\n"
        'Total TX        : %s\\nTotal RX        : 0\\n\' "$n";;\n'
        '  *burst*) echo "$*" >> "$d/calls"; echo "200 OK";;\n'
        "  *) echo 00000000,,0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,1.0,1.0,0.0,Not synchronised;;\n"
        "esac\n"
    )
    chronyc.chmod(0o755)
    return {"PATH": f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def test_ntpdata_is_read_by_label() -> None:
    assert c.parse_ntpdata(NTPDATA_BLOCKED) == {"198.18.81.11": c.Traffic("198.18.81.11", 4, 0)}
    two = NTPDATA_BLOCKED + "\n" + NTPDATA_BLOCKED.replace("81.11", "81.12").replace(": 4\n", ": 9\n")
    said = c.parse_wait({c.WAIT: ("", 0), c.TRACKING: ("x", 0), c.NTPDATA: (two, 0)})
    assert c.parse_ntpdata(said.ntpdata)["198.18.81.12"].sent == 9
    assert c.parse_ntpdata("506 Cannot talk to daemon\n") == {}


def test_wait_ends_as_soon_as_no_source_answers(tmp_path: Path) -> None:
    """A fresh chronyd whose only source never answers: the wait ends once 4 requests went unanswered
    (exit 4), long before its 30 s deadline."""
    env = _blocked_chronyc(tmp_path, sent=0)
    started = time.monotonic()
    answer = _wait(env, max_offset_s=0.1, timeout=30, has_sources=True)
    took = time.monotonic() - started
    assert answer.exit_code == c.NO_REPLY_EXIT, f"{answer} after {took:.1f} s"
    assert c.parse_ntpdata(answer.ntpdata)["10.0.0.1"].received == 0


def test_wait_asks_a_stale_source_again_and_judges_only_the_new_requests(tmp_path: Path) -> None:
    """Requests that went unanswered before the wait (an earlier run, before the firewall opened) do
    not decide: chronyd is asked for a burst (again and again: a burst under way, such as chronyd's
    initial one, ignores the request), and only requests sent during the wait count."""
    env = _blocked_chronyc(tmp_path, sent=40)
    answer = _wait(env, max_offset_s=0.1, timeout=30, has_sources=True)
    assert answer.exit_code == c.NO_REPLY_EXIT, answer
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls and set(calls) == {f"burst {c.UNANSWERED_REQUESTS}/{c.UNANSWERED_REQUESTS}"}, calls
    # 41 when the wait started; then until 4 more requests were seen
    assert c.parse_ntpdata(answer.ntpdata)["10.0.0.1"].sent >= 41 + c.UNANSWERED_REQUESTS


def test_a_source_that_answered_is_waited_for_until_the_deadline(tmp_path: Path) -> None:
    """It answered (not "no reply"), but is not selected yet: chronyd is kept sampling (its next poll
    after a burst, or after answers it missed, may be minutes away) until the deadline."""
    env = _blocked_chronyc(tmp_path, sent=10, reach="1")
    answer = _wait(env, max_offset_s=0.1, timeout=1, has_sources=True)
    assert answer.exit_code == 3, answer
    assert (tmp_path / "calls").read_text().startswith(f"burst {c.UNANSWERED_REQUESTS}/"), answer


def test_a_worker_whose_master_never_answers_fails_with_the_reason_and_no_source(tmp_path: Path) -> None:
    """Not `added` with the master shown as its source: failed, following nothing, and the problem
    names the blocked UDP 123 and the fix."""
    inv = load_inventory_text(_inventory(), "h.yaml")
    role = roles(inv, ADDR)["w1"]
    value = NodeTime("w1", role="client", daemon="chrony", state="added", sources=["10.0.0.1"])
    answer = _wait(_blocked_chronyc(tmp_path, sent=0), max_offset_s=0.1, timeout=30, has_sources=True)
    judge_wait("w1", value, role, answer, 100.0, 30.0, own_address="10.0.0.2")
    assert value.state == "failed" and value.selected is None and value.chrony_offset_ms is None
    assert value.problem is not None
    assert re.match(
        r"no time source: the master \(10\.0\.0\.1\) answered none of the [0-9]+ NTP", value.problem
    )
    assert "UDP 123 to the master is blocked: run `bootstrap firewall` (the pipeline does)" in value.problem
    assert "open UDP 123 from 10.0.0.2 on the master" in value.problem
    assert value.source(dry_run=False) == "none"


def test_no_reply_from_upstream_servers_names_them() -> None:
    role = c.ChronyRole(("10.9.9.9", "ntp.lab"))
    traffic = {"10.9.9.9": c.Traffic("10.9.9.9", 5, 0)}
    problem = no_reply_problem("w2", role, traffic, master=None, own_address=None)
    assert "(10.9.9.9: 5 sent, 0 answered, ntp.lab)" in problem
    assert "check that UDP 123 reaches them from w2" in problem and "bootstrap firewall" not in problem


def test_the_source_column_shows_only_what_a_node_follows() -> None:
    value = NodeTime("w1", sources=["10.0.0.1"])
    assert value.source(dry_run=False) == "none"  # configured, never followed
    assert value.source(dry_run=True) == "10.0.0.1 (planned)"
    value.selected = "10.0.0.1"
    assert value.source(dry_run=False) == "10.0.0.1"
    assert NodeTime("m", sources=["local clock"]).source(dry_run=False) == "local clock"
    assert NodeTime("m").source(dry_run=False) == "-"  # not managed: nothing configured


def test_windows_workers_are_allowed_by_the_serving_master() -> None:
    """A Windows worker's w32time asks the Linux master: the master's chrony must allow it (it listed
    only Linux workers before)."""
    from orchestrator.steps.timesync.master import windows_clients

    inv = load_inventory_text(
        "nodes:\n"
        "  - {name: m, host: 10.0.0.1}\n"
        "  - {name: w1, host: 10.0.0.2}\n"
        "  - {name: pc, host: 10.0.0.7, os: windows}\n"
        "  - {name: pc2, host: gaming-pc.lan, os: windows}\n"
        "  - {name: pc3, host: nowhere.lan, os: windows}\n"
        "cluster: {master: m}\n",
        "h.yaml",
    )

    def resolve(name: str) -> str:
        if name == "gaming-pc.lan":
            return "10.0.0.8"
        raise OSError("not found")

    allowed, problems = windows_clients(inv, resolve)
    assert allowed == {"pc": "10.0.0.7", "pc2": "10.0.0.8"}
    assert set(problems) == {"pc3"} and "nowhere.lan" in problems["pc3"] and "IP address" in problems["pc3"]
    addresses = _Addresses("10.0.0.1", {"w1": "10.0.0.2", **allowed}, problems=problems)
    assert roles(inv, addresses)["m"].allow == ("10.0.0.2", "10.0.0.7", "10.0.0.8")


# -- no wait where nothing changed -------------------------------------------------------------------

_TRACKING_NORMAL = "7F7F0101,,10,0,0,0,0,0,0,0,0,0,0.0,Normal\n"


def _running(sources: str = "", tracking: str = "") -> c.Probe:
    return c.Probe(chronyd="/usr/sbin/chronyd", running_pid=42, sources_csv=sources, tracking_csv=tracking)


@pytest.mark.parametrize(
    ("state", "sources", "settles"),
    [
        ("unchanged", "^,*,10.0.0.1,10,6,377,1,0.000020,0,0.00003\n", True),
        ("unchanged", "^,*,10.0.0.1,10,6,377,1,-0.250,0,0.00003\n", False),  # 250 ms off: wait
        ("unchanged", "^,?,10.0.0.1,0,6,0,-,0,0,0\n", False),  # nothing selected yet
        ("changed", "^,*,10.0.0.1,10,6,377,1,0.000020,0,0.00003\n", False),  # restarted: wait
    ],
)
def test_a_worker_with_nothing_changed_is_not_awaited_when_it_already_follows(
    state: str, sources: str, settles: bool
) -> None:
    """`ntp` with nothing to change sends no wait: what chronyd said when it was probed is the wait's
    own condition, and what it follows is recorded as the wait would have."""
    from orchestrator.steps.timesync.apply import settled

    value = NodeTime("w1", state=state)
    role = c.ChronyRole(("10.0.0.1",), prefer_first=True)
    assert settled(value, _running(sources), role, 100) is settles
    if settles:
        assert (value.selected, value.chrony_offset_ms) == ("10.0.0.1", 0.02)


def test_a_master_serving_its_own_clock_settles_on_a_normal_leap_status() -> None:
    from orchestrator.steps.timesync.apply import settled

    role = c.ChronyRole((), serve=True, allow=("10.0.0.2",))
    unsynced = "7F7F0101,,0,0,0,0,0,0,0,0,0,0,0.0,Not synchronised\n"
    assert not settled(NodeTime("m", state="unchanged"), _running(tracking=unsynced), role, 100)
    value = NodeTime("m", state="unchanged")
    assert settled(value, _running(tracking=_TRACKING_NORMAL), role, 100)
    assert value.chrony_offset_ms == 0.0 and value.selected is None


def test_the_probe_reads_chronyd_tracking_too() -> None:
    out = "running 4242\ntracking " + base64.b64encode(_TRACKING_NORMAL.encode()).decode()
    assert c.parse_tracking(c.parse_probe(out).tracking_csv)["leap"] == "Normal"


def test_a_reconfigured_master_has_every_worker_awaited_again() -> None:
    """Workers whose chrony was left as it was need no wait while they follow the master within the
    limit; once the serving master itself changed (restarted, other servers), each of them is awaited
    again: what they followed when probed is history."""
    from orchestrator.steps.timesync import to_await

    following = "^,*,10.0.0.1,10,6,377,1,0.000020,0,0.00003\n"
    probes = {
        "m": _running(tracking=_TRACKING_NORMAL),
        "w1": _running(following),
        "w2": _running("^,?,10.0.0.1,0,6,0,-,0,0,0\n"),
    }
    roles = {
        "m": c.ChronyRole((), serve=True, allow=("10.0.0.2", "10.0.0.3")),
        "w1": c.ChronyRole(("10.0.0.1",), prefer_first=True),
        "w2": c.ChronyRole(("10.0.0.1",), prefer_first=True),
    }

    def values(master_state: str) -> dict[str, NodeTime]:
        return {"m": NodeTime("m", state=master_state), "w1": NodeTime("w1", state="unchanged"),
                "w2": NodeTime("w2", state="unchanged")}  # fmt: skip

    assert to_await(values("unchanged"), probes, roles, "m", True, 100) == {"w2"}
    assert to_await(values("changed"), probes, roles, "m", True, 100) == {"m", "w1", "w2"}
    # nodes that follow servers of their own do not depend on the master
    assert to_await(values("changed"), probes, roles, "m", False, 100) == {"m", "w2"}


def test_the_time_sync_has_no_loop_over_nodes_of_its_own() -> None:
    """Every round trip of `bootstrap ntp` is the step runner's (issue 29): the time sync's modules
    hold no fan-out over the session and no transport in hand, so its dry run and its reads are the
    runner's, and the wait and the offsets are reads like any other."""
    import ast

    import orchestrator.steps.timesync as timesync

    package = Path(timesync.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("map", "run", "run_windows", "put"):
                found.append(f"{path.relative_to(package)}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in ("transport", "Transport"):
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.id}")
    assert found == []
