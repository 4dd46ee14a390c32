"""Reachability: can torchrun's rendezvous and gloo's/NCCL's full mesh form between these nodes?

A multi-node job hangs silently when the network is wrong, so the preflight tries it for real:

(a) nothing already listens on the master's rendezvous port (TCPStore would fail with "address
    already in use");
(b) every node connects to a short-lived listener on the master's address and that port (the master
    included: its own agent connects to the store through MASTER_ADDR too);
(c) every node connects to every other node on an ephemeral port: gloo gives each rank a listener
    on a random port and connects a full mesh, NCCL's bootstrap does the same
    (../shared/FIELD_NOTES.md "Ports and firewalls"), so a firewall that opens only the rendezvous
    port breaks training.

The probe (probes/reach.py) runs under each node's own Python. A listener listens on every address
of its node, so it can start before the controller knows which address the node will train on: on
Linux nodes it starts at the end of the node's facts round trip (rounds.py); elsewhere this module
starts it. Once every listener has reported its port, all connectors run at once, each from the
node's cluster address to the address its peers will dial. On a POSIX node the connector is the
listener itself: its inbox (a FIFO, probes/reach.py) gets one line naming the targets, and it dials
them and prints the results among its own lines (no second interpreter, no watched command). A
connector hands each listener the run's token; a listener ends by itself once every expected peer
delivered it (and, with an inbox, its own line came), else it is stopped: SIGTERM on Linux and in
WSL, the PowerShell platform's ``kill_tree`` on native Windows, which has no ``kill``; else it ends
after its own deadline. Nothing waits on a clock except deadlines: readiness
comes from the probes' output lines. Each connector also prints its node's clock first: a clock
sample for the preflight.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources

from orchestrator.platforms import Platform, PosixShell
from orchestrator.steps.preflight.checks import ClockSample
from orchestrator.steps.preflight.mesh import (
    CHECK,
    Busy,
    Clock,
    Connected,
    ConnectResult,
    Done,
    InboxAt,
    ListenerEvent,
    Listening,
    Outcome,
    Pair,
    PortRange,
    ProbeError,
    ProbeFailure,
    Ready,
    Role,
    build_verdicts,
    parse_clock_line,
    parse_connect_line,
    parse_listener_line,
)
from orchestrator.steps.preflight.model import Verdict
from orchestrator.transports import Result, Stream, Transport

__all__ = [
    "CHECK",
    "LISTEN_HOLD",
    "PROBE_TAG",
    "RUN_SLACK",
    "START_TIMEOUT",
    "STOP_GRACE",
    "Busy",
    "Clock",
    "ConnectResult",
    "Connected",
    "Done",
    "InboxAt",
    "Listener",
    "ListenerEvent",
    "Listening",
    "MeshPlan",
    "Outcome",
    "Pair",
    "PortRange",
    "ProbeError",
    "ProbeFailure",
    "ReachNode",
    "Ready",
    "Role",
    "build_verdicts",
    "check_reachability",
    "in_threads",
    "inbox_command",
    "parse_clock_line",
    "parse_connect_line",
    "parse_listener_line",
    "probe_command",
    "probe_source",
    "stop_command",
]

log = logging.getLogger("orchestrator.preflight.reachability")

#: first argument of every probe process: `pgrep -af cbt-reach` finds them on a node
PROBE_TAG = "cbt-reach"
#: how long listeners may take to report their ports (SSH channel + interpreter start)
START_TIMEOUT = 15.0
#: what a probe run may take beyond its own work (SSH channel, interpreter start, output)
RUN_SLACK = 15.0
#: after the connections, how long a listener that got every peer may take to end by itself
STOP_GRACE = 3.0
#: how long a listener started here waits at most (a safety net: it normally ends by itself or by
#: SIGTERM long before); one started at the end of a facts round trip adds how long the other
#: nodes' facts may take (rounds.py)
LISTEN_HOLD = START_TIMEOUT + 2.0 + RUN_SLACK + STOP_GRACE


@dataclass(frozen=True)
class ReachNode:
    name: str
    transport: Transport  # connected
    python: str  # interpreter on the node, e.g. "/usr/bin/python3"
    address: str  # the node's cluster IPv4 address (source address of its route to the master)
    listener: Listener | None = None  # already started (by the node's facts round trip); None: start one


@dataclass(frozen=True)
class MeshPlan:
    """What every listener is told, fixed before any node answered: who takes part (``names``), the
    master and its rendezvous port, the token that marks the connectors' connections."""

    names: tuple[str, ...]
    master: str
    port: int
    hold: float = LISTEN_HOLD
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    def listen_args(self, name: str) -> list[str]:
        """The listener's arguments on node ``name``: every other node connects to its mesh port;
        on the master, every node (itself included) to the rendezvous port too."""
        args = ["listen", f"{self.hold:g}", self.token, str(len(self.names) - 1)]
        if name == self.master:
            args += [str(self.port), str(len(self.names))]
        return args

    def listener(self, name: str, transport: Transport, python: str) -> Listener:
        """A listener for ``name`` that another command runs (its ``command`` ends that script)."""
        return Listener(name, transport, python, self.listen_args(name), self.hold + RUN_SLACK)


