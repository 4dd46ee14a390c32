"""Renderings of a step's :class:`~orchestrator.steps.contract.Report`: the plans a dry run shows, the
per-node ``--json`` entries. One shape for every step that runs on the runner (orchestrator/runner.py)."""

from __future__ import annotations

from typing import Any

from orchestrator.cli.common import node_docs
from orchestrator.cli.ui import UI
from orchestrator.plans import Put
from orchestrator.steps.contract import Report


def show_plans(ui: UI, report: Report[Any]) -> None:
    """``--dry-run``: per node, in order, what the real run would upload and run (the very plans it
    applies), or that nothing would change there."""
    for name, plan in report.plans.items():
        if not plan.actions:
            ui.print_text(f"# ---- {name}: nothing to change")
            continue
        for action in plan.actions:
            if isinstance(action, Put):
                body = action.content()
                ui.print_text(
                    f"# ---- {name}: would upload {action.target} ({action.what}, {len(body)} bytes)"
                )
                continue
            who = (
                ("as an administrator" if action.host else "as root")
                if action.become
                else "as the login user"
            )
            where = " on the Windows host" if action.host else ""
            what = f" ({action.what})" if action.what else ""
            ui.print_text(f"# ---- {name}: would run{where} {who}{what}:")
            ui.print_text(action.script)
        ui.print_text("")


def report_docs(report: Report[Any]) -> list[dict[str, Any]]:
    """Each node's ``--json`` entry: the common fields, its verdict, and its plan."""
    docs = node_docs(report.outcomes)
    for doc in docs:
        plan = report.plans.get(doc["name"])
        doc["plan"] = plan.public_dict() if plan is not None else None
    return docs
