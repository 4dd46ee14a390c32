"""`logs`, `status`, `stop` and `fetch` over a run's nodes: which nodes and rank labels a run has,
each operation of runs/control.py on every node at once (the scripts a dry run shows), and what its
results mean (a node with no such run failed, a controller that vanished, a missing path, which copy
of a log is kept, what is said after it). The CLI shows these reports; it decides nothing of them.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConnectError, ExitCode, UsageError
from orchestrator.executor import GroupResult, Outcome, exit_code_for
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.logs import RunLog
from orchestrator.neutralise import one_line
from orchestrator.redact import mask_credentials_in
from orchestrator.runs.base import LISTING_CAP
from orchestrator.runs.control import (
    Fetched,
    NodeStatus,
    StopResult,
    code_dir_of,
    connect_following,
    fetch_node,
    fetch_script,
    follow_node,
    no_such_run,
    runs_having,
    status_node,
    status_script,
    stop_node,
    stop_script,
    tail_script,
)
from orchestrator.runs.ids import runs_before
from orchestrator.runs.layout import (
    RUNS_ROOT,
    controller_lost,
    note_stop,
    read_record,
    sample_nonce,
    stop_nodes,
    train_args_line,
)
from orchestrator.runs.ranks import rank_labels
from orchestrator.runs.stall import span
from orchestrator.runs.tail import FollowResult
from orchestrator.view import Cell, Said, View, failures, node_view, red

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.platforms import Platform
    from orchestrator.runner import Reach
    from orchestrator.session import Session
    from orchestrator.transports.base import BlockHandler, Transport

#: a run command's script on one node (runs/control.py), as its dry run shows it
NodeScript = Callable[["Node", "Platform"], str]


@dataclass
class RecordedRun:
    """A run as the commands after its start work on it: its id, its nodes, each node's rank labels
    (first global rank, rank count), the nonce of its nodes' samples in their logs ("": none) and
    the inventory's code directory (where `fetch` looks last)."""

    run_id: str
    nodes: list[Node]
    labels: dict[str, tuple[int, int]]
    samples: str = ""
    code_dir: str | None = None
    #: nodes the run's record names that this inventory lacks: not asked, and said so
    absent: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def node_labels(self) -> dict[str, tuple[int, int]]:
        """The labels of the run's nodes (the inventory's other nodes left out)."""
        return {n.name: self.labels[n.name] for n in self.nodes}


def recorded_run(inventory: Inventory, nodes: list[Node], run_id: str, *, narrowed: bool) -> RecordedRun:
    """The nodes a run launched from here used (its record: ``launch --nodes`` may have left some
    out) unless ``narrowed`` (``--nodes`` names them), and each node's rank labels as that run gave
    them (an elastic run's lines carry their global rank themselves)."""
    labels = rank_labels(inventory)
    record = read_record(RUNS_ROOT / run_id) or {}
    recorded = record.get("nodes")
    samples, code_dir = sample_nonce(RUNS_ROOT / run_id), inventory.cluster.train.code_dir
    if not isinstance(recorded, dict) or not recorded:
        return RecordedRun(run_id, nodes, labels, samples, code_dir)
    if narrowed and (outside := [n.name for n in nodes if n.name not in recorded]):
        # said from the record here, before any node is dialled (it answered "no run" after a dial)
        raise UsageError(
            f"{', '.join(outside)}: not part of run {run_id} (its nodes: {', '.join(map(str, recorded))})",
            hint="leave them out of --nodes",
        )
    absent = [str(name) for name in recorded if str(name) not in {n.name for n in inventory.nodes}]
    if not narrowed:
        nodes = [n for n in inventory.nodes if n.name in recorded] or nodes
    if not inventory.cluster.train.elastic:
        for name, doc in recorded.items():
            try:
                labels[str(name)] = (int(doc["first_rank"]), int(doc["nproc"]))
            except (KeyError, TypeError, ValueError):
                continue
    return RecordedRun(run_id, nodes, labels, samples, code_dir, absent=absent)


def absent_said(absent: Sequence[str], run_id: str, doing: str) -> list[Said]:
    """The run's nodes the inventory given lacks, said (they were left out silently): ``doing``."""
    if not absent:
        return []
    return [
        Said(
            "warn",
            f"{', '.join(absent)}: part of run {run_id} but not in this inventory, so {doing} (the "
            "inventory the run was launched with has them)",
        )
    ]


