"""Which early preflight round trips the preflight adopts (steps/preflight/early.py): the main
pipeline's first command starts each node's listener; the preflight takes it over only when it is
still running, young enough to outlive the mesh, and planned for the mesh the preflight measures.
Anything else is ended, and the session forgets it either way."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from orchestrator.steps.preflight.early import EARLY, MAX_AGE, EarlyRound, adopt, end_early_rounds, take
from orchestrator.steps.preflight.reachability import MeshPlan


class FakeListener:
    def __init__(self, round_ended: threading.Event) -> None:
        self.reported = threading.Event()
        self.reported.set()  # it said "ready" with its pid
        self.ended = threading.Event()
        self.round_ended = round_ended
        self.stopped = 0

    def stop(self) -> None:  # SIGTERM: the listener ends, and with it its round's command
        self.stopped += 1
        self.ended.set()
        self.round_ended.set()


class FakeRound:
    def __init__(self, *, age: float = 1.0, ended: bool = False) -> None:
        self.ended = threading.Event()
        self.listener = FakeListener(self.ended)
        self.started_at = time.time() - age
        if ended:
            self.ended.set()
            self.listener.ended.set()


@dataclass
class FakeNode:
    name: str


@dataclass
class FakeSession:
    nodes: list[FakeNode]
    memo: dict[tuple[str, str], object] = field(default_factory=dict)

    def recall(self, node: str, key: str) -> object | None:
        return self.memo.get((node, key))

    def forget(self, node: str | None = None, *keys: str) -> None:
        for slot in list(self.memo):
            if (node is None or slot[0] == node) and (not keys or slot[1] in keys):
                del self.memo[slot]


PLAN = MeshPlan(("node1", "node2"), "node1", 29500)


def _session(**rounds: FakeRound) -> FakeSession:
    session = FakeSession([FakeNode(name) for name in ("node1", "node2")])
    for name, node_round in rounds.items():
        session.memo[(name, EARLY)] = EarlyRound(PLAN, f"token-{name}", node_round)  # type: ignore[arg-type]
    return session


def test_a_running_young_round_of_the_same_mesh_is_taken_over() -> None:
    first, second = FakeRound(), FakeRound()
    session = _session(node1=first, node2=second)
    plan = adopt(session, ("node1", "node2"), "node1", 29500)  # type: ignore[arg-type]
    assert plan is PLAN
    taken = take(session, "node1", PLAN)  # type: ignore[arg-type]
    assert taken is not None and taken.round is first and taken.token == "token-node1"
    assert session.recall("node1", EARLY) is None  # the preflight owns it now
    assert first.listener.stopped == 0


def test_a_round_too_old_to_outlive_the_mesh_is_ended_and_the_preflight_starts_its_own() -> None:
    old = FakeRound(age=MAX_AGE + 1)
    session = _session(node1=old)
    assert take(session, "node1", PLAN) is None  # type: ignore[arg-type]
    assert old.listener.stopped == 1 and session.recall("node1", EARLY) is None


def test_a_round_whose_listener_ended_is_not_taken() -> None:
    done = FakeRound(ended=True)
    session = _session(node1=done)
    assert take(session, "node1", PLAN) is None  # type: ignore[arg-type]
    assert done.listener.stopped == 0  # nothing left to stop


def test_rounds_planned_for_another_mesh_are_ended() -> None:
    first, second = FakeRound(), FakeRound()
    session = _session(node1=first, node2=second)
    # the preflight measures node1 alone (--nodes), or with another rendezvous port
    assert adopt(session, ("node1",), "node1", 29500) is None  # type: ignore[arg-type]
    assert first.listener.stopped == second.listener.stopped == 1
    assert session.recall("node1", EARLY) is None and session.recall("node2", EARLY) is None


def test_a_pipeline_that_stops_early_ends_what_nobody_adopted() -> None:
    first, second = FakeRound(), FakeRound()
    session = _session(node1=first, node2=second)
    end_early_rounds(session)  # type: ignore[arg-type]
    assert first.listener.stopped == second.listener.stopped == 1
    assert session.memo == {}
