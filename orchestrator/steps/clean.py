"""`bootstrap clean`: remove what bootstrap put on the nodes (environments, shipped code, run
directories), each found by bootstrap's own marker, never by a name alone: a file someone else put
in the workdir stays (docs/cli.md).

One node-side script (``probes/clean_node.py``) lists, measures and (``remove``) deletes; it refuses
on a node where a run of this workdir is still running. :class:`Clean` is the step that runs it: the
listing is its read, the removal its plan (orchestrator/runner.py).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.errors import CommandFailedError, ExitCode, UnsafeDirectoryError, UsageError
from orchestrator.executor import GroupResult, Outcome, exit_code_for
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.neutralise import one_line
from orchestrator.plans import NodePlan, Run
from orchestrator.platforms import platform_for_node
from orchestrator.runner import run_step
from orchestrator.runs.ids import is_run_id
from orchestrator.runs.layout import workdir_for
from orchestrator.steps.codesync.sync import code_dest
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.steps.envsync.spec import env_path
from orchestrator.view import Cell, Said, View, failures, human_bytes, red

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.platforms import Platform
    from orchestrator.session import Session
    from orchestrator.transports import Result


@dataclass
class CleanItem:
    kind: str  # env | code | runs
    path: str
    bytes: int
    files: int


@dataclass(frozen=True)
class RunChoice:
    """`clean --run/--older-than/--keep`: only run directories, those chosen (each given rule holds):
    ``ids`` (these runs), ``older_than`` (seconds since the run last wrote its log), ``keep`` (all but
    the newest N of the node's runs). The environment, the code and the caches stay."""

    ids: tuple[str, ...] = ()
    older_than: float | None = None
    keep: int | None = None

    @classmethod
    def chosen(cls, ids: Sequence[str], older_than: str | None, keep: int | None) -> RunChoice | None:
        """The runs `--run` (``latest``: the newest here), `--older-than AGE` and `--keep N` choose;
        None when none of them was given (a whole clean)."""
        from orchestrator.runs.ids import resolve_run

        if not ids and older_than is None and keep is None:
            return None
        age = None if older_than is None else parse_age(older_than)
        return cls(tuple(resolve_run(run_id) for run_id in ids), age, keep)

    def public_dict(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "older_than": self.older_than, "keep": self.keep}

    def options(self) -> list[str]:
        """The options that choose these runs, as typed (``--older-than`` in seconds)."""
        words = [word for run_id in self.ids for word in ("--run", run_id)]
        age = self.older_than
        words += ["--older-than", f"{int(age) if age.is_integer() else age}s"] if age is not None else []
        return words + (["--keep", str(self.keep)] if self.keep is not None else [])


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` in seconds; a UsageError for anything else."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise UsageError(f"--older-than {text!r}: write a number and a unit: 90s, 30m, 12h, 7d or 2w")
    return float(found.group(1)) * _UNIT[found.group(2)]


@dataclass
class NodeClean:
    """What bootstrap left on a node (``removed``: and it is gone now)."""

    node: str
    items: list[CleanItem] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    removed: bool = False
    errors: list[str] = field(default_factory=list)
    #: `clean --run/--older-than/--keep`: the runs chosen on this node (their directories)
    runs: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def status(self) -> str:
        if self.running:
            return "run running"
        return "removed" if self.removed else "found" if self.items else "nothing"

    def public_dict(self) -> dict[str, Any]:
        return {
            "items": [i.__dict__ for i in self.items],
            "bytes": self.bytes,
            "running": self.running,
            "removed": self.removed,
            "errors": self.errors,
            "runs": self.runs,
        }


def script() -> str:
    """The node-side script, with the record encoder it writes its answer with and ``unsafe_path``."""
    from orchestrator.steps.preflight.shared_fs import safe_path_source

    text = resources.files("orchestrator.steps.probes").joinpath("clean_node.py").read_text()
    return "import base64\n" + records.PYTHON_ENCODER + "\n" + safe_path_source() + text


@dataclass
class CleanContext:
    """The nodes where a run of this workdir is running: then nothing is removed on any node."""

    busy: list[str]


class Clean(Step[CleanContext, NodeClean]):
    """What bootstrap left on each node: the listing is the read (kept in the session, so the removal
    after the question reads nothing again), the removal the plan (``remove``), where there is
    something and no node runs a run. Native Windows nodes are refused (exit 2)."""

    name = "clean"

    def __init__(
        self, inventory: Inventory, *, remove: bool, outputs: bool, runs: RunChoice | None = None
    ) -> None:
        self.inventory, self.remove, self.outputs, self.runs = inventory, remove, outputs, runs
        self.nonce = records.new_nonce()

    def command(self, node: Node, platform: Platform, *, remove: bool) -> str:
        args = {
            "nonce": self.nonce,
            "node": node.name,
            "workdir": workdir_for(node),
            "env": env_path(node, path_setting=self.inventory.cluster.env.path),
            "code": code_dest(self.inventory.cluster, node),
            "remove": remove,
            "outputs": self.outputs,  # each run's $CB_RUN_DIR (checkpoints): kept unless asked
            "runs": None if self.runs is None else self.runs.public_dict(),  # only these run directories
        }
        return platform.join([interpreter_for(node), "-c", script(), json.dumps(args)])

    def answer(self, node: Node, output: str, code: int | None, result: Result) -> NodeClean:
        found = records.find(output, self.nonce, "clean")
        if code != 0 or found is None:
            # (the script says its own failures in its answer; without one, only the exit is known)
            said = "timed out" if result.timed_out else f"exit code {code}"
            raise CommandFailedError(
                f"the clean script gave no answer ({said})",
                node=node.name,
                hint=f"is {interpreter_for(node)} a working Python on the node? nothing was removed",
                result=result,
            )
        data = json.loads(found.text(0))
        if isinstance(data.get("refused"), str):  # a directory another user can change
            raise UnsafeDirectoryError(
                data["refused"], node=node.name, hint="nothing was removed on this node"
            )
        return NodeClean(
            node=node.name,
            items=[CleanItem(**item) for item in data.get("items") or []],
            # a run id from the node's processes (any of the node user's may carry a marker): one of
            # ours by its shape, or not repeated (it goes into a `stop --run` we suggest)
            running=[r for r in data.get("running") or [] if isinstance(r, str) and is_run_id(r)],
            removed=bool(data.get("removed")),
            errors=list(data.get("errors") or []),
            runs=[r for r in data.get("runs") or [] if isinstance(r, str) and is_run_id(r)],
        )

    def scope(self, selected: Sequence[Node]) -> list[Node]:
        return [n for n in selected if n.python_os != "windows"]

    def reads(self, node: Node) -> list[Read]:
        def parse(sections: Sections, result: Result) -> NodeClean:
            output, code = sections.get("clean", ("", 1))
            return self.answer(node, output, code, result)

        return [
            Read(
                f"clean.listing:outputs={self.outputs}:runs={self.runs}",
                lambda platform: [("clean", self.command(node, platform, remove=False))],
                parse=parse,
                what="listing what bootstrap left",
                timeout=600,
            )
        ]

    def context(self, found: ClusterFacts) -> CleanContext:
        listings = [v for values in found.values.values() for v in values.values()]
        return CleanContext([v.node for v in listings if isinstance(v, NodeClean) and v.running])

    def plan(self, node: Node, facts: Mapping[str, Any], context: CleanContext) -> NodePlan:
        if node.python_os == "windows":
            raise UsageError(
                "clean is not supported on native Windows nodes yet",
                node=node.name,
                hint="nothing was removed",
            )
        (listing,) = facts.values()
        if not self.remove or context.busy or not listing.items:
            return NodePlan(node.name, detail=listing)
        removal = Run(
            self.command(node, platform_for_node(node), remove=True),
            timeout=600,
            what="remove what bootstrap left",
        )
        return NodePlan(node.name, [removal], detail=listing)

    def judge(
        self, node: Node, plan: NodePlan, results: list[Result] | None, context: CleanContext
    ) -> NodeClean:
        if not results:  # a listing only
            listing: NodeClean = plan.detail
            return listing
        return self.answer(node, results[0].stdout, results[0].exit_code, results[0])


@dataclass
class CleanReport:
    """What `clean` found (``removed`` False) or removed on every node; ``declined``: what it found
    was not to be removed (the question answered no)."""

    outcomes: GroupResult[NodeClean]
    removed: bool
    declined: bool = False
    #: what this clean was asked to remove, as its options say it (a suggested command repeats them)
    options: tuple[str, ...] = ()

    @property
    def busy(self) -> list[Outcome[NodeClean]]:
        """Nodes where a run is running: nothing is removed on any node."""
        return [o for o in self.outcomes if o.value is not None and o.value.running]

    @property
    def bytes(self) -> int:
        return sum(o.value.bytes for o in self.outcomes if o.value is not None)

    def final(self) -> bool:
        """Nothing to remove, or removal refused: a node could not be read, one runs a run, or
        nothing of bootstrap's is there (no question to ask)."""
        failed = any(o.error is not None for o in self.outcomes)
        return bool(self.busy) or failed or not any(o.value and o.value.items for o in self.outcomes)

    def errors(self) -> list[str]:
        """What a node could not remove, one line each."""
        return [
            f"{o.node}: could not remove {one_line(e)}"
            for o in self.outcomes
            for e in (o.value.errors if o.value else [])
        ]

    def view(self, *, dry_run: bool) -> View:
        """The table: per node what is (or would be, or was) removed, where, how many files, how big."""
        title = "removed" if self.removed else "would remove" if dry_run else "to remove"
        view = View(title, ("node", "what", "path", "files", "size"), fold=True)
        for o in self.outcomes:
            if o.value is None or not o.value.items:
                view.add(o.node, red("failed") if o.value is None else Cell("nothing", "dim"), "-", "-", "-")
            for item in o.value.items if o.value else []:
                view.add(o.node, item.kind, item.path, str(item.files), human_bytes(item.bytes))
        return view

    def said(self, *, dry_run: bool) -> list[View | Said]:
        """What a human reads of the listing or the removal: the table, what failed, what a node could
        not remove, and the total."""
        said: list[View | Said] = [self.view(dry_run=dry_run), *failures(self.outcomes)]
        said += [Said("info", line) for line in self.chosen_lines(dry_run=dry_run)]
        said += [Said("error", error) for error in self.errors()]
        total = human_bytes(self.bytes)
        if self.removed:
            said.append(Said("info", f"clean: {total} removed from {len(self.outcomes)} node(s)"))
        elif dry_run and not self.busy:
            said.append(Said("info", f"clean --dry-run: {total} would be removed; nothing was changed"))
        return said

    def chosen_lines(self, *, dry_run: bool) -> list[str]:
        """`clean --run/--older-than/--keep`: the runs chosen, one line for the nodes choosing the
        same (their outputs stay unless --outputs)."""
        alike: dict[tuple[str, ...], list[str]] = {}
        for o in self.outcomes:
            if o.value is not None and o.value.items and o.value.runs:
                alike.setdefault(tuple(o.value.runs), []).append(o.node)
        verb = "removed" if self.removed else "would remove" if dry_run else "to remove"
        kept = (
            ""
            if "--outputs" in self.options
            else " (each run's out/ and node.log stay: --outputs removes them)"
        )
        return [
            f"{', '.join(nodes)}: {verb} run{'s' if len(runs) > 1 else ''} {', '.join(runs)}{kept}"
            for runs, nodes in alike.items()
        ]

    def refusals(self, *, dry_run: bool = False) -> list[str]:
        """Before a removal: per node running a run, that nothing was removed anywhere (a dry run:
        that nothing would be) and how to end it; the nodes that could not be read, that nothing was
        removed on the others either, and how to clean those alone."""
        if self.removed:
            return []
        nothing = "clean would remove nothing on any node" if dry_run else "nothing was removed on any node"
        alike: dict[tuple[str, ...], list[str]] = {}  # one line for the nodes running the same runs
        for o in self.busy:
            if o.value is not None:
                alike.setdefault(tuple(o.value.running), []).append(o.node)
        said = [
            f"{', '.join(nodes)}: run {', '.join(runs)} is running there: {nothing} "
            f"(`bootstrap stop --run {shlex.quote(runs[0])}` ends it)"
            for runs, nodes in alike.items()
        ]
        unread = [o.node for o in self.outcomes if o.error is not None]
        read = [o.node for o in self.outcomes if o.error is None]
        if unread and not dry_run and not self.busy:
            again = shlex.join(["bootstrap", "clean", "--nodes", ",".join(read), *self.options])
            others = f"; or clean the others alone: `{again}`" if read else ""
            said.append(
                f"{nothing}: {', '.join(unread)} could not be read (a run may be running there, and its "
                f"files are not listed); bring {'them' if len(unread) > 1 else 'it'} back{others}"
            )
        return said

    def exit_code(self) -> ExitCode:
        """1 also when a run blocked the removal, or a node kept something it should have lost."""
        code = exit_code_for(self.outcomes)
        kept = any(o.value is not None and (o.value.errors or o.value.running) for o in self.outcomes)
        return (
            ExitCode.NODES_FAILED if code == ExitCode.OK and (self.busy or (self.removed and kept)) else code
        )


def clean_all(
    session: Session, inventory: Inventory, *, remove: bool, outputs: bool, runs: RunChoice | None = None
) -> CleanReport:
    """:class:`Clean` on every node of ``session``: a listing, or (``remove``) the removal."""
    step = Clean(inventory, remove=remove, outputs=outputs, runs=runs)
    report = run_step(session, step, dry_run=not remove)
    options = (*(["--outputs"] if outputs else []), *(runs.options() if runs is not None else []))
    return CleanReport(report.outcomes, removed=remove, options=tuple(options))


def clean_nodes(
    session: Session,
    inventory: Inventory,
    *,
    outputs: bool,
    dry_run: bool,
    ask: Callable[[CleanReport], bool] | None,
    runs: RunChoice | None = None,
) -> CleanReport:
    """`clean`: the listing, and the removal where it may go on. The listing alone with ``dry_run``,
    or when it is final (a node could not be read, one runs a run, nothing of bootstrap's is there);
    else ``ask`` (None: --yes) is shown it and says whether to remove (no: the listing, declined).
    The removal reads nothing again (the listing is held in the session)."""
    found = clean_all(session, inventory, remove=False, outputs=outputs, runs=runs)
    if dry_run or found.final():
        return found
    if ask is not None and not ask(found):
        found.declined = True
        return found
    return clean_all(session, inventory, remove=True, outputs=outputs, runs=runs)
