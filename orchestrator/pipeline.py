"""The main job, ``bootstrap --inventory hosts.yaml``: sync, firewall, ntp, check, validate, launch, over
ONE session.

This module decides what runs, in which order, on which nodes, and when to stop; it knows nothing of
terminals. Each phase is the same work as its standalone command (``Phases``, which the CLI provides:
the step functions, with their reports shown as the standalone command shows them), handed the
pipeline's session: every node is connected once, a password is asked at most once per node, and what
one phase learnt about a node (its facts: ``Session.remember``) the next one reuses.

Order: sync (the environment the preflight then checks), firewall (the ports the preflight's
reachability mesh then tests), time (the clocks it then measures), the preflight, the all_reduce
validation, training. A failed sync stops the pipeline (training would run the wrong code or torch). A
failed firewall or time step only warns: the preflight that follows measures what they were for
(reachability, clocks) and decides. A failed check stops before anything starts, unless ``force``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.errors import BootstrapError, ConnectError, ExitCode
from orchestrator.facts.linux import RootAccess
from orchestrator.runs.run_inventory import Selection, run_nodes
from orchestrator.settled import settled_line

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.facts.base import Read
    from orchestrator.inventory import Inventory, Node
    from orchestrator.runner import Reach
    from orchestrator.session import Session
    from orchestrator.transports import SSHOptions

PHASES = ("sync", "firewall", "ntp", "check", "validate", "launch")


class Front(Protocol):
    """What the pipeline asks of the front end that shows it (the CLI): callbacks only. ``reach``:
    how a phase reaches its nodes through the pipeline's session (None: a session of the phase's own
    on ``inventory``'s nodes, default the pipeline's inventory: the Slurm pipeline) and shows its
    progress; ``begin`` a phase; ``show`` its report (the exit code it deserves; ``inventory``: the
    one it ran on when not the pipeline's, a Slurm allocation's); ``say`` why the pipeline goes on
    or stops."""

    def reach(self, session: Session | None, phase: str, inventory: Inventory | None = None) -> Reach: ...

    def begin(self, phase: str) -> None: ...

    def show(
        self, phase: str, report: Any, nodes: list[Node], inventory: Inventory | None = None
    ) -> ExitCode: ...

    def say(self, level: str, text: str) -> None: ...


@dataclass
class PipelineOptions:
    force: bool = False  # launch although a check failed
    skip_validate: bool = False
    until: str | None = None  # the last phase to run (e.g. "check": set the cluster up, train nothing)
    sync_from_master: bool = False  # no cluster.env: the master's torch and companions on every node
    dry_run: SSHOptions | None = None  # nothing changes (the options it would connect with)
    detach: bool = False  # launch: start training in the background, and return
    always_validate: bool = False  # --validate: even when nothing it checks changed
    #: a phase that changed nothing and has nothing to say is one line (a cluster validated before;
    #: the CLI asks for it on a terminal's plain output: not with -v, --json or --dry-run)
    brief: bool = False


@dataclass
class PipelineReport:
    """Which phases ran, with their exit codes, and why the pipeline stopped where it did."""

    codes: dict[str, ExitCode] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # phase -> why it did not run
    stopped: str | None = None  # why training was not started
    exit_code: ExitCode = ExitCode.OK

    def public_dict(self) -> dict[str, Any]:
        return {
            "phases": {
                name: (
                    {"exit_code": int(self.codes[name])}
                    if name in self.codes
                    else {"skipped": self.skipped.get(name, "not reached")}
                )
                for name in PHASES
            },
            "stopped": self.stopped,
        }


def until_done(options: PipelineOptions, phase: str, report: PipelineReport) -> bool:
    """``--until PHASE``: whether the pipeline ends after ``phase`` (the phases after it: skipped)."""
    if options.until != phase:
        return False
    for later in PHASES[PHASES.index(phase) + 1 :]:
        report.skipped.setdefault(later, f"--until {phase}")
    return True


def _root_steps(inventory: Inventory) -> list[str]:
    """The main pipeline's steps that will run as root on a cluster of 2+ nodes."""
    cluster = inventory.cluster
    return [
        name for name, on in (("firewall", cluster.firewall.manage), ("time sync", cluster.time.manage)) if on
    ]


