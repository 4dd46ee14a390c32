"""Facts: one small class per thing we learn about a node (pyinfra's FactBase shape).

A fact knows the command that reveals it (in the node's shell dialect) and how to parse that
command's output. It never decides anything. ``gather`` runs many facts in one round trip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from orchestrator import records
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
    token = records.new_nonce()  # the records' nonce: no output of the node can fake them
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
    """The records of ``Platform.sectioned`` read line by line while the script still runs: the
    sections are known the moment their record arrives, and what follows the last one (a command
    that keeps running, such as the preflight's listener) is handed back to the caller.

    Keeps the arrival time of each section's record (``time.time()``), written the moment its
    command ended: a section that prints the node's clock is dated by it."""

    def __init__(self, token: str, names: list[str]) -> None:
        self._token = token
        self._waiting = set(names)
        self.sections: dict[str, tuple[str, int]] = {}
        self.first_line_at: dict[str, float] = {}

    @property
    def complete(self) -> bool:
        """Every expected section ended."""
        return not self._waiting

    def feed(self, line: str, at: float) -> str | None:
        """Take one stdout line received at ``at``; returns it when every section ended (the
        caller's), else None (records, and what a section's command printed around them)."""
        if self.complete:
            return line
        found = records.decode_line(line, self._token) if line.startswith(records.MARK) else None
        if found is not None and found.kind == "section":
            name = _take(found, self.sections)
            self.first_line_at.setdefault(name, at)
            self._waiting.discard(name)
        return None


def _take(found: records.Record, sections: dict[str, tuple[str, int]]) -> str:
    """A ``section NAME OUTPUT NUL CODE`` record into ``sections``; returns NAME."""
    name = found.text(0)
    output, _, code = (found.fields[1] if len(found.fields) > 1 else b"").rpartition(b"\0")
    text = output.decode("utf-8", "replace").replace("\r\n", "\n")  # Windows tools' lines, as Linux ones
    number = code.decode("ascii", "replace").strip()
    sections[name] = (
        text[:-1] if text.endswith("\n") else text,
        int(number) if number.lstrip("-").isdigit() else 1,
    )
    return name


def split_sections(stdout: str, token: str) -> dict[str, tuple[str, int]]:
    """The records of a ``Platform.sectioned`` script as ``{name: (output, exit_code)}`` (the output
    without its last newline)."""
    sections: dict[str, tuple[str, int]] = {}
    for found in records.decode(stdout, token):
        if found.kind == "section":
            _take(found, sections)
    return sections
