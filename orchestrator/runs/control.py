"""A run after it started, on any OS: the scripts each operation sends, logs from byte offsets,
status, stop and fetch. Starting one (detached, or in the foreground on a native Windows node) is
runs/start.py.

Each operation is one script in the node's own shell (``run_ops``: runs/posix.py or runs/windows.py)
naming the run by its directory (runs/layout.py), and the parsing of what the node printed. The
``*_script`` functions are what ``--dry-run`` prints: the very text the operations send.
"""

from __future__ import annotations

import filecmp
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import records, safefiles
from orchestrator.errors import CancelledError, CommandFailedError, ConnectError, UnreachableError, UsageError
from orchestrator.platforms import Platform
from orchestrator.records import new_nonce
from orchestrator.runs.base import LISTING_CAP, RunOps, below, refused_dir, safe_parts
from orchestrator.runs.culprit import ROOT_CAUSE, torchrun_failures
from orchestrator.runs.layout import (
    RUN_OUTPUTS,
    RUNS_ROOT,
    in_workdir,
    node_log,
    read_record,
    run_dir_for,
    run_marker,
)
from orchestrator.runs.posix import PosixRuns
from orchestrator.runs.ranks import split_rank
from orchestrator.runs.samples import gpu_reading
from orchestrator.runs.tail import Batches, FollowResult
from orchestrator.runs.windows import WindowsRuns
from orchestrator.transports.base import BlockHandler
from orchestrator.view import human_bytes

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Transport

log = logging.getLogger(__name__)


def run_ops(platform: Platform, node: Node) -> RunOps:
    """The run management of ``node``'s platform (Linux and WSL: POSIX sh; native Windows: PowerShell)."""
    if (posix := platform.as_posix()) is not None:
        return PosixRuns(posix)
    if (powershell := platform.as_powershell()) is not None:
        return WindowsRuns(powershell)
    raise UsageError(f"runs on {platform.name} nodes are not supported", node=node.name)


# -- the scripts, per node (what --dry-run shows) ------------------------------------------------------


# Each script answers in records (orchestrator/records.py) carrying ``nonce``: the caller that reads
# the answer chooses it; a script only shown (--dry-run) gets a fresh one.


def start_script(platform: Platform, node: Node, run_id: str, nonce: str | None = None) -> str:
    run_dir = run_dir_for(node, run_id)
    return run_ops(platform, node).start(
        run_dir, node_log(run_dir), run_marker(run_id, node.name), nonce or new_nonce()
    )


def tail_script(
    platform: Platform,
    node: Node,
    run_id: str,
    offset: int = 0,
    *,
    follow: bool,
    python: str | None = None,
    interval: float | None = None,
    lines: int | None = None,
    nonce: str | None = None,
    samples: str = "",
) -> str:
    """The tail of the run's node.log from ``offset`` (runs/tail.py), its records with ``nonce``
    (a fresh one when the answer is not read); ``samples``: the nonce of the run's samples."""
    ops = run_ops(platform, node)
    run_dir = run_dir_for(node, run_id)
    return ops.tail(
        run_dir,
        run_marker(run_id, node.name),
        node_log(run_dir),
        offset,
        nonce=nonce or new_nonce(),
        follow=follow,
        python=python if ops.uses_python else None,
        interval=interval,
        lines=lines,
        samples=samples,
    )


def status_script(platform: Platform, node: Node, run_id: str, nonce: str | None = None) -> str:
    run_dir = run_dir_for(node, run_id)
    return run_ops(platform, node).status(
        run_dir, run_marker(run_id, node.name), node_log(run_dir), nonce or new_nonce()
    )


def stop_script(
    platform: Platform, node: Node, run_id: str, grace: float = 5.0, nonce: str | None = None
) -> str:
    return run_ops(platform, node).stop(
        run_dir_for(node, run_id), run_marker(run_id, node.name), grace, nonce or new_nonce()
    )


def code_dir_of(node: Node, code_dir: str | None) -> str:
    """The code directory on ``node`` where fetch looks (the run record's, else ``<workdir>/code``)."""
    return (code_dir or in_workdir(node, "code")).rstrip("/")


