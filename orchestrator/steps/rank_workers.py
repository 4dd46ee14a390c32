"""Our own rank workers (validate's all_reduce check, bench's throughput probe): one process per rank
on every node of a launch plan, each printing framed records of ``record`` under ``nonce`` among its
other lines. One loop for both: the records go to ``feed``, everything else to ``on_line``, and a
watchdog closes the session when a rank hangs inside a collective."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConnectError
from orchestrator.render import LaunchSpec, Renderer
from orchestrator.runs.ranks import worker_record
from orchestrator.steps.launch import RANKS_TEMPLATE, run_node

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.session import Session
    from orchestrator.steps.launch import NodeRunResult


def run_rank_workers(
    session: Session,
    specs: dict[str, LaunchSpec],
    worker: Path,
    *,
    nonce: str,
    record: str,
    feed: Callable[[dict[str, Any], str, int | None], None],
    on_line: Callable[[str, int | None, str], None] | None,
    give_up_after: float,
    on_give_up: Callable[[], None],
    renderer: Renderer,
    step: str,
) -> list[Outcome[NodeRunResult]]:
    """Run ``worker`` on every rank of ``specs`` (by node name); each ``record`` record goes to
    ``feed(record, node, rank)`` (one at a time), every other line to ``on_line(node, rank, text)``.
    After ``give_up_after`` seconds ``on_give_up()`` is called and the session closed (every node's
    command ends). No fail fast: a rank that cannot join is named by rank 0 when its wait ends, and
    stopping everyone at the first exit would lose that."""
    lock = threading.Lock()

    def line(node: str, text: str) -> None:
        local, found, rest = worker_record(text, nonce, record)  # native Windows: tagged twice
        rank = None if local is None else specs[node].first_rank + local
        if found is not None:
            with lock:
                feed(found, node, rank)
            return
        if on_line is not None:
            on_line(node, rank, rest)

    def give_up() -> None:
        on_give_up()
        session.close()

    watchdog = threading.Timer(give_up_after, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        return session.map(
            lambda node, t: run_node(
                node,
                t,
                specs[node.name],
                renderer=renderer,
                on_line=line,
                template=None if t.platform.as_powershell() is not None else RANKS_TEMPLATE,
                script_file=worker,
            ),
            step=step,
            fail_fast=False,
            # a node lost: its ranks will never join, and the others would wait --timeout for them
            stop_on=lambda outcome: isinstance(outcome.error, ConnectError),
        )
    finally:
        watchdog.cancel()
