"""The tail protocol: a node's ``node.log`` read from a byte offset, across dropped connections,
every line delivered exactly once. Three producers speak it on the nodes (FOLLOW_PROGRAM in the
node's Python, ``posix_tail`` in sh with tail and awk, ``powershell_tail`` on native Windows); one
reader takes it here (``Batches``, on records.Stream).

The producer's stdout is a stream of the codec (orchestrator/records.py): the log's lines as they are
(escaped by ``records.escape``) with records of the command's nonce between them. Given the log, an
OFFSET, FOLLOW and LINES it sends:

- the record ``missing``: there is no run directory; nothing else follows.
- ``start OFFSET``, first, only when LINES was given (`logs --tail N`): reading starts at the N-th
  last complete line, found on the node by reading back from the end (never the whole log), at
  OFFSET (0 when there is no log yet). A last line without its newline counts only once the
  launcher has ended; that end is checked before the size is taken.
- Batches: complete lines of the log from OFFSET, each followed by the record ``batch OFFSET``, the
  byte offset just past it. A last line without its newline is held back until the launcher has
  ended (then it is sent, with a newline added). A line longer than a producer's block (2 MiB) may
  be sent in pieces, each with a newline added and followed by the record ``piece OFFSET`` instead:
  the reader passes it on without that newline (the sh producer sends every line whole). Sizes are
  taken before reading: a line being written is never cut.
- With FOLLOW the producer polls until the launcher has ended (its exit-code file exists, or its
  recorded process is gone) and everything is read; without, it stops at the current end.
- ``end CODE|none OFFSET`` last: the launcher's exit code (none: still running, or killed), and the
  offset read up to.
- ``more OFFSET`` last instead, only from a producer given a ROUND (the follower of a foreground run
  on a native Windows node, runs/windows_follow.py): ROUND seconds have passed and the launcher is
  still running; the controller runs the next round from OFFSET. Other records (``started ...`` of
  that follower's first round) are kept by the reader, not delivered.

The reader passes a batch on only once the ``batch`` record after it arrived (it came whole) and
remembers that offset: after a dropped connection the tail is asked again from there, with a new
nonce, and the piece after the last record (possibly cut) is read again. Nothing is lost, nothing
printed twice. With ``start``, a reconnect after it resumes from offsets (the last N lines are not
counted again against a longer log); one before it (nothing delivered yet) asks for the last N lines
again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator import records
from orchestrator.platforms import PosixShell, PowerShell
from orchestrator.records import Record
from orchestrator.runs.layout import SIGNALLED, STOPPED
from orchestrator.transports.base import BlockHandler

log = logging.getLogger(__name__)

#: The producer in the node's Python (POSIX nodes, when the run's interpreter is known): one process
#: reads the log, no process per poll, so lines arrive within the interval even on a busy node.
#: argv: LOG RC_FILE PID_FILE OFFSET FOLLOW(0/1) INTERVAL LINES(-1: none) NONCE SAMPLE (the pattern
#: of the lines of the node's samples, ``records.line_pattern``; -: none);
#: records.py's encoder and stream escape are put before it (``_follow_program``)
FOLLOW_PROGRAM = r"""
path, rc_path, pid_path = sys.argv[1:4]
offset, follow, interval = int(sys.argv[4]), sys.argv[5] == "1", float(sys.argv[6])
lines, nonce = int(sys.argv[7]), sys.argv[8]
out = sys.stdout.buffer
SAMPLE = None if sys.argv[9] == "-" else re.compile(sys.argv[9].encode())

def say(kind, *fields):
    out.write(record(nonce, kind, *fields).encode("ascii"))
BLOCK = 2 << 20
BACK = 1 << 16

NOT_STARTED = 120.0  # seconds after the run directory last changed: no launcher will start now

def never_started():
    # no launcher, no log, and the run directory unchanged for NOT_STARTED seconds: the launch that
    # prepared it was cut short before starting anything (a controller killed during the uploads)
    if os.path.exists(pid_path) or os.path.exists(path):
        return False
    try:
        return time.time() - os.stat(os.path.dirname(pid_path)).st_mtime > NOT_STARTED
    except OSError:
        return False