# -- logs ----------------------------------------------------------------------------------------------


@dataclass
class LogsReport:
    """Every node's read of its log; ``copies``: per node what became of runs/<run-id>/<node>.log
    here (``RunLog.settle``, at ``paths``; empty with ``--tail``, which writes no copy);
    ``interrupted``: the Ctrl-C or SIGTERM that cut the reads short (the copies were settled first)."""

    outcomes: GroupResult[FollowResult]
    copies: dict[str, str] = field(default_factory=dict)
    interrupted: KeyboardInterrupt | None = None
    run_id: str = ""
    follow: bool = False
    tail: int | None = None
    paths: dict[str, Path] = field(default_factory=dict)
    #: the run's nodes the inventory given lacks: not read, and said so
    absent: list[str] = field(default_factory=list)

    @property
    def log_dir(self) -> Path | None:
        """Where the copies are here (None with ``--tail``: it writes none)."""
        return RUNS_ROOT / self.run_id if self.tail is None else None

    def node_fields(self, outcome: Outcome[FollowResult]) -> dict[str, Any]:
        """A node's ``--json`` fields: byte offsets in its node.log (reading began at ``start``, 0
        without ``--tail``, and ended at ``end``; ``bytes`` read), lines, reconnects, and ``copy``:
        runs/<run-id>/<node>.log here "written", "kept" (the read failed), "busy" (a running launch or
        another `logs` writes it), "none" (failed, and there is none); null with ``--tail``."""
        read = outcome.value
        return {
            "exit_code": read.exit_code if read else None,
            "lines": read.lines if read else None,
            "start": read.start if read else None,
            "end": read.offset if read else None,
            "bytes": read.offset - read.start if read else None,
            "reconnects": read.reconnects if read else None,
            "copy": self.copies.get(outcome.node),
        }

    def exit_code(self) -> ExitCode:
        """A failed read; with ``--follow``, also a node whose training did not exit 0 (1), or was
        stopped (130, as the launch it stopped says)."""
        code = exit_code_for(self.outcomes)
        ended = [o.value for o in self.outcomes if isinstance(o.value, FollowResult)]
        if not self.follow or code != ExitCode.OK:
            return code
        if any((r.exit_code != 0 and not r.stopped) or r.never_started for r in ended):
            return ExitCode.NODES_FAILED
        return ExitCode.INTERRUPTED if any(r.stopped for r in ended) else code

    def copy_notes(self) -> list[str]:
        """What became of each node's copy here, where it is not simply written."""
        said = {
            "kept": "the previous copy {path} was kept as it was",
            "busy": "{path} left as it is: a launch running from here (or another `logs`) writes it",
        }
        return [
            f"{name}: " + said[state].format(path=self.paths[name])
            for name, state in self.copies.items()
            if state in said
        ]

    def said(self) -> list[Said]:
        """Under the lines: what failed, the run's nodes not read, then the notes (the copies here,
        where else to look)."""
        absent = absent_said(self.absent, self.run_id, "its log was not read")
        return [*failures(self.outcomes), *absent, *(Said("note", note) for note in self.notes())]

    def notes(self) -> list[str]:
        """What follows the lines: the copies, with ``--follow`` how each node's training ended, and
        where the copies are when any node had lines."""
        notes = self.copy_notes()
        if self.follow:
            for o in self.outcomes:
                if isinstance(o.value, FollowResult):
                    how = (
                        "never started (the launch that prepared it was cut short before starting it)"
                        if o.value.never_started
                        else "was stopped"
                        if o.value.stopped
                        else "ended without an exit code: its processes were killed outright (SIGKILL, "
                        "the OOM killer, a reboot or a crash of that machine)"
                        if o.value.exit_code is None
                        else f"exited {o.value.exit_code}"
                    )
                    notes.append(f"{o.node}: training {how}")
        if self.log_dir is not None and any(
            isinstance(o.value, FollowResult) and o.value.lines for o in self.outcomes
        ):
            notes.append(f"logs: {self.log_dir}/")
        return notes


def logs_script(run: RecordedRun, *, follow: bool, tail: int | None) -> NodeScript:
    """`logs`' script on a node (its reader of the run's log), as the read sends it."""
    return lambda node, platform: tail_script(
        platform,
        node,
        run.run_id,
        follow=follow,
        python=interpreter_for(node),
        lines=tail,
        samples=run.samples,
    )


