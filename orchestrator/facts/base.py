"""Facts: one small class per thing we learn about a node (pyinfra's FactBase shape).

A fact knows the command that reveals it (in the node's shell dialect) and how to parse that
command's output. It never decides anything. ``gather`` runs many facts in one round trip.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from orchestrator.platforms import Platform
from orchestrator.transports.base import Result, Transport

T = TypeVar("T")


class FactParseError(ValueError):
    """The command ran but its output was not what the fact expects."""


class Fact(ABC, Generic[T]):
    #: key in fact tables and --json
    name: ClassVar[str]

    @abstractmethod
    def command(self, platform: Platform) -> str:
        """Shell text (in ``platform``'s dialect) whose stdout reveals the fact."""

    @abstractmethod
    def parse(self, output: str, exit_code: int) -> T:
        """Turn the command's stdout (and exit code) into the fact's value."""


@dataclass
class FactSet:
    """Every fact gathered from one node: values, and why the missing ones are missing."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        return self.values.get(name)


def gather(transport: Transport, facts: list[Fact[Any]], *, timeout: float = 120.0) -> FactSet:
    """Run every fact's command on the node in one script and parse each section."""
    token = "cb-" + secrets.token_hex(6)  # unguessable frame markers: no output can fake them
    platform = transport.platform
    script = platform.sectioned([(f.name, f.command(platform)) for f in facts], token)
    result = transport.run(script, timeout=timeout)
    return collect(facts, result, token)


def collect(facts: list[Fact[Any]], result: Result, token: str) -> FactSet:
    """Parse every fact's section of ``result`` (a run of a ``sectioned`` script framed with ``token``)."""
    why = "timed out" if result.timed_out else f"no output (exit code {result.exit_code})"
    return parse_sections(facts, split_sections(result.stdout, token), why)


def parse_sections(facts: list[Fact[Any]], sections: dict[str, tuple[str, int]], missing: str) -> FactSet:
    """Each fact's value from its section (``missing``: why a fact without a section has no value)."""
    found = FactSet()
    for fact in facts:
        if fact.name not in sections:
            found.errors[fact.name] = missing
            continue
        output, code = sections[fact.name]
        try:
            found.values[fact.name] = fact.parse(output, code)
        except (FactParseError, ValueError, KeyError, IndexError) as exc:
            found.errors[fact.name] = f"unexpected output (exit code {code}): {exc}"
    return found


class SectionStream:
    """The framed output of ``Platform.sectioned`` read line by line while the script still runs: the
    sections are known the moment their end marker arrives, and what follows the last one (a command
    that keeps running, such as the preflight's listener) is handed back to the caller.

    Keeps the arrival time of each section's first output line (``time.time()``): a section that
    prints the node's clock is dated by it."""

    def __init__(self, token: str, names: list[str]) -> None:
        self._begin, self._end = f"@@{token} begin ", f"@@{token} end "
        self._waiting = set(names)
        self._current: str | None = None
        self._lines: list[str] = []
        self.sections: dict[str, tuple[str, int]] = {}
        self.first_line_at: dict[str, float] = {}

    @property
    def complete(self) -> bool:
        """Every expected section ended."""
        return not self._waiting

    def feed(self, line: str, at: float) -> str | None:
        """Take one stdout line received at ``at``; returns it when it belongs to no section and
        every section ended (the caller's), else None."""
        if self.complete:
            return line
        if line.startswith(self._begin) and line.endswith("@@"):
            self._current, self._lines = line[len(self._begin) : -2], []
        elif line.startswith(self._end) and line.endswith("@@") and self._current is not None:
            name, _, code = line[len(self._end) : -2].rpartition(" ")
            if self._lines and self._lines[-1] == "":  # the newline we added before the marker
                self._lines.pop()
            self.sections[name] = ("\n".join(self._lines), int(code))
            self._waiting.discard(name)
            self._current = None
        elif self._current is not None:
            self.first_line_at.setdefault(self._current, at)
            self._lines.append(line)
        return None


def split_sections(stdout: str, token: str) -> dict[str, tuple[str, int]]:
    """Parse the framed output of ``Platform.sectioned`` into ``{name: (output, exit_code)}``."""
    sections: dict[str, tuple[str, int]] = {}
    begin, end = f"@@{token} begin ", f"@@{token} end "
    current: str | None = None
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(begin) and line.endswith("@@"):
            current, lines = line[len(begin) : -2], []
        elif line.startswith(end) and line.endswith("@@") and current is not None:
            name, _, code = line[len(end) : -2].rpartition(" ")
            # the end marker is preceded by a newline we added: drop that one empty line
            if lines and lines[-1] == "":
                lines.pop()
            sections[name] = ("\n".join(lines), int(code))
            current = None
        elif current is not None:
            lines.append(line)
    return sections
