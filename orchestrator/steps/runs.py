"""A run after it started: detached start, logs from byte offsets, status, stop, fetch.

A run is found on a node by its directory (``<workdir>/runs/<run-id>/<node>/``, see
``launch.run_dir_for``): the launcher writes ``pid`` there (pid, session, start time), its output goes
to ``node.log`` and its exit code to ``node.log.rc``. Its processes carry the run marker in their
environment (``PosixShell.RUN_MARKER_ENV``), so ``stop`` finds exactly them: never a process of
another run, never one matched by a name.

``logs`` resumes from byte offsets: the node sends the log in batches of complete lines, each followed
by a marker with the offset just past it; the controller prints a batch once its marker arrived,
remembers that offset, and after a dropped connection the tail restarts there. Nothing is lost and
nothing is printed twice. Asked for the last N lines (``logs --tail N``), the node finds where they
start itself (reading back from the end, never the whole log) and says so first (``@@start OFFSET``):
a reconnect resumes from offsets as always and never counts lines again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from orchestrator.errors import (
    CancelledError,
    CommandFailedError,
    ConnectError,
    UnreachableError,
    UsageError,
)
from orchestrator.platforms import Platform, PosixShell, PowerShell
from orchestrator.render import DEFAULT_WORKDIR
from orchestrator.steps.launch import (
    STREAMING_ENV,
    prepare_node,
    prepare_windows_node,
    run_dir_for,
    run_marker,
)
from orchestrator.transports.base import BlockHandler

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.render import LaunchSpec, Renderer
    from orchestrator.transports import Transport

log = logging.getLogger(__name__)

#: the controller's run directories (relative to the current directory, like launch's logs)
RUNS_ROOT = Path("runs")
RECORD = "run.json"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # .fullmatch only


# -- the controller's record of runs ---------------------------------------------------------------


def write_record(directory: Path, run_id: str, specs: Sequence[LaunchSpec], *, detached: bool) -> None:
    """``runs/<run-id>/run.json``: which nodes and ranks a run has, so `logs`, `status`, `stop` and
    `fetch` find the latest run without being told."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {
        "run_id": run_id,
        "detached": detached,
        "started": time.time(),
        "nodes": {s.node.name: {"first_rank": s.first_rank, "nproc": s.nproc} for s in specs},
    }
    tmp = directory / (RECORD + ".part")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, directory / RECORD)


def pick_run_id(prefix: str, root: Path = RUNS_ROOT, *, reserve: bool = True) -> str:
    """A run id for a run the user did not name: ``PREFIX-YYYYmmdd-HHMMSS``, with ``-2``, ``-3``...
    when that second is taken here (two runs within one second must not share an id). ``reserve``:
    its directory under ``root`` is created at once (atomically: a launch started at the same moment
    gets the next one)."""
    # a cluster's name is free text ("GPU lab"): ids are what `--run` accepts
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", prefix).strip("-._") or "run"
    base = f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
    if reserve:
        root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = check_run_id(base if n == 1 else f"{base}-{n}")
        if not reserve:
            if not (root / candidate).exists():
                return candidate
            continue
        try:
            (root / candidate).mkdir(mode=0o700)
        except FileExistsError:
            continue
        return candidate
    raise UsageError(f"no free run id for {base} in {root.resolve()}", hint="pass --run-id")


def claim_run_id(run_id: str, root: Path = RUNS_ROOT) -> str:
    """A run id the user chose: refused when a run of that id was launched from here already."""
    check_run_id(run_id)
    if (root / run_id / RECORD).exists():
        raise UsageError(
            f"run {run_id} already exists here ({root / run_id}/)",
            hint=f"choose another --run-id, or leave it out for a new one; `logs --run {run_id}` "
            "(same inventory) shows the earlier run",
        )
    return run_id


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (as `launch --run-id` does)"
        )
    return run_id


