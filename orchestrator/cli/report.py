"""Renderings of a :class:`~orchestrator.steps.contract.Report`: the plans a dry run shows (the one
dry-run printer: runner steps and ``steps/dry_run.py``'s reports alike), the per-node ``--json``
entries, and a command's ``--json`` document."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from orchestrator.cli.ui import UI
from orchestrator.errors import BootstrapError, ExitCode
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.neutralise import neutralise
from orchestrator.plans import plan_lines
from orchestrator.steps.contract import Report
from orchestrator.steps.dry_run import Planned
from orchestrator.view import Cell, Said, View, failures

#: what the dry run of launch, validate and bench adds: it connected to nothing
OFFLINE_NOTE = (
    "--dry-run: nothing was uploaded or started; secrets masked; interfaces as the inventory names "
    "them (a real run finds them on the nodes, as `bootstrap render` shows)"
)


def draw(ui: UI, view: View | None) -> None:
    """A :class:`~orchestrator.view.View` printed, on stdout (``view.stderr``: on stderr, below the
    lines a command streamed)."""
    if view is not None:
        (ui.err if view.stderr else ui.out).print(rich_table(view))


def rich_table(view: View) -> Table:
    """A view as every command's table: a left-aligned title, every cell's text neutralised before
    rich measures it, and never read as markup."""
    caption = Text(neutralise(view.caption)) if view.caption else None
    table = Table(title=Text(view.title), title_justify="left", caption=caption)
    right = set(view.right)
    for column in view.columns:
        options: dict[str, Any] = {"overflow": "fold"} if view.fold else {}
        options.update({"no_wrap": True} if view.no_wrap else {})
        options.update({"justify": "right"} if column in right else {})
        table.add_column(column, **{**options, **view.options.get(column, {})})
    for cells, style in view.rows:
        texts = (
            Text(neutralise(c.text), c.style) if isinstance(c, Cell) else Text(neutralise(c)) for c in cells
        )
        table.add_row(*texts, style=style or None)
    return table


def show_plans(ui: UI, report: Report[Any], above: Mapping[str, str] | None = None) -> None:
    """``--dry-run``: per node, in order, what the real run would upload and run (the very plans it
    applies), or that nothing would change there. Where the report knows how a node is reached
    (``steps.dry_run.Planned``), each run is shown as the exact text its shell receives. ``above``:
    a node's text shown before its plan (the time sync: the configuration diff its script writes)."""
    for outcome in report.outcomes:
        plan = report.plans.get(outcome.node)
        if plan is None:
            continue
        if above and above.get(outcome.node):
            ui.print_text(above[outcome.node].rstrip("\n"))
        doc, head, shown = plan.public_dict(), outcome.node, None
        if isinstance(outcome.value, Planned):
            head, shown = f"{outcome.node} ({outcome.value.via})", outcome.value.shown
            for action, sent in zip(
                [a for a in doc["actions"] if "run" in a], outcome.value.sent, strict=True
            ):
                action["sent"] = sent
        if not plan.actions:
            ui.print_text(f"# ---- {head}: nothing to change")
            continue
        for line in plan_lines(doc, head, shown):
            ui.print_text(line)
        ui.print_text("")


def show_dry_run(ui: UI, report: Report[Any], *, json_mode: bool, note: str = "") -> None:
    """A dry run's output: its ``--json`` document (``command``, ``dry_run``, the report's data, each
    node's entry) or the plans; ``note``: what the text adds about it (on stderr)."""
    if json_mode:
        head = {"command": report.step} if report.step else {}
        ui.print_json({**head, "dry_run": True, **report.data, "nodes": report_docs(report), "exit_code": 0})
        return
    show_plans(ui, report)
    if note:
        ui.note(note)


def error_dict(error: BootstrapError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"type": type(error).__name__, "message": error.message, "hint": error.hint}