# -- running the probes ----------------------------------------------------------------------------


@functools.cache
def probe_source() -> str:
    return resources.files("orchestrator.steps.preflight.probes").joinpath("reach.py").read_text("utf-8")


def probe_command(platform: Platform, python: str, args: Sequence[str]) -> str:
    # -I: a stray socket.py or selectors.py in the login directory, or PYTHONPATH, must not shadow
    # the standard library the probe relies on; -S: nor does it need site-packages, whose .pth files
    # cost a few ms of CPU per process (two per node on every check: benchmarks/fanout.py)
    return platform.join([python, "-I", "-S", "-c", probe_source(), PROBE_TAG, *args])


def stop_command(platform: Platform, pid: int) -> tuple[str, bool]:
    """(the command that stops the listener ``pid`` on a node of ``platform``, whether it ends the
    listener at once). POSIX sh (Linux, WSL): SIGTERM, which the probe answers with "done stopped".
    Native Windows has neither ``kill`` nor SIGTERM for a windowless process: the PowerShell
    platform's ``kill_tree`` terminates the listener (and anything it started) outright, so it
    prints nothing more."""
    powershell = platform.as_powershell()
    if powershell is not None:
        return powershell.kill_tree(pid), True
    return platform.join(["kill", "-TERM", str(pid)]), False


def inbox_command(posix: PosixShell, inbox: str, args: Sequence[str]) -> str:
    """The line that has a listener with an inbox (a FIFO) run ``args`` ("connect ..."): opened
    read-write, so that it never waits, even for a listener that is gone."""
    return posix.line_into_fifo(inbox, args)


