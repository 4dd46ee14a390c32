"""`bootstrap sync` as one step: what to sync, then the environment and the code on every node, as
one :class:`SyncReport` (the CLI renders it as tables or ``--json``; the pipeline runs it as its
first phase).

:func:`choose` decides from the inventory and the options alone (nothing contacted): whether the
environment is synced (cluster.env, or ``--from-master``), whether the code is (cluster.code, or
``--only code``), each skip said once. :func:`sync` then runs them on a session:
orchestrator/steps/envsync (the environment, ``--dry-run``: the plans it would apply) and
orchestrator/steps/codesync (the code). :func:`freeze` is ``--freeze FILE`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.errors import ExitCode, UsageError
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.plans import plan_lines
from orchestrator.redact import mask_url_credentials
from orchestrator.steps.envsync import (
    EnvInstallError,
    EnvSharedError,
    EnvSpec,
    NodeEnv,
    resolve_specs,
    summarize_outcomes,
    sync_env,
)
from orchestrator.steps.envsync import master as from_master_env
from orchestrator.steps.envsync.report import EnvReport
from orchestrator.view import Cell, Said, View, failures, node_view

if TYPE_CHECKING:
    from orchestrator.executor import NodeEvent
    from orchestrator.inventory import Inventory, Node
    from orchestrator.runner import Reach
    from orchestrator.session import Session
    from orchestrator.steps.envsync.master import MasterEnv, Reference


class Board(Protocol):
    """A per-node progress display: the executor's events, and what each node is doing now."""

    def on_event(self, event: NodeEvent) -> None: ...

    def update(self, node: str, activity: str, detail: str = "") -> None: ...


@dataclass
class Display:
    """How the step shows what it does while it runs (the CLI's terminal; nothing by default)."""

    note: Callable[[str], None] = lambda text: None
    warn: Callable[[str], None] = lambda text: None
    #: the installer's lines, as a build prints them (``-v``)
    on_line: Callable[[str, str], None] | None = None
    #: a progress board for one phase (``"env"``, ``"code"``) over these nodes
    board: Callable[[list[str], str], AbstractContextManager[Board]] | None = None


@dataclass(frozen=True)
class SyncOptions:
    only: str | None = None  # "env" | "code" | None: both
    force: bool = False
    from_master: bool = False
    freeze: Path | None = None  # with from_master: the master's set written there too
    dry_run: bool = False


@dataclass
class Choice:
    """What a sync does, decided from the inventory and the options (nothing contacted)."""

    env: bool
    code: bool
    from_master: bool
    specs: dict[str, EnvSpec] | None = None  # cluster.env's, per OS (None: from the master, or none)

    @property
    def anything(self) -> bool:
        return self.env or self.code


def choose(inventory: Inventory, nodes: list[Node], options: SyncOptions, display: Display) -> Choice:
    """What to sync. Raises UsageError (exit 2) for a refused combination, an unusable env section or
    code source: before any node is contacted. Each skipped half is said once (``display.note``)."""
    declared = inventory.cluster.env.declared
    from_master = options.from_master and not declared
    env = options.only in (None, "env")
    code = options.only in (None, "code")
    if env and not declared and not from_master:
        if options.only == "env":
            raise UsageError(
                "cluster.env declares no requirements or packages: nothing to sync "
                "(`bootstrap sync --from-master` installs the master's torch on every node; docs/sync.md)"
            )
        recorded = from_master_env.recorded_nodes(inventory)
        if recorded:
            display.note(
                f"no cluster.env: environment sync skipped ({', '.join(recorded)} train in the master's "
                "environment from `bootstrap sync --from-master`: run that again to refresh it)"
            )
        else:
            display.note(
                "no cluster.env in the inventory: environment sync skipped "
                "(`bootstrap sync --from-master` installs the master's torch on every node)"
            )
        env = False
    if options.only is None and not inventory.cluster.code_declared:
        # as the pipeline does: the default source is the current directory, which may be a home;
        # pushing it takes a cluster.code section, or asking for it by name
        display.note(
            "no cluster.code in the inventory: code sync skipped (`bootstrap sync --only code` pushes "
            "the current directory to <workdir>/code on every node; docs/sync.md)"
        )
        code = False
    if code:
        from orchestrator.steps.codesync import code_source

        source = code_source(inventory.cluster)
        try:
            is_dir = source.is_dir()
        except (OSError, ValueError):  # a name too long for this file system
            is_dir = False
        if not is_dir:  # before any node is contacted (and before the environment work)
            raise UsageError(
                f"code.source {source} is not a directory",
                hint="set cluster.code.source to your project directory (relative to the current one)",
            )
        from orchestrator.steps.script_check import not_the_project

        if (wrong := not_the_project(inventory, source)) is not None:
            # refused, not warned: a sync from another directory (/tmp, the home) listed and hashed
            # all of it, then replaced the nodes' code with it (and deleted the project's files there)
            raise UsageError(wrong, hint="nothing was synced")
    specs = None
    if env and not from_master:
        specs = resolve_specs(inventory, nodes)  # a bad env section stops here, exit 2
        for spec in specs.values():
            for warning in spec.warnings:
                display.warn(warning)
    return Choice(env=env, code=code, from_master=from_master, specs=specs)


