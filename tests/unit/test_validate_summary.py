"""`failure_summary`: the lines a user reads when `bootstrap validate` fails, one per failure kind.

Reports are fed the ``validate <json>`` records the shipped worker prints (see probes/validate_worker.py)
and the per-node outcomes are what ``run_node`` gives the executor: CommandFailedError when a node's
workers exit non-zero, CancelledError when the controller closed the connection, a ConnectError when
the node was never reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import BootstrapError, CancelledError, CommandFailedError, UnreachableError
from orchestrator.executor import Outcome
from orchestrator.steps.launch import LaunchPlan, NodeRunResult
from orchestrator.steps.validate import ValidateReport, Validation, failure_summary
from orchestrator.transports.base import Result


def _honest(report: ValidateReport, record: dict[str, Any]) -> None:
    """``record`` as the node that runs its rank sends it, on a line tagged with that rank."""
    rank = record.get("rank")
    rank = rank if isinstance(rank, int) else None
    report.feed(record, report.ranks.get(rank, "node1") if rank is not None else "node1", rank)


# node1 holds ranks 0 (the master) and 1, node2 rank 2, node3 rank 3
RANKS = {0: "node1", 1: "node1", 2: "node2", 3: "node3"}
NODES = ("node1", "node2", "node3")
MASTER = "192.168.1.10:29500"


def _report(*records: dict[str, Any]) -> ValidateReport:
    report = ValidateReport(world_size=len(RANKS), ranks=dict(RANKS))
    for record in records:
        _honest(report, record)
    return report


def _started(*ranks: int) -> list[dict[str, Any]]:
    return [{"kind": "start", "rank": r, "host": RANKS[r], "pid": 100 + r, "torch": "2.13.0"} for r in ranks]


def _joined(*ranks: int) -> list[dict[str, Any]]:
    return [{"kind": "joined", "rank": r, "seconds": 0.25} for r in ranks]


def _correct(ok: bool, *ranks: int) -> list[dict[str, Any]]:
    got = 10.0 if ok else 9.0
    return [{"kind": "correct", "rank": r, "ok": ok, "expected": 10.0, "got": got} for r in ranks]


def _exited(node: str, code: int, result: Result | None = None) -> CommandFailedError:
    """What run_node raises when a node's workers exit non-zero."""
    return CommandFailedError(
        f"training exited with code {code}",
        node=node,
        hint=f"the node keeps its log in ~/cluster-bootstrap/runs/validate-x/{node}/node.log",
        result=result,
    )


def _validation(report: ValidateReport, errors: Mapping[str, BootstrapError] | None = None) -> Validation:
    errors = errors or {}
    outcomes: list[Outcome[NodeRunResult]] = []
    for node in NODES:
        error = errors.get(node)
        value = (
            None if error else NodeRunResult(0, 1.5, [], f"/home/u/cluster-bootstrap/runs/v/{node}/node.log")
        )
        outcomes.append(Outcome(node=node, value=value, error=error, duration=1.5))
    plan = LaunchPlan(specs=[], backend="gloo", backend_reason="CPU only", inspected=[], warnings=[])
    return Validation(plan, outcomes, report)


def test_passed_validation_has_nothing_to_say() -> None:
    report = _report(
        *_started(0, 1, 2, 3),
        *_joined(0, 1, 2, 3),
        *_correct(True, 0, 1, 2, 3),
        {
            "kind": "result",
            "rank": 0,
            "bytes": 4096,
            "iters": 200,
            "latency_s": 2e-4,
            "algbw": 2e7,
            "busbw": 3e7,
        },
    )
    assert report.ok
    assert failure_summary(_validation(report)) == []


def test_a_rank_that_cannot_reach_the_master_is_named_with_the_error() -> None:
    # node3's TCPStore connection is refused (firewall); rank 0 then names rank 3 as missing, and
    # every worker exits non-zero: those exits are consequences, not news for the user.
    refused = "The client socket has failed to connect to any network address of (192.168.1.10, 29500)"
    report = _report(
        *_started(0, 1, 2, 3),
        {"kind": "unreachable", "rank": 3, "master": MASTER, "error": refused},
        {"kind": "missing", "rank": 0, "ranks": [3], "timeout": 60.0},
    )
    validation = _validation(
        report, {"node1": _exited("node1", 3), "node2": _exited("node2", 3), "node3": _exited("node3", 2)}
    )
    assert failure_summary(validation) == [
        f"rank 3 on node3 cannot reach the master: {MASTER}: {refused}",
        "ranks never joined: node3 (rank 3) (3 of 4 joined)",
    ]