def node_docs(
    outcomes: Iterable[Outcome[Any]],
    fields: Callable[[Outcome[Any]], dict[str, Any]] | None = None,
    *,
    ok: Callable[[Outcome[Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Each node's entry of a ``--json`` document, one shape for every command: ``name``, ``ok``,
    ``duration``, ``error``, then what the node's value says about itself (its ``public_dict()``),
    or ``fields(outcome)`` where a command shows something else."""
    docs = []
    for o in outcomes:
        doc: dict[str, Any] = {
            "name": o.node,
            "ok": o.ok if ok is None else ok(o),
            "duration": round(o.duration, 4),
            "error": error_dict(o.error),
        }
        if fields is not None:
            doc.update(fields(o))
        elif o.value is not None and hasattr(o.value, "public_dict"):
            doc.update(o.value.public_dict())
        docs.append(doc)
    return docs


def with_plan(report: Report[Any]) -> Callable[[Outcome[Any]], dict[str, Any]]:
    """The ``fields`` of a runner step's node entries: its verdict (``public_dict()``) and its plan."""

    def fields(o: Outcome[Any]) -> dict[str, Any]:
        doc = dict(o.value.public_dict()) if o.value is not None and hasattr(o.value, "public_dict") else {}
        plan = report.plans.get(o.node)
        doc.setdefault("plan", plan.public_dict() if plan is not None else None)
        return doc

    return fields


def report_docs(report: Report[Any]) -> list[dict[str, Any]]:
    """Each node's ``--json`` entry: the common fields, its verdict, and its plan."""
    return node_docs(report.outcomes, with_plan(report))


def json_doc(
    ui: UI,
    command: str,
    outcomes: list[Outcome[Any]],
    code: ExitCode,
    fields: Callable[[Outcome[Any]], dict[str, Any]] | None = None,
    ok: Callable[[Outcome[Any]], bool] | None = None,
    /,
    **top: Any,
) -> ExitCode:
    """Print a command's ``--json`` document: ``command``, the command's own values (``top``), each
    node's entry (:func:`node_docs`), ``exit_code``; returns ``code``. Every parameter but ``top`` is
    positional-only, so a command's own value named like one (validate's ``ok``) is a value, never an
    argument."""
    ui.print_json(
        {"command": command, **top, "nodes": node_docs(outcomes, fields, ok=ok), "exit_code": int(code)}
    )
    return code


def fail_lines(ui: UI, outcomes: Iterable[Outcome[Any]]) -> None:
    """One line per failed node (:func:`~orchestrator.view.failures`)."""
    tell(ui, failures(outcomes))


def fail_doc(ui: UI, command: str, outcomes: list[Outcome[Any]], json_mode: bool) -> ExitCode:
    """Nodes that could not be reached, a line each (with --json, the document all the same)."""
    fail_lines(ui, outcomes)
    code = exit_code_for(outcomes)
    return json_doc(ui, command, outcomes, code, run_id=None) if json_mode else code


def tell(ui: UI, shown: Iterable[View | Said | None]) -> None:
    """What a report shows, in its order: each table drawn, each line said as its ``how`` says."""
    for item in shown:
        if isinstance(item, View):
            draw(ui, item)
        elif item is not None and item.parts:
            line = Text.assemble(*(Text(neutralise(ui.commands(c.text)), c.style) for c in item.parts))
            ui.err.print(line, style=item.style or None)
        elif item is not None:
            {"out": ui.print_text, "note": ui.note, "warn": ui.warn, "error": ui.error}.get(
                item.how, ui.info
            )(f"hint: {item.text}" if item.how == "hint" else item.text)


def show_report(
    ui: UI,
    report: Report[Any],
    view: View | None,
    *,
    top: Mapping[str, Any] | None = None,
    ok: Callable[[Outcome[Any]], bool] | None = None,
    above: Mapping[str, str] | None = None,
    notes: Iterable[str] = (),
) -> ExitCode:
    """A runner step's report, the one way: its warnings; then its ``--json`` document (``command``,
    ``top``, ``dry_run``, the step's data, ``warnings``, each node's verdict and plan, ``exit_code``),
    or a dry run's plans (``above``: a node's text before its plan) and the table ``view``, each
    node's ``notes`` and ``notes``; last what failed (a node's error, a verdict's ``problem``). The
    exit code is the report's (``ok``: a node's ``ok`` in ``--json`` when it is not the outcome's)."""
    code = report.exit_code()
    for warning in report.warnings:
        ui.warn(warning)
    if ui.json_mode:
        _problems(ui, report)  # stderr: humans watching a --json run still see what failed
        doc = {**(top or {}), "dry_run": report.dry_run, **report.data, "warnings": report.warnings}
        return json_doc(ui, report.step, report.outcomes, code, with_plan(report), ok, **doc)
    if report.dry_run:
        show_plans(ui, report, above)
    draw(ui, view)
    for o in report.outcomes:
        for note in getattr(o.value, "notes", None) or []:
            ui.note(f"{o.node}: {note}")
    for note in notes:
        ui.note(note)
    _problems(ui, report)
    return code


def _problems(ui: UI, report: Report[Any]) -> None:
    fail_lines(ui, report.outcomes)
    for o in report.outcomes:
        if problem := getattr(o.value, "problem", None):
            ui.error(f"node {o.node!r}: {problem}")
