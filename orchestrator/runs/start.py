"""Starting a run: detached on any OS (each node's launcher started to outlive us, all or nothing),
in the foreground on a native Windows node (the controller's side of the follower's rounds,
``follow_windows``), and any other heavy job run outside the WinRS shell's job there
(``run_outside_job``).

What the node runs is asked of its run scripts (``start_script``: runs/control.py; the follower and
the watchdog: runs/windows_follow.py); a run that has started is followed, inspected, stopped and
fetched by runs/control.py.
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.records import new_nonce
from orchestrator.runs.base import refused_dir
from orchestrator.runs.control import StopResult, start_script, stop_node
from orchestrator.runs.layout import launcher_env, node_log, run_dir_for
from orchestrator.runs.tail import Batches
from orchestrator.runs.windows import WindowsRuns
from orchestrator.runs.windows_follow import JOB_SCRIPT, ROUND_SECONDS, RUNNER
from orchestrator.transports.base import BlockHandler, Result
from orchestrator.view import Said, failures

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Node
    from orchestrator.render import LaunchSpec
    from orchestrator.session import Session
    from orchestrator.transports import Transport
    from orchestrator.transports.base import OnLine, Stream

# -- detached start ----------------------------------------------------------------------------------


@dataclass
class Started:
    pid: int
    run_dir: str
    node_log: str


def start_node(node: Node, transport: Transport, run_id: str, sample_nonce: str = "") -> Started:
    """Start the node's launcher (uploaded into its run directory already) detached: a session of its
    own on POSIX nodes, a process outside the WinRM shell's job on native Windows nodes (it survives
    us). ``sample_nonce``: the run's (LaunchSpec.sample_nonce)."""
    run_dir = run_dir_for(node, run_id)
    nonce = new_nonce()
    result = transport.run(
        start_script(transport.platform, node, run_id, nonce),
        env=launcher_env(sample_nonce),  # `logs --follow` then sees lines as they are printed
        timeout=60,
    )
    refused = refused_dir(result, node.name)
    if refused is not None:
        raise refused
    for said in records.decode(result.stdout, nonce):
        pid = said.text(0).split()
        if said.kind == "started" and pid and pid[0].isdigit():
            return Started(int(pid[0]), run_dir, node_log(run_dir))
        if said.kind == "started-before":
            raise CommandFailedError(
                f"run {run_id} was already started on this node ({run_dir}/pid exists)",
                node=node.name,
                hint="pick another --run-id",
            )
    raise CommandFailedError(
        f"the launcher did not start (exit {result.exit_code}): {' | '.join(result.tail(3))}",
        node=node.name,
        result=result,
    )


@dataclass
class DetachedStart:
    run_id: str
    outcomes: list[Outcome[Started]]
    #: where it had started when another node failed to: stopped again (all or nothing)
    undone: list[Outcome[StopResult]] = field(default_factory=list)
    #: the Ctrl-C (or SIGTERM) that cut the start short: every node was then stopped again (``undone``)
    interrupted: KeyboardInterrupt | None = None
    swept_all: bool = True  # False: a second interrupt cut that short

    def interrupted_detail(self, again: Callable[[str], str]) -> str:
        """What a start cut short left: nothing (every node checked), or what to run."""
        if self.swept_all and all(o.ok for o in self.undone):
            stopped = [o.node for o in self.undone if o.value is not None and o.value.state == "stopped"]
            where = f" (stopped again on {', '.join(stopped)})" if stopped else ""
            return f"run {self.run_id} was not started: nothing of it runs on the nodes{where}"
        return f"run {self.run_id} may have started on some nodes: `{again('stop')}` ends it"

    @property
    def size(self) -> int:
        return len(self.outcomes)

    @property
    def failed(self) -> list[Outcome[Started]]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def stopped_again(self) -> list[str]:
        """The nodes where the run had started and was stopped again."""
        return [o.node for o in self.undone if o.ok]

    def undone_error(self) -> str:
        """What the all-or-nothing start undid, node by node ("" when nothing)."""
        if not self.undone:
            return ""
        return "not started on every node: stopped it again on " + ", ".join(
            f"{o.node} ({o.value.describe() if o.value else o.error})" for o in self.undone
        )

    def said(self, again: Callable[[str], str]) -> list[Said]:
        """What a human reads of the start: what failed (and what the all-or-nothing start undid), or
        each node's launcher and how to follow, see and stop the run (``again(command)``: that command
        for this run, as typed here)."""
        if self.failed:
            return [*failures(self.failed), *([Said("error", self.undone_error())] if self.undone else [])]
        return [
            *(
                Said("note", f"{o.node}: launcher pid {o.value.pid}, log {o.value.node_log}")
                for o in self.outcomes
                if isinstance(o.value, Started)
            ),
            Said(
                "info",
                f"run {self.run_id} started detached on {self.size} node(s); it keeps running without us",
            ),
            Said("info", f"  follow: {again('logs')} --follow"),
            Said("info", f"  status: {again('status')}"),
            Said("info", f"  stop:   {again('stop')}"),
            Said("out", self.run_id),
        ]

    @staticmethod
    def node_fields(outcome: Outcome[Started]) -> dict[str, Any]:
        """A node's ``--json`` fields: its launcher's pid and run directory (None: not started)."""
        started = outcome.value if isinstance(outcome.value, Started) else None
        return {"pid": started.pid if started else None, "run_dir": started.run_dir if started else None}


