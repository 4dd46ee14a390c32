"""Each node's progress in one step, from the executor's events and from what the node's worker says
it is doing ("installing torch", "1.1 GiB downloaded"), shared by their threads; whatever shows it (a
live table, a piped line every few seconds) reads it from here."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from orchestrator.executor import NodeEvent
from orchestrator.neutralise import neutralise


def progress_interval() -> float:
    """Seconds between piped progress lines: $BOOTSTRAP_PROGRESS_INTERVAL, else 10."""
    try:
        return max(float(os.environ.get("BOOTSTRAP_PROGRESS_INTERVAL", "") or 10), 0.1)
    except ValueError:
        return 10.0


class NodeProgress:
    """The state of every node of one step (waiting, running, no answer, ok, failed), what it is
    doing now, and since when. Node text (activities, failures) is kept neutralised, ready to show."""

    def __init__(self, nodes: Sequence[str], step: str, interval: float) -> None:
        self.nodes = list(nodes)
        self.step = step
        self.interval = interval  # seconds between two piped lines of a node
        self._lock = threading.Lock()
        self._status = {n: "waiting" for n in nodes}
        self._activity = {n: "" for n in nodes}
        self._detail = {n: "" for n in nodes}
        self._took: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self._printed: dict[str, float] = {}  # piped: when each node's last progress line was written
        self._failures: set[tuple[str, str, str]] = set()  # (node, step, error) already said

    def on_event(self, event: NodeEvent) -> str | None:
        """The executor's event; when a node is done, its line (``node: step ok (1.23s)``)."""
        with self._lock:
            if event.kind == "start":
                # a node's step may be several fan-outs (sync: check, then build): each phase's
                # first piped line comes an interval after that phase started
                self._started[event.node] = time.monotonic()
                self._printed.pop(event.node, None)
                self._status[event.node] = "running"
                self._activity[event.node] = event.step
                self._detail[event.node] = ""
                return None
            if event.kind == "waiting":  # the session printed the line: the board shows the state
                if self._status.get(event.node) == "running":
                    self._status[event.node] = "no answer"
                    self._activity[event.node] = neutralise(event.detail)
                return None
            took = time.monotonic() - self._started.get(event.node, time.monotonic())
            status = "ok" if event.kind == "done" else "failed"
            self._status[event.node] = status
            self._activity[event.node] = neutralise(event.detail.splitlines()[0]) if event.detail else ""
            self._detail[event.node] = ""
            self._took[event.node] = took
            if status == "failed":
                # one failure, one line: a step of several fan-outs meets a node that cannot be
                # reached (its host key, its password) once in each
                said = (event.node, event.step, event.detail)
                if said in self._failures:
                    return None
                self._failures.add(said)
        return f"{event.node}: {event.step} {'ok' if status == 'ok' else 'FAILED'} ({took:.2f}s)"

    def update(self, node: str, activity: str, detail: str = "") -> None:
        """What ``node`` is doing now (node text: neutralised before it is shown)."""
        with self._lock:
            if self._status.get(node) in ("ok", "failed"):
                return
            self._activity[node] = neutralise(activity)
            self._detail[node] = neutralise(detail)

    def line(self, node: str, now: float | None = None) -> str:
        """``[node] activity (detail, 45 s)``: one running node, as a piped line shows it."""
        with self._lock:
            elapsed = (now or time.monotonic()) - self._started.get(node, now or time.monotonic())
            activity, detail = self._activity.get(node) or self.step, self._detail.get(node, "")
        return f"[{node}] {activity} ({detail + ', ' if detail else ''}{elapsed:.0f} s)"

    def due(self, now: float) -> list[str]:
        """Running nodes whose next piped line is due: working for ``interval`` seconds or more, and
        ``interval`` seconds after their last line (quick work prints nothing but its end)."""
        out = []
        with self._lock:
            for node in self.nodes:
                if self._status[node] not in ("running", "no answer"):
                    continue
                last = self._printed.get(node, self._started.get(node, now))
                if now - last >= self.interval:
                    self._printed[node] = now
                    out.append(node)
        return out

    @contextmanager
    def ticking(self, say: Callable[[str], None]) -> Iterator[None]:
        """While inside: each running node's :meth:`line` to ``say`` whenever it is :meth:`due` (a
        thread of its own, checking every second or half an interval)."""
        closed = threading.Event()

        def tick() -> None:
            while not closed.wait(min(1.0, self.interval / 2)):
                now = time.monotonic()
                for node in self.due(now):
                    say(self.line(node, now))

        ticker = threading.Thread(target=tick, name=f"progress-{self.step}", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            closed.set()
            ticker.join(timeout=5)

    def rows(self) -> list[tuple[str, str, float, str]]:
        """Every node as a table shows it: its name, state, seconds (taken, or so far) and what it
        is doing (``activity (detail)``)."""
        now = time.monotonic()
        rows = []
        with self._lock:
            for name in self.nodes:
                status = self._status[name]
                done = status in ("ok", "failed")
                shown = self._took.get(name, 0.0) if done else now - self._started.get(name, now)
                detail = self._activity[name] + (f" ({self._detail[name]})" if self._detail[name] else "")
                rows.append((name, status, shown, detail))
        return rows
