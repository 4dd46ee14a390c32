"""What a human reads when nodes fail: one line per failure, and one line for a failure that many
nodes share (the same pip error on every node of a cluster without an index is read once)."""

from __future__ import annotations

from orchestrator.errors import CommandFailedError, ConnectError, said_once


def test_the_same_failure_on_many_nodes_is_one_line_naming_them() -> None:
    pip = "offline mode: downloading wheels failed: ERROR: No matching distribution found for x==1"
    errors = [
        CommandFailedError(pip, node="ws1", hint="check env.index_url"),
        ConnectError("connection refused", node="ws2"),
        CommandFailedError(pip, node="ws3", hint="check env.index_url"),
        CommandFailedError(pip, node="ws4", hint="another hint"),
    ]
    assert said_once(errors) == [
        f"nodes 'ws1', 'ws3': {pip} (check env.index_url)",
        "node 'ws2': connection refused",
        f"node 'ws4': {pip} (another hint)",
    ]


def test_failures_without_a_node_are_each_said() -> None:
    errors = [CommandFailedError("boom"), CommandFailedError("boom")]
    assert said_once(errors) == ["boom", "boom"]