def _first_reads(
    inventory: Inventory, selected: list[Node], options: PipelineOptions
) -> dict[str, list[Read]]:
    """What the steps the pipeline will run read first, per Linux node, each under the key its step
    reads by (so each step finds its reads held and sends nothing to read): whether the node can
    become root; the firewall's detection (every Linux node: the rules name every peer); chrony's
    state and the route to the master (the time step); the code sync's read-only scan; on the nodes
    the preflight checks, its facts."""
    from orchestrator.steps.firewall import Firewall
    from orchestrator.steps.preflight import facts_read_of
    from orchestrator.steps.preflight.privilege import root_access_read
    from orchestrator.steps.timesync.steps import ConfigureTime, InstallChrony

    cluster = inventory.cluster
    reads: dict[str, dict[str, Read]] = {n.name: {} for n in inventory.nodes if n.os == "linux"}

    def add(node: Node, found: list[Read]) -> None:
        if node.name in reads:
            for read in found:
                reads[node.name].setdefault(read.key, read)

    for node in selected:
        add(node, [root_access_read()])
    if cluster.firewall.manage:
        firewall = Firewall(inventory)
        for node in firewall.scope(selected):
            add(node, firewall.reads(node))
    if cluster.time.manage:
        steps: list[Any] = [InstallChrony()] if cluster.time.install else []
        for step in [*steps, ConfigureTime(inventory)]:
            for node in step.scope(selected):
                add(node, step.reads(node))
    if cluster.code_declared:
        from orchestrator.steps.codesync import prepare_tree
        from orchestrator.steps.codesync.sync import code_dest, scan_read

        try:
            tree = prepare_tree(inventory)
        except BootstrapError:  # the sync step says what is wrong with the project, in its place
            tree = None
        if tree is not None:
            for node in selected:
                add(node, [scan_read(node, tree, code_dest(cluster, node))])
    if options.until not in ("sync", "firewall", "ntp"):  # the preflight's facts, unless it does not run
        for node in selected:
            add(node, [facts_read_of(node, inventory)])
    return {name: list(found.values()) for name, found in reads.items() if found}


def _first_round(
    session: Session, inventory: Inventory, selected: list[Node], options: PipelineOptions
) -> dict[str, RootAccess | BootstrapError]:
    """The pipeline's first command on every Linux node (``runner.gather_reads`` over
    :func:`_first_reads`, sent by steps/preflight/early.py ``first_round``: a clock sample first, the
    preflight's listener last on the nodes it checks): each selected node's root access, or why
    there is none."""
    from orchestrator.runner import gather_reads
    from orchestrator.steps.preflight.early import first_round, mesh_plan
    from orchestrator.steps.preflight.privilege import ROOT_ACCESS

    checked = set() if options.until in ("sync", "firewall", "ntp") else {n.name for n in selected}
    plan = mesh_plan(inventory, tuple(n.name for n in selected)) if len(checked) > 1 else None
    reads = _first_reads(inventory, selected, options)
    send = first_round(session, plan, checked)
    found: dict[str, RootAccess | BootstrapError] = {}
    chosen = {n.name for n in selected}
    for o in gather_reads(session, reads, step="read setup", send={name: send for name in reads}):
        if o.node not in chosen:
            continue
        access = o.value.values.get(ROOT_ACCESS) if o.value is not None else None
        error = o.error or (o.value.error if o.value is not None else None)
        if isinstance(access, RootAccess):
            found[o.node] = access
        elif error is not None:
            found[o.node] = error
    return found


#: which exit code wins when phases end differently (docs/cli.md: 3 takes precedence over 1)
_PRECEDENCE = (ExitCode.CONNECTION, ExitCode.USAGE, ExitCode.NODES_FAILED)


def run_pipeline(
    session: Session,
    inventory: Inventory,
    selected: list[Node],
    options: PipelineOptions,
    front: Front,
) -> PipelineReport:
    """The whole job on ``session`` (which spans every node of ``inventory``: the firewall learns
    every peer's address, validation and training span them; the CLI has narrowed the inventory to
    ``--nodes`` first, the nodes the run uses); ``selected`` are the nodes synced, configured and
    checked.

    A real run goes on past a failed firewall or time step (the preflight measures what they were
    for); a dry run's preflight measures nothing, so there the worst phase's code is the exit code
    (nodes that could not be read: 3)."""
    report = _run_phases(session, inventory, selected, options, front)
    if options.dry_run is not None:
        codes = set(report.codes.values())
        worst = next((c for c in _PRECEDENCE if c in codes), ExitCode.OK)
        if worst != ExitCode.OK and worst != report.exit_code:
            failed = [name for name, code in report.codes.items() if code != ExitCode.OK]
            front.say(
                "error", f"--dry-run: the {' and '.join(failed)} phase(s) failed on some nodes (see above)"
            )
            report.exit_code = worst
    return report


