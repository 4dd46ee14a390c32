"""chrony on Linux nodes: what the node has (probe), the configuration we want, and the POSIX scripts that
apply, await and undo it. Pure functions plus script text; nothing here runs anything.

Where our configuration goes (chrony reads one main file; see chrony.conf(5)):

- ``dropin``: the main file has a ``confdir`` (Debian/Ubuntu: ``/etc/chrony/conf.d``): we add
  ``<confdir>/cluster-bootstrap.conf`` and never touch the distribution's file.
- ``block``: no ``confdir`` (RHEL's ``/etc/chrony.conf``): a block between BEGIN/END markers is appended
  to the main file, after a byte-exact backup of it.
- ``file``: chronyd is installed but has no main file at all (minimal images, the test namespaces): we
  write the whole file, marked as ours.

Every file we change is first copied to ``<file>.cluster-bootstrap.bak`` (only when it was not ours and no
backup exists yet, so a second run keeps the true original); ``<main>.cluster-bootstrap.state`` records
what we started (a chronyd pid, or a systemd unit that was inactive) so ``--restore`` stops exactly that.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.platforms import PosixShell

MARK = "cluster-bootstrap"
HEADER = "# Written by cluster-bootstrap (`bootstrap ntp`); `bootstrap ntp --restore` undoes it.\n"
BLOCK_BEGIN = "# BEGIN cluster-bootstrap time sync (managed by `bootstrap ntp`; --restore removes it)"
BLOCK_END = "# END cluster-bootstrap time sync"
DROPIN_NAME = "cluster-bootstrap.conf"
BACKUP_SUFFIX = ".cluster-bootstrap.bak"
STATE_SUFFIX = ".cluster-bootstrap.state"
MAIN_CANDIDATES = ("/etc/chrony/chrony.conf", "/etc/chrony.conf")  # Debian, RHEL
DEFAULT_PIDFILE = "/run/chrony/chronyd.pid"
#: chrony's stratum when the master serves its own clock: 10 is what chrony's docs suggest for
#: ``local``: high enough that any real upstream (stratum 1-4) a client can also see wins over it
LOCAL_STRATUM = 10
#: NTP's port: a serving master's chronyd answers the workers there (UDP; `bootstrap firewall` opens it)
NTP_PORT = 123
#: seconds a node gets to select its source and bring its offset under the threshold
SYNC_TIMEOUT = 60.0
#: NTP requests to a source left without any reply before the wait gives up on it: ``iburst`` sends the
#: first four about 2 s apart, so a source that answers nothing is known after about 7 s, not after
#: the whole SYNC_TIMEOUT (one that answers late on a LAN is not a source to keep time by anyway)
UNANSWERED_REQUESTS = 4
#: the exit code of :func:`wait_script` when no source ever answered: what it is known by, at once
NO_REPLY_EXIT = 4

_B64 = re.compile(r"[A-Za-z0-9+/=]*")  # .fullmatch only


# -- what a node has ---------------------------------------------------------------------------------


@dataclass
class Probe:
    """What the probe script found on one Linux node."""

    os_id: str = ""
    systemd: bool = False
    chronyd: str | None = None  # path of the binary
    timesyncd_active: bool = False
    unit: str | None = None  # chrony.service (Debian) or chronyd.service (RHEL)
    unit_active: bool = False
    package_manager: str | None = None  # apt-get, dnf, yum
    etc_chrony: bool = False  # /etc/chrony is a directory (Debian layout)
    shared_clock: bool = False  # another network namespace than PID 1: shares a kernel clock
    files: dict[str, bytes | None] = field(default_factory=dict)  # path -> content (None: absent)
    main: str | None = None  # the main config file that exists, if any
    pidfile: str = DEFAULT_PIDFILE
    running_pid: int | None = None  # chronyd named by the pidfile, alive
    running_cmdline: str = ""
    sources_csv: str = ""  # chronyc -n -c sources, when running
    chrony_user: str | None = None

    @property
    def state(self) -> dict[str, str]:
        main = self.main_path
        raw = self.files.get(main + STATE_SUFFIX)
        return parse_state(raw.decode(errors="replace")) if raw else {}

    @property
    def main_path(self) -> str:
        """The main config file: the one that exists, else where the distribution keeps it."""
        if self.main:
            return self.main
        return MAIN_CANDIDATES[0] if self.etc_chrony else MAIN_CANDIDATES[1]

    def text(self, path: str) -> str | None:
        raw = self.files.get(path)
        return None if raw is None else raw.decode(errors="replace")


def probe_script(shell: PosixShell) -> str:
    """Read-only: what runs, which files exist (base64), as ``key value`` lines. Run as root (reading
    /proc/1/ns needs it; sudo refusing shows up here, before anything changes)."""
    q = shell.quote
    candidates = " ".join(q(p) for p in MAIN_CANDIDATES)
    return f"""\
