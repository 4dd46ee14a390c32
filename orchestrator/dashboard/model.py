"""What the dashboard shows, kept on the controller: one ``LiveRun`` per command, fed by the streams the
command already reads (a launch's or `logs --follow`'s blocks of node output, the executor's node
events) and read by the page as a snapshot followed by deltas.

Cost per block of output (the stream's hot path): a list append and two substring tests; metric lines
(``CB_METRIC {...}``) are parsed as they come, since every one of them is a chart point. Everything
else (splitting lines by rank, masking, the last lines per rank) happens in :meth:`LiveRun.delta`,
called a few times a second by the one server thread whatever the number of viewers, on at most the
last ``TAIL`` lines each node sent since the previous flush. Memory is bounded: per node at most
``PENDING_BYTES`` waiting, per rank ``TAIL`` lines and ``POINTS`` chart points, ``EVENTS`` events.

Every string here is node text or derived from it: the page renders all of it as text (textContent),
and :meth:`LiveRun.mask` removes secrets (the run's secret values, credentials inside URLs) first.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import records

if TYPE_CHECKING:
    from orchestrator.executor import Executor, NodeEvent, Outcome
    from orchestrator.steps.node_facts import InspectedNode
from orchestrator.redact import mask_secrets, maskable
from orchestrator.runs.culprit import (
    ROOT_CAUSE,
    Failure,
    culprit,
    is_victim,
    stopped_pids,
    torchrun_failures,
)
from orchestrator.runs.ranks import split_rank
from orchestrator.runs.samples import node_sample
from orchestrator.view import Cell, View

#: last lines kept per rank (and shown per failure)
TAIL = 200
#: chart points kept per rank: beyond it, every other old point is dropped (the chart keeps its shape)
POINTS = 600
#: events kept (failures, stops, lost nodes, phase ends)
EVENTS = 100
#: bytes of one node's output waiting for the next flush; older blocks are dropped (only the last
#: ``TAIL`` lines of a flush are shown: a node printing 100 MB/s costs this much memory, not more)
PENDING_BYTES = 256 * 1024
#: seconds a failure event takes in its culprit's lines arriving after it
FOLLOW_SECONDS = 5.0
#: characters of a line shown (a 1 MB line is cut, the log here keeps it whole)
LINE_CHARS = 2000
#: bytes of torchrun's failure summary kept while it arrives (it is a few KiB)
SUMMARY_BYTES = 64 * 1024
#: said of a node's failure whose rank died of gloo's closed connection (runs/culprit.py)
CONSEQUENCE = " after a peer's connection closed (a consequence: the cause is another node's failure)"

# the rank capture's tag, then the metric record: ``[default3]:CB_METRIC {...}`` (a launcher line has
# no tag: its metrics count for no rank)
_TAG = re.compile(r"\[default(\d{1,9})\]:")
_METRIC_AT = "CB_METRIC {"
_RANK_IN = re.compile(r"\brank (\d+)\b")
# torchrun's agent, the moment it sees a worker die (before it stops the others and exits, seconds
# later): ``... api.py:1002] failed (exitcode: 3) local_rank: 1 (pid: 741) of binary: ...``
#: torchrun's agent saying a worker failed: its own line, never a rank's (tagged ``[defaultN]:``)
_WORKER_FAILED = re.compile(r"^(?!\[default)[^\n]*\] failed \(exitcode: (-?\d+)\) local_rank: (\d+)", re.M)


@dataclass
class RankState:
    rank: int
    node: str
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    updated: float | None = None  # time.time() of its last metric
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL))
    points: list[tuple[float, int | None, float | None, float | None]] = field(default_factory=list)

    def doc(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "step": self.step,
            "loss": self.loss,
            "samples_per_s": self.samples_per_s,
            "updated": self.updated,
        }


def use_text(node: Mapping[str, Any]) -> str:
    """A node's newest sample in a few words: ``0: 87% 20513/24576 MiB`` per GPU, else its CPU load
    (``load 1.23 / 4 CPUs``), else ``-``."""

    def num(value: Any) -> str:
        return "?" if value is None else f"{value:.0f}"

    gpus = node.get("gpus") or []
    if gpus:
        return "  ".join(
            f"{g['index']}: {num(g['util_percent'])}% {num(g['mem_used_mib'])}/{num(g['mem_total_mib'])} MiB"
            for g in gpus
        )
    load = node.get("load")
    if load:
        shown = "?" if load.get("load") is None else f"{load['load']:.2f}"
        return f"load {shown} / {load.get('cpus') or '?'} CPUs"
    return "-"


def _how(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None  # NaN, inf: JSON has none


class LiveRun:
    """The state of one run as the page shows it; every input method may be called from any thread.

    ``labels``: per node, ``(first global rank, local ranks)`` as :func:`orchestrator.runs.ranks.rank_labels`
    gives them (a line tagged ``[defaultN]:`` is rank ``first + N``). ``secrets``: values masked
    wherever they appear in node text."""

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        run_id: str = "",
        labels: Mapping[str, tuple[int, int]] | None = None,
        secrets: Iterable[str] = (),
        command: str = "launch",
        sample_nonce: str = "",
    ) -> None:
        self.run_id = run_id
        self.command = command
        self.labels: dict[str, tuple[int, int]] = {}
        self._secrets = maskable(secrets)
        self._lock = threading.Lock()
        self._pending: dict[str, list[str]] = {n: [] for n in nodes}
        self._pending_bytes: dict[str, int] = dict.fromkeys(nodes, 0)
        self._metrics: list[tuple[str, int | None, dict[str, Any]]] = []
        self._lines_in: dict[str, int] = dict.fromkeys(nodes, 0)
        self.nodes: dict[str, dict[str, Any]] = {
            n: {"node": n, "phase": "", "state": "waiting", "detail": "", "facts": {}, "lines": 0}
            for n in nodes
        }
        self.ranks: dict[int, RankState] = {}
        self.observed: set[int] = set()  # the executors whose events reach it (orchestrator.cli.dashboard)
        self.launcher_lines: dict[str, deque[str]] = {n: deque(maxlen=TAIL) for n in nodes}
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS)
        self.state = "running"
        self.started = time.time()
        self.seq = 0  # the number of the last delta
        # what changed since the last delta
        self._changed_nodes: set[str] = set()
        self._changed_ranks: set[int] = set()
        self._new_lines: dict[str, list[str]] = {}  # "rank" or "node" (its launcher's lines): lines
        self._new_points: dict[str, list[list[Any]]] = {}
        self._new_events: list[dict[str, Any]] = []  # (an event sent again replaces its earlier copy)
        self._event_ids = 0
        self._following: dict[int, tuple[dict[str, Any], float]] = {}  # failures whose lines may grow
        self._summaries: dict[str, str] = {}  # per node: torchrun's failure summary, as it arrives
        self._stopped: dict[str, frozenset[int]] = {}  # per node: the workers its torchrun stopped
        self._sample_nonce = ""  # the run's sample nonce (set_run): its samples' records
        if labels is not None:
            self.set_run(run_id, labels, sample_nonce)

    # -- input (any thread) ---------------------------------------------------------------------

    def set_run(self, run_id: str, labels: Mapping[str, tuple[int, int]], sample_nonce: str = "") -> None:
        """The run is known (the main pipeline's phases come before it): its id, and per node
        ``(first global rank, local ranks)`` as :func:`orchestrator.runs.ranks.rank_labels` gives them;
        ``sample_nonce``: the records of the nodes' samples in their output (LaunchSpec.sample_nonce)."""
        with self._lock:
            self.run_id = run_id
            self._sample_nonce = sample_nonce
            self.labels = dict(labels)
            for node, (first, count) in self.labels.items():
                for local in range(count):
                    self.ranks.setdefault(first + local, RankState(first + local, node))
                self._changed_nodes.add(node)
            self._changed_ranks.update(self.ranks)

    def node_event(
        self, node: str, step: str, kind: str, detail: str = "", *, cancelled: bool = False
    ) -> None:
        """An executor event (orchestrator.executor.NodeEvent): ``node`` started, finished or failed
        ``step``. A failure after the run was cancelled is a stop (the fail fast, Ctrl-C), not a cause."""
        if kind == "start":
            self.node_state(node, step, "running")
        elif kind == "done":
            if self.nodes.get(node, {}).get("state") not in ("failed", "stopped", "lost"):
                self.node_state(node, step, "ok")  # (a read that ended well of a run that failed: failed)
        elif cancelled:
            self.node_state(node, step, "stopped", detail)
            self.stopped(node, detail or f"{step} stopped")
        else:
            self.node_state(node, step, "failed", detail)
            self.failure(node, detail or f"{step} failed")

    def block(self, node: str, text: str) -> None:
        """Complete lines a node sent (its rank capture's ``[defaultN]:`` tags still on): the
        ``on_block`` of :class:`orchestrator.logs.RankedOutput`."""
        metrics = self._parse_metrics(node, text) if "CB_METRIC" in text else None
        with self._lock:
            pending = self._pending.setdefault(node, [])
            pending.append(text)
            size = self._pending_bytes.get(node, 0) + len(text)
            while size > PENDING_BYTES and len(pending) > 1:
                size -= len(pending.pop(0))
            self._pending_bytes[node] = size
            self._lines_in[node] = self._lines_in.get(node, 0) + text.count("\n")
            if metrics:
                self._metrics.extend(metrics)
        if "closing signal" in text:  # torchrun stopping its other workers: not causes
            self._stopped[node] = self._stopped.get(node, frozenset()) | stopped_pids(text)
        if "failed (exitcode: " in text:
            self._worker_failed(node, text)
            self._summaries[node] = ""  # its summary (every failed rank) follows: see _summary
        if node in self._summaries:
            self._summary(node, text)
        if records.mentions(text, self._sample_nonce):
            self._samples(node, text)

    def _samples(self, node: str, text: str) -> None:
        """The node's newest GPU use (or CPU load), from its rank capture's sample records (which are
        not lines the node printed)."""
        found_all = records.decode(text, self._sample_nonce)
        with self._lock:
            self._lines_in[node] = self._lines_in.get(node, 0) - len(found_all)
        for found in found_all:
            sample = node_sample(found)
            if sample is None:
                continue
            with self._lock:
                doc = self.nodes.setdefault(node, {"node": node, "facts": {}, "lines": 0})
                doc["gpus"] = sample.get("gpus", [])
                doc["load"] = None if "gpus" in sample else {"load": sample["load"], "cpus": sample["cpus"]}
                doc["sampled"] = time.time()
                self._changed_nodes.add(node)

    def _summary(self, node: str, text: str) -> None:
        """torchrun's failure summary of ``node``, once whole: its word on the culprit corrected when
        it named a co-located victim of the culprit's closed connection (runs/culprit.py)."""
        held = self._summaries[node] + text
        done = held.find("\n=====", held.find(ROOT_CAUSE)) if ROOT_CAUSE in held else -1
        if done < 0:
            self._summaries[node] = held[-SUMMARY_BYTES:]
            return
        del self._summaries[node]
        self.flush_pending()  # the ranks' last lines, up to the summary
        with self._lock:
            stopped = self._stopped.get(node, frozenset())

            def lines(failure: Failure) -> list[str]:
                return list(self.ranks[failure.rank].lines) if failure.rank in self.ranks else []

            found = culprit(torchrun_failures(held), lines, stopped)
            said = next((e for e in self.events if e["kind"] == "failure" and e["node"] == node), None)
            if found is None or said is None:
                return
            message = f"rank {found.rank} {_how(found.exit_code)}"
            if found.pid not in stopped and is_victim(lines(found)):
                message += CONSEQUENCE  # the rank its torchrun failed for died of it: not the cause
            if said["message"] != message:
                said["message"] = self.mask(message)
                said["lines"] = []
                self._refresh(said)
                if said not in self._new_events:
                    self._new_events.append(said)

    def _worker_failed(self, node: str, text: str) -> None:
        """torchrun said a worker died: the failure, with that rank's last lines, at once (the node's
        own end, which names it too, comes after its other ranks were stopped)."""
        for match in _WORKER_FAILED.finditer(text):
            local = int(match.group(2))
            rank = self.labels.get(node, (0, 0))[0] + local
            self.failure(node, f"rank {rank} {_how(int(match.group(1)))}")
            return

    def _parse_metrics(self, node: str, text: str) -> list[tuple[str, int | None, dict[str, Any]]]:
        """Each line's metric record (its first ``CB_METRIC {``, up to the ``}`` that ends the line),
        in one pass over the text: a line of output is never read twice (a regex that backtracked
        over a long line held the controller for minutes)."""
        out = []
        for line in text.split("\n"):
            line = line.rstrip(" \t\r")
            at = line.find(_METRIC_AT)
            if at < 0 or not line.endswith("}"):
                continue
            try:
                fields = json.loads(line[at + len(_METRIC_AT) - 1 :])
            except (ValueError, RecursionError):  # not a record (nested past the parser's depth too)
                continue
            if isinstance(fields, dict):
                tag = _TAG.match(line)
                out.append((node, None if tag is None else int(tag.group(1)), fields))
        return out

    def node_state(self, node: str, phase: str, state: str, detail: str = "") -> None:
        """``node`` is ``state`` (waiting, running, ok, failed, stopped, lost) in ``phase``."""
        with self._lock:
            doc = self.nodes.setdefault(node, {"node": node, "facts": {}, "lines": 0})
            doc.update(phase=phase, state=state, detail=self.mask(detail.splitlines()[0] if detail else ""))
            self._changed_nodes.add(node)

    def facts(self, node: str, facts: Mapping[str, Any]) -> None:
        """What the preflight found on ``node`` (OS, CPUs, memory, GPUs, torch, interface, clock)."""
        with self._lock:
            doc = self.nodes.setdefault(node, {"node": node, "phase": "", "state": "waiting", "lines": 0})
            doc["facts"] = {str(k): self.mask(str(v)) for k, v in facts.items() if v not in (None, "")}
            self._changed_nodes.add(node)

    def failure(self, node: str, message: str, lines: Sequence[str] = ()) -> None:
        """``node`` failed (``message`` names what): an event with the culprit's last lines. Without
        ``lines``: the last lines of the rank ``message`` names (torchrun's "rank 3 exited ..."),
        else of every rank of the node."""
        self.flush_pending()  # the lines that arrived before the failure belong in it
        with self._lock:
            said = next((e for e in self.events if e["kind"] == "failure" and e["node"] == node), None)
            if said is not None:  # torchrun named the rank before the node's end: that event, completed
                self._refresh(said)
                return
            shown = [self.mask(line) for line in lines] or self._culprit_lines(node, message)
            event = self._event("failure", node, message, shown)
            if not lines:
                # the culprit's own last lines may reach us after torchrun's word on it (two streams
                # on the node): the event follows them for a while
                self._following[event["id"]] = (event, time.monotonic() + FOLLOW_SECONDS)

    def _refresh(self, event: dict[str, Any]) -> None:
        lines = self._culprit_lines(event["node"], event["message"])
        if lines != event["lines"]:
            event["lines"] = lines
            if event not in self._new_events:
                self._new_events.append(event)

    def stopped(self, node: str, message: str) -> None:
        with self._lock:
            self._event("stop", node, message, [])

    def lost(self, node: str, message: str) -> None:
        with self._lock:
            self._event("lost", node, message, [])

    def ended(self, state: str, message: str = "") -> None:
        """The run is over: ``state`` is "ok", "failed" or "stopped"."""
        self.flush_pending()
        with self._lock:
            self.state = state
            self._changed_nodes.update(self.nodes)  # the delta carries the new state
            self._event("end", "", message or f"run {state}", [])

    def _event(self, kind: str, node: str, message: str, lines: list[str]) -> dict[str, Any]:
        self._event_ids += 1
        event = {
            "id": self._event_ids,
            "kind": kind,
            "node": node,
            "message": self.mask(message),
            "lines": lines,
            "time": time.time(),
        }
        self.events.append(event)
        self._new_events.append(event)
        return event

    def _culprit_lines(self, node: str, message: str) -> list[str]:
        named = _RANK_IN.search(message)
        if named is not None and int(named.group(1)) in self.ranks:
            return list(self.ranks[int(named.group(1))].lines)[-20:]
        first, count = self.labels.get(node, (0, 0))
        out: list[str] = []
        for rank in range(first, first + count):
            if rank in self.ranks and self.ranks[rank].node == node:
                out += [f"[{rank}] {line}" for line in list(self.ranks[rank].lines)[-10:]]
        return out + list(self.launcher_lines.get(node, ()))[-10:]

    # -- masking --------------------------------------------------------------------------------

    def mask(self, text: str) -> str:
        """Node text as shown: cut to ``LINE_CHARS``, secrets and URL credentials masked."""
        if len(text) > LINE_CHARS:
            text = text[:LINE_CHARS] + f" … ({len(text) - LINE_CHARS} more characters)"
        return mask_secrets(text, self._secrets)

    # -- output (the server's thread) -----------------------------------------------------------

    def _absorb(self) -> None:
        """Move what arrived since the last call into the state, remembering what changed (for the
        next delta). Under the lock."""
        pending, self._pending = self._pending, {n: [] for n in self._pending}
        self._pending_bytes = dict.fromkeys(self._pending_bytes, 0)
        metrics, self._metrics = self._metrics, []
        for node, blocks in pending.items():
            if not blocks:
                continue
            text = "".join(blocks)
            tail = text.rsplit("\n", TAIL + 1)[-TAIL - 1 :]  # the last TAIL lines, no full split
            first = self.labels.get(node, (0, 0))[0]
            nonce = self._sample_nonce if records.mentions(text, self._sample_nonce) else ""
            for raw in tail:
                if not raw or (nonce and records.decode_line(raw, nonce) is not None):
                    continue  # (a sample of the node's use, read by block(): not a line it printed)
                local, line = split_rank(raw)
                shown = self.mask(line)
                if local is None:
                    self.launcher_lines.setdefault(node, deque(maxlen=TAIL)).append(shown)
                    key = node
                else:
                    rank = first + local
                    self.ranks.setdefault(rank, RankState(rank, node)).lines.append(shown)
                    key = str(rank)
                new = self._new_lines.setdefault(key, [])
                new.append(shown)
                if len(new) > TAIL:
                    del new[: len(new) - TAIL]
            self.nodes.setdefault(node, {"node": node, "facts": {}})["lines"] = self._lines_in.get(node, 0)
            self._changed_nodes.add(node)
        now = time.time()
        for node, local, fields in metrics:
            metric_rank = self._metric_rank(node, local, fields)
            if metric_rank is None:
                continue
            rank = metric_rank
            state = self.ranks.setdefault(rank, RankState(rank, node))
            step = fields.get("step")
            state.step = step if isinstance(step, int) and not isinstance(step, bool) else state.step
            if "loss" in fields:
                state.loss = _number(fields.get("loss"))
            if "samples_per_s" in fields:
                state.samples_per_s = _number(fields.get("samples_per_s"))
            state.updated = now
            point = (now, state.step, state.loss, state.samples_per_s)
            state.points.append(point)
            if len(state.points) > POINTS:
                state.points[: POINTS // 2] = state.points[: POINTS // 2 : 2]
            self._new_points.setdefault(str(rank), []).append(list(point))
            self._changed_ranks.add(rank)

    def flush_pending(self) -> None:
        """Take in what arrived so far (a failure's event then holds the lines before it)."""
        with self._lock:
            self._absorb()

    def delta(self) -> dict[str, Any]:
        """What changed since the previous delta (``{}`` when nothing did), numbered ``seq``."""
        with self._lock:
            self._absorb()
            now = time.monotonic()
            for key, (event, until) in list(self._following.items()):
                self._refresh(event)
                if now > until:
                    del self._following[key]
            if not (self._new_lines or self._changed_ranks or self._changed_nodes or self._new_events):
                return {}
            self.seq += 1
            delta = {
                "seq": self.seq,
                "run_id": self.run_id,
                "state": self.state,
                "nodes": [self.nodes[n] for n in sorted(self._changed_nodes) if n in self.nodes],
                "ranks": [self.ranks[r].doc() for r in sorted(self._changed_ranks)],
                "points": self._new_points,
                "lines": self._new_lines,
                "events": self._new_events,
                "slowest": self._slowest(),
            }
            self._changed_nodes, self._changed_ranks = set(), set()
            self._new_lines, self._new_points, self._new_events = {}, {}, []
            return delta

    def _metric_rank(self, node: str, local: int | None, fields: Mapping[str, Any]) -> int | None:
        """The global rank of a metric line: the rank capture's tag (authoritative: a script's own
        "rank" field may be its local rank), else the record's own ``rank``."""
        if local is not None:
            return self.labels.get(node, (0, 0))[0] + local
        rank = fields.get("rank")
        return rank if isinstance(rank, int) and not isinstance(rank, bool) else None

    def slowest(self) -> int | None:
        """The rank with the lowest samples/s (None: fewer than two ranks report one)."""
        with self._lock:
            return self._slowest()

    def _slowest(self) -> int | None:
        """The rank with the lowest samples/s, when at least two ranks report one."""
        speeds = [(s.samples_per_s, s.rank) for s in self.ranks.values() if s.samples_per_s is not None]
        return min(speeds)[1] if len(speeds) >= 2 else None

    def view(self) -> View:
        """The live table (`status --watch`, the terminal key of `logs -f`): per node its state, lines
        read and GPU use (else CPU load), per rank its step, loss and samples/s (the slowest rank
        marked), the newest event as the caption."""
        self.flush_pending()
        columns = ("node", "state", "lines", "gpu / cpu", "rank", "step", "loss", "samples/s")
        view, slowest = View(f"run {self.run_id}", columns, no_wrap=True), self.slowest()
        for name, doc in self.nodes.items():
            ranks = sorted((r for r in self.ranks.values() if r.node == name), key=lambda r: r.rank)
            head = (name, str(doc.get("state", "")), str(doc.get("lines", 0)), use_text(doc))
            if not ranks:
                view.add(*head, "-", "-", "-", "-")
            for i, rank in enumerate(ranks):
                speed = "-" if rank.samples_per_s is None else f"{rank.samples_per_s:.1f}"
                view.add(
                    *(head if i == 0 else ("", "", "", "")),
                    str(rank.rank),
                    "-" if rank.step is None else str(rank.step),
                    "-" if rank.loss is None else f"{rank.loss:.4f}",
                    Cell(speed + " slowest", "bold red") if rank.rank == slowest else speed,
                )
        if self.events:
            event = self.events[-1]
            view.caption = f"{event['kind']}: {event['node']} {event['message']}"
        return view

    def snapshot(self) -> dict[str, Any]:
        """Everything a new viewer needs; the deltas after ``seq`` follow it."""
        with self._lock:
            return {
                "run_id": self.run_id,
                "command": self.command,
                "state": self.state,
                "started": self.started,
                "seq": self.seq,
                "nodes": [self.nodes[n] for n in self.nodes],
                "ranks": [self.ranks[r].doc() for r in sorted(self.ranks)],
                "points": {str(r): [list(p) for p in s.points] for r, s in self.ranks.items()},
                "lines": {
                    **{str(r): list(s.lines) for r, s in self.ranks.items()},
                    **{n: list(lines) for n, lines in self.launcher_lines.items()},
                },
                "events": list(self.events),
                "slowest": self._slowest(),
            }


def observe(live: LiveRun | None, executor: Executor) -> Callable[[], None]:
    """Feed ``executor``'s node events to ``live``; returns what undoes it."""
    if live is None or id(executor) in live.observed:
        return lambda: None
    live.observed.add(id(executor))

    def on_event(event: NodeEvent) -> None:
        live.node_event(event.node, event.step, event.kind, event.detail, cancelled=executor.cancelled)

    executor.observers.append(on_event)

    def undo() -> None:
        live.observed.discard(id(executor))
        if on_event in executor.observers:
            executor.observers.remove(on_event)

    return undo


def show_facts(live: LiveRun | None, inspected: Sequence[Outcome[InspectedNode]]) -> None:
    """Each reached node's facts, on the page."""
    if live is None:
        return
    for outcome in inspected:
        if outcome.value is not None:
            live.facts(outcome.node, outcome.value.summary())
