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


def test_failures_alike_but_for_the_nodes_own_path_are_one_line() -> None:
    """`status --run lab-2026120-1` (a typo): "no run ... (/wd/node1/runs/.../node1 does not
    exist)" once per node, each path ending in its node's name. One line, the name written <node>."""
    errors = [
        CommandFailedError(
            f"no run r1 on this node (/wd/{n}/runs/r1/{n} does not exist)", node=n, hint="check --run"
        )
        for n in ("ws1", "ws2", "ws3")
    ]
    assert said_once(errors) == [
        "nodes 'ws1', 'ws2', 'ws3': no run r1 on this node (/wd/<node>/runs/r1/<node> does not exist)"
        " (check --run)"
    ]
    one = [CommandFailedError("no run r1 on this node (/wd/ws1/runs/r1/ws1 does not exist)", node="ws1")]
    assert said_once(one) == ["node 'ws1': no run r1 on this node (/wd/ws1/runs/r1/ws1 does not exist)"]
    # a name that is only a word of the message stays (node "a" in "a run")
    assert said_once(
        [CommandFailedError("a run failed", node="a"), CommandFailedError("a run failed", node="b")]
    ) == ["nodes 'a', 'b': a run failed"]
