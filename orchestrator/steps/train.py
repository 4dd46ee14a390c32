"""Training on every node in the foreground, below the CLI: every node's plan applied at once
(``steps.launch.run_node``), fail fast, and a run cut short made to leave nothing behind.

The CLI gives each node's output handler and shows the report; this module decides what happened:
which node failed first (the cause), which were stopped because of it, which lost their connection
(they stop themselves when the controller's heartbeats stop), and what the sweep found still running.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator import records
from orchestrator.errors import ConnectError, RunStoppedError
from orchestrator.executor import GroupResult
from orchestrator.render import Renderer
from orchestrator.runs.layout import RUNS_ROOT, finish_record, logs_where, write_record
from orchestrator.runs.next_command import Reach as NextReach
from orchestrator.runs.next_command import train_without
from orchestrator.runs.ranks import split_rank
from orchestrator.steps.launch import died_of_a_peer, failure_tail, root_cause, run_node
from orchestrator.transports import Result
from orchestrator.view import Cell, Said, View

if TYPE_CHECKING:
    from orchestrator.dashboard.model import LiveRun
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory
    from orchestrator.logs import RunLog
    from orchestrator.render import LaunchSpec
    from orchestrator.runner import Reach
    from orchestrator.runs.start import DetachedStart
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.dry_run import Planned
    from orchestrator.steps.launch import LaunchPlan, NodeRunResult
    from orchestrator.transports import SSHOptions
    from orchestrator.transports.base import OnLine

T = TypeVar("T")

#: seconds a process of a stopped run gets between TERM and KILL in the sweep
SWEEP_GRACE = 5.0


def failed_first(
    outcomes: list[Outcome[T]], *, global_tags: bool = False
) -> tuple[list[Outcome[T]], list[Outcome[T]]]:
    """(nodes that failed, the cause first; nodes stopped because of them). In DDP the others often
    fail moments after the first ("Connection closed by peer"), before the stop reaches them: the
    cause is the earliest, whatever its place in the inventory, unless it died of a peer's closed
    connection and another did not (that one's node may end later: see ``consequence``)."""
    group = GroupResult(outcomes)
    return sorted(group.failed, key=lambda o: consequence(o, global_tags=global_tags)), group.cancelled


def consequence(outcome: Outcome[Any], *, global_tags: bool = False) -> bool:
    """Whether a node's failure may be another node's consequence: torchrun's failed rank there died
    of gloo's closed connection (steps.launch.died_of_a_peer). The fail fast then waits a moment
    (Executor.map, CAUSE_GRACE) for the node whose rank went away: when a victim's torchrun ends
    first, the cause is still the one named and the other nodes are stopped only after it."""
    result = getattr(outcome.error, "result", None)
    return isinstance(result, Result) and died_of_a_peer(result, global_tags=global_tags)


def sweep(session: Session, run_id: str, names: set[str]) -> list[Outcome[Any]]:
    """After a foreground run was cut short (Ctrl-C, or fail fast stopping the others): stop every
    process of the run still on a node, found by the run's marker as `bootstrap stop` does.

    Closing a node's connection stops the launcher's process group (TERM, KILL 5 s later) but
    torchrun starts its workers in sessions of their own: a worker that takes longer than that to
    handle TERM, or whose torchrun was killed before it could pass TERM on (a local node's group
    is killed at once), would be left training. The sweep runs on new connections, in parallel,
    with the same 5 s grace, on the nodes in ``names`` only: a node that refused the run id (it
    ran before there) holds another run's processes under that id."""
    from orchestrator.runs.control import stop_node

    nodes = [n for n in session.nodes if n.name in names]
    if not nodes:
        return []
    with session.reopened() as fresh:
        return fresh.map(
            lambda node, t: stop_node(node, t, run_id, grace=SWEEP_GRACE), step="sweep", nodes=nodes
        )


@dataclass
class TrainReport:
    run_id: str
    outcomes: list[Outcome[NodeRunResult]]
    started: set[str]  # nodes whose launcher was started: where the run can have processes
    failed: list[Outcome[NodeRunResult]] = field(default_factory=list)  # the first to fail first
    stopped: list[Outcome[NodeRunResult]] = field(default_factory=list)  # stopped because of them
    lost: set[str] = field(default_factory=set)  # started, then unreachable: they stop by themselves
    swept: list[Outcome[Any]] = field(default_factory=list)  # what the sweep found and stopped
    #: the Ctrl-C (KeyboardInterrupt) or SIGTERM (Terminated) that cut the run short, after the sweep
    interrupted: KeyboardInterrupt | None = None
    swept_all: bool = True  # False: a second interrupt cut the sweep short (`stop --run` then)
    #: the ranks' lines carry global ranks (elastic runs: torchrun's --tee tags), not local ones
    global_tags: bool = False
    #: the nonce of the nodes' GPU/CPU samples in their output (records, not lines a user wrote)
    sample_nonce: str = ""

    def status(self, outcome: Outcome[NodeRunResult]) -> str:
        """A node's result in a few words: ``ok``, ``exit N (rank R)`` for the rank that failed
        (torchrun exits 1 whatever the rank did: the rank's own code), ``stopped by stop --run``,
        ``stopped`` (because another node failed)."""
        if outcome.error is None:
            return "ok"
        if outcome in self.failed:
            result = getattr(outcome.error, "result", None)
            if isinstance(result, Result) and result.exit_code is not None:
                cause = root_cause(result, global_tags=self.global_tags)
                return f"exit {cause[1]} (rank {cause[0]})" if cause else f"exit {result.exit_code}"
            return "failed"
        if isinstance(outcome.error, RunStoppedError):
            return "stopped by stop --run"
        return "stopped" if outcome.node in self.started else "not started"

    def view(self) -> View:
        """The summary (on stderr, under the streamed lines): the node that failed first at the top,
        then the others; each one's result and time."""
        view = View(f"run {self.run_id}", ("node", "result", "time"), stderr=True)
        for o in self.failed + [o for o in self.outcomes if o not in self.failed]:
            word = self.status(o)
            style = "green" if word == "ok" else "red bold" if o in self.failed else "yellow"
            view.add(o.node, Cell(word, style), f"{o.duration:.1f}s")
        return view

    def hints(
        self, inventory: Inventory, specs: Sequence[LaunchSpec], labels: Mapping[str, tuple[int, int]]
    ) -> list[str]:
        """What to do, once each, from what the failed nodes said: a module the ranks missed (not
        synced, or a package), the node behind gloo's "closed by peer [ADDR]" (its ranks may have
        left first, with exit 0), a full disk on a node (said anywhere in its output)."""
        from orchestrator.runs.culprit import disk_full, peers_gone
        from orchestrator.runs.layout import workdir_for
        from orchestrator.steps.script_check import missing_module_hint

        addresses = {spec.local_addr: spec.node.name for spec in specs if spec.local_addr}
        nodes = {spec.node.name: spec.node for spec in specs}
        hints: dict[str, None] = {}
        for o in self.failed:
            tail = self.tail(o, labels.get(o.node, (0, 0))[0])
            if said := missing_module_hint(inventory, tail):
                hints[said] = None
            for address, node in peers_gone(tail, addresses.get):
                if node != o.node:
                    hints[f"{address}, the peer whose connection closed, is {node}: look there first"] = None
            if any(ABORT_IN_TEARDOWN in line for line in tail):
                hints[ABORT_HINT] = None
        for o in self.outcomes:
            result = getattr(o.error, "result", None)
            if isinstance(result, Result) and o.node in nodes and disk_full(result.stdout + result.stderr):
                where = workdir_for(nodes[o.node])
                hints[
                    f"{o.node}: a disk there is full ('No space left on device' in its output): free "
                    f"space in its workdir ({where}), then run again"
                ] = None
        return list(hints)

    def tail(self, outcome: Outcome[NodeRunResult], first_rank: int) -> list[str]:
        """A failed node's last lines, labelled as the stream labels them (``[node:rank] text``)."""
        result = getattr(outcome.error, "result", None)
        if not isinstance(result, Result):
            return []
        lines = []
        for line in failure_tail(result, global_tags=self.global_tags):
            if records.mentions(line, self.sample_nonce) and records.decode_line(line, self.sample_nonce):
                continue  # a sample of the node's GPUs or CPU load, not a line of the run
            local, text = split_rank(line)
            lines.append(f"[{outcome.node}{'' if local is None else f':{first_rank + local}'}] {text}")
        return lines


def train_run(
    session: Session,
    specs: list[LaunchSpec],
    renderer: Renderer,
    outputs: Mapping[str, OnLine],
    log: RunLog,
    *,
    train_doc: Mapping[str, Any] | None,
) -> TrainReport:
    """A foreground run from start to end: its record (``runs/<run-id>/run.json``), :func:`train`,
    and when a Ctrl-C or SIGTERM cuts it short, the sweep of the nodes where it started (the report's
    ``interrupted`` then says so; the caller ends the command). ``log`` is closed before the sweep
    and at the end; the record is finished either way (unless the controller is killed outright)."""
    run_id = specs[0].run_id if specs else ""
    directory = RUNS_ROOT / run_id
    write_record(directory, run_id, specs, detached=False, train=train_doc)
    started: set[str] = set()  # nodes whose launcher was started: where the run can have processes
    try:
        return train(session, specs, renderer, outputs, started)
    except KeyboardInterrupt as stop:
        report = TrainReport(run_id, [], started, interrupted=stop)
        try:  # a second Ctrl-C from here on cuts the sweep short, and is said so
            log.close()
            report.swept = sweep(session, run_id, started)
        except KeyboardInterrupt:
            report.swept_all = False
        return report
    finally:
        log.close()
        # a run whose master never started its launcher never trained (the others cannot meet
        # without it: refused there, the port in use, they were stopped at once): not `latest`,
        # which would make `stop --run latest` miss the run that holds the port
        master = specs[0].node.name if specs else ""
        finish_record(directory, started=master in started)


def train(
    session: Session,
    specs: list[LaunchSpec],
    renderer: Renderer,
    outputs: Mapping[str, OnLine],
    started: set[str],
) -> TrainReport:
    """Every node's part of the run at once, fail fast; then, when some were stopped, the sweep.

    ``started`` is filled while the run goes (the caller keeps it: after a KeyboardInterrupt it
    calls ``sweep`` on those nodes itself)."""
    by_name = {s.node.name: s for s in specs}
    elastic = session.inventory.cluster.train.elastic
    outcomes = session.map(
        lambda node, t: run_node(
            node, t, by_name[node.name], renderer=renderer, output=outputs[node.name], started=started
        ),
        step="train",
        fail_fast=True,
        consequence=lambda o: consequence(o, global_tags=elastic),
        nodes=[n for n in session.nodes if n.name in by_name],
    )
    failed, stopped = failed_first(outcomes, global_tags=elastic)
    report = TrainReport(specs[0].run_id if specs else "", outcomes, started, failed, stopped)
    report.global_tags = elastic
    report.sample_nonce = specs[0].sample_nonce if specs else ""
    if stopped:
        # a node whose connection was lost stops its own run when our heartbeats stop (15 s): the
        # sweep would only wait for its connect timeout
        report.lost = {o.node for o in outcomes if isinstance(o.error, ConnectError)} & started
        report.swept = sweep(session, report.run_id, started - report.lost)
    else:
        report.swept = leftovers(session, report.run_id, outcomes, started)
    return report


def leftovers(
    session: Session, run_id: str, outcomes: list[Outcome[NodeRunResult]], started: set[str]
) -> list[Outcome[Any]]:
    """After a run that ended by itself: what its ranks started and did not wait for (a server, a
    process in a session of its own) still carries the run's marker and would hold GPUs and ports
    without anyone knowing: stopped as `bootstrap stop` does, on the session's own connections (no
    new login). The run keeps its exit code (the stop writes ``stopped`` only before one exists)."""
    from orchestrator.runs.control import stop_node

    ended = {o.node for o in outcomes if not isinstance(o.error, ConnectError)} & started
    nodes = [n for n in session.nodes if n.name in ended]
    if not nodes:
        return []
    return session.map(
        lambda node, t: stop_node(node, t, run_id, grace=SWEEP_GRACE), step="leftovers", nodes=nodes
    )


@dataclass
class LaunchRun:
    """What `bootstrap launch` (and the main pipeline's launch phase) did, for the CLI to show: the
    dry run's plans; or why it did not launch (``unreachable``: the nodes not reached or not verified);
    or the detached start; or the foreground run's :class:`TrainReport`."""

    run_id: str
    nodes: list[str]
    planned: Report[Planned] | None = None
    plan: LaunchPlan | None = None
    unreachable: list[str] = field(default_factory=list)
    detached: DetachedStart | None = None
    report: TrainReport | None = None
    log_dir: Path | None = None
    labels: dict[str, tuple[int, int]] = field(default_factory=dict)

    def ending(self) -> list[Said]:
        """How a foreground run's end went (also beside ``--json``): nodes lost on the way, and what
        the sweep found."""
        report = self.report
        assert report is not None
        status = f"`bootstrap status --run {shlex.quote(self.run_id)}`"
        said = [
            Said(
                "note",
                f"{name}: unreachable; it stops its part of the run by itself within 15 s of losing "
                f"this controller ({status} once it is back)",
            )
            for name in sorted(report.lost)
        ]
        return said + sweep_said(self.run_id, report.swept, ended=not report.stopped)

    def summary(self, inventory: Inventory, reach: NextReach | None = None) -> list[View | Said]:
        """A foreground run's summary: the table, who failed first with their last lines, the hints,
        who was stopped, where the logs are; with ``reach`` (a command of its own: the pipeline says
        it at its end), how to train without the nodes lost while it ran."""
        report, plan = self.report, self.plan
        assert report is not None and plan is not None
        said: list[View | Said] = []
        said.append(report.view())
        for o in report.failed:
            said.append(Said("error", str(o.error)))
            said += [Said("info", f"  {line}") for line in report.tail(o, self.labels.get(o.node, (0, 0))[0])]
        said += [Said("hint", hint) for hint in report.hints(inventory, plan.specs, self.labels)]
        # said on the node's stream before its first line; the run is "ok", on other code than asked
        said += [
            Said("warn", f"{o.node}: {o.value.stale_code}")
            for o in report.outcomes
            if o.value and o.value.stale_code
        ]
        ran = [o.node for o in report.stopped if o.node in report.started]  # the others never started
        if ran and report.failed:
            said.append(
                Said("note", f"stopped because {report.failed[0].node} failed first: {', '.join(ran)}")
            )
        said.append(Said("note", f"logs: {self.log_dir}/ (and {logs_where(inventory.nodes, self.run_id)})"))
        if reach is not None and (hint := train_without(reach, inventory, sorted(report.lost), "launch")):
            said.append(Said("info", hint))
        if ran:  # what a stopped rank printed while it handled the stop may miss node.log
            said.append(
                Said(
                    "note",
                    "every line each rank wrote, also while it was being stopped: ranks/ beside node.log",
                )
            )
        return said


def sweep_said(run_id: str, swept: Sequence[Outcome[Any]], *, ended: bool = False) -> list[Said]:
    """What the sweep after a cut-short run found: nodes it could not check, processes it stopped.
    ``ended``: the run ended by itself, and what is found are processes its ranks left behind."""
    stop = f"`bootstrap stop --run {shlex.quote(run_id)}`"
    said = []
    for o in swept:
        if o.error is not None:
            said.append(
                Said(
                    "warn",
                    f"{o.node}: not checked for processes of the run left running ({o.error}): "
                    f"run {stop} when it is reachable",
                )
            )
        elif o.value is not None and o.value.state == "stopped" and ended:
            said.append(
                Said(
                    "warn",
                    f"{o.node}: the run ended, but processes its ranks started were still "
                    f"running (not waited for by the training script): {o.value.describe()}",
                )
            )
        elif o.value is not None and o.value.state == "stopped":
            said.append(
                Said("note", f"{o.node}: processes of the run were still running: {o.value.describe()}")
            )
    return said


def launch_phase(
    reach: Reach,
    inventory: Inventory,
    *,
    run_id: str | None,
    templates_dir: Path | None,
    detach: bool = False,
    dry_run: SSHOptions | None = None,
) -> LaunchRun:
    """Training on every node of ``inventory``: a new run id (the user's ``run_id`` is refused when it
    exists), the launch plan from the facts (the pipeline's session holds the preflight's), the shares,
    the run record, then the detached start or the foreground run with every line labelled and kept
    in runs/<run-id>/ (``reach.outputs`` shows it; ``reach.live`` the page). ``dry_run`` (the SSH
    options a run would connect with): each node's plan, connecting to nothing. A Ctrl-C or SIGTERM
    during the foreground run comes back as the report's ``interrupted``, after the sweep."""
    from orchestrator.bench.launch import attach_shares, planned_shares
    from orchestrator.dashboard.model import observe, show_facts
    from orchestrator.logs import RunLog
    from orchestrator.render import missing_secrets, templates_dir_for
    from orchestrator.runs.ids import check_run_id, new_run_id, release_run_id
    from orchestrator.runs.layout import train_args_line, train_record
    from orchestrator.runs.ranks import rank_labels
    from orchestrator.runs.stall import StallWatch, stall_seconds
    from orchestrator.steps.launch import (
        example_notice,
        missing_script_warning,
        offline_dry_run,
        plan,
        start_detached,
        with_code_record,
    )

    say, live = reach.say, reach.live
    if missing := missing_script_warning(inventory):
        say("warn", missing)
    if example := example_notice(inventory):
        say(*example)
    nodes = list(inventory.nodes)
    names = [n.name for n in nodes]
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    if dry_run is not None:
        shown_id = check_run_id(run_id) if run_id else f"{inventory.cluster.name}-<time>"  # as launch would
        for issue in missing_secrets(inventory):  # masked here; a real launch stops on them (exit 2)
            say("warn", f"{issue} (a real launch stops here, exit 2)")

        def shared(specs: list[LaunchSpec]) -> list[LaunchSpec]:  # what a launch adds to its specs
            specs, shares_note = planned_shares(inventory, with_code_record(inventory, specs))
            if shares_note:
                say("note", shares_note)
            return specs

        # detached: the start script, which starts launch.sh in a session of its own and returns
        planned = offline_dry_run(
            "launch", inventory, shown_id, renderer, shared, ssh=dry_run, say=say, detach=detach
        )
        return LaunchRun(shown_id, names, planned=planned)
    # a run id names one run: a new one unless the user named it (then refused when it exists)
    run_id = new_run_id(inventory.cluster.name, chosen=run_id)
    run = LaunchRun(run_id, names)
    with reach.connect(nodes) as session:
        unobserve = observe(live, session.executor)  # every phase's node states, on the page
        with reach.progress(names, "plan") as on_event:
            session.executor.on_event = on_event
            # with the project's code record: a node whose code directory holds other code is told
            try:
                run.plan = launch_plan = plan(session, inventory, run_id, starting=True)
            except BaseException:
                release_run_id(run_id)  # nothing started: the id's empty directory goes (not `latest`)
                raise
            launch_plan.specs = with_code_record(inventory, launch_plan.specs)
            attach_shares(session, inventory, launch_plan, run_id)  # cluster.train.shares (docs/bench.md)
        session.executor.on_event = None
        show_facts(live, launch_plan.inspected)
        if any(not o.ok for o in launch_plan.inspected):
            unobserve()
            # not reached, or reached and refused (an unknown host key, a login refused): not launching
            run.unreachable = [o.node for o in launch_plan.inspected if not o.ok]
            release_run_id(run_id)
            return run
        for warning in launch_plan.warnings:
            say("warn", warning)
        backend = f"backend {launch_plan.backend} ({launch_plan.backend_reason})"
        say("info", f"run {run_id}: {len(nodes)} node(s), {backend}")
        record = train_record(inventory)  # the run record's train part: what the script got
        if args_line := train_args_line(record):
            say("info", args_line)
        if detach:
            unobserve()
            run.detached = start_detached(session, launch_plan.specs, renderer=renderer, train_doc=record)
            return run
        log = RunLog(Path("runs") / run_id)
        run.log_dir, run.labels = log.directory, rank_labels(inventory)
        samples = launch_plan.specs[0].sample_nonce if launch_plan.specs else ""
        if live is not None:
            live.set_run(run_id, run.labels, samples)
        page = None if live is None else live.block  # the page reads the same blocks
        outputs = reach.outputs(run.labels, log, page, samples) if reach.outputs else {}
        if len(nodes) > 1:  # a single node's failure is the summary's to tell: nothing else to stop
            # the node whose failure ends the run, named as the fail fast stops the others: the
            # summary only comes after they are stopped and swept
            session.executor.on_cause = lambda cause: say(
                "warn", f"{cause.error}; stopping the run on the other nodes"
            )
        try:
            # a run whose ranks all went quiet (a hung rank) is said to be so, not left silent
            with StallWatch(outputs, lambda text: say("note", text), run_id, stall_seconds()):
                run.report = train_run(session, launch_plan.specs, renderer, outputs, log, train_doc=record)
        finally:
            session.executor.on_cause = None
            unobserve()
        if live is not None and run.report.interrupted is None:
            _tell_dashboard(live, run.report)
    return run


#: what a rank's C++ runtime prints when it aborts (SIGABRT, exit -6) in Python's teardown after the
#: script's last line: torch's gloo threads still running at interpreter exit
ABORT_IN_TEARDOWN = "terminate called without an active exception"
ABORT_HINT = (
    "'terminate called without an active exception': a rank aborted in Python's teardown, after the "
    "script's last line (torch's threads at interpreter exit: nothing of the training was lost). End the "
    "script with os._exit(0) after its last save and print, as examples/train_ddp.py does "
    '(docs/troubleshooting.md, "terminate called without an active exception")'
)


def _tell_dashboard(live: LiveRun, report: TrainReport) -> None:
    """How the run ended, on the page: lost nodes, then the end (before the page goes away)."""
    for name in sorted(report.lost):
        live.lost(name, "unreachable: it stops its part of the run by itself within 15 s")
        live.node_state(name, "train", "lost")
    state = "failed" if report.failed else "stopped" if report.stopped else "ok"
    live.ended(state, f"run {report.run_id} {'ended' if state == 'ok' else state}")