def start_all(
    session: Session,
    specs: Sequence[LaunchSpec],
    prepare: Callable[[Node, Transport, LaunchSpec], object],
) -> DetachedStart:
    """Start every node's launcher detached, all or nothing: when one fails to start, the ones that
    did are stopped again. ``prepare(node, transport, spec)`` creates the node's run directory and
    uploads its launcher first (steps.launch.prepare_detached)."""
    by_name = {s.node.name: s for s in specs}
    run_id = specs[0].run_id if specs else ""

    def one(node: Node, transport: Transport) -> Started:
        prepare(node, transport, by_name[node.name])
        return start_node(node, transport, run_id, by_name[node.name].sample_nonce)

    try:
        outcomes = session.map(one, step="start")
    except KeyboardInterrupt as stop:  # cut short while starting: whatever started is stopped again
        report = DetachedStart(run_id, [], interrupted=stop)
        try:  # on every node (one may have started as the start was cut), on new connections
            with session.reopened() as fresh:
                report.undone = fresh.map(lambda n, t: stop_node(n, t, run_id, grace=5.0), step="stop")
        except KeyboardInterrupt:  # a second Ctrl-C: not checked, and said so
            report.swept_all = False
        return report
    started = [s.node for s in specs if any(o.ok and o.node == s.node.name for o in outcomes)]
    report = DetachedStart(run_id, outcomes)
    if report.failed and started:
        report.undone = session.map(lambda n, t: stop_node(n, t, run_id), step="stop", nodes=started)
    return report


# -- a foreground run on a native Windows node ---------------------------------------------------------

#: how long one follower round may take beyond its own ROUND_SECONDS (a powershell.exe start on a
#: loaded node, the Receive rounds): past that it is stuck, is stopped, and the watchdog stops the run
ROUND_MARGIN = 60.0
#: the first round also starts the watchdog and the launcher (which has 60 s to write its pid file)
FIRST_ROUND_TIMEOUT = ROUND_SECONDS + ROUND_MARGIN + 60.0


class Followed(BlockHandler):
    """What the follower of a foreground run on a native Windows node prints (runs/windows_follow.py), read
    here: its stdout is the tail protocol (``Batches``), whose complete lines go on to ``output`` (the
    node's handler: ``[defaultN]:`` rank labels as in node.log); its stderr (the follower's own
    errors) goes on as stderr. The last ``keep`` lines of both are kept for a failure's summary.
    ``nonce``: the first round's (``WindowsRuns.foreground``); each next round gets its own."""

    def __init__(self, node: str, output: OnLine, nonce: str, keep: int = 200) -> None:
        self.output = output
        self.batches = Batches(node, self._deliver, nonce)
        self.kept: deque[str] = deque(maxlen=keep)
        self.errors: deque[str] = deque(maxlen=keep)

    def block(self, stream: Stream, text: str) -> None:
        if stream == "stdout":
            self.batches.block(stream, text)
            return
        self.errors.extend(_lines(text))
        self._pass("stderr", text)

    def _deliver(self, text: str) -> None:
        self.kept.extend(_lines(text))
        self._pass("stdout", text)

    def _pass(self, stream: Stream, text: str) -> None:
        if isinstance(self.output, BlockHandler):
            self.output.block(stream, text)
            return
        for line in _lines(text):
            self.output(stream, line)


def _lines(text: str) -> list[str]:
    """Complete lines (``text`` ends with a newline) split at newlines only: a form feed or U+2028
    inside a line is part of it, as the transports see it."""
    return text.removesuffix("\n").split("\n")


@dataclass
class ForegroundEnd:
    """How a foreground run on a native Windows node ended, as the controller saw it."""

    result: Result  # exit_code: the launcher's (None: cancelled, timed out, or ended without one)
    ended: bool  # the launcher ended (with or without an exit code); False: we stopped following
    rounds: int


