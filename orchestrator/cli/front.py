"""The CLI as the front end of the work it starts: a :class:`~orchestrator.runner.Reach` (sessions,
progress, lines and notes on this terminal). The main pipeline's front end is cli/pipeline.py
``CliFront``."""

from __future__ import annotations

from typing import Any

from orchestrator.cli.common import Settings, phase_session
from orchestrator.inventory import Inventory
from orchestrator.runner import Reach
from orchestrator.session import Session


def say(settings: Settings) -> Any:
    """``say(level, text)`` on this terminal."""
    ui = settings.ui
    return lambda level, text: {"error": ui.error, "warn": ui.warn, "info": ui.info}.get(level, ui.note)(text)


def reach_for(
    settings: Settings,
    inventory: Inventory,
    session: Session | None = None,
    *,
    lines: str | None = None,
    live: Any = None,
) -> Reach:
    """How a command's work reaches its nodes (the pipeline's ``session`` narrowed, or a session of
    its own) and shows itself here. ``lines``: where node lines go as they come: "ranks" (stdout; not
    with --json), "verbose" (stdout, with -v), "verbose-err" (stderr, with -v); None: only logged."""
    from orchestrator.logs import ranked_outputs

    ui = settings.ui
    shown = lines == "ranks" or (lines is not None and settings.verbose > 0)
    stream = ui.err.file if lines == "verbose-err" else None
    printer = (
        (lambda names: ui.line_printer(names, stream=stream)) if shown and not settings.json_mode else None
    )
    return Reach(
        lambda chosen: phase_session(settings, inventory, chosen, session),
        ui.progress,
        say=say(settings),
        lines=printer,
        board=ui.board,
        outputs=lambda labels, log, page, samples: ranked_outputs(
            labels, log, None if printer is None else printer(list(labels)), page, samples
        ),
        live=live,
    )
