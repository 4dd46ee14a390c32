"""`launch --detach` cut short by Ctrl-C while it starts the nodes: it said "commands still running on
the nodes were stopped" and exited 130 without a run id, while the run trained on every node (its
launchers are in sessions of their own: closing the connections stops nothing), or on some of them
as orphans waiting for a master that never came. Now every node is stopped again by the run's
marker, on new connections, and the message says what is left."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.executor import GroupResult, Outcome
from orchestrator.runs import start
from orchestrator.runs.control import StopResult


class _Session:
    """Ctrl-C while the nodes start; the stop after it goes on new connections."""

    def __init__(self, names: list[str]) -> None:
        self.nodes = [SimpleNamespace(name=n) for n in names]
        self.stopped: list[str] = []
        self.reopened_count = 0

    def map(self, fn: Callable[..., Any], step: str, nodes: Any = None) -> GroupResult[Any]:
        if step == "start":
            raise KeyboardInterrupt
        out = []
        for node in self.nodes:
            self.stopped.append(node.name)
            out.append(Outcome(node.name, fn(node, None), None, 0.1))
        return GroupResult(out)

    @contextmanager
    def reopened(self) -> Iterator[_Session]:
        self.reopened_count += 1
        yield self


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> dict[str, StopResult]:
    found = {"n1": StopResult("stopped", 2), "n2": StopResult("no run"), "n3": StopResult("stopped", 1)}
    monkeypatch.setattr(start, "stop_node", lambda node, t, run_id, grace: found[node.name])
    return found


def _specs(names: list[str]) -> list[Any]:
    return [SimpleNamespace(node=SimpleNamespace(name=n), run_id="lab-1", sample_nonce="x") for n in names]


def test_a_start_cut_short_stops_every_node_again_and_says_nothing_runs(stops: dict[str, Any]) -> None:
    session = _Session(["n1", "n2", "n3"])
    report = start.start_all(session, _specs(["n1", "n2", "n3"]), lambda *a: None)  # type: ignore[arg-type]
    assert isinstance(report.interrupted, KeyboardInterrupt) and report.swept_all
    assert session.reopened_count == 1 and session.stopped == ["n1", "n2", "n3"]
    said = report.interrupted_detail(lambda command: f"bootstrap {command} --run lab-1")
    assert said == "run lab-1 was not started: nothing of it runs on the nodes (stopped again on n1, n3)"


def test_a_node_the_stop_could_not_reach_is_named_with_the_stop_to_run(
    stops: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.errors import ConnectError

    session = _Session(["n1", "n2"])

    def unreachable(fn: Callable[..., Any], step: str, nodes: Any = None) -> GroupResult[Any]:
        if step == "start":
            raise KeyboardInterrupt
        return GroupResult([Outcome("n1", None, ConnectError("gone", node="n1"), 0.1)])

    monkeypatch.setattr(session, "map", unreachable)
    report = start.start_all(session, _specs(["n1", "n2"]), lambda *a: None)  # type: ignore[arg-type]
    said = report.interrupted_detail(lambda command: f"bootstrap {command} --run lab-1")
    assert said == "run lab-1 may have started on some nodes: `bootstrap stop --run lab-1` ends it"