def fetch_candidates(
    ops: RunOps,
    node: Node,
    run_id: str,
    paths: Sequence[str],
    code_dir: str | None,
    *,
    from_code: bool = False,
) -> list[list[str]]:
    """Where each PATH is looked for on the node: as it is when absolute, else in the run's outputs
    (``$CB_RUN_DIR``), the run directory, then the code directory; ``from_code``: only there."""
    run_dir = run_dir_for(node, run_id)
    code = code_dir_of(node, code_dir)
    if from_code:
        return [[p] if ops.is_absolute(p) else [f"{code}/{p}"] for p in paths]
    return [
        [p] if ops.is_absolute(p) else [f"{run_dir}/{RUN_OUTPUTS}/{p}", f"{run_dir}/{p}", f"{code}/{p}"]
        for p in paths
    ]


def fetch_script(
    platform: Platform,
    node: Node,
    run_id: str,
    paths: Sequence[str],
    code_dir: str | None,
    nonce: str | None = None,
    *,
    from_code: bool = False,
) -> str:
    ops = run_ops(platform, node)
    candidates = fetch_candidates(ops, node, run_id, paths, code_dir, from_code=from_code)
    # where a relative path was looked for: listed when it is missing (a typo's right name)
    near = [
        [] if ops.is_absolute(path) else [c[: -len(path) - 1] for c in found]
        for path, found in zip(paths, candidates, strict=True)
    ]
    return ops.list_files(candidates, nonce or new_nonce(), near)