def resolve_run(run: str | None, root: Path = RUNS_ROOT) -> str:
    """``latest`` (or nothing): the newest run under ./runs; anything else is taken as a run id."""
    if run not in (None, "", "latest"):
        assert run is not None
        return check_run_id(run)
    candidates = []
    if root.is_dir():
        for entry in root.iterdir():
            if entry.is_dir() and _RUN_ID.fullmatch(entry.name):
                stamp = entry / RECORD
                # launched from here first (a record), newest first; then copies `logs` made
                launched = stamp.exists()
                candidates.append((launched, (stamp if launched else entry).stat().st_mtime, entry.name))
    if not candidates:
        raise UsageError(
            f"no runs in {root.resolve()} (run ids are kept where `bootstrap launch` ran)",
            hint="pass --run RUN-ID, or run this from the directory you launched from",
        )
    return max(candidates)[2]


def rank_labels(inventory: Inventory) -> dict[str, tuple[int, int]]:
    """Per node, how the ``[defaultN]:`` tags of its lines become global ranks: ``(first, count)``,
    the rank of N = 0 and how many N there are. Static rendezvous: ranks follow inventory order (as
    plan_launch) and N is the local rank. Elastic: each rendezvous assigns the ranks, so the launch
    script's rank capture tags lines with the global rank itself (RANK, CB_RANK_LABEL=global, see
    probes/rank_capture.py): N is the global rank, first 0."""
    if inventory.cluster.train.elastic:
        world = sum(node.nproc for node in inventory.nodes)
        return {node.name: (0, world) for node in inventory.nodes}
    labels, first = {}, 0
    for node in inventory.nodes:
        labels[node.name] = (first, node.nproc)
        first += node.nproc
    return labels


class RunOps(ABC):
    """The node side of run management in the node's own shell: the scripts that start, stop, inspect
    and read a run, and how paths are told apart there. One per platform (``run_ops``)."""

    #: the launch script's name in the run directory
    launcher: str

    @abstractmethod
    def prepare(self, node: Node, transport: Transport, spec: LaunchSpec, *, renderer: Renderer) -> str:
        """Create the run directory, upload the launch script and the training script; the node log."""

    @abstractmethod
    def start(self, run_dir: str, node_log: str, marker: str) -> str:
        """Start the launcher detached; prints ``@@started PID ...`` (``@@started-before ...``)."""

    platform: PosixShell | PowerShell

    def stop(self, run_dir: str, marker: str, grace: float) -> str:
        """Prints one ``@@stop ...`` line (PosixShell.stop_run)."""
        return self.platform.stop_run(run_dir, marker, grace=grace)

    def status(self, run_dir: str, marker: str, node_log: str) -> str:
        """Prints ``key=value`` lines (PosixShell.run_status)."""
        return self.platform.run_status(run_dir, marker, node_log)

    @abstractmethod
    def tail(
        self,
        run_dir: str,
        marker: str,
        node_log: str,
        offset: int,
        *,
        follow: bool,
        python: str | None,
        interval: float | None,
        lines: int | None = None,
    ) -> str:
        """The log from ``offset`` in the tail protocol (FOLLOW_PROGRAM, PosixShell.tail_log).
        ``lines``: start at the ``lines``-th last complete line instead (``offset`` is then ignored);
        the node prints ``@@start OFFSET`` before anything else."""

    #: whether ``tail`` uses the node's Python when given one
    uses_python: bool = False

    def list_files(self, candidates: Sequence[Sequence[str]]) -> str:
        """``@@file``/``@@dir``/``@@missing`` lines (PosixShell.list_files)."""
        return self.platform.list_files(candidates)

    @abstractmethod
    def is_absolute(self, path: str) -> bool:
        """A path ``fetch`` takes as it is (else: looked for in the run, then the code directory)."""

    def local_parts(self, path: str) -> list[str] | None:
        """``path`` as safe parts of a local path below the fetch destination (None: unsafe)."""
        return _safe_parts(path)