dump() {{
  if [ -f "$1" ]; then printf 'file %s ' "$1"; base64 -w0 < "$1"; echo; else printf 'nofile %s\\n' "$1"; fi
}}
[ -r /etc/os-release ] && . /etc/os-release && echo "os ${{ID:-}}"
[ -d /run/systemd/system ] && echo "systemd yes"
[ -d /etc/chrony ] && echo "etcchrony yes"
c=$(command -v chronyd 2>/dev/null || {{ [ -x /usr/sbin/chronyd ] && echo /usr/sbin/chronyd; }})
[ -n "$c" ] && echo "chronyd $c"
for m in apt-get dnf yum; do command -v "$m" >/dev/null 2>&1 && {{ echo "pkg $m"; break; }}; done
for u in _chrony chrony; do id -u "$u" >/dev/null 2>&1 && {{ echo "user $u"; break; }}; done
# another network namespace than PID 1's: a container or test namespace sharing one kernel clock
if [ "$(readlink /proc/1/ns/net 2>/dev/null)" != "$(readlink /proc/self/ns/net 2>/dev/null)" ]; then
  echo "sharedclock yes"
fi
if [ -d /run/systemd/system ]; then
  systemctl is-active --quiet systemd-timesyncd 2>/dev/null && echo "timesyncd active"
  for u in chrony.service chronyd.service; do
    if [ "$(systemctl show -p LoadState --value "$u" 2>/dev/null)" = loaded ]; then
      echo "unit $u"; systemctl is-active --quiet "$u" && echo "unitactive yes"; break
    fi
  done
fi
main=
for f in {candidates}; do if [ -f "$f" ]; then main=$f; break; fi; done
for f in {candidates}; do dump "$f"; dump "$f{BACKUP_SUFFIX}"; dump "$f{STATE_SUFFIX}"; done
if [ -n "$main" ]; then
  echo "main $main"
  for d in $(awk '$1 == "confdir" {{ for (i = 2; i <= NF; i++) print $i }}' "$main"); do
    dump "$d/{DROPIN_NAME}"; dump "$d/{DROPIN_NAME}{BACKUP_SUFFIX}"
  done
  p=$(awk '$1 == "pidfile" {{ print $2 }}' "$main" | tail -n 1)
fi
p=${{p:-{DEFAULT_PIDFILE}}}
echo "pidfile $p"
pid=$(cat "$p" 2>/dev/null)
case "$pid" in ''|*[!0-9]*) ;; *)
  if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = chronyd ]; then
    echo "running $pid"; printf 'cmdline '; tr '\\0' ' ' < /proc/"$pid"/cmdline; echo
    printf 'sources '; chronyc -n -c sources 2>/dev/null | base64 -w0; echo
  fi;;