def ended():
    if os.path.exists(rc_path):
        return True
    try:
        with open(pid_path) as fh:
            pid, _sid, start = fh.read().split()[:3]
    except (OSError, ValueError):
        return never_started()
    try:
        with open("/proc/%s/stat" % pid, "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == b"Z" or fields[19].decode() != start

def newlines_back(f, size):
    # the log's newlines before size, the last one first (read back a block at a time), then -1
    pos = size
    while pos > 0:
        step = min(pos, BACK)
        pos -= step
        f.seek(pos)
        data = f.read(step)
        at = len(data)
        while True:
            at = data.rfind(b"\n", 0, at)
            if at < 0:
                break
            yield pos + at
    yield -1

def is_sample(f, at, end):
    # the line [at, end) is one of the node's samples (a record `logs` does not show)
    if SAMPLE is None or end - at > BACK:
        return False
    f.seek(at)
    return SAMPLE.search(f.read(end - at)) is not None

def last_lines(f, n, fin):
    # where the n-th last line `logs` shows starts: complete lines (a last one without newline only
    # once the launcher has ended), the node's samples not counted; fewer than n: 0
    size = os.fstat(f.fileno()).st_size
    start, end, taken = size, size, 0
    for q in newlines_back(f, size):
        line = q + 1
        if end == size and not (fin and line < size):
            start = line  # nothing after the last newline, or a line still being written
        elif taken < n and not is_sample(f, line, end):
            taken += 1
            start = line
        end = q
        if taken == n:
            return start
    return 0

f = None
if lines >= 0:
    offset = 0  # no log yet: everything the launcher will write is new
    if os.path.exists(path):
        f = open(path, "rb")
        offset = last_lines(f, lines, ended())  # ended() first: then the size is final
    say("start", str(offset))
    out.flush()
while True:
    fin = ended()
    if f is None and os.path.exists(path):
        f = open(path, "rb")
    while f is not None:
        size = os.fstat(f.fileno()).st_size
        if size <= offset:
            break
        f.seek(offset)
        data = f.read(min(size - offset, BLOCK))
        cut = data.rfind(b"\n") + 1
        kind = "batch"
        if fin and len(data) == size - offset:
            cut = len(data)  # the launcher has ended: a last line without newline is final
        elif cut == 0:
            if len(data) < BLOCK:
                break  # a line still being written: wait for its newline
            cut, kind = len(data), "piece"  # a line longer than a block: sent in pieces
        chunk = data[:cut]
        offset += cut
        if not chunk.endswith(b"\n"):
            chunk += b"\n"
        out.write(escape(chunk))
        say(kind, str(offset))
        out.flush()
    if fin or not follow:
        break
    time.sleep(interval)
rc = "none"
if os.path.exists(rc_path):
    with open(rc_path) as fh:
        rc = fh.read().strip() or "none"
marks = [os.path.join(os.path.dirname(pid_path), name) for name in ("stopped", "signalled")]
stopped = "1" if any(os.path.exists(mark) for mark in marks) else "0"
say("end", rc, str(offset), stopped, "1" if never_started() else "0")
out.flush()
"""


def _follow_program() -> str:
    """FOLLOW_PROGRAM with what it needs of the codec (records.py's own source) before it."""
    return (
        "import base64, os, re, sys, time\n" + records.PYTHON_ENCODER + records.PYTHON_ESCAPE + FOLLOW_PROGRAM
    )


def posix_tail(
    sh: PosixShell,
    preamble: str,
    log: str,
    offset: int,
    *,
    nonce: str,
    follow: bool,
    interval: float = 0.05,
    lines: int | None = None,
    samples: str = "",
) -> str:
    """The producer in sh (tail, awk, dd: processes per poll). ``preamble``: the run's shell
    functions (runs/posix.py: ``$d`` the run directory, ``_cb_leader``); ``nonce``: its records'.
    awk escapes the lines as ``records.escape`` does; the records are the platform's ``_cb_rec``.

    ``lines``: found without reading the whole log: ``dd`` seeks to a window before the end (64 KiB,
    doubled until it holds enough lines) and awk notes where its lines start, stopping at the size
    measured first. ``samples``: the nonce of the node's samples, records in the log that `logs` does
    not show: the N lines do not count them. The log is only ever appended to, so the bytes before
    that size do not change while they are read: the start is exact and on a line boundary; what
    the launcher writes meanwhile comes after it and is read by the loop."""
    start = ""
    sample_word = sh.quote(records.line_pattern(samples)) if samples else "''"
    if lines is not None:
        # the starts of the lines `logs` shows in [base, size) (a ring of the last n + 1: the first
        # line of a window that begins after byte 0 may start before it and is not one); prints the
        # start, or "-" when the window holds too few of them
        count = (
            "BEGIN { o = o0; t = size }"
            ' { e = o + length($0); ok = (NR > 1 || o0 == 0) && !(re != "" && $0 ~ re);'
            " if (e >= size) { if (fin && o < size) { if (ok) { c++; p[c % k] = o } } else t = o; exit }"
            " if (ok) { c++; p[c % k] = o }; o = e + 1 }"
            ' END { if (n == 0) { if (fin) printf "%.0f\\n", size;'
            ' else if (t > o0 || o0 == 0) printf "%.0f\\n", t; else print "-" }'
            ' else if (c >= n) printf "%.0f\\n", p[(c - n + 1) % k];'
            ' else if (o0 == 0) print 0; else print "-" }'
        )
        start = (
            f"n={max(0, int(lines))}\n"
            "fin=0\n"
            'if [ -f "$f.rc" ]; then fin=1; elif [ -f "$d/pid" ] && ! _cb_leader; then fin=1; fi\n'
            'size=0; [ -f "$f" ] && size=$(wc -c < "$f")\n'
            "off=0\n"
            'if [ "$size" -gt 0 ]; then\n'
            "  w=1; nb=$(((size + 65535) / 65536))\n"
            "  while :; do\n"
            '    skip=$((nb - w)); [ "$skip" -lt 0 ] && skip=0\n'
            '    off=$(dd if="$f" bs=65536 skip="$skip" 2>/dev/null'
            ' | LC_ALL=C awk -v o0=$((skip * 65536)) -v size="$size" -v n="$n" -v k=$((n + 1))'
            f' -v fin="$fin" -v re={sample_word} {sh.quote(count)})\n'
            '    [ "$off" != - ] && break\n'
            "    w=$((w * 2))\n"
            "  done\n"
            "fi\n"
            'case $off in ""|*[!0-9]*) echo "cannot find the last $n lines of $f" >&2; exit 1;; esac\n'
            '_cb_rec start "$off"\n'
        )
    awk = (
        "{ e = o + length($0) + 1; if (e > size) { if (!fin) exit; e = size }"
        f' if (substr($0, 1, {len(records.MARK)}) == "{records.MARK}") printf "@"; print; o = e }}'
        # the offset past the batch, for its record (the reader holds the batch until then)
        ' END { printf "%.0f\\n", o > "/dev/stderr" }'
    )
    missing = sh.quote(records.record(nonce, "missing").rstrip("\n"))
    return (
        preamble + f"f={sh.path_word(log)}\n"
        f"off={int(offset)}\n"
        f'if [ ! -d "$d" ]; then echo {missing}; exit 0; fi\n'
        + sh.record_functions(nonce)
        + "\nexec 4>&1\n"
        + start
        + "while :; do\n"
        "  fin=0\n"
        '  if [ -f "$f.rc" ]; then fin=1; elif [ -f "$d/pid" ] && ! _cb_leader; then fin=1; fi\n'
        '  size=0; [ -f "$f" ] && size=$(wc -c < "$f")\n'
        '  if [ "$size" -gt "$off" ]; then\n'
        # awk stops at the first line ending past $size (bytes written after it was measured)
        "    was=$off\n"
        '    off=$(tail -c +$((off + 1)) "$f" 2>/dev/null'
        f' | LC_ALL=C awk -v o="$off" -v size="$size" -v fin="$fin" {sh.quote(awk)} 2>&1 >&4)\n'
        '    [ "$off" = "$was" ] || _cb_rec batch "$off"\n'
        "  fi\n"
        '  [ "$fin" = 1 ] && break\n' + ("" if follow else "  break\n") + f"  sleep {interval:g}\n"
        "done\n"
        'rc=none; [ -f "$f.rc" ] && read -r rc < "$f.rc"\n'
        f'st=0; [ -f "$d/{STOPPED}" ] || [ -f "$d/{SIGNALLED}" ] && st=1\n'
        '_cb_rec end "${rc:-none}" "$off" "$st"'
    )


def posix_tail_python(
    sh: PosixShell,
    python: str,
    run_dir: str,
    log: str,
    offset: int,
    *,
    nonce: str,
    follow: bool,
    interval: float,
    lines: int | None = None,
    samples: str = "",
) -> str:
    """The producer in the node's Python (FOLLOW_PROGRAM run by ``python``, the interpreter the run
    uses): no process per poll, so lines arrive within ``interval`` even on a busy node. ``samples``:
    as for :func:`posix_tail`."""
    count = -1 if lines is None else max(0, int(lines))
    missing = sh.quote(records.record(nonce, "missing").rstrip("\n"))
    return (
        f"d={sh.path_word(run_dir)}\n"
        # the pid file the reader asks is believed only in a directory that is ours alone
        + sh.check_own_dir(run_dir)
        + "\n"
        f'if [ ! -d "$d" ]; then echo {missing}; exit 0; fi\n'
        f"exec {sh.quote(python)} -c {sh.quote(_follow_program())} {sh.path_word(log)}"
        f' {sh.path_word(log + ".rc")} "$d/pid" {int(offset)} {1 if follow else 0} {interval:g} {count}'
        f" {records.check_nonce(nonce)} {sh.quote(records.line_pattern(samples)) if samples else '-'}"
    )


def powershell_tail(
    ps: PowerShell,
    preamble: str,
    log: str,
    offset: int,
    *,
    nonce: str | None,
    follow: bool,
    interval: float = 0.05,
    lines: int | None = None,
    offset_from: str | None = None,
    beat: str = "",
    round_seconds: float | None = None,
    samples: str = "",
) -> str:
    """The producer in PowerShell (native Windows nodes). ``preamble``: the run's functions
    (runs/windows.py: ``$cbDir``, ``Read-CbText``, ``Get-CbLeader``); ``nonce``: its records'
    (None: the preamble defines ``Out-CbRecord`` with its own, as the follower does).

    The log is opened with FileShare ReadWrite (the launcher is writing it) and its bytes are
    written to our stdout unchanged (``[Console]::OpenStandardOutput()``): offsets are bytes of the
    UTF-8 file. ``records.escape`` is done on the bytes read as Latin-1, one character per byte; the
    records are the platform's ``Out-CbRecord`` (``[Console]::Out``, which flushes every write, as
    ``Send-Cb`` does: the order holds).
    ``lines``: found by reading back from the end with the same FileStream (a block at a time,
    newlines found with ``[Array]::LastIndexOf``); ``samples``: as for :func:`posix_tail` (a line of
    up to 64 KiB is read again to be matched).

    The follower of a foreground run (runs/windows_follow.py) also gives: ``offset_from``, a PowerShell
    expression for the offset (its script's ``$Offset`` parameter) instead of ``offset``; ``beat``, a
    statement run once per poll (it touches the heartbeat file); ``round_seconds``: after that long,
    with the launcher still running, it ends with the record ``more OFFSET`` instead of ``end``.
    """
    mark = records.MARK
    first = f"[long]{int(offset)}" if offset_from is None else f"[long]{offset_from}"
    if round_seconds is not None and not follow:
        raise ValueError("a round only makes sense while following")
    start = sample_test = ""
    if lines is not None:
        counted = "$cbTaken -lt $cbTail"
        if samples:
            pattern = records.line_pattern(samples)
            counted += " -and -not (Test-CbSample $cbLine $cbEnd)"
            # whether the line [At, End) is one of the node's samples (read again: up to 64 KiB)
            sample_test = (
                "function Test-CbSample([long]$At, [long]$End) {\n"
                "  $cbLength = $End - $At\n"
                "  if ($cbLength -le 0 -or $cbLength -gt 65536) { return $false }\n"
                "  $cbBytes = New-Object -TypeName byte[] -ArgumentList $cbLength\n"
                "  $null = $cbFile.Seek($At, [System.IO.SeekOrigin]::Begin)\n"
                "  $cbHave = 0\n"
                "  while ($cbHave -lt $cbLength) {\n"
                "    $cbRead = $cbFile.Read($cbBytes, $cbHave, $cbLength - $cbHave)\n"
                "    if ($cbRead -le 0) { break }\n"
                "    $cbHave += $cbRead\n"
                "  }\n"
                f"  return $cbLatin.GetString($cbBytes, 0, $cbHave) -cmatch {ps.quote(pattern)}\n"
                "}\n"
            )
        # going back line by line from the end: where the n-th last line `logs` shows starts
        # (complete lines, a last one without newline once the launcher has ended, no sample);
        # fewer than n: 0
        start = (
            f"  $cbTail = [long]{max(0, int(lines))}\n"
            "  $cbFin = Test-CbEnded\n"
            "  $cbOffset = [long]0\n"  # no log yet: everything the launcher writes is new
            "  if ([System.IO.File]::Exists($cbLogPath)) {\n"
            "    $cbFile = New-CbLogStream\n"
            "    $cbSize = $cbFile.Length\n"
            "    $cbOffset = $cbSize\n"
            "    $cbEnd = $cbSize\n"  # where the line before the next newline found ends
            "    $cbTaken = [long]0\n"
            "    $cbPos = $cbSize\n"
            "    $cbAt = 0\n"
            "    while ($true) {\n"
            "      $cbNewline = -1\n"
            "      while ($true) {\n"
            "        if ($cbAt -gt 0) {\n"
            "          $cbAt = [Array]::LastIndexOf($cbBuf, [byte]10, $cbAt - 1)\n"
            "        } else {\n"
            "          $cbAt = -1\n"
            "        }\n"
            "        if ($cbAt -ge 0) { $cbNewline = $cbPos + $cbAt; break }\n"
            "        if ($cbPos -le 0) { break }\n"
            "        $cbWant = [int][Math]::Min($cbPos, [long]$cbBlock)\n"
            "        $cbPos -= $cbWant\n"
            "        $cbAt = Read-CbBlock $cbFile $cbPos $cbWant\n"
            "      }\n"
            "      $cbLine = $cbNewline + 1\n"
            # nothing after the last newline, or a line still being written: from its start
            "      if ($cbEnd -eq $cbSize -and -not ($cbFin -and $cbLine -lt $cbSize)) {\n"
            "        $cbOffset = $cbLine\n"
            f"      }} elseif ({counted}) {{\n"
            "        $cbTaken += 1\n"
            "        $cbOffset = $cbLine\n"
            "      }\n"
            "      $cbEnd = $cbNewline\n"
            "      if ($cbTaken -eq $cbTail) { break }\n"
            "      if ($cbNewline -lt 0) { $cbOffset = [long]0; break }\n"
            "    }\n"
            "  }\n"
            "  Out-CbRecord 'start' @([string]$cbOffset)\n"
        )
    return (
        preamble
        + ("" if nonce is None else ps.record_functions(nonce) + "\n")
        + f"$cbLogPath = {ps.full_path(log)}\n"
        f"$cbOffset = {first}\n"
        f"$cbFollow = {'$true' if follow else '$false'}\n"
        "$cbOut = [Console]::OpenStandardOutput()\n"
        "$cbLatin = [System.Text.Encoding]::GetEncoding(28591)\n"
        "function Send-Cb([string]$Text) {\n"
        "  $cbData = $cbLatin.GetBytes($Text)\n"
        "  $cbOut.Write($cbData, 0, $cbData.Length)\n"
        "  $cbOut.Flush()\n"
        "}\n"
        "if (-not [System.IO.Directory]::Exists($cbDir)) { Out-CbRecord 'missing' @(); exit 0 }\n"
        "$cbRc = $cbLogPath + '.rc'\n"
        "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
        "function Test-CbEnded {\n"
        "  if ([System.IO.File]::Exists($cbRc)) { return $true }\n"
        "  return [System.IO.File]::Exists($cbPidFile) -and $null -eq (Get-CbLeader)\n"
        "}\n"
        "$cbBlock = 2097152\n"
        "$cbBuf = New-Object -TypeName byte[] -ArgumentList $cbBlock\n"
        "$cbFile = $null\n"
        # up to Want bytes from At into $cbBuf (a read may return fewer): how many it got
        "function Read-CbBlock([System.IO.FileStream]$Stream, [long]$At, [int]$Want) {\n"
        "  $null = $Stream.Seek($At, [System.IO.SeekOrigin]::Begin)\n"
        "  $got = 0\n"
        "  while ($got -lt $Want) {\n"
        "    $n = $Stream.Read($cbBuf, $got, $Want - $got)\n"
        "    if ($n -le 0) { break }\n"
        "    $got += $n\n"
        "  }\n"
        "  return $got\n"
        "}\n"
        "function New-CbLogStream {\n"
        "  $cbShare = [System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete\n"
        "  New-Object -TypeName System.IO.FileStream -ArgumentList $cbLogPath,"
        " ([System.IO.FileMode]::Open), ([System.IO.FileAccess]::Read), $cbShare\n"
        "}\n"
        + sample_test
        + (
            "$cbMore = $false\n$cbRound = [System.Diagnostics.Stopwatch]::StartNew()\n"
            if round_seconds is not None
            else ""
        )
        + "try {\n"
        + start
        + "  while ($true) {\n"
        + (f"    {beat}\n" if beat else "")
        # taken before the size: what the launcher wrote before it ended is all read
        + "    $cbFin = Test-CbEnded\n"
        "    if ($null -eq $cbFile -and [System.IO.File]::Exists($cbLogPath)) {\n"
        "      $cbFile = New-CbLogStream\n"
        "    }\n"
        "    while ($null -ne $cbFile) {\n"
        "      $cbSize = $cbFile.Length\n"
        "      if ($cbSize -le $cbOffset) { break }\n"
        "      $cbWant = [int][Math]::Min($cbSize - $cbOffset, [long]$cbBlock)\n"
        "      $cbGot = Read-CbBlock $cbFile $cbOffset $cbWant\n"
        "      if ($cbGot -eq 0) { break }\n"
        "      $cbCut = [Array]::LastIndexOf($cbBuf, [byte]10, $cbGot - 1) + 1\n"
        "      $cbKind = 'batch'\n"
        "      if ($cbFin -and $cbGot -eq $cbSize - $cbOffset) {\n"
        "        $cbCut = $cbGot\n"  # the launcher has ended: a last line without newline is final
        "      } elseif ($cbCut -eq 0) {\n"
        "        if ($cbGot -lt $cbBlock) { break }\n"  # a line still being written
        "        $cbCut = $cbGot; $cbKind = 'piece'\n"  # a line longer than a block: sent in pieces
        "      }\n"
        "      $cbText = $cbLatin.GetString($cbBuf, 0, $cbCut)\n"
        "      $cbOffset += $cbCut\n"
        '      if (-not $cbText.EndsWith("`n")) { $cbText += "`n" }\n'
        f"      if ($cbText.Contains('{mark}')) {{\n"
        f'        $cbText = ("`n" + $cbText).Replace("`n{mark}", "`n@{mark}").Substring(1)\n'
        "      }\n"
        "      Send-Cb $cbText\n"
        "      Out-CbRecord $cbKind @([string]$cbOffset)\n"
        "    }\n"
        "    if ($cbFin -or -not $cbFollow) { break }\n"
        + (
            f"    if ($cbRound.Elapsed.TotalSeconds -ge {round_seconds:g}) {{ $cbMore = $true; break }}\n"
            if round_seconds is not None
            else ""
        )
        + f"    Start-Sleep -Milliseconds {max(1, round(interval * 1000))}\n"
        "  }\n"
        "} finally {\n"
        "  if ($null -ne $cbFile) { $cbFile.Dispose() }\n"
        "}\n"
        + (
            # the launcher runs on: the controller starts the next round from here
            "if ($cbMore) {\n  Out-CbRecord 'more' @([string]$cbOffset)\n} else {\n"
            if round_seconds is not None
            else ""
        )
        + "$cbCode = (Read-CbText $cbRc).Trim()\n"
        "if (-not $cbCode) { $cbCode = 'none' }\n"
        "$cbStopped = '0'\n"
        "if ([System.IO.File]::Exists((Join-Path -Path $cbDir -ChildPath 'stopped'))) { $cbStopped = '1' }\n"
        "Out-CbRecord 'end' @($cbCode, [string]$cbOffset, $cbStopped)"
        + ("\n}" if round_seconds is not None else "")
    )


# -- the parser -----------------------------------------------------------------------------------


@dataclass
class FollowResult:
    exit_code: int | None  # the launcher's, when it has ended with one
    ended: bool  # the launcher is no longer running (exit code file, or its process gone)
    offset: int  # byte offset of node.log read up to (complete lines)
    lines: int  # lines delivered, the node's samples not counted (`logs` shows these lines)
    reconnects: int
    start: int = 0  # byte offset reading began at (``lines``: where the node found the last N lines)
    stopped: bool = False  # the run was stopped (`stop --run`, a signal): its exit code is the stop's
    never_started: bool = False  # no launcher ever started there (its launch was cut short)


class Batches(BlockHandler):
    """The controller side of the tail protocol, on ``records.Stream``: a batch of lines is passed on
    once the ``batch`` record after it arrived (it came whole); what came after the last record waits
    for its own. Before each command (a reconnect, a follower's next round) :meth:`restart` with the
    nonce that command was given."""

    def __init__(
        self,
        node: str,
        deliver: Callable[[str], None],
        nonce: str,
        deliver_piece: Callable[[str], None] | None = None,
        samples: str = "",
    ) -> None:
        self.node = node
        self.samples = samples  # the nonce of the node's samples: records delivered, not lines shown
        self.deliver = deliver
        # a part of a longer line (without the newline the producer added), for the handler's piece:
        # the log here keeps the line whole and every part of it keeps its rank's label
        self.deliver_piece = deliver_piece
        self.stream = records.Stream(nonce)
        self.offset = 0
        self.start: int | None = None  # ``start OFFSET``: where the node began the last N lines
        self.lines = 0
        self.markers: list[Record] = []  # the other records of this command (missing, end, more, started)

    @property
    def nonce(self) -> str:
        return self.stream.nonce

    def restart(self, nonce: str) -> None:
        self.stream.restart(nonce)  # what came after the last record may be cut: read again from ``offset``
        self.markers.clear()

    def block(self, stream: str, text: str) -> None:
        if stream != "stdout":
            log.debug("%s: tail: %s", self.node, text.rstrip("\n"))
            return
        items = self.stream.feed(text)
        for at, item in enumerate(items):
            if isinstance(item, str):  # always followed by its record, in the same list
                after = items[at + 1] if at + 1 < len(items) else None
                if self.deliver_piece is not None and isinstance(after, Record) and after.kind == "piece":
                    self.deliver_piece(item.removesuffix("\n"))
                    continue
                self.lines += item.count("\n")
                if records.mentions(item, self.samples):
                    self.lines -= len(records.decode(item, self.samples))
                self.deliver(item)
            elif item.kind in ("batch", "piece"):
                self.offset = _offset(item, 0)
            elif item.kind == "start":
                self.offset = self.start = _offset(item, 0)
            else:
                self.markers.append(item)

    def piece(self, stream: str, text: str) -> None:
        """A part of a line longer than the transport's limit (the shell producer sends lines whole):
        the stream holds it with the rest of its line until the record after it, no newline added."""
        if stream == "stdout":
            self.block(stream, text)
            return
        log.debug("%s: tail: %s", self.node, text)

    def _find(self, kind: str) -> Record | None:
        return next((m for m in self.markers if m.kind == kind), None)

    @property
    def missing(self) -> bool:
        """``missing`` arrived: the node has no such run directory."""
        return self._find("missing") is not None

    def end(self) -> Record | None:
        """The ``end CODE|none OFFSET`` record, once it arrived."""
        return self._find("end")

    def more(self) -> int | None:
        """``more OFFSET`` arrived (a follower's round is over, the launcher runs on): OFFSET."""
        found = self._find("more")
        return None if found is None else _offset(found, 0)

    def stopped(self) -> bool:
        """``end`` said the run was stopped (`stop --run`, or a signal its launcher got): its exit
        code is the stop's doing."""
        found = self.end()
        return found is not None and len(found.fields) > 2 and found.text(2) == "1"

    def never_started(self) -> bool:
        """``end`` said no launcher ever started there (the launch that prepared the run directory
        was cut short: nothing will start it now)."""
        found = self.end()
        return found is not None and len(found.fields) > 3 and found.text(3) == "1"

    def exit_code(self) -> int | None:
        """The launcher's exit code that ``end`` gave (None: running, killed, or no end yet)."""
        found = self.end()
        code = "" if found is None else found.text(0)
        return int(code) if code.lstrip("-").isdigit() else None


def _offset(found: Record, index: int) -> int:
    """Field ``index`` of a record as a byte offset (a producer's own number: anything else is a bug)."""
    text = found.text(index)
    if not text.isdigit():
        raise ValueError(f"tail: record {found.kind} without a byte offset: {found.texts}")
    return int(text)