def test_ranks_that_never_joined_are_named_by_node_not_a_traceback() -> None:
    # node2's worker started, then crashed before registering with the master: rank 0 names rank 2
    # after --timeout; every node's non-zero exit is a consequence and is not repeated
    report = _report(*_started(0, 1, 2, 3), {"kind": "missing", "rank": 0, "ranks": [2], "timeout": 60.0})
    validation = _validation(
        report, {"node1": _exited("node1", 3), "node2": _exited("node2", 1), "node3": _exited("node3", 3)}
    )
    assert failure_summary(validation) == ["ranks never joined: node2 (rank 2) (3 of 4 joined)"]


def test_a_node_whose_workers_never_started_says_why_under_the_missing_ranks() -> None:
    # node2's training python does not exist: its ranks never start, so its own output is the cause
    sh_error = "/bin/sh: 22: /home/u/.venvs/train/bin/python: not found"
    output = Result("node2", "sh launch.sh", 127, "", f"{sh_error}\n", 0.1)
    report = _report(*_started(0, 1, 3), {"kind": "missing", "rank": 0, "ranks": [2], "timeout": 60.0})
    validation = _validation(
        report,
        {"node1": _exited("node1", 3), "node2": _exited("node2", 127, output), "node3": _exited("node3", 3)},
    )
    assert failure_summary(validation) == [
        "ranks never joined: node2 (rank 2) (3 of 4 joined)",
        "node 'node2': training exited with code 127 "
        "(the node keeps its log in ~/cluster-bootstrap/runs/validate-x/node2/node.log)",
        f"  node2: {sh_error}",
    ]


def test_without_the_master_every_rank_is_named_and_the_masters_own_error_is_shown() -> None:
    # torch is missing on the master's node: its two ranks die at import (the same traceback twice),
    # the other ranks find nothing listening on the master port
    traceback = [
        "Traceback (most recent call last):",
        '  File "/home/u/cluster-bootstrap/runs/v/node1/validate_worker.py", line 63, in main',
        "    import torch",
        "ModuleNotFoundError: No module named 'torch'",
    ]
    output = Result("node1", "sh launch.sh", 1, "", "\n".join(traceback * 2) + "\n", 0.2)
    refused = "The client socket has failed to connect to any network address of (192.168.1.10, 29500)"
    report = _report(
        *_started(2, 3),
        *({"kind": "unreachable", "rank": r, "master": MASTER, "error": refused} for r in (2, 3)),
    )
    validation = _validation(
        report,
        {"node1": _exited("node1", 1, output), "node2": _exited("node2", 2), "node3": _exited("node3", 2)},
    )
    assert failure_summary(validation) == [
        f"rank 2 on node2 cannot reach the master: {MASTER}: {refused}",
        f"rank 3 on node3 cannot reach the master: {MASTER}: {refused}",
        "ranks never joined: node1 (ranks 0, 1), node2 (rank 2), node3 (rank 3) (0 of 4 joined)",
        "node 'node1': training exited with code 1 "
        "(the node keeps its log in ~/cluster-bootstrap/runs/validate-x/node1/node.log)",
        '  node1: File "/home/u/cluster-bootstrap/runs/v/node1/validate_worker.py", line 63, in main',
        "  node1: import torch",
        "  node1: ModuleNotFoundError: No module named 'torch'",
    ]


def test_several_missing_ranks_are_grouped_by_node() -> None:
    report = _report(*_started(0), {"kind": "missing", "rank": 0, "ranks": [3, 1, 2], "timeout": 60.0})
    validation = _validation(report, {"node1": _exited("node1", 3)})
    assert failure_summary(validation) == [
        "ranks never joined: node1 (rank 1), node2 (rank 2), node3 (rank 3) (1 of 4 joined)"
    ]


