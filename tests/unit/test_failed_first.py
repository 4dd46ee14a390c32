"""The launch summary blames the node that failed first, not the first failed one in the inventory."""

from __future__ import annotations

from orchestrator.errors import CancelledError, CommandFailedError
from orchestrator.executor import Outcome
from orchestrator.steps.train import failed_first


def test_the_earliest_failure_leads_whatever_the_inventory_order() -> None:
    outcomes: list[Outcome[int]] = [
        # node1 lost its peer moments after node3 crashed: a failure too, but not the cause
        Outcome("node1", None, CommandFailedError("training exited with code 1", node="node1"), 9.0, 100.2),
        Outcome("node2", None, CancelledError("stopped", node="node2"), 9.5, 100.6),
        Outcome("node3", None, CommandFailedError("training exited with code 3", node="node3"), 8.9, 100.1),
        Outcome("node4", 0, None, 9.0, 100.0),
    ]
    failed, stopped = failed_first(outcomes)
    assert [o.node for o in failed] == ["node3", "node1"]
    assert [o.node for o in stopped] == ["node2"]


def test_nothing_failed() -> None:
    assert failed_first([Outcome("a", 0, None, 1.0, 1.0)]) == ([], [])
