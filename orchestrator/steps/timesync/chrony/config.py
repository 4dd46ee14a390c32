"""The chrony configuration we want on a node (its role as directives, in a drop-in, a marked block or a
whole file) and the POSIX scripts that write it, (re)start chronyd and undo it all. Pure: script text.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import re
from dataclasses import dataclass

from orchestrator.platforms import PosixShell
from orchestrator.steps.timesync.chrony.probe import (
    BACKUP_SUFFIX,
    BLOCK_BEGIN,
    BLOCK_END,
    DROPIN_NAME,
    HEADER,
    STATE_SUFFIX,
    Probe,
    confdirs,
)

__all__ = [
    "LOCAL_STRATUM",
    "ChronyRole",
    "FileChange",
    "ForeignChronyd",
    "RestorePlan",
    "directives",
    "install_command",
    "peer_address",
    "plan_config",
    "plan_restore",
    "replace_block",
    "standalone_config",
    "start_script",
    "time_source",
    "write_file_script",
]

#: chrony's stratum when the master serves its own clock: 10 is what chrony's docs suggest for
#: ``local``: high enough that any real upstream (stratum 1-4) a client can also see wins over it
LOCAL_STRATUM = 10


# -- what we want ------------------------------------------------------------------------------------


#: a DNS name chrony and w32tm may be given (cluster.time.servers): labels of letters, digits, "-", "_"
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")  # .fullmatch only


def peer_address(text: object) -> str:
    """``text`` as an IP address a peer can be reached at (canonical); ValueError for anything else
    (a name, a network, loopback, unspecified, multicast): what may stand in an ``allow`` line or as
    the master's address in a worker's configuration."""
    try:
        ip = ipaddress.ip_address(str(text).strip()) if isinstance(text, str) else None
    except ValueError:
        ip = None
    if ip is None or ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"not an IP address a peer can use: {text!r}")
    return str(ip)


def time_source(text: object) -> str:
    """An NTP source: an IP address, or a DNS name (an inventory's ``time.servers``); ValueError else."""
    if isinstance(text, str):
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            if _HOST_NAME.fullmatch(text):
                return text
    raise ValueError(f"not an IP address or host name: {text!r}")


@dataclass(frozen=True)
class ChronyRole:
    """One node's part: follow ``sources``; when ``serve`` allow ``allow`` and keep ``local stratum``.

    What ends up in a chrony configuration is checked here, once: every source is an IP address or a
    DNS name, every ``allow`` an IP address (:func:`peer_address`); a role holding anything else (a
    value a node reported, such as ``all`` or ``0.0.0.0/0``) cannot be made.
    """

    sources: tuple[str, ...]
    serve: bool = False
    allow: tuple[str, ...] = ()
    prefer_first: bool = False  # workers of a serving master: the cluster agrees with the master

    def __post_init__(self) -> None:
        for source in self.sources:
            if time_source(source) != source:
                raise ValueError(f"not in canonical form: {source!r}")
        for address in self.allow:
            if peer_address(address) != address:
                raise ValueError(f"not in canonical form: {address!r}")


def _is_pool(name: str) -> bool:
    # "pool.ntp.org", "2.debian.pool.ntp.org": a DNS pool, many servers behind one name
    return "pool" in name.lower().split(".")


def directives(role: ChronyRole) -> str:
    """Our chrony directives (without header), one per line."""
    lines = []
    for i, source in enumerate(role.sources):
        kind = "pool" if _is_pool(source) else "server"
        prefer = " prefer" if role.prefer_first and i == 0 else ""
        lines.append(f"{kind} {source} iburst{prefer}")
    if role.serve:
        # serve the cluster even when the master has no upstream (labs without internet)
        lines.append(f"local stratum {LOCAL_STRATUM}")
        lines.extend(f"allow {a}" for a in role.allow)
    return "\n".join(lines) + "\n"


@dataclass
class FileChange:
    path: str
    before: bytes | None
    after: bytes
    backup: bool  # copy ``before`` to path + BACKUP_SUFFIX first

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        old = (self.before or b"").decode(errors="replace").splitlines(keepends=True)
        new = self.after.decode(errors="replace").splitlines(keepends=True)
        label = self.path if self.before is not None else "/dev/null"
        return "".join(difflib.unified_diff(old, new, label, self.path))


def _is_ours(content: bytes | None) -> bool:
    return content is not None and content.startswith(HEADER.encode())


def replace_block(text: str, body: str) -> str:
    """``text`` with our marked block holding ``body`` (replacing an earlier one, else appended)."""
    block = f"{BLOCK_BEGIN}\n{body}{BLOCK_END}\n"
    pattern = re.compile(re.escape(BLOCK_BEGIN) + r"\n.*?" + re.escape(BLOCK_END) + r"\n?", re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


def standalone_config(body: str) -> str:
    """A whole chrony.conf for a node that has none: our directives plus what chronyd needs to keep
    its state (drift) and to step a badly wrong clock at start (makestep, like Debian's default)."""
    return HEADER + "driftfile /var/lib/chrony/chrony.drift\nmakestep 1 3\n" + body


def plan_config(probe: Probe, role: ChronyRole) -> tuple[str, FileChange]:
    """(mode, the file change) that gives ``probe``'s node our directives."""
    body = directives(role)
    main = probe.main_path
    main_text = probe.text(main)
    if main_text is None or _is_ours(probe.files.get(main)):
        # no main file, or the one we wrote on an earlier run (restore deletes it)
        before = probe.files.get(main)
        return "file", FileChange(main, before, standalone_config(body).encode(), backup=False)
    dirs = confdirs(main_text)
    if dirs:
        path = f"{dirs[0].rstrip('/')}/{DROPIN_NAME}"
        before = probe.files.get(path)
        backup = before is not None and not _is_ours(before) and probe.files.get(path + BACKUP_SUFFIX) is None
        return "dropin", FileChange(path, before, (HEADER + body).encode(), backup=backup)
    raw = probe.files.get(main) or b""
    backup = BLOCK_BEGIN.encode() not in raw and probe.files.get(main + BACKUP_SUFFIX) is None
    return "block", FileChange(main, raw, replace_block(main_text, body).encode(), backup=backup)


# -- scripts -----------------------------------------------------------------------------------------


def install_command(package_manager: str | None) -> str | None:
    if package_manager == "apt-get":
        return "DEBIAN_FRONTEND=noninteractive apt-get install -y -q chrony"
    if package_manager in ("dnf", "yum"):
        return f"{package_manager} install -y -q chrony"
    return None


def write_file_script(shell: PosixShell, change: FileChange) -> str:
    """Back up (when asked), then replace ``change.path`` atomically with ``change.after``; an existing
    file keeps its mode and owner."""
    path = shell.quote(change.path)
    tmp = shell.quote(change.path + ".cluster-bootstrap.tmp")
    data = base64.b64encode(change.after).decode()
    lines = [f'mkdir -p -- "$(dirname {path})"']
    if change.backup:
        lines.append(f"cp -p -- {path} {shell.quote(change.path + BACKUP_SUFFIX)}")
    lines.append(f"printf %s {data} | base64 -d > {tmp}")
    lines.append(f"if [ -f {path} ]; then chmod --reference={path} {tmp}; chown --reference={path} {tmp}; fi")
    lines.append(f"mv -f -- {tmp} {path}")
    return "\n".join(lines)


def _stop_pid_script(pid_expr: str) -> str:
    """Stop the chronyd with pid ``pid_expr`` (shell word) and wait until it is gone (10 s, then KILL)."""
    return (
        f"p={pid_expr}\n"
        'if [ -n "$p" ] && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = chronyd ]; then\n'
        '  kill -TERM "$p"; n=0\n'
        '  while [ -e /proc/"$p" ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done\n'
        '  [ -e /proc/"$p" ] && kill -KILL "$p"\n'
        "fi"
    )


def start_script(shell: PosixShell, probe: Probe, *, no_clock_control: bool, restart: bool) -> str:
    """(Re)start chronyd so it reads the new configuration, and record what we started.

    With systemd: ``systemctl restart`` the unit (state: ``unit=...`` when it was inactive before).
    Without: stop the chronyd we started earlier (if any), then ``chronyd -f MAIN`` (it daemonizes and
    leaves our process group on its own; state: ``pid=...``). ``-x`` (never adjust the clock) when the
    node shares its kernel clock with another namespace or when asked: chronyd then only measures.
    """
    main = probe.main_path
    state = shell.quote(main + STATE_SUFFIX)
    previous = probe.state
    if probe.systemd and probe.unit:
        unit = shell.quote(probe.unit)
        lines = []
        if not probe.unit_active and "unit" not in previous:
            lines.append(f"printf 'unit=%s\\n' {unit} > {state}")
        lines.append(f"systemctl restart {unit}")
        return "\n".join(lines)
    user = probe.chrony_user
    lines = []
    if user:
        owner = shell.quote(user)
        lines.append(f"install -d -o {owner} -g {owner} -m 0750 /run/chrony /var/lib/chrony")
    else:
        lines.append("mkdir -p /run/chrony /var/lib/chrony")
    ours = previous.get("pid")
    if probe.running_pid is not None and restart:
        if ours != str(probe.running_pid):
            raise ForeignChronyd(probe.running_pid, probe.running_cmdline)
        lines.append(_stop_pid_script(shell.quote(ours)))
    flags = " -x" if (no_clock_control or probe.shared_clock) else ""
    chronyd = shell.quote(probe.chronyd or "chronyd")
    pidfile = shell.quote(probe.pidfile)
    lines.append(f"{chronyd} -f {shell.quote(main)}{flags} || exit 1")
    # chronyd writes its pidfile before its parent returns; a few tenths of a second of grace anyway
    lines.append(f'n=0; while [ ! -s {pidfile} ] && [ "$n" -lt 50 ]; do sleep 0.1; n=$((n + 1)); done')
    lines.append(f'printf "pid=%s\\n" "$(cat {pidfile})" > {state}')
    return "\n".join(lines)


class ForeignChronyd(Exception):
    """A chronyd we did not start runs without systemd: we cannot restart it with its own options."""

    def __init__(self, pid: int, cmdline: str) -> None:
        super().__init__(
            f"chronyd (pid {pid}: {cmdline or '?'}) runs without systemd and was not started by us"
        )
        self.pid = pid
        self.cmdline = cmdline


@dataclass
class RestorePlan:
    actions: list[str]  # human words
    script: str
    changes: list[FileChange]


def plan_restore(shell: PosixShell, probe: Probe) -> RestorePlan:
    """Put back every file we changed (from its backup, byte for byte), delete the ones we created, stop
    what we started (else restart the unit so it reads the old files), forget our state."""
    q = shell.quote
    lines: list[str] = []
    actions: list[str] = []
    changes: list[FileChange] = []
    for path, content in sorted(probe.files.items()):
        if path.endswith((BACKUP_SUFFIX, STATE_SUFFIX)):
            continue
        backup = probe.files.get(path + BACKUP_SUFFIX)
        if backup is not None:
            lines.append(f"mv -f -- {q(path + BACKUP_SUFFIX)} {q(path)}")
            actions.append(f"restored {path}")
            changes.append(FileChange(path, content, backup, backup=False))
        elif content is not None and (_is_ours(content) or BLOCK_BEGIN.encode() in content):
            if _is_ours(content):
                lines.append(f"rm -f -- {q(path)}")
                actions.append(f"removed {path}")
                changes.append(FileChange(path, content, b"", backup=False))
            else:  # a block without backup (backup deleted by hand): remove the block only
                text = content.decode(errors="replace")
                pattern = re.escape(BLOCK_BEGIN) + r"\n.*?" + re.escape(BLOCK_END) + r"\n?"
                kept = re.sub(pattern, "", text, flags=re.DOTALL).encode()
                lines.append(write_file_script(shell, FileChange(path, content, kept, backup=False)))
                actions.append(f"removed our block from {path}")
                changes.append(FileChange(path, content, kept, backup=False))
    state = probe.state
    main = probe.main_path
    stopped = False
    if "pid" in state and probe.running_pid is not None and state["pid"] == str(probe.running_pid):
        lines.append(_stop_pid_script(q(state["pid"])))
        actions.append(f"stopped chronyd (pid {state['pid']}) that bootstrap ntp started")
        stopped = True
    elif "unit" in state and probe.systemd:
        lines.append(f"systemctl stop {q(state['unit'])}")
        actions.append(f"stopped {state['unit']} (inactive before bootstrap ntp)")
        stopped = True
    if changes and not stopped and probe.systemd and probe.unit and probe.unit_active:
        lines.append(f"systemctl restart {q(probe.unit)}")
        actions.append(f"restarted {probe.unit} with the previous configuration")
    if probe.files.get(main + STATE_SUFFIX) is not None:
        lines.append(f"rm -f -- {q(main + STATE_SUFFIX)}")
    return RestorePlan(actions, "set -e\n" + "\n".join(lines) if lines else "", changes)