@dataclass
class SyncReport:
    """What a sync did (or, ``dry_run``, would do), per node; the tables and ``--json`` render it."""

    choice: Choice
    dry_run: bool
    env: list[Outcome[NodeEnv]] = field(default_factory=list)
    code: list[Outcome[Any]] = field(default_factory=list)
    #: said after the environment's table: the master's environment was recorded, or nothing to sync
    master_note: str | None = None

    @property
    def summary(self) -> EnvReport:
        """The distinct environments among the nodes that synced."""
        return summarize_outcomes(self.env)

    @property
    def exit_code(self) -> ExitCode:
        """A failed node (3 before 1), else 1 when the environments differ, else 0."""
        code = exit_code_for([*self.env, *self.code])
        if code == ExitCode.OK and self.summary.mismatch:
            return ExitCode.NODES_FAILED
        return code

    @property
    def shows_env(self) -> bool:
        """Whether the environment's table has anything to say."""
        return self.choice.env and (bool(self.env) or not self.choice.from_master)

    def public_dict(self) -> dict[str, Any]:
        summary = self.summary
        env = None
        if self.choice.env:
            env = {
                "nodes": [
                    _node_doc(o, {"kept_previous": getattr(o.error, "kept", None), **_value_doc(o)})
                    for o in self.env
                ],
                "environments": [
                    {"nodes": g.nodes, "os": g.os, "python": g.python, "packages": g.packages}
                    for g in summary.groups
                ],
                "identical": not summary.mismatch,
                "differing": summary.differing,
            }
        return {
            "command": "sync",
            "dry_run": self.dry_run,
            "from_master": self.choice.from_master,  # the environment is the master's (no cluster.env)
            "env": env,
            "code": {"nodes": [_node_doc(o, _value_doc(o)) for o in self.code]} if self.choice.code else None,
            "exit_code": int(self.exit_code),
        }

    # -- the tables, and what they say besides their rows -------------------------------------------

    def env_views(self) -> list[View]:
        """Each node's environment (what was done, by which installer, its Python and build, what
        changed, the time), then one line per distinct environment among them (red when they differ)."""
        columns = ("node", "result", "installer", "python", "env", "changes", "time")
        views = [node_view("environment", columns, self.env, NodeEnv.row, timed=True, fold=True)]
        summary = self.summary
        if summary.groups:
            title = f"{len(summary.groups)} distinct environment{'s' if len(summary.groups) > 1 else ''}"
            groups = View(title, ("", "nodes", "versions"), fold=True)
            for index, group in enumerate(summary.groups):
                label = Cell(
                    chr(ord("A") + index) if index < 26 else str(index),
                    "red" if summary.mismatch else "green",
                )
                groups.add(label, ", ".join(group.nodes), group.describe())
            views.append(groups)
        return views

    def code_view(self) -> View:
        """Each node's code: what moved (or nothing), the time."""
        row = lambda v: [Cell(v.summary(), "green" if v.unchanged else "cyan")]  # noqa: E731
        return node_view("code", ("node", "result", "time"), self.code, row, timed=True, fold=True)

    def installer_lines(self) -> list[tuple[str, str]]:
        """(node, line): the installer's last lines on each node whose install failed."""
        return [
            (o.node, line) for o in self.env if isinstance(o.error, EnvInstallError) for line in o.error.lines
        ]

    def shared_env_headline(self) -> str | None:
        """When nodes were refused because they share a directory: that is the cause, said once."""
        by_dir: dict[str, set[str]] = {}
        for o in self.env:
            if isinstance(o.error, EnvSharedError):
                by_dir.setdefault(o.error.directory, set()).update([o.node, *o.error.shared_with])
        if not by_dir:
            return None
        groups = [f"{', '.join(sorted(names))} share {where}" for where, names in sorted(by_dir.items())]
        return (
            "; ".join(groups)
            + " (one filesystem: nothing was installed; not a pip or index problem): give each node its "
            "own directory with {node} in workdir (docs/quickstart.md)"
        )

    def env_headline(self) -> str:
        """The environment's one-line outcome: nodes synced (unchanged), identical or not, failures."""
        summary = self.summary
        unchanged = sum(1 for o in self.env if o.value is not None and o.value.action == "unchanged")
        done = sum(1 for o in self.env if o.value is not None)
        failed = len(self.env) - done
        parts = []
        if summary.mismatch:
            parts.append("environments DIFFER")
        elif done > 1:
            parts.append("identical")
        elif done == 1 and not failed:
            parts.append("ok")
        if failed:
            parts.append(f"{failed} failed")
        shared = self.shared_env_headline()
        if shared:
            parts.append(shared)
        counted = f" ({unchanged} unchanged)" if done else ""
        return f"environment: {done}/{len(self.env)} nodes synced{counted}, {', '.join(parts)}"

    def launch_python(self) -> str | None:
        """The interpreter launch runs: one path, or each node's (``{node}`` in workdir)."""
        envs = [o.value for o in self.env if o.value is not None]
        return where(envs) if envs else None

    def shown(self) -> list[View | Said]:
        """What a human reads of the sync, in order: the master's note; the environment's tables
        (a dry run: each node's build plan), its failures, the installer's last lines, a mismatch,
        its headline and the interpreter launch runs; then the code's table (a dry run: its plans),
        the directories nodes share and what failed there."""
        said: list[View | Said] = [Said("note", self.master_note)] if self.master_note else []
        if self.shows_env and self.dry_run:
            for env in (o.value for o in self.env if o.value is not None):
                said += [Said("out", line) for line in env.plan_lines()] + [Said("out", "")]
            said += failures(self.env)
        elif self.shows_env:
            said += [*self.env_views(), *failures(self.env)]
            # the installer's last lines (they may repeat an index URL)
            said += [
                Said("info", f"  {node} | {mask_url_credentials(line)}")
                for node, line in self.installer_lines()
            ]
            if self.summary.mismatch:
                said.append(
                    Said(
                        "error",
                        "the nodes' environments differ (torch and Python must be identical on every rank):",
                    )
                )
                said += [Said("info", f"  {line}") for line in self.summary.describe_mismatch()]
            said.append(Said("info", self.env_headline()))
            if python := self.launch_python():
                said.append(
                    Said(
                        "note",
                        f"launch with {python} (the stable path; each build is switched in atomically)",
                    )
                )
        if not self.choice.code:
            return said
        said.append(self.code_view())
        planned = [o for o in self.code if self.dry_run and o.value is not None and o.value.plan is not None]
        for o in planned:
            assert o.value is not None and o.value.plan is not None
            said += [Said("out", f"# {o.node}: code at {o.value.dest}")]
            said += [Said("out", line) for line in plan_lines(o.value.plan, o.node)]
        for o in planned:  # what would move, after the plans (each one long): a file a line
            assert o.value is not None
            said += [Said("out", f"# {o.node}: {line}") for line in o.value.file_lines()]
        kept = [
            Said("warn", f"node {o.node!r}: {o.value.kept_warning()}")
            for o in self.code
            if o.value and o.value.kept
        ]
        shared = [Said("note", line) for line in self.shared_code_lines()]
        return [*said, *shared, *kept, *failures(self.code)]

    def shared_code_lines(self) -> list[str]:
        """One line per code directory several nodes share: which nodes, and the one that wrote it."""
        lines = []
        for o in self.code:
            value = o.value
            if value is None or value.synced_by is not None or not value.shared_with:
                continue
            nodes = ", ".join([o.node, *value.shared_with])
            lines.append(
                f"{value.dest} is one directory on {nodes} (a shared file system): synced once, from {o.node}"
            )
        return lines