# -- logs ------------------------------------------------------------------------------------------


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
    samples: str = "",
) -> FollowResult:
    """Stream the node's log of ``run_id`` from the start, to ``output`` (the node's handler, a block
    of lines at a time) or ``on_line(node, line)``; with ``follow`` until the launcher has ended and
    the log is read to its end. ``lines``: from the ``lines``-th last complete line instead (0: only
    what is written from now on), found on the node; ``samples``: the nonce of the run's samples,
    which those lines do not count (`logs` does not show them).

    A connection lost mid-stream is reopened (for up to ``reconnect_for`` seconds) and the tail
    restarts from the offset just past the last batch delivered (runs/tail.py). ``python``: the
    node's interpreter (the one the run uses): one Python process reads the log on the node instead
    of a shell loop running tail and awk at every poll; where it is missing, the shell reads.
    """
    if not run_ops(transport.platform, node).uses_python:
        python = None
    run_dir = run_dir_for(node, run_id)
    reconnects = 0

    def deliver(text: str) -> None:
        if output is not None:
            output.block("stdout", text)
        elif on_line is not None:
            for line in text[:-1].split("\n"):
                on_line(node.name, line)

    def deliver_piece(text: str) -> None:
        if output is not None:
            output.piece("stdout", text)
        elif on_line is not None:
            on_line(node.name, text)

    batches = Batches(node.name, deliver, new_nonce(), deliver_piece, samples)
    while True:
        batches.restart(new_nonce())
        script = tail_script(
            transport.platform,
            node,
            run_id,
            batches.offset,
            follow=follow,
            python=python,
            interval=interval,
            lines=lines if batches.start is None else None,
            nonce=batches.nonce,
            samples=samples,
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
            say = None if on_note is None else (lambda text: on_note(node.name, text))
            _reconnect(transport, node, time.monotonic() + reconnect_for, say)
            if on_note is not None:
                on_note(node.name, f"reconnected; resuming at byte {batches.offset}")
            continue
        if result.exit_code is None:
            raise CancelledError("stopped following", node=node.name)
        refused = refused_dir(result, node.name)
        if refused is not None:
            raise refused
        if batches.missing:
            raise no_such_run(node, run_id)
        end = batches.end()
        if end is None and python is not None and result.exit_code == 127 and not batches.markers:
            log.info("%s: %s not found: reading the log with the shell instead", node.name, python)
            python = None  # nothing was delivered: the shell reader starts at the same offset
            continue
        if end is None:
            raise CommandFailedError(
                f"reading {node_log(run_dir)} failed (exit {result.exit_code}): {' | '.join(result.tail(3))}",
                node=node.name,
                result=result,
            )
        code = batches.exit_code()
        return FollowResult(
            code,
            ended=follow or code is not None,
            offset=batches.offset,
            lines=batches.lines,
            reconnects=reconnects,
            start=batches.start or 0,
            stopped=batches.stopped(),
            never_started=batches.never_started(),
        )


#: seconds between two "still reconnecting" notes while a node does not answer
RECONNECT_NOTE_EVERY = 30.0


def connect_following(
    node: Node, transport: Transport, note: Callable[[str], None], reconnect_for: float = 300.0
) -> None:
    """Connect to ``node`` for a follow: when it does not answer, ``note`` says so at once (why, and
    how long it is tried) and the connection is tried again as for one lost mid-stream."""
    try:
        transport.connect()
    except CancelledError:
        raise
    except ConnectError as exc:
        note(
            f"cannot connect ({exc.message}); trying again for up to {reconnect_for:.0f} s, "
            "following the others meanwhile"
        )
        _reconnect(transport, node, time.monotonic() + reconnect_for, note)
        note("connected; following")


def _reconnect(
    transport: Transport, node: Node, deadline: float, note: Callable[[str], None] | None = None
) -> None:
    """Open the connection again, backing off, until it works or ``deadline`` passes; ``note`` is
    told every RECONNECT_NOTE_EVERY seconds that it is still trying (a silent wait looks hung)."""
    delay = 0.2
    began = time.monotonic()
    noted = began
    transport.retrying = True  # dialled each time, also when the session found it unreachable before
    try:
        while True:
            try:
                transport.connect()
                return
            except CancelledError:
                raise
            except ConnectError as exc:
                now = time.monotonic()
                if now + delay > deadline:
                    raise
                if note is not None and now - noted >= RECONNECT_NOTE_EVERY:
                    noted = now
                    note(
                        f"still reconnecting after {now - began:.0f} s ({exc.message}); gives up after "
                        f"{deadline - began:.0f} s"
                    )
                log.info("%s: reconnect failed; retrying in %.1fs", node.name, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
    finally:
        transport.retrying = False


# -- status ------------------------------------------------------------------------------------------


#: a run whose launcher is gone without an exit code, and no stop or signal marked (parse_status)
NO_EXIT_CODE = "no exit code"


@dataclass
class NodeStatus:
    state: str  # running / exited / stopped / not started / no run / controller lost
    exit_code: int | None = None
    runtime: float | None = None
    last_line: str = ""
    log_bytes: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)
    #: "controller lost": what the node alone would have said (stopped / exited), a race's outcome
    node_state: str | None = None
    #: a failed run: the rank torchrun's summary names as its root cause, and that rank's exit code
    #: (the node's own is torchrun's 1)
    failed_rank: tuple[int, int] | None = None
    #: running: seconds since a rank of it last printed (the node's own clock); a hung rank shows here
    quiet: float | None = None

    def public_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["runtime"] = None if self.runtime is None else round(self.runtime, 1)
        doc["quiet"] = None if self.quiet is None else round(self.quiet, 1)
        rank = self.failed_rank
        doc["failed_rank"] = None if rank is None else {"rank": rank[0], "exit_code": rank[1]}
        return doc

    @property
    def label(self) -> str:
        """The state as a table shows it: with the exit code, except after a stop (the code is what
        the stop made of it) and when the controller was lost."""
        if self.exit_code is None or self.state in ("stopped", "controller lost"):
            return self.state
        if self.failed_rank is not None:
            return f"{self.state} (rank {self.failed_rank[0]}: exit {self.failed_rank[1]})"
        return f"{self.state} ({self.exit_code})"

    @property
    def failed(self) -> bool:
        """Training went wrong there: a non-zero exit that no stop caused, an end without an exit
        code, or a lost controller."""
        if self.state in ("controller lost", NO_EXIT_CODE):
            return True
        return self.state != "stopped" and self.exit_code not in (None, 0)

    @property
    def runtime_text(self) -> str:
        """The runtime as a table shows it: ``M:SS``, ``H:MM:SS``; ``-`` when unknown."""
        if self.runtime is None:
            return "-"
        seconds = max(0, int(self.runtime))
        hours, rest = divmod(seconds, 3600)
        return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"

    @property
    def gpu_text(self) -> str:
        """Each GPU's utilisation as a table shows it (``0:87% 1:90%``); ``-`` without nvidia-smi."""
        if not self.gpus:
            return "-"
        return " ".join(
            f"{g['index']}:{g['util_percent']:.0f}%" for g in self.gpus if g["util_percent"] is not None
        )


def status_node(node: Node, transport: Transport, run_id: str) -> NodeStatus:
    """One round trip: is the launcher alive, its exit code, times, last line, GPU utilisation."""
    nonce = new_nonce()
    result = transport.run(status_script(transport.platform, node, run_id, nonce), timeout=60)
    refused = refused_dir(result, node.name)
    if refused is not None:
        raise refused
    if not result.ok:
        raise CommandFailedError(
            f"status failed (exit {result.exit_code}): {' | '.join(result.tail(3))}", node=node.name
        )
    return parse_status(result.stdout, nonce)


def no_such_run(node: Node, run_id: str) -> CommandFailedError:
    """The error of a node that has no run ``run_id`` (its run directory does not exist), said as
    this machine's record of the run explains it: a launch refused before anything started there, a
    directory gone since (``clean``, by hand), else an id or an inventory that is not the run's."""
    from orchestrator.runs.ids import nearest_run

    where = run_dir_for(node, run_id)
    record = read_record(RUNS_ROOT / run_id) or {}
    if record.get("not_started"):
        return CommandFailedError(
            f"run {run_id} never started on this node ({where} does not exist): its launch was refused "
            "or stopped before training began",
            node=node.name,
            hint="the launch's own output said why; nothing of that run is on the nodes",
        )
    if node.name in (record.get("nodes") or {}):
        copy = RUNS_ROOT / run_id / f"{node.name}.log"
        kept = f"; {copy} here keeps what `logs` read of it" if copy.is_file() else ""
        return CommandFailedError(
            f"run {run_id} is gone from this node ({where} does not exist: removed by `clean` or by "
            f"hand, or this node's workdir changed since){kept}",
            node=node.name,
        )
    near = nearest_run(run_id)
    return CommandFailedError(
        f"no run {run_id} on this node ({where} does not exist)",
        node=node.name,
        hint=f"check --run{f' (did you mean {near}?)' if near else ''} and that the inventory is the one "
        "the run was launched with",
    )


def parse_status(stdout: str, nonce: str) -> NodeStatus:
    """The status script's records (``nonce``) as a NodeStatus; nothing else it printed counts."""
    values: dict[str, str] = {}
    gpus: list[dict[str, Any]] = []
    cause: list[str] = []
    for found in records.decode(stdout, nonce):
        key, value = found.kind, found.text(0)
        if key == "cause":
            cause.append(value)
            continue
        if key == "gpu":
            reading = gpu_reading(value)
            if reading is not None:
                gpus.append(reading)
            continue
        values[key] = value
    if values.get("state") == "no-run":
        return NodeStatus("no run")
    now, started, ended = _num(values.get("now")), _num(values.get("started")), _num(values.get("ended"))
    rc = values.get("rc")
    code = int(rc) if rc is not None and rc.lstrip("-").isdigit() else None
    quiet = None
    if values.get("alive") == "1":
        state = "running"
        runtime = now - started if now is not None and started is not None else None
        spoke = _num(values.get("spoke"))  # a rank's last line (the log's time counts samples too)
        quiet = max(0.0, now - spoke) if now is not None and spoke is not None else None
    elif values.get("stopped") is not None:
        state = "stopped"  # by `stop --run` (or a controller's stop): whatever code it ended with
        stopped = _num(values.get("stopped"))
        # no exit code: it ran until the stop, and after it while it handled TERM (its last output)
        modified = _num(values.get("modified"))
        end = (
            ended
            if ended is not None
            else max((t for t in (stopped, modified) if t is not None), default=None)
        )
        runtime = max(0.0, end - started) if end is not None and started is not None else None
    elif rc is not None:
        state = "exited"
        runtime = ended - started if ended is not None and started is not None else None
    elif started is not None:
        # its process is gone without an exit code and no stop or signal was marked: killed outright
        # (SIGKILL, the OOM killer, a reboot) or the code could not be written (a full disk). Not
        # "stopped": nobody stopped it, and it did not end as training ends (a failure)
        state = NO_EXIT_CODE
        # nothing records when it ended: until its last output (the log's mtime), a lower bound
        modified = _num(values.get("modified"))
        runtime = max(0.0, modified - started) if modified is not None else None
    else:
        state = "not started"
        runtime = None
    return NodeStatus(
        state,
        exit_code=code,
        runtime=runtime,
        last_line=split_rank(values.get("last", ""))[1],
        log_bytes=int(_num(values.get("size")) or 0),
        gpus=gpus,
        failed_rank=root_cause(cause) if code not in (None, 0) else None,
        quiet=quiet,
    )


def root_cause(lines: list[str]) -> tuple[int, int] | None:
    """The rank and exit code of torchrun's root cause, from the lines under its "Root Cause (first
    observed failure):" (the status script's ``cause`` records); None without one."""
    found = torchrun_failures("\n".join([ROOT_CAUSE, *lines]))
    root = next((f for f in found if f.root), None)
    return None if root is None else (root.rank, root.exit_code)


def _num(text: str | None) -> float | None:
    """A node's number (a time, a size): None when it is none, or no finite one within reason (a
    node's ``-inf`` or ``1e308`` gave `status --json` an Infinity no JSON reader takes)."""
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and abs(value) < 1e15 else None


# -- stop --------------------------------------------------------------------------------------------


@dataclass
class StopResult:
    state: str  # stopped / stopped earlier / exited / gone / not started / no run
    terminated: int = 0  # processes sent SIGTERM
    killed: int = 0  # of those, still there after the grace period: SIGKILL
    exit_code: int | None = None
    forced: bool = False  # Windows: terminated at once (TerminateProcess), no grace period

    def public_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.state == "stopped" and self.forced:
            return f"terminated {self.terminated} process(es)"
        if self.state == "stopped":
            extra = f", {self.killed} needed SIGKILL" if self.killed else ""
            return f"stopped {self.terminated} process(es){extra}"
        if self.state == "stopped earlier":
            return "nothing to stop: a stop before this one stopped it"
        if self.state == "exited":
            return f"nothing to stop: exited with code {self.exit_code}"
        if self.state == "gone":
            return "nothing to stop: its processes are gone"
        if self.state == "not started":
            return "nothing to stop: never started here"
        return "nothing to stop: no such run on this node"


def stop_node(node: Node, transport: Transport, run_id: str, *, grace: float = 5.0) -> StopResult:
    """TERM every process of the run on the node, KILL what is left after ``grace`` seconds."""
    nonce = new_nonce()
    result = transport.run(stop_script(transport.platform, node, run_id, grace, nonce), timeout=grace + 30)
    refused = refused_dir(result, node.name)
    if refused is not None:
        raise refused  # nothing was signalled
    said = records.find(result.stdout, nonce, "stop")
    if said is None:
        raise CommandFailedError(
            f"stop failed (exit {result.exit_code}): {' | '.join(result.tail(3))}", node=node.name
        )
    words = [w.strip() for w in said.texts]
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
    if kind == "earlier":  # what it exited with then is the stop's doing, not its own result
        return StopResult("stopped earlier")
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
    index: int = 0  # which of the paths asked
    #: missing: the node's file whose path is closest to it (a typo), "" or None: none
    near: str | None = None
    #: copies here that held other bytes than the node's: each kept beside it (``NAME.~N~``)
    kept: list[str] = field(default_factory=list)
    #: a directory's names that are no plain file name here (a line break, a control character): left
    skipped: int = 0
    #: a directory whose listing was longer than :data:`LISTING_CAP`: only the files of its first part
    cut: bool = False
    #: files not copied: here a directory has a file's name there, or a file a directory's (an earlier
    #: fetch of the same path when it was the other kind)
    clashed: list[str] = field(default_factory=list)

    @property
    def size(self) -> str:
        """``bytes`` as a table shows it (B, KiB, MiB, GiB)."""
        return human_bytes(self.bytes)


def fetch_node(
    node: Node,
    transport: Transport,
    run_id: str,
    paths: Sequence[str],
    *,
    code_dir: str | None,
    dest: Path,
    from_code: bool = False,
    copy: bool = True,
    vet: Callable[[list[Fetched]], None] | None = None,
) -> list[Fetched]:
    """Copy what the run wrote on the node into ``dest`` (``runs/<run-id>/<node>/``).

    A relative PATH is looked for in the run's outputs (``$CB_RUN_DIR``), its run directory, then
    the code directory (``from_code``: only there); an absolute one is taken as is. Directories are
    copied with everything below them. ``copy`` False: only what would be copied, and where. ``vet``
    sees what was found before anything is copied (it raises to copy nothing). A copy here with
    other bytes is never replaced: it is kept beside the new one as ``NAME.~N~`` (``Fetched.kept``).
    """
    ops = run_ops(transport.platform, node)
    nonce = new_nonce()
    script = fetch_script(transport.platform, node, run_id, paths, code_dir, nonce, from_code=from_code)
    listing = transport.run(script, timeout=120)
    if not listing.ok:
        raise CommandFailedError(
            f"cannot list {', '.join(paths)} (exit {listing.exit_code}): {' | '.join(listing.tail(3))}",
            node=node.name,
        )
    fetched: list[Fetched] = []
    near: dict[int, str] = {}
    copies: list[tuple[Fetched, bytes | None]] = []  # a file (None), or a directory's listing
    for found in records.decode(listing.stdout, nonce):
        index_text = found.text(0)
        if (
            found.kind == "near"
            and index_text.isdigit()
            and int(index_text) < len(paths)
            and found.fields[1:]
        ):
            near[int(index_text)] = _nearest(paths[int(index_text)], found.fields[1])
            continue
        if found.kind not in ("missing", "dir", "file") or not index_text.isdigit():
            continue
        index = int(index_text)
        if index >= len(paths):
            log.warning("%s: skipping a listing for path #%d (only %d asked)", node.name, index, len(paths))
            continue
        asked = paths[index]
        local_root = below(dest, ops.local_parts(asked) or [f"path{index}"])
        if found.kind == "missing":
            fetched.append(Fetched(asked, None, index=index))
        elif found.kind == "file":
            size_text, source = found.text(1).strip(), found.text(2)
            size = int(size_text) if size_text.isdigit() else 0
            fetched.append(Fetched(asked, source, 1, size, str(local_root)))
            copies.append((fetched[-1], None))
        else:
            fetched.append(Fetched(asked, found.text(1), local=str(local_root)))
            copies.append((fetched[-1], found.fields[2] if len(found.fields) > 2 else b""))
    for f in fetched:
        f.near = near.get(f.index) if f.source is None else None
    if vet is not None:
        vet(fetched)
    with _Stage(dest) as stage:
        for item, listing_bytes in copies:
            assert item.source is not None
            if listing_bytes is None:
                if copy and _clashes(Path(item.local), dest):
                    item.clashed.append(item.path)
                elif copy:
                    item.kept += keep_and_get(transport, item.source, Path(item.local), stage)
            else:
                _fetch_listing(node, transport if copy else None, item.source, listing_bytes, item, stage)
    return fetched


def runs_having(
    node: Node, transport: Transport, run_ids: Sequence[str], paths: Sequence[str]
) -> dict[str, str]:
    """For each of ``paths`` (relative, as fetch looks for them in a run: its outputs, then its run
    directory) the newest of ``run_ids`` (newest first) that has it on ``node``; one round trip."""
    ops = run_ops(transport.platform, node)
    asked = [
        (path, run_id, f"{run_dir_for(node, run_id)}/{where}{path}")
        for path in paths
        if not ops.is_absolute(path)
        for run_id in run_ids
        for where in (f"{RUN_OUTPUTS}/", "")
    ]
    if not asked:
        return {}
    nonce = new_nonce()
    result = transport.run(ops.which_exist([where for _, _, where in asked], nonce), timeout=60)
    have = {
        int(r.text(0))
        for r in records.decode(result.stdout, nonce)
        if r.kind == "have" and r.text(0).isdigit()
    }
    found: dict[str, str] = {}
    for index, (path, run_id, _) in enumerate(asked):
        if index in have:
            found.setdefault(path, run_id)
    return found


class _Stage:
    """Where one node's copies arrive before they are moved into place: a new private directory beside
    ``runs/<run-id>/<node>/`` (``.fetching-*``: no node's name starts with a dot), so that no file
    fetched, or fetched before, is ever removed or overwritten to make room for one on its way (a
    ``NAME.part`` of the node's own included). Removed with whatever is left in it."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.dir: Path | None = None
        self.count = 0

    def __enter__(self) -> _Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def next(self) -> Path:
        """A new name in the stage (made on first use)."""
        if self.dir is None:
            safefiles.private_dirs(self.dest.parent)
            self.dir = Path(tempfile.mkdtemp(prefix=".fetching-", dir=self.dest.parent))
        self.count += 1
        return self.dir / str(self.count)


def keep_and_get(
    transport: Transport, source: str, local: Path, stage: _Stage, taken: Container[Path] = ()
) -> list[str]:
    """``source`` copied to ``local`` (through ``stage``); a file already there with other bytes (a
    checkpoint fetched before, maybe its only copy now) is kept beside it as ``NAME.~N~`` (as ``cp
    --backup=numbered``), a name neither here nor ``taken`` (what this fetch writes next): its path,
    in a list (empty: nothing was there, or the same bytes). A link at ``local`` is replaced, never
    written through."""
    arrived = stage.next()
    transport.get(source, arrived)
    safefiles.private_dirs(local.parent)
    if local.is_file() and not local.is_symlink():
        if filecmp.cmp(arrived, local, shallow=False):
            return []
        n = 1
        while (backup := local.with_name(f"{local.name}.~{n}~")) in taken or os.path.lexists(backup):
            n += 1
        local.rename(backup)
        os.replace(arrived, local)
        return [str(backup)]
    os.replace(arrived, local)
    return []


def _nearest(asked: str, listing: bytes) -> str:
    """The file below where ``asked`` was looked for whose path is closest to it (a typo:
    checkpoint/last.pt for checkpoints/last.pt), "" when none is close. ``listing``: ``./RELPATH NUL``
    per file, maybe cut short (its last name then dropped)."""
    import difflib

    names = [n.decode("utf-8", "replace").removeprefix("./") for n in listing.split(b"\0")[:-1]]
    close = difflib.get_close_matches(asked.strip("/"), names, n=1, cutoff=0.75)
    return close[0] if close else ""


def _fetch_listing(
    node: Node, transport: Transport | None, base: str, listing: bytes, into: Fetched, stage: _Stage
) -> None:
    """Copy the files of a directory listing (``SIZE NUL RELPATH NUL`` per file; one longer than
    :data:`LISTING_CAP` was cut there: its whole entries only) below ``into.local`` (no ``transport``:
    only count them). A name that is no plain file name here is skipped and counted."""
    if len(listing) > LISTING_CAP:
        into.cut, listing = True, listing[:LISTING_CAP]
    cells = listing.split(b"\0")
    wanted: list[tuple[str, Path, int]] = []
    for size_bytes, rel_bytes in zip(cells[0:-1:2], cells[1:-1:2], strict=False):  # whole entries
        size_text, rel = size_bytes.decode("ascii", "replace").strip(), rel_bytes.decode("utf-8", "replace")
        rel_parts = safe_parts(rel)
        if rel_parts is None or not size_text.isdigit() or not all(p.isprintable() for p in rel_parts):
            log.info("%s: skipping unexpected entry %r under %s", node.name, rel, base)  # a note says it
            into.skipped += 1
            continue
        try:
            local = below(Path(into.local), rel_parts)
        except ValueError:
            log.info("%s: skipping %r under %s: not below %s", node.name, rel, base, into.local)
            into.skipped += 1
            continue
        wanted.append((f"{base.rstrip('/')}/{'/'.join(rel_parts)}", local, int(size_text)))
    # the names this fetch writes, and the directories it makes: no backup takes one of them
    taken = {at for _, local, _ in wanted for at in (local, *local.parents)}
    for source, local, size in wanted:
        if transport is not None and _clashes(local, Path(into.local)):
            into.clashed.append(str(local.relative_to(into.local)))
            continue
        if transport is not None:
            into.kept += keep_and_get(transport, source, local, stage, taken)
        into.files += 1
        into.bytes += size


def _clashes(local: Path, root: Path) -> bool:
    """Whether the copy cannot go to ``local`` (below ``root``, or ``root`` itself): a directory here
    where it goes, or a file (or link) here where one of its directories goes."""
    if local.is_dir() and not local.is_symlink():
        return True
    parents = [p for p in local.parents if p == root or root in p.parents]
    return any(os.path.lexists(p) and (p.is_symlink() or not p.is_dir()) for p in parents)
