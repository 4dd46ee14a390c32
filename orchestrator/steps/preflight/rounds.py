"""One round trip per Linux node for `bootstrap check`: a clock sample, the node's facts, then its
reachability listener, in one script whose output is read while it runs.

The script is the facts' sectioned script (facts/base.py) with the node's clock as its first
section and the listener (reachability.py) as its last command. The facts are parsed the moment
their last section ends, while the listener keeps running in the same command until its peers have
connected. The clock line is dated by its arrival: the node's clock was read between the moment the
command was sent and that moment.

Facts already gathered in this session (``Session.remember``) are not asked again: the round trip
then carries the clock and the listener only.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from orchestrator.facts.base import Fact, FactParseError, FactSet, SectionStream, parse_sections
from orchestrator.facts.linux import WallClock
from orchestrator.steps.preflight.checks import ClockSample

if TYPE_CHECKING:
    from orchestrator.steps.preflight.reachability import Listener
    from orchestrator.transports import Result, Transport
    from orchestrator.transports.base import Stream

log = logging.getLogger("orchestrator.preflight.rounds")

#: how long a node's facts may take (torch's first import on a slow disk is the long part)
FACTS_TIMEOUT = 120.0


class NodeRound:
    """The round trip of one node (see the module docstring); ``start`` sends it."""

    def __init__(
        self,
        name: str,
        transport: Transport,
        facts: list[Fact[Any]],
        listener: Listener | None = None,
        *,
        facts_timeout: float = FACTS_TIMEOUT,
    ) -> None:
        self.name = name
        self.transport = transport
        self.facts = facts
        self.listener = listener
        self.facts_timeout = facts_timeout
        self._clock = WallClock()
        sections: list[Fact[Any]] = [self._clock, *facts]
        token = "cb-" + secrets.token_hex(6)  # unguessable frame markers: no output can fake them
        platform = transport.platform
        self.script = platform.sectioned([(f.name, f.command(platform)) for f in sections], token)
        if listener is not None:
            self.script += "\n" + listener.command
        self.timeout = facts_timeout + (listener.timeout if listener is not None else 0.0)
        self._stream = SectionStream(token, [f.name for f in sections])
        self.sections_in = threading.Event()  # every section arrived, or the command ended
        self.ended = threading.Event()
        self.started_at: float | None = None  # time.time() just before the command was sent
        self.result: Result | None = None
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name=f"check-{name}", daemon=True)

    def start(self) -> NodeRound:
        self._thread.start()
        return self

    def _run(self) -> None:
        self.started_at = time.time()
        try:
            self.result = self.transport.run(self.script, timeout=self.timeout, on_line=self._on_line)
        except Exception as exc:  # a thread boundary: handed to whoever waits for the facts
            log.debug("%s: the check's round trip failed", self.name, exc_info=True)
            self.error = exc
        finally:
            self.sections_in.set()
            self.ended.set()
            if self.listener is not None:
                error = None if self.error is None else str(self.error) or type(self.error).__name__
                self.listener.ended_elsewhere(self.result, error)

    def _on_line(self, stream: Stream, line: str) -> None:
        if stream != "stdout":
            return
        rest = self._stream.feed(line, time.time())
        if self._stream.complete:
            self.sections_in.set()
        if rest is not None and self.listener is not None:
            self.listener.feed(rest)

    def gathered(self) -> FactSet:
        """The facts, once their sections are in (the listener may still run). Raises what the
        transport raised when the command could not run (the node is unreachable)."""
        if not self.sections_in.wait(self.facts_timeout):
            missing = f"timed out after {self.facts_timeout:g}s"
        elif self.error is not None and not self._stream.complete:
            raise self.error
        elif self.result is not None and not self._stream.complete:
            missing = (
                "timed out" if self.result.timed_out else f"no output (exit code {self.result.exit_code})"
            )
        else:
            missing = "no output"
        return parse_sections(self.facts, dict(self._stream.sections), missing)

    def clock(self) -> ClockSample | None:
        """The node's clock offset from ours, corrected by half the time the line took to come;
        None when the node's `date` gave nothing usable (busybox: no %N)."""
        self.sections_in.wait(self.facts_timeout)
        section = self._stream.sections.get(self._clock.name)
        after = self._stream.first_line_at.get(self._clock.name)
        if section is None or after is None or self.started_at is None:
            return None
        try:
            remote = self._clock.parse(*section)
        except FactParseError:
            return None
        return ClockSample(offset=remote - (self.started_at + after) / 2, rtt=after - self.started_at)