def read_logs(
    session: Session,
    run: RecordedRun,
    outputs_for: Callable[[RunLog | None], Mapping[str, BlockHandler]],
    *,
    follow: bool,
    tail: int | None,
    on_note: Callable[[str, str], None],
    on_failed: Callable[[str, int], None] | None = None,
) -> LogsReport:
    """Every node's log from its start (or its last ``tail`` lines) into the handlers
    ``outputs_for(copies)`` gives: ``copies`` (None with ``tail``, which only prints) is the staged
    log here that settles each node's copy: a node read to the end replaces it, a failed read keeps
    it, a read cut short by Ctrl-C replaces it only when longer (of two prefixes of the same
    append-only log, the longer). ``on_failed(node, code)``: a node whose training exited non-zero,
    as its read ends."""
    run_log = RunLog(RUNS_ROOT / run.run_id, staged=True) if tail is None else None
    outputs = outputs_for(run_log)
    read: dict[str, FollowResult] = {}  # nodes whose read has ended well (known before Ctrl-C too)

    def one(node: Node, t: Any) -> FollowResult:
        if follow:
            # a node that does not answer at first is told at once and tried again, as one lost
            # mid-stream is, while the others are followed (it was given up silently)
            connect_following(node, t, lambda text: on_note(node.name, text))
        result = follow_node(
            node,
            t,
            run.run_id,
            follow=follow,
            output=outputs[node.name],
            on_note=on_note,
            python=interpreter_for(node),  # the run's own: it is there
            lines=tail,
            samples=run.samples,  # not shown: a tail's N lines do not count them
        )
        read[node.name] = result
        if on_failed is not None and result.exit_code not in (0, None) and not result.stopped:
            on_failed(node.name, result.exit_code)
        return result

    report = LogsReport(GroupResult(), run_id=run.run_id, follow=follow, tail=tail, absent=run.absent)
    try:
        try:
            with session:
                report.outcomes = session.map(one, step="logs", connect=not follow)
            settle = {o.node: "replace" if o.ok else "keep" for o in report.outcomes}
        except KeyboardInterrupt as stop:
            report.interrupted = stop
            settle = {n: "replace" if n in read else "longer" for n in outputs}
        if run_log is not None:
            report.copies = run_log.settle(outputs, settle)
            report.paths = {n: run_log.path(n) for n in report.copies}
    finally:
        if run_log is not None:
            run_log.close()  # drops the parts not committed: the copies stay as they were
    return report


#: characters of a rank's last line in the status table (the full line: `logs --tail 1`, `--json`)
STATUS_LINE_WIDTH = 60

# -- status --------------------------------------------------------------------------------------------