def _target(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _tail(result: Result, lines: int = 3) -> str:
    text = [line.strip() for line in result.tail(lines * 4) if line.strip()]
    return " | ".join(text[-lines:]) or f"exit code {result.exit_code}"


class _ProbeRun:
    """One probe command on one node; output lines are parsed as they come. It runs in a thread of
    its own (:meth:`start`), or inside a longer command that hands its lines over (:meth:`feed`,
    :meth:`ended_elsewhere`): the listener at the end of a facts round trip."""

    def __init__(
        self, name: str, transport: Transport, python: str, args: Sequence[str], timeout: float
    ) -> None:
        self.name = name
        self.transport = transport
        self.python = python
        self.command = probe_command(transport.platform, python, args)
        self.timeout = timeout
        self.ended = threading.Event()
        self.result: Result | None = None
        self.error: str | None = None  # the transport raised (connection lost, cancelled)
        self.started_at: float | None = None  # time.time() just before the command was sent
        self._thread = threading.Thread(target=self._run, name=f"reach-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        result: Result | None = None
        error: str | None = None
        self.started_at = time.time()
        try:
            result = self.transport.run(self.command, timeout=self.timeout, on_line=self._on_line)
        except Exception as exc:  # a thread boundary: whatever happened becomes this node's verdict
            error = str(exc) or type(exc).__name__
        finally:
            self.ended_elsewhere(result, error)

    def _on_line(self, stream: Stream, line: str) -> None:
        if stream == "stdout":
            self.feed(line)

    def feed(self, line: str) -> None:
        """One stdout line of the probe."""
        self._line(line)

    def ended_elsewhere(self, result: Result | None, error: str | None) -> None:
        """The command that ran the probe is over (``error``: it raised)."""
        self.result, self.error = result, error
        self.ended.set()
        self._ended()

    def _line(self, line: str) -> None:
        raise NotImplementedError

    def _ended(self) -> None:
        pass

    def failure(self, what: str) -> ProbeFailure:
        if self.error is not None:
            return ProbeFailure(
                f"the {what} probe could not run: {self.error}",
                f"check the connection to {self.name} and rerun `bootstrap check`",
            )
        if self.result is None:
            return ProbeFailure(
                f"the {what} probe did not answer in time",
                f"{self.name} or its SSH server is very slow: rerun `bootstrap check`",
            )
        if self.result.timed_out:
            return ProbeFailure(
                f"the {what} probe did not end within {self.timeout:g}s: {_tail(self.result)}",
                "rerun `bootstrap check`; if it persists, run it with -vv and report it",
            )
        return ProbeFailure(
            f"the {what} probe failed (exit code {self.result.exit_code}): {_tail(self.result)}",
            f"check that `{self.python}` runs on {self.name} (python: in the inventory)",
        )


class Listener(_ProbeRun):
    """A node's listener (``cbt-reach listen``): its ports, its pid, how it ended."""

    def __init__(
        self, name: str, transport: Transport, python: str, args: Sequence[str], timeout: float
    ) -> None:
        super().__init__(name, transport, python, args, timeout)
        self.reported = threading.Event()  # ready, error or ended
        self.mesh: Listening | None = None
        self.rendezvous: Listening | None = None
        self.busy: Busy | None = None
        self.range: PortRange | None = None
        self.pid: int | None = None
        self.problem: str | None = None
        self.done: str | None = None
        self.stop_sent = False
        #: stopped outright on our request (native Windows): an end without "done" is expected then
        self.terminated = False
        #: its FIFO (probes/reach.py), where one line makes it connect in its own process
        self.inbox: str | None = None
        #: the connector whose lines this listener prints (asked through the inbox)
        self.connector: _Connector | None = None

    def _line(self, line: str) -> None:
        if self.connector is not None and self.connector.take(line):
            return
        event = parse_listener_line(line)
        if isinstance(event, Listening):
            if event.role == "mesh":
                self.mesh = event
            else:
                self.rendezvous = event
        elif isinstance(event, Busy):
            self.busy = event
        elif isinstance(event, PortRange):
            self.range = event
        elif isinstance(event, InboxAt):
            self.inbox = event.path
        elif isinstance(event, Ready):
            self.pid = event.pid
            self.reported.set()
        elif isinstance(event, ProbeError):
            self.problem = event.message
            self.reported.set()
        elif isinstance(event, Done):
            self.done = event.how

    def _ended(self) -> None:
        self.reported.set()
        if self.connector is not None:
            self.connector.reported.set()

    @property
    def listening(self) -> bool:
        return self.pid is not None and self.mesh is not None and self.problem is None

    def listener_failure(self) -> ProbeFailure | None:
        """Why this node has no usable measurement (None: it listened and ended as asked)."""
        if self.problem is not None:
            return ProbeFailure(
                f"the reachability probe cannot listen: {self.problem}",
                f"check that this user may listen on TCP ports on {self.name} (ports below 1024 need "
                "root: choose a cluster port above 1023)",
            )
        if not self.listening:
            return self.failure("reachability")
        if self.done in ("complete", "stopped"):
            # it saw every connection there was to see: how its command ended after that (a
            # connection closing under a heartbeat, the commands after it) changes no measurement
            return None
        if self.terminated and self.ended.is_set() and self.done is None and self.error is None:
            return None  # it listened until we stopped it, after every connection was tried
        if self.ended.is_set() and (self.done is None or self.result is None or not self.result.ok):
            # a listener that died early makes its peers look refused: no verdict can rest on it
            return self.failure("reachability listener")
        if self.done == "deadline":
            return ProbeFailure(
                "the reachability listener gave up before every connection was tried",
                f"{self.name} or its SSH server is very slow: rerun `bootstrap check`",
            )
        return None

    def stop(self) -> None:
        """Stop the listener (:func:`stop_command`: SIGTERM, after which it prints "done stopped"
        and exits; on native Windows it is terminated); a no-op once it ended."""
        if self.pid is None or self.ended.is_set() or self.stop_sent:
            return
        self.stop_sent = True
        command, outright = stop_command(self.transport.platform, self.pid)
        try:
            result = self.transport.run(command, timeout=RUN_SLACK)
        except Exception as exc:  # its own deadline still ends it; say so in the log only
            log.warning("%s: could not stop the reachability listener: %s", self.name, exc)
            return
        if not result.ok:
            log.warning("%s: could not stop the reachability listener: %s", self.name, _tail(result))
        elif outright:
            self.terminated = True


class _Connector(_ProbeRun):
    """A node's connections to its peers: a ``cbt-reach connect`` process of its own or, when the
    node's listener has an inbox (``via``), one line written there: that listener connects and
    prints the results among its own lines (two processes and an interpreter start fewer)."""

    def __init__(
        self,
        node: ReachNode,
        targets: Sequence[tuple[str, Role, str, int]],
        connect_timeout: float,
        token: str,
        via: Listener | None = None,
    ) -> None:
        args = ["connect", node.address, f"{connect_timeout:g}", token]
        args += [_target(address, port) for _, _, address, port in targets]
        super().__init__(node.name, node.transport, node.python, args, connect_timeout + RUN_SLACK)
        # the inbox is a FIFO: a POSIX shell writes the line there (opened read-write: no wait, even
        # when the listener is gone)
        posix = node.transport.platform.as_posix()
        self.via = via if via is not None and via.inbox is not None and posix is not None else None
        if self.via is not None and self.via.inbox is not None and posix is not None:
            self.command = inbox_command(posix, self.via.inbox, args)
            self.via.connector = self
        self.answered = False  # the listener printed "connected"
        self.targets = list(targets)  # (target node, role, address, port)
        self.results: dict[int, ConnectResult] = {}
        self.clock: ClockSample | None = None
        # every result is in ("done" or "connected" printed, or the run ended): listeners can be
        # settled while this run is still coming back
        self.reported = threading.Event()

    def _run(self) -> None:
        if self.via is None:
            super()._run()
            return
        result: Result | None = None
        error: str | None = None
        self.started_at = time.time()
        try:  # the line goes into a FIFO the listener holds open: nothing waits, nothing to watch
            result = self.transport.run_brief(self.command, timeout=self.timeout)
        except Exception as exc:  # a thread boundary: whatever happened becomes this node's verdict
            error = str(exc) or type(exc).__name__
        self.result, self.error = result, error
        if error is not None or result is None or not result.ok or self.via.ended.is_set():
            self.reported.set()  # no listener will answer it
        self.ended.set()

    def take(self, line: str) -> bool:
        """A line of the listener that connects for us: True when it was ours."""
        ours = parse_connect_line(line) is not None or parse_clock_line(line) is not None
        if not ours and not isinstance(parse_listener_line(line), Connected):
            return False
        self._line(line)
        return True

    def _line(self, line: str) -> None:
        result = parse_connect_line(line)
        if result is not None and 0 <= result.index < len(self.targets):
            self.results[result.index] = result
        elif (clock := parse_clock_line(line)) is not None and self.started_at is not None:
            after = time.time()
            self.clock = ClockSample(
                offset=clock.unix_time - (self.started_at + after) / 2, rtt=after - self.started_at
            )
        elif isinstance(event := parse_listener_line(line), (Done, Connected)):
            self.answered = isinstance(event, Connected)
            self.reported.set()

    def _ended(self) -> None:
        self.reported.set()

    def failure(self, what: str) -> ProbeFailure:
        if self.via is not None and self.error is None and self.result is not None and self.result.ok:
            return ProbeFailure(
                f"the {what} probe (in the listener) did not report every connection",
                f"{self.name} or its SSH server is very slow: rerun `bootstrap check`",
            )
        return super().failure(what)

    def pairs(self) -> list[Pair]:
        return [
            Pair(self.name, target, role, address, port, r.outcome, r.ms, r.detail)
            for index, (target, role, address, port) in enumerate(self.targets)
            if (r := self.results.get(index)) is not None
        ]


def in_threads(calls: Sequence[Callable[[], None]], timeout: float) -> None:
    """Run every call in a thread of its own; return when all ended or ``timeout`` passed."""
    threads = [threading.Thread(target=call, daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _await(events: Iterable[threading.Event], deadline: float) -> None:
    for event in events:
        event.wait(max(0.0, deadline - time.monotonic()))


def check_reachability(
    nodes: Sequence[ReachNode],
    master: str,
    port: int,
    *,
    connect_timeout: float = 2.0,
    plan: MeshPlan | None = None,
    clocks: dict[str, ClockSample] | None = None,
    from_default: bool = False,
) -> dict[str, Verdict]:
    """Verdicts keyed by node name (check "reachability"); see the module docstring.

    ``plan``: what the nodes' listeners were told when some were started already (``ReachNode.listener``);
    its ``names`` may include nodes missing here (they never answered): listeners waiting for them are
    stopped. ``clocks`` receives each node's clock sample, taken by its connector."""
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"node names must be unique: {names}")
    if master not in names:
        raise ValueError(f"master {master!r} is not among the nodes {names}")
    plan = plan or MeshPlan(tuple(names), master, port)
    if plan.master != master or plan.port != port or not set(names) <= set(plan.names):
        raise ValueError(f"the listeners' plan {plan} does not cover the nodes {names}")
    started = time.monotonic()
    listeners: dict[str, Listener] = {}
    for node in nodes:
        if node.listener is not None:
            listeners[node.name] = node.listener
            continue
        own = Listener(
            node.name, node.transport, node.python, plan.listen_args(node.name), plan.hold + RUN_SLACK
        )
        own.start()
        listeners[node.name] = own
    _await((lst.reported for lst in listeners.values()), time.monotonic() + START_TIMEOUT)
    ready = [name for name in names if listeners[name].listening]
    listened = time.monotonic() - started

    address = {n.name: n.address for n in nodes}
    rendezvous = listeners[master].rendezvous if master in ready else None
    connectors: list[_Connector] = []
    for name in ready:
        targets: list[tuple[str, Role, str, int]] = []
        if rendezvous is not None:
            targets.append((master, "rendezvous", address[master], rendezvous.port))
        for other in ready:
            mesh = listeners[other].mesh
            if other != name and mesh is not None:
                targets.append((other, "mesh", address[other], mesh.port))
        if targets:
            node = next(n for n in nodes if n.name == name)
            connectors.append(_Connector(node, targets, connect_timeout, plan.token, listeners[name]))
    for connector in connectors:
        connector.start()
    _await((c.reported for c in connectors), time.monotonic() + connect_timeout + RUN_SLACK)
    pairs = [pair for connector in connectors for pair in connector.pairs()]
    connected = time.monotonic() - started

    # Listeners whose every peer connected end by themselves; the others wait for peers that will
    # never come (dropped, refused, no probe on that node, or no answer at all): stop those now.
    arrived: dict[tuple[str, Role], int] = defaultdict(int)
    for p in pairs:
        if p.ok:
            arrived[(p.target, p.role)] += 1
    waiting = []
    asked = {c.name for c in connectors if c.answered}
    for name, listener in listeners.items():
        complete = arrived[(name, "mesh")] == len(plan.names) - 1 and (
            listener.rendezvous is None or arrived[(name, "rendezvous")] == len(plan.names)
        )
        # one with an inbox also waits for its connect line
        complete = complete and (listener.inbox is None or name in asked)
        if not complete:
            waiting.append(listener.stop)
    in_threads(waiting, RUN_SLACK)
    _await((lst.ended for lst in listeners.values()), time.monotonic() + STOP_GRACE)
    in_threads([lst.stop for lst in listeners.values() if not lst.ended.is_set()], RUN_SLACK)
    _await((lst.ended for lst in listeners.values()), time.monotonic() + STOP_GRACE)
    # connectors ended right after their last line: this only collects their exit
    _await((c.ended for c in connectors), time.monotonic() + RUN_SLACK)

    failures: dict[str, ProbeFailure] = {}
    for connector in connectors:
        if len(connector.results) < len(connector.targets):
            failures[connector.name] = connector.failure("connection")
        if clocks is not None and connector.clock is not None:
            clocks[connector.name] = connector.clock
    for name, listener in listeners.items():
        if not listener.ended.is_set():
            log.warning("%s: the reachability listener is still running; it ends by its deadline", name)
        problem = listener.listener_failure()
        if problem is not None:
            failures.setdefault(name, problem)

    log.info(
        "reachability: %d of %d nodes listening after %.2fs, %d pairs measured after %.2fs, done after %.2fs",
        len(ready),
        len(nodes),
        listened,
        len(pairs),
        connected,
        time.monotonic() - started,
    )
    master_listener = listeners[master]
    return build_verdicts(
        names,
        address,
        master,
        port,
        pairs,
        busy=master_listener.busy if master not in failures else None,
        failures=failures,
        ranges={
            name: (lst.range.low, lst.range.high) for name, lst in listeners.items() if lst.range is not None
        },
        seconds=time.monotonic() - started,
        from_default=from_default,
    )