def _run_phases(
    session: Session,
    inventory: Inventory,
    selected: list[Node],
    options: PipelineOptions,
    front: Front,
) -> PipelineReport:
    from orchestrator.steps.firewall import firewall_report
    from orchestrator.steps.preflight import preflight_report
    from orchestrator.steps.preflight.early import end_early_rounds
    from orchestrator.steps.timesync import time_report
    from orchestrator.steps.train import launch_phase
    from orchestrator.steps.validate import validation_phase
    from orchestrator.steps.validate_stamp import last_stamp

    try:
        report = PipelineReport()
        cluster = inventory.cluster
        brief = options.brief and options.dry_run is None and last_stamp(inventory) is not None
        everyone = list(inventory.nodes)  # validation and training span every node of the run

        def stop(why: str, code: ExitCode) -> PipelineReport:
            report.stopped = why
            report.exit_code = code
            front.say("error", why)
            return report

        single = len(inventory.nodes) < 2  # one machine: no peers to let in, no clocks to align
        as_root = [] if single or options.until == "sync" else _root_steps(inventory)
        if as_root:
            # the firewall and time steps run as root and never type a password: a node that cannot
            # become root stops the pipeline here, before anything (sync included) changed anywhere. The
            # same command reads what the steps after it read first (_first_reads), under their keys
            from orchestrator.steps.preflight.privilege import refused_root

            refused = refused_root(_first_round(session, inventory, selected, options), as_root)
            if refused:
                for line in refused:
                    front.say("error", line)
                report.skipped.update({name: "a node cannot become root" for name in PHASES})
                return stop(
                    f"not going on: the {' and '.join(as_root)} step(s) need root on every node (see above); "
                    "nothing was changed",
                    ExitCode.NODES_FAILED,
                )

        env, code_sync = cluster.env.declared, cluster.code_declared
        from_master = options.sync_from_master and not env  # cluster.env wins: it declares the environment
        if options.sync_from_master and env:
            front.say(
                "warn", "--sync-from-master ignored: cluster.env declares the environment (synced below)"
            )
        if env or code_sync or from_master:
            env = env or from_master
            only = None if env and code_sync else "env" if env else "code"
            synced: list[Any] = []

            def sync_phase(reach: Reach) -> Any:
                synced.append(_sync(reach, inventory, selected, only, from_master, options))
                return synced[-1]

            report.codes["sync"] = _phase("sync", front, session, selected, sync_phase, brief=brief)
            if report.codes["sync"] != ExitCode.OK:
                return stop(_sync_failed(synced[0] if synced else None, from_master), report.codes["sync"])
        else:
            report.skipped["sync"] = "the inventory declares no cluster.env or cluster.code"

        if until_done(options, "sync", report):
            return report
        # the firewall and time steps only warn when they fail: the preflight measures what they were for
        for name, setting, managed, step, failed in (
            (
                "firewall",
                "cluster.firewall.manage",
                cluster.firewall.manage,
                lambda reach: firewall_report(
                    reach, inventory, selected, remove=False, dry_run=options.dry_run is not None
                ),
                "the firewall step failed on some nodes (see above): the preflight's reachability "
                "check shows whether the nodes can still reach each other",
            ),
            (
                "ntp",
                "cluster.time.manage",
                cluster.time.manage,
                lambda reach: time_report(reach, inventory, selected, dry_run=options.dry_run is not None),
                "time sync failed on some nodes (see above): the preflight's clock check shows "
                "whether it matters for this run",
            ),
        ):
            if single or not managed:
                report.skipped[name] = "one node" if single else f"{setting} is false"
            else:
                report.codes[name] = _phase(name, front, session, selected, step, brief=brief)
                if report.codes[name] != ExitCode.OK:
                    front.say("warn", failed)
            if until_done(options, name, report):
                return report
        checked = report.codes["check"] = _phase(
            "check",
            front,
            session,
            selected,
            lambda reach: preflight_report(reach, inventory, selected, dry_run=options.dry_run),
            brief=brief,
        )
        report.exit_code = checked
        if until_done(options, "check", report):
            return report
        if checked == ExitCode.NODES_FAILED and options.force:
            front.say("warn", "--force: launching although a check failed")
        elif checked != ExitCode.OK:
            report.skipped.update(validate="a check failed", launch="a check failed")
            return stop("not launching: fix what failed above (or pass --force to launch anyway)", checked)

        if options.skip_validate:
            report.skipped["validate"] = "--skip-validate"
        else:
            if options.dry_run and not options.always_validate:  # the stamp is read by a real run only
                front.say(
                    "note",
                    "validate: a real run skips it when nothing it checks changed since it last passed "
                    "on these nodes (--validate runs it anyway); the dry run shows it as it would run",
                )
            validated = report.codes["validate"] = _phase(
                "validate",
                front,
                session,
                everyone,
                lambda reach: validation_phase(
                    reach, inventory, reuse=not options.always_validate, dry_run=options.dry_run
                ),
            )
            if validated != ExitCode.OK:
                report.skipped["launch"] = "validation failed"
                return stop(
                    "not launching: validation failed (see above; --skip-validate launches anyway)", validated
                )
            if until_done(options, "validate", report):
                return report
        report.exit_code = report.codes["launch"] = _phase(
            "launch",
            front,
            session,
            everyone,
            lambda reach: launch_phase(
                reach,
                inventory,
                run_id=None,
                templates_dir=None,
                detach=options.detach,
                dry_run=options.dry_run,
            ),
        )
        return report
    finally:  # the preflight's listeners that the first command started and no preflight adopted
        end_early_rounds(session)