@dataclass
class StatusReport:
    """Every node's status of the run: a node with no such run failed (its state kept); ``lost``:
    the run's foreground controller vanished (every node then says "controller lost", its own word
    in ``node_state``); ``train``: the record's arguments of a run launched from here."""

    outcomes: GroupResult[NodeStatus]
    lost: bool = False
    train: dict[str, Any] | None = None
    #: the nodes a `stop --run` of this run could not reach, and those where it stopped something
    #: (its record here)
    unreached: set[str] = field(default_factory=set)
    by_stop: set[str] = field(default_factory=set)
    #: its record here says the launch ended before the master's launcher started (refused, failed)
    never_started: bool = False
    #: nodes the run's record names that the inventory given lacks (not asked)
    absent: list[str] = field(default_factory=list)

    def exit_code(self) -> ExitCode:
        """1 also when the run failed on a node (a non-zero exit no stop caused, no exit code, its
        controller lost), as `status --watch` and `logs --follow` say of a run that ended so."""
        code = exit_code_for(self.outcomes)
        if code == ExitCode.OK and self.never_started:
            return ExitCode.NODES_FAILED  # a run that never trained did not do what it was for
        after = self.after_stop()
        failed = any(o.value is not None and o.value.failed and o.node not in after for o in self.outcomes)
        return ExitCode.NODES_FAILED if code == ExitCode.OK and failed else code

    def after_stop(self) -> list[str]:
        """Nodes a `stop --run` could not reach (``unreached``: the record here says so, never a
        node's word; a foreground launch's own stop of the others after a failure is no such stop)
        whose non-zero exit came at or after the moment the others were stopped: their ranks lost
        their peers ("Connection closed by peer"), no failure of their own. Runtimes are each node's
        own, from launchers started together; a crash before the stop is still the run's failure."""
        if not self.unreached:
            return []
        stops = [
            o.value.runtime
            for o in self.outcomes
            if o.node in self.by_stop and o.value and o.value.state == "stopped"
        ]
        first = min((t for t in stops if t is not None), default=None)
        if first is None:
            return []
        return [
            o.node
            for o in self.outcomes
            if o.node in self.unreached
            and o.value is not None
            and o.value.state == "exited"
            and o.value.exit_code not in (None, 0)
            and o.value.runtime is not None
            and o.value.runtime >= first
        ]

    def never_started_line(self, run_id: str) -> str:
        return (
            f"run {run_id} never started: its launch ended before training began on the master (refused "
            "or failed on a node: that launch's output said why; `logs --run` shows what each node wrote)"
        )

    def lost_warning(self, run_id: str) -> str:
        """What a lost controller means for the run (``lost``): what was left of it was stopped, or,
        killed before it started anything, the run never started."""
        if all(o.value is not None and o.value.node_state == "not started" for o in self.outcomes):
            return (
                f"run {run_id} never started: the launch that prepared it ended (killed, or its machine "
                "lost) before it started training on any node; launch again"
            )
        return (
            f"run {run_id}: its controller ended without ending the run (killed, or its machine or "
            "connection lost): each node's watchdog stopped what was left; "
            f"`bootstrap logs --run {shlex.quote(run_id)}` shows what every rank printed last"
        )

    def said(self, run_id: str) -> list[View | Said]:
        """What a human reads: the table, the run's arguments, a lost controller, what failed where."""
        said: list[View | Said] = [self.view(run_id)]
        said += [Said("info", line)] if (line := train_args_line(self.train)) else []
        said += [Said("warn", self.lost_warning(run_id))] if self.lost else []
        said += [Said("error", self.never_started_line(run_id))] if self.never_started else []
        return [
            *said,
            *(Said("error", line) for line in self.failure_lines(run_id)),
            *(Said("note", line) for line in self.after_stop_lines()),
            *(Said("note", line) for line in self.quiet_lines(run_id)),
            *absent_said(self.absent, run_id, "not asked"),
            *failures(self.outcomes),
        ]

    def quiet_lines(self, run_id: str) -> list[str]:
        """A running run none of whose ranks printed for the stall time (runs/stall.py, as the
        foreground launch says it): maybe a hung rank, how to look and how to stop."""
        from orchestrator.runs.stall import stall_seconds

        running = [o.value for o in self.outcomes if o.value is not None and o.value.state == "running"]
        after = stall_seconds()
        if not running or after <= 0 or any(v.quiet is None or v.quiet < after for v in running):
            return []
        least = min(v.quiet or 0.0 for v in running)
        return [
            f"no rank has printed anything for {span(least)}: one may be hung (a data loader, a wait), the "
            "others then wait for it in their next collective up to the process group's timeout (30 min "
            "for gloo by default). To see where a rank is: `py-spy dump --pid PID` on its node; to stop "
            f"the run: `bootstrap stop --run {shlex.quote(run_id)}`; if the script is only quiet, this can "
            "be ignored (BOOTSTRAP_STALL_NOTE=SECONDS sets when this is said, 0 never)"
        ]

    def failure_lines(self, run_id: str) -> list[str]:
        """One line per node where the run failed, the one whose launcher vanished (no exit code: the
        node's processes killed outright) first: the others' ranks then failed because of it, and it
        is where to look (the foreground launch says the same from the ranks' last lines); then the
        others in the order they ended, the first to end named when it ended before the rest."""
        if self.lost:
            return []  # lost_warning says it for every node
        from orchestrator.runs.control import NO_EXIT_CODE

        later = self.after_stop()
        failed = [
            o
            for o in self.outcomes
            if o.value is not None and o.error is None and o.value.failed and o.node not in later
        ]
        vanished = [o.node for o in failed if o.value is not None and o.value.state == NO_EXIT_CODE]
        lines = [
            f"{node}: its launcher ended without an exit code: the node's processes were killed outright "
            "(SIGKILL, the OOM killer, a reboot or a crash of that machine), or the code could not be "
            "written (a full disk there: `df` on it); the others failed after it: look there first "
            f"(`bootstrap logs --run {shlex.quote(run_id)} --nodes {node}`)"
            for node in vanished
        ]
        # the others by when they ended (their launchers started together: the shortest runtime
        # ended first), the first named as such: the others' ranks usually failed because of it
        ended = {o.node: o.value.runtime for o in failed if o.value is not None}
        rest = sorted(
            (o for o in failed if o.value is not None and o.node not in vanished),
            key=lambda o: (ended[o.node] is None, ended[o.node] or 0.0),
        )
        times = [ended[o.node] or 0.0 for o in rest if ended[o.node] is not None]
        first = rest[0].node if len(times) > 1 and len(rest) == len(times) and times[0] < times[1] else None
        for o in rest:
            assert o.value is not None
            last = f": {o.value.last_line}" if o.value.last_line else ""
            after = f", after {', '.join(vanished)}" if vanished else ""
            ahead = " (failed first: the others ended after it)" if o.node == first and not vanished else ""
            lines.append(f"{o.node}: {o.value.label}{after}{ahead}{last}")
        return lines

    def after_stop_lines(self) -> list[str]:
        """Per node that exited after its peers were stopped: why it is no failure."""
        stopped = [o.node for o in self.outcomes if o.node in self.by_stop]
        were = "was" if len(stopped) == 1 else "were"
        return [
            f"{node}: exited after {', '.join(stopped)} {were} stopped: its ranks lost their peers (no "
            "failure of its own)"
            for node in self.after_stop()
        ]

    def view(self, run_id: str) -> View:
        """The table: per node its state (red: failed, no run), runtime, GPU use, last line (which
        gives way to the other columns: a 500-character line collapsed them all)."""
        view = View(f"run {run_id}", ("node", "state", "runtime", "gpu", "last line"), no_wrap=True)
        view.options["last line"] = {"overflow": "ellipsis", "max_width": STATUS_LINE_WIDTH}
        styles = {"running": "cyan", "exited": "green", "stopped": "yellow"}
        for o in self.outcomes:
            if (value := o.value) is None:
                view.add(o.node, red("unknown"), "-", "-", "")
                continue
            failed = o.error is not None or value.failed  # "no run" too
            state = Cell(value.label, "red" if failed else styles.get(value.state, "dim"))
            quiet = value.quiet or 0.0  # a running node silent for a minute or more: since when
            last = f"({span(quiet)} ago) {value.last_line}" if quiet >= 60 else value.last_line
            view.add(o.node, state, value.runtime_text, value.gpu_text, last)
        return view


