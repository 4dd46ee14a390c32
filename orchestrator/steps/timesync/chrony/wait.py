"""Awaiting a node's time source: the POSIX script that waits until chronyd follows a source within the
threshold (or knows that none answers), and the parsers of what ``chronyc`` prints then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "NO_REPLY_EXIT",
    "NTP_PORT",
    "SYNC_TIMEOUT",
    "UNANSWERED_REQUESTS",
    "SourceLine",
    "Traffic",
    "WaitAnswer",
    "describe_sources",
    "parse_ntpdata",
    "parse_sources",
    "parse_tracking",
    "parse_wait",
    "wait_sections",
]

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


#: the sections of the wait's round trip (:func:`wait_sections`)
WAIT, SOURCES, TRACKING, NTPDATA = "chrony.wait", "chrony.sources", "chrony.tracking", "chrony.ntpdata"


def wait_sections(*, max_offset_s: float, timeout: float, has_sources: bool) -> list[tuple[str, str]]:
    """The ``(name, shell)`` sections (``Platform.sectioned``: one round trip, as root) that await on
    the node a selected source (``^*``) whose offset is within ``max_offset_s`` (or, for a master
    serving only its own clock, a normal leap status), up to ``timeout`` seconds; but with sources,
    stop as soon as none of them answers (:data:`UNANSWERED_REQUESTS` requests each, no reply: a
    firewall dropping UDP 123, a server down), which waiting longer would not change. Until a source
    is selected chronyd is kept sampling (``chronyc burst``, which does nothing while a burst, such as
    ``iburst``'s, is under way): after its initial burst, or sources left unanswered before the wait
    (an earlier run; a firewall opened since), its own next poll may be minutes away.

    :data:`WAIT` prints nothing and exits 0, 3 when the deadline passed, :data:`NO_REPLY_EXIT` when no
    source answered; then, once it ended, :data:`SOURCES`, :data:`TRACKING` and :data:`NTPDATA` are
    ``chronyc -c sources``, ``tracking`` and ``ntpdata`` (each its own section: :func:`parse_wait`)."""
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
    wait = (
        f"end=$(($(date +%s) + {int(timeout)}))\n"
        "rc=0\n"
        f"{start}"
        f"until {cond}; do\n"
        f"{check}"
        '  if [ "$(date +%s)" -ge "$end" ]; then rc=3; break; fi\n'
        "  sleep 0.2\n"
        "done\n"
        'exit "$rc"'
    )
    return [
        (WAIT, wait),
        (SOURCES, "chronyc -n -c sources 2>&1"),
        (TRACKING, "chronyc -c tracking 2>&1"),
        (NTPDATA, "chronyc -n ntpdata 2>&1"),
    ]


@dataclass(frozen=True)
class WaitAnswer:
    """What the wait's round trip said: its exit code (0, 3: the deadline passed, NO_REPLY_EXIT: no
    source answered; None: it did not run) and ``chronyc``'s final ``sources`` and ``tracking`` (CSV)
    and ``ntpdata``, empty when they did not come."""

    exit_code: int | None
    sources: str
    tracking: str
    ntpdata: str


def parse_wait(sections: Mapping[str, tuple[str, int]]) -> WaitAnswer:
    """The answers to :func:`wait_sections`."""
    code = sections[WAIT][1] if WAIT in sections else None
    said = {name: sections.get(name, ("", 1))[0] for name in (SOURCES, TRACKING, NTPDATA)}
    return WaitAnswer(code, said[SOURCES].strip(), said[TRACKING].strip(), said[NTPDATA])


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


@dataclass(frozen=True)
class Traffic:
    """What chronyd sent to and heard from one NTP source (``chronyc ntpdata``)."""

    address: str
    sent: int  # Total TX
    received: int  # Total RX


def parse_ntpdata(stdout: str) -> dict[str, Traffic]:
    """``chronyc -n ntpdata`` (the :data:`NTPDATA` section of :func:`wait_sections`), by source address. Read
    by label: the CSV form's columns differ between chrony versions."""
    text = stdout
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


def describe_sources(sources: Sequence[SourceLine]) -> str | None:
    for s in sources:
        if s.selected:
            return s.address
    return None