class PosixRuns(RunOps):
    """Linux and WSL-mode nodes: sessions, the run marker in the environment, /proc."""

    launcher = "launch.sh"
    uses_python = True

    platform: PosixShell

    def __init__(self, platform: PosixShell) -> None:
        self.platform = platform

    def prepare(self, node: Node, transport: Transport, spec: LaunchSpec, *, renderer: Renderer) -> str:
        return prepare_node(node, transport, spec, renderer=renderer)[2]

    def start(self, run_dir: str, node_log: str, marker: str) -> str:
        return self.platform.start_detached(run_dir, f"{run_dir}/{self.launcher}", node_log, marker)

    def tail(
        self,
        run_dir: str,
        marker: str,
        node_log: str,
        offset: int,
        *,
        follow: bool,
        python: str | None,
        interval: float | None,
        lines: int | None = None,
    ) -> str:
        if python is not None:
            return self.platform.tail_log_python(
                python,
                FOLLOW_PROGRAM,
                run_dir,
                node_log,
                offset,
                follow=follow,
                interval=interval or 0.02,
                lines=lines,
            )
        return self.platform.tail_log(
            run_dir, marker, node_log, offset, follow=follow, interval=interval or 0.05, lines=lines
        )

    def is_absolute(self, path: str) -> bool:
        return path.startswith(("/", "~"))


_WINDOWS_ABSOLUTE = re.compile(r"([A-Za-z]:[\\/]|[\\/]{2}|~)")


class WindowsRuns(RunOps):
    """Native Windows nodes: launch.ps1 started outside the WinRS job (Win32_Process Create), found by
    the pid and creation time it records (PowerShell.start_detached)."""

    launcher = "launch.ps1"

    platform: PowerShell

    def __init__(self, platform: PowerShell) -> None:
        self.platform = platform

    def prepare(self, node: Node, transport: Transport, spec: LaunchSpec, *, renderer: Renderer) -> str:
        return prepare_windows_node(node, transport, self.platform, spec, renderer=renderer)[1]

    def start(self, run_dir: str, node_log: str, marker: str) -> str:
        return self.platform.start_detached(run_dir, f"{run_dir}/{self.launcher}", node_log)

    def tail(
        self,
        run_dir: str,
        marker: str,
        node_log: str,
        offset: int,
        *,
        follow: bool,
        python: str | None,
        interval: float | None,
        lines: int | None = None,
    ) -> str:
        return self.platform.tail_log(
            run_dir, node_log, offset, follow=follow, interval=interval or 0.05, lines=lines
        )

    def is_absolute(self, path: str) -> bool:
        return bool(_WINDOWS_ABSOLUTE.match(path))

    def local_parts(self, path: str) -> list[str] | None:
        return _safe_parts(re.sub(r"^[A-Za-z]:", "", path.replace("\\", "/")).lstrip("/"))


def run_ops(platform: Platform, node: Node) -> RunOps:
    """The run management of ``node``'s platform (Linux and WSL: POSIX sh; native Windows: PowerShell)."""
    if isinstance(platform, PosixShell):
        return PosixRuns(platform)
    if isinstance(platform, PowerShell):
        return WindowsRuns(platform)
    raise UsageError(f"runs on {platform.name} nodes are not supported", node=node.name)


def _ops(transport: Transport, node: Node) -> RunOps:
    return run_ops(transport.platform, node)


# -- detached start ----------------------------------------------------------------------------------


@dataclass
class Started:
    pid: int
    run_dir: str
    node_log: str