def status_script_of(run: RecordedRun) -> NodeScript:
    return lambda node, platform: status_script(platform, node, run.run_id)


def status_all(reach: Reach, run: RecordedRun) -> StatusReport:
    """Every node's status of the run, in one round trip each."""
    run_id, by_name = run.run_id, {n.name: n for n in run.nodes}
    outcomes = reach.within(
        run.nodes,
        "status",
        lambda session: session.map(lambda node, t: status_node(node, t, run_id), step="status"),
    )
    outcomes = GroupResult(_unknown_run(o, by_name[o.node], run_id) for o in outcomes)
    record = read_record(RUNS_ROOT / run_id)
    lost = controller_lost(
        record, [o.value.state if o.ok and o.value is not None else "unknown" for o in outcomes]
    )
    if lost:
        outcomes = GroupResult(_as_lost(o) for o in outcomes)
    train = (record or {}).get("train")
    never = bool((record or {}).get("not_started"))
    kept = mask_credentials_in(train) if isinstance(train, dict) else None  # an older record kept logins
    unreached, by_stop = stop_nodes(record, "unreached"), stop_nodes(record, "stopped")
    return StatusReport(
        outcomes, lost, kept, unreached=unreached, by_stop=by_stop, never_started=never, absent=run.absent
    )


def _unknown_run(outcome: Outcome[NodeStatus], node: Node, run_id: str) -> Outcome[NodeStatus]:
    if outcome.value is None or outcome.value.state != "no run":
        return outcome
    return dataclasses.replace(outcome, error=no_such_run(node, run_id))


def _as_lost(outcome: Outcome[NodeStatus]) -> Outcome[NodeStatus]:
    value = outcome.value
    assert value is not None
    said = (
        value.state if value.exit_code is None or value.state == "stopped" else f"exited ({value.exit_code})"
    )
    return dataclasses.replace(
        outcome, value=dataclasses.replace(value, state="controller lost", node_state=said)
    )