def _value_doc(outcome: Outcome[Any]) -> dict[str, Any]:
    value = outcome.value
    return value.public_dict() if value is not None and hasattr(value, "public_dict") else {}


def _node_doc(outcome: Outcome[Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A node's entry, in the shape every command's ``--json`` has (cli/common.py node_docs)."""
    error = outcome.error
    return {
        "name": outcome.node,
        "ok": outcome.ok,
        "duration": round(outcome.duration, 4),
        "error": None
        if error is None
        else {"type": type(error).__name__, "message": error.message, "hint": error.hint},
        **fields,
    }


def where(envs: list[NodeEnv]) -> str:
    """The interpreter launch runs: one path, or each node's (``{node}`` in workdir)."""
    paths = {e.python_path for e in envs}
    if len(paths) == 1:
        return paths.pop()
    shown = "; ".join(f"{e.node}: {e.python_path}" for e in envs[:3])
    return f"each node's own venv ({shown}{'; ...' if len(envs) > 3 else ''})"


@contextmanager
def _phase(session: Session, display: Display, nodes: list[Node], step: str) -> Iterator[Board | None]:
    """The progress board of one phase, fed by the session's executor while it is open."""
    if display.board is None:
        yield None
        return
    with display.board([n.name for n in nodes], step) as board:
        session.executor.on_event = board.on_event
        try:
            yield board
        finally:
            session.executor.on_event = None


def sync_report(reach: Reach, inventory: Inventory, nodes: list[Node], options: SyncOptions) -> SyncReport:
    """The sync phase (``bootstrap sync`` and the main pipeline's first phase): what to sync
    (:func:`choose`), then :func:`sync` on a session of ``reach`` when there is anything (else no
    node is contacted); shown meanwhile through ``reach``."""
    lines = None if reach.lines is None else reach.lines([n.name for n in nodes]).write
    display = Display(
        note=lambda text: reach.say("note", text),
        warn=lambda text: reach.say("warn", text),
        on_line=lines,
        board=reach.board,
    )
    choice = choose(inventory, nodes, options, display)
    if not choice.anything:
        return SyncReport(choice, options.dry_run)
    with reach.connect(nodes) as on:
        return sync(on, inventory, nodes, choice, options, display)


def sync(
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    choice: Choice,
    options: SyncOptions,
    display: Display | None = None,
) -> SyncReport:
    """Run ``choice`` on ``nodes`` (the environment first, then the code): the report. Per-node
    failures are in it; a master without torch (``--from-master``) raises."""
    display = display or Display()
    report = SyncReport(choice, options.dry_run)
    if choice.env and choice.from_master:
        report.env, report.master_note = _from_master(session, inventory, nodes, options, display)
    elif choice.env:
        report.env = _env(session, inventory, nodes, options, display, choice.specs)
    if choice.code:
        from orchestrator.steps.codesync import sync_code

        with _phase(session, display, nodes, "code") as board:
            report.code = sync_code(
                session,
                inventory,
                nodes,
                dry_run=options.dry_run,
                on_progress=None if board is None else board.update,
            )
    return report


def _env(
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    options: SyncOptions,
    display: Display,
    specs: dict[str, EnvSpec] | None,
) -> list[Outcome[NodeEnv]]:
    with _phase(session, display, nodes, "env") as board:
        return sync_env(
            session,
            inventory,
            nodes,
            dry_run=options.dry_run,
            force=options.force,
            on_line=display.on_line,
            on_progress=None if board is None else board.update,
            specs=specs,
            on_notice=display.note,
        )


def read_reference(session: Session, inventory: Inventory) -> Reference:
    """Whose environment ``--from-master`` copies (the master's, read there; master.py)."""
    master = inventory.master_node
    found = session.map(
        lambda node, t: from_master_env.read_reference(inventory, t), step="master", nodes=[master]
    )[0]
    if found.error is not None:
        raise found.error
    assert found.value is not None
    return found.value


def _torch_line(env: MasterEnv) -> str:
    return f"torch {env.torch} and {len(env.packages) - 1} companions from {env.where}"


def _from_master(
    session: Session, inventory: Inventory, nodes: list[Node], options: SyncOptions, display: Display
) -> tuple[list[Outcome[NodeEnv]], str | None]:
    """The master's environment on ``nodes`` (the master itself left out when its own interpreter is
    the reference), then the record check, validate and launch read (master.py)."""
    reference = read_reference(session, inventory)
    env = reference.env
    master = inventory.master_node.name
    targets = [n for n in nodes if not (reference.master_is_reference and n.name == master)]
    if options.freeze is not None and not options.dry_run:
        for path in from_master_env.write_freeze(options.freeze, inventory, nodes, env):
            display.note(f"wrote {path}: {_torch_line(env)}")
    if not targets:
        return [], f"nothing to sync: {master} is the master, whose Python is the reference"
    specs = {
        os_name: from_master_env.spec_from_master(inventory, env, os_name)
        for os_name in sorted({n.python_os for n in targets})
    }
    display.note(f"the master's environment: {_torch_line(env)}")
    outcomes = _env(session, inventory, targets, options, display, specs)
    synced = {
        o.node: {"env_id": o.value.env_id, "torch": o.value.packages.get("torch"), "source": env.where}
        for o in outcomes
        if o.value is not None
    }
    if options.dry_run or not synced:
        return outcomes, None
    record = from_master_env.remember(inventory, synced)
    envs = [o.value for o in outcomes if o.value is not None]
    return outcomes, (
        f"training on {', '.join(synced)} now uses {where(envs)} (recorded in {record}); to make it "
        "part of the inventory: bootstrap sync --freeze requirements.txt, then "
        "cluster.env.requirements: requirements.txt"
    )


@dataclass
class FreezeReport:
    """``--freeze FILE`` alone: the master's set, and the file(s) written (or, dry run, their text)."""

    env: MasterEnv
    texts: dict[Path, str]
    written: list[Path]

    @property
    def torch_line(self) -> str:
        return _torch_line(self.env)

    def said(self, base: Path) -> list[Said]:
        """What a human reads: a dry run's text of each file, else each file written and how to
        declare it (its path as the inventory in ``base`` names it)."""
        if not self.written:  # a dry run: what would be written, written nowhere
            return [
                Said("out", line)
                for t, text in self.texts.items()
                for line in (f"# would write {t}:", text.rstrip("\n"))
            ]
        said = []
        for written in self.written:
            shown = written.resolve()
            shown = shown.relative_to(base) if shown.is_relative_to(base) else shown
            declare = f"cluster: {{env: {{requirements: {shown}}}}}"
            said.append(Said("info", f"wrote {written}: {self.torch_line}"))
            said.append(Said("note", f"declare it in the inventory: {declare} (then bootstrap sync)"))
        return said

    def public_dict(self) -> dict[str, Any]:
        return {
            "command": "sync",
            "freeze": {
                "files": [str(f) for f in self.written],
                "master": self.env.where,
                "torch": self.env.torch,
                "packages": self.env.packages,
            },
            "exit_code": 0,
        }


def freeze(
    session: Session, inventory: Inventory, nodes: list[Node], path: Path, *, dry_run: bool
) -> FreezeReport:
    """Read the master's environment and write it to ``path`` (per OS among ``nodes``); a dry run
    writes nothing and keeps the texts."""
    env = read_reference(session, inventory).env
    texts = from_master_env.freeze_texts(path, inventory, nodes, env)
    written = [] if dry_run else from_master_env.write_freeze(path, inventory, nodes, env)
    return FreezeReport(env, texts, written)