def start_node(node: Node, transport: Transport, spec: LaunchSpec, *, renderer: Renderer) -> Started:
    """Upload the node's scripts and start its launcher detached: a session of its own on POSIX
    nodes, a process outside the WinRM shell's job on native Windows nodes (it survives us)."""
    ops = _ops(transport, node)
    node_log = ops.prepare(node, transport, spec, renderer=renderer)
    run_dir = run_dir_for(node, spec.run_id)
    marker = run_marker(spec.run_id, node.name)
    result = transport.run(
        ops.start(run_dir, node_log, marker),
        env=STREAMING_ENV,  # `logs --follow` then sees lines as they are printed
        timeout=60,
    )
    for line in result.stdout.splitlines():
        if line.startswith("@@started "):
            return Started(int(line.split()[1]), run_dir, node_log)
        if line.startswith("@@started-before "):
            raise CommandFailedError(
                f"run {spec.run_id} was already started on this node ({run_dir}/pid exists)",
                node=node.name,
                hint="pick another --run-id",
            )
    raise CommandFailedError(
        f"the launcher did not start (exit {result.exit_code}): {' | '.join(result.tail(3))}",
        node=node.name,
        result=result,
    )


# -- logs ------------------------------------------------------------------------------------------


#: The node side of `logs` when the node's Python is known (PosixShell.tail_log_python): bytes of the
#: log from an offset, complete lines only, sent as they are (a line starting with "@@" gets one more
#: "@"), each batch followed by "@@. OFFSET" (the offset just past the batch), "@@end CODE|none
#: OFFSET" last. A last line without its newline is sent only once the launcher has ended. Same
#: protocol as the shell/awk version (PosixShell.tail_log). LINES >= 0 (`logs --tail`): start at the
#: LINES-th last complete line instead of OFFSET, found by reading back from the end on the open
#: file, and say where first: "@@start OFFSET" (0 when there is no log yet).
FOLLOW_PROGRAM = r"""
import os, sys, time
path, rc_path, pid_path = sys.argv[1:4]
offset, follow, interval = int(sys.argv[4]), sys.argv[5] == "1", float(sys.argv[6])
lines = int(sys.argv[7])
out = sys.stdout.buffer
BLOCK = 1 << 20
BACK = 1 << 16

def ended():
    if os.path.exists(rc_path):
        return True
    try:
        with open(pid_path) as fh:
            pid, _sid, start = fh.read().split()[:3]
    except (OSError, ValueError):
        return False
    try:
        with open("/proc/%s/stat" % pid, "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == b"Z" or fields[19].decode() != start

def last_lines(f, n, fin):
    # where the n-th last complete line starts; a last line without newline is one only once the
    # launcher has ended (as it is sent); read back from the end, a block at a time
    size = os.fstat(f.fileno()).st_size
    need = n + 1  # newlines to pass going back: the last line's own, then the one before each
    if fin and size:
        f.seek(size - 1)
        if f.read(1) != b"\n":
            need = n
    if need == 0:
        return size
    pos = size
    while pos > 0:
        step = min(pos, BACK)
        pos -= step
        f.seek(pos)
        data = f.read(step)
        found = data.count(b"\n")
        if found < need:
            need -= found
            continue
        end = len(data)
        while True:
            end = data.rfind(b"\n", 0, end)
            need -= 1
            if need == 0:
                return pos + end + 1
    return 0

f = None
if lines >= 0:
    offset = 0  # no log yet: everything the launcher will write is new
    if os.path.exists(path):
        f = open(path, "rb")
        offset = last_lines(f, lines, ended())  # ended() first: then the size is final
    out.write(b"@@start %d\n" % offset)
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
        if fin and len(data) == size - offset:
            cut = len(data)  # the launcher has ended: a last line without newline is final
        elif cut == 0:
            if len(data) < BLOCK:
                break  # a line still being written: wait for its newline
            cut = len(data)  # a line longer than a block: sent in pieces
        chunk = data[:cut]
        offset += cut
        if not chunk.endswith(b"\n"):
            chunk += b"\n"
        if b"@@" in chunk:
            chunk = (b"\n" + chunk).replace(b"\n@@", b"\n@@@")[1:]
        out.write(chunk + b"@@. %d\n" % offset)
        out.flush()
    if fin or not follow:
        break
    time.sleep(interval)
rc = "none"
if os.path.exists(rc_path):
    with open(rc_path) as fh:
        rc = fh.read().strip() or "none"
out.write(b"@@end %s %d\n" % (rc.encode(), offset))
out.flush()
"""