# -- stop and fetch ------------------------------------------------------------------------------------


@dataclass
class StopReport:
    outcomes: GroupResult[StopResult]
    #: the run's nodes the inventory given lacks: not stopped, and said so
    absent: list[str] = field(default_factory=list)

    def exit_code(self) -> ExitCode:
        return exit_code_for(self.outcomes)

    def view(self, run_id: str) -> View:
        return node_view(
            f"stop {run_id}",
            ("node", "result"),
            self.outcomes,
            lambda v: [Cell(v.describe(), "green" if v.state == "stopped" else "dim")],
            failed=lambda o: "failed",
        )

    def said(self, run_id: str, again_stop: str) -> list[View | Said]:
        """The table, what failed, the nodes not reached (``again_stop``: the stop to repeat), or that
        nothing was running."""
        said: list[View | Said] = [self.view(run_id), *failures(self.outcomes)]
        said += absent_said(self.absent, run_id, "not stopped: its part of the run may still be running")
        if self.unreached:
            said.append(
                Said(
                    "warn",
                    f"{', '.join(self.unreached)}: not reached, so its part of the run may still be running "
                    f"there; once it answers, run `{again_stop}` again",
                )
            )
        return said + ([Said("note", "nothing was running: nothing changed")] if self.nothing_ran else [])

    @property
    def unreached(self) -> list[str]:
        """Nodes that could not be reached: their part of the run may still be running there."""
        from orchestrator.errors import ConnectError

        return [o.node for o in self.outcomes if isinstance(o.error, ConnectError)]

    @property
    def nothing_ran(self) -> bool:
        """Every node answered and none had anything of the run to stop: nothing changed."""
        return self.exit_code() == ExitCode.OK and all(
            o.value is not None and o.value.state != "stopped" for o in self.outcomes
        )


def stop_script_of(run: RecordedRun, *, grace: float) -> NodeScript:
    return lambda node, platform: stop_script(platform, node, run.run_id, grace)


def stop_all(reach: Reach, run: RecordedRun, *, grace: float) -> StopReport:
    """Every process of the run stopped on every node (``grace`` seconds between SIGTERM and SIGKILL).
    A run id no launch from here recorded is a mistake on a node that does not have it either, not
    "nothing to stop": that node fails with "no run", as `status` says it (and its progress line)."""
    known = read_record(RUNS_ROOT / run.run_id) is not None

    def one(node: Node, transport: Transport) -> StopResult:
        result = stop_node(node, transport, run.run_id, grace=grace)
        if result.state == "no run" and not known:
            raise no_such_run(node, run.run_id)
        return result

    report = StopReport(
        reach.within(run.nodes, "stop", lambda session: session.map(one, step="stop")), absent=run.absent
    )
    if known:  # the nodes it could not reach: their ranks may fail on the stopped peers (status)
        unreached = [o.node for o in report.outcomes if isinstance(o.error, ConnectError)]
        stopped = [o.node for o in report.outcomes if o.value is not None and o.value.state == "stopped"]
        note_stop(RUNS_ROOT / run.run_id, unreached, stopped)
    return report


