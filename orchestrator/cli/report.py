"""Renderings of a :class:`~orchestrator.steps.contract.Report`: the plans a dry run shows (the one
dry-run printer: runner steps and ``steps/dry_run.py``'s reports alike), the per-node ``--json``
entries, and a command's ``--json`` document."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.cli.ui import UI
from orchestrator.errors import BootstrapError, ExitCode
from orchestrator.executor import Outcome
from orchestrator.plans import Put
from orchestrator.steps.contract import Report
from orchestrator.steps.dry_run import Planned

#: what the dry run of launch, validate and bench adds: it connected to nothing
OFFLINE_NOTE = (
    "--dry-run: nothing was uploaded or started; secrets masked; interfaces as the inventory names "
    "them (a real run finds them on the nodes, as `bootstrap render` shows)"
)
#: said under a run whose text reaches an SSH node's /bin/sh through the login shell
ENCODED = " (reaches /bin/sh base64-encoded through the login shell)"


def show_plans(ui: UI, report: Report[Any]) -> None:
    """``--dry-run``: per node, in order, what the real run would upload and run (the very plans it
    applies), or that nothing would change there. Where the report knows how a node is reached
    (``steps.dry_run.Planned``), each run is shown as the exact text its shell receives."""
    for outcome in report.outcomes:
        plan = report.plans.get(outcome.node)
        if plan is None:
            continue
        name = outcome.node
        planned = outcome.value if isinstance(outcome.value, Planned) else None
        if planned is not None:
            name = f"{name} ({planned.via})"
        if not plan.actions:
            ui.print_text(f"# ---- {name}: nothing to change")
            continue
        sent = iter(planned.sent if planned is not None else [])
        for action in plan.actions:
            if isinstance(action, Put):
                body = action.content()
                ui.print_text(
                    f"# ---- {name}: would upload {action.target} ({action.what}, {len(body)} bytes)"
                )
                if planned is not None and action.target in planned.shown:
                    ui.print_text(planned.shown[action.target])
                continue
            who = (
                ("as an administrator" if action.host else "as root")
                if action.become
                else "as the login user"
            )
            where = " on the Windows host" if action.host else ""
            what = f" ({action.what})" if action.what else ""
            encoded = ENCODED if planned is not None and planned.via.startswith("ssh") else ""
            ui.print_text(f"# ---- {name}: would run{where} {who}{what}{encoded}:")
            ui.print_text(next(sent, action.script))
        ui.print_text("")


def show_dry_run(ui: UI, report: Report[Any], *, json_mode: bool, note: str = "") -> None:
    """A dry run's output: its ``--json`` document (``command``, ``dry_run``, the report's data, each
    node's entry) or the plans; ``note``: what the text adds about it (on stderr)."""
    if json_mode:
        head = {"command": report.step} if report.step else {}
        ui.print_json({**head, "dry_run": True, **report.data, "nodes": report_docs(report)})
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


def report_docs(report: Report[Any]) -> list[dict[str, Any]]:
    """Each node's ``--json`` entry: the common fields, its verdict, and its plan."""
    docs = node_docs(report.outcomes)
    for doc in docs:
        plan = report.plans.get(doc["name"])
        doc.setdefault("plan", plan.public_dict() if plan is not None else None)
    return docs


def json_doc(
    ui: UI,
    command: str,
    outcomes: list[Outcome[Any]],
    code: ExitCode,
    fields: Callable[[Outcome[Any]], dict[str, Any]] | None = None,
    *,
    ok: Callable[[Outcome[Any]], bool] | None = None,
    **top: Any,
) -> ExitCode:
    """Print a command's ``--json`` document: ``command``, the command's own values (``top``), each
    node's entry (:func:`node_docs`), ``exit_code``; returns ``code``."""
    ui.print_json(
        {"command": command, **top, "nodes": node_docs(outcomes, fields, ok=ok), "exit_code": int(code)}
    )
    return code
