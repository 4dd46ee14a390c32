"""One round trip per Linux node for `bootstrap check`: a clock sample, the node's facts, its
workdir marker, then its reachability listener and, once that ended, the markers it sees.

The script is the facts' sectioned script (facts/base.py) with the node's clock as its first
section and the listener (reachability.py) as its last command but one. The facts are parsed the
moment their last section ends, while the listener keeps running in the same command until its
peers have connected. The clock line is dated by its arrival: the node's clock was read between the
moment the command was sent and that moment.

The shared-workdir check (shared_fs.py) needs every node's marker written before any node lists
them: the listener is that barrier. A listener ends once every peer connected, and the connectors
start only when every node's facts, marker included, are in. So the listing after it sees every
marker of this check: two round trips fewer per node. POSIX sh builtins only (no process, no Python).

Facts already gathered in this session (``Session.remember``) are not asked again: the round trip
then carries the clock, the marker and the listener.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.facts.base import (
    Fact,
    FactParseError,
    FactSet,
    SectionStream,
    fact_sections,
    parse_sections,
    split_sections,
)
from orchestrator.facts.linux import WallClock
from orchestrator.records import new_nonce
from orchestrator.steps.preflight.checks import ClockSample

if TYPE_CHECKING:
    from orchestrator.platforms import PosixShell
    from orchestrator.steps.preflight.reachability import Listener
    from orchestrator.transports import Result, Transport
    from orchestrator.transports.base import Stream

log = logging.getLogger("orchestrator.preflight.rounds")

#: ``Session.remember`` key of a node's :class:`ClockSample` against this controller's clock (taken
#: by the main pipeline's first round trip or by the time step; the time step forgets the nodes whose
#: time configuration it changed)
CLOCK = "clock"
#: how long a node's facts may take (torch's first import on a slow disk is the long part)
FACTS_TIMEOUT = 120.0
#: section names of the workdir markers (written before the listener, listed after it)
MARK, MARKS = "workdir_mark", "workdir_marks"


def mark_command(platform: PosixShell, workdir: str, marker_dir: str, name: str, token: str) -> str:
    """Write ``token`` into ``<workdir>/<marker_dir>/<name>`` (both created when missing); prints
    the failure, if any (shared_fs.py's protocol in sh). Only into a workdir no other user can
    change (``check_path``: launch refuses the others too): in one that another user made, a link
    planted as the marker would have had any file we can write overwritten (``/etc/shadow`` as root);
    the refusal is printed instead (exit UNSAFE_DIR_EXIT), and nothing is written."""
    q, wd = platform.quote, platform.path_word(workdir)
    # never through a link: one where the markers' directory goes is refused (on a shared file
    # system another node, or a run's code, could plant it to have <any directory>/<name> replaced
    # here). The script goes into that directory (cd -P: builtins, no process) and checks it went
    # where the name is, not where a link led; from then on it writes by relative names, so a link
    # swapped in after the check changes nothing. The marker is a new file (noclobber) renamed over
    # <name> (a rename replaces a link, never writes through it).
    return (
        f"{{ {platform.check_path(workdir)}\n}} 2>&1\n"
        f"cd -P -- {wd} 2>/dev/null || mkdir -p -- {wd} 2>&1 && cd -P -- {wd} || exit 1\n"
        f"_cb_w=$PWD m={q(marker_dir)} t=.{q(name)}.$$\n"
        'if [ -L "$m" ] || { [ -e "$m" ] && [ ! -d "$m" ]; }; then\n'
        '  echo "$_cb_w/$m: not a directory of its own (a link or a file in its place): refused"; exit 1\n'
        "fi\n"
        '[ -d "$m" ] || mkdir "$m" 2>/dev/null || [ -d "$m" ] ||'
        ' { echo "$_cb_w/$m: cannot be created"; exit 1; }\n'
        'cd -P -- "$m" && [ "$PWD" = "$_cb_w/$m" ] || {\n'
        '  echo "$_cb_w/$m: not a directory of its own (a link or a file in its place): refused"; exit 1; }\n'
        # (rm only for a name left over: a process less on every node and check; set -C holds for
        # the rest of this section, a subshell of its own)
        f'{{ {{ [ ! -e "$t" ] && [ ! -L "$t" ]; }} || rm -f "$t"; set -C; printf %s {q(token)} > "$t"'
        f' && mv -f "$t" {q(name)}; }} 2>&1'
    )


def list_command(platform: PosixShell, workdir: str, marker_dir: str) -> str:
    """``NAME TOKEN`` for every marker in ``<workdir>/<marker_dir>`` (dot files are half-written):
    read in that directory itself (cd -P, then checked), never through a link in its place."""
    w, m = platform.path_word(workdir), platform.quote(marker_dir)
    return (
        f'cd -P -- {w} 2>/dev/null && _cb_w=$PWD && cd -P -- {m} 2>/dev/null && [ "$PWD" = "$_cb_w"/{m} ]'
        " || exit 0\n"
        'for f in *; do [ -f "$f" ] && [ ! -L "$f" ] || continue; t=; IFS= read -r t < "$f"\n'
        'printf \'%s %s\\n\' "$f" "$t"; done'
    )


def parse_listing(output: str) -> dict[str, str]:
    """:func:`list_command`'s output -> {node: token}."""
    seen = {}
    for line in output.splitlines():
        name, _, token = line.partition(" ")
        if name:
            seen[name] = token.strip()
    return seen


class NodeRound:
    """The round trip of one node (see the module docstring); ``start`` sends it.

    ``before``: (name, command) sections after the facts, before the listener; ``after``: sections
    after the listener ended (their output is read once the command is over)."""

    def __init__(
        self,
        name: str,
        transport: Transport,
        facts: list[Fact[Any]],
        listener: Listener | None = None,
        *,
        before: Sequence[tuple[str, str]] = (),
        after: Sequence[tuple[str, str]] = (),
        facts_timeout: float = FACTS_TIMEOUT,
    ) -> None:
        self.name = name
        self.transport = transport
        self.facts = facts
        self.listener = listener
        self.facts_timeout = facts_timeout
        self._clock = WallClock()
        platform = transport.platform
        first = fact_sections([self._clock, *facts], platform) + list(before)
        self._token = new_nonce()  # the records' nonce: no output of the node can fake them
        self.script = platform.sectioned(first, self._token)
        if listener is not None:
            self.script += "\n" + listener.command
        if after:
            self.script += "\n" + platform.sectioned(list(after), self._token)
        self.timeout = facts_timeout + (listener.timeout if listener is not None else 0.0)
        self._stream = SectionStream(self._token, [section for section, _ in first])
        self.sections_in = threading.Event()  # every section before the listener arrived, or the end
        self.ended = threading.Event()
        self.started_at: float | None = None  # time.time() just before the command was sent
        self.result: Result | None = None
        self.error: Exception | None = None
        self._lines: list[str] = []  # stdout as it came: all there is when the command raised at the end
        self._thread = threading.Thread(target=self._run, name=f"check-{name}", daemon=True)

    def start(self) -> NodeRound:
        self._thread.start()
        return self

    def run(self) -> NodeRound:
        """The round trip in the calling thread (no listener waits for it): returns once it ended."""
        self._run()
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
            if self.listener is not None:
                error = None if self.error is None else str(self.error) or type(self.error).__name__
                self.listener.ended_elsewhere(self.result, error)
            self.ended.set()

    def _on_line(self, stream: Stream, line: str) -> None:
        if stream != "stdout":
            return
        self._lines.append(line)
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

    def section(self, name: str) -> tuple[str, int] | None:
        """(output, exit code) of a ``before`` section once in, or of an ``after`` section once the
        command is over; None when it never came."""
        if name in self._stream.sections:
            return self._stream.sections[name]
        if not self.ended.is_set():
            return None
        return split_sections("\n".join(self._lines), self._token).get(name)

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