@dataclass
class FetchReport:
    outcomes: GroupResult[list[Fetched]]
    from_code: bool = False
    #: a Slurm run's --dry-run: the paths were listed through the login host, nothing was copied
    listed_only: bool = False
    #: the runs launched from here before this one that were looked in (newest first), for the paths
    #: no node has in this one; ``elsewhere``: path -> the newest of them that has it, and a node
    earlier: list[str] = field(default_factory=list)
    elsewhere: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def missing(self) -> list[tuple[str, str]]:
        """(node, path) for every path a node did not have."""
        return [(o.node, f.path) for o in self.outcomes if o.value for f in o.value if f.source is None]

    @property
    def nowhere(self) -> list[str]:
        """The paths no node has (a path one node has, such as the checkpoint rank 0 alone saves, is
        fetched: the others' lack of it is noted, not a failure)."""
        found = {f.path for o in self.outcomes for f in o.value or [] if f.source is not None}
        return sorted({path for _, path in self.missing} - found)

    def errors(self) -> list[str]:
        """One line per path no node has, naming the nodes and where it was looked for."""
        where = (
            "the code directory"
            if self.from_code
            else "the run's outputs, its run directory or the code directory"
        )
        lines = []
        for path in self.nowhere:
            nodes = [node for node, missing in self.missing if missing == path]
            named = f"node {nodes[0]!r}" if len(nodes) == 1 else "nodes " + ", ".join(map(repr, nodes))
            near = sorted(
                {(f.near, o.node) for o in self.outcomes for f in o.value or [] if f.path == path and f.near}
            )
            meant = f" (did you mean {one_line(near[0][0])}? {near[0][1]} has it)" if near else ""
            lines.append(f"{named}: {path} not found in {where}{meant}")
        return lines

    def notes(self) -> list[str]:
        """A path some nodes have and others not: which lack it; a copy here that held other bytes:
        where it was kept."""
        partly = sorted({path for _, path in self.missing} - set(self.nowhere))
        lacking = [
            f"{path}: not on {', '.join(node for node, missing in self.missing if missing == path)} "
            "(copied from the nodes that have it)"
            for path in partly
        ]
        kept = [
            f"{o.node}: {one_line(backup.rsplit('.~', 1)[0])} held other bytes "
            f"than the node's: kept as {one_line(backup)}"
            for o in self.outcomes
            for f in o.value or []
            for backup in f.kept
        ]
        skipped = [
            f"{o.node}: {f.path}: {f.skipped} name(s) below it left on the node: not a plain file name "
            "here (a line break or a control character in it)"
            for o in self.outcomes
            for f in o.value or []
            if f.skipped
        ]
        return [*lacking, *kept, *skipped]

    def cut(self) -> list[str]:
        """What was found and not copied (each an error): a directory whose listing was too long to
        take whole; files whose place here holds the other kind (a directory for a file, or a file
        where a directory goes)."""
        return [
            f"{o.node}: {f.path}: its listing was longer than {LISTING_CAP >> 20} MiB of names, so only "
            f"the first {f.files} file(s) were copied: fetch the directories below it one by one"
            for o in self.outcomes
            for f in o.value or []
            if f.cut
        ] + [
            f"{o.node}: {f.path}: {len(f.clashed)} file(s) not copied, the first {one_line(f.clashed[0])}: "
            "here a directory has a file's name there, or a file a directory's (an earlier fetch when it "
            "was the other kind); move that away here and fetch again"
            for o in self.outcomes
            for f in o.value or []
            if f.clashed
        ]

    def hint(self, run_id: str) -> str:
        """Where the paths no node has in this run are: the newest earlier run that has each, with
        the fetch to type, or that none of the runs looked in has them ("": not looked)."""
        if not self.earlier:
            return ""
        lines = [
            f"{path}: in run {other} ({node} has it): `bootstrap fetch --run {other} {shlex.quote(path)}`"
            for path, (other, node) in self.elsewhere.items()
        ]
        if missing := [p for p in self.nowhere if p not in self.elsewhere]:
            count = len(self.earlier)
            runs = f"the {count} runs launched from here before it" if count > 1 else self.earlier[0]
            named = " ".join(map(shlex.quote, missing))
            lines.append(f"no node has {named} in run {run_id}, nor in {runs}")
        return "; ".join(lines)

    def shared(self, run_id: str) -> list[str]:
        """Relative paths found in the code directory, not in the run's own directories: shared by
        every run (the checkpoints of every run a script wrote there), not this run's alone."""
        return [
            f"{o.node}: {f.path} came from the code directory ({one_line(f.source)}), which every run "
            f"shares: not only run {run_id}'s (`fetch --code` looks there alone)"
            for o in self.outcomes
            for f in o.value or []
            if f.source
            and not f.path.startswith("/")
            and f"/runs/{run_id}/{o.node}/" not in f.source.replace("\\", "/") + "/"
        ]

    def said(self, run_id: str) -> list[View | Said]:
        """The table, what failed; under it: where a path came from when not the run's own, the paths
        some nodes lack, those no node has, where else to look."""
        said: list[View | Said] = [self.view(run_id), *failures(self.outcomes)]
        said += [
            Said("note", note) for note in (*([] if self.from_code else self.shared(run_id)), *self.notes())
        ]
        said += [Said("error", e) for e in (*self.errors(), *self.cut())]
        return said + ([Said("hint", hint)] if (hint := self.hint(run_id)) else [])

    def exit_code(self) -> ExitCode:
        """1 also when a path is on no node, or something found was not copied (:meth:`cut`)."""
        code = exit_code_for(self.outcomes)
        return ExitCode.NODES_FAILED if code == ExitCode.OK and (self.nowhere or self.cut()) else code

    def view(self, run_id: str) -> View:
        """A row per path a node has (or lacks: "missing") with its files, size and where it went."""
        view = View(f"fetch {run_id}", ("node", "path", "files", "size", "copied to"))
        for o in self.outcomes:
            if o.value is None:  # its error is said under the table
                view.add(o.node, "-", red("failed"), "-", "-")
            for f in o.value or []:
                found = (
                    (str(f.files), f.size, f.local) if f.source is not None else (red("missing"), "-", "-")
                )
                view.add(o.node, f.path, *found)
        return view

    @staticmethod
    def node_fields(outcome: Outcome[list[Fetched]]) -> dict[str, Any]:
        return {"paths": [dataclasses.asdict(f) for f in outcome.value] if outcome.value else []}