def test_a_wrong_all_reduce_result_is_reported_first_then_the_nodes_that_failed() -> None:
    # every rank joined, the sum is wrong (mixed builds): every worker exits 4
    report = _report(
        *_started(0, 1, 2, 3), *_joined(0, 1, 2, 3), *_correct(True, 0, 1, 3), *_correct(False, 2)
    )
    validation = _validation(report, {node: _exited(node, 4) for node in NODES})
    lines = failure_summary(validation)
    assert lines[0] == "all_reduce returned a WRONG result: ranks disagree (mixed builds or a broken backend)"
    assert lines[1:] == [
        f"node '{node}': training exited with code 4 "
        f"(the node keeps its log in ~/cluster-bootstrap/runs/validate-x/{node}/node.log)"
        for node in NODES
    ]


def test_a_hang_inside_a_collective_becomes_a_timeout_line_and_the_stopped_nodes_are_not_errors() -> None:
    # everyone joined and agreed, then a collective hung: the watchdog closed the session, so every
    # node's outcome is a CancelledError, which says nothing new
    report = _report(*_started(0, 1, 2, 3), *_joined(0, 1, 2, 3), *_correct(True, 0, 1, 2, 3))
    report.timed_out = True
    stopped = {node: CancelledError("stopped", node=node, hint="its log: node.log") for node in NODES}
    assert failure_summary(_validation(report, stopped)) == [
        "validation did not finish in time and was stopped (a rank hung inside a collective)"
    ]


def test_a_timeout_before_anyone_joined_names_every_rank() -> None:
    report = _report(*_started(0, 1, 2, 3))
    report.timed_out = True
    stopped = {node: CancelledError("stopped", node=node) for node in NODES}
    assert failure_summary(_validation(report, stopped)) == [
        "ranks never joined: node1 (ranks 0, 1), node2 (rank 2), node3 (rank 3) (0 of 4 joined)",
        "validation did not finish in time and was stopped (a rank hung inside a collective)",
    ]


def test_an_unreachable_node_is_named_with_its_own_error_beside_its_missing_rank() -> None:
    # not a CommandFailedError: the node never ran its worker, so its error says why (and what to do)
    unreachable = UnreachableError(
        "cannot connect to 192.168.1.13:22: No route to host", node="node3", hint="is the machine on?"
    )
    report = _report(*_started(0, 1, 2), {"kind": "missing", "rank": 0, "ranks": [3], "timeout": 60.0})
    validation = _validation(report, {"node1": _exited("node1", 3), "node3": unreachable})
    assert failure_summary(validation) == [
        "ranks never joined: node3 (rank 3) (3 of 4 joined)",
        "node 'node3': cannot connect to 192.168.1.13:22: No route to host (is the machine on?)",
    ]


def test_a_node_lost_while_validation_ran_gives_exit_3_as_an_unreachable_one_does() -> None:
    from orchestrator.errors import ExitCode

    lost = UnreachableError("the connection to 192.168.1.13 was lost while the command ran", node="node3")
    report = _report(*_started(0, 1, 2, 3))
    stopped = {node: CancelledError("stopped", node=node) for node in ("node1", "node2")}
    validation = _validation(report, {**stopped, "node3": lost})
    assert validation.exit_code() == ExitCode.CONNECTION
    assert "node 'node3': the connection to 192.168.1.13 was lost while the command ran" in failure_summary(
        validation
    )


def test_a_node_that_failed_after_a_good_check_is_named() -> None:
    # all joined and correct, but one node's workers exited non-zero afterwards: that is the news
    report = _report(*_started(0, 1, 2, 3), *_joined(0, 1, 2, 3), *_correct(True, 0, 1, 2, 3))
    validation = _validation(report, {"node2": _exited("node2", 1)})
    assert failure_summary(validation) == [
        "node 'node2': training exited with code 1 "
        "(the node keeps its log in ~/cluster-bootstrap/runs/validate-x/node2/node.log)"
    ]


def test_cancelled_outcomes_alone_say_validation_did_not_complete() -> None:
    # the user interrupted after every rank joined: no verdict, no error worth a line of its own
    report = _report(*_started(0, 1, 2, 3), *_joined(0, 1, 2, 3))
    stopped = {node: CancelledError("stopped", node=node) for node in NODES}
    assert failure_summary(_validation(report, stopped)) == ["validation did not complete"]