@dataclass
class FollowResult:
    exit_code: int | None  # the launcher's, when it has ended with one
    ended: bool  # the launcher is no longer running (exit code file, or its process gone)
    offset: int  # byte offset of node.log read up to (complete lines)
    lines: int
    reconnects: int
    start: int = 0  # byte offset reading began at (``lines``: where the node found the last N lines)


def _markers(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every marker line in ``text`` (complete lines): lines starting with "@@" but
    not "@@@" (a log line that starts with "@@" arrives with one more "@")."""
    line = 0
    while True:
        if text.startswith("@@", line):
            end = text.index("\n", line) + 1
            if text[line + 2 : line + 3] != "@":
                yield line, end
            line = end
            continue
        found = text.find("\n@@", line)
        if found < 0:
            return
        line = found + 1


class _Batches(BlockHandler):
    """The controller side of the tail protocol: a batch of lines is passed on once the marker after
    it arrived (it came whole); what came after the last marker waits for its own."""

    def __init__(self, node: str, deliver: Callable[[str], None]) -> None:
        self.node = node
        self.deliver = deliver
        self.offset = 0
        self.start: int | None = None  # "@@start OFFSET": where the node began the last N lines
        self.lines = 0
        self.markers: list[str] = []
        self.pending: list[str] = []

    def restart(self) -> None:
        self.pending.clear()  # possibly cut by a dropped connection: read again from ``offset``
        self.markers.clear()

    def block(self, stream: str, text: str) -> None:
        if stream != "stdout":
            log.debug("%s: tail: %s", self.node, text.rstrip("\n"))
            return
        pos = 0
        for start, end in _markers(text):
            self._batch(text[pos:start])
            pos = end
            marker = text[start : end - 1]
            if marker.startswith("@@. "):
                self.offset = int(marker[4:])
            elif marker.startswith("@@start "):
                self.offset = self.start = int(marker[8:])
            else:
                self.markers.append(marker)
        if pos < len(text):
            self.pending.append(text[pos:])

    def _batch(self, text: str) -> None:
        if self.pending:
            text = "".join(self.pending) + text
            self.pending.clear()
        if not text:
            return
        if "@@@" in text:  # lines of the log that start with "@@" arrive with one more "@"
            text = ("\n" + text).replace("\n@@@", "\n@@")[1:]
        self.lines += text.count("\n")
        self.deliver(text)


def follow_node(
    node: Node,
    transport: Transport,
    run_id: str,
    *,
    follow: bool,
    on_line: Callable[[str, str], None] | None = None,
    output: BlockHandler | None = None,
    on_note: Callable[[str, str], None] | None = None,
    reconnect_for: float = 300.0,
    python: str | None = None,
    interval: float | None = None,
    lines: int | None = None,
) -> FollowResult:
    """Stream the node's log of ``run_id`` from the start, to ``output`` (the node's handler, a block
    of lines at a time) or ``on_line(node, line)``; with ``follow`` until the launcher has ended and
    the log is read to its end. ``lines``: from the ``lines``-th last complete line instead (0: only
    what is written from now on), found on the node.

    A connection lost mid-stream is reopened (for up to ``reconnect_for`` seconds) and the tail
    restarts from the offset just past the last batch delivered. ``python``: the node's interpreter
    (the one the run uses): one Python process reads the log on the node (FOLLOW_PROGRAM) instead of
    a shell loop running tail and awk at every poll. The batch being received when the connection
    dropped may have arrived cut: a batch is delivered only once the marker after it arrived.
    With ``lines``, the node's ``@@start OFFSET`` fixes where reading began: a reconnect after it
    resumes from offsets (the last N lines are not counted again, against a longer log); one before
    it (nothing was delivered yet) asks for the last N lines again.
    """
    ops = _ops(transport, node)
    if not ops.uses_python:
        python = None
    run_dir = run_dir_for(node, run_id)
    marker = run_marker(run_id, node.name)
    reconnects = 0

    def deliver(text: str) -> None:
        if output is not None:
            output.block("stdout", text)
        elif on_line is not None:
            for line in text[:-1].split("\n"):
                on_line(node.name, line)

    batches = _Batches(node.name, deliver)
    markers = batches.markers
    while True:
        batches.restart()
        log_path = f"{run_dir}/node.log"
        script = ops.tail(
            run_dir,
            marker,
            log_path,
            batches.offset,
            follow=follow,
            python=python,
            interval=interval,
            lines=lines if batches.start is None else None,
        )
        try:
            result = transport.run(script, on_line=batches, keep_lines=20)
        except (UnreachableError, EOFError, OSError) as exc:
            # EOFError/OSError: paramiko can raise them raw when the connection dies while it
            # sends (a window adjust inside recv); the transport does not wrap those yet
            log.info("%s: tail interrupted: %r", node.name, exc)
            reconnects += 1
            if on_note is not None:
                on_note(node.name, f"connection lost after byte {batches.offset}; reconnecting")
            _reconnect(transport, node, time.monotonic() + reconnect_for)
            if on_note is not None:
                on_note(node.name, f"reconnected; resuming at byte {batches.offset}")
            continue
        if result.exit_code is None:
            raise CancelledError("stopped following", node=node.name)
        if "@@missing" in markers:
            raise CommandFailedError(
                f"no run {run_id} on this node ({run_dir} does not exist)",
                node=node.name,
                hint="check --run and that the inventory is the one the run was launched with",
            )
        end = next((m for m in markers if m.startswith("@@end ")), None)
        if end is None and python is not None and result.exit_code == 127 and not markers:
            log.info("%s: %s not found: reading the log with the shell instead", node.name, python)
            python = None  # nothing was delivered: the shell reader starts at the same offset
            continue
        if end is None:
            raise CommandFailedError(
                f"reading {run_dir}/node.log failed (exit {result.exit_code}): {' | '.join(result.tail(3))}",
                node=node.name,
                result=result,
            )
        words = end.split()
        code = int(words[1]) if len(words) > 1 and words[1].lstrip("-").isdigit() else None
        return FollowResult(
            code,
            ended=follow or code is not None,
            offset=batches.offset,
            lines=batches.lines,
            reconnects=reconnects,
            start=batches.start or 0,
        )


def _reconnect(transport: Transport, node: Node, deadline: float) -> None:
    """Open the connection again, backing off, until it works or ``deadline`` passes."""
    delay = 0.2
    while True:
        try:
            transport.connect()
            return
        except CancelledError:
            raise
        except ConnectError:
            if time.monotonic() + delay > deadline:
                raise
            log.info("%s: reconnect failed; retrying in %.1fs", node.name, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


# -- status ------------------------------------------------------------------------------------------


@dataclass
class NodeStatus:
    state: str  # running / exited / stopped / not started / no run
    exit_code: int | None = None
    runtime: float | None = None
    last_line: str = ""
    log_bytes: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def public_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["runtime"] = None if self.runtime is None else round(self.runtime, 1)
        return doc


def status_node(node: Node, transport: Transport, run_id: str) -> NodeStatus:
    """One round trip: is the launcher alive, its exit code, times, last line, GPU utilisation."""
    ops = _ops(transport, node)
    run_dir = run_dir_for(node, run_id)
    result = transport.run(
        ops.status(run_dir, run_marker(run_id, node.name), f"{run_dir}/node.log"), timeout=60
    )
    if not result.ok:
        raise CommandFailedError(
            f"status failed (exit {result.exit_code}): {' | '.join(result.tail(3))}", node=node.name
        )
    return parse_status(result.stdout)


def parse_status(stdout: str) -> NodeStatus:
    values: dict[str, str] = {}
    gpus: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "gpu":
            cells = [c.strip() for c in value.split(",")]
            if len(cells) == 4:
                gpus.append(
                    {
                        "index": cells[0],
                        "util_percent": _num(cells[1]),
                        "mem_used_mib": _num(cells[2]),
                        "mem_total_mib": _num(cells[3]),
                    }
                )
            continue
        values[key] = value
    if values.get("state") == "no-run":
        return NodeStatus("no run")
    now, started, ended = _num(values.get("now")), _num(values.get("started")), _num(values.get("ended"))
    rc = values.get("rc")
    code = int(rc) if rc is not None and rc.lstrip("-").isdigit() else None
    if values.get("alive") == "1":
        state = "running"
        runtime = now - started if now is not None and started is not None else None
    elif values.get("stopped") is not None:
        state = "stopped"  # by `stop --run` (or a controller's stop): whatever code it ended with
        stopped = _num(values.get("stopped"))
        end = ended if ended is not None else stopped
        runtime = max(0.0, end - started) if end is not None and started is not None else None
    elif rc is not None:
        state = "exited"
        runtime = ended - started if ended is not None and started is not None else None
    elif started is not None:
        state = "stopped"  # its process is gone without writing an exit code: killed
        # nothing records when it was killed: until its last output (the log's mtime), a lower bound
        modified = _num(values.get("modified"))
        runtime = max(0.0, modified - started) if modified is not None else None
    else:
        state = "not started"
        runtime = None
    from orchestrator.steps.launch import split_rank

    return NodeStatus(
        state,
        exit_code=code,
        runtime=runtime,
        last_line=split_rank(values.get("last", ""))[1],
        log_bytes=int(_num(values.get("size")) or 0),
        gpus=gpus,
    )


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


# -- stop --------------------------------------------------------------------------------------------


@dataclass
class StopResult:
    state: str  # stopped / exited / gone / not started / no run
    terminated: int = 0  # processes sent SIGTERM
    killed: int = 0  # of those, still there after the grace period: SIGKILL
    exit_code: int | None = None
    forced: bool = False  # Windows: terminated at once (TerminateProcess), no grace period

    def describe(self) -> str:
        if self.state == "stopped" and self.forced:
            return f"terminated {self.terminated} process(es)"
        if self.state == "stopped":
            extra = f", {self.killed} needed SIGKILL" if self.killed else ""
            return f"stopped {self.terminated} process(es){extra}"
        if self.state == "exited":
            return f"nothing to stop: exited with code {self.exit_code}"
        if self.state == "gone":
            return "nothing to stop: its processes are gone"
        if self.state == "not started":
            return "nothing to stop: never started here"
        return "nothing to stop: no such run on this node"


def stop_node(node: Node, transport: Transport, run_id: str, *, grace: float = 5.0) -> StopResult:
    """TERM every process of the run on the node, KILL what is left after ``grace`` seconds."""
    ops = _ops(transport, node)
    run_dir = run_dir_for(node, run_id)
    result = transport.run(ops.stop(run_dir, run_marker(run_id, node.name), grace), timeout=grace + 30)
    line = next((x for x in result.stdout.splitlines() if x.startswith("@@stop ")), None)
    if line is None:
        raise CommandFailedError(
            f"stop failed (exit {result.exit_code}): {' | '.join(result.tail(3))}", node=node.name
        )
    words = line.split()[1:]
    kind = words[0] if words else ""
    if kind == "stopped":
        termed, killed, left = (int(w) for w in words[1:4])
        if left:
            raise CommandFailedError(
                f"{left} process(es) of run {run_id} survived SIGKILL",
                node=node.name,
                hint="they may be stuck in the kernel (D state); see `ps` on the node",
            )
        return StopResult("stopped", termed, killed)
    if kind == "terminated":  # Windows: every process terminated at once (no SIGTERM there)
        count, left = (int(w) for w in words[1:3])
        if left:
            raise CommandFailedError(
                f"{left} process(es) of run {run_id} were still there 10 s after being terminated",
                node=node.name,
                hint="see Get-Process on the node; a process stuck in a driver call ends only with it",
            )
        return StopResult("stopped", count, 0, forced=True)
    if kind == "exited":
        code = words[1] if len(words) > 1 else ""
        return StopResult("exited", exit_code=int(code) if code.lstrip("-").isdigit() else None)
    return StopResult({"gone": "gone", "not-started": "not started"}.get(kind, "no run"))


# -- fetch -------------------------------------------------------------------------------------------


@dataclass
class Fetched:
    path: str  # as asked
    source: str | None  # where it was found on the node (None: missing)
    files: int = 0
    bytes: int = 0
    local: str = ""


def _safe_parts(path: str) -> list[str] | None:
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        return None
    return parts


def fetch_candidates(
    ops: RunOps, node: Node, run_id: str, paths: Sequence[str], code_dir: str | None
) -> list[list[str]]:
    """Where each PATH is looked for on the node: as it is when absolute, else in the run directory,
    then in the code directory."""
    run_dir = run_dir_for(node, run_id)
    workdir = (node.workdir or DEFAULT_WORKDIR).rstrip("/")
    code = code_dir or f"{workdir}/code"
    return [[p] if ops.is_absolute(p) else [f"{run_dir}/{p}", f"{code.rstrip('/')}/{p}"] for p in paths]


def fetch_node(
    node: Node, transport: Transport, run_id: str, paths: Sequence[str], *, code_dir: str | None, dest: Path
) -> list[Fetched]:
    """Copy what the run wrote on the node into ``dest`` (``runs/<run-id>/<node>/``).

    A relative PATH is looked for in the node's run directory, then in its code directory; an
    absolute one is taken as is. Directories are copied with everything below them.
    """
    ops = _ops(transport, node)
    listing = transport.run(ops.list_files(fetch_candidates(ops, node, run_id, paths, code_dir)), timeout=120)
    if not listing.ok:
        raise CommandFailedError(
            f"cannot list {', '.join(paths)} (exit {listing.exit_code}): {' | '.join(listing.tail(3))}",
            node=node.name,
        )
    fetched: list[Fetched] = []
    current: Fetched | None = None
    base = ""
    for line in listing.stdout.splitlines():
        if line.startswith("@@"):
            words = line.split(" ", 3)
            index = int(words[1])
            asked = paths[index]
            parts = ops.local_parts(asked) or [f"path{index}"]
            local_root = dest.joinpath(*parts)
            if words[0] == "@@missing":
                current = None
                fetched.append(Fetched(asked, None))
            elif words[0] == "@@dir":
                base = line.split(" ", 2)[2]
                current = Fetched(asked, base, local=str(local_root))
                fetched.append(current)
            elif words[0] == "@@file":
                size_text, source = line.split(" ", 3)[2:4]
                current = None
                transport.get(source, local_root)
                fetched.append(Fetched(asked, source, 1, int(size_text), str(local_root)))
            continue
        if current is None:
            continue
        size_text, _, rel = line.partition(" ")
        rel_parts = _safe_parts(rel)
        if rel_parts is None or not size_text.isdigit():
            log.warning("%s: skipping unexpected entry %r under %s", node.name, rel, base)
            continue
        transport.get(f"{base.rstrip('/')}/{'/'.join(rel_parts)}", Path(current.local).joinpath(*rel_parts))
        current.files += 1
        current.bytes += int(size_text)
    return fetched