def fetch_script_of(run: RecordedRun, paths: Sequence[str], *, from_code: bool) -> NodeScript:
    return lambda node, platform: fetch_script(
        platform, node, run.run_id, paths, run.code_dir, from_code=from_code
    )


def fetch_on_slurm(
    reach: Reach,
    inventory: Inventory,
    run_id: str,
    paths: Sequence[str],
    *,
    from_code: bool,
    copy: bool = True,
) -> FetchReport:
    """fetch of a Slurm run: its nodes' directories are on the shared file system, read through the
    login host (a session over that host alone); ``copy`` False (--dry-run) lists, copies nothing."""
    check_fetch_paths(paths)
    from orchestrator.slurm.job import login_node
    from orchestrator.slurm.run import fetch_run

    dest = RUNS_ROOT / run_id
    with reach.connect([login_node(inventory)]) as session:
        login = session.transport(login_node(inventory))
        found = fetch_run(login, inventory, run_id, paths, dest_root=dest, from_code=from_code, copy=copy)
    return FetchReport(GroupResult(found), from_code=from_code, listed_only=not copy)


def check_fetch_paths(paths: Sequence[str]) -> None:
    """An empty PATH names nothing (as a relative path it would be the whole run's outputs): a usage
    error, not a copy of everything."""
    if any(not path.strip() for path in paths):
        raise UsageError("fetch: an empty PATH names no file", hint="name the file or directory to copy")


def fetch_all(reach: Reach, run: RecordedRun, paths: Sequence[str], *, from_code: bool) -> FetchReport:
    """Each path from every node into runs/<run-id>/<node>/ here."""
    check_fetch_paths(paths)

    def one(node: Node, t: Any) -> list[Fetched]:
        code = code_dir_of(node, run.code_dir) + "/"

        def vet(found: list[Fetched]) -> None:
            """Nothing found, or only in the code directory every run shares: is the run there at all?
            A run whose directory the node lacks (removed by `clean`) has nothing of its own to fetch."""
            if from_code or not all(f.source is None or f.source.startswith(code) for f in found):
                return
            if status_node(node, t, run.run_id).state == "no run":
                raise no_such_run(node, run.run_id)

        dest = RUNS_ROOT / run.run_id / node.name
        return fetch_node(
            node, t, run.run_id, paths, code_dir=run.code_dir, dest=dest, from_code=from_code, vet=vet
        )

    def fetch_then_look(session: Session) -> FetchReport:
        """The paths fetched; those no node has in this run then looked for in the runs launched from
        here before it, on the same connections (a close name in this run may be a typo, or not: the
        code directory's ckpt/last.pt beside an earlier run's last.pt)."""
        report = FetchReport(session.map(one, step="fetch"), from_code=from_code)
        lost = [] if from_code else report.nowhere
        report.earlier = runs_before(run.run_id) if lost else []
        if report.earlier:
            looked = session.map(lambda n, t: runs_having(n, t, report.earlier, lost), step="earlier runs")
            for path in lost:
                having = [
                    (report.earlier.index(o.value[path]), o.node)
                    for o in looked
                    if o.value is not None and path in o.value
                ]
                if having:
                    at, node = min(having)
                    report.elsewhere[path] = (report.earlier[at], node)
        return report

    return reach.within(run.nodes, "fetch", fetch_then_look)
