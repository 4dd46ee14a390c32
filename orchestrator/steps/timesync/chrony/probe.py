"""What a Linux node has, read by one read-only probe: whether chronyd is installed, running and how
(systemd unit or a plain process), its main configuration file and every file of ours (base64), and the
state we left there. Also where these files live (the layout is described in the package docstring).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

from orchestrator.platforms import PosixShell

__all__ = [
    "BACKUP_SUFFIX",
    "BLOCK_BEGIN",
    "BLOCK_END",
    "DEFAULT_PIDFILE",
    "DROPIN_NAME",
    "HEADER",
    "MAIN_CANDIDATES",
    "MARK",
    "STATE_SUFFIX",
    "Probe",
    "confdirs",
    "parse_probe",
    "parse_state",
    "probe_script",
]

MARK = "cluster-bootstrap"
HEADER = "# Written by cluster-bootstrap (`bootstrap ntp`); `bootstrap ntp --restore` undoes it.\n"
BLOCK_BEGIN = "# BEGIN cluster-bootstrap time sync (managed by `bootstrap ntp`; --restore removes it)"
BLOCK_END = "# END cluster-bootstrap time sync"
DROPIN_NAME = "cluster-bootstrap.conf"
BACKUP_SUFFIX = ".cluster-bootstrap.bak"
STATE_SUFFIX = ".cluster-bootstrap.state"
MAIN_CANDIDATES = ("/etc/chrony/chrony.conf", "/etc/chrony.conf")  # Debian, RHEL
DEFAULT_PIDFILE = "/run/chrony/chronyd.pid"

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
    tracking_csv: str = ""  # chronyc -c tracking, when running
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
# (`-ef`: the same namespace file, test's builtin; one of them unreadable counts as another)
if ! [ /proc/1/ns/net -ef /proc/self/ns/net ] &&
  {{ [ -e /proc/1/ns/net ] || [ -e /proc/self/ns/net ]; }}; then
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
  # its confdir directories, in order, and its last pidfile (read's fields: awk's, no process)
  dirs= p=
  while read -r k rest || [ -n "$k" ]; do
    case $k in confdir) dirs="$dirs $rest" ;; pidfile) p=${{rest%%[ \t]*}} ;; esac
  done < "$main"
  for d in $dirs; do
    dump "$d/{DROPIN_NAME}"; dump "$d/{DROPIN_NAME}{BACKUP_SUFFIX}"
  done
fi
p=${{p:-{DEFAULT_PIDFILE}}}
echo "pidfile $p"
pid=
{{ read -r pid < "$p"; }} 2>/dev/null
case "$pid" in ''|*[!0-9]*) ;; *)
  comm=
  {{ read -r comm < /proc/"$pid"/comm; }} 2>/dev/null
  if [ "$comm" = chronyd ]; then
    echo "running $pid"; printf 'cmdline '; tr '\\0' ' ' < /proc/"$pid"/cmdline; echo
    printf 'sources '; chronyc -n -c sources 2>/dev/null | base64 -w0; echo
    printf 'tracking '; chronyc -c tracking 2>/dev/null | base64 -w0; echo
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
        elif key == "tracking":
            probe.tracking_csv = _b64(value.strip()).decode(errors="replace")
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