def follow_windows(
    node: Node,
    transport: Transport,
    run_dir: str,
    followed: Followed,
    first: Result,
    *,
    deadline: float | None = None,
) -> ForegroundEnd:
    """After the first round of the follower (the foreground plan's last action, its output already
    fed to ``followed``): further rounds from the offset each one reached, until the launcher has
    ended. Cancelled (the transport closed: fail fast, Ctrl-C) or timed out: returns at once; the
    follower was stopped with the WinRS shell, and the node's watchdog stops the run. ``deadline``
    (``time.monotonic()``): no round is started past it (the result says timed out; the run goes on
    until the caller stops it).

    A round that ends without the record ``more`` or ``end`` is a follower that failed: CommandFailedError
    (the watchdog stops the run once its heartbeat is old)."""
    platform = transport.platform.as_powershell()
    assert platform is not None, "native Windows nodes only"
    ops = WindowsRuns(platform)
    batches = followed.batches
    result, rounds, duration = first, 1, first.duration
    while True:
        if result.exit_code is None:
            return ForegroundEnd(_summary(followed, result, None, duration), False, rounds)
        if batches.missing:
            raise CommandFailedError(f"{run_dir} does not exist on this node", node=node.name)
        if batches.end() is not None:
            code = batches.exit_code()
            return ForegroundEnd(_summary(followed, result, code, duration), True, rounds)
        if batches.more() is None:
            said = [*followed.errors, *result.tail(3)][-3:]
            raise CommandFailedError(
                f"following the run failed (exit {result.exit_code}): {' | '.join(said)}",
                node=node.name,
                hint="the node's watchdog stops the run when the follower's heartbeat is old; "
                f"see {node_log(run_dir)} there",
                result=result,
            )
        if deadline is not None and time.monotonic() >= deadline:
            late = Result(result.node, result.command, None, "", "", 0.0, timed_out=True)
            return ForegroundEnd(_summary(followed, late, None, duration), False, rounds)
        batches.restart(new_nonce())
        rounds += 1
        result = transport.run(
            ops.follow_round(run_dir, batches.offset, batches.nonce),
            on_line=followed,
            keep_lines=20,
            timeout=ROUND_SECONDS + ROUND_MARGIN,
        )
        duration += result.duration


def run_outside_job(
    node: Node,
    transport: Transport,
    job_dir: str,
    script: str,
    *,
    output: OnLine,
    timeout: float | None = None,
    keep: int = 400,
) -> Result:
    """Run PowerShell ``script`` on a native Windows node outside the WinRS shell's job, as a
    foreground run is (runs/windows_follow.py): in ``job_dir`` (made owner-only here; it must not hold a
    log yet), ``job.ps1`` (``script`` wrapped as every script is) is run by ``run.ps1`` (launch.ps1's
    contract), started by the follower's first round with its watchdog, and followed in rounds;
    each line the script prints (stdout and stderr alike, in order) goes to ``output`` as stdout.

    For heavy or long work that the shell's quotas (MaxProcessesPerShell, MaxMemoryPerShellMB) would
    end: pip installing torch. Returns the script's exit code and its last ``keep`` lines (None and
    ``timed_out`` past ``timeout``: the job is stopped then). Cancelled (the transport closed): exit
    code None; the watchdog stops the job on the node."""
    platform = transport.platform.as_powershell()
    if platform is None:
        raise UsageError(
            f"run_outside_job is for native Windows nodes, not {transport.platform.name}", node=node.name
        )
    ops = WindowsRuns(platform)
    log_path = node_log(job_dir)
    nonce = new_nonce()
    prepared = transport.run(
        platform.say_if_exists(log_path, records.record(nonce, "ran-before").rstrip("\n"))
        + "\n"
        + platform.mkdir(job_dir, private=True),
        timeout=60,
    )
    ran_before = records.find(prepared.stdout, nonce, "ran-before") is not None
    if ran_before or not prepared.ok:
        raise CommandFailedError(
            f"cannot use {job_dir} for a job: "
            + ("it holds a job's log already" if prepared.ok else " | ".join(prepared.tail(3))),
            node=node.name,
        )
    with tempfile.TemporaryDirectory(prefix="cb-job-") as tmp:
        for name, text in ((JOB_SCRIPT, platform.wrap(script)), (RUNNER, ops.runner_script())):
            local = Path(tmp) / name
            local.write_bytes(platform.script_file(text))
            transport.put(local, f"{job_dir}/{name}")
    deadline = None if timeout is None else time.monotonic() + timeout
    followed = Followed(node.name, output, new_nonce(), keep=keep)
    first = transport.run(
        ops.foreground(job_dir, log_path, followed.batches.nonce, launcher=RUNNER),
        on_line=followed,
        keep_lines=20,
        timeout=FIRST_ROUND_TIMEOUT,
    )
    end = follow_windows(node, transport, job_dir, followed, first, deadline=deadline)
    if end.result.timed_out and not transport.closed:
        transport.run(ops.stop(job_dir), timeout=60)  # the watchdog would, once the heartbeat is old
    return end.result


def _summary(followed: Followed, last: Result, code: int | None, duration: float) -> Result:
    """The run as one Result: the launcher's exit code, the lines it printed (the last ones),
    the follower's own errors."""
    return Result(
        node=last.node,
        command=last.command,
        exit_code=code,
        stdout="".join(line + "\n" for line in followed.kept),
        stderr="".join(line + "\n" for line in followed.errors),
        duration=duration,
        timed_out=last.timed_out,
    )