def _phase(
    name: str,
    front: Front,
    session: Session,
    nodes: list[Node],
    work: Callable[[Reach], Any],
    *,
    brief: bool = False,
) -> ExitCode:
    """One phase: begun, its work on the pipeline's session narrowed to ``nodes``, its report shown
    (``brief``: as one line when it changed nothing and has nothing to say, orchestrator/settled.py)."""
    front.begin(name)
    report = work(front.reach(session, name))
    if brief and (line := settled_line(name, report)) is not None:
        front.say("info", line)
        return ExitCode.OK
    return front.show(name, report, nodes)


def _sync_failed(synced: Any, from_master: bool) -> str:
    """Why the pipeline stops after a failed sync, and what to do: a repeat of the sync only when that
    can help (not for a node that did not answer, nor one a run is running from)."""
    from orchestrator.steps.codesync import CodeInUseError

    errors = [o.error for o in [*getattr(synced, "env", []), *getattr(synced, "code", [])] if o.error]
    if errors and all(isinstance(e, ConnectError) for e in errors):
        return "not going on: sync could not reach every node (see above)"
    if any(isinstance(e, CodeInUseError) for e in errors):
        return "not going on: a run is running from the code directory (see above): stop it first, or wait"
    again = f"`bootstrap sync{' --from-master' if from_master else ''}` repeats just that step"
    return f"not going on: sync failed (see above); {again}"


def _sync(
    reach: Reach,
    inventory: Inventory,
    nodes: list[Node],
    only: str | None,
    from_master: bool,
    options: PipelineOptions,
) -> Any:
    from orchestrator.steps.sync import SyncOptions, sync_report

    chosen = SyncOptions(only=only, from_master=from_master, dry_run=options.dry_run is not None)
    return sync_report(reach, inventory, nodes, chosen)


def pipeline_inventory(
    inventory: Inventory,
    selection: Selection,
    master: str | None,
    *,
    dry_run: bool,
    syncs: bool = True,
    templates: Path | None = None,
) -> Inventory:
    """The inventory the main pipeline (and `launch`: ``syncs`` False) runs on (``--nodes``,
    ``--master``: :func:`run_nodes`), refused (a UsageError, exit 2) before anything connects or
    changes when it cannot train: native Windows beside Linux nodes (decided once, from the whole
    inventory), a training script that does not compile, env files missing (for a sync), and unless a
    dry run, train.env values from the environment or the templates (``templates``, else
    train.templates) missing."""
    from orchestrator.render import require_secrets, templates_dir_for
    from orchestrator.steps.preflight import checks
    from orchestrator.steps.script_check import check_env_files, check_script_compiles

    checks.refuse_native_mix(inventory)
    inventory = run_nodes(selection, inventory, master)
    check_script_compiles(inventory)
    if syncs:
        check_env_files(inventory)
    if not dry_run:
        require_secrets(inventory)
        templates_dir_for(inventory, templates)
    return inventory


def pipeline_doc(phase_docs: list[Any], report: PipelineReport) -> dict[str, Any]:
    """The main pipeline's ``--json`` document: each phase's own document (which says its "command")
    under its name, None for a phase that did not run; which phases ran, why it stopped, its exit code."""
    phases: dict[str, Any] = dict.fromkeys(PHASES)
    for doc in phase_docs:
        phases[doc.get("command", "check") if isinstance(doc, dict) else "check"] = doc
    return {"command": "bootstrap", **phases, **report.public_dict(), "exit_code": int(report.exit_code)}