esac
exit 0
"""


def parse_probe(output: str) -> Probe:
    probe = Probe()
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        if key == "os":
            probe.os_id = value.strip()
        elif key == "systemd":
            probe.systemd = True
        elif key == "chronyd":
            probe.chronyd = value.strip() or None
        elif key == "pkg":
            probe.package_manager = value.strip()
        elif key == "user":
            probe.chrony_user = value.strip()
        elif key == "etcchrony":
            probe.etc_chrony = True
        elif key == "sharedclock":
            probe.shared_clock = True
        elif key == "timesyncd":
            probe.timesyncd_active = True
        elif key == "unit":
            probe.unit = value.strip()
        elif key == "unitactive":
            probe.unit_active = True
        elif key == "main":
            probe.main = value.strip()
        elif key == "pidfile":
            probe.pidfile = value.strip() or DEFAULT_PIDFILE
        elif key == "running" and value.strip().isdigit():
            probe.running_pid = int(value.strip())
        elif key == "cmdline":
            probe.running_cmdline = value.strip()
        elif key == "sources":
            probe.sources_csv = _b64(value.strip()).decode(errors="replace")
        elif key == "file":
            path, _, data = value.partition(" ")
            probe.files[path] = _b64(data.strip())
        elif key == "nofile":
            probe.files.setdefault(value.strip(), None)
    return probe


def _b64(data: str) -> bytes:
    if not _B64.fullmatch(data):
        raise ValueError(f"not base64: {data[:40]!r}")
    return base64.b64decode(data)


def parse_state(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def confdirs(main_text: str) -> list[str]:
    """Directories a chrony main file includes (``confdir DIR...``), in order."""
    dirs: list[str] = []
    for line in main_text.splitlines():
        words = line.split()
        if words and words[0] == "confdir":
            dirs.extend(words[1:])
    return dirs


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


#: prints what the NTP server sources (``^`` in ``chronyc -c sources``) say about being answered:
#: ``noreply`` when every one is known not to answer: its reachability register is 0 (no reply to any
#: of its last 8 requests) and chronyd sent it ``min`` requests (``Total TX`` of ``chronyc ntpdata``),
#: counted from ``base`` (``ADDR=TX ...`` at the start of the wait) when it had had ``min`` already by
#: then: old failures never decide, only requests sent during this wait (so a firewall opened since
#: counts); ``ask`` while none is selected (``*``) yet: chronyd is to sample now, not at its next poll;
#: else ``wait`` (there is none to judge: names not resolved yet, refclocks only, a chronyc without
#: ntpdata; or one is selected and the offset is being awaited).
_ANSWERED_AWK = """\
BEGIN {
  split(base, pairs, " ")
  for (i in pairs) { split(pairs[i], kv, "="); before[kv[1]] = kv[2] + 0 }
  while (("chronyc -n -c sources 2>/dev/null" | getline line) > 0) {
    split(line, f, ",")
    if (f[1] == "^") { n++; reach[f[3]] = f[6]; if (f[2] == "*") chosen = 1 }
  }
  while (("chronyc -n ntpdata 2>/dev/null" | getline line) > 0) {
    split(line, w, " ")
    if (line ~ /^Remote address/) a = w[4]
    else if (line ~ /^Total TX/) tx[a] = w[4] + 0
  }
  if (!n) { print "wait"; exit }
  dead = 1
  for (a in reach) {
    need = before[a] >= min ? before[a] + min : min
    if (reach[a] != "0" || tx[a] < need) dead = 0
  }
  print dead ? "noreply" : chosen ? "wait" : "ask"
}"""
#: ``ADDR=TX`` for every NTP source (what ``base`` of _ANSWERED_AWK takes)
_SENT_AWK = '/^Remote address/ { a = $4 } /^Total TX/ { printf "%s=%s ", a, $4 }'


def wait_script(*, max_offset_s: float, timeout: float, has_sources: bool) -> str:
    """Await on the node: a selected source (``^*``) whose offset is within ``max_offset_s`` (or, for a
    master serving only its own clock, a normal leap status), up to ``timeout`` seconds; but with sources,
    stop as soon as none of them answers (:data:`UNANSWERED_REQUESTS` requests each, no reply: a firewall
    dropping UDP 123, a server down), which waiting longer would not change. Until a source is selected
    chronyd is kept sampling (``chronyc burst``, which does nothing while a burst, such as ``iburst``'s,
    is under way): after its initial burst, or sources left unanswered before the wait (an earlier run; a
    firewall opened since), its own next poll may be minutes away. Prints the final ``chronyc -c
    sources``, ``tracking`` and ``ntpdata`` either way; exit 3 when the deadline passed,
    :data:`NO_REPLY_EXIT` when no source answered."""
    if has_sources:
        cond = (
            "chronyc -n -c sources 2>/dev/null | awk -F, -v max="
            f"{max_offset_s:.6f}"
            " '$2 == \"*\" { o = $8 + 0; if (o < 0) o = -o; if (o <= max) ok = 1 } END { exit !ok }'"
        )
        n = UNANSWERED_REQUESTS
        start = f"base=$(chronyc -n ntpdata 2>/dev/null | awk '{_SENT_AWK}')\n"
        check = (
            f"  case $(awk -v min={n} -v base=\"$base\" '{_ANSWERED_AWK}') in\n"
            f"    noreply) rc={NO_REPLY_EXIT}; break;;\n"
            f"    ask) chronyc burst {n}/{n} >/dev/null 2>&1;;\n"
            "  esac\n"
        )
    else:
        cond = "chronyc -c tracking 2>/dev/null | awk -F, '$NF == \"Normal\" { ok = 1 } END { exit !ok }'"
        start = check = ""
    return (
        f"end=$(($(date +%s) + {int(timeout)}))\n"
        "rc=0\n"
        f"{start}"
        f"until {cond}; do\n"
        f"{check}"
        '  if [ "$(date +%s)" -ge "$end" ]; then rc=3; break; fi\n'
        "  sleep 0.2\n"
        "done\n"
        "echo '@@sources'; chronyc -n -c sources 2>&1\n"
        "echo '@@tracking'; chronyc -c tracking 2>&1\n"
        "echo '@@ntpdata'; chronyc -n ntpdata 2>&1\n"
        'exit "$rc"'
    )


@dataclass
class SourceLine:
    state: str  # "*" selected, "+" combined, "-", "?", "x", "~"
    address: str
    stratum: int
    reach: int
    offset: float  # seconds, local clock minus source (positive: we are ahead)
    error: float

    @property
    def selected(self) -> bool:
        return self.state == "*"


def parse_sources(csv: str) -> list[SourceLine]:
    """``chronyc -n -c sources``: mode,state,address,stratum,poll,reach,lastrx,offset,measured,error."""
    out = []
    for line in csv.splitlines():
        parts = line.split(",")
        if len(parts) < 10:
            continue
        try:
            out.append(
                SourceLine(
                    state=parts[1],
                    address=parts[2],
                    stratum=int(parts[3]),
                    reach=int(parts[5], 8) if parts[5].isdigit() else 0,
                    offset=float(parts[7]),
                    error=float(parts[9]),
                )
            )
        except ValueError:
            continue
    return out


def parse_tracking(csv: str) -> dict[str, str]:
    """``chronyc -c tracking``: reference id and name, stratum, ..., leap status (last field)."""
    for line in csv.splitlines():
        parts = line.split(",")
        if len(parts) >= 14:
            return {"ref_id": parts[0], "ref": parts[1], "stratum": parts[2], "leap": parts[-1]}
    return {}


def split_wait_output(stdout: str) -> tuple[str, str]:
    """(``chronyc -c sources``, ``chronyc -c tracking``) from :func:`wait_script`'s output."""
    sources, _, tracking = stdout.partition("@@tracking")
    return sources.partition("@@sources")[2].strip(), tracking.partition("@@ntpdata")[0].strip()


@dataclass(frozen=True)
class Traffic:
    """What chronyd sent to and heard from one NTP source (``chronyc ntpdata``)."""

    address: str
    sent: int  # Total TX
    received: int  # Total RX


def parse_ntpdata(stdout: str) -> dict[str, Traffic]:
    """``chronyc -n ntpdata`` (the ``@@ntpdata`` section of :func:`wait_script`'s output, or all of
    it), by source address. Read by label: the CSV form's columns differ between chrony versions."""
    text = stdout.partition("@@ntpdata")[2] if "@@ntpdata" in stdout else stdout
    found: dict[str, Traffic] = {}
    address: str | None = None
    counts: dict[str, int] = {}

    def close() -> None:
        if address is not None and "Total TX" in counts:
            found[address] = Traffic(address, counts["Total TX"], counts.get("Total RX", 0))

    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if not sep:
            continue
        label, words = label.strip(), value.split()
        if label == "Remote address":
            close()
            address, counts = (words[0] if words else None), {}
        elif label in ("Total TX", "Total RX") and words and words[0].isdigit():
            counts[label] = int(words[0])
    close()
    return found


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


def describe_sources(sources: Sequence[SourceLine]) -> str | None:
    for s in sources:
        if s.selected:
            return s.address
    return None
